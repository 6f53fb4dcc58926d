"""Hardware profile contract; also the schema every `hardware_catalog/` entry must satisfy."""

from __future__ import annotations

import re
from datetime import UTC, date, datetime, timedelta
from enum import StrEnum
from typing import Annotated, Any, ClassVar, Literal, Self

from pydantic import BeforeValidator, Field, StringConstraints, field_validator, model_validator

from app.domain.hardware import (
    MAX_BANDWIDTH_BYTES_PER_S,
    MAX_PEAK_FLOPS_PER_S,
    MAX_PRICE_USD_PER_HOUR,
    MAX_SM_COUNT,
    MAX_TDP_WATTS,
    MIN_BANDWIDTH_BYTES_PER_S,
    MIN_PEAK_FLOPS_PER_S,
    PriceKind,
)
from app.domain.precision import DType
from app.schemas.base import MAX_BYTES, Page, Schema, Slug, located_error

# A device as a planner names it: a hardware slug (the whole device) or `slug/profile` (one MIG
# slice of a MIG-capable GPU, e.g. nvidia-a100-80gb-sxm/1g.10gb), the form recommendations take.
DEVICE_PATTERN = (
    r"^[a-z0-9](?:[a-z0-9-]{0,62}[a-z0-9])?(?:/[1-8]g\.[0-9]{1,3}gb(?:[+-][a-z]+(?:\.[a-z]+)?)?)?$"
)
DEVICE_MAX_LENGTH = 100
DeviceName = Annotated[
    str,
    StringConstraints(pattern=DEVICE_PATTERN, min_length=1, max_length=DEVICE_MAX_LENGTH),
    Field(
        description="A hardware slug (the whole device) or `slug/profile` (one MIG slice of a "
        "MIG-capable GPU: its profile's usable memory, the GPU's overheads and defaults).",
        examples=["nvidia-a100-80gb-sxm/1g.10gb"],
    ),
]


class HardwareKind(StrEnum):
    """Broad class of a device."""

    GPU = "gpu"
    CPU = "cpu"
    TPU = "tpu"
    EDGE = "edge"


class HardwareSource(StrEnum):
    """Where a hardware profile came from: the shipped catalog (read-only) or a user."""

    CATALOG = "catalog"
    USER = "user"


# Physically sane ranges (the roofline model divides by these figures; zero, subnormal, negative
# or non-finite values are rejected with a 422 naming the field). The upper bounds leave orders
# of magnitude of room for future hardware.
MIN_MEMORY_BYTES = 2**20  # 1 MiB
MIN_BANDWIDTH = int(MIN_BANDWIDTH_BYTES_PER_S)
MAX_BANDWIDTH = int(MAX_BANDWIDTH_BYTES_PER_S)
MIN_TDP_WATTS = 0.01
MIN_CLOCK_HZ = 10**6
PEAK_RANGE = (
    f"each in [{MIN_PEAK_FLOPS_PER_S:.0e}, {MAX_PEAK_FLOPS_PER_S:.0e}] (1 MFLOP/s to 1 ZFLOP/s)"
)
BANDWIDTH_RANGE = f"[{MIN_BANDWIDTH:.0e}, {MAX_BANDWIDTH:.0e}] B/s (1 MB/s to 1 EB/s)"

Bandwidth = Annotated[int, Field(ge=MIN_BANDWIDTH, le=MAX_BANDWIDTH)]
PeakTable = dict[
    DType,
    Annotated[float, Field(ge=MIN_PEAK_FLOPS_PER_S, le=MAX_PEAK_FLOPS_PER_S, allow_inf_nan=False)],
]
EARLIEST_PRICE_DATE = date(2000, 1, 1)
_ISO_DATE = re.compile(r"^[0-9]{4}-[0-9]{2}-[0-9]{2}$")


def _iso_date_only(value: Any) -> Any:
    """A price date is a calendar date written YYYY-MM-DD (or a YAML date): no timestamps, no
    numbers, no times of day."""
    if isinstance(value, datetime) or isinstance(value, bool | int | float):
        raise ValueError("expected a date written YYYY-MM-DD")
    if isinstance(value, str) and not _ISO_DATE.match(value):
        raise ValueError(f"expected a date written YYYY-MM-DD, got {value[:40]!r}")
    return value


