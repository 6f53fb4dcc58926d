"""PyTorch's CUDA caching allocator, replayed: what ``max_memory_allocated`` and
``max_memory_reserved`` report for a sequence of tensor allocations and frees.

The rules are read from PyTorch's source, ``c10/cuda/CUDACachingAllocator.cpp`` (PyTorch 2.x;
the constants and functions below are unchanged from 1.13 to 2.9), with the allocator's default
configuration (``PYTORCH_CUDA_ALLOC_CONF`` unset: no ``max_split_size_mb``, no
``roundup_power2_divisions``, no garbage-collection threshold) unless ``expandable`` is set:

* ``round_size``: a request is rounded up to a multiple of 512 B (``kMinBlockSize``); that
  rounded size is what ``memory_allocated`` counts for a block that is split off a larger one.
* ``get_pool``: requests of at most 1 MiB (``kSmallSize``) come from the small pool, larger ones
  from the large pool; blocks never move between pools.
* ``get_free_block``: best fit: the smallest cached free block of the pool that holds the
  request (ties: the lowest address).
* ``get_allocation_size``: with no free block that fits, a new segment is ``cudaMalloc``-ed:
  2 MiB (``kSmallBuffer``) for a small request, 20 MiB (``kLargeBuffer``) for a request under
  10 MiB (``kMinLargeAlloc``), else the request rounded up to 2 MiB (``kRoundLarge``).
* ``should_split``: the rest of a block is split off (and stays cached) when at least 512 B
  remain in the small pool, or more than 1 MiB remains in the large pool; otherwise the whole
  block is handed out and counted as allocated.
* ``free``: a freed block merges with free neighbours of the same segment and stays cached:
  ``memory_reserved`` (the segments) never shrinks without ``empty_cache()`` or an
  out-of-memory retry (``release_cached_blocks``), so its peak is the high-water mark.
* ``expandable_segments:True``: one segment per pool that grows by mapping pages (2 MiB in the
  small pool, 20 MiB in the large one) at its end; every split is taken (>= 512 B remaining).

One stream (the default), as a training or serving loop without side streams runs. Pure and
deterministic: no I/O, no clock.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from app.domain.units import MIB

SOURCE = "c10/cuda/CUDACachingAllocator.cpp (PyTorch 2.x, default PYTORCH_CUDA_ALLOC_CONF)"

MIN_BLOCK_BYTES = 512  # kMinBlockSize: every request is rounded up to a multiple of it
SMALL_REQUEST_BYTES = 1 * MIB  # kSmallSize: largest request served by the small pool
SMALL_SEGMENT_BYTES = 2 * MIB  # kSmallBuffer: a small-pool segment
LARGE_SEGMENT_BYTES = 20 * MIB  # kLargeBuffer: the segment for 1-10 MiB requests
MIN_LARGE_ALLOC_BYTES = 10 * MIB  # kMinLargeAlloc: from here on, a segment per request
ROUND_LARGE_BYTES = 2 * MIB  # kRoundLarge: large segments are rounded up to it


def round_size(size_bytes: int) -> int:
    """The block size a request gets: at least 512 B, rounded up to a multiple of 512 B."""
    if size_bytes < MIN_BLOCK_BYTES:
        return MIN_BLOCK_BYTES
    return -(-size_bytes // MIN_BLOCK_BYTES) * MIN_BLOCK_BYTES


def is_small(size_bytes: int) -> bool:
    """Whether a (rounded) request is served by the small pool."""
    return size_bytes <= SMALL_REQUEST_BYTES


def allocation_size(size_bytes: int) -> int:
    """The segment ``cudaMalloc``-ed when no cached block fits a (rounded) request."""
    if size_bytes <= SMALL_REQUEST_BYTES:
        return SMALL_SEGMENT_BYTES
    if size_bytes < MIN_LARGE_ALLOC_BYTES:
        return LARGE_SEGMENT_BYTES
    return -(-size_bytes // ROUND_LARGE_BYTES) * ROUND_LARGE_BYTES


def should_split(block_bytes: int, size_bytes: int, *, small: bool, expandable: bool) -> bool:
    """Whether the rest of a block is split off a request of ``size_bytes``."""
    remaining = block_bytes - size_bytes
    if small or expandable:
        return remaining >= MIN_BLOCK_BYTES
    return remaining > SMALL_REQUEST_BYTES


@dataclass(slots=True)
class _Pool:
    small: bool
    free: list[tuple[int, int]] = field(default_factory=list)  # sorted (size, address)
    tail: int = 0  # expandable: the segment's used end (its address range starts at 0)
    mapped: int = 0  # expandable: bytes mapped


@dataclass(frozen=True, slots=True)
class AllocatorPeaks:
    """What ``torch.cuda.memory_stats`` would report over the replayed sequence [B]."""

    requested_bytes: int  # peak of the bytes asked for ("requested_bytes.all.peak")
    allocated_bytes: int  # peak of the blocks handed out (``max_memory_allocated``)
    reserved_bytes: int  # peak of the segments (``max_memory_reserved``)
    segments: int  # segments cudaMalloc-ed (expandable: pages mapped)


class CachingAllocator:
    """A replay of the caching allocator's block bookkeeping for one device and stream.

    ``malloc(size)`` returns a handle for ``free(handle)``; the peaks are read from
    :meth:`peaks`. ``expandable`` replays ``expandable_segments:True``.
    """

    def __init__(self, *, expandable: bool = False) -> None:
        self.expandable = expandable
        self._pools = (_Pool(small=True), _Pool(small=False))
        # address -> [size, allocated?, segment]; segment -> (start, end)
        self._blocks: dict[int, list[int]] = {}
        self._ends: dict[int, int] = {}  # end address -> block address (for merging backward)
        self._segment_bounds: list[tuple[int, int]] = []
        self._next_base = 0
        self._handles: dict[int, tuple[int, int, int]] = {}  # handle -> (address, requested, pool)
        self._next_handle = 0
        self.requested = self.allocated = self.reserved = 0
        self.peak_requested = self.peak_allocated = self.peak_reserved = 0
        self.segments = 0

    # -- bookkeeping ------------------------------------------------------------------------

    def _insert_free(self, pool: _Pool, address: int, size: int) -> None:
        insort(pool.free, (size, address))

    def _remove_free(self, pool: _Pool, address: int, size: int) -> None:
        index = bisect_left(pool.free, (size, address))
        del pool.free[index]

    def _put(self, address: int, size: int, allocated: bool, segment: int) -> None:
        self._blocks[address] = [size, int(allocated), segment]
        self._ends[address + size] = address

    def _drop(self, address: int) -> list[int]:
        block = self._blocks.pop(address)
        del self._ends[address + block[0]]
        return block

    def _new_segment(self, pool: _Pool, size: int) -> int:
        """A fresh segment holding one free block; returns its address."""
        if self.expandable:
            return self._grow(pool, size)
        segment_bytes = allocation_size(size)
        address = self._next_base
        self._next_base += segment_bytes + MIN_BLOCK_BYTES  # never adjacent to the next one
        segment = len(self._segment_bounds)
        self._segment_bounds.append((address, address + segment_bytes))
        self._put(address, segment_bytes, False, segment)
        self._insert_free(pool, address, segment_bytes)
        self.reserved += segment_bytes
        self.segments += 1
        return address

    def _grow(self, pool: _Pool, size: int) -> int:
        """Expandable segments: map pages at the pool's end until a free block there fits."""
        page = SMALL_SEGMENT_BYTES if pool.small else LARGE_SEGMENT_BYTES
        segment = 0 if pool.small else 1
        base = 0 if pool.small else 1 << 62  # two disjoint address ranges
        start = pool.tail
        tail_address = self._ends.get(base + start)
        if tail_address is not None and not self._blocks[tail_address][1]:
            start = tail_address - base  # the free block at the end grows
        need = start + size
        if need > pool.mapped:
            pages = -(-(need - pool.mapped) // page)
            pool.mapped += pages * page
            self.reserved += pages * page
            self.segments += pages
        if start != pool.tail:
            old = self._drop(base + start)
            self._remove_free(pool, base + start, old[0])
        self._put(base + start, pool.mapped - start, False, segment)
        self._insert_free(pool, base + start, pool.mapped - start)
        pool.tail = pool.mapped
        return base + start

    # -- the allocator's calls --------------------------------------------------------------

    def malloc(self, size_bytes: int) -> int:
        """Allocate ``size_bytes``; return a handle for :meth:`free`."""
        size = round_size(size_bytes)
        pool = self._pools[0 if is_small(size) else 1]
        index = bisect_left(pool.free, (size, -1))
        if index < len(pool.free):
            block_bytes, address = pool.free[index]
            del pool.free[index]
        else:
            address = self._new_segment(pool, size)
            block_bytes = self._blocks[address][0]
            self._remove_free(pool, address, block_bytes)
        segment = self._blocks[address][2]
        if should_split(block_bytes, size, small=pool.small, expandable=self.expandable):
            self._drop(address)
            self._put(address, size, True, segment)
            self._put(address + size, block_bytes - size, False, segment)
            self._insert_free(pool, address + size, block_bytes - size)
        else:
            self._blocks[address][1] = 1
            size = block_bytes
        handle = self._next_handle
        self._next_handle += 1
        self._handles[handle] = (address, size_bytes, 0 if pool.small else 1)
        self.requested += size_bytes
        self.allocated += size
        self.peak_requested = max(self.peak_requested, self.requested)
        self.peak_allocated = max(self.peak_allocated, self.allocated)
        self.peak_reserved = max(self.peak_reserved, self.reserved)
        return handle

    def free(self, handle: int) -> None:
        """Return a block to its pool, merged with free neighbours of its segment."""
        address, requested, pool_index = self._handles.pop(handle)
        pool = self._pools[pool_index]
        size, _, segment = self._drop(address)
        self.requested -= requested
        self.allocated -= size
        after = self._blocks.get(address + size)
        if after is not None and not after[1] and after[2] == segment:
            self._remove_free(pool, address + size, after[0])
            self._drop(address + size)
            size += after[0]
        before_address = self._ends.get(address)
        if before_address is not None:
            before = self._blocks[before_address]
            if not before[1] and before[2] == segment:
                self._remove_free(pool, before_address, before[0])
                self._drop(before_address)
                address, size = before_address, size + before[0]
        self._put(address, size, False, segment)
        self._insert_free(pool, address, size)

    def reset_peaks(self) -> None:
        """``torch.cuda.reset_peak_memory_stats()``: peaks restart from the current values."""
        self.peak_requested, self.peak_allocated = self.requested, self.allocated
        self.peak_reserved = self.reserved

    def peaks(self) -> AllocatorPeaks:
        """The peaks so far."""
        return AllocatorPeaks(
            requested_bytes=self.peak_requested,
            allocated_bytes=self.peak_allocated,
            reserved_bytes=self.peak_reserved,
            segments=self.segments,
        )


# An event of a replayed sequence: ("alloc", key, bytes) or ("free", key, 0).
Event = tuple[str, object, int]


def replay(events: Iterable[Event], *, expandable: bool = False) -> AllocatorPeaks:
    """The allocator's peaks over a sequence of allocations and frees named by keys."""
    allocator = CachingAllocator(expandable=expandable)
    handles: dict[object, int] = {}
    for kind, key, size in events:
        if kind == "alloc":
            handles[key] = allocator.malloc(size)
        else:
            allocator.free(handles.pop(key))
    return allocator.peaks()


def replay_steady(
    events: Sequence[Event], steady_from: int, *, expandable: bool = False
) -> tuple[AllocatorPeaks, AllocatorPeaks]:
    """The peaks of the first iteration (events before ``steady_from``) and of the steady one
    after it, as ``torch.cuda.reset_peak_memory_stats()`` between them would report: the
    steady iteration starts from what the first left allocated and reserved (cached segments
    stay reserved). ``steady_from`` 0: one pass, reported as both."""
    allocator = CachingAllocator(expandable=expandable)
    handles: dict[object, int] = {}
    first: AllocatorPeaks | None = None
    for position, (kind, key, size) in enumerate(events):
        if position == steady_from and steady_from:
            first = allocator.peaks()
            allocator.reset_peaks()
        if kind == "alloc":
            handles[key] = allocator.malloc(size)
        else:
            allocator.free(handles.pop(key))
    steady = allocator.peaks()
    return first or steady, steady
