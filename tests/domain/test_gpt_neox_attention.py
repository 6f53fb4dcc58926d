"""Golden tests (issue 32, cluster B): GPT-NeoX's attention as transformers wrote it in mid-2024
(modeling_gpt_neox.py, the version of the published pythia-410m SDPA rows): the fused QKV
output kept whole by the value view, the fp32-rotated q and k, and the registered buffers.

The per-layer count is the one measured on CPU (transformers 4.43.4, PyTorch 2.13, pythia-410m's
shapes, fp16, SDPA, saved_tensors_hooks): 18 hidden-wide 16-bit storages a token and layer."""

from __future__ import annotations

from typing import Any

import pytest

from app.domain.graph.analysis import GraphAnalysis, analyze
from app.domain.graph.ops import Storage
from app.domain.precision import Precision
from app.domain.workload import Attention, Runtime
from app.importers.hf_config import import_hf_config

HIDDEN, HEADS, LAYERS, BATCH, SEQ = 64, 4, 2, 2, 16
TOKENS = BATCH * SEQ
PYTHIA_LIKE = {  # EleutherAI/pythia-410m-deduped's config.json, narrowed
    "model_type": "gpt_neox", "hidden_size": HIDDEN, "intermediate_size": 4 * HIDDEN,
    "num_attention_heads": HEADS, "num_hidden_layers": LAYERS, "max_position_embeddings": 128,
    "rotary_pct": 0.25, "use_parallel_residual": True, "tie_word_embeddings": False,
    "vocab_size": 100, "hidden_act": "gelu",
}  # fmt: skip


def _analysis(
    attention: Attention,
    precision: Precision = Precision.FP16,
    config: dict[str, Any] | None = None,
) -> GraphAnalysis:
    graph = import_hf_config(config or PYTHIA_LIKE, sequence_length=SEQ)
    return analyze(
        graph.inputs,
        graph.layers,
        {**graph.default_bindings, "batch": BATCH, "seq": SEQ},
        training=True,
        attention=attention,
        runtime=Runtime.CUDA,
        precision=precision,
    )


def _attention_saved(analysis: GraphAnalysis) -> dict[str, tuple[int, Storage]]:
    layer = next(layer for layer in analysis.layers if layer.op == "attention")
    return {s.label: (s.numel, s.storage) for s in layer.result.saved}


def test_sdpa_keeps_the_fused_qkv_output_and_16_bit_q_k_copies() -> None:
    saved = _attention_saved(_analysis(Attention.FLASH))
    assert saved["qkv_fused"] == (3 * TOKENS * HIDDEN, Storage.ACT)  # the value view's base
    assert "v" not in saved
    assert saved["q"] == (TOKENS * HIDDEN, Storage.ACT)  # query.to(value.dtype)
    assert saved["k"] == (TOKENS * HIDDEN, Storage.ACT)


def test_a_block_keeps_18_hidden_vectors_a_token_as_measured() -> None:
    """Block input, two layer-norm outputs, q, k, qkv (3), SDPA's output and its contiguous
    copy, the MLP's 4h input and output (4 + 4): 18 (the fp32 statistics and log-sum-exp aside)."""
    analysis = _analysis(Attention.FLASH)
    block = [layer for layer in analysis.layers if layer.name.startswith("layers.0.")]
    new = sum(
        s.numel
        for layer in block
        for s in layer.result.saved
        if s.source == "new" and s.storage is Storage.ACT
    )
    # the block input is the input layer norm's in0; its output is the attention's in0
    inputs = sum(
        s.numel
        for layer in block
        for s in layer.result.saved
        if layer.op == "layernorm" and s.label == "input" and layer.name.endswith("input_layernorm")
    )
    outputs = sum(
        s.numel for layer in block if layer.op in ("attention", "mlp") for s in layer.result.saved
        if s.label == "input"
    )  # fmt: skip
    assert (new + inputs + outputs) // (TOKENS * HIDDEN) == 18


