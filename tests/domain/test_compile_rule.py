"""``torch.compile`` as a rule over saved tensors (app.domain.memory.compiled): exact bytes
derived by hand from the partitioner's rule (pointwise chains recomputed, matmul outputs, row
statistics and dropout masks kept)."""

from __future__ import annotations

from typing import Any

import pytest

from app.domain.graph.analysis import GraphAnalysis, InputDecl, analyze
from app.domain.graph.ops import Saved, Storage
from app.domain.memory.compiled import compiled_kept, loss_upcast_bytes, rmsnorm_kept
from app.domain.memory.estimate import MemoryEstimate, MemoryRequest, estimate_memory
from app.domain.precision import Precision
from app.domain.workload import (
    Mode,
    Optimizer,
    Runtime,
    TrainingOptionError,
    TrainingOptions,
    WorkloadSpec,
)
from tests.domain.test_formulas import evaluate

# x [2, 8, 16] -> RMSNorm -> SwiGLU MLP (16 -> 32 -> 16, no bias) -> dropout -> RMSNorm
N, S, D, INNER = 2, 8, 16, 32
ROWS = N * S  # 16 token rows
BLOCK: list[dict[str, Any]] = [
    {"name": "norm", "op": "rmsnorm"},
    {"name": "mlp", "op": "mlp", "intermediate_size": INNER, "activation": "swiglu",
     "bias": False},
    {"name": "drop", "op": "dropout", "p": 0.1},
    {"name": "norm2", "op": "rmsnorm"},
]  # fmt: skip


def _graph(layers: list[dict[str, Any]] = BLOCK) -> GraphAnalysis:
    return analyze([InputDecl(name="x", shape=(N, S, D))], layers, {}, training=True)


def _estimate(
    *, compile: bool, precision: Precision = Precision.BF16, runtime: Runtime = Runtime.CUDA
) -> MemoryEstimate:
    request = MemoryRequest(
        mode=Mode.TRAINING,
        precision=precision,
        optimizer=Optimizer.SGD,
        runtime=runtime,
        training_options=TrainingOptions(compile=compile),
    )
    return estimate_memory(_graph(), request, per_layer=True)


def _kept(estimate: MemoryEstimate) -> dict[str, dict[str, tuple[str, int]]]:
    return {
        layer.name: {k.label: (k.source, k.bytes) for k in layer.kept} for layer in estimate.layers
    }


def test_compile_golden_bf16() -> None:
    eager, compiled = _kept(_estimate(compile=False)), _kept(_estimate(compile=True))
    x = ROWS * D  # 256 elements of the block's input
    wide = ROWS * INNER  # 512 elements of each MLP intermediate
    # eager RMSNorm (HF Llama): an fp32 copy of its input (a new tensor: 256 x 4 B), the
    # normalized bf16 tensor (256 x 2 B) and the fp32 rstd per row (16 x 4 B)
    assert eager["norm"] == {
        "input_fp32": ("new", x * 4),
        "normalized": ("new", x * 2),
        "rstd": ("new", ROWS * 4),
    }
    # compiled: its bf16 input itself (256 x 2 B) and rstd (a reduction: never recomputed)
    assert compiled["norm"] == {"input": ("input", x * 2), "rstd": ("new", ROWS * 4)}
    # eager SwiGLU: input, gate, silu(gate), up, product; compiled: silu(gate) recomputed from
    # gate (pointwise); the product stays (the down projection's weight gradient reads it)
    assert eager["mlp"] == {
        "input": ("input", x * 2),
        "gate": ("new", wide * 2),
        "activated_gate": ("new", wide * 2),
        "up": ("new", wide * 2),
        "product": ("new", wide * 2),
    }
    assert compiled["mlp"] == {
        "input": ("input", x * 2),
        "gate": ("new", wide * 2),
        "up": ("new", wide * 2),
        "product": ("new", wide * 2),
    }
    # dropout: random ops are never recomputed: the 1-byte mask stays (256 B)
    assert eager["drop"] == compiled["drop"] == {"mask": ("new", x)}


