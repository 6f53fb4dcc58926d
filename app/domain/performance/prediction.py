"""What a prediction is made of: per-phase timings, the pipeline's stages and the totals
(pure)."""

from __future__ import annotations

import math
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum

from app.domain.hardware import HardwareSpec, in_range
from app.domain.performance.calibration import Calibration
from app.domain.performance.errors import RooflineInputError
from app.domain.performance.tiling import Tiling
from app.domain.precision import DType, Precision
from app.domain.workload import Attention


@dataclass(frozen=True, slots=True, kw_only=True)
class StageSpan:
    """The kernels one pipeline stage runs."""

    first_kernel: str
    last_kernel: str
    blocks: int
    kernels: int


@dataclass(frozen=True, slots=True, kw_only=True)
class PipelinePhase:
    """One phase repetition through the pipeline."""

    name: str
    stage_s: tuple[float, ...]  # T_s: each stage's kernel time on one micro-batch [s]
    send_bytes: tuple[int, ...]  # each boundary's activation per micro-batch [B]
    send_s: tuple[float, ...]  # X_s = alpha + bytes / L_eff [s]
    slot_s: float  # tau = max_s (T_s + X_s)
    round_trip_s: float  # R = sum T_s + sum X_s
    cycle_s: float  # I = max(m tau, R)
    idle_fraction: float  # 1 - m sum T_s / (p I): GPU time idle in steady state
    gpipe_bubble_fraction: float  # (p - 1) / (m + p - 1): one pass of a batch alone


@dataclass(frozen=True, slots=True, kw_only=True)
class PipelineTiming:
    """What a pipeline-parallel prediction is made of."""

    stages: int
    micro_batches: int
    micro_batch_size: int
    spans: tuple[StageSpan, ...]
    link_source: str
    link_bytes_per_s: float  # effective, per direction
    transfer_latency_s: float
    phases: tuple[PipelinePhase, ...]


class Bound(StrEnum):
    """What a request's latency mostly goes to."""

    COMPUTE = "compute"
    MEMORY = "memory"
    TRANSFER = "transfer"
    OVERHEAD = "overhead"


