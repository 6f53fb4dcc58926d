"""LoRA and DoRA on GPT-2, BERT, T5, BLOOM and GPT-NeoX graphs as PEFT counts them (golden
figures; the same configurations are checked against peft (0.21.0; earlier rows also 0.21.2) by
benchmarks/peft_params/count.py and its results.md)."""

from __future__ import annotations

import json
from functools import cache

import pytest

from app.config import PROJECT_ROOT
from app.domain.graph.analysis import GraphAnalysis, analyze
from app.domain.peft import (
    LoraBias,
    LoraConfig,
    LoraError,
    LoraKind,
    linear_modules,
    lora_plan,
    lora_trainable_params,
    module_naming,
)
from app.importers.hf_config import import_hf_config

HF_CONFIGS = PROJECT_ROOT / "tests" / "fixtures" / "hf_configs"
MOE_MLP = ("gate_proj", "up_proj", "down_proj")


@cache
def _hf(name: str) -> GraphAnalysis:
    graph = import_hf_config(json.loads((HF_CONFIGS / f"{name}.json").read_text()))
    bindings = {**graph.default_bindings, "batch": 1, "seq": 8}
    return analyze(graph.inputs, graph.layers, bindings, training=True)


def test_each_family_gets_its_modeling_files_names() -> None:
    assert module_naming(_hf("gpt2").layers).family == "gpt2"
    assert module_naming(_hf("bert-base-uncased").layers).family == "bert"
    assert module_naming(_hf("roberta-base").layers).family == "bert"
    assert module_naming(_hf("t5-small-encoder").layers).family == "t5"
    assert module_naming(_hf("llama-2-7b").layers).family == "llama"
    names = {m.name for m in linear_modules(_hf("gpt2").layers)}
    assert {"h.0.attn.c_attn", "h.0.attn.c_proj", "h.0.mlp.c_fc", "h.0.mlp.c_proj"} <= names
    names = {m.name for m in linear_modules(_hf("bert-base-uncased").layers)}
    assert {"encoder.0.attn.self.query", "encoder.0.attn.output.dense"} <= names
    assert {"encoder.0.mlp.intermediate.dense", "encoder.0.mlp.output.dense"} <= names
    assert "pooler.dense" in names
    names = {m.name for m in linear_modules(_hf("flan-t5-base-encoder").layers)}
    assert {"block.0.attn.q", "block.0.attn.o", "block.0.mlp.wi_0", "block.0.mlp.wo"} <= names


def test_gpt2_c_attn_is_one_fused_linear() -> None:
    # Conv1D(768 -> 2304): lora_A 8 x 768, lora_B 2304 x 8, 12 blocks
    modules = {m.name: m for m in linear_modules(_hf("gpt2").layers)}
    assert (modules["h.0.attn.c_attn"].in_features, modules["h.0.attn.c_attn"].out_features) == (
        768,
        2304,
    )
    layers = _hf("gpt2").layers
    assert lora_trainable_params(layers, LoraConfig(r=8, target_modules=("c_attn",))) == 294_912
    assert 12 * 8 * (768 + 2304) == 294_912
    # c_proj is the attention's output and the MLP's down projection, as in modeling_gpt2.py
    both = LoraConfig(r=16, target_modules=("c_attn", "c_proj"))
    assert lora_trainable_params(layers, both) == 12 * 16 * (3072 + 1536 + 3840) == 1_622_016
    lora_only = LoraConfig(r=8, target_modules=("c_attn",), bias=LoraBias.LORA_ONLY)
    assert lora_trainable_params(layers, lora_only) == 294_912 + 12 * 2304


