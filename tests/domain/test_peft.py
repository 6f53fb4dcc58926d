"""LoRA as PEFT applies it: trainable parameters counted by hand, the memory lines of a frozen
base with adapters, and the configurations that do not apply to a model."""

from __future__ import annotations

import json
from functools import cache

import pytest

from app.config import PROJECT_ROOT
from app.domain.graph.analysis import GraphAnalysis, analyze
from app.domain.memory.estimate import MemoryRequest, analyze_for, estimate_memory
from app.domain.peft import (
    LoraBias,
    LoraConfig,
    LoraError,
    LoraKind,
    linear_modules,
    lora_plan,
    lora_trainable_params,
)
from app.domain.precision import Precision
from app.domain.workload import Checkpointing, Mode, Parallelism, Runtime
from app.domain.zoo import ZOO
from app.importers.hf_config import import_hf_config

HF_CONFIGS = PROJECT_ROOT / "tests" / "fixtures" / "hf_configs"


@cache
def _hf(name: str) -> GraphAnalysis:
    graph = import_hf_config(json.loads((HF_CONFIGS / f"{name}.json").read_text()))
    bindings = {**graph.default_bindings, "batch": 1, "seq": 8}
    return analyze(graph.inputs, graph.layers, bindings, training=True)


@cache
def _llama() -> GraphAnalysis:
    model = ZOO["llama-2-7b"]
    return analyze(model.inputs, model.layers, {"batch": 1, "seq": 8}, training=True)


def test_llama_2_7b_r8_q_v_is_peft_figure() -> None:
    # 32 layers x 2 modules x r 8 x (in 4096 + out 4096): PEFT prints 4,194,304
    config = LoraConfig(r=8, target_modules=("q_proj", "v_proj"))
    assert lora_trainable_params(_llama().layers, config) == 32 * 2 * 8 * (4096 + 4096)
    assert lora_trainable_params(_llama().layers, config) == 4_194_304


def test_llama_2_7b_r16_all_linear_excludes_the_head() -> None:
    per_layer = 4 * (4096 + 4096) + 2 * (4096 + 11008) + (11008 + 4096)  # q k v o, gate up, down
    config = LoraConfig(r=16, target_kind=LoraKind.ALL_LINEAR)
    assert lora_trainable_params(_llama().layers, config) == 32 * 16 * per_layer == 39_976_960
    plan = lora_plan(_llama().layers, config)
    assert len(plan.modules) == 32 * 7
    assert all(m.name != "lm_head" for m in plan.modules)


def test_llama_from_its_hf_config_counts_the_same() -> None:
    config = LoraConfig(r=16, target_kind=LoraKind.ALL_LINEAR)
    assert lora_trainable_params(_hf("llama-2-7b").layers, config) == 39_976_960


def test_mistral_7b_gqa_r16_qkvo() -> None:
    # GQA: k_proj and v_proj are Linear(4096, 1024)
    config = LoraConfig(r=16, target_modules=("q_proj", "k_proj", "v_proj", "o_proj"))
    per_layer = 2 * (4096 + 4096) + 2 * (4096 + 1024)
    assert lora_trainable_params(_hf("mistral-7b-v0.1").layers, config) == 32 * 16 * per_layer
    assert 32 * 16 * per_layer == 13_631_488


def test_kinds_and_regex_select_the_same_modules_as_names() -> None:
    layers = _llama().layers
    by_kind = lora_plan(layers, LoraConfig(r=4, target_kind=LoraKind.MLP))
    by_name = lora_plan(
        layers, LoraConfig(r=4, target_modules=("gate_proj", "up_proj", "down_proj"))
    )
    assert by_kind.modules == by_name.modules
    assert by_kind.trainable_params == 32 * 4 * (2 * (4096 + 11008) + 11008 + 4096)
    attention = lora_plan(layers, LoraConfig(r=4, target_kind=LoraKind.ATTENTION))
    assert attention.trainable_params == 32 * 4 * 4 * 8192
    regex = lora_plan(
        layers, LoraConfig(r=8, target_regex=r"model\.layers\.(0|1)\.self_attn\.q_proj")
    )
    assert [m.full_name for m in regex.modules] == [
        "model.layers.0.self_attn.q_proj",
        "model.layers.1.self_attn.q_proj",
    ]
    assert regex.trainable_params == 2 * 8 * 8192
    # PEFT fullmatches a regex against named_modules()' names, which start with "model."
    with pytest.raises(LoraError):
        lora_plan(layers, LoraConfig(r=8, target_regex=r"layers\.(0|1)\.self_attn\.q_proj"))
    # a list entry matches a suffix at a dot, never a partial name
    with pytest.raises(LoraError):
        lora_plan(layers, LoraConfig(r=8, target_modules=("proj",)))


