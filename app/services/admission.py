"""Admission decisions: may a pod's workload run on the GPU resources it asks for?"""

from __future__ import annotations

import json
import re
from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError
from sqlalchemy.orm import Session

from app.db.models import Hardware
from app.db.repositories import HardwareRepository
from app.domain.admission import (
    WHOLE_GPU,
    GpuRequest,
    gpu_requests,
    planner_annotations,
)
from app.domain.fit import fit
from app.domain.mig.layout import (
    kubernetes_resource,
    smallest_fitting,
)
from app.domain.units import GIB
from app.domain.workload import (
    DEFAULT_SAFETY_MARGIN_FRACTION,
)
from app.schemas.admission import AdmissionCheckRequest, AdmissionCheckResponse
from app.schemas.base import SLUG_PATTERN
from app.schemas.estimates import (
    DefaultUsedRow,
    WorkloadSpec,
)
from app.services.convert import (
    geometry,
)
from app.services.errors import (
    InvalidInput,
    ServiceError,
)
from app.services.pipeline import (
    required_memory,
    spec_pointers,
    workload_spec,
)
from app.services.state_cache import Digest, PerWatch, timed_digest

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
    attention: list[str] = field(default_factory=list)
    defaults_used: list[DefaultUsedRow] = field(default_factory=list)


def _warning(text: str) -> str:
    return text if len(text) <= MAX_WARNING else text[: MAX_WARNING - 1] + "…"


def _describe(label: str, spec: WorkloadSpec, precision: str) -> str:
    return f"{label} {spec.mode.value} bs {spec.batch_size} {precision}"


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
    need = required_memory(
        session,
        spec,
        hardware,
        cuda_context_bytes=None,
        safety_margin_fraction=DEFAULT_SAFETY_MARGIN_FRACTION,
    )
    required = need.required_bytes
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
    allowed = fit(need.requirement, usable).fits
    described = _describe(label, spec, need.run.resolved.precision.value)
    message = f"{described} needs {required / GIB:.1f} GiB; {what}"
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
        attention=need.run.attention,
        defaults_used=need.run.defaults_used(),
    )


def check(session: Session, *, payload: AdmissionCheckRequest) -> AdmissionCheckResponse:
    """The simple form for scripts."""
    hardware = HardwareRepository(session).get(payload.gpu_model)
    if hardware is None:
        raise InvalidInput(f"hardware '{payload.gpu_model}' does not exist", pointer="/gpu_model")
    with spec_pointers("/workload", payload.workload):
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
        attention=decision.attention,
        defaults_used=decision.defaults_used,
    )


def _inline_spec(notes: dict[str, str]) -> WorkloadSpec:
    fields: dict[str, Any] = {
        "model": notes.get("model"),
        "mode": notes.get("mode", "inference"),
        "batch_size": notes.get("batch-size", "1"),
    }
    # Every other option comes from the one default table, as for the API and the CLI.
    for key in ("precision", "attention", "logits"):
        if key in notes:
            fields[key] = notes[key]
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


_INLINE_KEYS = (
    "model",
    "mode",
    "batch-size",
    "precision",
    "sequence-length",
    "image-size",
    "attention",
    "logits",
)
API_VERSION = "admission.k8s.io/v1"
REVIEW_KIND = "AdmissionReview"
_SLUG = re.compile(SLUG_PATTERN)

# The webhook's answers (everything after the uid, pre-rendered) per database, keyed by what the
# pod asks: its workload (or inline annotations), GPU and GPU requests. Valid in the generation of
# the planning data they were computed in (see app.services.state_cache). Errors are not cached.
DECISIONS: PerWatch[Hashable, bytes] = PerWatch(size=1024, name="admission_decisions")


@dataclass(frozen=True, slots=True)
class Review:
    """What the webhook reads from a body: the uid to echo, and the pod or why there is none."""

    uid: str
    pod: dict[str, Any] | None
    problem: str | None = None


def read_review(raw: bytes) -> Review:
    """Parse an AdmissionReview (``json.loads`` only: no model validation).

    A JSON object whose ``apiVersion`` or ``kind`` is present and is not ``admission.k8s.io/v1``
    ``AdmissionReview`` raises ``InvalidInput`` (answered 422, never evaluated as v1). Anything
    else the webhook can answer is a ``Review``: a body that is not JSON, is nested deeper than
    the parser goes, or lacks ``request.uid`` echoes an empty uid; a missing ``apiVersion`` or
    ``kind``, or an ``object`` that is not a Pod, is a ``problem``.
    """
    try:
        body = json.loads(raw)
    except (ValueError, RecursionError):  # RecursionError: nested deeper than json can parse
        body = None
    if not isinstance(body, dict):
        return Review("", None, "malformed AdmissionReview: request.uid is missing")
    for name, expected in (("apiVersion", API_VERSION), ("kind", REVIEW_KIND)):
        value = body.get(name)
        if value is not None and value != expected:
            shown = value if isinstance(value, str) else json.dumps(value)[:40]
            raise InvalidInput(
                f"{name} {shown[:80]!r} is not supported: this webhook answers "
                f'{API_VERSION} {REVIEW_KIND} only (admissionReviewVersions: ["v1"])',
                pointer=f"/{name}",
            )
    request = body.get("request")
    uid = request.get("uid") if isinstance(request, dict) else None
    if not isinstance(request, dict) or not isinstance(uid, str) or not uid:
        return Review("", None, "malformed AdmissionReview: request.uid is missing")
    missing = [name for name in ("apiVersion", "kind") if name not in body]
    if missing:
        return Review(uid, None, f"malformed AdmissionReview: {' and '.join(missing)} missing")
    pod = request.get("object")
    if not isinstance(pod, dict) or pod.get("kind", "Pod") != "Pod":
        return Review(uid, None, "malformed AdmissionReview: request.object is not a Pod")
    return Review(uid, pod)