def test_compile_moves_the_peak_by_the_dropped_tensors() -> None:
    # CPU: no allocator rounding or CUDA context to hide a few hundred bytes
    eager, compiled = (_estimate(compile=flag, runtime=Runtime.CPU) for flag in (False, True))
    x, wide = ROWS * D, ROWS * INNER
    assert eager.peak_phase == compiled.peak_phase == "backward"
    # the peak is the MLP's backward: live are the MLP's kept tensors, what `norm` keeps and
    # its output (the MLP's input, 256 x 2 B); the caller's x (256 x 2 B) is the inputs line
    # (until issue 32 counted each input once, the activations held it too: 512 B more each);
    # norm2 and the dropout have run their backward. Eager: 4 x 512 x 2 + (256 x 4 + 256 x 2
    # + 16 x 4) + 512 = 6,208 B. Compiled: 3 x 512 x 2 + 16 x 4 (norm's input is x itself) +
    # 512 = 3,648 B
    lines = [{line.key: line.bytes for line in e.lines} for e in (eager, compiled)]
    assert lines[0]["activations"] == 4 * wide * 2 + (x * 4 + x * 2 + ROWS * 4) + x * 2
    assert lines[0]["activations"] == 6_208
    assert lines[1]["activations"] == 3 * wide * 2 + ROWS * 4 + x * 2 == 3_648
    assert {k: v for k, v in lines[0].items() if k != "activations"} == {
        k: v for k, v in lines[1].items() if k != "activations"
    }
    assert eager.peak_bytes - compiled.peak_bytes == 2_560
    assert any(a.startswith("compile: torch.compile") for a in compiled.assumptions)
    for line in compiled.lines:
        assert evaluate(line.formula) == (line.bytes, line.bytes), (line.key, line.formula)


def test_compile_rmsnorm_fp32_keeps_the_input_and_drops_normalized() -> None:
    saved = (
        Saved(label="input_fp32", source="in0_fp32", numel=256, storage=Storage.FP32),
        Saved(label="normalized", source="new", numel=256),
        Saved(label="rstd", source="new", numel=16, storage=Storage.FP32),
    )
    assert rmsnorm_kept(saved) == (
        Saved(label="input", source="in0", numel=256),
        Saved(label="rstd", source="new", numel=16, storage=Storage.FP32),
    )
    # fp32 activations: the eager input_fp32 is the input itself, so only normalized goes
    eager, compiled = (
        _kept(_estimate(compile=flag, precision=Precision.FP32)) for flag in (False, True)
    )
    assert eager["norm"]["input_fp32"] == ("input", 256 * 4)
    assert compiled["norm"] == {"input": ("input", 256 * 4), "rstd": ("new", 16 * 4)}


def test_compile_keeps_other_ops_and_gelu_new_parts_go() -> None:
    linear = (Saved(label="input", source="in0", numel=8),)
    assert compiled_kept("linear", linear) == linear
    gelu_new = (
        Saved(label="input", source="in0", numel=8),
        Saved(label="pre_activation", source="new", numel=32),
        Saved(label="activated", source="new", numel=32),
        *(Saved(label=f"activation_part{i}", source="new", numel=32) for i in range(3)),
    )
    assert [s.label for s in compiled_kept("mlp", gelu_new)] == [
        "input",
        "pre_activation",
        "activated",
    ]


def test_loss_upcast_rule() -> None:
    assert loss_upcast_bytes(16, 100, upcast=True, compiled=False) == 16 * 100 * 4
    assert loss_upcast_bytes(16, 100, upcast=False, compiled=False) == 0
    assert loss_upcast_bytes(16, 100, upcast=True, compiled=True) == 0


def test_compile_at_inference_changes_nothing_and_engine_is_refused() -> None:
    graph = analyze([InputDecl(name="x", shape=(N, S, D))], BLOCK, {}, training=False)
    plain, compiled = (
        estimate_memory(
            graph,
            MemoryRequest(
                mode=Mode.INFERENCE,
                precision=Precision.BF16,
                runtime=Runtime.CUDA,
                training_options=TrainingOptions(compile=flag),
            ),
        )
        for flag in (False, True)
    )
    assert [(line.key, line.bytes) for line in plain.lines] == [
        (line.key, line.bytes) for line in compiled.lines
    ]
    assert any(a.startswith("compile: torch.compile at inference") for a in compiled.assumptions)
    from app.domain.engines.choice import EngineChoice
    from app.domain.engines.vllm import VllmOptions

    with pytest.raises(TrainingOptionError) as raised:
        WorkloadSpec(
            mode=Mode.INFERENCE,
            batch_size=1,
            engine=EngineChoice(name="vllm", options=VllmOptions()),
            training_options=TrainingOptions(compile=True),
        )
    assert raised.value.field == "compile"