def test_bias_options_on_qwen2_q_k_v_biases() -> None:
    layers = _hf("qwen2-0.5b").layers
    base = 24 * 8 * ((896 + 896) + (896 + 128))  # q_proj, v_proj (GQA: v out 128)
    none = LoraConfig(r=8, target_modules=("q_proj", "v_proj"))
    assert lora_trainable_params(layers, none) == base == 540_672
    lora_only = LoraConfig(r=8, target_modules=("q_proj", "v_proj"), bias=LoraBias.LORA_ONLY)
    assert lora_trainable_params(layers, lora_only) == base + 24 * (896 + 128)
    every = LoraConfig(r=8, target_modules=("q_proj", "v_proj"), bias=LoraBias.ALL)
    assert lora_trainable_params(layers, every) == base + 24 * (896 + 128 + 128)  # q, k, v biases


def test_bias_all_counts_layernorm_biases() -> None:
    layers = _hf("bert-base-uncased").layers
    every = lora_trainable_params(
        layers, LoraConfig(r=8, target_modules=("query",), bias=LoraBias.ALL)
    )  # BERT's names (modeling_bert.py): q_proj matches nothing there, as in PEFT
    adapters = 12 * 8 * (768 + 768)
    # per block: q k v o (4 x 768), intermediate 3072 + output 768, two layernorms (2 x 768);
    # the embeddings' layernorm 768 and the pooler 768
    biases = 12 * (4 * 768 + 3072 + 768 + 2 * 768) + 768 + 768
    assert every == adapters + biases


def test_modules_to_save_trains_the_whole_module() -> None:
    config = LoraConfig(r=8, target_modules=("q_proj", "v_proj"), modules_to_save=("lm_head",))
    assert lora_trainable_params(_llama().layers, config) == 4_194_304 + 32000 * 4096


def test_linear_modules_have_the_ops_shapes() -> None:
    modules = {m.name: m for m in linear_modules(_hf("mistral-7b-v0.1").layers)}
    k = modules["layers.3.self_attn.k_proj"]
    assert (k.in_features, k.out_features, k.bias) == (4096, 1024, False)
    down = modules["layers.31.mlp.down_proj"]
    assert (down.in_features, down.out_features) == (14336, 4096)
    assert modules["lm_head"].out_features == 32000


@pytest.mark.parametrize(
    ("config", "field"),
    [
        (LoraConfig(r=8, target_modules=("query_key_value",)), "target_modules"),
        (LoraConfig(r=8, target_regex=r"nothing\..*"), "target_regex"),
        (LoraConfig(r=8, target_modules=("q_proj", "qkv")), "target_modules"),
        (LoraConfig(r=1025, target_modules=("k_proj",)), "r"),  # k_proj is 4096 -> 1024
        (
            LoraConfig(r=8, target_modules=("q_proj",), modules_to_save=("score",)),
            "modules_to_save",
        ),
    ],
)
def test_configurations_that_do_not_apply_name_the_field(config: LoraConfig, field: str) -> None:
    with pytest.raises(LoraError) as info:
        lora_plan(_hf("mistral-7b-v0.1").layers, config)
    assert info.value.field == field


def test_a_rank_at_the_width_is_accepted() -> None:
    config = LoraConfig(r=1024, target_modules=("k_proj",))
    assert lora_trainable_params(_hf("mistral-7b-v0.1").layers, config) == 32 * 1024 * 5120


@pytest.mark.parametrize(
    "kwargs",
    [
        {"r": 0, "target_modules": ("q_proj",)},
        {"r": 8},
        {"r": 8, "target_modules": ("q_proj",), "target_kind": LoraKind.MLP},
        {"r": 8, "target_regex": "("},
        {"r": 8, "target_modules": ("q_proj",), "dropout": 1.0},
    ],
)
def test_bad_configs(kwargs: dict[str, object]) -> None:
    with pytest.raises(LoraError):
        LoraConfig(**kwargs)  # type: ignore[arg-type]


def _estimate(lora: LoraConfig | None, **options: object):  # type: ignore[no-untyped-def]
    model = ZOO["llama-2-7b"]
    request = MemoryRequest(mode=Mode.TRAINING, lora=lora, **options)  # type: ignore[arg-type]
    analysis = analyze_for(model.inputs, model.layers, {"batch": 1, "seq": 512}, request)
    return estimate_memory(analysis, request)


