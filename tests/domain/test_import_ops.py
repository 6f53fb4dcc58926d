"""Ops the importers need: matmul, elementwise, reduce, slice, tensor, opaque, moe."""

from typing import Any

import pytest

from app.domain.errors import GraphError
from app.domain.graph.analysis import InputDecl, analyze
from app.domain.graph.ops import Transient
from app.domain.memory.estimate import MemoryRequest, estimate_memory
from app.domain.workload import Mode, Runtime

X = InputDecl(name="x", shape=("batch", 4, 8))


def _run(layers: list[dict[str, Any]], *, training: bool = True, batch: int = 2) -> Any:
    return analyze([X], layers, {"batch": batch}, training=training)


def test_matmul_shapes_flops_and_saved_inputs() -> None:
    analysis = _run(
        [
            {"name": "t", "op": "transpose", "dim0": 1, "dim1": 2},
            {"name": "scores", "op": "matmul", "inputs": ["x", "t"]},
        ]
    )
    scores = analysis.layers[-1]
    assert scores.output_shape == (2, 4, 4)
    assert scores.flops == 2 * 2 * 4 * 8 * 4
    assert [(s.source, s.numel) for s in scores.saved] == [("in0", 64), ("in1", 64)]
    with pytest.raises(GraphError, match="inner sizes differ"):
        _run([{"name": "bad", "op": "matmul", "inputs": ["x", "x"]}])


def test_elementwise_broadcasts_and_keeps_what_autograd_keeps() -> None:
    analysis = _run(
        [
            {"name": "bias", "op": "tensor", "shape": [8]},
            {"name": "plus", "op": "elementwise", "function": "add", "inputs": ["x", "bias"]},
            {"name": "times", "op": "elementwise", "function": "mul", "inputs": ["plus", "bias"]},
            {"name": "root", "op": "elementwise", "function": "sqrt"},
        ]
    )
    bias, plus, times, root = analysis.layers
    assert bias.params == 8
    assert not bias.result.materialized
    assert plus.output_shape == (2, 4, 8)
    assert plus.saved == ()
    assert [s.source for s in times.saved] == ["in0", "in1"]
    assert [s.source for s in root.saved] == ["out"]
    assert analysis.params == 8
    with pytest.raises(GraphError, match="do not broadcast"):
        _run(
            [
                {"name": "b", "op": "tensor", "shape": [3]},
                {"name": "e", "op": "elementwise", "function": "add", "inputs": ["x", "b"]},
            ]
        )


def test_reduce_slice_and_tensor_output_shape() -> None:
    analysis = _run(
        [
            {"name": "mean", "op": "reduce", "dim": -1, "keepdim": True},
            {"name": "first", "op": "slice", "dim": 1, "start": 1, "end": 100, "step": 2,
             "inputs": ["x"]},
            {"name": "cls", "op": "tensor", "shape": [1, 1, 8], "output_shape": ["batch", 1, 8]},
            {"name": "cat", "op": "concat", "dim": 1, "inputs": ["cls", "x"]},
        ]
    )  # fmt: skip
    mean, first, cls, cat = analysis.layers
    assert mean.output_shape == (2, 4, 1)
    assert first.output_shape == (2, 2, 8)
    assert not first.allocates_output
    assert cls.output_shape == (2, 1, 8)
    assert cls.params == 8
    assert cat.output_shape == (2, 5, 8)


def test_opaque_passes_the_shape_through_with_nothing_else() -> None:
    layer = _run([{"name": "odd", "op": "opaque", "source_op": "Hardmax"}]).layers[0]
    assert (layer.output_shape, layer.params, layer.flops, layer.saved) == ((2, 4, 8), 0, 0, ())


def test_moe_counts_every_expert_but_routes_k() -> None:
    layer = {"name": "moe", "op": "moe", "num_experts": 4, "experts_per_token": 2,
             "intermediate_size": 16}  # fmt: skip
    result = _run([layer]).layers[0]
    assert result.params == 4 * 8 + 4 * 3 * 8 * 16
    dense = _run([{"name": "mlp", "op": "mlp", "intermediate_size": 16,
                   "activation": "swiglu", "bias": False}]).layers[0]  # fmt: skip
    assert result.flops > 2 * dense.flops  # two experts per token plus the router
    wide = [s.numel for s in result.saved if s.label == "gate"]
    assert wide == [2 * 4 * 2 * 16]


