"""Model architecture use cases."""

from __future__ import annotations

from sqlalchemy.orm import Session

from app.db.models import ModelArchitecture
from app.db.repositories import ModelRepository
from app.schemas.models import (
    ModelCreate,
    ModelList,
    ModelRead,
    ModelReplace,
)
from app.schemas.models import Provenance as ProvenanceEnum
from app.services import model_store
from app.services.concurrency import IfMatch, commit_versioned, require_match
from app.services.decision_store import flush_versioned, refresh_model
from app.services.errors import (
    InUse,
    NotFound,
    ReadOnly,
)
from app.services.model_store import apply_model_fields, model_read, validated_layer_count


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
    return ModelList(items=[model_read(r) for r in rows], total=total, limit=limit, offset=offset)


def get_model(session: Session, *, slug: str) -> ModelRead:
    """One architecture."""
    return model_read(_get_row(ModelRepository(session), slug))


def replace_model(
    session: Session, *, slug: str, payload: ModelReplace, if_match: IfMatch | None
) -> ModelRead:
    """Replace a user architecture if the client holds its current version (and recompute the
    admission decisions of its workloads in the same transaction)."""
    row = _get_row(ModelRepository(session), slug)
    _require_editable(row)
    require_match(if_match, current_version=row.version, what=f"model '{slug}'")
    validated_layer_count(payload)
    apply_model_fields(row, payload)
    flush_versioned(session, what=f"model '{slug}'")
    refresh_model(session, row)
    commit_versioned(session, what=f"model '{slug}'")
    return model_read(row)


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


def create_model(session: Session, *, payload: ModelCreate) -> ModelRead:
    """Validate and store a user's architecture."""
    return model_store.create_model(session, payload=payload)
