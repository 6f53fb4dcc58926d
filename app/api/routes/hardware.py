"""/v1/hardware: hardware profiles."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Body, Depends, Path, Query, Response, status

from app.api import examples
from app.api.deps import DatabaseDep, IfMatchDep, require_reader, require_writer
from app.api.errors import problem_responses
from app.schemas.base import StorableStr
from app.schemas.hardware import (
    HardwareCreate,
    HardwareKind,
    HardwareList,
    HardwareRead,
    HardwareReplace,
    HardwareSource,
)
from app.services import hardware as service
from app.services.concurrency import etag_for

router = APIRouter(prefix="/v1/hardware", tags=["hardware"])
SlugPath = Annotated[
    StorableStr,
    Path(max_length=64, description="Hardware slug.", examples=[examples.CATALOG_GPU]),
]
# PUT and DELETE change user profiles only: their example is the one POST's example creates.
UserSlugPath = Annotated[
    StorableStr,
    Path(max_length=64, description="Hardware slug.", examples=[examples.USER_HARDWARE]),
]
READ = [Depends(require_reader)]
WRITE = [Depends(require_writer)]


@router.get(
    "",
    response_model=HardwareList,
    dependencies=READ,
    responses=problem_responses(401, 403, 422, 503),
    summary="List hardware profiles",
)
async def list_hardware(
    db: DatabaseDep,
    kind: Annotated[HardwareKind | None, Query(description="Only this device class.")] = None,
    vendor: Annotated[
        StorableStr | None, Query(max_length=64, description="Only this vendor (case-insensitive).")
    ] = None,
    family: Annotated[
        StorableStr | None, Query(max_length=64, description="Only this device family.")
    ] = None,
    source: Annotated[
        HardwareSource | None, Query(description="`catalog` (read-only) or `user`.")
    ] = None,
    mig_capable: Annotated[
        bool | None, Query(description="Only devices with (true) or without (false) MIG.")
    ] = None,
    limit: Annotated[int, Query(ge=1, le=500, description="Page size.")] = 50,
    offset: Annotated[int, Query(ge=0, le=1_000_000, description="Items to skip.")] = 0,
) -> HardwareList:
    """Hardware profiles ordered by slug, filtered and paginated."""
    return await db.call(
        service.list_hardware,
        kind=kind.value if kind else None,
        vendor=vendor,
        family=family,
        source=source.value if source else None,
        mig_capable=mig_capable,
        limit=limit,
        offset=offset,
    )


@router.get(
    "/{slug}",
    response_model=HardwareRead,
    dependencies=READ,
    responses=problem_responses(401, 403, 404, 422, 503),
    summary="Get a hardware profile",
)
async def get_hardware(slug: SlugPath, db: DatabaseDep, response: Response) -> HardwareRead:
    """One hardware profile; the ETag header carries its version."""
    result = await db.call(service.get_hardware, slug=slug)
    response.headers["ETag"] = etag_for(result.version)
    return result


@router.post(
    "",
    response_model=HardwareRead,
    status_code=status.HTTP_201_CREATED,
    dependencies=WRITE,
    responses=problem_responses(400, 401, 403, 409, 413, 422, 503),
    summary="Create a hardware profile",
)
async def create_hardware(
    payload: Annotated[HardwareCreate, Body(openapi_examples=examples.HARDWARE_CREATE)],
    db: DatabaseDep,
    response: Response,
) -> HardwareRead:
    """Store a user-defined hardware profile (the catalog's own entries are read-only)."""
    result = await db.call(service.create_hardware, payload=payload)
    response.headers["ETag"] = etag_for(result.version)
    response.headers["Location"] = f"/v1/hardware/{result.slug}"
    return result


@router.put(
    "/{slug}",
    response_model=HardwareRead,
    dependencies=WRITE,
    responses=problem_responses(400, 401, 403, 404, 409, 412, 413, 422, 428, 503),
    summary="Replace a hardware profile",
)
async def replace_hardware(
    slug: UserSlugPath,
    payload: Annotated[HardwareReplace, Body(openapi_examples=examples.HARDWARE_REPLACE)],
    db: DatabaseDep,
    if_match: IfMatchDep,
    response: Response,
) -> HardwareRead:
    """Replace a user-defined profile; send the ETag you read as If-Match."""
    result = await db.call(service.replace_hardware, slug=slug, payload=payload, if_match=if_match)
    response.headers["ETag"] = etag_for(result.version)
    return result


@router.delete(
    "/{slug}",
    status_code=status.HTTP_204_NO_CONTENT,
    dependencies=WRITE,
    responses=problem_responses(401, 403, 404, 409, 412, 422, 428, 503),
    summary="Delete a hardware profile",
)
async def delete_hardware(slug: UserSlugPath, db: DatabaseDep, if_match: IfMatchDep) -> Response:
    """Delete a user-defined profile; send the ETag you read as If-Match."""
    await db.call(service.delete_hardware, slug=slug, if_match=if_match)
    return Response(status_code=status.HTTP_204_NO_CONTENT)
