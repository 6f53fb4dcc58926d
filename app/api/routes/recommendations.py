"""/v1/recommendations: CPU vs GPU vs MIG slice for inference, and the roofline picture."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Body, Depends, Query, Request, Response

from app.api import examples
from app.api.deps import ComputeDep, DatabaseDep, require_reader
from app.api.errors import COMPUTE_EXAMPLES, problem_responses
from app.api.media import SVG, svg_responses
from app.api.params import BatchSizeQuery, ImageSizeQuery, SequenceLengthQuery
from app.domain.precision import Precision
from app.schemas.base import StorableStr
from app.schemas.recommendations import (
    InferenceRecommendationRequest,
    InferenceRecommendationResponse,
)
from app.services import recommendations as service

router = APIRouter(
    prefix="/v1/recommendations", tags=["recommendations"], dependencies=[Depends(require_reader)]
)


@router.post(
    "/inference",
    response_model=InferenceRecommendationResponse,
    response_model_exclude_none=True,
    responses=problem_responses(400, 401, 403, 404, 413, 422, 503, examples=COMPUTE_EXAMPLES),
    summary="Recommend a device, precision and batch size for inference",
)
async def recommend_inference(
    payload: Annotated[
        InferenceRecommendationRequest, Body(openapi_examples=examples.RECOMMENDATION)
    ],
    request: Request,
    db: DatabaseDep,
    compute: ComputeDep,
) -> InferenceRecommendationResponse:
    """Should the CPU run this model directly, or should the data cross the host link to a GPU
    (or a MIG slice)? Every candidate device and precision is predicted with a calibrated
    per-layer roofline at each batch size (latency, throughput, devices for the target, cost
    per million inferences, energy per inference, fit in memory, what bounds it), the best batch
    per candidate is kept, and the list is ranked by the objective among the candidates that fit
    and meet the SLO; a paragraph says what to run and why. Every figure comes with the inputs
    of its formulas. Nothing is stored.

    The work is bounded: graph layers x devices x precisions x batch sizes over
    CAPPLAN_MAX_WORK_UNITS is a 422 `/problems/too-expensive` naming what to reduce (nothing is
    computed), and a computation still running at CAPPLAN_COMPUTE_TIMEOUT_S is stopped and
    answered with the same problem type."""
    return await compute.call(
        db, service.prepare_recommend, request, payload=payload, limit_units=compute.budget_units
    )


@router.get(
    "/roofline.svg",
    response_class=Response,
    responses=svg_responses(
        "A log-log roofline per device (calibrated solid, catalog dashed) "
        "with its ridge point, and the model's kernels as points.",
        401,
        403,
        404,
        422,
        503,
    ),
    summary="Roofline chart of a model on devices (SVG)",
)
async def roofline_svg(
    request: Request,
    db: DatabaseDep,
    compute: ComputeDep,
    model: Annotated[
        StorableStr,
        Query(max_length=64, description="Stored model slug.", examples=["resnet-50"]),
    ],
    devices: Annotated[
        StorableStr,
        Query(
            min_length=1,
            max_length=800,
            description="Comma-separated hardware slugs or `slug/profile` MIG slices (at most 8).",
            examples=["intel-xeon-platinum-8480plus,nvidia-a10,nvidia-a100-80gb-sxm/1g.10gb"],
        ),
    ],
    precision: Annotated[Precision, Query(description="Precision.")] = Precision.INT8,
    batch_size: BatchSizeQuery = 1,
    sequence_length: SequenceLengthQuery = None,
    image_size: ImageSizeQuery = None,
    prompt_tokens: Annotated[
        int, Query(ge=1, le=16_777_216, description="Decoders: prompt tokens.")
    ] = 512,
    generated_tokens: Annotated[
        int, Query(ge=1, le=16_777_216, description="Decoders: generated tokens.")
    ] = 128,
) -> Response:
    """The roofline of each named device at the precision (`image/svg+xml`): attainable FLOP/s
    against operational intensity on log-log axes, the calibrated roof solid and the catalog
    roof dashed, each ridge point marked and labelled, and every kernel of the model (decoders:
    prefill dots, decode triangles) at its intensity and achieved rate including launch
    overhead. Devices that lack the precision are listed in the subtitle."""
    names = [name.strip() for name in devices.split(",") if name.strip()]
    svg = await compute.call(
        db,
        service.prepare_roofline_chart,
        request,
        limit_units=compute.budget_units,
        model=model,
        devices=names,
        precision=precision,
        batch_size=batch_size,
        sequence_length=sequence_length,
        image_size=image_size,
        prompt_tokens=prompt_tokens,
        generated_tokens=generated_tokens,
    )
    return Response(svg, media_type=SVG)
