"""The replay's shortcuts against the plain replay, on the events real estimates build.

``replay_steady`` leaves out the frees after the last allocation and replays the allocations
just before them as one "keep" event (:func:`~app.domain.memory.cuda_allocator.last_run`):
speed only. Here every estimate's events (zoo models in both modes, with the options that
change the step: accumulation, ZeRO, checkpointing, for-loop optimizers, expandable segments)
are replayed both ways, and the peaks of both iterations must be the same, field by field.
The plain replay is :class:`~app.domain.memory.cuda_allocator.CachingAllocator` run over the
two iterations' events as they are, which ``test_cuda_allocator_reference.py`` checks against
a slow reference of PyTorch's rules."""

from __future__ import annotations

from typing import Any

import pytest

import app.domain.memory.cuda_allocator as cuda_allocator
import app.domain.memory.cuda_runtime as engine
from app.domain.hardware import FrameworkOverhead
from app.domain.memory.cuda_allocator import (
    AllocatorPeaks,
    CachingAllocator,
    Event,
    Handle,
    last_run,
    replay_steady,
)
from app.domain.memory.estimate import MemoryRequest, analyze_for, estimate_memory
from app.domain.precision import Precision
from app.domain.workload import (
    Checkpointing,
    Mode,
    OptimizerImpl,
    Parallelism,
    Runtime,
    default_precision,
)
from app.domain.zoo import ZOO

# the models that keep the test short: one of each family (GPT-3 175B has GPT-2's blocks)
MODELS = ("gpt-2", "bert-base", "llama-3-8b", "resnet-50", "vit-b-16", "lstm-classifier")
TRAINING_OPTIONS: list[dict[str, Any]] = [
    {},
    {"accumulation_steps": 4},
    {"parallelism": Parallelism(data=8, zero_stage=3)},
    {"checkpointing": Checkpointing.FULL},
    {"optimizer_impl": OptimizerImpl.FOR_LOOP},
]


def _plain(
    events: list[Event], steady_from: int, expandable: bool
) -> tuple[AllocatorPeaks, AllocatorPeaks]:
    """Both iterations' peaks, every event replayed as it is."""
    allocator = CachingAllocator(expandable=expandable)
    handles: dict[object, Handle] = {}
    if not 0 < steady_from < len(events):
        allocator.run(events, handles)
        return allocator.peaks(), allocator.peaks()
    allocator.run(events[:steady_from], handles)
    first = allocator.peaks()
    allocator.reset_peaks()
    allocator.run(events[steady_from:], handles)
    return first, allocator.peaks()


def _captured(monkeypatch: pytest.MonkeyPatch) -> list[tuple[list[Event], int]]:
    """The events and steady start of every replay the estimates below run."""
    captured: list[tuple[list[Event], int]] = []
    original = cuda_allocator.replay_steady

    def capture(events: Any, steady_from: int, **kwargs: Any) -> Any:
        captured.append((list(events), steady_from))
        return original(events, steady_from, **kwargs)

    monkeypatch.setattr(engine, "replay_steady", capture)
    for slug in MODELS:
        model = ZOO[slug]
        bindings = {**model.default_bindings, "batch": 2}
        for mode in Mode:
            options = TRAINING_OPTIONS if mode is Mode.TRAINING else [{}]
            for option in options:
                precision = default_precision(mode, Runtime.CUDA)
                request = MemoryRequest(mode=mode, precision=precision, **option)
                analysis = analyze_for(model.inputs, model.layers, bindings, request)
                estimate_memory(analysis, request)
    return captured


def test_the_shortcuts_replay_real_steps_as_the_plain_replay(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Every field of both iterations' peaks, both allocator modes, over the zoo's steps."""
    captured = _captured(monkeypatch)
    assert len(captured) == len(MODELS) * (len(TRAINING_OPTIONS) + 1)
    shortened = 0
    for events, steady_from in captured:
        if len(last_run(events, steady_from)) < len(events) - steady_from:
            shortened += 1
        for expandable in (False, True):
            fast = replay_steady(events, steady_from, expandable=expandable)
            assert fast == _plain(events, steady_from, expandable), (steady_from, expandable)
    # precondition: the shortcut is taken (training steps end with the optimizer's temporaries)
    assert shortened >= len(MODELS)


def test_the_last_run_drops_trailing_frees_and_keeps_the_allocations_before_them() -> None:
    events: list[Event] = [
        ("alloc", 1, 3 * 2**20),
        ("alloc", 2, 5000),
        ("free", 1, 0),
        ("alloc", 3, 700),
        ("alloc", 4, 40 * 2**20),
        ("free", 2, 0),
        ("free", 3, 0),
        ("free", 4, 0),
    ]
    assert last_run(events, 0) == [*events[:3], ("keep", (700, 40 * 2**20), 0)]
    assert last_run(events, 4) == [("alloc", 4, 40 * 2**20)]  # one allocation: as it is
    assert last_run(events, 6) == []
    for steady_from in range(len(events)):
        for expandable in (False, True):
            assert replay_steady(events, steady_from, expandable=expandable) == _plain(
                events, steady_from, expandable
            )


def test_an_estimate_with_expandable_segments_replays_as_the_plain_replay(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The estimate's own call (its allocator mode) on a training step with temporaries."""
    seen: list[tuple[AllocatorPeaks, AllocatorPeaks]] = []
    original = cuda_allocator.replay_steady

    def compare(events: Any, steady_from: int, **kwargs: Any) -> Any:
        fast = original(events, steady_from, **kwargs)
        assert fast == _plain(list(events), steady_from, kwargs["expandable"])
        seen.append(fast)
        return fast

    monkeypatch.setattr(engine, "replay_steady", compare)
    model = ZOO["bert-base"]
    overhead = FrameworkOverhead(expandable_segments=True)
    request = MemoryRequest(mode=Mode.TRAINING, precision=Precision.BF16, overhead=overhead)
    bindings = {**model.default_bindings, "batch": 8}
    analysis = analyze_for(model.inputs, model.layers, bindings, request)
    estimate_memory(analysis, request)
    assert len(seen) == 1
