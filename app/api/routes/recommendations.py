"""/v1/recommendations: CPU vs GPU vs MIG slice for inference, and the roofline picture."""

from __future__ import annotations

from fastapi import APIRouter, Depends

from app.api.deps import SessionDep, require_reader
from app.api.errors import problem_responses
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
    responses=problem_responses(400, 401, 403, 404, 413, 422),
    summary="Recommend a device, precision and batch size for inference",
)
def recommend_inference(
    payload: InferenceRecommendationRequest, session: SessionDep
) -> InferenceRecommendationResponse:
    """Should the CPU run this model directly, or should the data cross the host link to a GPU
    (or a MIG slice)? Every candidate device and precision is predicted with a calibrated
    per-layer roofline at each batch size (latency, throughput, devices for the target, cost
    per million inferences, energy per inference, fit in memory, what bounds it), the best batch
    per candidate is kept, and the list is ranked by the objective among the candidates that fit
    and meet the SLO; a paragraph says what to run and why. Every figure comes with the inputs
    of its formulas. Nothing is stored."""
    return service.recommend(session, payload=payload)