PriceDate = Annotated[date, BeforeValidator(_iso_date_only)]

MigProfileName = Annotated[
    str,
    StringConstraints(pattern=r"^[1-8]g\.[0-9]{1,3}gb(?:[+-][a-z]+(?:\.[a-z]+)?)?$"),
]


class HostLink(Schema):
    """How the device talks to its host (or, for a CPU, to its accelerators)."""

    type: str = Field(
        min_length=1,
        max_length=200,
        description="Human-readable description of the link.",
        examples=["PCIe Gen4 x16"],
    )
    pcie_generation: int | None = Field(
        default=None, ge=1, le=7, description="PCIe generation, if PCIe.", examples=[4]
    )
    pcie_lanes: int | None = Field(
        default=None, ge=1, le=256, description="PCIe lanes, if PCIe.", examples=[16]
    )
    bandwidth_bytes_per_s: Bandwidth | None = Field(
        default=None,
        description=f"Theoretical per-direction host link bandwidth, {BANDWIDTH_RANGE}.",
        examples=[31_500_000_000],
    )


class GpuLink(Schema):
    """The direct link between the GPUs of a node (NVLink), used by tensor parallelism."""

    type: str = Field(
        min_length=1,
        max_length=200,
        description="Human-readable description of the link.",
        examples=["NVLink 4 (18 links, 900 GB/s bidirectional)"],
    )
    bandwidth_bytes_per_s: Bandwidth = Field(
        description=f"Per-direction bandwidth of one GPU to its peers, {BANDWIDTH_RANGE}.",
        examples=[450_000_000_000],
    )


class CpuDetails(Schema):
    """Core counts and clocks of a CPU (or of the CPU side of an edge SoC)."""

    cores: int = Field(gt=0, le=4096, description="Physical cores per socket.", examples=[56])
    threads: int = Field(gt=0, le=8192, description="Hardware threads per socket.", examples=[112])
    base_clock_hz: int | None = Field(
        default=None,
        ge=MIN_CLOCK_HZ,
        le=10**11,
        description="Base clock, 1 MHz to 100 GHz [Hz].",
        examples=[2_000_000_000],
    )
    boost_clock_hz: int | None = Field(
        default=None,
        ge=MIN_CLOCK_HZ,
        le=10**11,
        description="Max boost clock, 1 MHz to 100 GHz [Hz].",
        examples=[3_800_000_000],
    )
    simd: str | None = Field(
        default=None,
        max_length=200,
        description="Vector / matrix extensions that set the peak figures.",
        examples=["AVX-512 + AMX"],
    )


class MigProfile(Schema):
    """One MIG GPU-instance profile of a GPU model."""

    name: MigProfileName = Field(
        description="Profile name as nvidia-smi prints it.", examples=["1g.10gb"]
    )
    memory_mib: int = Field(
        gt=0,
        le=2**24,
        description="Usable memory as the driver reports it, smallest value observed [MiB].",
        examples=[9728],
    )
    compute_slices: int = Field(
        ge=1, le=8, description="Compute slices (the 'Ng' prefix).", examples=[1]
    )
    sm_count: int | None = Field(
        default=None,
        strict=True,
        ge=1,
        le=MAX_SM_COUNT,
        description="Streaming multiprocessors of one instance as NVIDIA's profile table gives "
        "it (not proportional to the compute slices: 14 on an A100 1g slice, 98 on its 7g), "
        "an integer from 1 to the GPU's `sm_count`; null: not published, and the slice gets "
        "floor(GPU sm_count x compute slices / total compute slices), an approximation.",
        examples=[14],
    )
    memory_slices: int = Field(
        ge=1, le=8, description="Memory slices occupied (placement size).", examples=[1]
    )
    max_instances: int = Field(
        ge=1, le=8, description="Maximum instances of this profile on one GPU.", examples=[7]
    )
    placements: list[Annotated[int, Field(ge=0, le=7)]] = Field(
        min_length=1,
        description="Allowed start indices on the memory-slice axis.",
        examples=[[0, 1, 2, 3, 4, 5, 6]],
    )
    unconfirmed: list[str] = Field(
        default_factory=list,
        description="Fields of this profile not confirmed against a primary source.",
        examples=[["placements"]],
    )


