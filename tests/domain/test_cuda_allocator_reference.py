"""The allocator replay against a plain reference: the same rules of
c10/cuda/CUDACachingAllocator.cpp (as app.domain.memory.cuda_allocator states them), written
the slow and obvious way (a list of blocks per segment, best fit by a scan, merges by
neighbours), over random sequences of allocations and frees. The replay's free blocks kept by
size then address, inlined segment creation, chunked loop, scratch events (an allocation freed
at once, replayed without touching the free lists), "keep" events (allocations never freed,
without handles) and its snapshots are speed only: every figure must be the same."""

from __future__ import annotations

import random
from dataclasses import dataclass

import pytest

from app.domain.memory.cuda_allocator import (
    CachingAllocator,
    Event,
    Handle,
    allocation_size,
    replay_steady,
    round_size,
    should_split,
)
from app.domain.units import MIB


@dataclass
class _Block:
    address: int
    size: int
    free: bool
    requested: int = 0


class _Reference:
    """The caching allocator's rules, one block list per segment, nothing clever."""

    def __init__(self, expandable: bool) -> None:
        self.expandable = expandable
        self.segments: list[tuple[bool, list[_Block]]] = []  # (small pool, blocks by address)
        self.live: dict[object, _Block] = {}
        self.next_base = 0
        self.mapped = {True: 0, False: 0}  # expandable: bytes mapped per pool
        self.requested = self.allocated = self.reserved = self.segment_count = 0
        self.peaks = [0, 0, 0]

    def _pool_blocks(self, small: bool) -> list[tuple[list[_Block], _Block]]:
        return [(blocks, b) for pool, blocks in self.segments if pool == small for b in blocks]

    def malloc(self, key: object, size_bytes: int) -> None:
        size = round_size(size_bytes)
        small = size <= MIB
        fits = [(b.size, b.address, blocks, b) for blocks, b in self._pool_blocks(small)]
        fits = [f for f in fits if f[3].free and f[3].size >= size]
        if fits:
            _, _, blocks, block = min(fits, key=lambda f: (f[0], f[1]))
        elif self.expandable:
            blocks, block = self._grow(small, size)
        else:
            segment = allocation_size(size)
            block = _Block(self.next_base, segment, True)
            blocks = [block]
            self.segments.append((small, blocks))
            self.next_base += segment + 512
            self.segment_count += 1
            self.reserved += segment
        if should_split(block.size, size, small=small, expandable=self.expandable):
            rest = _Block(block.address + size, block.size - size, True)
            blocks.insert(blocks.index(block) + 1, rest)
            block.size = size
        block.free = False
        block.requested = size_bytes
        self.live[key] = block
        self.requested += size_bytes
        self.allocated += block.size
        self._peak()

    def _grow(self, small: bool, size: int) -> tuple[list[_Block], _Block]:
        """Expandable: the pool's one segment maps pages at its end until its last block, free,
        holds the request."""
        found = [blocks for pool, blocks in self.segments if pool == small]
        if not found:
            found = [[]]
            self.segments.append((small, found[0]))
        blocks = found[0]
        base = 0 if small else 1 << 62
        page = 2 * MIB if small else 20 * MIB
        end = base + self.mapped[small]
        if blocks and blocks[-1].free:
            tail = blocks[-1]
        else:
            tail = _Block(end, 0, True)
            blocks.append(tail)
        while tail.size < size:
            tail.size += page
            self.mapped[small] += page
            self.reserved += page
            self.segment_count += 1
        return blocks, tail

    def free(self, key: object) -> None:
        block = self.live.pop(key)
        self.requested -= block.requested
        self.allocated -= block.size
        block.free = True
        blocks = next(blocks for _, blocks in self.segments if any(b is block for b in blocks))
        index = next(i for i, b in enumerate(blocks) if b is block)
        if index + 1 < len(blocks) and blocks[index + 1].free:
            block.size += blocks.pop(index + 1).size
        if index and blocks[index - 1].free:
            blocks[index - 1].size += blocks.pop(index).size

    def _peak(self) -> None:
        current = (self.requested, self.allocated, self.reserved)
        self.peaks = [max(p, c) for p, c in zip(self.peaks, current, strict=True)]

    def run(self, events: list[Event]) -> None:
        for kind, key, size_bytes in events:
            if kind == "free":
                self.free(key)
            elif kind == "keep":  # allocations never freed, one after the other
                assert isinstance(key, tuple)
                for size in key:
                    kept = object()
                    self.malloc(kept, size)
                    del self.live[kept]  # never freed: no handle
            else:
                self.malloc(key, size_bytes)
                if kind == "scratch":  # allocated and freed at once
                    self.free(key)


