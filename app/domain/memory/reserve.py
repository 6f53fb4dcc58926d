"""Why reserved memory exceeds allocated memory on CUDA, step by step, and how far (issue 32).

Reads the caching allocator replay's output (:class:`~app.domain.memory.cuda_allocator.
AllocatorPeaks` of the first and the steady iteration) and writes the explanation the estimate
prints with its ``fragmentation_reserve`` line. The rules are PyTorch's,
``c10/cuda/CUDACachingAllocator.cpp`` (PyTorch 2.x, default ``PYTORCH_CUDA_ALLOC_CONF``):

1. ``round_size``: every request is rounded up to a multiple of 512 B (``kMinBlockSize``).
2. ``get_allocation_size``: with no cached block that fits, a segment is ``cudaMalloc``-ed: 2 MiB
   (``kSmallBuffer``) for a request of at most 1 MiB (``kSmallSize``), 20 MiB (``kLargeBuffer``)
   for one under 10 MiB (``kMinLargeAlloc``), else the request rounded up to 2 MiB
   (``kRoundLarge``).
3. ``should_split``: a large-pool block is split only when more than 1 MiB would remain; else the
   whole block is handed out and counted as allocated (the rounding of step 1 and this are the
   ``allocator_rounding`` line).
4. ``free``: a freed block stays cached in its segment (merged with free neighbours of the same
   segment only) and serves only requests it fits (best fit): blocks that no later request fits,
   and segment tails smaller than the next request, are reserved but not allocated. Segments are
   returned only by ``empty_cache()`` or an out-of-memory retry, so ``max_memory_reserved`` is a
   high-water mark.

Bound: the replay's reserved figure is exact for the tensor sequence the estimate models; it is
bounded below by the allocated peak rounded up to whole 2 MiB pages (what an allocator that never
fragments would map: ``expandable_segments:True`` comes close). It has no upper bound in the
allocated peak or the tensors' sizes (:data:`NO_UPPER_BOUND` says why; :func:`reserve_anatomy`
takes a replayed reserve apart at the allocated peak). Reserved is not monotone in the
sequence length even where allocated is: the tensor sizes change with the sequence length, and
with them which freed blocks a later request fits (step 4), so one length reuses its cached
blocks and the next needs new segments. :func:`monotone_report` says where and why for a series
of estimates (the calibration benchmark prints it).
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Sequence
from dataclasses import dataclass

from app.domain.memory.cuda_allocator import (
    LARGE_SEGMENT_BYTES,
    MIN_BLOCK_BYTES,
    MIN_LARGE_ALLOC_BYTES,
    ROUND_LARGE_BYTES,
    SMALL_REQUEST_BYTES,
    SMALL_SEGMENT_BYTES,
    SOURCE,
    AllocatorPeaks,
    CachingAllocator,
    Event,
    Handle,
    round_size,
)
from app.domain.units import MIB

PAGE_BYTES = ROUND_LARGE_BYTES  # kRoundLarge: the granularity no allocator can go below


def _mib(value: int) -> str:
    return f"{value / MIB:,.1f} MiB"


def _pct(part: int, whole: int) -> str:
    return f"{100 * part / whole:.1f} %" if whole else "n/a"


@dataclass(frozen=True, slots=True, kw_only=True)
class ReserveBound:
    """The reserve over allocated of one estimate [B] and its floor."""

    allocated_bytes: int
    reserved_bytes: int
    floor_bytes: int  # allocated rounded up to whole 2 MiB pages: a reserve that never fragments

    @property
    def cached_bytes(self) -> int:
        """Reserved but not allocated (``fragmentation_reserve``)."""
        return self.reserved_bytes - self.allocated_bytes

    @property
    def fragmentation_bytes(self) -> int:
        """Reserved beyond the floor: cached blocks no request fit, segment tails."""
        return max(0, self.reserved_bytes - self.floor_bytes)


def reserve_bound(peaks: AllocatorPeaks) -> ReserveBound:
    """The reserve of a replayed iteration and its floor."""
    allocated = peaks.allocated_bytes
    floor = -(-allocated // PAGE_BYTES) * PAGE_BYTES
    return ReserveBound(
        allocated_bytes=allocated,
        reserved_bytes=max(peaks.reserved_bytes, allocated),
        floor_bytes=min(floor, max(peaks.reserved_bytes, allocated)),
    )


def explain_reserve(
    first: AllocatorPeaks, steady: AllocatorPeaks, *, expandable: bool, workspace_bytes: int
) -> list[str]:
    """The lines that explain the step from requested to allocated to reserved [B], the
    first iteration against the steady one, and the bound."""
    bound = reserve_bound(steady)
    rounding = steady.allocated_bytes - steady.requested_bytes
    lines = [
        f"reserved step 1, requested -> allocated: the step's tensors ask for "
        f"{steady.requested_bytes:,} B at the peak; each request is rounded up to "
        f"{MIN_BLOCK_BYTES} B (kMinBlockSize) and a large-pool block is handed out whole when at "
        f"most {SMALL_REQUEST_BYTES // MIB} MiB (kSmallSize) would remain after a split: "
        f"+{rounding:,} B = {steady.allocated_bytes:,} B allocated "
        f"(max_memory_allocated, the cuBLAS workspaces' {workspace_bytes:,} B included) "
        f"[{SOURCE}]",
        f"reserved step 2, segments: requests up to {SMALL_REQUEST_BYTES // MIB} MiB come from "
        f"{SMALL_SEGMENT_BYTES // MIB} MiB segments (kSmallBuffer), 1-"
        f"{MIN_LARGE_ALLOC_BYTES // MIB} MiB ones from {LARGE_SEGMENT_BYTES // MIB} MiB segments "
        f"(kLargeBuffer), larger ones get their own segment rounded up to "
        f"{ROUND_LARGE_BYTES // MIB} MiB (kRoundLarge); {steady.segments:,} "
        + ("pages mapped (expandable_segments)" if expandable else "segments cudaMalloc-ed"),
        f"reserved step 3, cached blocks: a freed block stays in its segment and serves only the "
        f"requests it fits (best fit, merged only with free neighbours of its segment); segments "
        f"are never returned during the step, so the reserve is the high-water mark: "
        f"{steady.reserved_bytes:,} B reserved = {steady.allocated_bytes:,} B allocated + "
        f"{bound.cached_bytes:,} B cached ({_pct(bound.cached_bytes, steady.allocated_bytes)} of "
        f"allocated)",
        f"reserved step 4, first iteration: {first.allocated_bytes:,} B allocated, "
        f"{first.reserved_bytes:,} B reserved; the steady iteration starts with the first's "
        f"segments cached and reuses them where its requests fit",
        f"reserved bound: at least the allocated peak rounded up to whole "
        f"{PAGE_BYTES // MIB} MiB pages, {bound.floor_bytes:,} B (an allocator that never "
        f"fragments); the replay adds {bound.fragmentation_bytes:,} B "
        f"({_mib(bound.fragmentation_bytes)}) of cached blocks and segment tails no request "
        f"fit. No upper bound: a request no cached block holds maps a new segment however "
        f"much is cached (blocks never move or leave their segment), so requests growing one "
        f"after another reserve their sum while allocating the largest; the figure is exact "
        f"for the modelled tensor sequence only, and not monotone in the sequence length: "
        f"tensor sizes change with it and with them which cached blocks the later requests "
        f"fit (PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True brings it close to the floor)",
    ]
    return lines


@dataclass(frozen=True, slots=True, kw_only=True)
class ReservePoint:
    """One estimate of a series (a sequence length) [B]."""

    label: str
    allocated_bytes: int
    reserved_bytes: int
    segments: int | None = None  # from the replay's peaks, when the caller has them


def monotone_report(points: Sequence[ReservePoint]) -> list[str]:
    """Where reserved falls while allocated grows along ``points`` (in order), and why: the
    lines are empty when reserved is monotone wherever allocated is."""
    lines = []
    for before, after in zip(points, points[1:], strict=False):
        grows = after.allocated_bytes >= before.allocated_bytes
        if grows and after.reserved_bytes < before.reserved_bytes:
            cached_before = before.reserved_bytes - before.allocated_bytes
            cached_after = after.reserved_bytes - after.allocated_bytes
            lines.append(
                f"{before.label} -> {after.label}: allocated grows "
                f"{_mib(before.allocated_bytes)} -> {_mib(after.allocated_bytes)} but reserved "
                f"falls {_mib(before.reserved_bytes)} -> {_mib(after.reserved_bytes)}: the cached "
                f"blocks no request fit fall from {_mib(cached_before)} to {_mib(cached_after)}"
                + (
                    f" ({before.segments} -> {after.segments} segments)"
                    if before.segments is not None and after.segments is not None
                    else ""
                )
                + f": at {after.label} the freed "
                "blocks fit the later requests and are reused, at "
                f"{before.label} they did not and new segments were cudaMalloc-ed"
            )
    return lines


# --- what the reserve consists of at the allocated peak (the calibration benchmark) ---------

NO_UPPER_BOUND = (
    "no upper bound follows from the allocated peak or from the tensors' sizes alone: the "
    "allocator never moves a block, serves a request only from one cached block that holds "
    "it (blocks merge only with free neighbours in their own segment), and returns no segment "
    "without empty_cache() or an out-of-memory retry, so a request that no cached block fits "
    "maps a new segment however many bytes are cached. Requests that grow one after another, "
    "each freed before the next (k blocks of s, s + 2 MiB, s + 4 MiB, ... MiB, all >= 10 MiB), "
    "reserve their sum while allocating only the largest: reserve over allocated grows with k "
    "without limit (tests/domain/test_reserve.py replays it). Bounded above is only the "
    "replay's own tensor sequence, exactly"
)


@dataclass(frozen=True, slots=True, kw_only=True)
class SegmentKind:
    """Segments of one kind at the allocated peak [B]."""

    kind: str  # "small" (kSmallBuffer), "large_buffer" (kLargeBuffer), "exact" (own segment)
    segments: int
    mapped_bytes: int
    free_bytes: int  # cached, not allocated, at the allocated peak
    free_blocks: int
    whole_free: int  # segments with nothing allocated in them at the peak


@dataclass(frozen=True, slots=True, kw_only=True)
class ReserveAnatomy:
    """Reserved = allocated peak + what is cached at that moment + segments mapped after it,
    for the steady iteration of a replayed step [B]."""

    allocated_bytes: int  # the steady iteration's allocated peak (max_memory_allocated)
    reserved_bytes: int  # max_memory_reserved: the segments' total at the end (never shrinks)
    peak_event: int  # index (into the steady events) of the event that reached the peak
    peak_request_bytes: int  # the allocation that reached it
    kinds: tuple[SegmentKind, ...]  # the segments mapped at the peak, by kind
    after_peak: tuple[int, ...]  # the segments cudaMalloc-ed after the peak, their bytes
    largest_free: tuple[int, ...]  # the largest cached free blocks at the peak, largest first

    @property
    def cached_at_peak_bytes(self) -> int:
        return sum(kind.free_bytes for kind in self.kinds)


def _kind_of(request: int) -> str:
    size = round_size(request)
    if size <= SMALL_REQUEST_BYTES:
        return "small"
    return "large_buffer" if size < MIN_LARGE_ALLOC_BYTES else "exact"


def _one_by_one(events: Sequence[Event]) -> list[Event]:
    """``events`` as single allocations and frees: a "scratch" as an alloc freed at once (the
    replay's own reading of it), a "keep" as allocations never freed."""
    out: list[Event] = []
    for index, (kind, key, size) in enumerate(events):
        if kind == "scratch":
            out += [("alloc", ("scratch", index), size), ("free", ("scratch", index), 0)]
        elif kind == "keep":
            sizes = key if isinstance(key, tuple) else ()
            out += [("alloc", ("keep", index, i), s) for i, s in enumerate(sizes)]
        else:
            out.append((kind, key, size))
    return out


def reserve_anatomy(events: Sequence[Event], steady_from: int) -> ReserveAnatomy | None:
    """Replay ``events`` (:func:`~app.domain.memory.allocator_events.step_allocator_events`'s,
    without ``expandable_segments``) one allocation at a time and take the steady iteration
    apart at its allocated peak: each segment mapped then (by kind, from the request that
    mapped it: :func:`~app.domain.memory.cuda_allocator.allocation_size`) with its cached free
    blocks, and the segments mapped after it. ``max_memory_reserved`` is the segments' total
    at the end (no segment is returned), so it is the allocated peak + the free bytes cached
    at the peak + the segments mapped after it. None when the replay's segment layout is not
    the one assumed (segments laid out in order, 512 B apart)."""
    flat = _one_by_one(events)
    start = len(_one_by_one(events[:steady_from])) if steady_from else 0
    allocator = CachingAllocator()
    handles: dict[object, Handle] = {}
    segments: list[tuple[int, int, str, int]] = []  # address, bytes, kind, event index
    base = 0
    peak, peak_at = -1, -1
    for index, event in enumerate(flat):
        count, reserved = allocator.segments, allocator.reserved
        allocator.run((event,), handles)
        if allocator.segments > count:  # one segment per request at most
            grown = allocator.reserved - reserved
            segments.append((base, grown, _kind_of(event[2]), index))
            base += grown + MIN_BLOCK_BYTES
        if index >= start and allocator.allocated > peak:
            peak, peak_at = allocator.allocated, index
    if peak_at < 0 or allocator.snapshot({}).next_base != base:
        return None
    at_peak = CachingAllocator()
    at_peak.run(flat[: peak_at + 1], {})
    free = sorted(at_peak.snapshot({}).free_at)
    starts = [address for address, _, _, _ in segments]
    per_segment: dict[int, list[int]] = {}
    for address, size in free:
        segment = bisect_right(starts, address) - 1
        per_segment.setdefault(segment, []).append(size)
    kinds = []
    for kind in ("small", "large_buffer", "exact"):
        mapped = [i for i, s in enumerate(segments) if s[2] == kind and s[3] <= peak_at]
        blocks = [size for i in mapped for size in per_segment.get(i, [])]
        kinds.append(
            SegmentKind(
                kind=kind,
                segments=len(mapped),
                mapped_bytes=sum(segments[i][1] for i in mapped),
                free_bytes=sum(blocks),
                free_blocks=len(blocks),
                whole_free=sum(1 for i in mapped if sum(per_segment.get(i, [])) == segments[i][1]),
            )
        )
    return ReserveAnatomy(
        allocated_bytes=peak,
        reserved_bytes=allocator.reserved,
        peak_event=peak_at - start,
        peak_request_bytes=flat[peak_at][2],
        kinds=tuple(kinds),
        after_peak=tuple(s[1] for s in segments if s[3] > peak_at),
        largest_free=tuple(sorted((size for _, size in free), reverse=True)[:5]),
    )


_KIND_WORDS = {
    "small": f"{SMALL_SEGMENT_BYTES // MIB} MiB small-pool segments (kSmallBuffer, requests "
    f"<= {SMALL_REQUEST_BYTES // MIB} MiB)",
    "large_buffer": f"{LARGE_SEGMENT_BYTES // MIB} MiB segments (kLargeBuffer, requests of "
    f"1-{MIN_LARGE_ALLOC_BYTES // MIB} MiB, several per segment)",
    "exact": f"segments of one request >= {MIN_LARGE_ALLOC_BYTES // MIB} MiB rounded up to "
    f"{ROUND_LARGE_BYTES // MIB} MiB (kRoundLarge)",
}


def anatomy_lines(anatomy: ReserveAnatomy) -> list[str]:
    """:class:`ReserveAnatomy` step by step, each figure in bytes."""
    a = anatomy
    lines = [
        f"1. allocated peak: {a.allocated_bytes:,} B ({_mib(a.allocated_bytes)}), reached by "
        f"a request of {a.peak_request_bytes:,} B (allocation {a.peak_event:,} of the steady "
        "iteration)",
        f"2. segments mapped at that moment: "
        f"{sum(k.mapped_bytes for k in a.kinds):,} B = {a.allocated_bytes:,} B allocated + "
        f"{a.cached_at_peak_bytes:,} B cached ({_pct(a.cached_at_peak_bytes, a.allocated_bytes)})",
    ]
    for kind in a.kinds:
        if kind.segments:
            lines.append(
                f"   - {kind.segments:,} {_KIND_WORDS[kind.kind]}: {kind.mapped_bytes:,} B "
                f"mapped, {kind.free_bytes:,} B cached in {kind.free_blocks:,} free blocks"
                + (
                    f" ({kind.whole_free:,} segments wholly free: blocks freed earlier that no "
                    "request since fitted)"
                    if kind.whole_free
                    else ""
                )
            )
    if a.largest_free:
        lines.append(
            "   - largest cached blocks: " + ", ".join(f"{size:,} B" for size in a.largest_free)
        )
    after = sum(a.after_peak)
    over = a.reserved_bytes - a.allocated_bytes
    lines += [
        f"3. segments cudaMalloc-ed after the peak: {len(a.after_peak):,}, {after:,} B (a "
        "later request no cached block fitted: each cached block smaller than it)",
        f"4. max_memory_reserved = {a.allocated_bytes:,} + {a.cached_at_peak_bytes:,} + "
        f"{after:,} = {a.reserved_bytes:,} B ({_pct(over, a.allocated_bytes)} over "
        "allocated); never shrinks: no segment is returned within the step",
    ]
    return lines