@dataclass(frozen=True, slots=True)
class Question:
    """What a pod asks, as far as the decision goes (``key`` identifies it in the cache)."""

    notes: dict[str, str]
    gpu: str
    requests: tuple[GpuRequest, ...]
    key: Hashable


def _slug(notes: dict[str, str], name: str) -> str:
    value = notes[name]
    if not _SLUG.match(value):
        raise ReviewError(
            f"capacity-planner.io/{name} {value[:64]!r} is not a slug (lowercase letters, digits "
            "and inner hyphens, 1-64 characters)"
        )
    return value


def question(pod: dict[str, Any]) -> Question | None:
    """What ``pod`` asks (pure), or None when it asks for no GPU. Raises ``ReviewError`` or
    ``PodSpecError`` when it cannot be evaluated."""
    requests = tuple(gpu_requests(pod))
    if not requests:
        return None
    notes = planner_annotations(pod)
    if "workload" not in notes and "model" not in notes:
        raise ReviewError(
            "pod asks for GPUs but names no workload: annotate capacity-planner.io/workload "
            "(or capacity-planner.io/model, mode, batch-size, precision)"
        )
    if notes.get("gpu") is None:
        raise ReviewError(
            "which GPU model? set annotation or nodeSelector capacity-planner.io/gpu to a "
            "hardware slug (GET /v1/hardware)"
        )
    gpu = _slug(notes, "gpu")
    subject: Hashable
    if "workload" in notes:
        subject = ("workload", _slug(notes, "workload"))
    else:
        _slug(notes, "model")
        subject = ("inline", *(notes.get(key) for key in _INLINE_KEYS))
    return Question(notes=notes, gpu=gpu, requests=requests, key=(subject, gpu, requests))


def _decisions(session: Session, asked: Question) -> tuple[Decision, ...]:
    notes = asked.notes
    if "workload" in notes:
        label = notes["workload"]
        spec = workload_spec(session, label)
    else:
        spec = _inline_spec(notes)
        label = spec.model or "inline"
    hardware = HardwareRepository(session).get(asked.gpu)
    if hardware is None:
        raise ReviewError(f"capacity-planner.io/gpu '{asked.gpu}' is not a known hardware profile")
    return tuple(
        decide(
            session,
            spec=spec,
            label=label,
            hardware=hardware,
            resource=request.resource,
            count=request.count,
        )
        for request in asked.requests
    )


def evaluate(session: Session, asked: Question) -> tuple[bool, str, list[str]]:
    """Allowed, message and warnings for a pod's GPU requests (reads the database)."""
    decisions = list(zip(asked.requests, _decisions(session, asked), strict=True))
    denied = [(r, d) for r, d in decisions if not d.allowed]
    warnings = [w for _, d in decisions for w in d.warnings]
    if denied:
        request, decision = denied[0]
        kind = "init container" if request.init_container else "container"
        return False, f"{kind} '{request.container}': {decision.message}", warnings
    request, decision = decisions[0]
    suffix = f" ({len(decisions)} GPU requests checked)" if len(decisions) > 1 else ""
    return True, decision.message + suffix, warnings


def evaluate_with_digest(session: Session, asked: Question) -> tuple[bytes, Digest, float]:
    """``evaluate`` rendered as an answer tail, with the digest of the data it saw (read first,
    in the same session, so the answer is at least as new as the digest)."""
    digest, read_at = timed_digest(session)
    return answer_tail(*evaluate(session, asked)), digest, read_at


def answer_tail(allowed: bool, message: str, warnings: list[str]) -> bytes:
    """The AdmissionResponse after its uid, rendered once (cached answers are bytes)."""
    response: dict[str, Any] = {
        "allowed": allowed,
        "status": {"code": 200 if allowed else 403, "message": message},
    }
    if warnings:
        response["warnings"] = [_warning(w) for w in warnings]
    return json.dumps(response, separators=(",", ":")).encode()[1:]


_ALLOWED = b'"allowed":true,'


def is_allowed(tail: bytes) -> bool:
    """Whether an ``answer_tail`` allows the pod (its first member is ``allowed``)."""
    return tail.startswith(_ALLOWED)


_HEAD = b'{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","response":{"uid":'


def render(uid: str, tail: bytes) -> bytes:
    """The AdmissionReview answer: ``uid`` echoed, then a tail from ``answer_tail``."""
    return b"".join((_HEAD, json.dumps(uid).encode(), b",", tail, b"}"))


def on_failure(policy: str, reason: str) -> bytes:
    """The answer tail when a review cannot be evaluated: deny, or allow with a warning."""
    if policy == "allow":
        return answer_tail(True, f"not checked: {reason}", [f"capacity-planner: {reason}"])
    return answer_tail(False, f"denied: {reason}", [])


def failure_reason(exc: BaseException) -> str:
    """The reason an ``on_failure`` answer gives for a review error."""
    if isinstance(exc, ServiceError):
        return exc.detail
    return str(exc)


NO_GPU = answer_tail(True, "no GPU requested", [])