@pytest.mark.parametrize(
    ("slug", "config", "expected"),
    [
        ("gpt2", LoraConfig(r=16, target_kind=LoraKind.ALL_LINEAR), 2_359_296),
        ("gpt2", LoraConfig(r=8, target_kind=LoraKind.ATTENTION), 442_368),
        ("gpt2", LoraConfig(r=8, target_kind=LoraKind.MLP), 737_280),
        ("gpt2", LoraConfig(r=8, target_modules=("c_attn",), use_dora=True), 322_560),
        ("bert-base-uncased", LoraConfig(r=8, target_modules=("query", "value")), 294_912),
        (
            "bert-base-uncased",
            LoraConfig(r=16, target_modules=("query", "key", "value", "dense")),
            2_678_784,
        ),
        ("bert-base-uncased", LoraConfig(r=16, target_kind=LoraKind.ALL_LINEAR), 2_678_784),
        ("bert-base-uncased", LoraConfig(r=8, target_kind=LoraKind.MLP), 737_280),
        (
            "bert-base-uncased",
            LoraConfig(r=8, target_modules=("query", "value"), bias=LoraBias.ALL),
            397_824,
        ),
        ("t5-small-encoder", LoraConfig(r=8, target_modules=("q", "v")), 98_304),
        ("t5-small-encoder", LoraConfig(r=16, target_kind=LoraKind.ALL_LINEAR), 884_736),
        ("t5-small-encoder", LoraConfig(r=8, target_modules=("q", "v"), use_dora=True), 104_448),
        ("flan-t5-base-encoder", LoraConfig(r=8, target_kind=LoraKind.MLP), 811_008),
        ("flan-t5-base-encoder", LoraConfig(r=32, target_kind=LoraKind.ATTENTION), 2_359_296),
        # T5ForConditionalGeneration: the decoder's self- and cross-attention are adapted too
        ("t5-small", LoraConfig(r=8, target_modules=("q", "v")), 294_912),
        ("t5-small", LoraConfig(r=16, target_kind=LoraKind.ALL_LINEAR), 2_162_688),
        ("flan-t5-base", LoraConfig(r=32, target_kind=LoraKind.ATTENTION), 7_077_888),
        ("flan-t5-base", LoraConfig(r=8, target_kind=LoraKind.MLP), 1_622_016),
        # BLOOM and GPT-NeoX: PEFT's query_key_value (one fused Linear) at two ranks
        ("bloomz-560m", LoraConfig(r=8, target_modules=("query_key_value",)), 786_432),
        ("bloomz-560m", LoraConfig(r=16, target_modules=("query_key_value",)), 1_572_864),
        (
            "bloomz-560m",
            LoraConfig(
                r=16, target_modules=("query_key_value", "dense", "dense_h_to_4h", "dense_4h_to_h")
            ),
            6_291_456,
        ),
        ("bloomz-560m", LoraConfig(r=64, target_kind=LoraKind.ALL_LINEAR), 25_165_824),
        ("pythia-160m", LoraConfig(r=8, target_modules=("query_key_value",)), 294_912),
        ("pythia-160m", LoraConfig(r=16, target_modules=("query_key_value",)), 589_824),
        ("pythia-160m", LoraConfig(r=8, target_kind=LoraKind.ATTENTION), 442_368),
        (
            "pythia-160m",
            LoraConfig(r=8, target_modules=("query_key_value",), bias=LoraBias.LORA_ONLY),
            322_560,
        ),
        # OPT (out_proj, fc1, fc2) and Phi-2 (dense, fc1, fc2)
        ("opt-125m", LoraConfig(r=16, target_modules=("out_proj", "fc1", "fc2")), 1_769_472),
        ("opt-350m", LoraConfig(r=16, target_kind=LoraKind.ALL_LINEAR), 7_127_040),
        ("phi-2", LoraConfig(r=8, target_modules=("q_proj", "v_proj")), 2_621_440),
        ("phi-2", LoraConfig(r=16, target_modules=("dense", "fc1", "fc2")), 15_728_640),
        # multi-head latent attention (DeepSeek) and gpt-oss' biased attention with sinks
        (
            "deepseek-v2-lite-chat",
            LoraConfig(r=8, target_modules=("q_proj", "kv_a_proj_with_mqa", "kv_b_proj", "o_proj")),
            3_552_768,
        ),
        ("deepseek-v2-lite-chat", LoraConfig(r=16, target_kind=LoraKind.ATTENTION), 7_105_536),
        ("deepseek-v3", LoraConfig(r=16, target_modules=("kv_b_proj",)), 32_481_280),
        ("deepseek-v3", LoraConfig(r=16, target_kind=LoraKind.ATTENTION), 97_006_592),
        (
            "gpt-oss-20b",
            LoraConfig(r=8, target_modules=("q_proj", "k_proj", "v_proj", "o_proj")),
            3_981_312,
        ),
        (
            "gpt-oss-20b",
            LoraConfig(r=8, target_modules=("q_proj", "v_proj"), bias=LoraBias.LORA_ONLY),
            2_101_248,
        ),
        # MoE: the shared expert's Linear gate/up/down (routed experts are 3-d parameters)
        (
            "qwen1.5-moe-a2.7b",
            LoraConfig(r=8, target_modules=("gate_proj", "up_proj", "down_proj")),
            4_423_680,
        ),
        (
            "llama-4-scout-17b-16e-text",
            LoraConfig(r=16, target_modules=("gate_proj", "up_proj", "down_proj")),
            30_670_848,
        ),
    ],
)
def test_family_counts_are_peft_figures(slug: str, config: LoraConfig, expected: int) -> None:
    # pinned from peft 0.21.2 and 0.21.0 (benchmarks/peft_params/results.md)
    assert lora_trainable_params(_hf(slug).layers, config) == expected


