"""What a Kubernetes Pod asks for (pure parsing, bounded) and the decision policy: a stored
evaluation of the workload on the GPU, compared with each requested resource."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from app.domain.errors import DomainError
from app.domain.fit import fits
from app.domain.units import GIB

WHOLE_GPU = "nvidia.com/gpu"
MIG_PREFIX = "nvidia.com/mig-"
ANNOTATION_PREFIX = "capacity-planner.io/"


class PodSpecError(DomainError):
    """The pod in a review is not shaped like a Pod."""


@dataclass(frozen=True, slots=True, kw_only=True)
class GpuRequest:
    """One container's GPU resource: a MIG slice type or whole GPUs, and how many."""

    container: str
    init_container: bool
    resource: str
    count: int

    @property
    def is_mig(self) -> bool:
        """Whether it asks for MIG slices."""
        return self.resource.startswith(MIG_PREFIX)


# Parse-side bounds: a review's cost must not grow with what a pod lists. Kubernetes sets no
# limit on containers; real pods have a handful. Past these the review is not evaluated (the
# failure policy answers) and nothing else is read.
MAX_CONTAINERS = 512  # containers + init containers examined
MAX_GPU_REQUESTS = 16  # containers asking for GPU resources

MAX_QUANTITY_DIGITS = 6  # a million GPUs in one container is nonsense, not a number to parse


def _quantity(value: Any, where: str) -> int:
    text = str(value).strip()
    # ASCII digits only: str.isdigit() accepts "²", which int() refuses.
    if not (text.isascii() and text.isdigit()) or len(text) > MAX_QUANTITY_DIGITS or int(text) < 1:
        shown = text if len(text) <= 20 else text[:20] + "…"
        raise PodSpecError(f"{where}: GPU quantity must be a positive integer, got {shown!r}")
    return int(text)


def gpu_requests(pod: Mapping[str, Any]) -> list[GpuRequest]:
    """Every container's and init container's GPU resource (limits, else requests)."""
    spec = pod.get("spec")
    if not isinstance(spec, Mapping):
        raise PodSpecError("object.spec is missing: not a Pod")
    found: list[GpuRequest] = []
    listed = {key: spec.get(key) or [] for key in ("initContainers", "containers")}
    for key, containers in listed.items():
        if not isinstance(containers, list):
            raise PodSpecError(f"spec.{key} must be a list")
    total = sum(len(containers) for containers in listed.values())
    if total > MAX_CONTAINERS:
        raise PodSpecError(
            f"pod has {total} containers and init containers; this webhook evaluates pods with "
            f"at most {MAX_CONTAINERS}"
        )
    for key, init in (("initContainers", True), ("containers", False)):
        for index, container in enumerate(listed[key]):
            if not isinstance(container, Mapping):
                raise PodSpecError(f"spec.{key}[{index}] must be an object")
            name = str(container.get("name") or f"{key}[{index}]")
            resources = container.get("resources") or {}
            if not isinstance(resources, Mapping):
                raise PodSpecError(f"container '{name}': resources must be an object")
            wanted = resources.get("limits") or resources.get("requests") or {}
            if not isinstance(wanted, Mapping):
                raise PodSpecError(f"container '{name}': resource limits must be an object")
            for resource, value in sorted(wanted.items()):
                if resource == WHOLE_GPU or str(resource).startswith(MIG_PREFIX):
                    if len(found) == MAX_GPU_REQUESTS:
                        raise PodSpecError(
                            f"pod asks for GPU resources in more than {MAX_GPU_REQUESTS} "
                            "containers; this webhook evaluates at most that many"
                        )
                    found.append(
                        GpuRequest(
                            container=name,
                            init_container=init,
                            resource=str(resource),
                            count=_quantity(value, f"container '{name}' {resource}"),
                        )
                    )
    return found


