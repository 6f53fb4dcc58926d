"""Pipeline parallelism for inference: consecutive layers on p GPUs, micro-batches between them
(pure).

A request's kernels are split into ``p`` stages of consecutive transformer blocks; each GPU
holds its stage's weights and its layers' KV cache and runs its kernels; between stages the
hidden state of every token in flight crosses the GPU link. The split is **balanced by
layers**, not by time: the repeated blocks are divided evenly, the remainder going to the
stages before the last (the first stage also runs the embedding, the last the final norm and
the LM head), as vLLM does (``vllm/distributed/utils.py``, ``get_pp_indices``: "the first and
last partitions are excluded because they contain the input and output embeddings");
TensorRT-LLM and Megatron also give each stage ``layers / p`` blocks. Balancing by time would
need a partition search the serving engines do not run; the slowest stage (usually the last,
with the LM head) sets the pace and is reported.

Per phase repetition (a forward pass, a prefill or one decode step) a batch of ``B`` requests
runs as ``m = min(B, p)`` micro-batches of ``mu = ceil(B / m)`` (``p`` micro-batches are what
keeps every stage busy: vLLM runs one virtual engine per stage). With ``T_s`` the kernel time of
stage ``s`` on one micro-batch (the roofline of its kernels, its all-reduces under tensor
parallelism) and ``X_s = alpha + bytes_s / L_eff`` the send of the micro-batch's boundary
activation after it (``alpha`` the 10 us per-transfer latency of the all-reduces, ``L_eff`` the
GPU link (NVLink), else the host link, at the calibrated link efficiency; ``X_{p-1} = 0``):

    round trip  R   = sum_s T_s + sum_s X_s      one micro-batch through every stage
    slot        tau = max_s (T_s + X_s)           the slowest stage and its send (not overlapped)
    cycle       I   = max(m * tau, R)             per repetition: each stage serves the m
                                                  micro-batches once, and a micro-batch's next
                                                  step cannot start before it left the last stage

The cycle is the time between two repetitions of one micro-batch (a decode step's latency) and
of the batch (the steady-state interval). With ``m >= p`` balanced stages ``m * tau >= R``: the
stages stay busy but for the transfers and the imbalance. With ``m < p`` (a batch smaller than
the pipeline) ``R`` sets the pace and only ``m`` of the ``p`` GPUs work at a time. The share of
GPU time idle in steady state is ``1 - m * sum_s T_s / (p * I)``. The GPipe bubble ``(p - 1) /
(m + p - 1)`` is the idle share of one pass of a batch *alone* (the pipeline filled and drained:
``(m + p - 1)`` slots for ``m`` micro-batches), what a lone batch or the first after idle pays; it
is reported beside the steady state, not priced into the figures.

    latency  = t_req + sum over phases of repeats * (h2d + I + d2h)
    interval = max(sum of repeats * I, m * h2d time, m * d2h time, t_req)

References
----------
Huang et al., "GPipe: Efficient Training of Giant Neural Networks using Pipeline Parallelism",
NeurIPS 2019 (bubble (p - 1) / (m + p - 1)). Narayanan et al., "Efficient Large-Scale Language
Model Training on GPU Clusters Using Megatron-LM", SC 2021 (section 2.2).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from enum import StrEnum

from app.domain.hardware import HardwareSpec
from app.domain.performance.calibration import Calibration
from app.domain.performance.errors import RooflineInputError
from app.domain.performance.kernels import Kernel
from app.domain.performance.phases import Phase, PhasedRequest
from app.domain.performance.prediction import (
    PhaseTiming,
    PipelinePhase,
    PipelineTiming,
    Prediction,
    StageSpan,
)
from app.domain.performance.roofline import predict
from app.domain.performance.tensor_parallel import ALLREDUCE_LATENCY_S, link_between_gpus

PIPELINE_TRANSFER_LATENCY_S = ALLREDUCE_LATENCY_S  # per send/receive of a boundary activation


class ParallelStrategy(StrEnum):
    """How a model that does not fit one GPU is spread over the GPUs of a node."""

    TENSOR = "tensor"  # Megatron-style: every GPU runs 1/t of every layer
    PIPELINE = "pipeline"  # every GPU runs 1/p of the layers
    BOTH = "both"  # tensor groups, pipeline groups and t x p groups


def block_key(name: str) -> str | None:
    """The repeated block a kernel belongs to: its name up to the first numeric segment
    (``layers.12.mlp`` -> ``layers.12``), or None outside the blocks (embedding, final norm,
    head)."""
    parts = name.split(".")
    for index, part in enumerate(parts):
        if part.isdigit():
            return ".".join(parts[: index + 1])
    return None


def _units(kernels: Sequence[Kernel]) -> list[list[int]]:
    """Kernel indices grouped by block: kernels before the first block join it, kernels after
    a block (and between blocks) join the block before them."""
    units: list[list[int]] = []
    lead: list[int] = []
    current: str | None = None
    for index, kernel in enumerate(kernels):
        key = block_key(kernel.name)
        if key is None or key == current:
            (units[-1] if units else lead).append(index)
            continue
        current = key
        units.append([*lead, index])
        lead = []
    if lead and units:
        units[-1] += lead
    return units


def blocks_per_stage(blocks: int, stages: int) -> tuple[int, ...]:
    """Blocks per stage, balanced by count: ``floor(L / p)`` each, the remainder one each to
    the stages before the last (vLLM ``get_pp_indices``).

    Parameters
    ----------
    blocks : L, repeated blocks of the model [-]
    stages : p [-]

    Returns
    -------
    sizes : blocks of each stage, first to last [-]
    """
    if stages < 2:
        raise RooflineInputError(f"pipeline parallelism needs >= 2 stages, got {stages}")
    if blocks < stages:
        raise RooflineInputError(
            f"pipeline parallelism over {stages} stages needs at least {stages} repeated blocks "
            f"(layers named like 'layers.0.*'); the graph has {blocks}"
        )
    sizes = [blocks // stages] * stages
    for offset in range(2, blocks % stages + 2):
        sizes[-offset] += 1
    return tuple(sizes)


@dataclass(frozen=True, slots=True, kw_only=True)
class PipelinePlan:
    """A request split into stages: each stage's share of every phase, and the activation each
    boundary sends per phase repetition."""

    stages: tuple[PhasedRequest, ...]
    spans: tuple[StageSpan, ...]
    send_bytes: tuple[tuple[int, ...], ...]  # per phase, per boundary (p - 1) [B]


def _stage_phase(phase: Phase, kernels: tuple[Kernel, ...], *, first: bool, last: bool,
                 tensor_parallel: int) -> Phase:  # fmt: skip
    allreduces = allreduce_bytes = 0
    if tensor_parallel > 1:  # as shard(): two all-reduces of the hidden state per layer
        attention = [k for k in kernels if "attention" in k.ops]
        allreduces = 2 * len(attention)
        allreduce_bytes = 2 * sum(k.output_bytes for k in attention)
    return Phase(
        name=phase.name,
        kernels=kernels,
        h2d_bytes=phase.h2d_bytes if first else 0,
        d2h_bytes=phase.d2h_bytes if last else 0,
        repeats=phase.repeats,
        allreduces=allreduces,
        allreduce_bytes=allreduce_bytes,
    )


def split_stages(request: PhasedRequest, stages: int) -> PipelinePlan:
    """``request`` split into ``stages`` pipeline stages of consecutive blocks.

    Parameters
    ----------
    request : one micro-batch of the request (a tensor-parallel shard of it for t x p)
    stages : p, GPUs (or tensor-parallel groups) in the pipeline [-]

    Returns
    -------
    plan : per stage the request's phases with that stage's kernels (the host copy in on the
        first stage, out on the last; under tensor parallelism each stage's own all-reduces),
        and the bytes each boundary sends: the output of the stage's last kernel (the hidden
        state of every token of the micro-batch)

    Raises
    ------
    RooflineInputError
        When ``stages`` < 2 or the graph has fewer repeated blocks than stages.
    """
    first_phase = request.phases[0]
    sizes = blocks_per_stage(len(_units(first_phase.kernels)), stages)
    bounds = [0]
    for size in sizes:
        bounds.append(bounds[-1] + size)
    per_stage: list[list[Phase]] = [[] for _ in range(stages)]
    send: list[tuple[int, ...]] = []
    spans: list[StageSpan] = []
    for phase in request.phases:
        units = _units(phase.kernels)
        if len(units) != bounds[-1]:
            raise RooflineInputError(
                f"phase '{phase.name}' has {len(units)} blocks, '{first_phase.name}' "
                f"{bounds[-1]}: the stages would differ between phases"
            )
        sends = []
        for s in range(stages):
            indices = [i for unit in units[bounds[s] : bounds[s + 1]] for i in unit]
            kernels = tuple(phase.kernels[i] for i in indices)
            per_stage[s].append(
                _stage_phase(
                    phase,
                    kernels,
                    first=s == 0,
                    last=s == stages - 1,
                    tensor_parallel=request.tensor_parallel,
                )  # fmt: skip
            )
            if s < stages - 1:
                sends.append(kernels[-1].output_bytes)
            if phase is first_phase:
                spans.append(
                    StageSpan(
                        first_kernel=kernels[0].name,
                        last_kernel=kernels[-1].name,
                        blocks=sizes[s],
                        kernels=len(kernels),
                    )
                )
        send.append(tuple(sends))
    note = (
        f"pipeline parallel over {stages} stages of consecutive blocks "
        f"({'/'.join(map(str, sizes))}; balanced by layers as vLLM's get_pp_indices, the "
        "embedding on the first stage, the final norm and LM head on the last): each GPU runs "
        "its stage's kernels and holds its weights and KV cache; the hidden state crosses the "
        f"link between stages, {PIPELINE_TRANSFER_LATENCY_S * 1e6:g} us plus bytes / link each"
    )
    return PipelinePlan(
        stages=tuple(
            replace(request, phases=tuple(phases), assumptions=(*request.assumptions, note))
            for phases in per_stage
        ),
        spans=tuple(spans),
        send_bytes=tuple(send),
    )


def pipeline_phase(
    name: str, stage_s: Sequence[float], send_bytes: Sequence[int], *, micro_batches: int,
    link_bytes_per_s: float,
) -> PipelinePhase:  # fmt: skip
    """One phase repetition of ``m`` micro-batches through ``p`` stages.

    Parameters
    ----------
    name : the phase
    stage_s : T_s, each stage's kernel time on one micro-batch [s]
    send_bytes : the activation each of the p - 1 boundaries sends per micro-batch [B]
    micro_batches : m [-]
    link_bytes_per_s : L_eff, the link between the GPUs at the calibrated efficiency [B/s]

    Returns
    -------
    phase : ``X_s = alpha + bytes_s / L_eff``, ``tau = max_s (T_s + X_s)``, ``R = sum T_s +
        sum X_s``, ``I = max(m tau, R)``, idle share ``1 - m sum T_s / (p I)`` and the GPipe
        bubble ``(p - 1) / (m + p - 1)``
    """
    p, m = len(stage_s), micro_batches
    if len(send_bytes) != p - 1:
        raise RooflineInputError(f"{p} stages have {p - 1} boundaries, got {len(send_bytes)}")
    sends = tuple(PIPELINE_TRANSFER_LATENCY_S + b / link_bytes_per_s for b in send_bytes)
    slot = max(t + x for t, x in zip(stage_s, (*sends, 0.0), strict=True))
    trip = sum(stage_s) + sum(sends)
    cycle = max(m * slot, trip)
    return PipelinePhase(
        name=name,
        stage_s=tuple(stage_s),
        send_bytes=tuple(send_bytes),
        send_s=sends,
        slot_s=slot,
        round_trip_s=trip,
        cycle_s=cycle,
        idle_fraction=1 - m * sum(stage_s) / (p * cycle) if cycle > 0 else 0.0,
        gpipe_bubble_fraction=(p - 1) / (m + p - 1),
    )


def micro_batching(batch: int, stages: int) -> tuple[int, int]:
    """``(m, mu)``: ``m = min(B, p)`` micro-batches of ``mu = ceil(B / m)`` requests (the last
    may hold fewer; it is priced as a full one)."""
    if batch < 1 or stages < 1:
        raise RooflineInputError("batch and stages must be >= 1")
    m = min(batch, stages)
    return m, -(-batch // m)


def _sum_phase(name: str, timings: Sequence[PhaseTiming], piped: PipelinePhase) -> PhaseTiming:
    first, last = timings[0], timings[-1]
    compute = sum(t.compute_s for t in timings)
    flops = sum(t.flops for t in timings)
    quantized = sum(t.flops / t.wave_efficiency for t in timings if t.wave_efficiency)
    return PhaseTiming(
        name=name,
        repeats=first.repeats,
        kernels=sum(t.kernels for t in timings),
        launches=sum(t.launches for t in timings),
        compute_bound_kernels=sum(t.compute_bound_kernels for t in timings),
        flops=flops,
        bytes_moved=sum(t.bytes_moved for t in timings),
        dram_bytes=sum(t.dram_bytes for t in timings),
        compute_s=compute,
        memory_s=sum(t.memory_s for t in timings),
        launch_s=sum(t.launch_s for t in timings),
        h2d_bytes=first.h2d_bytes,
        h2d_s=first.h2d_s,
        d2h_bytes=last.d2h_bytes,
        d2h_s=last.d2h_s,
        allreduces=sum(t.allreduces for t in timings),
        allreduce_bytes=sum(t.allreduce_bytes for t in timings),
        allreduce_s=sum(t.allreduce_s for t in timings),
        host_wait_s=sum(t.host_wait_s for t in timings),
        wave_efficiency=flops / quantized if quantized else 1.0,
        pipeline_transfer_bytes=sum(piped.send_bytes),
        pipeline_transfer_s=sum(piped.send_s),
        pipeline_wait_s=piped.cycle_s - piped.round_trip_s,
    )


def predict_pipeline(
    plan: PipelinePlan,
    device: HardwareSpec,
    calibration: Calibration,
    *,
    batch: int,
    micro_batches: int,
) -> Prediction:
    """Latency and throughput of ``batch`` requests run as ``micro_batches`` micro-batches
    through the plan's stages, one GPU (or tensor-parallel group) of ``device`` each.

    Parameters
    ----------
    plan : the stages of one micro-batch (:func:`split_stages`)
    device : one GPU of the pipeline (peaks, bandwidth, links)
    calibration : efficiencies and overheads of the device's calibration class
    batch : B, requests in flight [-]
    micro_batches : m [-]

    Returns
    -------
    prediction : per phase the stages' kernel times summed (one micro-batch through every
        stage) plus the transfers and the wait for the other micro-batches, so that a phase's
        latency is its cycle ``I``; ``latency = t_req + sum repeats (h2d + I + d2h)``,
        ``interval = max(sum repeats I, m x copy times, t_req)``; FLOPs and bytes are the m
        micro-batches'; ``pipeline`` has every stage's figures

    Notes
    -----
    See the module docstring for the cycle ``I = max(m tau, R)``.
    """
    p = len(plan.stages)
    if micro_batches < 1 or micro_batches > batch:
        raise RooflineInputError(f"micro_batches must be in [1, {batch}], got {micro_batches}")
    cal = calibration
    link_bytes_per_s, link_source = link_between_gpus(device, cal, what="pipeline parallelism")
    stage_predictions = [predict(stage, device, cal) for stage in plan.stages]
    m = micro_batches
    piped_phases = []
    timings = []
    for index, phase in enumerate(plan.stages[0].phases):
        per_stage = [sp.phases[index] for sp in stage_predictions]
        piped = pipeline_phase(
            phase.name,
            [t.kernel_s for t in per_stage],
            plan.send_bytes[index],
            micro_batches=m,
            link_bytes_per_s=link_bytes_per_s,
        )
        piped_phases.append(piped)
        timings.append(_sum_phase(phase.name, per_stage, piped))
    overhead = cal.request_overhead_s
    latency = overhead + sum(t.latency_s * t.repeats for t in timings)
    interval = max(
        sum(t.kernel_s * t.repeats for t in timings),
        m * sum(t.h2d_s * t.repeats for t in timings),
        m * sum(t.d2h_s * t.repeats for t in timings),
        overhead,
    )
    head = stage_predictions[0]
    request = plan.stages[0]
    return replace(
        head,
        batch=batch,
        phases=tuple(timings),
        latency_s=latency,
        interval_s=interval,
        flops=m * sum(sp.flops for sp in stage_predictions),
        bytes_moved=m * sum(sp.bytes_moved for sp in stage_predictions),
        dram_bytes=m * sum(sp.dram_bytes for sp in stage_predictions),
        first_token_s=overhead + timings[0].latency_s if request.decoder else None,
        per_token_s=timings[1].latency_s if request.decoder and len(timings) > 1 else None,
        pipeline=PipelineTiming(
            stages=p,
            micro_batches=m,
            micro_batch_size=request.batch,
            spans=plan.spans,
            link_source=link_source,
            link_bytes_per_s=link_bytes_per_s,
            transfer_latency_s=PIPELINE_TRANSFER_LATENCY_S,
            phases=tuple(piped_phases),
        ),
    )


def stage_weights_note(spans: Sequence[StageSpan]) -> str:
    """The stages in words."""
    return "; ".join(
        f"stage {i}: {span.blocks} blocks, {span.kernels} kernels ({span.first_kernel} .. "
        f"{span.last_kernel})"
        for i, span in enumerate(spans)
    )