def test_bert_all_linear_is_every_dense_with_the_pooler() -> None:
    # BertModel has no output embedding: all-linear adapts the pooler's dense too
    per_block = 4 * (768 + 768) + (768 + 3072) + (3072 + 768)
    expected = 16 * (12 * per_block + 768 + 768)
    config = LoraConfig(r=16, target_kind=LoraKind.ALL_LINEAR)
    assert lora_trainable_params(_hf("bert-base-uncased").layers, config) == expected


def test_dora_adds_out_features_per_adapted_linear() -> None:
    layers = _hf("llama-2-7b").layers
    plain = lora_trainable_params(layers, LoraConfig(r=8, target_modules=("q_proj", "v_proj")))
    dora = LoraConfig(r=8, target_modules=("q_proj", "v_proj"), use_dora=True)
    assert lora_trainable_params(layers, dora) == plain + 32 * 2 * 4096 == 4_456_448


def test_llama_names_match_nothing_on_gpt2() -> None:
    with pytest.raises(LoraError) as caught:
        lora_trainable_params(_hf("gpt2").layers, LoraConfig(target_modules=("q_proj",)))
    assert caught.value.field == "target_modules"
    assert "c_attn" in str(caught.value)


def test_bloom_and_neox_get_their_modeling_files_names() -> None:
    """query_key_value / dense / dense_h_to_4h / dense_4h_to_h, as modeling_bloom.py and
    modeling_gpt_neox.py name them (Llama's q_proj was given before and matched nothing)."""
    assert module_naming(_hf("bloomz-560m").layers).family == "bloom"
    assert module_naming(_hf("pythia-160m").layers).family == "gpt_neox"
    names = {m.name for m in linear_modules(_hf("bloomz-560m").layers)}
    assert {"h.0.self_attention.query_key_value", "h.0.self_attention.dense"} <= names
    assert {"h.0.mlp.dense_h_to_4h", "h.0.mlp.dense_4h_to_h"} <= names
    names = {m.name for m in linear_modules(_hf("pythia-160m").layers)}
    assert {"layers.0.attention.query_key_value", "layers.0.attention.dense"} <= names
    modules = {m.name: m for m in linear_modules(_hf("bloomz-560m").layers)}
    qkv = modules["h.0.self_attention.query_key_value"]
    assert (qkv.in_features, qkv.out_features, qkv.bias) == (1024, 3072, True)
    # 24 blocks x r x (1024 + 3072)
    config = LoraConfig(r=8, target_modules=("query_key_value",))
    assert lora_trainable_params(_hf("bloomz-560m").layers, config) == 24 * 8 * 4096
    with pytest.raises(LoraError) as caught:
        lora_trainable_params(_hf("bloomz-560m").layers, LoraConfig(target_modules=("q_proj",)))
    assert "query_key_value" in str(caught.value)


