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
from app.domain.memory.estimate import MemoryRequest, analyze_for, estimate_memory
from app.domain.precision import Precision
from app.domain.workload import Mode, Optimizer, Runtime
from app.domain.zoo import lstm_classifier
from app.importers.onnx_model import import_onnx

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
