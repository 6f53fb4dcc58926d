"""Real torch.onnx.export output imports like the zoo's hand-built graphs: exact parameters,
the exporter's patterns recognised, the same memory estimate.

`tests/fixtures/onnx/lstm_classifier_graph_only.onnx`: benchmarks/fidelity/models.py's
LSTMClassifier (embedding 20,000 x 128, LSTM 128 -> 256, linear 256 -> 2; 2,955,778
parameters) exported by torch 2.13.0 (TorchScript exporter, opset 17, dynamic batch and
sequence), then every float initializer's data cleared with the onnx package.
"""

from __future__ import annotations

import pytest

from app.config import PROJECT_ROOT
from app.domain.memory.estimate import (
    MemoryEstimate,
    MemoryRequest,
    analyze_for,
    estimate_memory,
)
from app.domain.precision import Precision
from app.domain.workload import Attention, Mode, Optimizer, Runtime
from app.domain.zoo import ZooModel, bert, gpt2, llama, lstm_classifier
from app.importers.onnx_model import import_onnx
from app.importers.result import ImportedGraph

FIXTURES = PROJECT_ROOT / "tests" / "fixtures" / "onnx"


@pytest.mark.parametrize("runtime", list(Runtime))
@pytest.mark.parametrize("mode", list(Mode))
def test_a_torch_exported_lstm_estimates_like_the_zoo_graph(mode: Mode, runtime: Runtime) -> None:
    imported = import_onnx((FIXTURES / "lstm_classifier_graph_only.onnx").read_bytes())
    assert imported.parameter_count == imported.source_parameter_count == 2_955_778
    assert not imported.unsupported
    assert "lstm" in [layer["op"] for layer in imported.layers]
    zoo = lstm_classifier()
    request = MemoryRequest(
        mode=mode, precision=Precision.FP32, runtime=runtime, optimizer=Optimizer.SGD_MOMENTUM
    )
    bindings = {"batch": 32, "seq": 128}
    ours = estimate_memory(
        analyze_for(imported.inputs, imported.layers, bindings, request), request
    )
    theirs = estimate_memory(
        analyze_for(zoo.inputs, zoo.layers, {**zoo.default_bindings, **bindings}, request), request
    )
    assert ours.params == theirs.params == 2_955_778
    assert ours.peak_bytes == theirs.peak_bytes


@pytest.mark.parametrize("form", ["erf", "tanh"])
def test_torch_gelu_exports_are_fused_into_one_gelu(form: str) -> None:
    """nn.Sequential(Linear(16, 64), GELU(approximate=...), Linear(64, 4)) exported by torch
    2.13 at opset 17: GELU arrives as Div/Erf/Add/Mul/Mul (erf) or Pow/Mul/Add/Mul/Tanh/...
    (tanh) and is imported as one gelu layer, named in the report."""
    data = (FIXTURES / f"mlp_gelu_{form}_torch_export.onnx").read_bytes()
    imported = import_onnx(data)
    assert [layer["op"] for layer in imported.layers] == ["linear", "gelu", "linear"]
    gelu = imported.layers[1]
    assert gelu.get("approximate", "none") == ("tanh" if form == "tanh" else "none")
    assert imported.parameter_count == 16 * 64 + 64 + 64 * 4 + 4
    assert f"fused 1 exporter subgraph(s): GELU ({form} form) -> gelu" in imported.assumptions


# Tiny Hugging Face models exported by torch 2.13.0 / transformers 5.23.0 with
# scripts/export_onnx_fixtures.py (graph-only: float data cleared, provenance metadata trimmed).
ATTENTION_EXPORTS = {
    # file: (torch's parameter count, attention layers expected)
    "bert_sdpa_dynamo": (22_368 - (32 * 32 + 32), {"num_heads": 4, "num_kv_heads": 4,
                         "head_dim": 8, "causal": False, "qkv_bias": True, "out_bias": True}),
    "bert_eager_torchscript": (22_368 - (32 * 32 + 32), {"num_heads": 4, "num_kv_heads": 4,
                               "head_dim": 8, "causal": False, "qkv_bias": True,
                               "out_bias": True}),
    "gpt2_sdpa_dynamo": (29_568, {"num_heads": 4, "num_kv_heads": 4, "head_dim": 8,
                         "causal": True, "qkv_bias": True, "out_bias": True}),
    "llama_gqa_sdpa_dynamo": (22_688, {"num_heads": 4, "num_kv_heads": 2, "head_dim": 8,
                              "causal": True, "qkv_bias": False, "out_bias": False,
                              "rotary": True}),
}  # fmt: skip