def test_sdpa_training_holds_the_fp32_key_it_returns_as_the_layer_cache() -> None:
    """use_cache (pythia's config: true) returns (key, value) per layer with the model's output:
    the fp32-rotated key is a storage SDPA does not keep (it keeps the 16-bit copy)."""
    assert _attention_saved(_analysis(Attention.FLASH))["key_cache_fp32"] == (
        TOKENS * HIDDEN,
        Storage.FP32,
    )
    for precision, attention in (
        (Precision.FP32, Attention.FLASH),
        (Precision.FP16, Attention.EAGER),
    ):
        # fp32: no promotion; eager: the returned key is the fp32 k its baddbmm keeps
        assert "key_cache_fp32" not in _attention_saved(_analysis(attention, precision))


@pytest.mark.parametrize(
    ("precision", "storage"),
    [(Precision.FP16, Storage.FP32), (Precision.BF16, Storage.FP32), (Precision.FP32, Storage.ACT)],
)
def test_eager_keeps_the_fp32_rotated_q_and_k(precision: Precision, storage: Storage) -> None:
    saved = _attention_saved(_analysis(Attention.EAGER, precision))
    assert saved["q"] == (TOKENS * HIDDEN, storage)  # baddbmm's batch1, fp32 after the rotary
    assert saved["k"] == (TOKENS * HIDDEN, storage)
    assert saved["qkv_fused"] == (3 * TOKENS * HIDDEN, Storage.ACT)  # P x V keeps the value


def test_every_attention_layer_registers_the_mask_and_rotary_buffers() -> None:
    analysis = _analysis(Attention.FLASH)
    layers = [layer for layer in analysis.layers if layer.op == "attention"]
    rotary = int(HIDDEN // HEADS * 0.25)  # rotary_ndims = 4
    per_layer = 128 * 128 + 4 * (2 * 128 * rotary + rotary // 2)  # bool P x P; fp32 cos, sin
    assert [layer.result.buffers_bytes for layer in layers] == [per_layer] * LAYERS
    assert per_layer == 20_488


def test_pythia_410m_buffers_are_24_times_4_mib_and_the_rotary_caches() -> None:
    """pythia-410m (P 2,048, rotary_ndims 16): 24 x (4 MiB + 256 KiB + 32 B) = 106,955,520 B."""
    config = {**PYTHIA_LIKE, "hidden_size": 1024, "num_attention_heads": 16,
              "num_hidden_layers": 24, "intermediate_size": 4096,
              "max_position_embeddings": 2048}  # fmt: skip
    analysis = _analysis(Attention.FLASH, config=config)
    total = sum(layer.result.buffers_bytes for layer in analysis.layers)
    assert total == 24 * (2048 * 2048 + 4 * (2 * 2048 * 16 + 8)) == 106_955_520


def test_other_decoders_keep_v_alone_and_register_no_buffers() -> None:
    graph = import_hf_config(
        {
            "model_type": "gpt2",
            "n_embd": HIDDEN,
            "n_layer": 1,
            "n_head": HEADS,
            "vocab_size": 100,
            "n_positions": 128,
        },  # fmt: skip
        sequence_length=SEQ,
    )
    analysis = analyze(
        graph.inputs,
        graph.layers,
        {**graph.default_bindings, "batch": BATCH, "seq": SEQ},
        training=True,
        attention=Attention.EAGER,
        runtime=Runtime.CUDA,
        precision=Precision.FP16,
    )
    saved = _attention_saved(analysis)
    assert saved["v"] == (TOKENS * HIDDEN, Storage.ACT)
    assert saved["q"] == (TOKENS * HIDDEN, Storage.ACT)
    assert "qkv_fused" not in saved
    assert all(
        layer.result.buffers_bytes == 0 for layer in analysis.layers if layer.op == "attention"
    )