class MigSpec(Schema):
    """MIG geometry of a GPU model and its profiles."""

    total_compute_slices: int = Field(
        ge=1, le=8, description="Compute slices of the whole GPU (7, or 4 on A30).", examples=[7]
    )
    total_memory_slices: int = Field(
        ge=1, le=8, description="Memory slices of the whole GPU (8, or 4 on A30).", examples=[8]
    )
    max_gpu_instances: int = Field(
        ge=1, le=8, description="Maximum GPU instances at once.", examples=[7]
    )
    profiles: list[MigProfile] = Field(
        min_length=1, description="Every supported GPU-instance profile."
    )

    @model_validator(mode="after")
    def _profiles_fit_geometry(self) -> Self:
        seen: set[str] = set()
        for index, profile in enumerate(self.profiles):
            where = f"profiles[{index}] ({profile.name})"
            if profile.name in seen:
                raise located_error(
                    "MigSpec", ("profiles", index, "name"), f"{where}: duplicate profile name"
                )
            seen.add(profile.name)
            if profile.compute_slices > self.total_compute_slices:
                raise located_error(
                    "MigSpec",
                    ("profiles", index, "compute_slices"),
                    f"{where}: compute_slices {profile.compute_slices} exceeds "
                    f"total_compute_slices {self.total_compute_slices}",
                )
            for position, start in enumerate(profile.placements):
                if start + profile.memory_slices > self.total_memory_slices:
                    raise located_error(
                        "MigSpec",
                        ("profiles", index, "placements", position),
                        f"{where}: placement {start} + memory_slices {profile.memory_slices} "
                        f"runs past total_memory_slices {self.total_memory_slices}",
                    )
        return self


class FrameworkOverheadDefaults(Schema):
    """Per-device framework defaults the memory engine adds as separate lines."""

    cuda_context_bytes: int = Field(
        ge=0,
        le=MAX_BYTES,
        description="Per-process CUDA context (PyTorch, lazy module loading) [B].",
        examples=[524_288_000],
    )
    workspace_bytes: int = Field(
        ge=0,
        le=MAX_BYTES,
        description="cuBLAS / cuDNN workspace reserved per process [B].",
        examples=[33_554_432],
    )


