"""Hardware profile use cases."""

from __future__ import annotations

from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from app.db.models import Hardware, utcnow
from app.db.repositories import HardwareRepository
from app.domain.mig.layout import kubernetes_resource
from app.domain.units import MIB
from app.schemas.hardware import (
    CpuDetails,
    FrameworkOverheadDefaults,
    GpuLink,
    HardwareCreate,
    HardwareList,
    HardwareRead,
    HardwareReplace,
    HardwareSource,
    HostLink,
    MigProfileRead,
    MigSpecRead,
)
from app.services.concurrency import IfMatch, commit_versioned, require_match
from app.services.convert import (
    apply_hardware_fields,
)
from app.services.decision_store import flush_versioned, refresh_hardware
from app.services.errors import (
    AlreadyExists,
    InUse,
    NotFound,
    ReadOnly,
)


def to_read(row: Hardware) -> HardwareRead:
    """The API view of a stored profile."""
    mig = None
    if row.mig_total_compute_slices is not None:
        mig = MigSpecRead(
            total_compute_slices=row.mig_total_compute_slices,
            total_memory_slices=row.mig_total_memory_slices or 0,
            max_gpu_instances=row.mig_max_gpu_instances or 0,
            profiles=[
                MigProfileRead(
                    name=p.name,
                    memory_mib=p.memory_mib,
                    memory_bytes=p.memory_mib * MIB,
                    compute_slices=p.compute_slices,
                    sm_count=p.sm_count,
                    memory_slices=p.memory_slices,
                    max_instances=p.max_instances,
                    placements=p.placements,
                    unconfirmed=p.unconfirmed,
                    kubernetes_resource=kubernetes_resource(p.name),
                )
                for p in row.mig_profiles
            ],
        )
    return HardwareRead.model_validate(
        {
            "slug": row.slug,
            "vendor": row.vendor,
            "name": row.name,
            "kind": row.kind,
            "family": row.family,
            "architecture": row.architecture,
            "launch_year": row.launch_year,
            "memory_bytes": row.memory_bytes,
            "memory_type": row.memory_type,
            "memory_bandwidth_bytes_per_s": row.memory_bandwidth_bytes_per_s,
            "peak_flops_per_s": row.peak_flops_per_s,
            "peak_sparse_flops_per_s": row.peak_sparse_flops_per_s,
            "host_link": HostLink(
                type=row.host_link_type,
                pcie_generation=row.host_link_pcie_generation,
                pcie_lanes=row.host_link_pcie_lanes,
                bandwidth_bytes_per_s=row.host_link_bandwidth_bytes_per_s,
            ),
            "gpu_link": (
                None
                if row.gpu_link_type is None or row.gpu_link_bandwidth_bytes_per_s is None
                else GpuLink(
                    type=row.gpu_link_type,
                    bandwidth_bytes_per_s=row.gpu_link_bandwidth_bytes_per_s,
                )
            ),
            "sm_count": row.sm_count,
            "compute_capability": row.compute_capability,
            "cuda_visible_memory_bytes": row.cuda_visible_memory_bytes,
            "cuda_visible_memory_source": row.cuda_visible_memory_source,
            "tdp_watts": row.tdp_watts,
            "price_usd_per_hour": row.price_usd_per_hour,
            "price_kind": row.price_kind,
            "price_region": row.price_region,
            "price_date": row.price_date,
            "price_source": row.price_source,
            "cpu": CpuDetails.model_validate(row.cpu) if row.cpu else None,
            "mig": mig,
            "framework_overhead": (
                FrameworkOverheadDefaults.model_validate(row.framework_overhead)
                if row.framework_overhead
                else None
            ),
            "unconfirmed": row.unconfirmed,
            "sources": row.sources,
            "notes": row.notes,
            "source": row.source,
            "version": row.version,
            "created_at": row.created_at,
            "updated_at": row.updated_at,
        }
    )


def _get_row(repo: HardwareRepository, slug: str) -> Hardware:
    row = repo.get(slug)
    if row is None:
        raise NotFound(
            f"hardware profile '{slug}' does not exist; GET /v1/hardware lists the slugs"
        )
    return row


def _require_editable(row: Hardware) -> None:
    if row.source == HardwareSource.CATALOG.value:
        raise ReadOnly(
            f"hardware profile '{row.slug}' comes from the shipped catalog and is read-only; "
            "create your own profile under a new slug (POST /v1/hardware) to change figures"
        )


def list_hardware(
    session: Session,
    *,
    kind: str | None = None,
    vendor: str | None = None,
    family: str | None = None,
    source: str | None = None,
    mig_capable: bool | None = None,
    limit: int = 50,
    offset: int = 0,
) -> HardwareList:
    """A filtered page of hardware profiles."""
    rows, total = HardwareRepository(session).list(
        kind=kind,
        vendor=vendor,
        family=family,
        source=source,
        mig_capable=mig_capable,
        limit=limit,
        offset=offset,
    )
    return HardwareList(items=[to_read(r) for r in rows], total=total, limit=limit, offset=offset)


def get_hardware(session: Session, *, slug: str) -> HardwareRead:
    """One hardware profile."""
    return to_read(_get_row(HardwareRepository(session), slug))


def create_hardware(session: Session, *, payload: HardwareCreate) -> HardwareRead:
    """Store a user-defined hardware profile."""
    repo = HardwareRepository(session)
    if repo.get(payload.slug) is not None:
        raise AlreadyExists(
            f"a hardware profile with slug '{payload.slug}' exists already; "
            "pick another slug or PUT to /v1/hardware/{slug} to replace yours"
        )
    row = Hardware(slug=payload.slug, source=HardwareSource.USER.value, created_at=utcnow())
    apply_hardware_fields(row, payload)
    session.add(row)
    try:
        session.flush()
        refresh_hardware(session, row)  # every workload's admission decision on it
        session.commit()
    except IntegrityError as exc:  # a concurrent create won the race
        session.rollback()
        raise AlreadyExists(
            f"a hardware profile with slug '{payload.slug}' exists already"
        ) from exc
    return to_read(row)


def replace_hardware(
    session: Session, *, slug: str, payload: HardwareReplace, if_match: IfMatch | None
) -> HardwareRead:
    """Replace a user-defined profile if the client holds its current version."""
    row = _get_row(HardwareRepository(session), slug)
    _require_editable(row)
    require_match(if_match, current_version=row.version, what=f"hardware profile '{slug}'")
    apply_hardware_fields(row, payload)
    flush_versioned(session, what=f"hardware profile '{slug}'")
    refresh_hardware(session, row)  # every workload's admission decision on it
    commit_versioned(session, what=f"hardware profile '{slug}'")
    return to_read(row)


def delete_hardware(session: Session, *, slug: str, if_match: IfMatch | None) -> None:
    """Delete a user-defined profile if the client holds its current version."""
    repo = HardwareRepository(session)
    row = _get_row(repo, slug)
    _require_editable(row)
    require_match(if_match, current_version=row.version, what=f"hardware profile '{slug}'")
    if repo.is_referenced(row):
        raise InUse(f"hardware profile '{slug}' is used by saved workloads; delete those first")
    session.delete(row)
    commit_versioned(session, what=f"hardware profile '{slug}'")