def test_new_ops_go_through_the_memory_model() -> None:
    layers: list[dict[str, Any]] = [
        {"name": "bias", "op": "tensor", "shape": [1, 4, 8]},
        {"name": "plus", "op": "elementwise", "function": "mul", "inputs": ["x", "bias"]},
        {"name": "t", "op": "transpose", "dim0": 1, "dim1": 2},
        {"name": "mm", "op": "matmul", "inputs": ["plus", "t"]},
        {"name": "moe", "op": "moe", "num_experts": 2, "experts_per_token": 1,
         "intermediate_size": 8, "inputs": ["plus"]},
    ]  # fmt: skip
    for mode in (Mode.TRAINING, Mode.INFERENCE):
        analysis = _run(layers, training=mode is Mode.TRAINING)
        estimate = estimate_memory(analysis, MemoryRequest(mode=mode), per_layer=True)
        assert estimate.peak_bytes > 0


@pytest.mark.parametrize(("op", "gates", "saved_steps", "inference_steps"),
                         [("rnn", 1, 1, 16), ("gru", 3, 7, 24)])  # fmt: skip
def test_native_cpu_cells_keep_what_pytorchs_step_loop_keeps(
    op: str, gates: int, saved_steps: int, inference_steps: int
) -> None:
    """x [2, 4, 8] -> hidden 16: the output has 2 x 4 x 16 = 128 elements. On CPU PyTorch runs
    GRU and Elman RNN step by step (not oneDNN): training keeps a seq-first copy of the input
    (64) and the per-step tensors (RNN: the states, 128; GRU: 7 x 128), with the input gates
    (gates x 128) alive while the loop runs; inference holds the gates and the steps' states
    (RNN 128; GRU 1.5 x 128, between torch.no_grad's 2 and inference_mode's 1). Both modes hold
    h_n, the final state [layers x directions, N, H] = 1 x 2 x 16 = 32 elements."""
    layer = {"name": op, "op": op, "hidden_size": 16}
    trained = analyze([X], [layer], {"batch": 2}, training=True, runtime=Runtime.CPU)
    (cell,) = trained.layers
    assert cell.params == gates * 16 * (8 + 16) + 2 * gates * 16
    assert [(s.label, s.source, s.numel) for s in cell.result.saved] == [
        ("input_seq_first", "new", 64), ("step_tensors", "new", saved_steps * 128),
    ]  # fmt: skip
    assert [(t.label, t.numel) for t in cell.result.transients] == [
        ("input_gates", gates * 128), ("final_state", 32),
    ]  # fmt: skip
    served = analyze([X], [layer], {"batch": 2}, training=False, runtime=Runtime.CPU)
    assert [(t.label, t.numel) for t in served.layers[0].result.transients] == [
        ("input_gates", gates * 128), ("step_states", 128 * inference_steps // 16),
        ("final_state", 32),
    ]  # fmt: skip
    two = analyze([X], [{**layer, "num_layers": 2}], {"batch": 2}, training=False,
                  runtime=Runtime.CPU)  # fmt: skip
    assert two.layers[0].result.transients[-1] == Transient(label="final_state", numel=2 * 32)
    # On CUDA (cuDNN; measured for LSTM only) every cell keeps input, output and a reserve space.
    cuda = analyze([X], [layer], {"batch": 2}, training=True, runtime=Runtime.CUDA)
    assert [s.label for s in cuda.layers[0].result.saved] == ["input", "output", "reserve"]


def test_an_elman_rnn_takes_tanh_or_relu() -> None:
    relu = {"name": "rnn", "op": "rnn", "hidden_size": 16, "nonlinearity": "relu"}
    assert _run([relu]).output_shape == (2, 4, 16)
    with pytest.raises(GraphError, match="must be one of: tanh, relu"):
        _run([{**relu, "nonlinearity": "gelu"}])
