"""Recommendation candidates: devices, MIG slices and multi-GPU groups, and which of them can
run a request at each precision (pure).

A candidate is a device with the memory-engine settings of its hardware row. A whole GPU on
which batch 1 does not fit becomes, where the request allows, the smallest tensor-parallel
group (2, 4 or 8 GPUs, Megatron-style), pipeline group (2, 4 or 8 stages) or tensor x pipeline
group (at most :data:`MAX_NODE_GPUS`, one node) whose per-GPU peak fits. A group is priced as
its GPUs together (price and TDP x GPUs) and holds one GPU's memory: the memory engine's peak
is per GPU.

The memory fits and the workloads come from a :class:`WorkloadSource` (the service's model
source: the graph, its analyses and the memory engine, cached).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Protocol

from app.domain.hardware import DeviceKind, FrameworkOverhead, HardwareSpec
from app.domain.performance.decoding import DecoderServing
from app.domain.performance.errors import RooflineInputError
from app.domain.performance.phases import PhasedRequest
from app.domain.performance.pipeline import ParallelStrategy, PipelinePlan
from app.domain.performance.precision_schemes import PrecisionScheme
from app.domain.performance.recommend import MemoryFit
from app.domain.performance.roofline import unsupported_reason
from app.domain.precision import Precision
from app.domain.workload import Runtime


@dataclass(frozen=True, slots=True)
class Candidate:
    """A device with the memory-engine settings of its hardware row."""

    device: HardwareSpec
    runtime: Runtime
    overhead: FrameworkOverhead
    tensor_parallel: int = 1  # a group of GPUs; ``device`` is the group (price, TDP x t)
    pipeline_parallel: int = 1  # stages (each of ``tensor_parallel`` GPUs)

    @property
    def gpus(self) -> int:
        """GPUs the candidate is."""
        return self.tensor_parallel * self.pipeline_parallel


@dataclass(frozen=True, slots=True, kw_only=True)
class ExcludedCandidate:
    """A device and precision that was not evaluated, and why."""

    device: str  # the candidate's slug
    precision: Precision
    reason: str


Runnable = tuple[Candidate, PrecisionScheme]


class WorkloadSource(Protocol):
    """What the search asks of a model: its decoder serving plan, the memory fit of a batch
    on a candidate and the phased request a candidate runs."""

    @property
    def decoder(self) -> bool:
        """Whether the model is a decoder LLM (prefill and decode steps)."""
        ...

    @property
    def plan(self) -> DecoderServing:
        """The decoder serving plan."""
        ...

    def memory_fit(self, batch: int, scheme: PrecisionScheme, candidate: Candidate) -> MemoryFit:
        """The fit of ``batch`` requests on the candidate's memory."""
        ...

    def fits(self, batch: int, scheme: PrecisionScheme, candidate: Candidate) -> bool:
        """Whether ``batch`` requests fit the candidate's memory."""
        ...

    def overfills(self, batch: int, scheme: PrecisionScheme, candidate: Candidate) -> bool:
        """Whether a floor under the requirement already exceeds the candidate's memory."""
        ...

    def floor_fit(
        self, batch: int, scheme: PrecisionScheme, candidate: Candidate
    ) -> MemoryFit | None:
        """The fit judged from that floor when it overfills (``exact`` False), else None."""
        ...

    def max_concurrent_requests(
        self, scheme: PrecisionScheme, candidate: Candidate, limit: int
    ) -> int:
        """Continuous batching: the most requests that fit, at most ``limit``."""
        ...

    def workload(self, batch: int, scheme: PrecisionScheme) -> PhasedRequest:
        """The request's phases at a batch and precision."""
        ...

    def sharded(self, batch: int, scheme: PrecisionScheme, degree: int) -> PhasedRequest:
        """One GPU's share of the request on a tensor-parallel group."""
        ...

    def staged(
        self, batch: int, scheme: PrecisionScheme, stages: int, tensor: int = 1
    ) -> PipelinePlan:
        """One micro-batch of the request split into pipeline stages."""
        ...


TENSOR_PARALLEL_DEGREES = (2, 4, 8)


