"""Storing model architectures: shared by the models and imports use cases."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from app.db.models import ModelArchitecture, utcnow
from app.db.repositories import ModelRepository
from app.domain.engines.quant_schemes import checkpoint_layout
from app.domain.engines.vllm import EngineInputError
from app.domain.errors import GraphError
from app.domain.graph.format import validate_graph
from app.domain.quantization import CheckpointLayout
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


def check_quantization(config: Mapping[str, Any] | None, pointer: str) -> None:
    """A checkpoint's ``quantization_config`` as vLLM 0.19 reads it (422 naming
    ``<pointer>/<key>`` when it refuses it; app.domain.engines.quant_schemes)."""
    if config is None:
        return
    try:
        checkpoint_layout(config)
    except EngineInputError as exc:
        where = exc.field.removeprefix("quantization_config").lstrip("/")
        raise InvalidInput(str(exc), pointer=f"{pointer}/{where}" if where else pointer) from exc


def apply_model_fields(target: ModelArchitecture, fields: ModelBase) -> None:
    """Copy every client-supplied field onto the ORM row."""
    check_quantization(fields.quantization_config, "/quantization_config")
    target.name = fields.name
    target.family = fields.family
    target.description = fields.description
    target.inputs = [spec.model_dump() for spec in fields.inputs]
    target.layers = fields.layers
    target.default_bindings = dict(fields.default_bindings)
    target.quantization_config = fields.quantization_config
    target.torch_dtype = fields.torch_dtype
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
            "quantization_config": row.quantization_config,
            "torch_dtype": row.torch_dtype,
            "provenance": row.provenance,
            "layer_count": validate_graph(row.layers, names).layer_count,
            "version": row.version,
            "created_at": row.created_at,
            "updated_at": row.updated_at,
        }
    )


@dataclass(frozen=True, slots=True)
class StoredCheckpoint:
    """A stored model's pre-quantized checkpoint: its ``quantization_config`` as given, how it
    stores its linears (app.domain.engines.quant_schemes.checkpoint_layout) and its
    ``torch_dtype`` (None: not stated)."""

    config: dict[str, Any]
    layout: CheckpointLayout
    torch_dtype: str | None


def stored_checkpoint(row: ModelArchitecture) -> StoredCheckpoint | None:
    """The row's checkpoint quantization (checked when written; a row a client wrote past the
    API that vLLM's reading refuses is a 422 naming ``/model``)."""
    config = row.quantization_config
    if config is None:
        return None
    try:
        layout = checkpoint_layout(config)
    except EngineInputError as exc:
        raise InvalidInput(
            f"model '{row.slug}' stores a quantization_config vLLM refuses: {exc}",
            pointer="/model",
        ) from exc
    return StoredCheckpoint(config, layout, row.torch_dtype)


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
