"""Admission decisions: may a pod's workload run on the GPU resources it asks for?"""

from __future__ import annotations

import logging
from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError
from sqlalchemy.orm import Session

from app.db.models import Hardware
from app.db.repositories import FingerprintRepository, HardwareRepository
from app.domain.admission import (
    WHOLE_GPU,
    GpuRequest,
    PodSpecError,
    gpu_requests,
    planner_annotations,
)
from app.domain.mig import kubernetes_resource, smallest_fitting
from app.schemas.admission import AdmissionCheckRequest, AdmissionCheckResponse
from app.schemas.estimates import WorkloadSpec
from app.services.errors import InvalidInput, ServiceError
from app.services.estimates import LruCache
from app.services.mig import geometry, required_memory, workload_spec

logger = logging.getLogger("app.admission")
GIB = 2**30
LOW_HEADROOM = 0.10
MAX_WARNING = 120


class ReviewError(Exception):
    """A review that cannot be evaluated; the message says why."""


@dataclass(slots=True)
class Decision:
    """One resource's verdict."""

    allowed: bool
    message: str
    required_bytes: int
    usable_bytes: int
    smallest_fitting_resource: str | None
    warnings: list[str] = field(default_factory=list)


def _warning(text: str) -> str:
    return text if len(text) <= MAX_WARNING else text[: MAX_WARNING - 1] + "…"


def _describe(label: str, spec: WorkloadSpec) -> str:
    return f"{label} {spec.mode.value} bs {spec.batch_size} {spec.precision.value}"


def decide(
    session: Session,
    *,
    spec: WorkloadSpec,
    label: str,
    hardware: Hardware,
    resource: str,
    count: int,
) -> Decision:
    """Compare the workload's requirement with one resource (per device / per slice)."""
    lines, _, _ = required_memory(
        session, spec, hardware, cuda_context_bytes=None, safety_margin_fraction=0.05
    )
    required = sum(line.bytes for line in lines)
    smallest = None
    if hardware.mig_total_compute_slices is not None:
        geo = geometry(hardware)
        fitting = smallest_fitting(geo, required)
        smallest = kubernetes_resource(fitting.name) if fitting else None
    if resource == WHOLE_GPU:
        usable = hardware.memory_bytes
        what = f"{WHOLE_GPU} ({hardware.slug}) gives {usable / GIB:.1f} GiB per GPU"
    else:
        if hardware.mig_total_compute_slices is None:
            raise ReviewError(f"{resource} asked for, but '{hardware.slug}' does not support MIG")
        profiles = {kubernetes_resource(p.name): p for p in geometry(hardware).profiles}
        profile = profiles.get(resource)
        if profile is None:
            raise ReviewError(
                f"'{hardware.slug}' has no {resource}; valid: " + ", ".join(sorted(profiles))
            )
        usable = profile.memory_bytes
        what = f"{resource} gives {usable / GIB:.1f} GiB usable"
    allowed = required <= usable
    message = f"{_describe(label, spec)} needs {required / GIB:.1f} GiB; {what}"
    if not allowed:
        hint = (
            f"smallest fitting: {smallest.removeprefix('nvidia.com/')}"
            if smallest
            else ("no MIG profile fits; use whole GPUs or a larger GPU")
        )
        message += f"; {hint}"
    warnings = []
    if allowed and usable - required < LOW_HEADROOM * usable:
        warnings.append(
            _warning(
                f"{label}: headroom {(usable - required) / GIB:.1f} GiB on {resource} is under "
                f"{LOW_HEADROOM:.0%}"
            )
        )
    if count > 1 and resource != WHOLE_GPU:
        warnings.append(_warning(f"{label}: {count} x {resource}; each must hold the workload"))
    return Decision(
        allowed=allowed,
        message=message,
        required_bytes=required,
        usable_bytes=usable,
        smallest_fitting_resource=smallest,
        warnings=warnings,
    )


def check(session: Session, *, payload: AdmissionCheckRequest) -> AdmissionCheckResponse:
    """The simple form for scripts."""
    hardware = HardwareRepository(session).get(payload.gpu_model)
    if hardware is None:
        raise InvalidInput(f"hardware '{payload.gpu_model}' does not exist", pointer="/gpu_model")
    spec = workload_spec(session, payload.workload)
    label = payload.workload if isinstance(payload.workload, str) else (spec.model or "inline")
    try:
        decision = decide(
            session,
            spec=spec,
            label=label,
            hardware=hardware,
            resource=payload.resource,
            count=payload.count,
        )
    except ReviewError as exc:
        raise InvalidInput(str(exc), pointer="/resource") from exc
    return AdmissionCheckResponse(
        allowed=decision.allowed,
        message=decision.message,
        required_bytes=decision.required_bytes,
        usable_bytes=decision.usable_bytes,
        smallest_fitting_resource=decision.smallest_fitting_resource,
        warnings=decision.warnings,
    )


def _inline_spec(notes: dict[str, str]) -> WorkloadSpec:
    fields: dict[str, Any] = {
        "model": notes.get("model"),
        "mode": notes.get("mode", "inference"),
        "batch_size": notes.get("batch-size", "1"),
        "precision": notes.get("precision", "bf16"),
    }
    if "sequence-length" in notes:
        fields["sequence_length"] = notes["sequence-length"]
    if "image-size" in notes:
        fields["image_size"] = notes["image-size"]
    try:
        return WorkloadSpec.model_validate(fields)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise ReviewError(f"inline workload annotations invalid: {where}: {first['msg']}") from exc