class HardwareBase(Schema):
    """Fields a client supplies for a hardware profile."""

    vendor: str = Field(
        min_length=1, max_length=64, description="Manufacturer.", examples=["NVIDIA"]
    )
    name: str = Field(
        min_length=1, max_length=200, description="Marketing name.", examples=["A100 80GB SXM4"]
    )
    kind: HardwareKind = Field(description="Device class.", examples=["gpu"])
    family: str | None = Field(
        default=None,
        max_length=64,
        description="Device family; for catalog entries, the catalog file it came from.",
        examples=["nvidia-ampere"],
    )
    architecture: str | None = Field(
        default=None,
        max_length=100,
        description="Micro-architecture. On a GPU it picks the performance calibration: a "
        "name containing the word Ampere or Hopper runs under gpu_ampere or gpu_hopper (their "
        "own fitted efficiency), any other under the pooled gpu class.",
        examples=["Ampere GA100"],
    )
    launch_year: int | None = Field(
        default=None, ge=1990, le=2100, description="Year of launch.", examples=[2020]
    )
    memory_bytes: int = Field(
        ge=MIN_MEMORY_BYTES,
        le=MAX_BYTES,
        description=(
            "Device memory, at least 1 MiB [B]. GPU HBM/GDDR sold as 'N GB' is N GiB; for CPUs, "
            "the memory of the reference system named in `notes`."
        ),
        examples=[85_899_345_920],
    )
    memory_type: str | None = Field(
        default=None, max_length=64, description="Memory technology.", examples=["HBM2e"]
    )
    memory_bandwidth_bytes_per_s: Bandwidth = Field(
        description=f"Peak memory bandwidth, {BANDWIDTH_RANGE}.", examples=[2_039_000_000_000]
    )
    peak_flops_per_s: PeakTable = Field(
        min_length=1,
        description=(
            "Dense peak throughput per dtype [FLOP/s, or OP/s for integer dtypes]; the best "
            f"dense figure (tensor/matrix units where present), no 2:4 sparsity; {PEAK_RANGE}."
        ),
        examples=[{"fp32": 19.5e12, "tf32": 156e12, "bf16": 312e12, "fp16": 312e12}],
    )
    peak_sparse_flops_per_s: PeakTable = Field(
        default_factory=dict,
        description="2:4 structured-sparsity peaks as marketed [FLOP/s or OP/s], kept apart; "
        f"{PEAK_RANGE}.",
        examples=[{"bf16": 624e12}],
    )
    host_link: HostLink = Field(description="Host link of the device.")
    gpu_link: GpuLink | None = Field(
        default=None,
        description="GPU-to-GPU link of the node (NVLink); null: the GPUs of a node reach each "
        "other over the host link (PCIe).",
    )
    sm_count: int | None = Field(
        default=None,
        strict=True,
        ge=1,
        le=MAX_SM_COUNT,
        description="Streaming multiprocessors of a GPU or SoC GPU, 1 to 100 000; null: "
        "unknown (GEMMs are then priced without tile and wave quantization). A MIG slice gets "
        "its profile's `sm_count`, else floor(sm_count x compute slices / total compute "
        "slices), an approximation.",
        examples=[108],
    )
    compute_capability: str | None = Field(
        default=None,
        pattern=r"^[1-9][0-9]?\.[0-9]$",
        description="CUDA compute capability `major.minor` of an NVIDIA GPU or SoC GPU (NVIDIA, "
        "'CUDA GPUs - Compute Capability': 7.0 V100, 7.5 T4, 8.0 A100, 8.9 L4, 9.0 H100); null: "
        "not a CUDA device, or unknown. It decides the defaults on the device: below 8.0 there "
        "is no bf16 (precision defaults to fp16 / amp_fp16) and no flash attention (SDPA picks "
        "mem_efficient), and the precisions a 'GPUs that would fit' list offers it for.",
        examples=["8.0"],
    )
    cuda_visible_memory_bytes: int | None = Field(
        default=None,
        strict=True,
        ge=1,
        description="Memory the GPU shows to CUDA, `torch.cuda.mem_get_info()[1]` (what vLLM "
        "logs as `total_memory`) [B]: less than `memory_bytes`, the capacity the GPU is sold "
        "with (an H100 80GB shows 79.19 GiB), because the driver keeps part of it. vLLM's KV "
        "pool is `gpu_memory_utilization` x this figure. Null: not measured; the engine answers "
        "then use `memory_bytes` and say so. At most `memory_bytes`; needs "
        "`cuda_visible_memory_source`.",
        examples=[85029158748],
    )
    cuda_visible_memory_source: str | None = Field(
        default=None,
        min_length=1,
        max_length=500,
        description="Where `cuda_visible_memory_bytes` was measured (a log, a run, a driver "
        "version); required with it.",
        examples=["vLLM 0.19 start-up logs on an H100 80GB HBM3: total_memory=79.19GiB"],
    )
    tdp_watts: float | None = Field(
        default=None,
        ge=MIN_TDP_WATTS,
        le=MAX_TDP_WATTS,
        allow_inf_nan=False,
        description="Thermal design power, 0.01 W to 100 kW [W].",
        examples=[400],
    )
    price_usd_per_hour: float | None = Field(
        default=None,
        ge=0,
        le=MAX_PRICE_USD_PER_HOUR,
        allow_inf_nan=False,
        description="Indicative price of one device, 0 to 100 000 [USD/h]; `price_kind` says "
        "which kind of offer it is (required with a price).",
        examples=[4.1],
    )
    price_kind: PriceKind | None = Field(
        default=None,
        description="Kind of offer the price is: `on_demand` (list rate, pay as you go), "
        "`reserved` (committed or pre-booked capacity: reservations, savings plans, capacity "
        "blocks) or `spot` (interruptible). Required when `price_usd_per_hour` is set; "
        "recommendations rank costs among prices of one kind only.",
        examples=["on_demand"],
    )
    price_region: str | None = Field(
        default=None,
        min_length=1,
        max_length=64,
        description="Region the price was quoted for (e.g. `us-east-1`); null: the source "
        "does not say.",
        examples=["us-east-1"],
    )
    price_date: PriceDate | None = Field(
        default=None,
        description="Date the price was published or read, YYYY-MM-DD, from 2000-01-01 to "
        "today; null: unknown (`price_source` then says where the figure comes from).",
        examples=["2026-11-01"],
    )
    price_source: str | None = Field(
        default=None,
        min_length=1,
        max_length=500,
        description="Where the price comes from: the offer (provider, instance, how the "
        "per-device figure was derived) and the page it was read on.",
        examples=["AWS p4d.24xlarge on-demand 32.77 USD/h / 8 GPUs"],
    )
    cpu: CpuDetails | None = Field(default=None, description="CPU details, for CPUs and SoCs.")
    mig: MigSpec | None = Field(
        default=None, description="MIG geometry and profiles; null when MIG is not supported."
    )
    framework_overhead: FrameworkOverheadDefaults | None = Field(
        default=None, description="Framework overhead defaults for this device; null: none."
    )
    unconfirmed: list[Annotated[str, StringConstraints(max_length=300)]] = Field(
        default_factory=list,
        max_length=100,
        description="Fields not confirmed against a primary source.",
        examples=[["price_usd_per_hour"]],
    )
    sources: list[Annotated[str, StringConstraints(min_length=1, max_length=500)]] = Field(
        default_factory=list,
        max_length=50,
        description="Where the figures come from.",
        examples=[["https://www.nvidia.com/en-us/data-center/a100/"]],
    )
    notes: str | None = Field(
        default=None, max_length=4000, description="Free-form remarks.", examples=[None]
    )

    # A price written through the API or the catalog must say its kind; rows read back may
    # carry a price stored before prices had one (kind null = unknown).
    require_price_kind: ClassVar[bool] = True

    @field_validator("price_date")
    @classmethod
    def _price_date_in_range(cls, value: date | None) -> date | None:
        if value is None:
            return value
        latest = datetime.now(UTC).date() + timedelta(days=1)  # any time zone's today
        if not EARLIEST_PRICE_DATE <= value <= latest:
            raise ValueError(
                f"price_date {value.isoformat()} must be between "
                f"{EARLIEST_PRICE_DATE.isoformat()} and today"
            )
        return value

    @model_validator(mode="after")
    def _price_says_its_kind(self) -> Self:
        name = type(self).__name__
        if self.price_usd_per_hour is None:
            for field in ("price_kind", "price_region", "price_date", "price_source"):
                if getattr(self, field) is not None:
                    raise located_error(
                        name, (field,), f"{field} describes a price: set price_usd_per_hour too"
                    )
        elif self.price_kind is None and self.require_price_kind:
            raise located_error(
                name,
                ("price_kind",),
                "a price must say its kind: on_demand, reserved or spot (prices of different "
                "kinds are not compared)",
            )
        return self

    @model_validator(mode="after")
    def _sm_count_not_on_cpus(self) -> Self:
        if self.sm_count is not None and self.kind is HardwareKind.CPU:
            raise located_error(
                type(self).__name__,
                ("sm_count",),
                "a cpu has no streaming multiprocessors: its cores are cpu.cores",
            )
        return self

    @model_validator(mode="after")
    def _compute_capability_only_on_cuda_devices(self) -> Self:
        if self.compute_capability is not None and self.kind not in (
            HardwareKind.GPU,
            HardwareKind.EDGE,
        ):
            raise located_error(
                type(self).__name__,
                ("compute_capability",),
                f"a {self.kind.value} has no CUDA compute capability (GPUs and SoC GPUs only)",
            )
        return self

    @model_validator(mode="after")
    def _cuda_visible_memory_with_source(self) -> Self:
        visible = self.cuda_visible_memory_bytes
        if visible is not None and self.kind not in (HardwareKind.GPU, HardwareKind.EDGE):
            raise located_error(
                type(self).__name__,
                ("cuda_visible_memory_bytes",),
                f"a {self.kind.value} shows no memory to CUDA (GPUs and SoC GPUs only)",
            )
        if visible is not None and visible > self.memory_bytes:
            raise located_error(
                type(self).__name__,
                ("cuda_visible_memory_bytes",),
                f"{visible:,} B is more than the device's memory_bytes ({self.memory_bytes:,} "
                "B): a GPU shows CUDA at most the memory it has",
            )
        if (visible is None) != (self.cuda_visible_memory_source is None):
            missing = (
                "cuda_visible_memory_source"
                if visible is not None
                else ("cuda_visible_memory_bytes")
            )
            raise located_error(
                type(self).__name__,
                (missing,),
                "cuda_visible_memory_bytes and cuda_visible_memory_source go together: the "
                "figure and where it was measured",
            )
        return self

    @model_validator(mode="after")
    def _mig_only_on_gpus(self) -> Self:
        if self.mig is not None and self.kind is not HardwareKind.GPU:
            raise located_error(
                type(self).__name__,
                ("mig",),
                f"only gpu devices support MIG, not kind '{self.kind.value}'",
            )
        return self

    @model_validator(mode="after")
    def _mig_slices_within_the_gpu_sms(self) -> Self:
        if self.mig is None or self.sm_count is None:
            return self
        for index, profile in enumerate(self.mig.profiles):
            if profile.sm_count is not None and profile.sm_count > self.sm_count:
                raise located_error(
                    type(self).__name__,
                    ("mig", "profiles", index, "sm_count"),
                    f"mig.profiles[{index}] ({profile.name}): sm_count {profile.sm_count} "
                    f"exceeds the GPU's sm_count {self.sm_count}",
                )
        return self


