"""The profile forward's peak from the graph (app.domain.engines.profile_forward): golden bytes
derived by hand for a tiny Llama-style decoder."""

from __future__ import annotations

import math
from typing import Any

import pytest

from app.domain.engines.profile_forward import (
    ProfileGraphError,
    graph_forward_peak,
    profile_forward_bindings,
    profile_forward_request,
)
from app.domain.engines.vllm import (
    H100_80GB_CUDA_VISIBLE_BYTES,
    VLLM_0_19,
    ServingModel,
    VllmOptions,
    decoder_stage_weights_bytes,
    engine_memory,
    graph_forward_peak_bytes,
    sampler_peak_bytes,
)
from app.domain.graph.analysis import InputDecl
from app.domain.units import MIB
from app.domain.workload import Attention, Logits, Mode
from app.importers.hf_config import import_hf_config

# A tiny Llama: hidden 1024, gated MLP 4096, 8 heads of 128 (2 KV heads), 2 layers.
TINY_LLAMA: dict[str, Any] = {
    "model_type": "llama",
    "hidden_size": 1024,
    "intermediate_size": 4096,
    "num_attention_heads": 8,
    "num_key_value_heads": 2,
    "num_hidden_layers": 2,
    "vocab_size": 32000,
    "max_position_embeddings": 4096,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "rms_norm_eps": 1e-5,
}
TOKENS = 512
CUBLAS_WORKSPACE = 32 * MIB  # the memory engine's Hopper cuBLAS workspace, one handle


def _peak(tp: int, dtype: str = "bfloat16") -> Any:
    graph = import_hf_config(TINY_LLAMA)
    return graph_forward_peak(
        graph.inputs,
        graph.layers,
        graph.default_bindings,
        tokens=TOKENS,
        tensor_parallel_size=tp,
        dtype=dtype,
    )


def test_tiny_llama_profile_forward_golden_bytes() -> None:
    peak = _peak(1)
    hidden = TOKENS * 1024 * 2  # one [512, 1024] bf16 tensor: 1 MiB
    input_ids = TOKENS * 8  # int64 token ids
    parts = dict(peak.lines)
    # At the peak, inside layer 0's MLP: the input ids (the inputs line; until issue 32 the
    # activations counted them too), the residual sum, the norm output and the MLP output live...
    assert parts["inputs"] == input_ids == 4096
    assert parts["activations"] == 3 * hidden == 3_145_728
    # ... and the gated MLP's gate, up and their product: 3 x 512 x 4096 x 2 B. No S x S scores
    # (flash), no KV cache, no logits over the 512 tokens.
    assert parts["transient"] == 3 * TOKENS * 4096 * 2 == 12 * MIB
    assert parts["workspace"] == CUBLAS_WORKSPACE
    assert parts["allocator_rounding"] == 0
    assert peak.peak_bytes == 4096 + 3_145_728 + 12 * MIB + 32 * MIB == 49_287_168
    assert peak.where == "during the forward of 'layers.0.mlp'"
    assert (peak.tokens, peak.tensor_parallel_size, peak.attention) == (512, 1, "flash")


def test_tensor_parallel_splits_the_mlp_intermediate_and_adds_the_all_reduce_output() -> None:
    parts = dict(_peak(2).lines)
    # 1/2 of gate, up and product per rank, plus the row-parallel all-reduce's [512, 1024] output
    assert parts["transient"] == 3 * TOKENS * 2048 * 2 + TOKENS * 1024 * 2 == 7 * MIB
    assert parts["activations"] == 3_145_728  # the hidden states are whole on every rank
    assert _peak(2).peak_bytes < _peak(1).peak_bytes


def test_fp32_doubles_the_activations_and_uses_memory_efficient_attention() -> None:
    peak = _peak(1, "float32")
    parts = dict(peak.lines)
    assert peak.attention == "mem_efficient"
    assert parts["transient"] == 3 * TOKENS * 4096 * 4 == 24 * MIB
    assert parts["activations"] == 3 * TOKENS * 1024 * 4


def test_the_engine_takes_the_graph_peak_times_its_factor() -> None:
    peak = _peak(1)
    forward = graph_forward_peak_bytes(peak.peak_bytes)
    assert forward == math.ceil(VLLM_0_19.graph_forward_factor * 49_287_168)
    model = ServingModel(
        layers=2,
        hidden_size=1024,
        attention_heads=8,
        kv_heads=2,
        head_dim=128,
        intermediate_size=4096,
        vocab_size=32000,
        max_position_embeddings=4096,
    )
    options = VllmOptions(max_num_batched_tokens=TOKENS, max_num_seqs=4)
    weights = decoder_stage_weights_bytes(model, 1, 1, 2)
    memory = engine_memory(
        model, options, H100_80GB_CUDA_VISIBLE_BYTES, weights, forward_peak=forward
    )
    assert sampler_peak_bytes(32000, 4) < forward
    assert memory.stages[0].peak_bytes == forward  # the forward exceeds the 4-row sampler


def test_the_request_is_an_inference_forward_without_kv_cache_or_all_logits() -> None:
    request = profile_forward_request("bfloat16", 4)
    assert request.mode is Mode.INFERENCE
    assert request.kv_cache is False
    assert request.attention is Attention.FLASH
    assert request.logits is Logits.LAST
    assert request.parallelism.tensor == 4


def test_a_dtype_without_activation_precision_is_refused() -> None:
    with pytest.raises(ProfileGraphError, match="fp8"):
        profile_forward_request("fp8", 1)


def test_a_graph_without_one_token_input_is_refused() -> None:
    image = InputDecl(name="pixels", shape=("batch", "channels", "height", "width"))
    with pytest.raises(ProfileGraphError, match="found 0"):
        profile_forward_bindings([image], {}, 512)
    tokens = InputDecl(name="input_ids", shape=("batch", "seq"))
    assert profile_forward_bindings([tokens], {"seq": 4096, "other": 3}, 512) == {
        "batch": 1,
        "seq": 512,
        "other": 3,
    }