_INLINE_KEYS = ("model", "mode", "batch-size", "precision", "sequence-length", "image-size")
_Decisions = tuple[Decision, ...]


# Decisions keyed by the state they were computed from: the (id, version, updated_at) of the
# workload, its model and the GPU's hardware profile, read by one cheap query each. Any write to
# those rows changes the key, so a hit is exactly what the full evaluation would answer now.
# Misses and errors are not cached.
DECISIONS: LruCache[Hashable, _Decisions] = LruCache(size=1024)


def _state_key(
    session: Session, notes: dict[str, str], gpu: str, requests: list[GpuRequest]
) -> Hashable | None:
    """What the decisions depend on, or None when a row is missing (the full path says why)."""
    rows = FingerprintRepository(session)
    subject: Hashable
    if "workload" in notes:
        subject, state = notes["workload"], rows.workload(notes["workload"])
    else:
        subject, state = (
            tuple((key, notes.get(key)) for key in _INLINE_KEYS),
            rows.model(notes["model"]),
        )
    hardware = rows.hardware(gpu)
    if state is None or hardware is None:
        return None
    wanted = tuple((r.resource, r.count) for r in requests)
    return subject, state, gpu, hardware, wanted


def _decisions(
    session: Session, notes: dict[str, str], gpu: str, requests: list[GpuRequest]
) -> _Decisions:
    """Each request's decision: from the cache when the rows are unchanged, else computed."""
    key = _state_key(session, notes, gpu, requests)
    if key is not None and (cached := DECISIONS.get(key)) is not None:
        return cached
    if "workload" in notes:
        label = notes["workload"]
        spec = workload_spec(session, label)
    else:
        spec = _inline_spec(notes)
        label = spec.model or "inline"
    hardware = HardwareRepository(session).get(gpu)
    if hardware is None:
        raise ReviewError(f"capacity-planner.io/gpu '{gpu}' is not a known hardware profile")
    decisions = tuple(
        decide(
            session,
            spec=spec,
            label=label,
            hardware=hardware,
            resource=request.resource,
            count=request.count,
        )
        for request in requests
    )
    # Cache only if nothing changed while computing (a concurrent write moves the key on).
    if key is not None and _state_key(session, notes, gpu, requests) == key:
        DECISIONS.put(key, decisions)
    return decisions


def _evaluate(session: Session, pod: dict[str, Any]) -> tuple[bool, str, list[str]]:
    requests = gpu_requests(pod)
    if not requests:
        return True, "no GPU requested", []
    notes = planner_annotations(pod)
    if "workload" not in notes and "model" not in notes:
        raise ReviewError(
            "pod asks for GPUs but names no workload: annotate capacity-planner.io/workload "
            "(or capacity-planner.io/model, mode, batch-size, precision)"
        )
    gpu = notes.get("gpu")
    if gpu is None:
        raise ReviewError(
            "which GPU model? set annotation or nodeSelector capacity-planner.io/gpu to a "
            "hardware slug (GET /v1/hardware)"
        )
    decisions = list(zip(requests, _decisions(session, notes, gpu, requests), strict=True))
    denied = [(r, d) for r, d in decisions if not d.allowed]
    warnings = [w for _, d in decisions for w in d.warnings]
    if denied:
        request, decision = denied[0]
        kind = "init container" if request.init_container else "container"
        return False, f"{kind} '{request.container}': {decision.message}", warnings
    request, decision = decisions[0]
    suffix = f" ({len(decisions)} GPU requests checked)" if len(decisions) > 1 else ""
    return True, decision.message + suffix, warnings


def review(session: Session, body: Any, *, failure_policy: str) -> dict[str, Any]:
    """Answer an AdmissionReview; never raises, always echoes the uid."""
    uid = ""
    request = body.get("request") if isinstance(body, dict) else None
    if isinstance(request, dict) and isinstance(request.get("uid"), str):
        uid = request["uid"]
    try:
        if not isinstance(request, dict) or not uid:
            raise ReviewError("malformed AdmissionReview: request.uid is missing")
        pod = request.get("object")
        if not isinstance(pod, dict) or pod.get("kind", "Pod") != "Pod":
            raise ReviewError("malformed AdmissionReview: request.object is not a Pod")
        allowed, message, warnings = _evaluate(session, pod)
    except (ReviewError, PodSpecError, ServiceError) as exc:
        detail = exc.detail if isinstance(exc, ServiceError) else str(exc)
        allowed, message, warnings = _on_failure(failure_policy, detail)
    except Exception:  # an internal error must still produce a well-formed answer
        logger.exception("admission review failed")
        allowed, message, warnings = _on_failure(
            failure_policy, "internal error in capacity-planner; see its logs"
        )
    response: dict[str, Any] = {
        "uid": uid,
        "allowed": allowed,
        "status": {"code": 200 if allowed else 403, "message": message},
    }
    if warnings:
        response["warnings"] = [_warning(w) for w in warnings]
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": response}


def _on_failure(policy: str, reason: str) -> tuple[bool, str, list[str]]:
    if policy == "allow":
        return True, f"not checked: {reason}", [_warning(f"capacity-planner: {reason}")]
    return False, f"denied: {reason}", []