def test_t5_cross_attention_is_adapted_and_counted_as_attention() -> None:
    names = {m.name for m in linear_modules(_hf("t5-small").layers)}
    assert {"decoder_block.0.EncDecAttention.q", "decoder_block.0.EncDecAttention.o"} <= names
    # q, v in 6 encoder self-, 6 decoder self- and 6 cross-attentions: 18 x 2 x 8 x (512 + 512)
    config = LoraConfig(r=8, target_modules=("q", "v"))
    assert lora_trainable_params(_hf("t5-small").layers, config) == 18 * 2 * 8 * 1024


def test_opt_and_phi2_get_their_modeling_files_names() -> None:
    assert module_naming(_hf("opt-125m").layers).family == "opt"
    assert module_naming(_hf("phi-2").layers).family == "phi"
    assert module_naming(_hf("phi-3-mini-4k-instruct").layers).family == "phi3"
    names = {m.name for m in linear_modules(_hf("opt-350m").layers)}
    assert {"layers.0.self_attn.out_proj", "layers.0.mlp.fc1", "layers.0.mlp.fc2"} <= names
    assert {"project_in", "project_out"} <= names
    names = {m.name for m in linear_modules(_hf("phi-2").layers)}
    assert {"layers.0.self_attn.dense", "layers.0.mlp.fc1", "layers.0.mlp.fc2"} <= names
    with pytest.raises(LoraError):
        lora_trainable_params(_hf("opt-125m").layers, LoraConfig(target_modules=("o_proj",)))


def test_latent_attention_gets_deepseeks_module_names() -> None:
    """DeepseekV2/V3Attention's Linear modules; its norm weights are neither Linear nor biases
    (LoRA on DeepSeek-V3 and gpt-oss raised KeyError before, V2-Lite got q/k/v/o names)."""
    modules = {m.name.rsplit(".", 1)[-1]: m for m in linear_modules(_hf("deepseek-v3").layers)}
    assert {"q_a_proj", "q_b_proj", "kv_a_proj_with_mqa", "kv_b_proj", "o_proj"} <= set(modules)
    assert not {"k_proj", "v_proj"} & set(modules)
    q_a, kv_b = modules["q_a_proj"], modules["kv_b_proj"]
    assert (q_a.in_features, q_a.out_features, q_a.bias) == (7168, 1536, False)
    assert (kv_b.in_features, kv_b.out_features) == (512, 128 * (128 + 128))
    lite = {
        m.name.rsplit(".", 1)[-1]: m for m in linear_modules(_hf("deepseek-v2-lite-chat").layers)
    }
    assert lite["o_proj"].bias is False
    assert "q_a_proj" not in lite
    assert "q_proj" in lite
    oss = [m for m in linear_modules(_hf("gpt-oss-20b").layers) if m.kind == "attention"]
    assert len(oss) == 24 * 4
    assert all(m.bias for m in oss)