def planner_annotations(pod: Mapping[str, Any]) -> dict[str, str]:
    """This service's annotations (prefix stripped), then nodeSelector entries as fallback."""
    found: dict[str, str] = {}
    spec = pod.get("spec") if isinstance(pod.get("spec"), Mapping) else {}
    selector = spec.get("nodeSelector") if isinstance(spec, Mapping) else None
    metadata = pod.get("metadata") if isinstance(pod.get("metadata"), Mapping) else {}
    notes = metadata.get("annotations") if isinstance(metadata, Mapping) else None
    for source in (selector, notes):  # annotations win over the node selector
        if isinstance(source, Mapping):
            for key, value in source.items():
                if str(key).startswith(ANNOTATION_PREFIX):
                    found[str(key).removeprefix(ANNOTATION_PREFIX)] = str(value)
    return found


LOW_HEADROOM = 0.10
MAX_WARNING = 120


class ResourceError(DomainError):
    """The pod asks for a resource the GPU does not offer."""


@dataclass(frozen=True, slots=True, kw_only=True)
class EngineOnResource:
    """A serving engine on one resource (a whole GPU or a MIG slice): the requirement the engine
    gives there (app.domain.fit.engine_requirement), the memory the device shows to CUDA, and
    the engine's figures. ``reason``: why it does not fit, in the engine's terms."""

    required_bytes: int
    usable_bytes: int
    kv_tokens: int
    max_concurrency: float
    max_model_len: int
    reason: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Evaluation:
    """A workload's requirement on one GPU profile and what that GPU offers: every input of
    the verdicts (computed when the workload, its model or the hardware is written)."""

    summary: str  # "chat inference bs 8 bf16": label, mode, batch size, precision
    gpu: str  # the hardware profile's slug
    required_bytes: int
    smallest_fitting_resource: str | None  # the smallest MIG resource that holds it
    resources: Mapping[str, int]  # nvidia.com/gpu and each MIG resource -> usable bytes
    # a workload served by an engine: its requirement and figures per resource (the verdict
    # reads these instead of required_bytes), the engine's name and its tensor x pipeline GPUs
    engine: Mapping[str, EngineOnResource] | None = None
    engine_name: str = ""
    engine_gpus: int = 1

    @property
    def supports_mig(self) -> bool:
        """Whether the GPU offers MIG resources."""
        return any(name.startswith(MIG_PREFIX) for name in self.resources)


@dataclass(frozen=True, slots=True, kw_only=True)
class Verdict:
    """One resource's decision."""

    allowed: bool
    message: str
    usable_bytes: int
    warnings: tuple[str, ...] = ()
    annotations: Mapping[str, str] | None = None  # auditAnnotations (an engine's figures)


def warning_text(text: str) -> str:
    """A warning cut to Kubernetes' 120 characters."""
    return text if len(text) <= MAX_WARNING else text[: MAX_WARNING - 1] + "…"


def verdict(evaluation: Evaluation, *, resource: str, count: int, label: str) -> Verdict:
    """Whether ``count`` x ``resource`` holds the evaluated workload (per device / per slice:
    fits when the requirement is at most the usable bytes), with a message a person can act
    on. Raises ``ResourceError`` for a resource the GPU does not offer."""
    usable = evaluation.resources.get(resource)
    if usable is not None and evaluation.engine is not None:
        return engine_verdict(evaluation, resource=resource, count=count, label=label)
    if usable is None:
        if resource == WHOLE_GPU or not evaluation.supports_mig:
            raise ResourceError(
                f"{resource} asked for, but '{evaluation.gpu}' does not support MIG"
            )
        offered = sorted(name for name in evaluation.resources if name.startswith(MIG_PREFIX))
        raise ResourceError(f"'{evaluation.gpu}' has no {resource}; valid: " + ", ".join(offered))
    required = evaluation.required_bytes
    if resource == WHOLE_GPU:
        what = f"{WHOLE_GPU} ({evaluation.gpu}) gives {usable / GIB:.1f} GiB per GPU"
    else:
        what = f"{resource} gives {usable / GIB:.1f} GiB usable"
    allowed = fits(required, usable)
    message = f"{evaluation.summary} needs {required / GIB:.1f} GiB; {what}"
    if not allowed:
        smallest = evaluation.smallest_fitting_resource
        hint = (
            f"smallest fitting: {smallest.removeprefix('nvidia.com/')}"
            if smallest
            else "no MIG profile fits; use whole GPUs or a larger GPU"
        )
        message += f"; {hint}"
    warnings = []
    if allowed and usable - required < LOW_HEADROOM * usable:
        warnings.append(
            warning_text(
                f"{label}: headroom {(usable - required) / GIB:.1f} GiB on {resource} is under "
                f"{LOW_HEADROOM:.0%}"
            )
        )
    if count > 1 and resource != WHOLE_GPU:
        warnings.append(warning_text(f"{label}: {count} x {resource}; each must hold the workload"))
    return Verdict(allowed=allowed, message=message, usable_bytes=usable, warnings=tuple(warnings))


