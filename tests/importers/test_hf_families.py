"""Served families (app/importers/hf_families.py): how sliding windows, latent attention, shared
experts and dense layers are laid out, what the KV cache of each layer holds, and bad configs.
The parameter counts themselves are pinned in test_hf_config.py (GOLDEN)."""

import json
from typing import Any

import pytest

from app.config import PROJECT_ROOT
from app.domain.errors import GraphError
from app.domain.graph.analysis import analyze
from app.importers.hf_config import import_hf_config
from app.importers.result import ImportedGraph, ImportRejected

CONFIGS = PROJECT_ROOT / "tests" / "fixtures" / "hf_configs"


def _load(name: str) -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads((CONFIGS / f"{name}.json").read_text())
    return loaded


def _repeats(imported: ImportedGraph) -> list[tuple[str, int, list[dict[str, Any]]]]:
    return [(r["name"], r["times"], r["layers"]) for r in imported.layers if r["op"] == "repeat"]


def _kv_per_layer(imported: ImportedGraph, seq: int) -> list[int]:
    """KV-cache elements each attention layer holds after ``seq`` tokens (batch 1), in order."""
    analysis = analyze(imported.inputs, imported.layers, {"batch": 1, "seq": seq}, training=False)
    return [layer.result.kv_cache_numel for layer in analysis.layers if layer.op == "attention"]


def test_gemma2_alternates_sliding_and_global_layers() -> None:
    imported = import_hf_config(_load("gemma-2-9b-it"))
    [(name, times, body)] = _repeats(imported)
    assert (name, times) == ("layers", 21)
    attention = [layer for layer in body if layer["op"] == "attention"]
    assert [a.get("sliding_window") for a in attention] == [4096, None]  # layer 0 slides
    norms = [layer["name"] for layer in body if layer["op"] == "rmsnorm"][:4]
    assert norms == ["l0_input_layernorm", "l0_post_attention_layernorm",
                     "l0_pre_feedforward_layernorm", "l0_post_feedforward_layernorm"]  # fmt: skip
    # the second layer's residual stream is the first layer's output
    assert body[[layer["name"] for layer in body].index("l1_attn_add")]["inputs"][0] == "l0_mlp_add"
    kv_dim = 8 * 256
    kv = _kv_per_layer(imported, 8192)
    assert len(kv) == 42
    assert kv[:2] == [2 * 4096 * kv_dim, 2 * 8192 * kv_dim]  # the window bounds the sliding layer
    assert sum(kv) == 21 * 2 * (4096 + 8192) * kv_dim
    assert _kv_per_layer(imported, 1024)[:2] == [2 * 1024 * kv_dim] * 2  # shorter than the window


def test_gemma3_five_sliding_layers_in_six_and_the_leftover_run() -> None:
    imported = import_hf_config(_load("gemma-3-1b-it"))
    runs = _repeats(imported)
    assert [(name, times) for name, times, _ in runs] == [("layers_0", 4), ("layers_24", 1)]
    windows = [[a.get("sliding_window") for a in body if a["op"] == "attention"]
               for _, _, body in runs]  # fmt: skip
    assert windows == [[512] * 5 + [None], [512, 512]]
    assert any(layer["name"] == "l0_q_norm" and layer["shape"] == [256] for layer in runs[0][2])
    kv = _kv_per_layer(imported, 4096)
    assert sum(kv) == 2 * 256 * (22 * 512 + 4 * 4096)  # 1 KV head of 256


def test_gpt_oss_sinks_biases_and_layer_types_given() -> None:
    config = _load("gpt-oss-20b")
    imported = import_hf_config(config)
    [(_, times, body)] = _repeats(imported)
    assert times == 12
    assert [a.get("sliding_window") for a in body if a["op"] == "attention"] == [128, None]
    # one sink logit a head (64) in each of 24 layers
    no_sinks = json.loads(json.dumps(imported.layers).replace('"sinks": true', '"sinks": false'))
    analysis = analyze(imported.inputs, no_sinks, {"batch": 1, "seq": 16}, training=False)
    assert imported.parameter_count - analysis.params == 24 * 64
    moe = next(layer for layer in body if layer["op"] == "moe")
    assert (moe["num_experts"], moe["experts_per_token"], moe["bias"], moe["router_bias"]) == (
        32, 4, True, True)  # fmt: skip
    assert any("mxfp4" in note for note in imported.assumptions)
    # layer_types, when given, decides: all full layers leave no window
    full = import_hf_config({**config, "layer_types": ["full_attention"] * 24})
    assert all("sliding_window" not in a for _, _, b in _repeats(full) for a in b)
    assert full.parameter_count == imported.parameter_count


