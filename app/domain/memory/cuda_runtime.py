"""The CUDA runtime's lines: allocator rounding and cached segments (the allocator replay, or
the per-tensor rule past :data:`MAX_REPLAYED_LAYERS`), the cuBLAS workspaces, the CUDA context,
and the figures PyTorch reports (:class:`~app.domain.memory.result.CudaMemory`)."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping
from dataclasses import replace
from operator import attrgetter

from app.domain.hardware import FrameworkOverhead
from app.domain.memory.allocator_events import forward_events_key, step_allocator_events
from app.domain.memory.context import Estimation
from app.domain.memory.cuda_allocator import AllocatorPeaks, replay_steady
from app.domain.memory.liveness import storage_size_counts
from app.domain.memory.memo import memoised
from app.domain.memory.request import MemoryRequest
from app.domain.memory.result import CudaMemory
from app.domain.units import MIB
from app.domain.workload import Runtime

_HANDLE_WORDS = {
    1: "cuBLAS handle: the inference thread's",
    2: "cuBLAS handles: the forward's thread and autograd's backward thread, one workspace each",
}


def _cublas_handles(e: Estimation) -> int:
    """cuBLAS handles that get a workspace: PyTorch keeps one per (handle, stream) and a handle
    per thread (CublasHandlePool.cpp); autograd runs a CUDA backward on its own device thread,
    so training has two (source-derived; benchmarks/fidelity/cuda probes measure it)."""
    return 2 if e.step is not None else 1


# The allocator replay walks every tensor of the step, twice in training, at 0.5 to 1 us per
# allocation or free (10 to 30 per layer): a 99,999-layer graph would take seconds where the
# rest of its estimate takes 0.3 s. Graphs of more executed layers than this are estimated with
# the rule the replay replaced (per-tensor rounding, a fixed fragmentation reserve), cost linear
# in the layers with a small constant; every zoo and imported graph pinned by
# tests/domain/memory_snapshot.json is far below it (GPT-3 175B: 773).
MAX_REPLAYED_LAYERS = 10_000


UNREPLAYED_FRAGMENTATION_FRACTION = 0.05  # the fixed reserve before the replay (issue 13)


def _replays_allocator(e: Estimation) -> bool:
    """Whether the estimate replays the caching allocator (round_allocations and at most
    :data:`MAX_REPLAYED_LAYERS` executed layers)."""
    return e.request.overhead.round_allocations and len(e.analysis.layers) <= MAX_REPLAYED_LAYERS


def _rounding_waste(counts: Mapping[int, int]) -> int:
    """Bytes the caching allocator adds to tensors without a replay (the rule before it): 512 B
    granularity, 2 MiB blocks for tensors over 1 MiB. ``counts``: tensors per size [B]."""
    return sum(
        count * (-size % (2 * MIB) if size > MIB else -size % 512) for size, count in counts.items()
    )


def _unreplayed_rounding(e: Estimation) -> tuple[int, int]:
    """:func:`_rounding_waste` of the step's tensors and of its parameter tensors (once per
    distinct op result: the repeats of a block share theirs)."""
    par = e.request.parallelism
    num = e.plan.weight.numerator
    den = e.plan.weight.denominator * par.tensor * par.pipeline
    results = list(map(attrgetter("result"), e.analysis.layers))
    by_id = dict(zip(map(id, results), results, strict=True))
    weights = 0
    for result_id, count in Counter(map(id, results)).items():
        shapes = by_id[result_id].param_shapes
        sizes = Counter(-(-math.prod(shape) * num // den) for shape in shapes)
        weights += count * _rounding_waste(sizes)
    return _rounding_waste(storage_size_counts(e.storage_plan)), weights


def cuda_lines(e: Estimation, parts: dict[str, int]) -> None:
    """CUDA runtime: allocator rounding and cached segments (from a replay of PyTorch's caching
    allocator over the step's tensors), the cuBLAS workspace and the CUDA context."""
    request, formulas = e.request, e.formulas
    overhead = request.overhead
    handles = _cublas_handles(e)
    workspace = handles * overhead.workspace_bytes
    replay = _replays_allocator(e)
    unreplayed = overhead.round_allocations and not replay
    if unreplayed:
        layers = len(e.analysis.layers)
        e.assumptions.append(
            f"allocator not replayed: {layers:,} executed layers exceed the replay's "
            f"{MAX_REPLAYED_LAYERS:,}; allocator_rounding rounds each tensor (512 B, 2 MiB over "
            "1 MiB) and fragmentation_reserve is a fixed fraction of the allocated bytes "
            f"({UNREPLAYED_FRAGMENTATION_FRACTION!r} unless fragmentation_fraction is set)"
        )
        tensors, parameters = _unreplayed_rounding(e)
        parts["allocator_rounding"] = tensors + parameters
        formulas["allocator_rounding"] = (
            f"{tensors:,} [B: activation, kept and input tensors] + {parameters:,} [B: "
            f"parameter tensors] [not replayed ({layers:,} layers > {MAX_REPLAYED_LAYERS:,}): "
            f"sizes rounded up to 512 B, to 2 MiB over 1 MiB] = {tensors + parameters:,} B"
        )
    elif replay:
        events, steady_from, weights, forward_from, blocks = step_allocator_events(
            e, overhead, handles
        )
        expandable = overhead.expandable_segments

        def replayed() -> tuple[AllocatorPeaks, AllocatorPeaks]:
            return replay_steady(
                events,
                steady_from,
                expandable=expandable,
                shared_prefix=len(weights.events),
                memo=e.replays,
                prefix_key=weights.key,
                blocks=blocks,
            )

        if e.step is not None or e.plans is None:
            e.allocator = replayed()
        else:  # inference: the weights, the head, then the forward of (analysis, dtype, runtime)
            head = tuple(events[len(weights.events) : forward_from])
            e.allocator = memoised(
                e.plans,
                e.analysis,
                ("replayed", *forward_events_key(e)[1:], weights.key, head, expandable,
                 handles, overhead.workspace_bytes),
                replayed,
            )  # fmt: skip
        steady = e.allocator[1]
        rounding = max(0, steady.allocated_bytes - steady.requested_bytes)
        parts["allocator_rounding"] = rounding
        formulas["allocator_rounding"] = (
            f"{steady.allocated_bytes:,} [B: peak allocated, max_memory_allocated] - "
            f"{steady.requested_bytes:,} [B: peak requested] = {rounding:,} B"
        )
    else:
        parts["allocator_rounding"] = 0
        formulas["allocator_rounding"] = (
            "0 [B: allocator not replayed (round_allocations=false)] = 0 B"
        )
    allocated = sum(parts.values())
    if overhead.fragmentation_fraction is not None or not replay:
        fraction = overhead.fragmentation_fraction or 0.0
        if unreplayed and overhead.fragmentation_fraction is None:
            fraction = UNREPLAYED_FRAGMENTATION_FRACTION
        parts["fragmentation_reserve"] = int(allocated * fraction)
        formulas["fragmentation_reserve"] = (
            f"floor({allocated:,} [B allocated] x {fraction!r} [fragmentation_fraction]) = "
            f"{parts['fragmentation_reserve']:,} B"
        )
    else:
        assert e.allocator is not None  # replayed above (round_allocations)
        steady = e.allocator[1]
        cached = max(0, steady.reserved_bytes - steady.allocated_bytes)
        parts["fragmentation_reserve"] = cached
        formulas["fragmentation_reserve"] = (
            f"{steady.reserved_bytes:,} [B: peak reserved, max_memory_reserved] - "
            f"{steady.allocated_bytes:,} [B: peak allocated] = {cached:,} B"
        )
    parts["workspace"] = workspace
    parts["cuda_context"] = overhead.cuda_context_bytes
    formulas.update(
        workspace=f"{handles} [{_HANDLE_WORDS[handles]}] x {overhead.workspace_bytes:,} "
        f"[B: {overhead.workspace_source}] = {workspace:,} B",
        cuda_context=f"{overhead.cuda_context_bytes:,} [B: {overhead.context_source}] = "
        f"{overhead.cuda_context_bytes:,} B",
    )


def cuda_memory(
    e: Estimation, parts: Mapping[str, int], first_total: int | None
) -> CudaMemory | None:
    """The CUDA figures of an estimate from its lines (and the first iteration's replay)."""
    if e.request.runtime is not Runtime.CUDA:
        return None
    context = parts["cuda_context"]
    cached = parts["fragmentation_reserve"]
    allocated = sum(parts.values()) - context - cached
    first_allocated = first_reserved = None
    if first_total is not None:
        rounding = cache = 0
        if e.allocator is not None:
            first = e.allocator[0]
            rounding = max(0, first.allocated_bytes - first.requested_bytes)
            cache = max(0, first.reserved_bytes - first.allocated_bytes)
        else:  # not replayed: the fixed rounding and reserve (0 with round_allocations=false)
            rounding, cache = parts["allocator_rounding"], cached
        first_allocated = first_total + rounding + parts["workspace"]
        first_reserved = first_allocated + cache
    return CudaMemory(
        allocated_bytes=allocated,
        reserved_bytes=allocated + cached,
        context_bytes=context,
        device_total_bytes=allocated + cached + context,
        first_iteration_allocated_bytes=first_allocated,
        first_iteration_reserved_bytes=first_reserved,
        expandable_segments=e.request.overhead.expandable_segments,
    )


def context_free(request: MemoryRequest) -> MemoryRequest:
    """``request`` without what only adds to an estimate's peak, for a caller that memoises
    estimates of many devices: the CUDA context (:func:`cuda_lines` adds it as a line of its
    own, after the allocator's figures and the fragmentation reserve; nothing else reads it),
    and on a runtime other than CUDA the whole framework overhead (only :func:`cuda_lines` and
    :func:`cuda_memory`, both CUDA only, read it). ``estimate_memory(a, request).peak_bytes ==
    estimate_memory(a, context_free(request)).peak_bytes + context_bytes(request)``."""
    overhead = request.overhead
    if request.runtime is not Runtime.CUDA:
        free = _NO_OVERHEAD
    else:
        free = replace(overhead, cuda_context_bytes=0, context_source="", context_default="")
    return request if free == overhead else replace(request, overhead=free)


def context_bytes(request: MemoryRequest) -> int:
    """The CUDA context an estimate of ``request`` adds to its peak [B] (0 off CUDA)."""
    return request.overhead.cuda_context_bytes if request.runtime is Runtime.CUDA else 0


_NO_OVERHEAD = FrameworkOverhead()
