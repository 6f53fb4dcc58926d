"""/v1/engines: serving engines' memory at start-up."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Body, Depends, Request

from app.api import examples
from app.api.deps import ComputeDep, DatabaseDep, require_reader
from app.api.errors import problem_responses
from app.schemas.engines import VllmMemoryRequest, VllmMemoryResponse
from app.services import engines as service

router = APIRouter(prefix="/v1/engines", tags=["engines"])


@router.post(
    "/vllm/memory",
    response_model=VllmMemoryResponse,
    response_model_exclude_none=True,
    dependencies=[Depends(require_reader)],
    responses=problem_responses(400, 401, 403, 404, 413, 422, 503),
    summary="vLLM's start-up memory: KV pool, KV tokens, concurrency, start verdict",
)
async def vllm_memory(
    payload: Annotated[VllmMemoryRequest, Body(openapi_examples=examples.VLLM_MEMORY)],
    request: Request,
    db: DatabaseDep,
    compute: ComputeDep,
) -> VllmMemoryResponse:
    """What vLLM 0.19 does at start-up on each GPU of a TP x PP group serving a stored decoder:
    it claims `gpu_memory_utilization` x the memory CUDA shows, loads the weights, profiles one
    forward of `max_num_batched_tokens` tokens (and a sampler run of `max_num_seqs` requests),
    and gives the rest to the paged KV cache. The answer gives each stage's weights, profile
    peak, memory outside the allocator and KV pool, the KV tokens and the concurrency at
    `max_model_len`, and whether the engine starts, with vLLM's own message when it does not.
    Options take vLLM's names and defaults (`defaults_used` lists those filled in). An option
    vLLM refuses is a 422 naming it; nothing is stored."""
    return await compute.call(db, service.prepare_vllm_memory, request, payload=payload)
