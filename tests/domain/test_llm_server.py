"""Decoder serving under load: continuous batching's TTFT / TPOT percentiles (golden numbers
derived by hand from the scheduler's rules, and the stability the answer claims)."""

from __future__ import annotations

import math
from typing import Any

import pytest

from app.domain.performance.llm_server import (
    MIN_REQUESTS,
    STABLE_RELATIVE,
    IterationCost,
    IterationTiming,
    LlmServerShape,
    LlmServingInputError,
    capacity_per_s,
    llm_server_throughput,
    simulate,
)

# Prefill of n prompts: 5 ms + 20 ms each; decode step of n sequences: 10 ms + 0.2 ms each.
TIMINGS = [
    IterationTiming(sequences=n, prefill_s=0.005 + 0.02 * n, decode_step_s=0.010 + 0.0002 * n)
    for n in (1, 2, 4, 8, 16, 32, 64)
]
SHAPE = LlmServerShape(
    prompt_tokens=512, generated_tokens=128, max_seqs=64, max_batched_tokens=8192
)


def test_iteration_cost_interpolates_the_timed_points() -> None:
    cost = IterationCost(TIMINGS, prompt_tokens=512)
    assert cost.decode_s(0) == 0.0
    assert cost.decode_s(4) == pytest.approx(0.0108)
    assert cost.decode_s(6) == pytest.approx(0.0112)  # halfway between 4 and 8
    assert cost.decode_s(128) == pytest.approx(0.010 + 0.0002 * 128)  # the last slope above
    # prefill by tokens: 1 prompt = 512 tokens -> 25 ms; 768 tokens halfway to 2 prompts (45 ms)
    assert cost.prefill_s(512) == pytest.approx(0.025)
    assert cost.prefill_s(768) == pytest.approx(0.035)
    assert cost.prefill_s(100) == pytest.approx(0.025)  # below the smallest: its time
    assert cost.iteration_s(8, 1024) == pytest.approx(0.0116 + 0.045)


def test_a_lone_request_sees_its_prefill_then_one_decode_step_per_token() -> None:
    # At a vanishing rate every request is alone: TTFT = one iteration of its 512 prompt
    # tokens (25 ms), then 127 decode steps of one sequence (10.2 ms each).
    cost = IterationCost(TIMINGS, prompt_tokens=512)
    run = simulate(cost, SHAPE, rate_per_s=1e-3, requests=200)
    assert run.ttft_p99_s == pytest.approx(0.025)
    assert run.tpot_p99_s == pytest.approx(0.0102)
    assert run.ttft_mean_s == pytest.approx(0.025)
    assert run.tpot_mean_s == pytest.approx(0.0102)


def test_a_prompt_longer_than_the_token_budget_is_prefilled_in_chunks() -> None:
    # 512 prompt tokens, 200 per iteration: chunks of 200, 200, 112 -> three iterations
    # priced at prefill_s(200), prefill_s(200), prefill_s(112): all below one prompt, 25 ms each.
    shape = LlmServerShape(
        prompt_tokens=512, generated_tokens=2, max_seqs=4, max_batched_tokens=200
    )
    cost = IterationCost(TIMINGS, prompt_tokens=512)
    run = simulate(cost, shape, rate_per_s=1e-3, requests=200)
    assert run.ttft_p99_s == pytest.approx(3 * 0.025)
    assert run.tpot_p99_s == pytest.approx(0.0102)


def test_capacity_is_prefill_plus_decode_steps_at_full_concurrency() -> None:
    cost = IterationCost(TIMINGS, prompt_tokens=512)
    per_request_s = 0.025 + 127 * (0.010 + 0.0002 * 64) / 64
    assert capacity_per_s(cost, SHAPE) == pytest.approx(1 / per_request_s)


