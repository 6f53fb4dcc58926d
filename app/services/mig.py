"""MIG use cases: profile listing, fit checks, layout validation and partition plans."""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session

from app.db.models import Hardware
from app.db.repositories import HardwareRepository
from app.domain.memory import FrameworkOverhead, Runtime
from app.domain.mig import (
    MIB,
    MigGeometry,
    MigProfileSpec,
    kubernetes_resource,
    smallest_fitting,
)
from app.schemas.estimates import WorkloadSpec
from app.schemas.mig import (
    FitAlternatives,
    LargerGpu,
    MigFitRequest,
    MigFitResponse,
    MigProfileInfo,
    MigProfileList,
    ProfileFit,
    RequiredLine,
)
from app.services.errors import InvalidInput, NotFound
from app.services.estimates import run_estimate

DEFAULT_CUDA_CONTEXT_BYTES = 512 * MIB
MAX_BATCH_SEARCH = 1_048_576


def _mig_gpu_slugs(session: Session) -> list[str]:
    query = select(Hardware.slug).where(Hardware.mig_total_compute_slices.is_not(None))
    return sorted(session.scalars(query))


def mig_hardware(session: Session, slug: str) -> Hardware:
    """The hardware row of a MIG-capable GPU (404 naming the valid ones; 422 without MIG)."""
    row = HardwareRepository(session).get(slug)
    if row is None:
        raise NotFound(
            f"hardware profile '{slug}' does not exist; MIG-capable GPUs: "
            + ", ".join(_mig_gpu_slugs(session))
        )
    if row.mig_total_compute_slices is None:
        raise InvalidInput(
            f"'{slug}' does not support MIG; MIG-capable GPUs: "
            + ", ".join(_mig_gpu_slugs(session)),
            pointer="/gpu",
        )
    return row


def geometry(row: Hardware) -> MigGeometry:
    """The pure MIG geometry of a hardware row."""
    profiles = sorted(
        (
            MigProfileSpec(
                name=p.name,
                memory_mib=p.memory_mib,
                compute_slices=p.compute_slices,
                memory_slices=p.memory_slices,
                max_instances=p.max_instances,
                placements=tuple(p.placements),
            )
            for p in row.mig_profiles
        ),
        key=lambda p: (p.compute_slices, p.memory_mib, p.name),
    )
    return MigGeometry(
        gpu=row.slug,
        total_compute_slices=row.mig_total_compute_slices or 0,
        total_memory_slices=row.mig_total_memory_slices or 0,
        max_gpu_instances=row.mig_max_gpu_instances or 0,
        profiles=tuple(profiles),
    )


def require_profile(geo: MigGeometry, name: str) -> MigProfileSpec:
    """The named profile, or a 404 listing the valid ones."""
    profile = geo.profile(name)
    if profile is None:
        raise NotFound(
            f"'{geo.gpu}' has no MIG profile '{name}'; valid profiles: "
            + ", ".join(p.name for p in geo.profiles)
        )
    return profile


def list_profiles(session: Session, *, slug: str) -> MigProfileList:
    """Every MIG profile of a GPU with memory in bytes and MiB."""
    row = mig_hardware(session, slug)
    unconfirmed = {p.name: list(p.unconfirmed) for p in row.mig_profiles}
    geo = geometry(row)
    return MigProfileList(
        gpu=geo.gpu,
        total_compute_slices=geo.total_compute_slices,
        total_memory_slices=geo.total_memory_slices,
        max_gpu_instances=geo.max_gpu_instances,
        profiles=[
            MigProfileInfo(
                name=p.name,
                memory_mib=p.memory_mib,
                memory_bytes=p.memory_bytes,
                compute_slices=p.compute_slices,
                memory_slices=p.memory_slices,
                max_instances=p.max_instances,
                placements=list(p.placements),
                kubernetes_resource=kubernetes_resource(p.name),
                unconfirmed=unconfirmed[p.name],
            )
            for p in geo.profiles
        ],
    )


def _cuda_context(payload_bytes: int | None, row: Hardware) -> tuple[int, str]:
    if payload_bytes is not None:
        return payload_bytes, "request override"
    overhead = row.framework_overhead or {}
    if "cuda_context_bytes" in overhead:
        return int(overhead["cuda_context_bytes"]), f"hardware profile '{row.slug}'"
    return DEFAULT_CUDA_CONTEXT_BYTES, "default 512 MiB (PyTorch, lazy module loading)"


