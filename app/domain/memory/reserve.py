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
fragments would map: ``expandable_segments:True`` comes close). Reserved is not monotone in the
sequence length even where allocated is: the tensor sizes change with the sequence length, and
with them which freed blocks a later request fits (step 4), so one length reuses its cached
blocks and the next needs new segments. :func:`monotone_report` says where and why for a series
of estimates (the calibration benchmark prints it).
"""

from __future__ import annotations

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
        f"fit. The figure is exact for the modelled tensor sequence, not monotone in the "
        f"sequence length: tensor sizes change with it and with them which cached blocks the "
        f"later requests fit (PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True brings it "
        f"close to the floor)",
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
