"""/v1/estimates: memory footprints."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Body, Depends, Query, Request, Response
from fastapi.exceptions import RequestValidationError
from pydantic import ValidationError

from app.api import examples
from app.api.deps import ComputeDep, DatabaseDep, require_reader
from app.api.errors import COMPUTE_EXAMPLES, problem_responses
from app.api.media import SVG, svg_responses
from app.api.params import ImageSizeQuery, SequenceLengthQuery
from app.domain.precision import Precision
from app.domain.workload import Attention, Checkpointing, Logits, Mode, Optimizer, Runtime
from app.schemas.base import StorableStr
from app.schemas.estimates import MemoryEstimateRequest, MemoryEstimateResponse
from app.services import estimates as service

router = APIRouter(prefix="/v1/estimates", tags=["estimates"])


@router.post(
    "/memory",
    response_model=MemoryEstimateResponse,
    response_model_exclude_none=True,
    dependencies=[Depends(require_reader)],
    responses=problem_responses(400, 401, 403, 404, 413, 422, 503, examples=COMPUTE_EXAMPLES),
    summary="Estimate a memory footprint",
)
async def estimate_memory(
    payload: Annotated[MemoryEstimateRequest, Body(openapi_examples=examples.MEMORY_ESTIMATE)],
    request: Request,
    db: DatabaseDep,
    compute: ComputeDep,
) -> MemoryEstimateResponse:
    """Peak memory per device for training or inference, with a breakdown that adds up to the
    peak, the phase of the peak, and the assumptions behind every line. Nothing is stored.

    The work is bounded: a graph over the work budget is a 422 `/problems/too-expensive`
    naming what to reduce, and so is an estimate stopped at CAPPLAN_COMPUTE_TIMEOUT_S."""
    return await compute.call(
        db, service.prepare_estimate, request, payload=payload, limit_units=compute.budget_units
    )


async def memory_query(
    model: Annotated[
        StorableStr,
        Query(max_length=64, description="Stored model slug.", examples=[examples.ZOO_MODEL]),
    ],
    mode: Annotated[Mode, Query(description="training or inference.", examples=["inference"])],
    batch_size: Annotated[int, Query(ge=1, le=1_048_576, description="Batch size.", examples=[1])],
    sequence_length: SequenceLengthQuery = None,
    decoder_sequence_length: Annotated[
        int | None,
        Query(
            ge=1,
            le=16_777_216,
            description="Encoder-decoder models (T5): binds the decoder's `decoder_seq` "
            "(tokens of decoder_input_ids). Default: sequence_length. A 422 for a model "
            "without a decoder input.",
        ),
    ] = None,
    image_size: ImageSizeQuery = None,
    micro_batch_size: Annotated[
        int | None, Query(ge=1, le=1_048_576, description="Batch per forward pass.")
    ] = None,
    precision: Annotated[
        Precision | None,
        Query(
            description="Precision convention. Default: bf16 (inference) / amp_bf16 "
            "(training) on CUDA, fp16 / amp_fp16 on a GPU below compute capability 8.0, fp32 "
            "on CPU."
        ),
    ] = None,
    optimizer: Annotated[Optimizer | None, Query(description="Optimizer. Default: adamw.")] = None,
    checkpointing: Annotated[
        Checkpointing | None, Query(description="Activation checkpointing. Default: none.")
    ] = None,
    attention: Annotated[
        Attention | None,
        Query(
            description="eager, sdpa_math, flash or mem_efficient. Default: PyTorch SDPA's "
            "choice for the GPU's compute capability (flash on CUDA fp16/bf16 from sm80, "
            "mem_efficient on CUDA fp32 or below sm80, flash on CPU)."
        ),
    ] = None,
    logits: Annotated[
        Logits | None,
        Query(description="Decoder inference: last (default) or all positions."),
    ] = None,
    kv_cache: Annotated[
        bool | None, Query(description="Decoder inference: include the KV cache (default).")
    ] = None,
    hardware: Annotated[
        StorableStr | None,
        Query(
            max_length=100,
            description="Hardware slug, or `slug/profile` for one MIG slice "
            "(nvidia-a100-80gb-sxm/1g.10gb).",
        ),
    ] = None,
    runtime: Annotated[Runtime | None, Query(description="Runtime.")] = None,
) -> MemoryEstimateRequest:
    """The query form of a memory estimate (a 422 naming the query when it is inconsistent)."""
    try:
        return MemoryEstimateRequest.model_validate(
            {
                "model": model,
                "mode": mode,
                "batch_size": batch_size,
                "sequence_length": sequence_length,
                "decoder_sequence_length": decoder_sequence_length,
                "image_size": image_size,
                "micro_batch_size": micro_batch_size,
                "precision": precision,
                "optimizer": optimizer,
                "checkpointing": checkpointing,
                "attention": attention,
                "logits": logits,
                "kv_cache": kv_cache,
                "hardware": hardware,
                "runtime": runtime,
            }
        )
    except ValidationError as exc:
        raise RequestValidationError(
            [{**error, "loc": ("query", *error["loc"])} for error in exc.errors()]
        ) from exc


MemoryQuery = Annotated[MemoryEstimateRequest, Depends(memory_query)]


@router.get(
    "/memory",
    response_model=MemoryEstimateResponse,
    response_model_exclude_none=True,
    dependencies=[Depends(require_reader)],
    responses=problem_responses(401, 403, 404, 422, 503, examples=COMPUTE_EXAMPLES),
    summary="Estimate a memory footprint (query form)",
)
async def estimate_memory_get(
    request: Request, db: DatabaseDep, compute: ComputeDep, payload: MemoryQuery
) -> MemoryEstimateResponse:
    """The same estimate as the POST form for a stored model, for scripts and curl."""
    return await compute.call(
        db, service.prepare_estimate, request, payload=payload, limit_units=compute.budget_units
    )


@router.get(
    "/memory.svg",
    response_class=Response,
    dependencies=[Depends(require_reader)],
    responses=svg_responses(
        "The breakdown as horizontal bars in GiB, with the total and, when "
        "`hardware` is given, a line at its memory.",
        401,
        403,
        404,
        422,
        503,
    ),
    summary="Memory breakdown as an SVG bar chart",
)
async def estimate_memory_svg(
    request: Request, db: DatabaseDep, compute: ComputeDep, payload: MemoryQuery
) -> Response:
    """The query form of a memory estimate drawn as a bar chart (`image/svg+xml`): one bar per
    breakdown line and the peak, labelled in GiB."""
    svg = await compute.call(
        db, service.prepare_memory_chart, request, payload=payload, limit_units=compute.budget_units
    )
    return Response(svg, media_type=SVG)
