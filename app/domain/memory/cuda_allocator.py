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
from dataclasses import dataclass
from itertools import islice
from typing import NamedTuple, Protocol, cast

from app.domain.budget import CHECK_EVERY, checkpoint
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


@dataclass(frozen=True, slots=True)
class AllocatorPeaks:
    """What ``torch.cuda.memory_stats`` would report over the replayed sequence [B]."""

    requested_bytes: int  # peak of the bytes asked for ("requested_bytes.all.peak")
    allocated_bytes: int  # peak of the blocks handed out (``max_memory_allocated``)
    reserved_bytes: int  # peak of the segments (``max_memory_reserved``)
    segments: int  # segments cudaMalloc-ed (expandable: pages mapped)


_LARGE_BASE = 1 << 62  # expandable: the large pool's segment starts here, the small one's at 0
# The last entry of each pool's list of free sizes: larger than any block, so best fit always
# finds an index, and finding this one means that no cached block fits.
_NO_BLOCK = 1 << 128


# An allocated block: (address, block size, bytes requested).
Handle = tuple[int, int, int]


class CachingAllocator:
    """A replay of the caching allocator's block bookkeeping for one device and stream.

    ``malloc(size)`` returns a handle for ``free(handle)``; the peaks are read from
    :meth:`peaks`. ``expandable`` replays ``expandable_segments:True``.

    Layout, for speed: per pool the sorted sizes of its free blocks (each once, then
    :data:`_NO_BLOCK`) and, per size, the sorted addresses of its free blocks of that size:
    best fit is a ``bisect`` over the few sizes and the first address of that size (a step's
    blocks come in few sizes, so this is a few comparisons where one sorted list of every free
    block took a dozen); the free blocks of both pools by address and by end address (for
    merging with a freed block's neighbours); an allocated block is known only by its handle.
    Segments are laid out with a 512 B gap between them (and the two expandable segments far
    apart), so blocks that touch always belong to the same segment: a freed block merges with
    any free block that ends where it starts or starts where it ends.
    """

    def __init__(self, *, expandable: bool = False) -> None:
        self.expandable = expandable
        # per pool: the sorted sizes of its free blocks, then _NO_BLOCK; by size, their addresses
        self._small_sizes: list[int] = [_NO_BLOCK]
        self._small_blocks: dict[int, list[int]] = {}
        self._large_sizes: list[int] = [_NO_BLOCK]
        self._large_blocks: dict[int, list[int]] = {}
        self._free_at: dict[int, int] = {}  # address -> size of a free block
        self._free_end: dict[int, int] = {}  # end address -> address of a free block
        self._next_base = 0
        self._tail = [0, 0]  # expandable, per pool (small, large): the segment's used end
        self._mapped = [0, 0]  # expandable, per pool: bytes mapped
        self.requested = self.allocated = self.reserved = 0
        self.peak_requested = self.peak_allocated = self.peak_reserved = 0
        self.segments = 0

    # -- bookkeeping ------------------------------------------------------------------------

    def _new_segment(self, size: int, small: bool) -> tuple[int, int, int]:
        """A fresh segment for a request that no cached block fits: the (address, bytes) of its
        free block, and the bytes newly reserved."""
        if self.expandable:
            return self._grow(size, small)
        segment_bytes = allocation_size(size)
        address = self._next_base
        self._next_base += segment_bytes + MIN_BLOCK_BYTES  # never adjacent to the next one
        self.segments += 1
        return address, segment_bytes, segment_bytes

    def _grow(self, size: int, small: bool) -> tuple[int, int, int]:
        """Expandable segments: map pages at the pool's end until a free block there fits;
        that block's (address, bytes), taken out of the free blocks, and the bytes mapped."""
        pool = 0 if small else 1
        page = SMALL_SEGMENT_BYTES if small else LARGE_SEGMENT_BYTES
        base = 0 if small else _LARGE_BASE
        start = base + self._tail[pool]
        tail_block = self._free_end.pop(start, None)
        if tail_block is not None:  # the free block at the end grows
            sizes, blocks = (
                (self._small_sizes, self._small_blocks)
                if small
                else (self._large_sizes, self._large_blocks)
            )
            tail_bytes = self._free_at.pop(tail_block)
            addresses = blocks[tail_bytes]
            del addresses[bisect_left(addresses, tail_block)]
            if not addresses:
                del blocks[tail_bytes]
                del sizes[bisect_left(sizes, tail_bytes)]
            start = tail_block
        need = start - base + size
        mapped = self._mapped[pool]
        pages = -(-(need - mapped) // page) if need > mapped else 0
        mapped += pages * page
        self._mapped[pool] = self._tail[pool] = mapped
        self.segments += pages
        return start, base + mapped - start, pages * page

    # -- the allocator's calls --------------------------------------------------------------

    def run(self, events: Iterable[Event], handles: dict[object, Handle]) -> None:
        """Replay ``events``: ``handles`` maps the key of each live allocation to its handle.

        :meth:`malloc` and :meth:`free` in one loop, with the state and the constants in local
        variables and the events taken :data:`~app.domain.budget.CHECK_EVERY` at a time (the
        replay of a training step runs tens of thousands of events; speed only)."""
        small_sizes, small_blocks = self._small_sizes, self._small_blocks
        large_sizes, large_blocks = self._large_sizes, self._large_blocks
        free_at, free_end = self._free_at, self._free_end
        new_segment = self._new_segment
        requested, allocated, reserved = self.requested, self.allocated, self.reserved
        peak_requested, peak_allocated = self.peak_requested, self.peak_allocated
        peak_reserved = self.peak_reserved
        # should_split, as ``rest > threshold`` (sizes are multiples of 512 B)
        small_threshold = MIN_BLOCK_BYTES - 1
        large_threshold = small_threshold if self.expandable else SMALL_REQUEST_BYTES
        minimum, small_bytes = MIN_BLOCK_BYTES, SMALL_REQUEST_BYTES
        round_up, align, no_block = MIN_BLOCK_BYTES - 1, -MIN_BLOCK_BYTES, _NO_BLOCK
        bisect, insert = bisect_left, insort
        expandable = self.expandable
        next_base, segments = self._next_base, self.segments
        small_segment, large_segment = SMALL_SEGMENT_BYTES, LARGE_SEGMENT_BYTES
        min_large_alloc, round_large = MIN_LARGE_ALLOC_BYTES, ROUND_LARGE_BYTES
        addresses: list[int] | None  # the addresses of the free blocks of one size
        iterator = iter(events)
        while chunk := list(islice(iterator, CHECK_EVERY)):
            checkpoint()  # app.domain.budget: stop here past the request's deadline
            for kind, key, size_bytes in chunk:
                if kind == "alloc":
                    size = (size_bytes + round_up) & align or minimum  # round_size
                    if size <= small_bytes:  # is_small
                        sizes, blocks, threshold = small_sizes, small_blocks, small_threshold
                    else:
                        sizes, blocks, threshold = large_sizes, large_blocks, large_threshold
                    index = bisect(sizes, size)  # get_free_block: best fit, lowest address
                    block = sizes[index]
                    if block != no_block:
                        addresses = blocks[block]
                        address = addresses[0]
                        del addresses[0]
                        if not addresses:
                            del blocks[block]
                            del sizes[index]
                        del free_at[address]
                        rest = block - size
                        if rest > threshold:  # split: the rest stays cached
                            split = address + size
                            free_at[split] = rest
                            free_end[address + block] = split  # replaces the taken block's
                            addresses = blocks.get(rest)
                            if addresses is None:
                                blocks[rest] = [split]
                                insert(sizes, rest)
                            else:
                                insert(addresses, split)
                        else:
                            del free_end[address + block]
                            size = block
                    else:
                        if expandable:
                            address, block, grown = new_segment(size, size <= small_bytes)
                        else:  # _new_segment, inline
                            block = grown = (
                                small_segment
                                if size <= small_bytes
                                else large_segment
                                if size < min_large_alloc
                                else -(-size // round_large) * round_large
                            )
                            address = next_base
                            next_base += block + minimum  # never adjacent to the next one
                            segments += 1
                        reserved += grown  # never shrinks: its peak is read after the loop
                        rest = block - size
                        if rest > threshold:  # split: the rest stays cached
                            split = address + size
                            free_at[split] = rest
                            free_end[address + block] = split
                            addresses = blocks.get(rest)
                            if addresses is None:
                                blocks[rest] = [split]
                                insert(sizes, rest)
                            else:
                                insert(addresses, split)
                        else:
                            size = block
                    handles[key] = (address, size, size_bytes)
                    requested += size_bytes
                    if requested > peak_requested:
                        peak_requested = requested
                    allocated += size
                    if allocated > peak_allocated:
                        peak_allocated = allocated
                elif kind == "free":  # merge with the free neighbours
                    address, size, size_bytes = handles.pop(key)
                    requested -= size_bytes
                    allocated -= size
                    # a block handed out is as large as its request, so its size names its pool
                    if size <= small_bytes:
                        sizes, blocks = small_sizes, small_blocks
                    else:
                        sizes, blocks = large_sizes, large_blocks
                    end = address + size
                    if end in free_at:  # its entry by end address is overwritten below
                        after = free_at.pop(end)
                        addresses = blocks[after]
                        del addresses[bisect(addresses, end)]
                        if not addresses:
                            del blocks[after]
                            del sizes[bisect(sizes, after)]
                        end += after
                    if address in free_end:
                        before = free_end.pop(address)
                        block = free_at.pop(before)
                        addresses = blocks[block]
                        del addresses[bisect(addresses, before)]
                        if not addresses:
                            del blocks[block]
                            del sizes[bisect(sizes, block)]
                        address = before
                    block = end - address
                    free_at[address] = block
                    free_end[end] = address
                    addresses = blocks.get(block)
                    if addresses is None:
                        blocks[block] = [address]
                        insert(sizes, block)
                    else:
                        insert(addresses, address)
                elif kind == "scratch":  # an alloc freed at once; the state comes back
                    size = (size_bytes + round_up) & align or minimum
                    if size <= small_bytes:
                        sizes, blocks, threshold = small_sizes, small_blocks, small_threshold
                    else:
                        sizes, blocks, threshold = large_sizes, large_blocks, large_threshold
                    block = sizes[bisect(sizes, size)]
                    # a cached block: split and merged back, or handed out whole and freed
                    if block == no_block:  # a new segment (or pages): cached as one free block
                        if expandable:
                            address, block, grown = new_segment(size, size <= small_bytes)
                        else:
                            block = grown = (
                                small_segment
                                if size <= small_bytes
                                else large_segment
                                if size < min_large_alloc
                                else -(-size // round_large) * round_large
                            )
                            address = next_base
                            next_base += block + minimum
                            segments += 1
                        reserved += grown
                        free_at[address] = block
                        free_end[address + block] = address
                        addresses = blocks.get(block)
                        if addresses is None:
                            blocks[block] = [address]
                            insert(sizes, block)
                        else:
                            insert(addresses, address)
                    if requested + size_bytes > peak_requested:
                        peak_requested = requested + size_bytes
                    used = size if block - size > threshold else block
                    if allocated + used > peak_allocated:
                        peak_allocated = allocated + used
                else:  # "keep": allocations never freed (no handles); the totals only grow
                    for size_bytes in cast(tuple[int, ...], key):
                        size = (size_bytes + round_up) & align or minimum
                        if size <= small_bytes:
                            sizes, blocks, threshold = small_sizes, small_blocks, small_threshold
                        else:
                            sizes, blocks, threshold = large_sizes, large_blocks, large_threshold
                        index = bisect(sizes, size)
                        block = sizes[index]
                        if block != no_block:
                            addresses = blocks[block]
                            address = addresses[0]
                            del addresses[0]
                            if not addresses:
                                del blocks[block]
                                del sizes[index]
                            del free_at[address]
                            rest = block - size
                            if rest > threshold:
                                split = address + size
                                free_at[split] = rest
                                free_end[address + block] = split
                                addresses = blocks.get(rest)
                                if addresses is None:
                                    blocks[rest] = [split]
                                    insert(sizes, rest)
                                else:
                                    insert(addresses, split)
                            else:
                                del free_end[address + block]
                                size = block
                        else:
                            if expandable:
                                address, block, grown = new_segment(size, size <= small_bytes)
                            else:
                                block = grown = (
                                    small_segment
                                    if size <= small_bytes
                                    else large_segment
                                    if size < min_large_alloc
                                    else -(-size // round_large) * round_large
                                )
                                address = next_base
                                next_base += block + minimum
                                segments += 1
                            reserved += grown
                            rest = block - size
                            if rest > threshold:
                                split = address + size
                                free_at[split] = rest
                                free_end[address + block] = split
                                addresses = blocks.get(rest)
                                if addresses is None:
                                    blocks[rest] = [split]
                                    insert(sizes, rest)
                                else:
                                    insert(addresses, split)
                            else:
                                size = block
                        requested += size_bytes
                        allocated += size
                    if requested > peak_requested:
                        peak_requested = requested
                    if allocated > peak_allocated:
                        peak_allocated = allocated
        if reserved > peak_reserved:
            peak_reserved = reserved
        self.requested, self.allocated, self.reserved = requested, allocated, reserved
        self.peak_requested, self.peak_allocated = peak_requested, peak_allocated
        self.peak_reserved = peak_reserved
        if not expandable:
            self._next_base, self.segments = next_base, segments

    def _state(self) -> tuple[object, ...]:
        """The state without the handles' keys or the peaks: the free blocks by address (they
        fix the by-size lists, and with the segments unchanged each one's pool), the totals,
        the segments and the expandable pools' ends."""
        return (
            dict(self._free_at),
            self.requested,
            self.allocated,
            self.reserved,
            self._next_base,
            self.segments,
            tuple(self._tail),
            tuple(self._mapped),
        )

    def run_blocks(
        self, events: Sequence[Event], handles: dict[object, Handle], blocks: Blocks
    ) -> int:
        """Replay the identical ``blocks`` of ``events`` (:func:`~app.domain.memory
        .repeated_blocks.find_blocks`'s) and return the index of the event after them.

        Once the state before a block equals the state before the previous one (:meth:`_state`)
        and the blocks that the block frees from its predecessor have the handles that the
        predecessor freed from its own, the block does what its predecessor did, decision for
        decision, and so does every block after it: the state and the peaks stay as they are
        (the totals retrace a path the peaks already cover), and the blocks are skipped. The
        allocations of the last replayed block still live then (the next block frees them, the
        totals being unchanged) are renamed to their copies in the last block. Speed only."""
        start, period, count, refs = blocks
        previous: tuple[object, ...] | None = None
        for index in range(start, start + count * period, period):
            state = (self._state(), [handles[events[index + ref][1]] for ref in refs])
            if state == previous:
                shift = start + count * period - index
                first = index - period
                moved = {
                    events[at + shift][1]: handles.pop(key)
                    for at, (kind, key, _) in enumerate(events[first:index], first)
                    if kind == "alloc" and key in handles
                }
                handles.update(moved)
                return start + count * period
            previous = state
            self.run(events[index : index + period], handles)
        return start + count * period

    def snapshot(self, handles: dict[object, Handle]) -> AllocatorSnapshot:
        """The whole state, and the handles of the blocks allocated so far, as a value."""
        return AllocatorSnapshot(
            expandable=self.expandable,
            small_free=tuple(
                (size, tuple(self._small_blocks[size])) for size in self._small_sizes[:-1]
            ),
            large_free=tuple(
                (size, tuple(self._large_blocks[size])) for size in self._large_sizes[:-1]
            ),
            free_at=tuple(self._free_at.items()),
            free_end=tuple(self._free_end.items()),
            next_base=self._next_base,
            tail=(self._tail[0], self._tail[1]),
            mapped=(self._mapped[0], self._mapped[1]),
            counters=(self.requested, self.allocated, self.reserved),
            peaks=(self.peak_requested, self.peak_allocated, self.peak_reserved),
            segments=self.segments,
            handles=tuple(handles.items()),
        )

    @classmethod
    def restore(cls, snapshot: AllocatorSnapshot) -> tuple[CachingAllocator, dict[object, Handle]]:
        """An allocator in the state of ``snapshot``, and the handles of its allocated blocks."""
        allocator = cls(expandable=snapshot.expandable)
        allocator._small_sizes = [size for size, _ in snapshot.small_free] + [_NO_BLOCK]
        allocator._small_blocks = {size: list(addresses) for size, addresses in snapshot.small_free}
        allocator._large_sizes = [size for size, _ in snapshot.large_free] + [_NO_BLOCK]
        allocator._large_blocks = {size: list(addresses) for size, addresses in snapshot.large_free}
        allocator._free_at = dict(snapshot.free_at)
        allocator._free_end = dict(snapshot.free_end)
        allocator._next_base = snapshot.next_base
        allocator._tail = list(snapshot.tail)
        allocator._mapped = list(snapshot.mapped)
        allocator.requested, allocator.allocated, allocator.reserved = snapshot.counters
        allocator.peak_requested, allocator.peak_allocated, allocator.peak_reserved = snapshot.peaks
        allocator.segments = snapshot.segments
        return allocator, dict(snapshot.handles)

    def malloc(self, size_bytes: int) -> Handle:
        """Allocate ``size_bytes``; return a handle for :meth:`free`."""
        handles: dict[object, Handle] = {}
        self.run((("alloc", None, size_bytes),), handles)
        return handles[None]

    def free(self, handle: Handle) -> None:
        """Return a block to its pool, merged with free neighbours of its segment."""
        self.run((("free", None, 0),), {None: handle})

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


# An event of a replayed sequence: ("alloc", key, bytes), ("free", key, 0), ("scratch", key,
# bytes): an allocation freed before any other event (a kernel's workspace), replayed as the
# two would be without touching the free lists where a cached block holds it, or ("keep", sizes,
# 0): allocations of ``sizes`` (a tuple of bytes, in order) that are never freed (weights,
# optimizer state), replayed as "alloc" events would be without keeping their handles.
Event = tuple[str, object, int]


class Blocks(NamedTuple):
    """``repeats`` identical blocks of ``period`` events from event ``start``
    (:func:`~app.domain.memory.repeated_blocks.find_blocks`)."""

    start: int
    period: int
    repeats: int
    refs: tuple[int, ...]  # offsets (negative) of the predecessor's allocations a block frees


@dataclass(frozen=True, slots=True)
class AllocatorSnapshot:
    """A :class:`CachingAllocator`'s state after some events (:meth:`CachingAllocator.snapshot`)."""

    expandable: bool
    small_free: tuple[tuple[int, tuple[int, ...]], ...]  # per size of free block: their addresses
    large_free: tuple[tuple[int, tuple[int, ...]], ...]
    free_at: tuple[tuple[int, int], ...]
    free_end: tuple[tuple[int, int], ...]
    next_base: int
    tail: tuple[int, int]
    mapped: tuple[int, int]
    counters: tuple[int, int, int]  # requested, allocated, reserved
    peaks: tuple[int, int, int]
    segments: int
    handles: tuple[tuple[object, Handle], ...]


class EventsKey:
    """A run of events as a memo key, hashed once (a caller that keeps it across replays saves
    hashing the events again); equal to another key over the same events."""

    __slots__ = ("_hash", "events")

    def __init__(self, events: tuple[Event, ...]) -> None:
        self.events = events
        self._hash: int | None = None

    def __hash__(self) -> int:
        if self._hash is None:
            self._hash = hash(self.events)
        return self._hash

    def __eq__(self, other: object) -> bool:
        if self is other:
            return True
        if not isinstance(other, EventsKey):
            return NotImplemented
        return hash(self) == hash(other) and self.events == other.events


class ReplayMemo(Protocol):
    """Where :func:`replay_steady` keeps the state after a prefix of events, by the prefix (a
    bounded cache the caller owns; e.g. ``app.services.cache.LruCache``)."""

    def get(self, key: tuple[object, ...], /) -> AllocatorSnapshot | None:
        """The state stored for ``key``, or None."""

    def put(self, key: tuple[object, ...], value: AllocatorSnapshot, /) -> None:
        """Store the state after the prefix ``key`` names."""


def replay(events: Iterable[Event], *, expandable: bool = False) -> AllocatorPeaks:
    """The allocator's peaks over a sequence of allocations and frees named by keys."""
    allocator = CachingAllocator(expandable=expandable)
    allocator.run(events, {})
    return allocator.peaks()


def _kept_from(events: Sequence[Event], start: int) -> tuple[int, int]:
    """Where :func:`last_run` cuts ``events[start:]``: the start of the allocations before the
    trailing frees, and the start of those frees."""
    end = len(events)
    while end > start and events[end - 1][0] == "free":
        end -= 1
    run = end
    while run > start and events[run - 1][0] == "alloc":
        run -= 1
    return run, end


def last_run(events: Sequence[Event], start: int) -> list[Event]:
    """``events[start:]`` for a replay that ends with them (speed only: the peaks are the same).

    The frees after the last allocation are left out: a free lowers the totals and reserves
    nothing, so no peak moves after it. The allocations just before them (the optimizer step's
    temporaries, which a step frees at its end) are then never freed in what is replayed: one
    "keep" event, replayed without handles and with one peak check (the totals only grow in a
    run of allocations)."""
    run, end = _kept_from(events, start)
    if end - run < 2:
        return list(events[start:end])
    return [*events[start:run], ("keep", tuple(size for _, _, size in events[run:end]), 0)]


def _run(
    allocator: CachingAllocator,
    events: Sequence[Event],
    handles: dict[object, Handle],
    span: tuple[int, int | None],
    blocks: Sequence[Blocks],
) -> None:
    """Replay ``events[start:end]`` (``end`` None: :func:`last_run` from ``start``), the
    ``blocks`` inside it through :meth:`CachingAllocator.run_blocks`."""
    start, end = span
    limit = _kept_from(events, start)[0] if end is None else end
    for found in blocks:
        if start <= found.start and found.start + found.repeats * found.period <= limit:
            allocator.run(events[start : found.start], handles)
            start = allocator.run_blocks(events, handles, found)
    allocator.run(last_run(events, start) if end is None else events[start:end], handles)


def replay_steady(
    events: Sequence[Event],
    steady_from: int,
    *,
    expandable: bool = False,
    shared_prefix: int = 0,
    memo: ReplayMemo | None = None,
    prefix_key: EventsKey | None = None,
    blocks: Sequence[Blocks] = (),
) -> tuple[AllocatorPeaks, AllocatorPeaks]:
    """The peaks of the first iteration (events before ``steady_from``) and of the steady one
    after it, as ``torch.cuda.reset_peak_memory_stats()`` between them would report: the
    steady iteration starts from what the first left allocated and reserved (cached segments
    stay reserved). ``steady_from`` 0: one pass, reported as both.

    ``memo``: the state after the first ``shared_prefix`` events (at most ``steady_from`` when
    that is not 0) is looked up by those events and stored after a replay, so sequences that
    begin alike (the weights of one model at every batch size) replay that part once. The
    replay is deterministic: the state after the same events is the same. ``prefix_key``: those
    events as a key the caller keeps (its ``events`` must be the first ``shared_prefix``
    events), so they are not copied and hashed again. ``blocks``: runs of identical blocks
    after the prefix, in order (:func:`~app.domain.memory.repeated_blocks.find_blocks`),
    replayed by :meth:`CachingAllocator.run_blocks` (speed only: the same peaks)."""
    allocator = CachingAllocator(expandable=expandable)
    handles: dict[object, Handle] = {}
    start = 0
    if memo is not None and 0 < shared_prefix <= len(events):
        if 0 < steady_from < shared_prefix:
            raise ValueError("the shared prefix must end before the steady iteration starts")
        if prefix_key is None:
            prefix_key = EventsKey(tuple(islice(events, shared_prefix)))
        elif len(prefix_key.events) != shared_prefix:
            raise ValueError("the prefix key must name the first shared_prefix events")
        key = ("replay prefix", expandable, prefix_key)
        found = memo.get(key)
        if found is None:
            allocator.run(events[:shared_prefix], handles)
            memo.put(key, allocator.snapshot(handles))
        else:
            allocator, handles = CachingAllocator.restore(found)
        start = shared_prefix
    if not 0 < steady_from < len(events):
        _run(allocator, events, handles, (start, None), blocks)
        steady = allocator.peaks()
        return steady, steady
    _run(allocator, events, handles, (start, steady_from), blocks)
    first = allocator.peaks()
    allocator.reset_peaks()
    _run(allocator, events, handles, (steady_from, None), blocks)
    return first, allocator.peaks()
