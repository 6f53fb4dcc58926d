"""ONE hardware spec: what the planners know about a device, built once per request.

A :class:`HardwareSpec` is a whole GPU, CPU or SoC from the catalog, or one MIG slice of a GPU
(:func:`mig_slice`). It carries the roofline's figures (peaks, bandwidths, link, power, price),
the usable memory, the MIG geometry of a MIG-capable GPU, and the framework overheads the memory
engine and the fit charge on it (CUDA context, library workspaces, fragmentation reserve).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import date
from enum import StrEnum

from app.domain.errors import DomainError
from app.domain.mig.layout import MigGeometry, MigProfileSpec
from app.domain.precision import ComputeCapability, DType
from app.domain.units import MIB
from app.domain.workload import GpuTraits, Runtime


class HardwareInputError(DomainError):
    """Hardware figures that no device can have."""


# Physically sane ranges of the figures the model divides by. The hardware schema rejects
# profiles outside them on write; the model checks again before dividing (profiles stored before
# that check, devices built by other code), so no input can make it divide by zero, by a
# subnormal number or by infinity.
MIN_PEAK_FLOPS_PER_S = 1e6  # 1 MFLOP/s: slower than any processor worth planning for
MAX_PEAK_FLOPS_PER_S = 1e21  # 1 ZFLOP/s per device: >100 000x a 2025 flagship GPU's dense peak
MIN_BANDWIDTH_BYTES_PER_S = 1e6  # 1 MB/s: below any memory or host link (PCIe 1.0 x1: 250 MB/s)
MAX_BANDWIDTH_BYTES_PER_S = 1e18  # 1 EB/s: ~50x wafer-scale on-chip SRAM (21 PB/s)
MIN_EFFICIENCY = 1e-4  # calibrated efficiencies: 0.01 % to 100 %
MIN_FRACTION = 1 / 1024  # MIG slice share of compute or bandwidth
MAX_OVERHEAD_S = 3600.0  # per kernel launch or per request
# The hardware schema's limits too (app.schemas.hardware imports them): one value on write and
# before dividing. 100 kW: ~100x a 2025 flagship GPU's TDP (about 1 kW); 100 000 USD/h: over
# 10 000x an on-demand flagship GPU hour.
MAX_TDP_WATTS = 100_000
MAX_PRICE_USD_PER_HOUR = 100_000
MAX_SM_COUNT = 100_000  # streaming multiprocessors per device: ~700x a 2025 flagship GPU's 148


def in_range(value: object, low: float, high: float) -> bool:
    """Whether ``value`` is a real number (not bool, NaN or infinite) in ``[low, high]``."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return False
    if isinstance(value, float) and not math.isfinite(value):
        return False
    return low <= value <= high


def require_range(
    name: str,
    value: object,
    low: float,
    high: float,
    unit: str = "",
    error: type[DomainError] = HardwareInputError,
) -> None:
    """Raise ``error`` unless ``value`` is a finite number in [low, high]."""
    if not in_range(value, low, high):
        raise error(f"{name} must be a finite number in [{low:g}, {high:g}]{unit}, got {value!r}")


# cuBLAS workspace PyTorch allocates per (cuBLAS handle, stream), through the caching allocator
# (so it counts in memory_allocated) and keeps: aten/src/ATen/cuda/CublasHandlePool.cpp,
# ``getChosenWorkspaceSize()``: CUBLAS_WORKSPACE_CONFIG unset -> ":4096:2:16:8" (2 x 4096 KiB +
# 8 x 16 KiB) except 32 MiB (":4096:8") on Hopper (sm90, PRs #89027/#91564) and Blackwell
# (sm100/sm120, PR #175344, 2026). cuBLASLt shares it (TORCH_CUBLASLT_UNIFIED_WORKSPACE default
# since PR #173002, 2026; before: a separate 1 MiB).
CUBLAS_WORKSPACE_BYTES = 2 * 4096 * 1024 + 8 * 16 * 1024  # 8,519,680 B
CUBLAS_WORKSPACE_32MIB_BYTES = 4096 * 8 * 1024  # 33,554,432 B
_CUBLAS_SOURCE = "aten/src/ATen/cuda/CublasHandlePool.cpp, PyTorch 2.13"
CUDA_CONTEXT_SOURCE = (
    "CUDA context and kernels outside the caching allocator: documented default, not measured "
    "(PyTorch loads modules lazily, CUDA_MODULE_LOADING=LAZY, since 1.13; PR #86509 measured "
    "274 MiB lazy vs 636 MiB eager on one GPU; per-GPU figures come from "
    "benchmarks/fidelity/cuda)"
)


