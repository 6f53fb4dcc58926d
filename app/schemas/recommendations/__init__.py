"""Inference recommendation contract: CPU vs GPU vs MIG slice, with the roofline behind it.

By concept: :mod:`.request` (what is asked), :mod:`.prediction` (how one candidate's figures
were computed) and :mod:`.response` (the ranked answer); every class is importable from here.
"""

from app.schemas.recommendations.prediction import (
    DecoderServingRead,
    LlmServerRead,
    PhaseRead,
    PipelinePhaseRead,
    PipelineRead,
    PipelineStageRead,
    RooflineInputs,
    ServerScenarioRead,
    TimeShares,
)
from app.schemas.recommendations.request import (
    CANDIDATE_PATTERN,
    MAX_BATCH_SIZES,
    MAX_DEVICES,
    MAX_SEARCH_BATCH,
    CalibrationOverride,
    CandidateName,
    InferenceRecommendationRequest,
    PriceUsdPerHour,
)
from app.schemas.recommendations.response import (
    CalibrationRead,
    Exclusion,
    InferenceRecommendationResponse,
    RankedCandidate,
    WorkloadSummary,
)

__all__ = [
    "CANDIDATE_PATTERN",
    "MAX_BATCH_SIZES",
    "MAX_DEVICES",
    "MAX_SEARCH_BATCH",
    "CalibrationOverride",
    "CalibrationRead",
    "CandidateName",
    "DecoderServingRead",
    "Exclusion",
    "InferenceRecommendationRequest",
    "InferenceRecommendationResponse",
    "LlmServerRead",
    "PhaseRead",
    "PipelinePhaseRead",
    "PipelineRead",
    "PipelineStageRead",
    "PriceUsdPerHour",
    "RankedCandidate",
    "RooflineInputs",
    "ServerScenarioRead",
    "TimeShares",
    "WorkloadSummary",
]
