"""Real torch.onnx.export output, committed graph-only (weights stripped: a few KB), imports
like the zoo's hand-built graph: exact parameters and the same memory estimate.

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