def test_moe_shared_experts_are_the_moe_blocks_linear_modules() -> None:
    """Qwen2-MoE / Llama-4 ``shared_expert``, DeepSeek ``shared_experts``; no routed expert
    (3-d parameters in transformers 5.23) and no MoE module in Qwen3-MoE or Mixtral."""
    names = {m.name for m in linear_modules(_hf("qwen1.5-moe-a2.7b").layers)}
    assert "layers.0.mlp.shared_expert.gate_proj" in names
    assert not any("shared_expert_gate" in n for n in names)
    names = {m.name for m in linear_modules(_hf("deepseek-v2-lite-chat").layers)}
    assert "layers.1.mlp.shared_experts.down_proj" in names
    names = {m.name for m in linear_modules(_hf("llama-4-scout-17b-16e-text").layers)}
    assert "layers.0.feed_forward.shared_expert.up_proj" in names
    assert not any(m.kind == "mlp" for m in linear_modules(_hf("qwen3-30b-a3b").layers))
    # 24 layers x 3 shared-expert projections: r x (2048 + 5632) each
    config = LoraConfig(r=8, target_modules=("gate_proj", "up_proj", "down_proj"))
    assert lora_trainable_params(_hf("qwen1.5-moe-a2.7b").layers, config) == 24 * 3 * 8 * 7680


def test_phi3_fused_projections_are_its_modeling_files_modules() -> None:
    """Phi3Attention.qkv_proj (out (32 + 2 x 32) x 96 = 9,216) and Phi3MLP.gate_up_proj (out
    2 x 8,192): q_proj / gate_proj named before match nothing in transformers (peft refuses)."""
    layers = _hf("phi-3-mini-4k-instruct").layers
    modules = {m.full_name: m for m in linear_modules(layers)}
    qkv = modules["model.layers.0.self_attn.qkv_proj"]
    gate_up = modules["model.layers.0.mlp.gate_up_proj"]
    assert (qkv.in_features, qkv.out_features) == (3072, 9216)
    assert (gate_up.in_features, gate_up.out_features) == (3072, 16384)
    assert not any(name.endswith(("q_proj", "gate_proj")) for name in modules if "qkv" not in name)
    with pytest.raises(LoraError):
        lora_trainable_params(layers, LoraConfig(target_modules=("q_proj",)))
    # pinned from peft 0.21.0 (benchmarks/peft_params/results.md): 32 x 8 x (3072 + 9216)
    config = LoraConfig(r=8, target_modules=("qkv_proj",))
    assert lora_trainable_params(layers, config) == 32 * 8 * 12288 == 3_145_728
    everything = LoraConfig(r=16, target_kind=LoraKind.ALL_LINEAR)
    assert lora_trainable_params(layers, everything) == 25_165_824


@pytest.mark.parametrize(
    ("slug", "regex", "expected"),
    [
        # pinned from peft 0.21.0 on transformers' own names (benchmarks/peft_params/results.md)
        ("llama-2-7b", r"model\.layers\.1\.self_attn\.q_proj", 65_536),
        ("gemma-2-9b-it", r"model\.layers\.1\.self_attn\.q_proj", 61_440),
        ("gemma-3-1b-it", r"model\.layers\.1\.self_attn\.q_proj", 17_408),
        ("gemma-2-9b-it", r"model\.layers\.[0-4]\.(self_attn\.o_proj|mlp\.down_proj)", 1_024_000),
        ("gemma-3-1b-it", r"model\.layers\.[0-4]\.(self_attn\.o_proj|mlp\.down_proj)", 409_600),
        ("gemma-2-9b-it", r".*layers\.(0|1)\.self_attn\.q_proj", 122_880),
        ("phi-3-mini-4k-instruct", r"model\.layers\.1\.self_attn\.qkv_proj", 98_304),
    ],
)
def test_regex_targets_see_transformers_module_names(slug: str, regex: str, expected: int) -> None:
    assert lora_trainable_params(_hf(slug).layers, LoraConfig(r=8, target_regex=regex)) == expected


