"""Golden tests: the CUDA caching allocator's rules (c10/cuda/CUDACachingAllocator.cpp),
exact bytes worked out by hand from the constants and functions the module cites."""

from __future__ import annotations

import pytest

from app.domain.memory.cuda_allocator import (
    AllocatorSnapshot,
    CachingAllocator,
    Event,
    EventsKey,
    Handle,
    allocation_size,
    replay,
    replay_steady,
    round_size,
    should_split,
)
from app.domain.units import MIB


@pytest.mark.parametrize(
    ("request_bytes", "rounded", "segment"),
    [
        (1, 512, 2 * MIB),  # kMinBlockSize; small pool: a 2 MiB segment
        (512, 512, 2 * MIB),
        (513, 1024, 2 * MIB),
        (MIB, MIB, 2 * MIB),  # kSmallSize is still small
        (MIB + 1, MIB + 512, 20 * MIB),  # large pool, under 10 MiB: kLargeBuffer
        (9 * MIB, 9 * MIB, 20 * MIB),
        (10 * MIB - 1, 10 * MIB, 10 * MIB),  # rounds to exactly kMinLargeAlloc: own segment
        (10 * MIB + 1, 10 * MIB + 512, 12 * MIB),  # kRoundLarge: 2 MiB multiples
        (21 * MIB, 21 * MIB, 22 * MIB),
        (100 * MIB + 1, 100 * MIB + 512, 102 * MIB),
    ],
)
def test_round_size_and_segment_size(request_bytes: int, rounded: int, segment: int) -> None:
    assert round_size(request_bytes) == rounded
    assert allocation_size(rounded) == segment


def test_split_rules_differ_by_pool() -> None:
    assert should_split(2 * MIB, 2 * MIB - 512, small=True, expandable=False)  # 512 B remain
    assert not should_split(2 * MIB, 2 * MIB - 511, small=True, expandable=False)
    assert should_split(20 * MIB, 19 * MIB - 512, small=False, expandable=False)  # > 1 MiB
    assert not should_split(20 * MIB, 19 * MIB, small=False, expandable=False)  # exactly 1 MiB
    assert should_split(20 * MIB, 19 * MIB, small=False, expandable=True)