def tensor_parallel_group(candidate: Candidate, degree: int) -> Candidate:
    """``degree`` whole GPUs of the candidate's kind as one candidate: the group's price and
    TDP, one GPU's memory (the memory engine's peak is per GPU), named ``slug xN``."""
    device = candidate.device
    return replace(
        candidate,
        tensor_parallel=degree,
        device=replace(
            device,
            slug=f"{device.slug} x{degree}",
            name=f"{degree} x {device.name} (tensor parallel)",
            price_usd_per_hour=(
                None if device.price_usd_per_hour is None else device.price_usd_per_hour * degree
            ),
            tdp_watts=None if device.tdp_watts is None else device.tdp_watts * degree,
        ),
    )


PIPELINE_PARALLEL_DEGREES = (2, 4, 8)
MAX_NODE_GPUS = 8  # a t x p group stays inside one node


def pipeline_group(candidate: Candidate, stages: int, tensor: int = 1) -> Candidate:
    """``stages`` x ``tensor`` whole GPUs of the candidate's kind as one pipeline-parallel
    candidate: the group's price and TDP, one GPU's memory, named ``slug xN (pipeline)`` (or
    ``slug xN (tensor t x pipeline p)``)."""
    device = candidate.device
    gpus = stages * tensor
    how = "pipeline" if tensor == 1 else f"tensor {tensor} x pipeline {stages}"
    return replace(
        candidate,
        tensor_parallel=tensor,
        pipeline_parallel=stages,
        device=replace(
            device,
            slug=f"{device.slug} x{gpus} ({how})",
            name=f"{gpus} x {device.name} ({how} parallel)",
            price_usd_per_hour=(
                None if device.price_usd_per_hour is None else device.price_usd_per_hour * gpus
            ),
            tdp_watts=None if device.tdp_watts is None else device.tdp_watts * gpus,
        ),
    )


def supported(
    pool: Sequence[Candidate], schemes: Sequence[PrecisionScheme]
) -> tuple[list[Runnable], list[ExcludedCandidate]]:
    """Every candidate and precision it can run, in order, and the others with the reason
    (:func:`app.domain.performance.roofline.unsupported_reason`)."""
    excluded: list[ExcludedCandidate] = []
    runnable: list[Runnable] = []
    for candidate in pool:
        for scheme in schemes:
            reason = unsupported_reason(candidate.device, scheme)
            if reason is None:
                runnable.append((candidate, scheme))
            else:
                excluded.append(
                    ExcludedCandidate(
                        device=candidate.device.slug, precision=scheme.precision, reason=reason
                    )
                )
    return runnable, excluded


def tensor_parallel_groups(
    source: WorkloadSource,
    runnable: Sequence[Runnable],
    most: int,
    excluded: list[ExcludedCandidate],
) -> list[Runnable]:
    """For each whole GPU and precision whose batch 1 does not fit one GPU, the smallest
    tensor-parallel group (2, 4 or 8 GPUs, at most ``most``) whose per-GPU peak fits."""
    groups: list[Runnable] = []
    for candidate, scheme in runnable:
        device = candidate.device
        if device.kind is not DeviceKind.GPU or device.parent is not None or most < 2:
            continue
        if source.fits(1, scheme, candidate):
            continue
        for degree in (d for d in TENSOR_PARALLEL_DEGREES if d <= most):
            group = tensor_parallel_group(candidate, degree)
            if not source.fits(1, scheme, group):
                continue
            try:
                source.sharded(1, scheme, degree)  # cached: the batch loop reuses it
            except RooflineInputError as exc:
                excluded.append(
                    ExcludedCandidate(
                        device=group.device.slug, precision=scheme.precision, reason=str(exc)
                    )
                )
                break
            groups.append((group, scheme))
            break
    return groups


def explicit_tensor_parallel_groups(
    source: WorkloadSource,
    runnable: Sequence[Runnable],
    degree: int,
    excluded: list[ExcludedCandidate],
) -> list[Runnable]:
    """For each whole GPU and precision, the tensor-parallel group of exactly ``degree`` GPUs
    the request asked for, whether or not one GPU holds the model (a smaller latency or a
    larger KV pool per replica), when its per-GPU peak fits and the heads split over it;
    otherwise the group is listed in ``excluded`` with the reason."""
    groups: list[Runnable] = []
    for candidate, scheme in runnable:
        device = candidate.device
        if device.kind is not DeviceKind.GPU or device.parent is not None:
            continue
        group = tensor_parallel_group(candidate, degree)
        try:
            source.sharded(1, scheme, degree)
        except RooflineInputError as exc:
            excluded.append(
                ExcludedCandidate(
                    device=group.device.slug, precision=scheme.precision, reason=str(exc)
                )
            )
            continue
        if not source.fits(1, scheme, group):
            excluded.append(
                ExcludedCandidate(
                    device=group.device.slug,
                    precision=scheme.precision,
                    reason=f"batch 1 does not fit one GPU of the {degree}-GPU tensor group",
                )
            )
            continue
        groups.append((group, scheme))
    return groups