@pytest.mark.parametrize("name", list(ATTENTION_EXPORTS))
def test_exported_attention_is_one_attention_layer_with_exact_parameters(name: str) -> None:
    """The exporters' attention (dynamo: SDPA decomposed with its IsNaN fix, causal masks from
    Range comparisons, GQA Expand/Reshape, rotary Slice/Neg/Concat, GPT-2's fused qkv Gemm and
    Split; TorchScript: MatMul/Softmax) imports as the graph's own attention op, strictly (no
    opaque layers), with torch's parameter count (BERT's unused pooler is not exported)."""
    params, expected = ATTENTION_EXPORTS[name]
    imported = import_onnx((FIXTURES / f"{name}.onnx").read_bytes())
    assert imported.parameter_count == imported.source_parameter_count == params
    attentions = [layer for layer in imported.layers if layer["op"] == "attention"]
    assert len(attentions) == 2
    for layer in attentions:
        assert {k: v for k, v in layer.items() if k not in ("name", "inputs")} == {
            "op": "attention",
            **expected,
        }
    ops = {layer["op"] for layer in imported.layers}
    assert not ops & {"matmul", "softmax", "opaque", "transpose"}
    assert any("attention written out -> attention" in a for a in imported.assumptions)


def test_a_graph_only_dynamo_export_ties_the_lm_head_by_its_provenance() -> None:
    """GPT-2's LM head reads a constant-folded transposed copy of the embedding table: with no
    weight data, the dynamo exporter's node metadata (``aten.linear(.., %p_..lm_head_weight)``)
    names the parameter, which the embedding also reads: tied, counted once."""
    imported = import_onnx((FIXTURES / "gpt2_sdpa_dynamo.onnx").read_bytes())
    layers = {layer["name"]: layer for layer in imported.layers}
    head = imported.layers[-1]
    assert head["op"] == "linear"
    assert head["out_features"] == 64
    assert layers[head["tied_to"]]["op"] == "embedding"
    assert any("is a transposed copy of 'model.lm_head.weight'" in a for a in imported.assumptions)


ZOO_TWINS = {
    "bert_sdpa_dynamo": lambda: bert(
        layers=2, hidden=32, heads=4, vocab=64, positions=64, intermediate=64, pooler=False,
        dropout=0.0,
    ),
    "bert_eager_torchscript": lambda: bert(
        layers=2, hidden=32, heads=4, vocab=64, positions=64, intermediate=64, pooler=False,
        dropout=0.0,
    ),
    "gpt2_sdpa_dynamo": lambda: gpt2(
        layers=2, hidden=32, heads=4, vocab=64, positions=64, dropout=0.0
    ),
    "llama_gqa_sdpa_dynamo": lambda: llama(
        layers=2, hidden=32, heads=4, kv_heads=2, intermediate=64, vocab=64
    ),
}  # fmt: skip


@pytest.mark.parametrize("attention", [Attention.EAGER, Attention.FLASH])
@pytest.mark.parametrize("mode", list(Mode))
@pytest.mark.parametrize("name", list(ZOO_TWINS))
def test_exported_transformers_estimate_like_their_zoo_twins(
    name: str, mode: Mode, attention: Attention
) -> None:
    """With attention, feed-forward (GPT-2's op-by-op ``gelu_new`` told by the dynamo
    exporter's provenance), norms and the tied head recognised, an exported tiny transformer
    has the zoo graph's parameters and memory estimate to the byte (eval-mode exports carry no
    dropout: the twins are built without)."""
    imported = import_onnx((FIXTURES / f"{name}.onnx").read_bytes())
    ours, theirs = _twin_estimates(imported, ZOO_TWINS[name](), mode, attention)
    assert ours.params == theirs.params
    assert ours.peak_bytes == theirs.peak_bytes
    assert [layer["op"] for layer in imported.layers].count("mlp") == 2


def _twin_estimates(
    imported: ImportedGraph, zoo: ZooModel, mode: Mode, attention: Attention
) -> tuple[MemoryEstimate, MemoryEstimate]:
    """The CPU fp32 AdamW estimates of an imported graph and its zoo twin, batch 4 x 32."""
    request = MemoryRequest(
        mode=mode, precision=Precision.FP32, runtime=Runtime.CPU, optimizer=Optimizer.ADAMW,
        attention=attention,
    )  # fmt: skip
    bindings = {"batch": 4, "seq": 32}
    ours = estimate_memory(
        analyze_for(imported.inputs, imported.layers, bindings, request), request
    )
    theirs = estimate_memory(
        analyze_for(zoo.inputs, zoo.layers, {**zoo.default_bindings, **bindings}, request), request
    )
    return ours, theirs