def test_a_fresh_allocation_counts_its_block_and_its_segment() -> None:
    one_byte = replay([("alloc", "a", 1)])
    assert (one_byte.requested_bytes, one_byte.allocated_bytes) == (1, 512)
    assert one_byte.reserved_bytes == 2 * MIB
    # 19.5 MiB: a 20 MiB segment whose 0.5 MiB rest is not split off: all 20 MiB allocated
    unsplit = replay([("alloc", "a", 19 * MIB + MIB // 2)])
    assert (unsplit.allocated_bytes, unsplit.reserved_bytes) == (20 * MIB, 20 * MIB)
    # 11 MiB: a 12 MiB segment; the 1 MiB rest is not more than kSmallSize: not split
    assert replay([("alloc", "a", 11 * MIB)]).allocated_bytes == 12 * MIB
    # 3 MiB: split off a 20 MiB segment (17 MiB remain cached)
    split = replay([("alloc", "a", 3 * MIB)])
    assert (split.allocated_bytes, split.reserved_bytes) == (3 * MIB, 20 * MIB)


def test_small_tensors_share_a_segment() -> None:
    peaks = replay([("alloc", i, 4096) for i in range(512)])  # 512 x 4 KiB = 2 MiB
    assert peaks.reserved_bytes == 2 * MIB
    assert peaks.segments == 1
    assert replay([("alloc", i, 4096) for i in range(513)]).segments == 2


def test_freed_blocks_are_reused_best_fit_and_merged() -> None:
    allocator = CachingAllocator()
    big = allocator.malloc(100 * MIB)
    allocator.free(big)
    assert (allocator.allocated, allocator.reserved) == (0, 100 * MIB)  # cached, not released
    first = allocator.malloc(60 * MIB)
    second = allocator.malloc(30 * MIB)  # both carved from the cached 100 MiB segment
    assert (allocator.allocated, allocator.reserved) == (90 * MIB, 100 * MIB)
    allocator.free(first)
    allocator.free(second)
    # merged back into one 100 MiB block: a 100 MiB request fits without a new segment
    allocator.malloc(100 * MIB)
    assert allocator.reserved == 100 * MIB
    assert allocator.segments == 1


def test_fragmentation_forces_a_new_segment() -> None:
    """Free 40 MiB in two non-adjacent 20 MiB holes; a 30 MiB request needs a new segment."""
    allocator = CachingAllocator()
    blocks = [allocator.malloc(20 * MIB) for _ in range(4)]  # four 20 MiB segments
    allocator.free(blocks[0])
    allocator.free(blocks[2])
    allocator.malloc(30 * MIB)
    assert allocator.reserved == 4 * 20 * MIB + 30 * MIB
    assert allocator.peaks().reserved_bytes == 110 * MIB


def test_expandable_segments_grow_in_pages() -> None:
    # two 30 MiB tensors: one segment of 60 MiB mapped as three 20 MiB pages, no 2 MiB rounding
    peaks = replay([("alloc", "a", 30 * MIB), ("alloc", "b", 30 * MIB)], expandable=True)
    assert (peaks.allocated_bytes, peaks.reserved_bytes, peaks.segments) == (
        60 * MIB,
        60 * MIB,
        3,
    )
    # without: two segments of 30 MiB each (already 2 MiB multiples)
    assert replay([("alloc", "a", 30 * MIB), ("alloc", "b", 30 * MIB)]).reserved_bytes == 60 * MIB
    # the free tail grows instead of a new segment: 10 + free 10, then 25 -> 30 MiB used, 40 mapped
    events = [("alloc", "a", 10 * MIB), ("alloc", "b", 10 * MIB), ("free", "b", 0)]
    peaks = replay([*events, ("alloc", "c", 25 * MIB)], expandable=True)
    assert peaks.reserved_bytes == 40 * MIB
    # the default allocator cannot grow a segment: 10 + 10 + 26 MiB
    assert replay([*events, ("alloc", "c", 25 * MIB)]).reserved_bytes == 46 * MIB


class _Memo:
    """A dict with the memo protocol, counting hits."""

    def __init__(self) -> None:
        self.items: dict[tuple[object, ...], AllocatorSnapshot] = {}
        self.hits = 0

    def get(self, key: tuple[object, ...]) -> AllocatorSnapshot | None:
        found = self.items.get(key)
        self.hits += found is not None
        return found

    def put(self, key: tuple[object, ...], value: AllocatorSnapshot) -> None:
        self.items[key] = value


def _step(batch: int, workspace: int) -> tuple[list[Event], int, int]:
    """Weights (small and large, some split), then a workspace, then two iterations whose
    activations reuse and merge blocks next to the weights: (events, steady_from, weights)."""
    events: list[Event] = []
    for size in (3 * MIB, 700_000, 11 * MIB + 5, 4096, 3 * MIB, 25 * MIB):
        events.append(("alloc", len(events), size))
    weights = len(events)
    events.append(("alloc", "workspace", workspace))
    steady_from = 0
    for iteration in range(2):
        if iteration:
            steady_from = len(events)
        for layer in range(4):
            events.append(("alloc", ("act", iteration, layer), batch * (layer + 1) * 300_000))
            if layer:
                events.append(("free", ("act", iteration, layer - 1), 0))
        events.append(("free", ("act", iteration, 3), 0))
    return events, steady_from, weights


@pytest.mark.parametrize("expandable", [False, True])
def test_a_memoised_prefix_replays_the_same_peaks(expandable: bool) -> None:
    """States after the same weights are shared: every batch and workspace size, with or
    without the memo (a miss, then hits), gives the peaks of a replay from scratch."""
    memo = _Memo()
    for batch in (1, 3, 8):
        for workspace in (8 * MIB + 512 * 1024, 32 * MIB):
            events, steady_from, weights = _step(batch, workspace)
            alone = replay_steady(events, steady_from, expandable=expandable)
            shared = replay_steady(
                events, steady_from, expandable=expandable, shared_prefix=weights, memo=memo
            )
            assert shared == alone
            one_pass = replay_steady(
                events[:steady_from], 0, expandable=expandable, shared_prefix=weights, memo=memo
            )
            assert one_pass == replay_steady(events[:steady_from], 0, expandable=expandable)
    assert (len(memo.items), memo.hits) == (1, 11)


def test_a_snapshot_restores_blocks_and_handles() -> None:
    allocator = CachingAllocator()
    handles: dict[object, Handle] = {}
    allocator.run([("alloc", "a", 3 * MIB), ("alloc", "b", 5 * MIB), ("free", "a", 0)], handles)
    copy, copied = CachingAllocator.restore(allocator.snapshot(handles))
    later: list[Event] = [("alloc", "c", 2 * MIB), ("free", "b", 0), ("alloc", "d", 9 * MIB)]
    allocator.run(later, handles)
    copy.run(later, copied)
    assert copy.peaks() == allocator.peaks()
    assert copied == handles
    assert copy.snapshot(copied) == allocator.snapshot(handles)


def test_a_shared_prefix_must_end_before_the_steady_iteration() -> None:
    events, steady_from, _ = _step(1, MIB)
    with pytest.raises(ValueError, match="shared prefix"):
        replay_steady(events, steady_from, shared_prefix=steady_from + 1, memo=_Memo())


def test_a_kept_prefix_key_replays_as_the_events_do() -> None:
    """A caller's EventsKey of the weights' events is the memo key the events give, and must
    name exactly the shared prefix."""
    memo = _Memo()
    events, steady_from, weights = _step(2, MIB)
    key = EventsKey(tuple(events[:weights]))
    kept = replay_steady(events, steady_from, shared_prefix=weights, memo=memo, prefix_key=key)
    assert kept == replay_steady(events, steady_from, shared_prefix=weights, memo=memo)
    assert (len(memo.items), memo.hits) == (1, 1)
    with pytest.raises(ValueError, match="prefix key"):
        replay_steady(events, steady_from, shared_prefix=weights - 1, memo=memo, prefix_key=key)