def cublas_workspace(architecture: str | None) -> tuple[int, str]:
    """The cuBLAS workspace per (handle, stream) PyTorch allocates on a GPU architecture [B],
    and where the figure comes from."""
    name = (architecture or "").lower()
    if name.startswith(("hopper", "blackwell")):
        return CUBLAS_WORKSPACE_32MIB_BYTES, (
            f"cuBLAS workspace per handle and stream, 32 MiB on Hopper/Blackwell ({_CUBLAS_SOURCE})"
        )
    if architecture is None:
        return CUBLAS_WORKSPACE_32MIB_BYTES, (
            "cuBLAS workspace per handle and stream, no GPU named: Hopper's 32 MiB, the larger "
            f"default ({_CUBLAS_SOURCE})"
        )
    return CUBLAS_WORKSPACE_BYTES, (
        f"cuBLAS workspace per handle and stream, :4096:2:16:8 before Hopper ({_CUBLAS_SOURCE})"
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class FrameworkOverhead:
    """Per-process overheads of the runtime (CUDA only), each reported as its own line."""

    cuda_context_bytes: int = 512 * MIB
    workspace_bytes: int = CUBLAS_WORKSPACE_32MIB_BYTES  # per (cuBLAS handle, stream)
    # None: the cached-but-free segments come from replaying the caching allocator; a number:
    # a fixed reserve of that fraction of the allocated bytes instead.
    fragmentation_fraction: float | None = None
    round_allocations: bool = True  # replay the caching allocator (False: no rounding, no cache)
    expandable_segments: bool = False  # PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
    workspace_source: str = cublas_workspace(None)[1]
    context_source: str = CUDA_CONTEXT_SOURCE
    # Non-empty: the context is the CUDA context table's default (app.domain.cuda_context), and
    # this says what it assumed (loading, CUDA major, the GPU's row), for defaults_used.
    context_default: str = ""

    def __post_init__(self) -> None:
        for name in ("cuda_context_bytes", "workspace_bytes"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise HardwareInputError(f"{name} must be an integer >= 0, got {value!r}")
        fraction = self.fragmentation_fraction
        if fraction is None:
            return
        if not (isinstance(fraction, int | float) and math.isfinite(fraction)):
            raise HardwareInputError(f"fragmentation_fraction must be a number, got {fraction!r}")
        if not 0 <= fraction <= 1:
            raise HardwareInputError(f"fragmentation_fraction must be in [0, 1], got {fraction!r}")


class PriceKind(StrEnum):
    """What kind of offer a price is: prices of different kinds are never ranked together."""

    ON_DEMAND = "on_demand"  # list rate, pay as you go, no commitment
    RESERVED = "reserved"  # committed or pre-booked capacity: reservations, capacity blocks
    SPOT = "spot"  # interruptible capacity at a market rate


class DeviceKind(StrEnum):
    """Broad class of a device; calibration defaults are per kind, with CPUs split by matrix
    engine (``app.domain.performance.roofline.CalibrationClass``)."""

    GPU = "gpu"
    CPU = "cpu"
    EDGE = "edge"  # SoCs with unified memory (Jetson, Apple silicon): no host-link copy
    TPU = "tpu"


@dataclass(frozen=True, slots=True, kw_only=True)
class HardwareSpec:
    """A candidate device: a whole GPU/CPU/SoC, or one MIG slice of a GPU.

    Peaks and bandwidth are the whole device's catalog figures; a MIG slice gets
    ``compute_fraction`` and ``bandwidth_fraction`` of them. ``memory_bytes``, ``tdp_watts`` and
    ``price_usd_per_hour`` are already the slice's own (usable memory, share of power and price).
    """

    slug: str  # "nvidia-a100-80gb-sxm" or "nvidia-a100-80gb-sxm/1g.10gb"
    name: str
    kind: DeviceKind
    peak_flops_per_s: Mapping[DType, float]
    memory_bandwidth_bytes_per_s: float
    memory_bytes: int
    host_link_bytes_per_s: float | None  # None: unified memory (edge, CPU) or unknown
    host_link_source: str
    tdp_watts: float | None
    price_usd_per_hour: float | None
    price_source: str = "catalog"
    price_kind: PriceKind | None = None  # None: no price, or one stored without its kind
    price_region: str | None = None  # None: the source does not say
    price_date: date | None = None  # None: unknown (price_source says where it comes from)
    simd: str | None = None  # CPUs: the vector / matrix extensions
    parent: str | None = None  # MIG: the GPU's slug
    mig_profile: str | None = None
    compute_fraction: float = 1.0
    bandwidth_fraction: float = 1.0
    mig: MigGeometry | None = None  # a MIG-capable GPU's geometry (None on a slice)
    overhead: FrameworkOverhead = field(default_factory=FrameworkOverhead)
    gpu_link_bytes_per_s: float | None = None  # per direction to peers (NVLink); None: none
    sm_count: int | None = None  # GPU/SoC streaming multiprocessors (a MIG slice: its own)
    # Where a MIG slice's sm_count comes from, in words (None: the device's own figure)
    sm_count_source: str | None = None
    cpu_cores: int | None = None  # CPUs: physical cores per socket (the catalog's cpu.cores)
    architecture: str | None = None  # the catalog's, e.g. "Hopper GH100" (None: not stated)
    # CUDA compute capability (None: not a CUDA device, or not in the profile); a MIG slice
    # has its GPU's
    compute_capability: ComputeCapability | None = None
    # What the GPU shows to CUDA (torch.cuda.mem_get_info's total) [B] and the figure's
    # source; None: not measured (memory_bytes is the sold capacity, not this)
    cuda_visible_memory_bytes: int | None = None
    cuda_visible_memory_source: str | None = None

    @property
    def parallel_units(self) -> int | None:
        """Units a kernel's tiles are spread over: SMs on a GPU or SoC, cores on a CPU (None:
        unknown, e.g. TPUs, or profiles stored without the figure)."""
        return self.cpu_cores if self.kind is DeviceKind.CPU else self.sm_count

    @property
    def gpu(self) -> GpuTraits | None:
        """What the precision and attention defaults need of this device (None: a CPU/TPU)."""
        if self.kind not in (DeviceKind.GPU, DeviceKind.EDGE):
            return None
        return GpuTraits(name=self.slug, compute_capability=self.compute_capability)

    @property
    def runtime(self) -> Runtime:
        """The PyTorch runtime the memory engine models on this device."""
        return Runtime.CPU if self.kind is DeviceKind.CPU else Runtime.CUDA

    @property
    def needs_host_copy(self) -> bool:
        """Whether inputs and outputs cross a host link (discrete accelerators)."""
        return self.kind in (DeviceKind.GPU, DeviceKind.TPU)


def slice_cuda_visible_bytes(
    gpu_visible_bytes: int | None, gpu_visible_source: str | None, profile_bytes: int
) -> tuple[int | None, str | None]:
    """What a MIG slice shows to CUDA [B], and the source, where a measurement bounds it.

    A slice cannot show CUDA more than its whole GPU does: where the GPU's measured figure is
    below the profile's usable memory (an H100 80GB's 7g.80gb profile is listed with 79.25 GiB
    by ``nvidia-smi mig -lgip``, the whole GPU shows 79.19 GiB to torch), the GPU's figure caps
    the slice's. Otherwise (None, None): no measurement of the slice itself, so its catalog
    memory stands.
    """
    if gpu_visible_bytes is None or profile_bytes <= gpu_visible_bytes:
        return None, None
    return gpu_visible_bytes, (
        f"at most what the whole GPU shows to CUDA ({gpu_visible_bytes:,} B: {gpu_visible_source})"
    )


def mig_slice(gpu: HardwareSpec, geometry: MigGeometry, profile: MigProfileSpec) -> HardwareSpec:
    """One MIG instance of ``gpu`` as a device of its own.

    Notes
    -----
    compute fraction = compute slices / the GPU's total compute slices (7, or 4 on A30);
    bandwidth fraction = memory slices / total memory slices (8, or 4 on A30); memory = the
    profile's usable bytes; TDP and price scale with the compute fraction; SMs = the profile's
    own ``sm_count`` where known (NVIDIA's tables are not proportional: an A100 1g slice has 14
    SMs, not floor(108 / 7) = 15, and its 7g slice 98, not 108), else
    max(1, floor(GPU SMs x compute fraction)), an approximation and usually an upper bound. The
    host link is not partitioned: a slice alone on its GPU gets all of it.

    References
    ----------
    NVIDIA Multi-Instance GPU User Guide, "Supported MIG Profiles" (SMs per profile).
    """
    for what, part, total in (
        ("compute", profile.compute_slices, geometry.total_compute_slices),
        ("memory", profile.memory_slices, geometry.total_memory_slices),
    ):
        if not 1 <= part <= total:
            raise HardwareInputError(
                f"{gpu.slug} MIG {profile.name}: {what} slices {part} must be between 1 and the "
                f"GPU's total of {total}"
            )
    sms, most = profile.sm_count, gpu.sm_count or MAX_SM_COUNT
    if sms is not None and (
        isinstance(sms, bool) or not isinstance(sms, int) or not 1 <= sms <= most
    ):
        raise HardwareInputError(
            f"{gpu.slug} MIG {profile.name}: sm_count {sms!r} must be an integer between 1 and "
            + (f"the GPU's sm_count of {most}" if gpu.sm_count else f"{most}")
        )
    compute = profile.compute_slices / geometry.total_compute_slices
    bandwidth = profile.memory_slices / geometry.total_memory_slices
    sm_count, sm_count_source = _slice_sms(gpu.sm_count, geometry, profile)
    visible, visible_source = slice_cuda_visible_bytes(
        gpu.cuda_visible_memory_bytes, gpu.cuda_visible_memory_source, profile.memory_bytes
    )
    return replace(
        gpu,
        slug=f"{gpu.slug}/{profile.name}",
        name=f"{gpu.name} MIG {profile.name}",
        memory_bytes=profile.memory_bytes,
        tdp_watts=None if gpu.tdp_watts is None else gpu.tdp_watts * compute,
        price_usd_per_hour=(
            None if gpu.price_usd_per_hour is None else gpu.price_usd_per_hour * compute
        ),
        price_source=f"{gpu.price_source}, x {profile.compute_slices}/"
        f"{geometry.total_compute_slices} compute slices",
        parent=gpu.slug,
        mig=None,
        mig_profile=profile.name,
        compute_fraction=compute,
        bandwidth_fraction=bandwidth,
        sm_count=sm_count,
        sm_count_source=sm_count_source,
        cuda_visible_memory_bytes=visible,
        cuda_visible_memory_source=visible_source,
    )


def _slice_sms(
    gpu_sm_count: int | None, geometry: MigGeometry, profile: MigProfileSpec
) -> tuple[int | None, str | None]:
    """A MIG slice's SMs and where they come from: the profile's own figure, else the GPU's
    proportional share (an approximation)."""
    if profile.sm_count is not None:
        return profile.sm_count, f"MIG {profile.name}: the profile's own SM count"
    if gpu_sm_count is None:
        return None, None
    share = max(1, gpu_sm_count * profile.compute_slices // geometry.total_compute_slices)
    return share, (
        f"MIG {profile.name}: approximated as floor({gpu_sm_count} GPU SMs x "
        f"{profile.compute_slices}/{geometry.total_compute_slices} compute slices), no SM count "
        "for the profile (NVIDIA's per-profile counts are often lower)"
    )


# Theoretical per-direction bandwidth of one PCIe lane after line coding [B/s]; the catalog's
# x16 figures (15.75 / 31.5 / 63 GB/s for Gen3 / 4 / 5) divided by 16.
PCIE_LANE_BYTES_PER_S: Mapping[int, float] = {
    1: 0.25e9,
    2: 0.5e9,
    3: 0.984375e9,
    4: 1.96875e9,
    5: 3.9375e9,
    6: 7.875e9,
}


def pcie_bandwidth_bytes_per_s(generation: int, lanes: int) -> float | None:
    """Theoretical per-direction bandwidth of a PCIe link, or None for an unknown generation.

    Parameters
    ----------
    generation : PCIe generation (1-6) [-]
    lanes : link width [-]

    Returns
    -------
    bandwidth : lanes * per-lane rate after 8b/10b (Gen1-2) or 128b/130b (Gen3+) coding [B/s]
    """
    rate = PCIE_LANE_BYTES_PER_S.get(generation)
    return None if rate is None else rate * lanes