def required_memory(
    session: Session,
    spec: WorkloadSpec,
    row: Hardware,
    *,
    cuda_context_bytes: int | None,
    safety_margin_fraction: float,
    batch_size: int | None = None,
) -> tuple[list[RequiredLine], str, list[str]]:
    """Estimate + CUDA context + safety margin as named lines (the context is not in the
    estimate line, so it can be overridden on its own)."""
    overhead = FrameworkOverhead(cuda_context_bytes=0)
    run = run_estimate(
        session, spec, runtime=Runtime.CUDA, overhead=overhead, batch_size=batch_size
    )
    context, source = _cuda_context(cuda_context_bytes, row)
    estimate = run.result.peak_bytes
    margin = int((estimate + context) * safety_margin_fraction + 0.999999)
    lines = [
        RequiredLine(
            key="memory_estimate",
            bytes=estimate,
            detail=f"peak of {run.label} ({run.result.peak_phase}), POST /v1/estimates/memory "
            "for the breakdown",
        ),
        RequiredLine(key="cuda_context", bytes=context, detail=source),
        RequiredLine(
            key="safety_margin",
            bytes=margin,
            detail=f"{safety_margin_fraction:.0%} of estimate + context",
        ),
    ]
    return lines, run.result.peak_phase, list(run.result.assumptions)


def _profile_fit(profile: MigProfileSpec, required: int) -> ProfileFit:
    fits = required <= profile.memory_bytes
    return ProfileFit(
        profile=profile.name,
        kubernetes_resource=kubernetes_resource(profile.name),
        compute_slices=profile.compute_slices,
        usable_bytes=profile.memory_bytes,
        required_bytes=required,
        headroom_bytes=profile.memory_bytes - required,
        fits=fits,
        limiting_factor="none" if fits else "memory",
    )


def fit(session: Session, *, payload: MigFitRequest) -> MigFitResponse:
    """Which profiles of a GPU hold the workload; if none, what would."""
    row = mig_hardware(session, payload.gpu)
    geo = geometry(row)
    requested_profile = (
        require_profile(geo, payload.profile) if payload.profile else None
    )
    lines, phase, assumptions = required_memory(
        session,
        payload.workload,
        row,
        cuda_context_bytes=payload.cuda_context_bytes,
        safety_margin_fraction=payload.safety_margin_fraction,
    )
    required = sum(line.bytes for line in lines)
    fits = [_profile_fit(p, required) for p in geo.profiles]
    smallest = smallest_fitting(geo, required)
    alternatives = None
    if smallest is None:
        alternatives = _alternatives(session, payload, row, geo, required)
    return MigFitResponse(
        gpu=geo.gpu,
        required_bytes=required,
        required=lines,
        estimate_peak_phase=phase,
        profiles=fits,
        smallest_fitting_profile=smallest.name if smallest else None,
        smallest_fitting_resource=kubernetes_resource(smallest.name) if smallest else None,
        requested=_profile_fit(requested_profile, required) if requested_profile else None,
        alternatives=alternatives,
        assumptions=assumptions,
    )


def _alternatives(
    session: Session, payload: MigFitRequest, row: Hardware, geo: MigGeometry, required: int
) -> FitAlternatives:
    biggest = max(geo.profiles, key=lambda p: (p.memory_mib, p.compute_slices, p.name))
    gpus = session.scalars(
        select(Hardware)
        .where(Hardware.kind == "gpu", Hardware.memory_bytes >= required)
        .order_by(Hardware.memory_bytes, Hardware.slug)
        .limit(5)
    )
    return FitAlternatives(
        full_gpu_fits=row.memory_bytes >= required,
        full_gpu_memory_bytes=row.memory_bytes,
        larger_gpus=[
            LargerGpu(
                hardware=gpu.slug,
                memory_bytes=gpu.memory_bytes,
                mig_capable=gpu.mig_total_compute_slices is not None,
            )
            for gpu in gpus
        ],
        largest_batch_on_biggest_profile=_largest_batch(session, payload, row, biggest),
        biggest_profile=biggest.name,
    )


def _largest_batch(
    session: Session, payload: MigFitRequest, row: Hardware, profile: MigProfileSpec
) -> int | None:
    """Binary search for the largest batch whose requirement fits ``profile`` (memory grows
    with the batch size, so the predicate is monotone)."""

    def fits(batch: int) -> bool:
        lines, _, _ = required_memory(
            session,
            payload.workload,
            row,
            cuda_context_bytes=payload.cuda_context_bytes,
            safety_margin_fraction=payload.safety_margin_fraction,
            batch_size=batch,
        )
        return sum(line.bytes for line in lines) <= profile.memory_bytes

    if not fits(1):
        return None
    low, high = 1, min(payload.workload.batch_size, MAX_BATCH_SEARCH)
    while low < high:
        middle = (low + high + 1) // 2
        if fits(middle):
            low = middle
        else:
            high = middle - 1
    return low