# A process sees one MIG instance: CUDA enumerates a single MIG device per process (NVIDIA MIG
# User Guide, "CUDA Device Enumeration"), so an engine's group of several GPUs cannot be slices.
MIG_ONE_DEVICE = (
    "tensor x pipeline = {gpus} GPUs cannot be MIG slices: CUDA shows a process one MIG instance"
)


def engine_verdict(evaluation: Evaluation, *, resource: str, count: int, label: str) -> Verdict:
    """An engine's verdict on ``count`` x ``resource``: it fits when the engine's requirement
    there is at most the memory the device shows (:func:`app.domain.fit.fits`: the engine
    starts, with the asked concurrency) and the container gets the engine's tensor x pipeline
    GPUs (whole GPUs; a group cannot be MIG slices). Allowed: the expected KV tokens and
    concurrency as a warning and audit annotations; denied: the engine's own reason."""
    assert evaluation.engine is not None
    entry = evaluation.engine[resource]
    gpus = evaluation.engine_gpus
    name = evaluation.engine_name
    problem = None
    if not fits(entry.required_bytes, entry.usable_bytes):
        problem = f"{entry.reason} (needs {entry.required_bytes / GIB:.2f} GiB shown to CUDA)"
    if resource == WHOLE_GPU and count < gpus:
        problem = (
            f"{name} needs tensor x pipeline = {gpus} GPUs, the container gets {count} {WHOLE_GPU}"
        )
    elif resource != WHOLE_GPU and gpus > 1:
        problem = MIG_ONE_DEVICE.format(gpus=gpus)
    where = f"on {resource} ({evaluation.gpu}, {entry.usable_bytes / GIB:.2f} GiB shown to CUDA)"
    if problem is not None:
        smallest = evaluation.smallest_fitting_resource
        hint = f"; smallest fitting: {smallest.removeprefix('nvidia.com/')}" if smallest else ""
        return Verdict(
            allowed=False,
            message=f"{evaluation.summary} {where}: {problem}{hint}",
            usable_bytes=entry.usable_bytes,
        )
    figures = (
        f"{entry.kv_tokens:,} KV tokens, concurrency {entry.max_concurrency:.2f} at "
        f"{entry.max_model_len:,} tokens"
    )
    warnings = [warning_text(f"{label}: {name} expects {figures} on {resource}")]
    if resource == WHOLE_GPU and count > gpus:
        warnings.append(
            warning_text(f"{label}: {count} x {WHOLE_GPU}; the engine uses {gpus} (tp x pp)")
        )
    return Verdict(
        allowed=True,
        message=f"{evaluation.summary} {where}: {name} starts with {figures}",
        usable_bytes=entry.usable_bytes,
        warnings=tuple(warnings),
        annotations={
            "engine": name,
            "engine-kv-tokens": str(entry.kv_tokens),
            "engine-max-concurrency": f"{entry.max_concurrency:.2f}",
            "engine-max-model-len": str(entry.max_model_len),
        },
    )
