"""Model architecture use cases."""

from __future__ import annotations

from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from app.db.models import ModelArchitecture, utcnow
from app.db.repositories import ModelRepository
from app.domain.errors import GraphError
from app.domain.graph.format import validate_graph
from app.schemas.models import ModelBase, ModelCreate, ModelList, ModelRead, ModelReplace
from app.schemas.models import Provenance as ProvenanceEnum
from app.services.concurrency import IfMatch, commit_versioned, require_match
from app.services.errors import AlreadyExists, InUse, InvalidInput, NotFound, ReadOnly


def _validated_layer_count(fields: ModelBase) -> int:
    names = [spec.name for spec in fields.inputs]
    if len(set(names)) != len(names):
        raise InvalidInput("input names must be unique", pointer="/inputs")
    try:
        return validate_graph(fields.layers, names).layer_count
    except GraphError as exc:
        raise invalid_graph(exc) from exc


def invalid_graph(exc: GraphError) -> InvalidInput:
    """A 422-mapped error pointing at the layer and field at fault."""
    if exc.layer is not None:
        pointer = f"/layers/{exc.layer}/{exc.field}" if exc.field else f"/layers/{exc.layer}"
    else:
        pointer = "/" + (exc.field or "layers").replace(".", "/").replace("[", "/").replace("]", "")
    return InvalidInput(str(exc), pointer=pointer)


def apply_fields(target: ModelArchitecture, fields: ModelBase) -> None:
    """Copy every client-supplied field onto the ORM row."""
    target.name = fields.name
    target.family = fields.family
    target.description = fields.description
    target.inputs = [spec.model_dump() for spec in fields.inputs]
    target.layers = fields.layers
    target.default_bindings = dict(fields.default_bindings)
    target.updated_at = utcnow()


def to_read(row: ModelArchitecture) -> ModelRead:
    """The API view of a stored architecture."""
    names = [spec["name"] for spec in row.inputs]
    return ModelRead.model_validate(
        {
            "slug": row.slug,
            "name": row.name,
            "family": row.family,
            "description": row.description,
            "inputs": row.inputs,
            "layers": row.layers,
            "default_bindings": row.default_bindings,
            "provenance": row.provenance,
            "layer_count": validate_graph(row.layers, names).layer_count,
            "version": row.version,
            "created_at": row.created_at,
            "updated_at": row.updated_at,
        }
    )


def _get_row(repo: ModelRepository, slug: str) -> ModelArchitecture:
    row = repo.get(slug)
    if row is None:
        raise NotFound(f"model '{slug}' does not exist; GET /v1/models lists the slugs")
    return row


def _require_editable(row: ModelArchitecture) -> None:
    if row.provenance == ProvenanceEnum.BUILTIN.value:
        raise ReadOnly(
            f"model '{row.slug}' is a built-in zoo model and is read-only; "
            "POST a copy under a new slug to change it"
        )


def list_models(
    session: Session,
    *,
    family: str | None = None,
    provenance: str | None = None,
    limit: int = 50,
    offset: int = 0,
) -> ModelList:
    """A filtered page of architectures."""
    rows, total = ModelRepository(session).list(
        family=family, provenance=provenance, limit=limit, offset=offset
    )
    return ModelList(items=[to_read(r) for r in rows], total=total, limit=limit, offset=offset)


def get_model(session: Session, *, slug: str) -> ModelRead:
    """One architecture."""
    return to_read(_get_row(ModelRepository(session), slug))


def create_model(
    session: Session, *, payload: ModelCreate, provenance: ProvenanceEnum = ProvenanceEnum.USER
) -> ModelRead:
    """Validate and store an architecture."""
    _validated_layer_count(payload)
    repo = ModelRepository(session)
    if repo.get(payload.slug) is not None:
        raise AlreadyExists(
            f"a model with slug '{payload.slug}' exists already; pick another slug "
            "or PUT to /v1/models/{slug} to replace yours"
        )
    row = ModelArchitecture(slug=payload.slug, provenance=provenance.value, created_at=utcnow())
    apply_fields(row, payload)
    session.add(row)
    try:
        session.commit()
    except IntegrityError as exc:
        session.rollback()
        raise AlreadyExists(f"a model with slug '{payload.slug}' exists already") from exc
    return to_read(row)


def replace_model(
    session: Session, *, slug: str, payload: ModelReplace, if_match: IfMatch | None
) -> ModelRead:
    """Replace a user architecture if the client holds its current version."""
    row = _get_row(ModelRepository(session), slug)
    _require_editable(row)
    require_match(if_match, current_version=row.version, what=f"model '{slug}'")
    _validated_layer_count(payload)
    apply_fields(row, payload)
    commit_versioned(session, what=f"model '{slug}'")
    return to_read(row)


def delete_model(session: Session, *, slug: str, if_match: IfMatch | None) -> None:
    """Delete a user architecture if the client holds its current version."""
    repo = ModelRepository(session)
    row = _get_row(repo, slug)
    _require_editable(row)
    require_match(if_match, current_version=row.version, what=f"model '{slug}'")
    if repo.is_referenced(row):
        raise InUse(f"model '{slug}' is used by saved workloads; delete those first")
    session.delete(row)
    commit_versioned(session, what=f"model '{slug}'")