@pytest.mark.parametrize("attention", [Attention.EAGER, Attention.FLASH])
def test_a_train_mode_export_carries_its_dropout(attention: Attention) -> None:
    """The dynamo exporter's SDPA translation leaves attention dropout out of the ONNX graph;
    its provenance (``aten.scaled_dot_product_attention(q, k, v, mask, 0.1)``) keeps it, and
    the Dropout nodes' ratio is an input (0.1, not a default 0.5): the training estimate equals
    the zoo BERT's with dropout 0.1 (on CPU, SDPA's math kernel under attention dropout)."""
    imported = import_onnx((FIXTURES / "bert_sdpa_dynamo_train.onnx").read_bytes())
    assert {layer.get("dropout") for layer in imported.layers if layer["op"] == "attention"} == {
        0.1
    }
    assert {layer["p"] for layer in imported.layers if layer["op"] == "dropout"} == {0.1}
    zoo = bert(layers=2, hidden=32, heads=4, vocab=64, positions=64, intermediate=64,
               pooler=False, dropout=0.1)  # fmt: skip
    ours, theirs = _twin_estimates(imported, zoo, Mode.TRAINING, attention)
    assert ours.peak_bytes == theirs.peak_bytes


@pytest.mark.parametrize("mode", ["train", "eval"])
def test_batch_norm_folded_by_the_dynamo_optimizer_is_restored(mode: str) -> None:
    """torch.onnx.export(dynamo=True) folds BatchNorm2d into the convolution before it, in train
    mode too (scripts/export_onnx_fixtures.py: Conv(3, 8, no bias), BatchNorm2d(8, eps 1e-3),
    ReLU, Conv(8, 8), BatchNorm2d(8, affine=False); 816 parameters). The Conv node's provenance
    names the batch norm: it comes back after its convolution, with its eps and parameters,
    and the bias the fold made for the first convolution is not counted."""
    imported = import_onnx((FIXTURES / f"conv_batchnorm_dynamo_{mode}.onnx").read_bytes())
    assert imported.parameter_count == imported.source_parameter_count == 816
    shown = [{k: v for k, v in layer.items() if k not in ("name", "inputs", "stride", "padding",
              "dilation", "groups", "kernel_size")} for layer in imported.layers]  # fmt: skip
    assert shown == [
        {"op": "conv2d", "out_channels": 8, "bias": False},
        {"op": "batchnorm2d", "eps": 1e-3},
        {"op": "relu"},
        {"op": "conv2d", "out_channels": 8, "bias": True},
        {"op": "batchnorm2d", "eps": 1e-5, "affine": False},
    ]
    assert any(a.startswith("2 batch norm(s) restored") for a in imported.assumptions)
    request = MemoryRequest(mode=Mode.TRAINING, precision=Precision.FP32, runtime=Runtime.CPU)
    analysis = analyze_for(imported.inputs, imported.layers, {"batch": 2}, request)
    said = estimate_memory(analysis, request).assumptions
    assert not any(a.startswith("cannot see batch norm") for a in said)


@pytest.mark.parametrize(
    ("name", "cell", "params"),
    [("gru_classifier_dynamo", "gru", 1_794), ("rnn_classifier_torchscript", "rnn", 962)],
)
@pytest.mark.parametrize("mode", list(Mode))
def test_exported_gru_and_rnn_estimate_like_the_zoo(
    name: str, cell: str, params: int, mode: Mode
) -> None:
    """Embedding(64, 8), GRU or RNN(8, 16, batch_first), Linear(16, 2) (scripts/
    export_onnx_fixtures.py): the dynamo exporter writes an ONNX GRU node; the TorchScript
    exporter an ONNX RNN node (the dynamo exporter unrolls nn.RNN over the example's steps). Both
    import as the graph's recurrent op, with the zoo classifier's parameters and estimate."""
    imported = import_onnx((FIXTURES / f"{name}.onnx").read_bytes())
    assert imported.parameter_count == imported.source_parameter_count == params
    assert cell in [layer["op"] for layer in imported.layers]
    zoo = lstm_classifier(vocab=64, embed=8, hidden=16, cell=cell)
    request = MemoryRequest(mode=mode, precision=Precision.FP32, runtime=Runtime.CPU)
    bindings = {"batch": 32, "seq": 128}
    ours = estimate_memory(
        analyze_for(imported.inputs, imported.layers, bindings, request), request
    )
    theirs = estimate_memory(
        analyze_for(zoo.inputs, zoo.layers, {**zoo.default_bindings, **bindings}, request), request
    )
    assert ours.params == theirs.params == params
    assert ours.peak_bytes == theirs.peak_bytes
