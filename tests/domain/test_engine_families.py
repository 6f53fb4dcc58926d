"""Engine weights of MLA and DeepSeek MoE (app.domain.engines.families), hand-derived, and the
serving geometry app.services.serving_geometry.serving_model reads from imported served families."""

import json
from typing import Any

import pytest

from app.config import PROJECT_ROOT
from app.domain.engines.families import MlaGeometry, decoder_layers_params
from app.domain.engines.vllm import (
    H100_80GB_CUDA_VISIBLE_BYTES,
    ServingModel,
    VllmOptions,
    decoder_stage_weights_bytes,
    engine_memory,
)
from app.importers.hf_config import import_hf_config
from app.services.errors import InvalidInput
from app.services.serving_geometry import serving_model

CONFIGS = PROJECT_ROOT / "tests" / "fixtures" / "hf_configs"

# deepseek-ai/DeepSeek-V2-Lite-Chat's config.json, by hand
DEEPSEEK_V2_LITE = ServingModel(
    layers=27,
    hidden_size=2048,
    attention_heads=16,
    kv_heads=16,
    head_dim=192,
    intermediate_size=1408,
    vocab_size=102400,
    experts=64,
    experts_per_token=6,
    mla_latent_dim=576,
    max_position_embeddings=4096,
    mla=MlaGeometry(kv_lora_rank=512, qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128),
    shared_expert_intermediate_size=2816,
    dense_layers=(0,),
    dense_intermediate_size=10944,
)


def _load(name: str) -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads((CONFIGS / f"{name}.json").read_text())
    return loaded


def _served(name: str) -> ServingModel:
    imported = import_hf_config(_load(name))
    return serving_model(name, imported.layers, imported.default_bindings)


def test_deepseek_v2_lite_weights_at_tp1_are_the_transformers_count() -> None:
    """The vocabulary (102,400) is already a multiple of 64: at TP 1 vLLM holds every parameter
    transformers counts (benchmarks/hf_params), in bf16."""
    assert decoder_stage_weights_bytes(DEEPSEEK_V2_LITE, 1, 1, 2) == (2 * 15_706_484_224,)


def test_deepseek_v2_lite_weights_split_over_tensor_ranks() -> None:
    h = 2048
    # replicated on every rank: kv_a_proj_with_mqa, kv_a_layernorm, the two layer norms
    replicated = h * 576 + 512 + 2 * h
    split = h * 16 * 192 + 512 * 16 * 256 + 16 * 128 * h  # q_proj, kv_b_proj, o_proj
    moe = 64 * 3 * h * 1408 + 3 * h * 2816  # routed and shared experts (split); router whole
    layers = decoder_layers_params(DEEPSEEK_V2_LITE, 2, llama_layer=0)
    assert layers[0] == replicated + split // 2 + 3 * h * 10944 // 2
    assert layers[1:] == (replicated + split // 2 + moe // 2 + h * 64,) * 26
    weights = decoder_stage_weights_bytes(DEEPSEEK_V2_LITE, 2, 1, 2)
    embed = 102400 // 2 * h
    assert weights == (2 * (sum(layers) + 2 * embed + h),)
    # pipeline stages: the dense layer is on the first stage only
    first, last = decoder_stage_weights_bytes(DEEPSEEK_V2_LITE, 1, 2, 2)
    per_layer = decoder_layers_params(DEEPSEEK_V2_LITE, 1, llama_layer=0)
    assert per_layer[0] != per_layer[1]
    assert first + last == 2 * 15_706_484_224


def test_mla_caches_one_latent_replicated_on_every_rank() -> None:
    one = engine_memory(DEEPSEEK_V2_LITE, VllmOptions(), H100_80GB_CUDA_VISIBLE_BYTES,
                        decoder_stage_weights_bytes(DEEPSEEK_V2_LITE, 1, 1, 2))  # fmt: skip
    assert one.stages[0].kv_bytes_per_token == 27 * 576 * 2
    two = engine_memory(DEEPSEEK_V2_LITE, VllmOptions(tensor_parallel_size=2),
                        H100_80GB_CUDA_VISIBLE_BYTES,
                        decoder_stage_weights_bytes(DEEPSEEK_V2_LITE, 2, 1, 2))  # fmt: skip
    assert two.stages[0].kv_bytes_per_token == 27 * 576 * 2
    assert two.kv_tokens > one.kv_tokens  # half the weights, the same latent a token


def test_llama_style_models_keep_their_weights() -> None:
    """A model without MLA, shared experts or dense layers: every layer the caller's count."""
    mixtral = _served("mixtral-8x7b-v0.1")
    assert decoder_layers_params(mixtral, 2, llama_layer=123) == (123,) * 32


def test_serving_model_reads_imported_served_families() -> None:
    imported = import_hf_config(_load("deepseek-v2-lite-chat"))
    assert serving_model("ds", imported.layers, imported.default_bindings) == DEEPSEEK_V2_LITE
    gemma2 = _served("gemma-2-9b-it")
    assert (gemma2.layers, gemma2.sliding_window, gemma2.norms_per_layer) == (42, 4096, 4)
    assert (gemma2.kv_heads, gemma2.head_dim, gemma2.tie_word_embeddings) == (8, 256, True)
    qwen = _served("qwen1.5-moe-a2.7b")
    assert (qwen.experts, qwen.experts_per_token, qwen.intermediate_size) == (60, 4, 1408)
    assert (qwen.shared_expert_intermediate_size, qwen.shared_expert_gate) == (5632, True)
    # TP 1 weights = transformers' count: every Qwen1.5-MoE parameter is a linear or a norm
    assert decoder_stage_weights_bytes(qwen, 1, 1, 2) == (2 * 14_315_784_192,)
    maverick = _served("llama-4-maverick-17b-128e-text")
    assert maverick.dense_layers == tuple(range(0, 48, 2))
    assert (maverick.dense_intermediate_size, maverick.shared_expert_intermediate_size) == (
        16384, 8192)  # fmt: skip
    assert decoder_stage_weights_bytes(maverick, 1, 1, 2) == (2 * 400_711_848_960,)
    gemma3 = _served("gemma-3-1b-it")
    assert (gemma3.layers, gemma3.sliding_window) == (26, 512)


def test_serving_model_refuses_layers_that_differ_in_attention() -> None:
    imported = import_hf_config(_load("gemma-2-9b-it"))
    layers = json.loads(json.dumps(imported.layers))
    body = next(layer for layer in layers if layer["op"] == "repeat")["layers"]
    next(layer for layer in body if layer["name"] == "l1_self_attn")["num_kv_heads"] = 4
    with pytest.raises(InvalidInput) as caught:
        serving_model("odd", layers, imported.default_bindings)
    assert caught.value.pointer == "/model"
    assert "attention geometry" in str(caught.value)
