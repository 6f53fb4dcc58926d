"""Storing model architectures: shared by the models and imports use cases."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from app.db.models import ModelArchitecture, utcnow
from app.db.repositories import ModelRepository
from app.domain.errors import GraphError
from app.domain.graph.format import validate_graph
from app.schemas.models import (
    ModelBase,
    ModelCreate,
    ModelRead,
)
from app.schemas.models import Provenance as ProvenanceEnum
from app.services.errors import AlreadyExists, InvalidInput


def validated_layer_count(fields: ModelBase) -> int:
    names = [spec.name for spec in fields.inputs]
    if len(set(names)) != len(names):
        raise InvalidInput("input names must be unique", pointer="/inputs")
    try:
        return validate_graph(fields.layers, names).layer_count
    except GraphError as exc:
        raise invalid_graph(exc, fields.layers) from exc


def _layer_path(layers: Sequence[Any], name: str) -> str | None:
    """``3`` or ``0/layers/1`` (a block's layer): where the layer named ``name`` sits."""
    for index, layer in enumerate(layers):
        if not isinstance(layer, Mapping):
            continue
        if layer.get("name") == name:
            return str(index)
        inner = layer.get("layers")
        if isinstance(inner, list):
            found = _layer_path(inner, name)
            if found is not None:
                return f"{index}/layers/{found}"
    return None


def invalid_graph(exc: GraphError, layers: Sequence[Any] = ()) -> InvalidInput:
    """A 422-mapped error pointing at the layer (by its index in ``layers``; by name when it
    is not there) and the field at fault."""
    if exc.layer is not None:
        where = _layer_path(layers, exc.layer) or exc.layer
        pointer = f"/layers/{where}/{exc.field}" if exc.field else f"/layers/{where}"
    else:
        pointer = "/" + (exc.field or "layers").replace(".", "/").replace("[", "/").replace("]", "")
    return InvalidInput(str(exc), pointer=pointer)


def apply_model_fields(target: ModelArchitecture, fields: ModelBase) -> None:
    """Copy every client-supplied field onto the ORM row."""
    target.name = fields.name
    target.family = fields.family
    target.description = fields.description
    target.inputs = [spec.model_dump() for spec in fields.inputs]
    target.layers = fields.layers
    target.default_bindings = dict(fields.default_bindings)
    target.updated_at = utcnow()


def model_read(row: ModelArchitecture) -> ModelRead:
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


def create_model(
    session: Session, *, payload: ModelCreate, provenance: ProvenanceEnum = ProvenanceEnum.USER
) -> ModelRead:
    """Validate and store an architecture."""
    validated_layer_count(payload)
    repo = ModelRepository(session)
    if repo.get(payload.slug) is not None:
        raise AlreadyExists(
            f"a model with slug '{payload.slug}' exists already; pick another slug "
            "or PUT to /v1/models/{slug} to replace yours"
        )
    row = ModelArchitecture(slug=payload.slug, provenance=provenance.value, created_at=utcnow())
    apply_model_fields(row, payload)
    session.add(row)
    try:
        session.commit()
    except IntegrityError as exc:
        session.rollback()
        raise AlreadyExists(f"a model with slug '{payload.slug}' exists already") from exc
    return model_read(row)