@pytest.mark.parametrize(("ttft_ms", "tpot_ms"), [(2000, 200), (500, 20), (200, 15), (1000, 40)])
def test_the_answer_meets_both_bounds_and_doubling_the_arrivals_moves_it_under_5_percent(
    ttft_ms: float, tpot_ms: float
) -> None:
    load = llm_server_throughput(
        TIMINGS, SHAPE, ttft_bound_s=ttft_ms / 1e3, tpot_bound_s=tpot_ms / 1e3
    )
    assert load is not None
    assert load.stable
    assert load.ttft_p99_s <= ttft_ms / 1e3
    assert load.tpot_p99_s <= tpot_ms / 1e3
    assert 0 < load.arrival_rate_per_s <= load.capacity_per_s
    assert load.requests == MIN_REQUESTS
    cost = IterationCost(TIMINGS, prompt_tokens=512)
    doubled = simulate(cost, SHAPE, rate_per_s=load.arrival_rate_per_s, requests=2 * MIN_REQUESTS)
    assert doubled.ttft_p99_s == load.ttft_p99_doubled_s
    assert doubled.tpot_p99_s == load.tpot_p99_doubled_s
    for answer, again in (
        (load.ttft_p99_s, doubled.ttft_p99_s),
        (load.tpot_p99_s, doubled.tpot_p99_s),
    ):
        assert abs(answer - again) / max(answer, again) < STABLE_RELATIVE
    assert load.binding in {"ttft", "tpot", "capacity", "stability"}


def test_a_tighter_tpot_bound_gives_a_lower_rate() -> None:
    loose = llm_server_throughput(TIMINGS, SHAPE, ttft_bound_s=2.0, tpot_bound_s=0.2)
    tight = llm_server_throughput(TIMINGS, SHAPE, ttft_bound_s=2.0, tpot_bound_s=0.015)
    assert loose is not None
    assert tight is not None
    assert tight.arrival_rate_per_s < loose.arrival_rate_per_s
    assert tight.tpot_p99_s <= 0.015


def test_a_bound_a_lone_request_misses_has_no_rate() -> None:
    # one decode step of one sequence takes 10.2 ms
    assert llm_server_throughput(TIMINGS, SHAPE, ttft_bound_s=2.0, tpot_bound_s=0.010) is None
    # the prefill of one prompt takes 25 ms
    assert llm_server_throughput(TIMINGS, SHAPE, ttft_bound_s=0.020, tpot_bound_s=0.2) is None


def test_fewer_sequences_in_flight_serve_fewer_requests() -> None:
    small = LlmServerShape(
        prompt_tokens=512, generated_tokens=128, max_seqs=8, max_batched_tokens=8192
    )
    wide = llm_server_throughput(TIMINGS, SHAPE, ttft_bound_s=2.0, tpot_bound_s=0.2)
    narrow = llm_server_throughput(TIMINGS, small, ttft_bound_s=2.0, tpot_bound_s=0.2)
    assert wide is not None
    assert narrow is not None
    assert narrow.arrival_rate_per_s < wide.arrival_rate_per_s
    assert narrow.mean_sequences <= 8 + 1e-9


@pytest.mark.parametrize(
    "bad",
    [
        {"prompt_tokens": 0, "generated_tokens": 1, "max_seqs": 1, "max_batched_tokens": 8},
        {"prompt_tokens": 1, "generated_tokens": 0, "max_seqs": 1, "max_batched_tokens": 8},
        {"prompt_tokens": 1, "generated_tokens": 1, "max_seqs": 0, "max_batched_tokens": 8},
        {"prompt_tokens": 1, "generated_tokens": 1, "max_seqs": 1, "max_batched_tokens": 0},
    ],
)
def test_shapes_it_cannot_simulate_are_refused(bad: dict[str, Any]) -> None:
    with pytest.raises(LlmServingInputError):
        LlmServerShape(**bad)


def test_timings_and_bounds_it_cannot_use_are_refused() -> None:
    with pytest.raises(LlmServingInputError):
        IterationTiming(sequences=1, prefill_s=math.nan, decode_step_s=0.01)
    with pytest.raises(LlmServingInputError):
        IterationCost([], prompt_tokens=1)
    with pytest.raises(LlmServingInputError):
        IterationCost([TIMINGS[0], TIMINGS[0]], prompt_tokens=1)
    with pytest.raises(LlmServingInputError):
        llm_server_throughput(TIMINGS, SHAPE, ttft_bound_s=0.0, tpot_bound_s=0.1)