class HardwareCreate(HardwareBase):
    """A new hardware profile."""

    slug: Slug = Field(examples=["lab-gpu-1"])


class HardwareReplace(HardwareBase):
    """A full replacement of a hardware profile (PUT); the slug is taken from the path."""


class CatalogEntry(HardwareCreate):
    """An entry of a `hardware_catalog/` file: a hardware profile that must cite sources."""

    sources: list[Annotated[str, StringConstraints(min_length=1, max_length=500)]] = Field(
        min_length=1, max_length=50, description="Where the figures come from."
    )


class CatalogFile(Schema):
    """One `hardware_catalog/*.yaml` file: a device family."""

    family: str = Field(
        pattern=r"^[a-z0-9-]+$", description="Family slug; must equal the file name stem."
    )
    description: str | None = Field(default=None, description="What the family covers.")
    devices: list[CatalogEntry] = Field(min_length=1, description="Devices of the family.")


class MigProfileRead(MigProfile):
    """A MIG profile with derived figures."""

    memory_bytes: int = Field(description="Usable memory [B].", examples=[10_200_547_328])
    kubernetes_resource: str = Field(
        description="Extended resource name the NVIDIA device plugin advertises ('+' -> '.').",
        examples=["nvidia.com/mig-1g.10gb"],
    )


class MigSpecRead(MigSpec):
    """MIG geometry with derived per-profile figures."""

    profiles: list[MigProfileRead] = Field(  # type: ignore[assignment]
        description="Every supported GPU-instance profile."
    )


class HardwareRead(HardwareCreate):
    """A stored hardware profile."""

    # Read from rows that were checked when written (the Create/Replace bodies): not re-walked.
    check_storable_text: ClassVar[bool] = False
    require_price_kind: ClassVar[bool] = False

    mig: MigSpecRead | None = Field(
        default=None, description="MIG geometry and profiles; null when MIG is not supported."
    )
    source: HardwareSource = Field(
        description="`catalog` entries are read-only; `user` entries are editable.",
        examples=["catalog"],
    )
    version: int = Field(description="Optimistic-concurrency version (the ETag).", examples=[1])
    created_at: datetime = Field(
        description="Creation time (UTC).", examples=["2026-11-22T06:00:00Z"]
    )
    updated_at: datetime = Field(
        description="Last change (UTC).", examples=["2026-11-22T06:00:00Z"]
    )


HardwareList = Page[HardwareRead]

KindFilter = Literal["gpu", "cpu", "tpu", "edge"]
