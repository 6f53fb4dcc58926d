"""What a Kubernetes Pod asks for: GPU resources per container (pure parsing)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from app.domain.errors import DomainError

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
    for key, init in (("initContainers", True), ("containers", False)):
        containers = spec.get(key) or []
        if not isinstance(containers, list):
            raise PodSpecError(f"spec.{key} must be a list")
        for index, container in enumerate(containers):
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
