"""Workload use cases: saved questions that estimates, fit checks and admission refer to."""

from __future__ import annotations

from collections.abc import Callable

from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from app.db.models import Hardware, Workload, utcnow
from app.db.repositories import HardwareRepository, ModelRepository, WorkloadRepository
from app.domain.budget import CancelToken, WorkCancelled, bound
from app.schemas.estimates import (
    MemoryEstimateRequest,
    MemoryEstimateResponse,
)
from app.schemas.workloads import (
    WorkloadBase,
    WorkloadCreate,
    WorkloadList,
    WorkloadOptions,
    WorkloadRead,
    WorkloadReplace,
)
from app.services.concurrency import IfMatch, commit_versioned, require_match
from app.services.convert import (
    DeviceTarget,
    device_target,
    hardware_overhead,
    hardware_runtime,
    to_spec,
    workload_device,
    workload_fields,
)
from app.services.decision_store import (
    WRITE_BUDGET_S,
    flush_versioned,
    over_budget,
    refresh_workload,
)
from app.services.errors import (
    AlreadyExists,
    InvalidInput,
)
from app.services.pipeline import (
    prepare_estimate_response,
    run_estimate,
    stored_spec,
    workload_row,
)


def to_read(row: Workload) -> WorkloadRead:
    """The API view of a stored workload."""
    return WorkloadRead.model_validate(
        {
            **workload_fields(row),
            "slug": row.slug,
            "version": row.version,
            "created_at": row.created_at,
            "updated_at": row.updated_at,
        }
    )


def _apply(session: Session, row: Workload, fields: WorkloadBase) -> None:
    """Check the references and that the workload can be estimated, then copy the fields."""
    model = ModelRepository(session).get(fields.model)
    if model is None:
        raise InvalidInput(
            f"model '{fields.model}' does not exist; GET /v1/models lists them", pointer="/model"
        )
    target: DeviceTarget | None = None
    if fields.hardware is not None:
        slug = fields.hardware.partition("/")[0]
        if HardwareRepository(session).get(slug) is None:
            raise InvalidInput(f"hardware profile '{slug}' does not exist", pointer="/hardware")
        # ``slug/profile``: 404 for a GPU without MIG or a profile it lacks (naming the valid
        # ones), as the estimate endpoints answer.
        target = device_target(session, fields.hardware)
    hardware: Hardware | None = None if target is None else target.row
    # Reject what no estimate could answer (unknown symbols, quantized training, ...) now. An
    # estimate over the work budget, or one that overruns the write's deadline, is not refused:
    # its admission decisions are stored as too expensive, or computed by the refresher
    # (app.services.decision_store).
    spec = to_spec(fields)
    if over_budget(session, spec) is None:
        try:
            with bound(CancelToken.after(WRITE_BUDGET_S)):
                run_estimate(
                    session,
                    spec,
                    runtime=None,
                    hardware_runtime=hardware_runtime(hardware),
                    overhead=hardware_overhead(hardware),
                    gpu=None if target is None else target.gpu,
                )
        except WorkCancelled:
            pass
        except InvalidInput as exc:  # the estimate names WorkloadInput's fields; a workload
            head = (exc.pointer or "").split("/")[1:2]  # keeps the rarer ones under options
            if head and head[0] in WorkloadOptions.model_fields:
                exc.pointer = f"/options{exc.pointer}"
            raise
    row.name = fields.name
    row.description = fields.description
    row.model_id = model.id
    row.model = model
    row.mode = fields.mode.value
    row.batch_size = fields.batch_size
    row.sequence_length = fields.sequence_length
    row.image_size = fields.image_size
    row.precision = fields.precision.value
    row.optimizer = fields.optimizer.value if fields.optimizer else None
    row.hardware_id = hardware.id if hardware else None
    row.hardware = hardware
    row.hardware_slice = target.name if target is not None and target.profile else None
    # Only the options set away from their defaults: a row that uses none of the options a
    # later release added stays readable by the release before it (rollback, rolling upgrade:
    # its schemas forbid unknown keys); reading fills the defaults back in.
    row.options = fields.options.model_dump(mode="json", exclude_defaults=True)
    row.updated_at = utcnow()


def list_workloads(
    session: Session,
    *,
    model: str | None = None,
    mode: str | None = None,
    limit: int = 50,
    offset: int = 0,
) -> WorkloadList:
    """A filtered page of workloads ordered by slug."""
    model_id = None
    if model is not None:
        row = ModelRepository(session).get(model)
        model_id = row.id if row else -1  # an unknown model: no workload
    rows, total = WorkloadRepository(session).list(
        model_id=model_id, mode=mode, limit=limit, offset=offset
    )
    return WorkloadList(items=[to_read(r) for r in rows], total=total, limit=limit, offset=offset)


def get_workload(session: Session, *, slug: str) -> WorkloadRead:
    """One workload."""
    return to_read(workload_row(session, slug))


def create_workload(session: Session, *, payload: WorkloadCreate) -> WorkloadRead:
    """Validate and store a workload, with its admission decision on every hardware profile."""
    if WorkloadRepository(session).exists(payload.slug):
        raise AlreadyExists(f"a workload with slug '{payload.slug}' exists already")
    row = Workload(slug=payload.slug, created_at=utcnow())
    _apply(session, row, payload)
    session.add(row)
    try:
        session.flush()
        refresh_workload(session, row)
        session.commit()
    except IntegrityError as exc:
        session.rollback()
        raise AlreadyExists(f"a workload with slug '{payload.slug}' exists already") from exc
    return to_read(row)


def replace_workload(
    session: Session, *, slug: str, payload: WorkloadReplace, if_match: IfMatch | None
) -> WorkloadRead:
    """Replace a workload if the client holds its current version (and recompute its admission
    decisions in the same transaction)."""
    row = workload_row(session, slug)
    require_match(if_match, current_version=row.version, what=f"workload '{slug}'")
    _apply(session, row, payload)
    flush_versioned(session, what=f"workload '{slug}'")
    refresh_workload(session, row)
    commit_versioned(session, what=f"workload '{slug}'")
    return to_read(row)


def delete_workload(session: Session, *, slug: str, if_match: IfMatch | None) -> None:
    """Delete a workload if the client holds its current version."""
    row = workload_row(session, slug)
    require_match(if_match, current_version=row.version, what=f"workload '{slug}'")
    session.delete(row)
    commit_versioned(session, what=f"workload '{slug}'")


def workload_memory(session: Session, *, slug: str) -> MemoryEstimateResponse:
    """The footprint of a stored workload on its target hardware (if any; a MIG slice: the fit
    on its profile's usable memory)."""
    return prepare_workload_memory(session, slug=slug)()


def prepare_workload_memory(
    session: Session, *, slug: str, limit_units: int | None = None
) -> Callable[[], MemoryEstimateResponse]:
    """Load what :func:`workload_memory` needs (and check the work budget, ``limit_units``);
    the returned function computes the estimate without the database (app.api.compute)."""
    row = workload_row(session, slug)
    spec = stored_spec(session, slug)
    hardware = workload_device(row)
    request = MemoryEstimateRequest.model_validate({**spec.model_dump(), "hardware": hardware})
    return prepare_estimate_response(session, payload=request, limit_units=limit_units)
