"""/v1/workloads: saved questions (model + how it runs)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Body, Depends, Path, Query, Request, Response, status

from app.api import examples
from app.api.deps import ComputeDep, DatabaseDep, IfMatchDep, require_reader, require_writer
from app.api.errors import COMPUTE_EXAMPLES, problem_responses
from app.domain.workload import Mode
from app.schemas.base import StorableStr
from app.schemas.estimates import MemoryEstimateResponse
from app.schemas.workloads import WorkloadCreate, WorkloadList, WorkloadRead, WorkloadReplace
from app.services import workloads as service
from app.services.concurrency import etag_for

router = APIRouter(prefix="/v1/workloads", tags=["workloads"])
SlugPath = Annotated[
    StorableStr, Path(max_length=64, description="Workload slug.", examples=["chat-serving"])
]
READ = [Depends(require_reader)]
WRITE = [Depends(require_writer)]


@router.get(
    "",
    response_model=WorkloadList,
    dependencies=READ,
    responses=problem_responses(401, 403, 422, 503),
    summary="List workloads",
)
async def list_workloads(
    db: DatabaseDep,
    model: Annotated[
        StorableStr | None, Query(max_length=64, description="Only this model.")
    ] = None,
    mode: Annotated[Mode | None, Query(description="Only this mode.")] = None,
    limit: Annotated[int, Query(ge=1, le=500, description="Page size.")] = 50,
    offset: Annotated[int, Query(ge=0, le=1_000_000, description="Items to skip.")] = 0,
) -> WorkloadList:
    """Workloads ordered by slug, filtered and paginated."""
    return await db.call(
        service.list_workloads,
        model=model,
        mode=mode.value if mode else None,
        limit=limit,
        offset=offset,
    )


@router.get(
    "/{slug}",
    response_model=WorkloadRead,
    dependencies=READ,
    responses=problem_responses(401, 403, 404, 422, 503),
    summary="Get a workload",
)
async def get_workload(slug: SlugPath, db: DatabaseDep, response: Response) -> WorkloadRead:
    """One workload; the ETag header carries its version."""
    result = await db.call(service.get_workload, slug=slug)
    response.headers["ETag"] = etag_for(result.version)
    return result


@router.get(
    "/{slug}/memory",
    response_model=MemoryEstimateResponse,
    response_model_exclude_none=True,
    dependencies=READ,
    responses=problem_responses(401, 403, 404, 422, 503, examples=COMPUTE_EXAMPLES),
    summary="Memory footprint of a workload",
)
async def workload_memory(
    slug: SlugPath, request: Request, db: DatabaseDep, compute: ComputeDep
) -> MemoryEstimateResponse:
    """The memory estimate of the workload on its target hardware (if it names one).

    Bounded like `POST /v1/estimates/memory`: a 422 `/problems/too-expensive` over the work
    budget or past CAPPLAN_COMPUTE_TIMEOUT_S."""
    return await compute.call(
        db, service.prepare_workload_memory, request, slug=slug, limit_units=compute.budget_units
    )


@router.post(
    "",
    response_model=WorkloadRead,
    status_code=status.HTTP_201_CREATED,
    dependencies=WRITE,
    responses=problem_responses(400, 401, 403, 404, 409, 413, 422, 503),
    summary="Create a workload",
)
async def create_workload(
    payload: Annotated[WorkloadCreate, Body(openapi_examples=examples.WORKLOAD_CREATE)],
    db: DatabaseDep,
    response: Response,
) -> WorkloadRead:
    """Store a workload after checking that its model exists and that it can be estimated.

    `hardware` may name one MIG slice, `slug/profile`: a 404 when the GPU has no such profile
    (or no MIG), naming the valid ones."""
    result = await db.call(service.create_workload, payload=payload)
    response.headers["ETag"] = etag_for(result.version)
    response.headers["Location"] = f"/v1/workloads/{result.slug}"
    return result


@router.put(
    "/{slug}",
    response_model=WorkloadRead,
    dependencies=WRITE,
    responses=problem_responses(400, 401, 403, 404, 412, 413, 422, 428, 503),
    summary="Replace a workload",
)
async def replace_workload(
    slug: SlugPath,
    payload: Annotated[WorkloadReplace, Body(openapi_examples=examples.WORKLOAD_REPLACE)],
    db: DatabaseDep,
    if_match: IfMatchDep,
    response: Response,
) -> WorkloadRead:
    """Replace a workload; send the ETag you read as If-Match."""
    result = await db.call(service.replace_workload, slug=slug, payload=payload, if_match=if_match)
    response.headers["ETag"] = etag_for(result.version)
    return result


@router.delete(
    "/{slug}",
    status_code=status.HTTP_204_NO_CONTENT,
    dependencies=WRITE,
    responses=problem_responses(401, 403, 404, 412, 422, 428, 503),
    summary="Delete a workload",
)
async def delete_workload(slug: SlugPath, db: DatabaseDep, if_match: IfMatchDep) -> Response:
    """Delete a workload; send the ETag you read as If-Match."""
    await db.call(service.delete_workload, slug=slug, if_match=if_match)
    return Response(status_code=status.HTTP_204_NO_CONTENT)