def test_stacked_decoder_layers_are_numbered_as_in_transformers() -> None:
    """Gemma-2's alternating layers (``layers.<j>.l<k>_``, period 2), Gemma-3's runs
    (``layers_<first>.<j>.l<k>_``) and DeepSeek's dense-then-MoE runs: layer first + j x period
    + k of model.layers."""
    names = [m.full_name for m in linear_modules(_hf("gemma-2-9b-it").layers)]
    assert "model.layers.41.mlp.down_proj" in names
    assert sum(n.endswith(".q_proj") for n in names) == 42
    assert len({n.split(".")[2] for n in names if n.startswith("model.layers.")}) == 42
    names = [m.full_name for m in linear_modules(_hf("gemma-3-1b-it").layers)]
    assert {f"model.layers.{i}.self_attn.q_proj" for i in range(26)} <= set(names)
    names = [m.full_name for m in linear_modules(_hf("deepseek-v2-lite-chat").layers)]
    assert "model.layers.0.mlp.gate_proj" in names
    assert "model.layers.1.mlp.shared_experts.gate_proj" in names
    assert "model.layers.26.self_attn.kv_b_proj" in names
    assert "lm_head" in names


@pytest.mark.parametrize(
    ("slug", "config", "expected"),
    [
        # pinned from peft 0.21.0 + transformers 5.18.0 (benchmarks/peft_params/results.md)
        ("deepseek-v2-lite-chat", LoraConfig(r=8, target_modules=MOE_MLP), 175_505_408),
        (
            "deepseek-v2-lite-chat",
            LoraConfig(r=16, target_modules=("kv_b_proj", "o_proj", "down_proj")),
            95_772_672,
        ),
        ("deepseek-v2-lite-chat", LoraConfig(r=8, target_kind=LoraKind.ALL_LINEAR), 179_497_472),
        ("deepseek-v2-lite-chat", LoraConfig(r=8, target_kind=LoraKind.MLP), 175_505_408),
        (
            "deepseek-v2-lite-chat",
            LoraConfig(
                r=8,
                target_regex=r"model\.layers\.1\.(self_attn\.kv_b_proj|mlp\.experts\.down_proj)",
            ),
            47_001_600,
        ),
        ("deepseek-v3", LoraConfig(r=8, target_modules=MOE_MLP), 3_770_679_296),
        ("deepseek-v3", LoraConfig(r=8, target_kind=LoraKind.ALL_LINEAR), 3_822_627_328),
    ],
)
def test_deepseek_routed_experts_count_as_peft_converts_them(
    slug: str, config: LoraConfig, expected: int
) -> None:
    assert lora_trainable_params(_hf(slug).layers, config) == expected


def test_deepseek_expert_targets_are_the_fused_parameters() -> None:
    """peft 0.21.0 converts gate_proj/up_proj to experts.gate_up_proj at rank 2r and
    down_proj to experts.down_proj, and drops them from target_modules: V2-Lite's 26 MoE
    layers of 64 experts (hidden 2048, expert intermediate 1408), no shared expert or dense
    MLP adapted."""
    layers = _hf("deepseek-v2-lite-chat").layers
    plan = lora_plan(layers, LoraConfig(r=8, target_modules=MOE_MLP))
    assert {m.name.split(".", 2)[2] for m in plan.modules} == {
        "mlp.experts.gate_up_proj",
        "mlp.experts.down_proj",
    }
    per_layer = 16 * 64 * (2048 + 2 * 1408) + 8 * 64 * (1408 + 2048)
    assert plan.trainable_params == 26 * per_layer == 175_505_408
    with pytest.raises(LoraError) as caught:
        lora_plan(layers, LoraConfig(r=8, target_modules=("gate_proj", "down_proj")))
    assert caught.value.field == "target_modules"
    assert "up_proj" in str(caught.value)
    with pytest.raises(LoraError) as caught:
        lora_plan(layers, LoraConfig(r=8, target_modules=MOE_MLP, dropout=0.1))
    assert caught.value.field == "dropout"
    with pytest.raises(LoraError) as caught:
        lora_plan(layers, LoraConfig(r=8, target_modules=MOE_MLP, use_dora=True))
    assert caught.value.field == "use_dora"
    # attention targets are untouched by the conversion
    attention = lora_plan(layers, LoraConfig(r=16, target_kind=LoraKind.ATTENTION))
    assert attention.trainable_params == 7_105_536
