"""Import use cases: an ONNX file or a Hugging Face config.json becomes a stored model."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, BinaryIO

from pydantic import ValidationError
from sqlalchemy.orm import Session

from app.db.repositories import ModelRepository
from app.importers.hf_config import import_hf_config
from app.importers.result import ImportedGraph, ImportRejected
from app.schemas.imports import (
    HfConfigImport,
    ImportFields,
    ImportReport,
    ModelImportResponse,
    OpMappingRead,
    UnsupportedOpRead,
)
from app.schemas.models import (
    ModelCreate,
    Provenance,
)
from app.services.errors import (
    AlreadyExists,
    ImportFailed,
    InvalidInput,
)
from app.services.model_store import check_quantization, create_model


def _failed(exc: ImportRejected) -> ImportFailed:
    return ImportFailed(exc.detail, kind=exc.kind, pointer=exc.pointer, problems=exc.problems)


def require_free_slug(session: Session, slug: str) -> None:
    """Fail before the (possibly slow) import when the slug is taken."""
    if ModelRepository(session).get(slug) is not None:
        raise AlreadyExists(
            f"a model with slug '{slug}' exists already; pick another slug "
            "or PUT to /v1/models/{slug} to replace yours"
        )


def _store(
    session: Session,
    fields: ImportFields,
    imported: ImportedGraph,
    provenance: Provenance,
    checkpoint: dict[str, Any] | None = None,
) -> ModelImportResponse:
    try:
        payload = ModelCreate.model_validate(
            {
                "slug": fields.slug,
                "name": fields.name or imported.name,
                "family": fields.family or imported.family,
                "description": fields.description or imported.description,
                "inputs": [
                    {
                        "name": decl.name,
                        "shape": list(decl.shape),
                        "dtype": decl.kind.value if decl.kind.value == "int64" else "float",
                    }
                    for decl in imported.inputs
                ],
                "layers": imported.layers,
                "default_bindings": imported.default_bindings,
                **(checkpoint or {}),
            }
        )
    except ValidationError as exc:
        first = exc.errors()[0]
        where = "/".join(str(p) for p in first.get("loc", ()))
        raise ImportFailed(
            f"the imported model is not storable: {where}: {first.get('msg', 'invalid')}",
            kind="invalid-import",
            pointer=f"/{where}",
        ) from exc
    model = create_model(session, payload=payload, provenance=provenance)
    report = ImportReport(
        source="onnx" if provenance is Provenance.ONNX else "hf_config",
        parameter_count=imported.parameter_count,
        source_parameter_count=imported.source_parameter_count,
        reference=imported.reference,
        op_mapping=[
            OpMappingRead(source_op=m.source_op, count=m.count, mapped_to=list(m.mapped_to))
            for m in imported.op_mapping
        ],
        unsupported_ops=[
            UnsupportedOpRead(source_op=u.source_op, count=u.count, nodes=list(u.nodes))
            for u in imported.unsupported
        ],
        assumptions=list(imported.assumptions),
    )
    return ModelImportResponse(model=model, report=report)


def import_hf(session: Session, *, payload: HfConfigImport) -> ModelImportResponse:
    """Build the graph a config.json describes and store it (provenance ``hf_config``)."""
    require_free_slug(session, payload.slug)
    checkpoint = _checkpoint_fields(payload.config)
    try:
        imported = import_hf_config(payload.config, sequence_length=payload.sequence_length)
    except ImportRejected as exc:
        raise _failed(exc) from exc
    return _store(session, payload, imported, Provenance.HF_CONFIG, checkpoint)


# The torch_dtype values a stored model keeps (app.schemas.models.ModelBase.torch_dtype)
_TORCH_DTYPES = ("bfloat16", "float16", "float32")


def _checkpoint_fields(config: Mapping[str, Any]) -> dict[str, Any]:
    """A config.json's ``quantization_config`` (checked as vLLM 0.19 reads it: 422 naming
    ``/config/quantization_config/<key>``) and ``torch_dtype`` (``dtype`` in newer configs), as
    the stored model keeps them; nothing without a ``quantization_config``."""
    quantization = config.get("quantization_config")
    if quantization is None:
        return {}
    if not isinstance(quantization, dict):
        raise InvalidInput(
            "quantization_config must be an object", pointer="/config/quantization_config"
        )
    check_quantization(quantization, "/config/quantization_config")
    dtype = config.get("torch_dtype", config.get("dtype"))
    return {
        "quantization_config": quantization,
        "torch_dtype": dtype if dtype in _TORCH_DTYPES else None,
    }


def map_onnx(data: bytes, *, fields: ImportFields, lenient: bool) -> ImportedGraph:
    """Map an uploaded ONNX model onto a graph; no database needed (it can take seconds, so the
    route runs it outside its database slot)."""
    from app.importers.onnx_model import import_onnx  # the onnx package loads on first use

    try:
        return import_onnx(data, lenient=lenient, sequence_length=fields.sequence_length)
    except ImportRejected as exc:
        raise _failed(exc) from exc


def map_onnx_upload(
    source: BinaryIO, *, limit_bytes: int, fields: ImportFields, lenient: bool
) -> ImportedGraph:
    """Map an uploaded ONNX file (the request's spooled file) onto a graph. The bytes are read
    here and dropped as soon as they are parsed: an import holds the file in memory about twice
    while parsing, then only its graph (``benchmarks/import_memory.py``)."""
    from app.importers.onnx_model import import_onnx_read  # the onnx package loads on first use

    def read() -> bytes:
        source.seek(0)
        data = source.read(limit_bytes + 1)
        if len(data) > limit_bytes:  # the body-size middleware stops larger bodies first
            raise ImportFailed(
                f"the file exceeds {limit_bytes} bytes (CAPPLAN_MAX_IMPORT_BYTES)",
                kind="invalid-onnx",
                pointer="/file",
            )
        return data

    try:
        return import_onnx_read(read, lenient=lenient, sequence_length=fields.sequence_length)
    except ImportRejected as exc:
        raise _failed(exc) from exc


def store_onnx(
    session: Session, *, fields: ImportFields, imported: ImportedGraph
) -> ModelImportResponse:
    """Store a mapped ONNX graph (provenance ``onnx``); a slug taken meanwhile is a 409."""
    return _store(session, fields, imported, Provenance.ONNX)


def import_onnx_bytes(
    session: Session, *, data: bytes, fields: ImportFields, lenient: bool
) -> ModelImportResponse:
    """Map an uploaded ONNX model onto a graph and store it, in one session (scripts)."""
    require_free_slug(session, fields.slug)
    imported = map_onnx(data, fields=fields, lenient=lenient)
    return store_onnx(session, fields=fields, imported=imported)
