"""The caching-allocator replay is bounded: graphs of more than MAX_REPLAYED_LAYERS executed
layers are estimated without building or replaying the step's allocator events (issue 29: a
99,999-layer repeated graph took 8 s and 18 s of CPU on the server, 0.9 s before the replay).

Structural, not timed: the tests count the calls that walk every tensor of the step."""

from __future__ import annotations

from typing import Any

import pytest

from app.domain.graph.analysis import GraphAnalysis, InputDecl, analyze
from app.domain.hardware import FrameworkOverhead
from app.domain.memory import allocator_events, cuda_allocator, cuda_runtime
from app.domain.memory import estimate as M
from app.domain.workload import Mode, Runtime
from tests.domain.test_formulas import evaluate

_CUDA_RUNTIME_LINES = ("fragmentation_reserve", "workspace", "cuda_context")
FEATURES = 100  # a [8, 100] fp32 output is 3,200 B: 384 B of 512 B rounding


def _repeated(times: int, *, training: bool) -> GraphAnalysis:
    layers = [
        {
            "name": "stack",
            "op": "repeat",
            "times": times,
            "layers": [{"name": "fc", "op": "linear", "out_features": FEATURES}],
        }
    ]
    inputs = [InputDecl(name="x", shape=("batch", FEATURES))]
    return analyze(inputs, layers, {"batch": 8}, training=training)


class _Calls:
    """How often the step's events are built and the allocator replays them."""

    def __init__(self) -> None:
        self.events = 0
        self.replays = 0


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> _Calls:
    counted = _Calls()
    build, run = allocator_events.step_allocator_events, cuda_allocator.CachingAllocator.run

    def counting_build(*args: Any, **kwargs: Any) -> Any:
        counted.events += 1
        return build(*args, **kwargs)

    def counting_run(self: cuda_allocator.CachingAllocator, *args: Any, **kwargs: Any) -> None:
        counted.replays += 1
        run(self, *args, **kwargs)

    monkeypatch.setattr(cuda_runtime, "step_allocator_events", counting_build)
    monkeypatch.setattr(cuda_allocator.CachingAllocator, "run", counting_run)
    return counted


@pytest.mark.parametrize("mode", [Mode.TRAINING, Mode.INFERENCE])
def test_a_99999_layer_repeated_graph_is_not_replayed_tensor_by_tensor(
    calls: _Calls, mode: Mode
) -> None:
    analysis = _repeated(99_999, training=mode is Mode.TRAINING)
    assert len(analysis.layers) == 99_999
    result = M.estimate_memory(analysis, M.MemoryRequest(mode=mode))
    assert (calls.events, calls.replays) == (0, 0)
    assert any("allocator not replayed: 99,999 executed layers" in a for a in result.assumptions)
    lines = {line.key: line for line in result.lines}
    assert lines["fragmentation_reserve"].formula.startswith("floor(")
    for key in ("allocator_rounding", "fragmentation_reserve"):
        value, stated = evaluate(lines[key].formula)
        assert value == stated == lines[key].bytes


def test_the_replay_runs_up_to_the_budget(calls: _Calls, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cuda_runtime, "MAX_REPLAYED_LAYERS", 40)
    request = M.MemoryRequest(mode=Mode.TRAINING)
    at_budget = M.estimate_memory(_repeated(40, training=True), request)
    assert calls.events == 1
    assert calls.replays >= 1
    assert not any("not replayed" in a for a in at_budget.assumptions)
    calls.events = calls.replays = 0
    over = M.estimate_memory(_repeated(41, training=True), request)
    assert (calls.events, calls.replays) == (0, 0)
    assert any("41 executed layers exceed the replay's 40" in a for a in over.assumptions)


def test_unreplayed_lines_follow_the_per_tensor_rule(monkeypatch: pytest.MonkeyPatch) -> None:
    """Golden figures of the rule, by hand: 3 fp32 linear layers 100 -> 100 at batch 8."""
    monkeypatch.setattr(cuda_runtime, "MAX_REPLAYED_LAYERS", 2)
    analysis = _repeated(3, training=False)
    result = M.estimate_memory(analysis, M.MemoryRequest(mode=Mode.INFERENCE))
    lines = {line.key: line.bytes for line in result.lines}
    # tensors: the input and 3 outputs of 3,200 B -> 3,584 B each: 4 x 384
    # parameters: per layer a 40,000 B weight (-> 40,448: 448) and a 400 B bias (-> 512: 112)
    assert lines["allocator_rounding"] == 4 * 384 + 3 * (448 + 112)
    # 5 % of the bytes before the reserve, the workspace and the context (as the rule was)
    tensors = sum(v for k, v in lines.items() if k not in _CUDA_RUNTIME_LINES)
    assert lines["fragmentation_reserve"] == int(tensors * M.UNREPLAYED_FRAGMENTATION_FRACTION)
    assert result.cuda is not None
    assert (
        result.cuda.reserved_bytes - result.cuda.allocated_bytes == lines["fragmentation_reserve"]
    )


def test_an_explicit_fragmentation_fraction_is_kept_over_the_budget(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(cuda_runtime, "MAX_REPLAYED_LAYERS", 2)
    overhead = FrameworkOverhead(fragmentation_fraction=0.25)
    request = M.MemoryRequest(mode=Mode.INFERENCE, overhead=overhead)
    result = M.estimate_memory(_repeated(3, training=False), request)
    reserve = next(line for line in result.lines if line.key == "fragmentation_reserve")
    assert "x 0.25 [fragmentation_fraction]" in reserve.formula


def test_the_first_iteration_keeps_the_rounding_without_a_replay(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(cuda_runtime, "MAX_REPLAYED_LAYERS", 2)
    result = M.estimate_memory(_repeated(3, training=True), M.MemoryRequest(mode=Mode.TRAINING))
    lines = {line.key: line.bytes for line in result.lines}
    assert result.cuda is not None
    assert result.first_iteration_peak_bytes is not None
    first_allocated = result.cuda.first_iteration_allocated_bytes
    assert first_allocated is not None
    base = result.first_iteration_peak_bytes - sum(
        lines[k]
        for k in ("allocator_rounding", "fragmentation_reserve", "workspace", "cuda_context")
    )
    assert first_allocated == base + lines["allocator_rounding"] + lines["workspace"]
    assert (
        result.cuda.first_iteration_reserved_bytes
        == first_allocated + (lines["fragmentation_reserve"])
    )


def test_round_allocations_false_is_unchanged_by_the_budget(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    overhead = FrameworkOverhead(round_allocations=False)
    request = M.MemoryRequest(mode=Mode.TRAINING, overhead=overhead)
    below = M.estimate_memory(_repeated(3, training=True), request)
    monkeypatch.setattr(cuda_runtime, "MAX_REPLAYED_LAYERS", 2)
    over = M.estimate_memory(_repeated(3, training=True), request)
    assert below == over
    assert not any("not replayed" in a for a in over.assumptions)


def test_the_cpu_runtime_never_replays(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cuda_runtime, "MAX_REPLAYED_LAYERS", 2)
    request = M.MemoryRequest(mode=Mode.INFERENCE, runtime=Runtime.CPU)
    result = M.estimate_memory(_repeated(3, training=False), request)
    assert result.cuda is None
    assert not any("not replayed" in a for a in result.assumptions)