def test_lora_memory_lines_train_only_the_adapters() -> None:
    config = LoraConfig(r=8, target_modules=("q_proj", "v_proj"))
    result = _estimate(config, precision=Precision.MIXED_BF16, runtime=Runtime.CPU)
    lines = {line.key: line.bytes for line in result.lines}
    trainable = 4_194_304
    assert result.trainable_params == trainable
    assert result.params == 6_738_415_616
    assert lines["weights"] == 6_738_415_616 * 2  # the frozen base at the base dtype
    assert lines["adapter_weights"] == trainable * 4  # fp32 adapters
    # the peak is the loss's backward: no gradient exists yet (zero_grad(set_to_none=True);
    # they were held through the forward until issue 32's frozen-base rules)
    assert lines["gradients"] == 0
    assert lines["optimizer_state"] == trainable * 2 * 4  # AdamW: two fp32 moments
    assert "master_weights" not in lines  # adapters are fp32 already; the base is frozen
    # bf16 activations, no autocast: lora_A keeps an fp32 copy of its input (512 x 4096) and
    # lora_B lora_A's fp32 output (512 x 8), for 64 adapted layers
    assert result.peak_phase == "backward"
    assert lines["adapter_activations"] == 64 * (512 * 4096 * 4 + 512 * 8 * 4)
    full = _estimate(None, precision=Precision.MIXED_BF16, runtime=Runtime.CPU)
    assert result.peak_bytes < full.peak_bytes // 4


def test_lora_adapter_activations_at_the_backward_peak() -> None:
    config = LoraConfig(r=8, target_modules=("q_proj", "v_proj"), dropout=0.1)
    result = _estimate(config, precision=Precision.FP32, runtime=Runtime.CPU)
    assert result.peak_phase == "backward"
    lines = {line.key: line for line in result.lines}
    # fp32 base: lora_A keeps the dropout's output (512 x 4096 x 4 B), dropout its mask (1 B)
    expected = 64 * (512 * 4096 * (4 + 1) + 512 * 8 * 4)
    assert lines["adapter_activations"].bytes == expected
    assert "lora_dropout=0.1" in lines["adapter_activations"].formula
    checkpointed = _estimate(
        config, precision=Precision.FP32, runtime=Runtime.CPU, checkpointing=Checkpointing.FULL
    )
    kept = {line.key: line.bytes for line in checkpointed.lines}
    assert kept.get("adapter_activations", 0) <= expected // 32


def test_lora_under_autocast_caches_only_the_adapters_casts() -> None:
    config = LoraConfig(r=8, target_modules=("q_proj", "v_proj"))
    result = _estimate(config, precision=Precision.AMP_BF16, runtime=Runtime.CUDA)
    lines = {line.key: line.bytes for line in result.lines}
    # autocast caches casts of leaf tensors that require grad: the adapters, not the base
    assert lines["weight_cast_cache"] == 4_194_304 * 2
    assert lines["weights"] == 6_738_415_616 * 4  # autocast keeps the base in fp32
    # lora_A keeps its own bf16 cast of x; lora_B the bf16 output of lora_A
    assert lines["adapter_activations"] == 64 * (512 * 4096 * 2 + 512 * 8 * 2)


def test_lora_at_inference_must_say_whether_it_is_merged() -> None:
    with pytest.raises(LoraError) as caught:
        MemoryRequest(mode=Mode.INFERENCE, lora=LoraConfig(r=8, target_modules=("q_proj",)))
    assert caught.value.pointer == "/lora"


def test_bias_all_leaves_qwen3_q_norm_and_k_norm_frozen() -> None:
    # q_norm / k_norm are RMSNorm weights of head_dim 128: not named bias, PEFT leaves them
    layers = _hf("qwen3-0.6b").layers
    base = lora_trainable_params(layers, LoraConfig(r=8, target_modules=("q_proj", "v_proj")))
    every = LoraConfig(r=8, target_modules=("q_proj", "v_proj"), bias=LoraBias.ALL)
    assert lora_trainable_params(layers, every) == base  # Qwen3 has no bias at all


def test_modules_to_save_of_a_tied_head_trains_a_full_copy() -> None:
    # Qwen2-0.5B ties lm_head to embed_tokens; PEFT's copy of lm_head is a vocab x hidden weight
    layers = _hf("qwen2-0.5b").layers
    config = LoraConfig(r=8, target_modules=("q_proj", "v_proj"), modules_to_save=("lm_head",))
    assert lora_trainable_params(layers, config) == 540_672 + 151_936 * 896


def test_lora_under_zero_3_shards_adapter_state_and_gathers_no_base_gradients() -> None:
    config = LoraConfig(r=8, target_modules=("q_proj", "v_proj"))
    parallel = Parallelism(data=8, zero_stage=3)
    result = _estimate(config, precision=Precision.AMP_BF16, parallelism=parallel)
    lines = {line.key: line for line in result.lines}
    assert lines["gradients"].bytes == 0  # the loss's backward: none yet (set_to_none)
    assert "no backward has run yet" in lines["gradients"].formula
    assert lines["optimizer_state"].bytes == 4_194_304 * 8 // 8
    # the largest FSDP unit (embeddings, final norm and head, fp32) holds no adapter
    assert lines["fsdp_buffers"].bytes == 2 * (2 * 32000 * 4096 + 4096) * 4
    assert "+ 0 [B: its gradients" in lines["fsdp_buffers"].formula
