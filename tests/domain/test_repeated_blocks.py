"""The replay's skip over identical blocks (:mod:`app.domain.memory.repeated_blocks`,
:meth:`CachingAllocator.run_blocks`) against the plain replay, on the inference steps real
estimates build: zoo models, precisions, batch sizes, both allocator modes. After each
iteration the whole allocator state (free blocks, totals, peaks, segments, and every live
handle under its key) must be the plain replay's; and two broken skips (one block too many; a
skip without the state comparison) must fail the same comparison."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

import app.domain.memory.allocator_events as allocator_events
import app.domain.memory.cuda_allocator as cuda_allocator
import app.domain.memory.cuda_runtime as engine
from app.domain.hardware import FrameworkOverhead
from app.domain.memory.cuda_allocator import Blocks, CachingAllocator, Event, Handle
from app.domain.memory.estimate import MemoryRequest, analyze_for, estimate_memory
from app.domain.memory.repeated_blocks import find_blocks, find_blocks_like, shifted
from app.domain.precision import Precision
from app.domain.workload import Mode
from app.domain.zoo import ZOO

MODELS = ("gpt-2", "bert-base", "llama-3-8b", "resnet-50", "vit-b-16", "lstm-classifier")
PRECISIONS = (Precision.FP32, Precision.BF16, Precision.INT8)
BATCHES = (1, 3, 16)

Step = tuple[list[Event], int, list[Blocks]]


def _steps(forwards: list[list[Event]] | None = None) -> list[Step]:
    """The events, steady start and blocks of every inference replay of the grid above (and
    into ``forwards`` the forwards whose blocks are looked for)."""
    captured: list[Step] = []
    original = cuda_allocator.replay_steady

    def capture(events: Any, steady_from: int, **kwargs: Any) -> Any:
        captured.append((list(events), steady_from, list(kwargs.get("blocks", ()))))
        return original(events, steady_from, **kwargs)

    def forward(events: Any, memo: Any, split: Any = None) -> list[Blocks]:
        if forwards is not None:
            forwards.append(list(events))
        if split is not None:  # the events' kinds, keys and bytes, as the events have them
            assert [list(column) for column in zip(*events, strict=True)] == list(split)
        return find_blocks_like(events, memo, split)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(engine, "replay_steady", capture)
        patch.setattr(allocator_events, "find_blocks_like", forward)
        for slug in MODELS:
            model = ZOO[slug]
            for batch in BATCHES:
                for precision in PRECISIONS:
                    request = MemoryRequest(mode=Mode.INFERENCE, precision=precision)
                    bindings = {**model.default_bindings, "batch": batch}
                    analysis = analyze_for(model.inputs, model.layers, bindings, request)
                    estimate_memory(analysis, request)
    return captured


@pytest.fixture(scope="module")
def steps() -> list[Step]:
    return _steps()


def _state(
    allocator: CachingAllocator, handles: dict[object, Handle]
) -> tuple[object, dict[object, Handle]]:
    """Every field of the allocator, and the live handles by key (in any order)."""
    snapshot = allocator.snapshot(handles)
    fields = {name: getattr(snapshot, name) for name in snapshot.__slots__ if name != "handles"}
    return fields, dict(handles)


def _replayed(step: Step, expandable: bool, skip: bool) -> list[object]:
    """The state after each run of blocks and after each iteration, replayed as
    ``replay_steady`` does (:func:`cuda_allocator._run`), with the blocks skipped or not."""
    events, steady_from, blocks = step
    allocator = CachingAllocator(expandable=expandable)
    handles: dict[object, Handle] = {}
    spans = [(0, steady_from), (steady_from, None)] if steady_from else [(0, None)]
    states: list[object] = []
    for start, end in spans:
        limit = cuda_allocator._kept_from(events, start)[0] if end is None else end
        for block in blocks:
            block_end = block.start + block.repeats * block.period
            if start <= block.start and block_end <= limit:
                allocator.run(events[start : block.start], handles)
                if skip:
                    start = allocator.run_blocks(events, handles, block)
                else:
                    allocator.run(events[block.start : block_end], handles)
                    start = block_end
                states.append(_state(allocator, handles))
        rest = cuda_allocator.last_run(events, start) if end is None else events[start:end]
        allocator.run(rest, handles)
        states.append(_state(allocator, handles))
        allocator.reset_peaks()
    return states


def _differs(steps: list[Step]) -> bool:
    """Whether any step, in either mode, replays otherwise with the blocks skipped."""
    for step in steps:
        for expandable in (False, True):
            try:
                if _replayed(step, expandable, True) != _replayed(step, expandable, False):
                    return True
            except (KeyError, IndexError):  # a key the broken skip lost, or an event past the end
                return True
    return False


@contextmanager
def _counted() -> Iterator[list[int]]:
    """The events :meth:`CachingAllocator.run` visits meanwhile."""
    visited = [0]
    run = CachingAllocator.run

    def counting(self: CachingAllocator, events: Any, handles: Any) -> None:
        events = list(events)
        visited[0] += len(events)
        run(self, events, handles)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(CachingAllocator, "run", counting)
        yield visited


def test_skipping_identical_blocks_leaves_every_field_as_the_plain_replay(
    steps: list[Step],
) -> None:
    assert len(steps) == len(MODELS) * len(BATCHES) * len(PRECISIONS)
    assert not _differs(steps)
    # precondition: blocks are found and skipped (the transformers' layers)
    assert sum(bool(blocks) for _, _, blocks in steps) >= 4 * len(BATCHES) * len(PRECISIONS)
    with _counted() as skipping:
        for step in steps:
            _replayed(step, False, True)
    with _counted() as plain:
        for step in steps:
            _replayed(step, False, False)
    assert skipping[0] < plain[0] / 2


def test_a_skip_of_one_block_too_many_fails_the_comparison(
    steps: list[Step], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The live allocations renamed as if one more block had been skipped (the events after
    the run then replayed as usual)."""
    run_blocks = CachingAllocator.run_blocks

    def one_too_many(
        self: CachingAllocator, events: Any, handles: dict[object, Handle], block: Blocks
    ) -> int:
        return run_blocks(self, events, handles, block._replace(repeats=block.repeats + 1)) - (
            block.period
        )

    monkeypatch.setattr(CachingAllocator, "run_blocks", one_too_many)
    assert _differs(steps)


