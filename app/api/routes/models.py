"""/v1/models: model architectures."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Body, Depends, Path, Query, Request, Response, status

from app.api import examples
from app.api.deps import ComputeDep, DatabaseDep, IfMatchDep, require_reader, require_writer
from app.api.errors import COMPUTE_EXAMPLES, problem_responses
from app.api.params import BatchSizeQuery, ImageSizeQuery, SequenceLengthQuery
from app.domain.precision import Precision
from app.schemas.base import StorableStr
from app.schemas.estimates import ModelSummary
from app.schemas.models import ModelCreate, ModelList, ModelRead, ModelReplace, Provenance
from app.services import estimates as estimates_service
from app.services import models as service
from app.services.concurrency import etag_for

router = APIRouter(prefix="/v1/models", tags=["models"])
SlugPath = Annotated[
    StorableStr, Path(max_length=64, description="Model slug.", examples=[examples.ZOO_MODEL])
]
# PUT and DELETE change user models only: their example is the one POST's example creates.
UserSlugPath = Annotated[
    StorableStr,
    Path(max_length=64, description="Model slug.", examples=[examples.USER_MODEL]),
]
READ = [Depends(require_reader)]
WRITE = [Depends(require_writer)]


@router.get(
    "",
    response_model=ModelList,
    dependencies=READ,
    responses=problem_responses(401, 403, 422, 503),
    summary="List model architectures",
)
async def list_models(
    db: DatabaseDep,
    family: Annotated[
        StorableStr | None, Query(max_length=64, description="Only this architecture family.")
    ] = None,
    provenance: Annotated[
        Provenance | None, Query(description="Only this provenance (builtin, user, ...).")
    ] = None,
    limit: Annotated[int, Query(ge=1, le=500, description="Page size.")] = 50,
    offset: Annotated[int, Query(ge=0, le=1_000_000, description="Items to skip.")] = 0,
) -> ModelList:
    """Architectures ordered by slug, filtered and paginated."""
    return await db.call(
        service.list_models,
        family=family,
        provenance=provenance.value if provenance else None,
        limit=limit,
        offset=offset,
    )


@router.get(
    "/{slug}",
    response_model=ModelRead,
    dependencies=READ,
    responses=problem_responses(401, 403, 404, 422, 503),
    summary="Get a model architecture",
)
async def get_model(slug: SlugPath, db: DatabaseDep, response: Response) -> ModelRead:
    """One architecture; the ETag header carries its version."""
    result = await db.call(service.get_model, slug=slug)
    response.headers["ETag"] = etag_for(result.version)
    return result


@router.post(
    "",
    response_model=ModelRead,
    status_code=status.HTTP_201_CREATED,
    dependencies=WRITE,
    responses=problem_responses(400, 401, 403, 409, 413, 422, 503),
    summary="Create a model architecture",
)
async def create_model(
    payload: Annotated[ModelCreate, Body(openapi_examples=examples.MODEL_CREATE)],
    db: DatabaseDep,
    response: Response,
) -> ModelRead:
    """Validate the layer graph (names, ops, attributes, inputs) and store it."""
    result = await db.call(service.create_model, payload=payload)
    response.headers["ETag"] = etag_for(result.version)
    response.headers["Location"] = f"/v1/models/{result.slug}"
    return result


@router.put(
    "/{slug}",
    response_model=ModelRead,
    dependencies=WRITE,
    responses=problem_responses(400, 401, 403, 404, 409, 412, 413, 422, 428, 503),
    summary="Replace a model architecture",
)
async def replace_model(
    slug: UserSlugPath,
    payload: Annotated[ModelReplace, Body(openapi_examples=examples.MODEL_REPLACE)],
    db: DatabaseDep,
    if_match: IfMatchDep,
    response: Response,
) -> ModelRead:
    """Replace a user architecture; send the ETag you read as If-Match."""
    result = await db.call(service.replace_model, slug=slug, payload=payload, if_match=if_match)
    response.headers["ETag"] = etag_for(result.version)
    return result


@router.delete(
    "/{slug}",
    status_code=status.HTTP_204_NO_CONTENT,
    dependencies=WRITE,
    responses=problem_responses(401, 403, 404, 409, 412, 422, 428, 503),
    summary="Delete a model architecture",
)
async def delete_model(slug: UserSlugPath, db: DatabaseDep, if_match: IfMatchDep) -> Response:
    """Delete a user architecture; send the ETag you read as If-Match."""
    await db.call(service.delete_model, slug=slug, if_match=if_match)
    return Response(status_code=status.HTTP_204_NO_CONTENT)


@router.get(
    "/{slug}/summary",
    response_model=ModelSummary,
    dependencies=READ,
    responses=problem_responses(401, 403, 404, 422, 503, examples=COMPUTE_EXAMPLES),
    summary="Per-layer summary of a model",
)
async def model_summary(
    slug: SlugPath,
    request: Request,
    db: DatabaseDep,
    compute: ComputeDep,
    batch_size: BatchSizeQuery = 1,
    sequence_length: SequenceLengthQuery = None,
    image_size: ImageSizeQuery = None,
    precision: Annotated[
        Precision, Query(description="Precision for the byte figures.")
    ] = Precision.FP32,
) -> ModelSummary:
    """Every executed layer: output shape, parameters, FLOPs and output size, with totals.

    Computed outside the database slots; stopped past CAPPLAN_COMPUTE_TIMEOUT_S (a 422
    `/problems/too-expensive`)."""
    return await compute.call(
        db,
        estimates_service.prepare_summary,
        request,
        slug=slug,
        batch_size=batch_size,
        sequence_length=sequence_length,
        image_size=image_size,
        precision=precision,
    )