def pipeline_shapes(
    strategy: ParallelStrategy, tensor_max: int, pipeline_max: int
) -> list[tuple[int, int]]:
    """(tensor, stages) groups to try in order, fewest GPUs first: pipeline 2, 4, 8;
    ``both`` adds t x p groups (t, p >= 2, at most 8 GPUs, more tensor first at equal size)."""
    shapes = [(1, p) for p in PIPELINE_PARALLEL_DEGREES if p <= pipeline_max]
    if strategy is ParallelStrategy.BOTH:
        shapes += [
            (t, p)
            for t in TENSOR_PARALLEL_DEGREES
            for p in PIPELINE_PARALLEL_DEGREES
            if t <= tensor_max and p <= pipeline_max and t * p <= MAX_NODE_GPUS
        ]
    return sorted(shapes, key=lambda shape: (shape[0] * shape[1], -shape[0]))


def pipeline_groups(
    source: WorkloadSource,
    runnable: Sequence[Runnable],
    strategy: ParallelStrategy,
    *,
    tensor_max: int,
    pipeline_max: int,
    excluded: list[ExcludedCandidate],
) -> list[Runnable]:
    """For each whole GPU and precision whose batch 1 does not fit one GPU, the smallest
    pipeline group (2, 4 or 8 stages) whose per-GPU peak fits, and with ``both`` the smallest
    tensor x pipeline group too."""
    if strategy is ParallelStrategy.TENSOR:
        return []
    shapes = pipeline_shapes(strategy, tensor_max, pipeline_max)
    groups: list[Runnable] = []
    for candidate, scheme in runnable:
        device = candidate.device
        if device.kind is not DeviceKind.GPU or device.parent is not None:
            continue
        if candidate.gpus > 1 or source.fits(1, scheme, candidate):
            continue
        for want_hybrid in (False, True) if strategy is ParallelStrategy.BOTH else (False,):
            for tensor, stages in shapes:
                if (tensor > 1) is not want_hybrid:
                    continue
                group = pipeline_group(candidate, stages, tensor)
                if not source.fits(1, scheme, group):
                    continue
                try:
                    source.staged(1, scheme, stages, tensor)  # cached: the batch loop reuses it
                except RooflineInputError as exc:
                    excluded.append(
                        ExcludedCandidate(
                            device=group.device.slug, precision=scheme.precision, reason=str(exc)
                        )
                    )
                    break
                groups.append((group, scheme))
                break
    return groups


def runnable_candidates(
    source: WorkloadSource,
    pool: Sequence[Candidate],
    schemes: Sequence[PrecisionScheme],
    strategy: ParallelStrategy,
    *,
    tensor_parallel_max: int,
    pipeline_parallel_max: int,
    tensor_parallel_size: int | None = None,
) -> tuple[list[Runnable], list[ExcludedCandidate]]:
    """Every candidate and precision to evaluate: the devices and slices that can run it
    (:func:`supported`), then the tensor-parallel groups (unless ``strategy`` is pipeline)
    and the pipeline groups of the GPUs too small for batch 1; and what was left out, why.
    ``tensor_parallel_size`` (>= 2) adds a group of exactly that many GPUs of every kind
    (:func:`explicit_tensor_parallel_groups`)."""
    runnable, excluded = supported(pool, schemes)
    singles = list(runnable)
    if strategy is not ParallelStrategy.PIPELINE:
        runnable += tensor_parallel_groups(source, singles, tensor_parallel_max, excluded)
    if tensor_parallel_size is not None and tensor_parallel_size > 1:
        present = {(c.device.slug, s.precision) for c, s in runnable}
        runnable += [
            (c, s)
            for c, s in explicit_tensor_parallel_groups(
                source, singles, tensor_parallel_size, excluded
            )
            if (c.device.slug, s.precision) not in present
        ]
    runnable += pipeline_groups(
        source,
        singles,
        strategy,
        tensor_max=tensor_parallel_max,
        pipeline_max=pipeline_parallel_max,
        excluded=excluded,
    )
    return runnable, excluded