def _growing(blocks: int) -> Step:
    """Identical layers that each keep one allocation more (the state never repeats): an
    output, a kept tensor, a transient, the previous output freed; one pass."""
    events: list[Event] = [("alloc", "out", 3 * 2**20)]
    for layer in range(blocks):
        events += [
            ("alloc", ("out", layer), 3 * 2**20),
            ("alloc", ("kept", layer), 5 * 2**20),
            ("scratch", None, 2**20),
            ("free", ("out", layer - 1) if layer else "out", 0),
        ]
    events.append(("alloc", "logits", 64 * 2**20))
    return events, 0, find_blocks(events)


def test_a_layer_that_keeps_a_tensor_is_replayed_in_full() -> None:
    step = _growing(12)
    assert step[2]
    assert not _differs([step])
    with _counted() as visited:
        _replayed(step, False, True)
    assert visited[0] == len(step[0])


def test_a_skip_without_the_state_comparison_fails_it(
    steps: list[Step], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every run skipped after its first block, whether the state repeats or not (in these
    zoo steps the state repeats from the first or second block on, and a skip after the first
    happens to end in the same state: the growing layers show the comparison's use)."""
    monkeypatch.setattr(CachingAllocator, "_state", lambda self: ())
    unchecked = [
        (events, steady_from, [block._replace(refs=()) for block in blocks])
        for events, steady_from, blocks in [*steps, _growing(12)]
    ]
    assert _differs(unchecked)


def test_expandable_segments_estimates_skip_alike(monkeypatch: pytest.MonkeyPatch) -> None:
    """The estimate's own call (its allocator mode) gets blocks and reports the plain peaks."""
    seen: list[int] = []
    original = cuda_allocator.replay_steady

    def compare(events: Any, steady_from: int, **kwargs: Any) -> Any:
        fast = original(events, steady_from, **kwargs)
        plain = original(events, steady_from, **(kwargs | {"blocks": ()}))
        assert fast == plain
        seen.append(len(kwargs["blocks"]))
        return fast

    monkeypatch.setattr(engine, "replay_steady", compare)
    model = ZOO["llama-3-8b"]
    overhead = FrameworkOverhead(expandable_segments=True)
    request = MemoryRequest(mode=Mode.INFERENCE, precision=Precision.BF16, overhead=overhead)
    analysis = analyze_for(
        model.inputs, model.layers, {**model.default_bindings, "batch": 4}, request
    )
    estimate_memory(analysis, request)
    assert seen
    assert seen[0] >= 2


def test_blocks_are_found_on_the_events_alone() -> None:
    """Three blocks of one period: an output, a transient, the previous output freed."""
    events: list[Event] = [("alloc", 0, 4096)]
    for layer in range(1, 8):
        events += [("alloc", layer, 4096), ("scratch", None, 9000), ("free", layer - 1, 0)]
    found = find_blocks(events)
    # the first layer frees the first tensor, 3 events back; the others their predecessor's
    assert found == [Blocks(4, 3, 6, (-3,))]
    assert shifted(found, 10) == [Blocks(14, 3, 6, (-3,))]
    # one event inserted before event 2 or 13: the blocks it or their predecessor spans go
    assert shifted(found, 10, 2) == [Blocks(18, 3, 5, (-3,))]
    assert shifted(found, 10, 13) == [Blocks(14, 3, 3, (-3,))]


class _Memo(dict[tuple[object, ...], object]):
    """A :class:`~app.domain.memory.memo.PlanMemo` without a bound."""

    def put(self, key: tuple[object, ...], value: object) -> None:
        self[key] = value


def test_blocks_found_once_per_shape_are_those_the_search_finds() -> None:
    """Over the grid's forwards (every model at every batch and precision, one memo for all,
    in two orders), the blocks reused for a forward of the same shape are its own search's."""
    forwards: list[list[Event]] = []
    _steps(forwards)
    assert len(forwards) >= len(MODELS) * len(BATCHES)
    searched = [find_blocks(events) for events in forwards]
    for order in (forwards, forwards[::-1]):
        memo = _Memo()
        reused = 0
        for events in order:
            before = dict(memo)
            assert find_blocks_like(events, memo) == find_blocks(events)
            reused += memo == before  # nothing stored again: the blocks were reused
        assert reused >= len(forwards) // 2  # precondition: most forwards share a shape
    assert any(searched)


def test_bytes_not_renamed_one_to_one_are_searched_again() -> None:
    """A forward with the shape of one searched but bytes that break a run (one layer's
    output larger) or merge two sizes (a transient as large as the outputs) is searched, and
    gets other blocks than the stored ones."""
    memo = _Memo()
    events: list[Event] = [("alloc", 0, 4096)]
    for layer in range(1, 9):
        events += [("alloc", layer, 4096), ("scratch", None, 9000), ("free", layer - 1, 0)]
    stored = find_blocks_like(events, memo)
    assert stored == find_blocks(events) == [Blocks(4, 3, 7, (-3,))]
    renamed = [(kind, key, {4096: 8192, 9000: 4096}.get(size, size)) for kind, key, size in events]
    assert find_blocks_like(renamed, memo) == stored  # one-to-one: the same blocks
    broken = list(events)
    broken[13] = ("alloc", 4, 5000)  # layer 4's output: the run stops before it
    assert find_blocks_like(broken, memo) == find_blocks(broken) != stored
    merged = [(kind, key, 4096 if kind == "scratch" else size) for kind, key, size in events]
    assert find_blocks_like(merged, memo) == find_blocks(merged)