_SIZES = (
    1,
    512,
    513,
    4096,
    100_000,
    MIB - 1,
    MIB,
    MIB + 1,
    3 * MIB,
    9 * MIB + 7,
    10 * MIB - 1,
    10 * MIB,
    11 * MIB + 5,
    21 * MIB,
    64 * MIB + 3,
)


def _events(rng: random.Random, count: int) -> list[Event]:
    """Random allocations (sizes around every threshold of both pools), frees of live keys,
    scratch allocations (freed at once) and runs of allocations never freed ("keep"), in runs
    that repeat (as a model's blocks do)."""
    events: list[Event] = []
    live: list[int] = []
    pattern = [rng.choice(_SIZES) * rng.choice((1, 1, 2, 3)) for _ in range(rng.randint(1, 6))]
    while len(events) < count:
        if rng.random() < 0.3:
            pattern = [rng.choice(_SIZES) for _ in range(rng.randint(1, 6))]
        if rng.random() < 0.1:  # weights or optimizer state: never freed
            kept = tuple(rng.choice(_SIZES) for _ in range(rng.randint(1, 8)))
            events.append(("keep", kept, 0))
        for size in pattern:
            if rng.random() < 0.2:  # a workspace: allocated and freed at once
                events.append(("scratch", len(events), rng.choice(_SIZES)))
            events.append(("alloc", len(events), size))
            live.append(len(events) - 1)
        for _ in range(rng.randint(0, len(pattern) + 1)):
            if live:
                key = live.pop(rng.randrange(len(live)) if rng.random() < 0.5 else -1)
                events.append(("free", key, 0))
    return events


@pytest.mark.parametrize("expandable", [False, True])
@pytest.mark.parametrize("seed", range(12))
def test_the_replay_equals_the_reference(seed: int, expandable: bool) -> None:
    """Peaks (requested, allocated, reserved) and segments after every piece of a random
    sequence, replayed in pieces of random lengths (across the chunks of the replay's loop)."""
    rng = random.Random(seed)
    events = _events(rng, rng.choice((50, 300, 1200)))
    reference = _Reference(expandable)
    allocator = CachingAllocator(expandable=expandable)
    handles: dict[object, Handle] = {}
    start = 0
    while start < len(events):
        stop = min(len(events), start + rng.choice((1, 7, 255, 256, 257, 600)))
        reference.run(events[start:stop])
        allocator.run(events[start:stop], handles)
        peaks = allocator.peaks()
        assert [peaks.requested_bytes, peaks.allocated_bytes, peaks.reserved_bytes] == (
            reference.peaks
        ), (seed, stop)
        assert peaks.segments == reference.segment_count
        assert (allocator.requested, allocator.allocated, allocator.reserved) == (
            reference.requested,
            reference.allocated,
            reference.reserved,
        )
        assert set(handles) == set(reference.live)
        start = stop


@pytest.mark.parametrize("seed", range(4))
def test_two_iterations_equal_the_reference(seed: int) -> None:
    """replay_steady's first and steady peaks: the reference's up to ``steady_from``, then its
    peaks restarted from the current values (``reset_peak_memory_stats``)."""
    rng = random.Random(100 + seed)
    events = _events(rng, 800)
    steady_from = len(events) // 2
    for expandable in (False, True):
        reference = _Reference(expandable)
        reference.run(events[:steady_from])
        first = list(reference.peaks)
        reference.peaks = [reference.requested, reference.allocated, reference.reserved]
        reference.run(events[steady_from:])
        replayed = replay_steady(events, steady_from, expandable=expandable)
        got = [[p.requested_bytes, p.allocated_bytes, p.reserved_bytes] for p in replayed]
        assert got == [first, reference.peaks]


@pytest.mark.parametrize("expandable", [False, True])
@pytest.mark.parametrize("seed", range(6))
def test_a_restored_snapshot_replays_as_the_allocator_it_was_taken_from(
    seed: int, expandable: bool
) -> None:
    """snapshot() then restore() at a random point (the replay memo's path) and the rest of the
    sequence: the same peaks, totals and live handles as one replay without the round trip."""
    rng = random.Random(200 + seed)
    events = _events(rng, 900)
    cut = rng.randrange(1, len(events))
    straight = CachingAllocator(expandable=expandable)
    straight_handles: dict[object, Handle] = {}
    straight.run(events, straight_handles)
    first = CachingAllocator(expandable=expandable)
    handles: dict[object, Handle] = {}
    first.run(events[:cut], handles)
    restored, restored_handles = CachingAllocator.restore(first.snapshot(handles))
    restored.run(events[cut:], restored_handles)
    assert restored.peaks() == straight.peaks()
    assert (restored.requested, restored.allocated, restored.reserved) == (
        straight.requested,
        straight.allocated,
        straight.reserved,
    )
    assert restored_handles == straight_handles