def test_deepseek_v2_lite_latent_attention_and_dense_first_layer() -> None:
    config = _load("deepseek-v2-lite-chat")
    imported = import_hf_config(config)
    runs = _repeats(imported)
    assert [(name, times) for name, times, _ in runs] == [("layers_0", 1), ("layers_1", 26)]
    dense = next(layer for layer in runs[0][2] if layer["op"] in ("mlp", "moe"))
    moe = next(layer for layer in runs[1][2] if layer["op"] in ("mlp", "moe"))
    assert (dense["op"], dense["intermediate_size"]) == ("mlp", 10944)
    assert (moe["op"], moe["num_experts"], moe["experts_per_token"]) == ("moe", 64, 6)
    assert moe["shared_intermediate_size"] == 2 * 1408  # n_shared_experts x moe_intermediate_size
    attention = next(layer for layer in runs[1][2] if layer["op"] == "attention")
    assert "q_lora_rank" not in attention  # null: one q_proj
    # the cache holds one latent of kv_lora_rank + qk_rope_head_dim a token and layer
    assert _kv_per_layer(imported, 1000) == [1000 * (512 + 64)] * 27
    # MLA weights a layer: q_proj, kv_a_proj_with_mqa, kv_a_layernorm, kv_b_proj, o_proj
    mla = 2048 * 16 * 192 + 2048 * 576 + 512 + 512 * 16 * 256 + 16 * 128 * 2048
    experts = 64 * 3 * 2048 * 1408 + 64 * 2048 + 3 * 2048 * 2816
    embeddings = 2 * 102400 * 2048
    assert imported.parameter_count == (
        27 * (mla + 2 * 2048) + 3 * 2048 * 10944 + 26 * experts + embeddings + 2048
    )
    no_shared = import_hf_config({**config, "n_shared_experts": None}).parameter_count
    assert imported.parameter_count - no_shared == 26 * 3 * 2048 * 2816


def test_deepseek_v3_low_rank_queries_and_three_dense_layers() -> None:
    imported = import_hf_config(_load("deepseek-v3"))
    runs = _repeats(imported)
    assert [(name, times) for name, times, _ in runs] == [("layers_0", 3), ("layers_3", 58)]
    attention = next(layer for layer in runs[0][2] if layer["op"] == "attention")
    assert attention["q_lora_rank"] == 1536
    as_full_rank = import_hf_config({**_load("deepseek-v3"), "q_lora_rank": None})
    low_rank = 7168 * 1536 + 1536 + 1536 * 128 * 192
    assert imported.parameter_count - as_full_rank.parameter_count == 61 * (
        low_rank - 7168 * 128 * 192
    )


def test_qwen_moe_shared_expert_gate_and_dense_layers() -> None:
    config = _load("qwen1.5-moe-a2.7b")
    imported = import_hf_config(config)
    [(_, times, body)] = _repeats(imported)
    moe = next(layer for layer in body if layer["op"] == "moe")
    assert (times, moe["shared_intermediate_size"], moe["shared_expert_gate"]) == (24, 5632, True)
    attention = next(layer for layer in body if layer["op"] == "attention")
    assert (attention["qkv_bias"], attention["out_bias"]) == (True, False)
    # layers in mlp_only_layers get a dense MLP of intermediate_size instead
    mixed = import_hf_config({**config, "mlp_only_layers": [0]})
    assert [(n, t) for n, t, _ in _repeats(mixed)] == [("layers_0", 1), ("layers_1", 23)]
    expert_block = 60 * (3 * 2048 * 1408) + 60 * 2048 + 3 * 2048 * 5632 + 2048
    assert imported.parameter_count - mixed.parameter_count == expert_block - 3 * 2048 * 5632
    qwen3 = import_hf_config(_load("qwen3-30b-a3b"))
    [(_, _, body)] = _repeats(qwen3)
    assert "shared_intermediate_size" not in next(x for x in body if x["op"] == "moe")
    assert [x["name"] for x in body if x["op"] == "tensor"] == ["q_norm", "k_norm"]


