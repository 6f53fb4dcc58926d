"""MIG use cases: profile listing, fit checks, layout validation and partition plans."""

from __future__ import annotations

import yaml
from sqlalchemy import select
from sqlalchemy.orm import Session

from app.db.models import Hardware
from app.db.repositories import HardwareRepository
from app.domain.hardware import FrameworkOverhead
from app.domain.mig.layout import (
    MigError,
    MigGeometry,
    MigProfileSpec,
    Placement,
    kubernetes_resource,
    smallest_fitting,
)
from app.domain.mig.layout import validate_layout as check_layout
from app.domain.mig.parted import mig_parted_config
from app.domain.mig.plan import Demand, plan_partitions
from app.domain.units import MIB
from app.domain.workload import Runtime
from app.schemas.estimates import WorkloadSpec
from app.schemas.mig import (
    FitAlternatives,
    LargerGpu,
    LayoutValidateRequest,
    LayoutValidateResponse,
    MigFitRequest,
    MigFitResponse,
    MigPlanRequest,
    MigPlanResponse,
    MigProfileInfo,
    MigProfileList,
    PlanItem,
    PlannedGpu,
    PlannedInstance,
    PlannedWorkload,
    ProfileFit,
    RequiredLine,
    Violation,
)
from app.services.errors import InvalidInput, NotFound
from app.services.estimates import run_estimate
from app.services.state_cache import Digest, PerWatch, timed_digest
from app.services.workloads import stored_spec

DEFAULT_CUDA_CONTEXT_BYTES = 512 * MIB
MAX_BATCH_SEARCH = 1_048_576
MAX_PLAN_REPLICAS = 100_000


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


def workload_spec(session: Session, workload: WorkloadSpec | str) -> WorkloadSpec:
    """An inline workload as is, or a stored one (by slug) as the estimate's inputs."""
    return workload if not isinstance(workload, str) else stored_spec(session, workload)


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
    requested_profile = require_profile(geo, payload.profile) if payload.profile else None
    lines, phase, assumptions = required_memory(
        session,
        workload_spec(session, payload.workload),
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


# Fit answers (rendered JSON) per database, keyed by the request, valid in the generation of the
# planning data they were computed in (app.services.state_cache). Errors are not cached.
FITS: PerWatch[str, bytes] = PerWatch(size=256)


def fit_with_digest(session: Session, *, payload: MigFitRequest) -> tuple[bytes, Digest, float]:
    """``fit`` rendered as the response body, with the digest of the data it saw (read first,
    in the same session, so the answer is at least as new as the digest)."""
    digest, read_at = timed_digest(session)
    body = fit(session, payload=payload).model_dump_json(by_alias=True, exclude_none=True)
    return body.encode(), digest, read_at


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
    spec = workload_spec(session, payload.workload)

    def fits(batch: int) -> bool:
        lines, _, _ = required_memory(
            session,
            spec,
            row,
            cuda_context_bytes=payload.cuda_context_bytes,
            safety_margin_fraction=payload.safety_margin_fraction,
            batch_size=batch,
        )
        return sum(line.bytes for line in lines) <= profile.memory_bytes

    if not fits(1):
        return None
    low, high = 1, min(spec.batch_size, MAX_BATCH_SEARCH)
    while low < high:
        middle = (low + high + 1) // 2
        if fits(middle):
            low = middle
        else:
            high = middle - 1
    return low


def validate_layout(session: Session, *, payload: LayoutValidateRequest) -> LayoutValidateResponse:
    """Check a layout against the GPU's MIG rules."""
    geo = geometry(mig_hardware(session, payload.gpu))
    for item in payload.instances:
        require_profile(geo, item.profile)
    violations = check_layout(
        geo, [Placement(profile=item.profile, start=item.start) for item in payload.instances]
    )
    return LayoutValidateResponse(
        gpu=geo.gpu,
        valid=not violations,
        violations=[
            Violation(rule=v.rule, message=v.message, instances=list(v.instances))
            for v in violations
        ],
    )


def _plan_profile(
    session: Session, payload: MigPlanRequest, row: Hardware, geo: MigGeometry, item: PlanItem
) -> PlannedWorkload:
    if (item.profile is None) == (item.workload is None):
        raise InvalidInput(
            f"workload '{item.name}': give exactly one of 'profile' or 'workload'",
            pointer="/workloads",
        )
    if item.profile is not None:
        require_profile(geo, item.profile)
        return PlannedWorkload(name=item.name, profile=item.profile, replicas=item.replicas)
    assert item.workload is not None
    lines, _, _ = required_memory(
        session,
        workload_spec(session, item.workload),
        row,
        cuda_context_bytes=payload.cuda_context_bytes,
        safety_margin_fraction=payload.safety_margin_fraction,
    )
    required = sum(line.bytes for line in lines)
    chosen = smallest_fitting(geo, required)
    if chosen is None:
        biggest = max(p.memory_bytes for p in geo.profiles)
        raise InvalidInput(
            f"workload '{item.name}' needs {required / 2**30:.1f} GiB; the biggest profile of "
            f"'{geo.gpu}' gives {biggest / 2**30:.1f} GiB (POST /v1/mig/fit for alternatives)",
            pointer="/workloads",
        )
    return PlannedWorkload(
        name=item.name, profile=chosen.name, replicas=item.replicas, required_bytes=required
    )


def plan(session: Session, *, payload: MigPlanRequest) -> MigPlanResponse:
    """Pack every replica onto the fewest GPUs with explicit valid layouts."""
    names = [item.name for item in payload.workloads]
    if len(set(names)) != len(names):
        raise InvalidInput("workload names must be unique", pointer="/workloads")
    total = sum(item.replicas for item in payload.workloads)
    if total > MAX_PLAN_REPLICAS:
        raise InvalidInput(
            f"{total:,} replicas in one plan; at most {MAX_PLAN_REPLICAS:,} (split the request)",
            pointer="/workloads",
        )
    row = mig_hardware(session, payload.gpu)
    geo = geometry(row)
    sized = sorted(
        (_plan_profile(session, payload, row, geo, item) for item in payload.workloads),
        key=lambda w: w.name,
    )
    try:
        result = plan_partitions(
            geo,
            [Demand(workload=w.name, profile=w.profile, replicas=w.replicas) for w in sized],
        )
    except MigError as exc:
        raise InvalidInput(str(exc), pointer="/workloads") from exc
    config = mig_parted_config(geo, result, config_name=payload.config_name)
    return MigPlanResponse(
        gpu=geo.gpu,
        gpu_count=len(result.gpus),
        optimal=result.optimal,
        workloads=sized,
        gpus=[
            PlannedGpu(
                index=gpu.index,
                instances=[
                    PlannedInstance(
                        workload=inst.workload,
                        profile=inst.profile,
                        start=inst.start,
                        kubernetes_resource=kubernetes_resource(inst.profile),
                    )
                    for inst in gpu.instances
                ],
                free_compute_slices=gpu.free_compute_slices,
                free_memory_slices=gpu.free_memory_slices,
                unused_memory_slices=list(gpu.unused_memory_slices),
            )
            for gpu in result.gpus
        ],
        mig_parted=config,
        mig_parted_yaml=yaml.safe_dump(config, sort_keys=False),
    )
