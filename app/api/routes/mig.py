"""/v1/mig: MIG profiles, fit checks, layout validation and partition plans."""

from __future__ import annotations

import functools
from typing import Annotated

from fastapi import APIRouter, Body, Depends, Path, Request, Response

from app.api import examples
from app.api.deps import ComputeDep, DatabaseDep, require_reader
from app.api.errors import COMPUTE_EXAMPLES, problem_responses
from app.config import Settings
from app.schemas.base import StorableStr
from app.schemas.mig import (
    LayoutValidateRequest,
    LayoutValidateResponse,
    MigFitRequest,
    MigFitResponse,
    MigPlanRequest,
    MigPlanResponse,
    MigProfileList,
)
from app.services import mig as service
from app.services.state_cache import read_digest, staleness_of, watch_for

router = APIRouter(tags=["mig"], dependencies=[Depends(require_reader)])


@router.get(
    "/v1/hardware/{slug}/mig-profiles",
    response_model=MigProfileList,
    responses=problem_responses(401, 403, 404, 422, 503),
    summary="MIG profiles of a GPU",
)
async def mig_profiles(
    slug: Annotated[
        StorableStr,
        Path(max_length=64, description="Hardware slug.", examples=[examples.CATALOG_GPU]),
    ],
    db: DatabaseDep,
) -> MigProfileList:
    """Every profile with usable memory in bytes and MiB, slices, placements and the
    Kubernetes resource name."""
    return await db.call(service.list_profiles, slug=slug)


@router.post(
    "/v1/mig/fit",
    response_model=MigFitResponse,
    response_model_exclude_none=True,
    responses=problem_responses(400, 401, 403, 404, 413, 422, 503, examples=COMPUTE_EXAMPLES),
    summary="Which MIG profiles can host a workload",
)
async def mig_fit(
    payload: Annotated[MigFitRequest, Body(openapi_examples=examples.MIG_FIT)],
    request: Request,
    db: DatabaseDep,
    compute: ComputeDep,
) -> Response:
    """For every profile of the GPU: required bytes (memory estimate + CUDA context + safety
    margin, each a named line), usable bytes, headroom, fits, limiting factor; the smallest
    fitting profile (fewest compute slices, then least memory); and, when none fits, the
    full GPU, larger catalog GPUs, and the largest batch that fits the biggest profile.

    Answers are cached per request while the planning data (hardware, models, workloads) is
    unchanged: a change through this process shows in the next answer, a change through
    another process or replica within CAPPLAN_CACHE_STALENESS_S (1 s).

    The work is bounded (graph layers x estimates of the batch search, CAPPLAN_MAX_WORK_UNITS;
    CAPPLAN_COMPUTE_TIMEOUT_S): a 422 `/problems/too-expensive` past either."""
    settings: Settings = request.app.state.settings  # (a dependency costs more than a hit)
    watch = watch_for(request.app.state.session_factory, staleness_of(settings))
    cache = service.FITS.of(watch)
    key = payload.model_dump_json()
    cached = cache.get(key, await watch.generation(lambda: db.run(read_digest)))
    if cached is not None:
        # Rendered once by the service from a MigFitResponse: no second validation here.
        return Response(cached, media_type="application/json")
    local = watch.local  # before computing: a commit meanwhile makes the entry stale
    render, digest, read_at = await db.run(
        functools.partial(
            service.prepare_fit_with_digest, payload=payload, limit_units=compute.budget_units
        )
    )
    body = await compute.run(render, request=request)
    watch.observe(digest, read_at)
    cache.put(key, (digest, local), body)
    return Response(body, media_type="application/json")


@router.post(
    "/v1/mig/layouts/validate",
    response_model=LayoutValidateResponse,
    responses=problem_responses(400, 401, 403, 404, 413, 422, 503),
    summary="Validate a MIG layout",
)
async def mig_validate_layout(
    payload: Annotated[LayoutValidateRequest, Body(openapi_examples=examples.MIG_LAYOUT)],
    db: DatabaseDep,
) -> LayoutValidateResponse:
    """Valid, or every rule broken: unknown profile, bad start, out of range, overlapping
    memory slices, count over the profile's maximum, too many instances, compute slices over
    the GPU's total."""
    return await db.call(service.validate_layout, payload=payload)


@router.post(
    "/v1/mig/plan",
    response_model=MigPlanResponse,
    responses=problem_responses(400, 401, 403, 404, 413, 422, 503, examples=COMPUTE_EXAMPLES),
    summary="Plan MIG partitions for a set of workloads",
)
async def mig_plan(
    payload: Annotated[MigPlanRequest, Body(openapi_examples=examples.MIG_PLAN)],
    request: Request,
    db: DatabaseDep,
    compute: ComputeDep,
) -> MigPlanResponse:
    """The fewest GPUs of the model that host every replica (profiles given, or sized by a
    fit check), each with an explicit valid layout and its unused capacity, plus a
    ready-to-apply NVIDIA mig-parted config. The same request always gives the same plan."""
    return await compute.call(
        db, service.prepare_plan, request, payload=payload, limit_units=compute.budget_units
    )