def test_llama4_maverick_interleaves_dense_and_moe_layers() -> None:
    imported = import_hf_config(_load("llama-4-maverick-17b-128e-text"))
    [(_, times, body)] = _repeats(imported)
    ffn = [layer for layer in body if layer["op"] in ("mlp", "moe")]
    assert times == 24
    assert [(f["op"], f["intermediate_size"]) for f in ffn] == [("mlp", 16384), ("moe", 8192)]
    assert ffn[1]["shared_intermediate_size"] == 8192
    scout = import_hf_config(_load("llama-4-scout-17b-16e-text"))
    assert [(n, t) for n, t, _ in _repeats(scout)] == [("layers", 48)]


@pytest.mark.parametrize(
    ("name", "change", "pointer"),
    [
        ("gemma-2-9b-it", {"layer_types": ["sliding_attention"] * 41}, "/config/layer_types"),
        ("gemma-2-9b-it", {"layer_types": ["local"] * 42}, "/config/layer_types"),
        ("gemma-2-9b-it", {"sliding_window": None}, "/config/sliding_window"),
        ("gemma-2-9b-it", {"num_key_value_heads": 5}, "/config/num_key_value_heads"),
        ("gemma-3-1b-it", {"hidden_size": None}, "/config/hidden_size"),
        ("gpt-oss-20b", {"num_experts_per_tok": 33}, "/config/num_experts_per_tok"),
        ("deepseek-v2-lite-chat", {"kv_lora_rank": None}, "/config/kv_lora_rank"),
        ("deepseek-v2-lite-chat", {"qk_rope_head_dim": 0}, "/config/qk_rope_head_dim"),
        ("deepseek-v2-lite-chat", {"num_experts_per_tok": 65}, "/config/num_experts_per_tok"),
        ("deepseek-v2-lite-chat", {"first_k_dense_replace": -1}, "/config/first_k_dense_replace"),
        ("deepseek-v2-lite-chat", {"n_shared_experts": "two"}, "/config/n_shared_experts"),
        ("deepseek-v3", {"q_lora_rank": 1.5}, "/config/q_lora_rank"),
        ("qwen1.5-moe-a2.7b", {"shared_expert_intermediate_size": None},
         "/config/shared_expert_intermediate_size"),
        ("qwen1.5-moe-a2.7b", {"num_attention_heads": 15}, "/config/num_attention_heads"),
        ("qwen3-30b-a3b", {"mlp_only_layers": [48]}, "/config/mlp_only_layers"),
        ("llama-4-scout-17b-16e-text", {"moe_layers": [0, 99]}, "/config/moe_layers"),
        ("llama-4-scout-17b-16e-text", {"intermediate_size_mlp": None},
         "/config/intermediate_size_mlp"),
    ],
)  # fmt: skip
def test_bad_family_configs_name_the_field(name: str, change: dict[str, Any], pointer: str) -> None:
    with pytest.raises(ImportRejected) as caught:
        import_hf_config({**_load(name), **change})
    assert caught.value.pointer == pointer
    assert pointer.rsplit("/", 1)[1] in caught.value.detail


def test_multimodal_wrappers_are_not_taken_for_their_text_model() -> None:
    """``gemma3`` / ``llama4`` configs wrap a vision tower: only the text model types import."""
    for model_type in ("gemma3", "llama4", "deepseek_vl_v2"):
        with pytest.raises(ImportRejected) as caught:
            import_hf_config({"model_type": model_type})
        assert caught.value.kind == "unsupported-model-type"
        assert "gemma3_text" in caught.value.detail
        assert "llama4_text" in caught.value.detail


def test_latent_attention_needs_its_head_sizes() -> None:
    """The graph format: ``kv_lora_rank`` without the other MLA sizes names the missing one."""
    imported = import_hf_config(_load("deepseek-v2-lite-chat"))
    broken = json.loads(json.dumps(imported.layers))
    for run in broken:
        for layer in run.get("layers", []):
            layer.pop("v_head_dim", None)
    with pytest.raises(GraphError) as caught:
        analyze(imported.inputs, broken, {"batch": 1, "seq": 8}, training=False)
    assert caught.value.field == "v_head_dim"
