"""MIG contract: profiles, fit checks, layout validation and partition plans."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from app.domain.workload import DEFAULT_SAFETY_MARGIN_FRACTION
from app.schemas.base import MAX_BYTES, Schema, Slug
from app.schemas.engine_options import EngineFitRead
from app.schemas.estimates import DefaultUsedRow, RequiredLine, WorkloadInput
from app.schemas.hardware import DeviceName, MigProfileRead


class MigProfileList(Schema):
    """Every MIG profile of a GPU model."""

    gpu: str = Field(description="Hardware slug.", examples=["nvidia-a100-80gb-sxm"])
    total_compute_slices: int = Field(description="Compute slices of the GPU.", examples=[7])
    total_memory_slices: int = Field(description="Memory slices of the GPU.", examples=[8])
    max_gpu_instances: int = Field(description="Maximum GPU instances.", examples=[7])
    profiles: list[MigProfileRead] = Field(description="Profiles, smallest first.")


class MigFitRequest(Schema):
    """Which MIG profiles of a GPU can host a workload."""

    workload: WorkloadInput | Slug = Field(
        description="The workload to place: a stored workload's slug, or inline.",
        examples=["chat-serving"],
    )
    gpu: DeviceName = Field(
        description="MIG-capable hardware slug, or `slug/profile` to ask about that profile "
        "(the same as `profile`).",
        examples=["nvidia-a100-80gb-sxm"],
    )
    profile: str | None = Field(
        default=None,
        max_length=32,
        description="Ask about this profile in particular.",
        examples=["2g.20gb"],
    )
    cuda_context_bytes: int | None = Field(
        default=None,
        ge=0,
        le=MAX_BYTES,
        description="Per-process CUDA context [B]; default: the GPU profile's, else 512 MiB.",
        examples=[536_870_912],
    )
    safety_margin_fraction: float = Field(
        default=DEFAULT_SAFETY_MARGIN_FRACTION,
        ge=0,
        lt=1,
        description="Safety margin as a fraction of estimate + context + workspace.",
        examples=[0.05],
    )
    min_concurrency: int | None = Field(
        default=None,
        ge=1,
        le=1_048_576,
        description="A workload with an `engine` only: a profile qualifies where the engine "
        "starts with at least this many sequences of `max_model_len` tokens at once (N). "
        "Default: the engine's `min_concurrency`, else 1 (it starts).",
        examples=[None],
    )
    max_model_len: int | None = Field(
        default=None,
        ge=1,
        le=16_777_216,
        description="A workload with an `engine` only: the sequence length L [tokens] (vLLM "
        '`--max-model-len`) of the question "smallest profile on which the engine starts '
        "with N sequences of L tokens\". Default: the engine's `max_model_len`, else the "
        "model's context (422 naming this field above it).",
        examples=[None],
    )


class ProfileFit(Schema):
    """The fit of the workload on one profile."""

    profile: str = Field(description="Profile name.", examples=["2g.20gb"])
    kubernetes_resource: str = Field(
        description="Extended resource name.", examples=["nvidia.com/mig-2g.20gb"]
    )
    compute_slices: int = Field(description="Compute slices.", examples=[2])
    usable_bytes: int = Field(description="Usable memory [B].", examples=[21_072_183_296])
    required_bytes: int = Field(description="Required memory [B].", examples=[15_000_000_000])
    headroom_bytes: int = Field(
        description="usable - required; negative: short by.", examples=[6_072_183_296]
    )
    fits: bool = Field(description="required <= usable.", examples=[True])
    limiting_factor: Literal["none", "memory"] = Field(
        description="What stops the fit (`memory`), or `none`.", examples=["none"]
    )
    reason: str | None = Field(
        default=None,
        description="With an engine, why the profile does not qualify: the engine's own message "
        "when it does not start, the concurrency it falls short by, or that a tensor/pipeline "
        "group cannot span MIG slices.",
        examples=[None],
    )
    engine: EngineFitRead | None = Field(
        default=None,
        description="With an engine: its figures on this profile (usable_bytes is the memory "
        "the slice shows; required_bytes the least on which it qualifies).",
    )


class LargerGpu(Schema):
    """A catalog GPU whose whole memory holds the workload."""

    hardware: str = Field(description="Hardware slug.", examples=["nvidia-h200-sxm"])
    memory_bytes: int = Field(description="Device memory [B].", examples=[151_397_597_184])
    mig_capable: bool = Field(description="Whether it supports MIG.", examples=[True])


class FitAlternatives(Schema):
    """What would work when no profile fits."""

    full_gpu_fits: bool = Field(
        description="Whether the whole GPU (MIG disabled) holds it.", examples=[False]
    )
    full_gpu_memory_bytes: int = Field(
        description="Whole-GPU memory [B].", examples=[85_899_345_920]
    )
    larger_gpus: list[LargerGpu] = Field(
        description="Catalog GPUs that hold it whole and run its precision (by compute "
        "capability and peak table: no V100 or T4 for bf16), smallest first (up to 5)."
    )
    largest_batch_on_biggest_profile: int | None = Field(
        default=None,
        description="Largest batch size that fits the biggest profile; null if even 1 does not.",
        examples=[4],
    )
    biggest_profile: str = Field(description="The biggest profile.", examples=["7g.80gb"])


class MigFitResponse(Schema):
    """Per-profile fit, the smallest fitting profile, and alternatives."""

    gpu: str = Field(description="Hardware slug.", examples=["nvidia-a100-80gb-sxm"])
    required_bytes: int = Field(description="Required memory [B].", examples=[15_000_000_000])
    required: list[RequiredLine] = Field(description="Lines that add up to required_bytes.")
    estimate_peak_phase: str = Field(
        description="Phase of the estimate's peak.", examples=["forward"]
    )
    profiles: list[ProfileFit] = Field(description="Every profile, smallest first.")
    smallest_fitting_profile: str | None = Field(
        default=None,
        description="Fewest compute slices, then least memory, that fits; null if none.",
        examples=["2g.20gb"],
    )
    smallest_fitting_resource: str | None = Field(
        default=None,
        description="Its Kubernetes resource name.",
        examples=["nvidia.com/mig-2g.20gb"],
    )
    requested: ProfileFit | None = Field(
        default=None, description="The fit on the requested `profile`."
    )
    alternatives: FitAlternatives | None = Field(
        default=None, description="When no profile fits: what would."
    )
    engine: EngineFitRead | None = Field(
        default=None,
        description="With an engine: its figures on the whole GPU (required_bytes and "
        "required are its requirement there).",
    )
    assumptions: list[str] = Field(description="Assumptions of the estimate.", examples=[[]])
    attention: list[str] = Field(
        default_factory=list,
        description="Attention implementations used, with why.",
        examples=[["flash: CUDA with 16-bit (or 8-bit) attention inputs: SDPA picks flash"]],
    )
    defaults_used: list[DefaultUsedRow] = Field(
        default_factory=list,
        description="Every workload option left out and the value the default table gave.",
        examples=[[{"option": "precision", "value": "bf16", "reason": "inference on CUDA"}]],
    )


class InstanceSpec(Schema):
    """One GPU instance: a profile at a start position."""

    profile: str = Field(max_length=32, description="Profile name.", examples=["3g.20gb"])
    start: int = Field(ge=0, le=7, description="Start memory slice.", examples=[4])


class LayoutValidateRequest(Schema):
    """A layout to check on a GPU model."""

    gpu: Slug = Field(description="MIG-capable hardware slug.", examples=["nvidia-a100-40gb-sxm"])
    instances: list[InstanceSpec] = Field(
        min_length=1, max_length=16, description="GPU instances of one GPU."
    )


class Violation(Schema):
    """A broken layout rule."""

    rule: str = Field(
        description="unknown_profile, bad_start, out_of_range, overlap, count_over_max, "
        "instances_over_max or compute_over_total.",
        examples=["overlap"],
    )
    message: str = Field(
        description="What is wrong, naming the instances.",
        examples=["instance 1 (1g.5gb at 0) overlaps instance 0 (1g.5gb at 0)"],
    )
    instances: list[int] = Field(
        description="Indices (in the request) of the instances involved.", examples=[[0, 1]]
    )


class LayoutValidateResponse(Schema):
    """Whether a layout is valid, and every rule it breaks."""

    gpu: str = Field(description="Hardware slug.", examples=["nvidia-a100-40gb-sxm"])
    valid: bool = Field(description="No rule is broken.", examples=[True])
    violations: list[Violation] = Field(description="Broken rules, in a stable order.")


class PlanItem(Schema):
    """A workload to host: a profile given directly, or a workload to size with a fit check."""

    name: str = Field(
        min_length=1,
        max_length=64,
        pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$",
        description="Name of the workload in the plan.",
        examples=["chatbot"],
    )
    replicas: int = Field(ge=1, le=10_000, description="Instances needed.", examples=[3])
    profile: str | None = Field(
        default=None, max_length=32, description="Profile to use.", examples=["2g.20gb"]
    )
    workload: WorkloadInput | Slug | None = Field(
        default=None,
        description="Size it (stored workload slug or inline): the smallest fitting profile "
        "is used.",
        examples=["chat-serving"],
    )


class MigPlanRequest(Schema):
    """Workloads with replica counts to pack onto GPUs of one model."""

    gpu: Slug = Field(description="MIG-capable hardware slug.", examples=["nvidia-a100-80gb-sxm"])
    workloads: list[PlanItem] = Field(min_length=1, max_length=500, description="What to host.")
    config_name: str = Field(
        default="capacity-planner",
        pattern=r"^[a-z0-9][a-z0-9-]{0,62}$",
        description="Name of the mig-parted config.",
        examples=["capacity-planner"],
    )
    cuda_context_bytes: int | None = Field(
        default=None,
        ge=0,
        le=MAX_BYTES,
        description="Per-process CUDA context for sized workloads [B].",
        examples=[None],
    )
    safety_margin_fraction: float = Field(
        default=0.05, ge=0, le=1, description="Safety margin for sized workloads.", examples=[0.05]
    )


class PlannedInstance(Schema):
    """One GPU instance in the plan."""

    workload: str = Field(description="Workload name.", examples=["chatbot"])
    profile: str = Field(description="Profile.", examples=["2g.20gb"])
    start: int = Field(description="Start memory slice.", examples=[0])
    kubernetes_resource: str = Field(
        description="Extended resource name.", examples=["nvidia.com/mig-2g.20gb"]
    )


class PlannedGpu(Schema):
    """One GPU of the plan with its explicit, valid layout."""

    index: int = Field(description="GPU number in the plan.", examples=[0])
    instances: list[PlannedInstance] = Field(description="Instances, by start slice.")
    free_compute_slices: int = Field(description="Unused compute slices.", examples=[1])
    free_memory_slices: int = Field(description="Unused memory slices.", examples=[1])
    unused_memory_slices: list[int] = Field(
        description="Indices of the unused memory slices.", examples=[[7]]
    )


class PlannedWorkload(Schema):
    """How a workload was sized."""

    name: str = Field(description="Workload name.", examples=["chatbot"])
    profile: str = Field(description="Profile used.", examples=["2g.20gb"])
    replicas: int = Field(description="Instances.", examples=[3])
    required_bytes: int | None = Field(
        default=None, description="Required memory when sized by a fit check [B].", examples=[None]
    )


class MigPlanResponse(Schema):
    """The fewest GPUs that host every replica, their layouts and a mig-parted config."""

    gpu: str = Field(description="Hardware slug.", examples=["nvidia-a100-80gb-sxm"])
    gpu_count: int = Field(description="GPUs needed.", examples=[2])
    optimal: bool = Field(description="Whether the count is proven minimal.", examples=[True])
    workloads: list[PlannedWorkload] = Field(description="Profile per workload.")
    gpus: list[PlannedGpu] = Field(description="Layout per GPU.")
    mig_parted: dict[str, Any] = Field(
        description="NVIDIA mig-parted config (`version: v1`, `mig-configs`).",
        examples=[{"version": "v1", "mig-configs": {}}],
    )
    mig_parted_yaml: str = Field(
        description="The same config as YAML, ready to apply.", examples=["version: v1\n"]
    )
