"""Rendering of a recommendation candidate's simulated LLM server (decoder serving under TTFT /
TPOT p99 bounds: app.domain.performance.llm_server), its length distributions included."""

from __future__ import annotations

from app.domain.performance.llm_server import LlmServerLoad
from app.domain.performance.request_lengths import (
    LENGTH_SAMPLING,
    LengthDistribution,
    LengthKind,
    LengthSummary,
)
from app.schemas.recommendations import LlmServerRead
from app.schemas.recommendations.lengths import (
    DrawnLengthsRead,
    LengthBin,
    LengthDistributionSpec,
    LengthsSimulatedRead,
)


def llm_server_read(load: LlmServerLoad) -> LlmServerRead:
    """A candidate's simulated LLM server as the answer shows it."""
    return LlmServerRead(
        arrival_rate_per_s=load.arrival_rate_per_s,
        ttft_p99_ms=load.ttft_p99_s * 1e3,
        tpot_p99_ms=load.tpot_p99_s * 1e3,
        ttft_p99_bound_ms=load.ttft_bound_s * 1e3,
        tpot_p99_bound_ms=load.tpot_bound_s * 1e3,
        max_num_seqs=load.max_seqs,
        max_num_batched_tokens=load.max_batched_tokens,
        mean_sequences_in_flight=load.mean_sequences,
        capacity_per_s=load.capacity_per_s,
        requests_simulated=load.requests,
        ttft_p99_doubled_ms=load.ttft_p99_doubled_s * 1e3,
        tpot_p99_doubled_ms=load.tpot_p99_doubled_s * 1e3,
        p99_drift=load.drift,
        stable=load.stable,
        limited_by=load.binding,
        lengths=_lengths_read(load),
        note=load.note(),
    )


def _lengths_read(load: LlmServerLoad) -> LengthsSimulatedRead | None:
    """The simulated requests' length distributions and what they drew (None: the means)."""
    lengths = load.lengths
    if lengths is None or load.prompt_drawn is None or load.generated_drawn is None:
        return None
    assert load.kv_pool_tokens is not None
    assert load.max_num_seqs is not None
    return LengthsSimulatedRead(
        prompt=_drawn_read(lengths.prompt, load.prompt_drawn),
        generated=_drawn_read(lengths.generated, load.generated_drawn),
        kv_pool_tokens=load.kv_pool_tokens,
        max_num_seqs=load.max_num_seqs,
        sampling=LENGTH_SAMPLING,
    )


def _drawn_read(distribution: LengthDistribution, drawn: LengthSummary) -> DrawnLengthsRead:
    lognormal = distribution.kind is LengthKind.LOGNORMAL
    spec = LengthDistributionSpec(
        kind=distribution.kind,
        min_tokens=distribution.min_tokens,
        max_tokens=distribution.max_tokens,
        mean_tokens=distribution.mean_tokens,
        p99_tokens=distribution.p99_tokens,
        sigma=distribution.sigma if lognormal and distribution.p99_tokens is None else None,
        bins=(
            [LengthBin(tokens=t, weight=w) for t, w in distribution.bins]
            if distribution.bins
            else None
        ),
    )
    return DrawnLengthsRead(
        distribution=spec,
        sigma=distribution.sigma if lognormal else None,
        mean_tokens=drawn.mean_tokens,
        p99_tokens=drawn.p99_tokens,
        max_tokens=drawn.max_tokens,
    )
