"""/v1/models/import: models from ONNX files and Hugging Face config.json."""

from __future__ import annotations

import functools
from typing import Annotated

import anyio.to_thread
from fastapi import APIRouter, Body, Depends, File, Form, Response, UploadFile, status

from app.api import examples
from app.api.deps import DatabaseDep, SettingsDep, require_writer
from app.api.errors import IMPORT_TOO_LARGE_EXAMPLES, problem_responses
from app.schemas.base import SLUG_PATTERN, StorableStr
from app.schemas.imports import HfConfigImport, ImportFields, ModelImportResponse
from app.services import imports as service
from app.services.concurrency import etag_for

router = APIRouter(
    prefix="/v1/models/import", tags=["models"], dependencies=[Depends(require_writer)]
)
ONNX_PATH = "/v1/models/import/onnx"


def _created(result: ModelImportResponse, response: Response) -> ModelImportResponse:
    response.headers["ETag"] = etag_for(result.model.version)
    response.headers["Location"] = f"/v1/models/{result.model.slug}"
    return result


@router.post(
    "/hf-config",
    response_model=ModelImportResponse,
    status_code=status.HTTP_201_CREATED,
    responses=problem_responses(400, 401, 403, 409, 413, 422, 503),
    summary="Import a model from a Hugging Face config.json",
)
async def import_hf_config(
    payload: Annotated[HfConfigImport, Body(openapi_examples=examples.HF_CONFIG_IMPORT)],
    db: DatabaseDep,
    response: Response,
) -> ModelImportResponse:
    """Build the layer graph a `config.json` describes (nothing is downloaded) and store it
    with provenance `hf_config`. Parameter counts equal the transformers class named in
    `report.reference` (decoders: `*ForCausalLM`; BERT/RoBERTa: `*Model` with pooler; ViT:
    `ViTModel` with pooler, or `ViTForImageClassification` when `architectures` names it; T5:
    `T5EncoderModel`). An unknown `model_type` is a 422 listing the supported ones."""
    return _created(await db.call(service.import_hf, payload=payload), response)


@router.post(
    "/onnx",
    response_model=ModelImportResponse,
    status_code=status.HTTP_201_CREATED,
    responses=problem_responses(
        400, 401, 403, 409, 413, 422, 503, examples={413: IMPORT_TOO_LARGE_EXAMPLES}
    ),
    summary="Import a model from an ONNX file (multipart upload)",
)
async def import_onnx(
    db: DatabaseDep,
    settings: SettingsDep,
    response: Response,
    file: Annotated[
        UploadFile,
        File(
            description="The `.onnx` file. Weights are optional: initializers that refer to "
            "external data (never opened) or carry no data are sized from their dims.",
            examples=["model.onnx"],
        ),
    ],
    slug: Annotated[
        str,
        Form(
            pattern=SLUG_PATTERN,
            min_length=1,
            max_length=64,
            description="Slug of the stored model.",
            examples=["my-resnet"],
        ),
    ],
    name: Annotated[
        StorableStr | None,
        Form(
            min_length=1,
            max_length=200,
            description="Display name; default: the ONNX graph name.",
            examples=["My ResNet"],
        ),
    ] = None,
    family: Annotated[
        str | None,
        Form(
            max_length=64,
            pattern=r"^[a-z0-9][a-z0-9_-]*$",
            description="Family for filtering; default `onnx`.",
            examples=["cnn"],
        ),
    ] = None,
    description: Annotated[
        StorableStr | None,
        Form(max_length=4000, description="Free-form description.", examples=[None]),
    ] = None,
    sequence_length: Annotated[
        int | None,
        Form(
            ge=1,
            le=1_048_576,
            description="Default `seq` binding when token-id inputs "
            "have a symbolic sequence axis (default 128).",
            examples=[512],
        ),
    ] = None,
    lenient: Annotated[
        bool,
        Form(
            description="Import unsupported ops as shape-preserving layers with no "
            "parameters instead of answering 422.",
            examples=[False],
        ),
    ] = False,
) -> ModelImportResponse:
    """Parse the ONNX graph in memory (never from a path), run ONNX shape inference, map its
    operators onto the layer graph, and store it with provenance `onnx`. The graph's parameter
    count must equal the initializers' (else 422). Unsupported ops are a 422 listing them,
    unless `lenient`. The planner needs shapes, not weights: a graph-only export (initializers
    without data, or pointing at an external data file that is not uploaded) imports the same.
    Uploads over CAPPLAN_MAX_IMPORT_BYTES are a 413; garbage, truncated files, absurd sizes and
    cyclic graphs (`cyclic-onnx-graph`, naming the cycle) are a 422. An import needs about 2.75
    times its upload in memory: an upload is read only once CAPPLAN_MAX_CONCURRENT_IMPORTS and
    CAPPLAN_IMPORT_MEMORY_BYTES leave room for it (a 503 with Retry-After after
    CAPPLAN_IMPORT_QUEUE_TIMEOUT_S), and one that needs more than CAPPLAN_IMPORT_MEMORY_BYTES
    alone is a 413."""
    fields = ImportFields(
        slug=slug,
        name=name,
        family=family,
        description=description,
        sequence_length=sequence_length,
    )
    await db.call(service.require_free_slug, slug)  # fail fast, before the slow mapping
    # Parsing and mapping can take seconds of CPU: done outside any database slot. The file is
    # read from its spool there, so that nothing else holds its bytes once they are parsed.
    imported = await anyio.to_thread.run_sync(
        functools.partial(
            service.map_onnx_upload,
            file.file,
            limit_bytes=settings.max_import_bytes,
            fields=fields,
            lenient=lenient,
        )
    )
    result = await db.call(service.store_onnx, fields=fields, imported=imported)
    return _created(result, response)