def kernel_seconds(
    compute_s: float,
    memory_s: float,
    launch_s: float,
    allreduce_s: float,
    host_wait_s: float,
    pipeline_transfer_s: float = 0.0,
    pipeline_wait_s: float = 0.0,
) -> float:
    """A phase's kernel time per repetition, summed in this order (:attr:`PhaseTiming.kernel_s`)
    [s]."""
    return (
        compute_s
        + memory_s
        + launch_s
        + allreduce_s
        + host_wait_s
        + pipeline_transfer_s
        + pipeline_wait_s
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class PhaseTiming:
    """One phase on one device, per repetition."""

    name: str
    repeats: int
    kernels: int
    launches: int
    compute_bound_kernels: int
    flops: int
    bytes_moved: int
    dram_bytes: float
    compute_s: float  # kernels limited by compute
    memory_s: float  # kernels limited by memory bandwidth
    launch_s: float
    h2d_bytes: int
    h2d_s: float
    d2h_bytes: int
    d2h_s: float
    allreduces: int = 0  # tensor parallelism
    allreduce_bytes: int = 0
    allreduce_s: float = 0.0  # on the GPUs' stream, between the kernels
    wave_efficiency: float = 1.0  # FLOPs / quantized FLOPs (1: no tiling known)
    pipeline_transfer_bytes: int = 0  # pipeline parallel: activations sent between stages
    pipeline_transfer_s: float = 0.0  # their time (one micro-batch, every boundary)
    pipeline_wait_s: float = 0.0  # the wait for the other micro-batches' slots (cycle - trip)
    # the device idle waiting for a framework's host to issue kernels: launches x host
    # dispatch beyond the device's own time (compute + memory + launch + all-reduces)
    host_wait_s: float = 0.0

    @property
    def kernel_s(self) -> float:
        """Time the device runs kernels (and the all-reduces between them, and waits for the
        host to issue them; pipeline parallel: every stage's kernels, the sends between stages
        and the wait for the other micro-batches) [s]."""
        return kernel_seconds(
            self.compute_s,
            self.memory_s,
            self.launch_s,
            self.allreduce_s,
            self.host_wait_s,
            self.pipeline_transfer_s,
            self.pipeline_wait_s,
        )

    @property
    def latency_s(self) -> float:
        """Copy in, kernels, copy out [s]."""
        return self.h2d_s + self.kernel_s + self.d2h_s


@dataclass(frozen=True, slots=True, kw_only=True)
class Prediction:
    """Latency and throughput of a request on a device, with every input of the formulas and
    what they assume (``assumptions``: precision convention, attention, MoE routing)."""

    device: HardwareSpec
    precision: Precision
    batch: int
    compute_dtype: DType
    peak_flops_per_s: float  # the whole device's catalog peak for compute_dtype
    peak_source: str
    calibration: Calibration
    effective_flops_per_s: float  # peak * compute fraction * compute efficiency (for dtype)
    effective_bandwidth_bytes_per_s: float
    effective_host_link_bytes_per_s: float | None
    phases: tuple[PhaseTiming, ...]
    request_overhead_s: float
    latency_s: float
    interval_s: float  # steady-state time per batch
    flops: int
    bytes_moved: int
    dram_bytes: float
    first_token_s: float | None = None  # decoders
    per_token_s: float | None = None
    attention: tuple[tuple[Attention, str], ...] = ()  # implementations priced, and why
    assumptions: tuple[str, ...] = ()  # precision convention, attention, MoE routing in words
    tensor_parallel: int = 1  # GPUs per request (the figures are the group's)
    allreduce_link_source: str = ""  # tensor parallel: the link the all-reduces cross
    tiling: Tiling | None = None  # tile and wave quantization (None: the device has no count)
    pipeline: PipelineTiming | None = None  # pipeline parallel: stages, micro-batches, sends

    @property
    def pipeline_parallel(self) -> int:
        """Pipeline stages (1: none)."""
        return 1 if self.pipeline is None else self.pipeline.stages

    def _where(self) -> str:
        """The prediction in words, for its errors (built only when one is raised)."""
        return f"{self.device.slug} at {self.precision.value}, batch {self.batch}"

    def __post_init__(self) -> None:
        # Every property below divides by one of these: a prediction only exists with them sane.
        # The common case first (a recommendation builds thousands): four floats in
        # [smallest normal, inf), which passes every check below.
        low = sys.float_info.min
        if (
            self.batch >= 1
            and type(self.effective_flops_per_s) is float
            and type(self.effective_bandwidth_bytes_per_s) is float
            and type(self.latency_s) is float
            and type(self.interval_s) is float
            and low <= self.effective_flops_per_s < math.inf
            and low <= self.effective_bandwidth_bytes_per_s < math.inf
            and low <= self.latency_s < math.inf
            and low <= self.interval_s < math.inf
        ):
            return
        if self.batch < 1:
            raise RooflineInputError(f"batch must be >= 1, got {self.batch}")
        for name in ("effective_flops_per_s", "effective_bandwidth_bytes_per_s"):
            value = getattr(self, name)
            if not in_range(value, sys.float_info.min, math.inf):
                raise RooflineInputError(f"{self._where()}: {name} must be positive, got {value!r}")
        for name in ("latency_s", "interval_s"):
            value = getattr(self, name)
            if not in_range(value, 0.0, math.inf):
                raise RooflineInputError(
                    f"{self._where()}: the {name[:-2]} is not a finite time ({value!r}): the "
                    "device's figures are too small for this request"
                )
            if value < sys.float_info.min:
                raise RooflineInputError(
                    f"{self._where()}: the {name[:-2]} would be 0 s: the model runs no kernel and "
                    "copies nothing, and the calibration sets no launch or request overhead"
                )

    @property
    def throughput_per_s(self) -> float:
        """Inferences (sequences for decoders) per second at steady state."""
        return self.batch / self.interval_s

    @property
    def time_split_s(self) -> Mapping[Bound, float]:
        """Latency split into compute-bound, memory-bound, transfer and overhead time [s]."""
        split = dict.fromkeys(Bound, 0.0)
        for phase in self.phases:
            split[Bound.COMPUTE] += phase.compute_s * phase.repeats
            split[Bound.MEMORY] += phase.memory_s * phase.repeats
            split[Bound.TRANSFER] += (
                phase.h2d_s + phase.d2h_s + phase.allreduce_s + phase.pipeline_transfer_s
            ) * phase.repeats
            split[Bound.OVERHEAD] += (
                phase.launch_s + phase.host_wait_s + phase.pipeline_wait_s
            ) * phase.repeats
        split[Bound.OVERHEAD] += self.request_overhead_s
        return split

    @property
    def bound(self) -> Bound:
        """The largest share of the latency."""
        split = self.time_split_s
        return max(Bound, key=lambda b: split[b])

    @property
    def arithmetic_intensity_flops_per_byte(self) -> float:
        """Operational intensity of the whole request: FLOPs per DRAM byte [FLOP/B]."""
        return self.flops / self.dram_bytes if self.dram_bytes else math.inf

    @property
    def ridge_point_flops_per_byte(self) -> float:
        """Intensity above which a kernel is compute-bound on this device (effective peak /
        effective bandwidth) [FLOP/B]."""
        return self.effective_flops_per_s / self.effective_bandwidth_bytes_per_s
