"""Golden tests (issue 32): what CUDA autocast makes a transformer keep beyond the 16-bit
activations, measured against the H100/H200 rows of BERT-base AMP (benchmarks/fidelity/cuda).

* a LayerNorm keeps its input in fp32 (``layer_norm`` is on CUDA autocast's fp32 list, PyTorch
  aten/src/ATen/autocast_mode.h ``AT_FORALL_FP32``; the residual stream it reads is fp32);
* q, k and v as three Linear calls each keep their own 16-bit cast of the fp32 input
  (autocast caches casts of weights only, aten/src/ATen/autocast_mode.cpp ``cached_cast``);
  GPT-2's one ``c_attn`` keeps one.

Observed on PyTorch 2.13 CPU autocast bf16 (transformers BertModel, saved_tensors_hooks, deduped
by storage): per encoder layer query, key and value each keep a bf16 [tokens, hidden] cast, and
the two LayerNorms (and the embeddings') keep the fp32 residual sum they normalise."""

from __future__ import annotations

import json
from pathlib import Path

from app.domain.graph.analysis import GraphAnalysis, analyze
from app.domain.memory.formulas import Sizer, precision_plan
from app.domain.precision import Precision
from app.domain.workload import Runtime
from app.domain.zoo import ZooModel, bert, gpt2, llama
from app.importers.hf_config import import_hf_config

HIDDEN, HEADS, LAYERS, BATCH, SEQ = 64, 4, 2, 2, 16
TOKENS = BATCH * SEQ


def _analysis(model: ZooModel, precision: Precision, runtime: Runtime) -> GraphAnalysis:
    return analyze(
        model.inputs,
        model.layers,
        {**model.default_bindings, "batch": BATCH, "seq": SEQ},
        training=True,
        runtime=runtime,
        precision=precision,
    )


def _input_bytes(model: ZooModel, op: str, precision: Precision, runtime: Runtime) -> list[int]:
    """Per layer of ``op``: bytes of the tensors it keeps labelled ``input``."""
    sizer = Sizer(precision_plan(precision), runtime)
    analysis = _analysis(model, precision, runtime)
    return [
        sum(sizer.storage_bytes(s.numel, s.storage) for s in layer.result.saved
            if s.label == "input")
        for layer in analysis.layers
        if layer.op == op
    ]  # fmt: skip


def _bert() -> ZooModel:
    return bert(layers=LAYERS, hidden=HIDDEN, heads=HEADS, vocab=100, positions=64)


def test_bert_layernorms_keep_an_fp32_input_under_cuda_autocast() -> None:
    """The embeddings' LayerNorm and two a block: 2,048 elements x 4 B each (was 2 B)."""
    kept = _input_bytes(_bert(), "layernorm", Precision.AMP_BF16, Runtime.CUDA)
    assert kept == [TOKENS * HIDDEN * 4] * (1 + 2 * LAYERS) == [8192] * 5


def test_bert_q_k_v_keep_three_16_bit_casts_under_cuda_autocast() -> None:
    """Three separate projections: three bf16 casts of the fp32 input, 3 x 2,048 x 2 B."""
    kept = _input_bytes(_bert(), "attention", Precision.AMP_BF16, Runtime.CUDA)
    assert kept == [3 * TOKENS * HIDDEN * 2] * LAYERS == [12288] * 2


def test_gpt2_fused_c_attn_keeps_one_cast() -> None:
    """GPT-2's c_attn is one projection: one cast (2 B an element), its LayerNorms fp32."""
    model = gpt2(layers=LAYERS, hidden=HIDDEN, heads=HEADS, vocab=100, positions=64)
    assert _input_bytes(model, "attention", Precision.AMP_BF16, Runtime.CUDA) == [4096] * 2
    assert _input_bytes(model, "layernorm", Precision.AMP_BF16, Runtime.CUDA) == [8192] * 5


def test_no_rule_outside_cuda_autocast() -> None:
    """Pure bf16 on CUDA and autocast on CPU keep the 16-bit input once, as before."""
    for precision, runtime in ((Precision.BF16, Runtime.CUDA), (Precision.AMP_BF16, Runtime.CPU)):
        assert _input_bytes(_bert(), "attention", precision, runtime) == [4096] * 2
        assert _input_bytes(_bert(), "layernorm", precision, runtime) == [4096] * 5
    fp32 = _input_bytes(_bert(), "layernorm", Precision.FP32, Runtime.CUDA)
    assert fp32 == [8192] * 5  # fp32 activations: the input itself, 4 B


def test_importers_mark_one_projection_models() -> None:
    """Phi-3's qkv_proj and BLOOM's query_key_value are one projection: one cast each."""
    fixture = Path(__file__).parents[1] / "fixtures" / "hf_configs" / "phi-3-mini-4k-instruct.json"
    bloom = {"model_type": "bloom", "hidden_size": 64, "n_head": 4, "n_layer": 2,
             "vocab_size": 100}  # fmt: skip
    for config in (json.loads(fixture.read_text()), bloom):
        graph = import_hf_config(config, sequence_length=SEQ)
        attention = [inner for layer in graph.layers for inner in layer.get("layers") or []
                     if inner["op"] == "attention"]  # fmt: skip
        assert attention
        assert all(inner["fused_qkv_projection"] is True for inner in attention)


def test_gated_mlp_gate_and_up_keep_two_16_bit_casts_under_cuda_autocast() -> None:
    """Llama's gate_proj and up_proj are two Linear calls on the fp32 input: each keeps its own
    bf16 cast (2 x 2,048 elements x 2 B); without autocast the input is kept once. Phi-3's one
    gate_up_proj keeps one (its importer marks the MLP)."""
    model = llama(layers=LAYERS, hidden=HIDDEN, heads=HEADS, kv_heads=HEADS, intermediate=128,
                  vocab=100, positions=64)  # fmt: skip
    assert _input_bytes(model, "mlp", Precision.AMP_BF16, Runtime.CUDA) == [8192] * LAYERS
    assert _input_bytes(model, "mlp", Precision.BF16, Runtime.CUDA) == [4096] * LAYERS
    assert _input_bytes(model, "mlp", Precision.AMP_BF16, Runtime.CPU) == [4096] * LAYERS
    fixture = Path(__file__).parents[1] / "fixtures" / "hf_configs" / "phi-3-mini-4k-instruct.json"
    graph = import_hf_config(json.loads(fixture.read_text()), sequence_length=SEQ)
    mlps = [inner for layer in graph.layers for inner in layer.get("layers") or []
            if inner["op"] == "mlp"]  # fmt: skip
    assert mlps
    assert all(inner["fused_gate_up_projection"] is True for inner in mlps)
