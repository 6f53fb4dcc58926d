"""Decoder serving under load with request length distributions: each arrival draws its own
prompt and output, and the KV pool admits it with its own blocks (golden numbers derived by
hand from the scheduler's rules; the stability the answer claims; fixed lengths unchanged)."""

from __future__ import annotations

import dataclasses

import pytest

from app.domain.performance.llm_server import (
    MIN_REQUESTS,
    STABLE_RELATIVE,
    IterationCost,
    IterationTiming,
    LlmServerShape,
    LlmServingInputError,
    llm_server_throughput,
    run_arrivals,
    simulate,
)
from app.domain.performance.request_lengths import (
    LengthDistribution,
    LengthKind,
    RequestLengths,
    lognormal_sigma,
)

# Prefill of n mean prompts: 5 ms + 20 ms each; decode step of n sequences: 10 ms + 0.2 ms each
# (as tests/domain/test_llm_server.py).
TIMINGS = [
    IterationTiming(sequences=n, prefill_s=0.005 + 0.02 * n, decode_step_s=0.010 + 0.0002 * n)
    for n in (1, 2, 4, 8, 16, 32, 64)
]


def _fixed(tokens: int) -> LengthDistribution:
    return LengthDistribution(kind=LengthKind.FIXED, tokens=tokens, limit_tokens=tokens)


def test_the_kv_pool_admits_each_request_with_its_own_blocks() -> None:
    # Pool: max_seqs 2 mean requests of 100 + 10 tokens = 220 slots (blocks of 1 token).
    # Prefill: 10 ms per 100 tokens (the smallest's time below 100); decode: 1 ms x sequences.
    cost = IterationCost(
        [
            IterationTiming(sequences=1, prefill_s=0.01, decode_step_s=0.001),
            IterationTiming(sequences=2, prefill_s=0.02, decode_step_s=0.002),
        ],
        prompt_tokens=100,
    )
    lengths = RequestLengths(
        prompt=LengthDistribution(
            kind=LengthKind.HISTOGRAM, bins=((10, 1.0), (100, 1.0)), limit_tokens=100
        ),
        generated=_fixed(10),
    )
    shape = LlmServerShape(
        prompt_tokens=100,
        generated_tokens=10,
        max_seqs=2,
        max_batched_tokens=1000,
        lengths=lengths,
        max_num_seqs=8,
    )
    assert shape.kv_pool_tokens == 220
    # Four requests at t = 0: 110, 20, 20 and 110 slots. The first three (150 slots: more
    # than max_seqs = 2 of the mean) are prefilled together: 120 tokens, 10 + 20 x 0.1 = 12 ms;
    # the fourth waits (150 + 110 > 220). 9 decode steps of 3 sequences, 3 ms each: they
    # finish at 39 ms; then the fourth's prefill (10 ms, TTFT 49 ms) and 9 steps of 1 ms.
    run = run_arrivals(
        cost, shape, [0.0, 0.0, 0.0, 0.0], prompts=[100, 10, 10, 100], outputs=[10] * 4
    )
    assert run.ttft_p99_s == pytest.approx(0.049)
    assert run.ttft_mean_s == pytest.approx((3 * 0.012 + 0.049) / 4)
    assert run.tpot_p99_s == pytest.approx(0.003)
    assert run.tpot_mean_s == pytest.approx((3 * 0.003 + 0.001) / 4)
    assert run.iterations == 1 + 9 + 1 + 9
    # sequences in flight x time: 3 x 12 ms + 3 x 27 ms + 1 x 10 ms + 1 x 9 ms, over 58 ms
    assert run.mean_sequences == pytest.approx(0.136 / 0.058)
    # Every request at the means (100 + 10), at most max_seqs = 2 in flight: two prefills of
    # 200 tokens (20 ms), 9 steps of 2 ms each, then the other two: TTFT p99 20 + 18 + 20 ms.
    plain = dataclasses.replace(shape, lengths=None, max_num_seqs=None)
    alike = run_arrivals(cost, plain, [0.0, 0.0, 0.0, 0.0])
    assert alike.ttft_p99_s == pytest.approx(0.058)
    assert alike.tpot_p99_s == pytest.approx(0.002)


def test_lone_requests_see_the_prefill_of_their_own_prompt() -> None:
    # Prompts of 512 or 1024 tokens, half each (mean 768: the timings are at 768 n tokens,
    # prefill(768) = 25 ms, prefill(1536) = 45 ms). Alone, a 512-token prompt takes the
    # smallest's 25 ms, a 1024-token one 25 + 256 / 768 x 20 = 31.67 ms: the p99.
    lengths = RequestLengths(
        prompt=LengthDistribution(
            kind=LengthKind.HISTOGRAM, bins=((512, 1.0), (1024, 1.0)), limit_tokens=1024
        ),
        generated=_fixed(128),
    )
    shape = LlmServerShape(
        prompt_tokens=768,
        generated_tokens=128,
        max_seqs=64,
        max_batched_tokens=8192,
        lengths=lengths,
        max_num_seqs=256,
    )
    cost = IterationCost(TIMINGS, prompt_tokens=768)
    run = simulate(cost, shape, rate_per_s=1e-3, requests=200)
    assert run.ttft_p99_s == pytest.approx(0.025 + 256 / 768 * 0.02)
    assert 0.025 < run.ttft_mean_s < run.ttft_p99_s
    assert run.tpot_p99_s == pytest.approx(0.0102)  # one sequence alone: 10.2 ms a step


def test_fixed_lengths_through_the_distribution_path_give_the_same_answer() -> None:
    # kind fixed for both sides is today's behaviour: the answer does not move.
    plain = LlmServerShape(
        prompt_tokens=512, generated_tokens=128, max_seqs=64, max_batched_tokens=8192
    )
    fixed = dataclasses.replace(
        plain,
        lengths=RequestLengths(prompt=_fixed(512), generated=_fixed(128)),
        kv_block_tokens=16,
        max_num_seqs=256,
    )
    before = llm_server_throughput(TIMINGS, plain, ttft_bound_s=0.5, tpot_bound_s=0.02)
    after = llm_server_throughput(TIMINGS, fixed, ttft_bound_s=0.5, tpot_bound_s=0.02)
    assert before is not None
    assert after is not None
    for field in ("arrival_rate_per_s", "ttft_p99_s", "tpot_p99_s", "mean_sequences",
                  "ttft_p99_doubled_s", "tpot_p99_doubled_s", "binding"):  # fmt: skip
        assert getattr(after, field) == getattr(before, field)
    assert before.lengths is None
    assert after.kv_pool_tokens == 64 * 640


LOGNORMAL = RequestLengths(
    prompt=LengthDistribution(
        kind=LengthKind.LOGNORMAL,
        mean_tokens=512,
        sigma=lognormal_sigma(512, 2048),
        limit_tokens=4096,
    ),
    generated=LengthDistribution(
        kind=LengthKind.LOGNORMAL, mean_tokens=128, sigma=0.6, limit_tokens=512
    ),
)
SPREAD = LlmServerShape(
    prompt_tokens=512,
    generated_tokens=128,
    max_seqs=64,
    max_batched_tokens=8192,
    lengths=LOGNORMAL,
    kv_block_tokens=16,
    max_num_seqs=256,
)


@pytest.mark.parametrize(("ttft_ms", "tpot_ms"), [(2000, 200), (500, 20), (300, 15), (1000, 40)])
def test_with_spread_lengths_the_answer_meets_both_bounds_and_is_stable(
    ttft_ms: float, tpot_ms: float
) -> None:
    load = llm_server_throughput(
        TIMINGS, SPREAD, ttft_bound_s=ttft_ms / 1e3, tpot_bound_s=tpot_ms / 1e3
    )
    assert load is not None
    assert load.stable
    assert load.ttft_p99_s <= ttft_ms / 1e3
    assert load.tpot_p99_s <= tpot_ms / 1e3
    cost = IterationCost(TIMINGS, prompt_tokens=512)
    doubled = simulate(cost, SPREAD, rate_per_s=load.arrival_rate_per_s, requests=2 * MIN_REQUESTS)
    assert doubled.ttft_p99_s == load.ttft_p99_doubled_s
    assert doubled.tpot_p99_s == load.tpot_p99_doubled_s
    assert load.drift < STABLE_RELATIVE
    assert load.prompt_drawn is not None
    assert load.prompt_drawn.mean_tokens == pytest.approx(LOGNORMAL.prompt.mean(), rel=0.01)
    assert load.prompt_drawn.p99_tokens <= 2048
    assert load.kv_pool_tokens == 64 * 640
    assert load.max_num_seqs == 256
    assert "lengths drawn per request" in load.note()


def test_at_the_same_rate_a_long_tail_of_prompts_raises_the_ttft_p99() -> None:
    cost = IterationCost(TIMINGS, prompt_tokens=512)
    plain = dataclasses.replace(SPREAD, lengths=None, kv_block_tokens=1, max_num_seqs=None)
    prompts_only = dataclasses.replace(
        SPREAD, lengths=dataclasses.replace(LOGNORMAL, generated=_fixed(128))
    )
    for rate in (1.0, 10.0):
        fixed_run = simulate(cost, plain, rate_per_s=rate)
        spread_run = simulate(cost, prompts_only, rate_per_s=rate)
        assert spread_run.ttft_p99_s > 1.5 * fixed_run.ttft_p99_s


def test_the_same_question_gives_the_same_answer() -> None:
    first = llm_server_throughput(TIMINGS, SPREAD, ttft_bound_s=0.5, tpot_bound_s=0.02)
    again = llm_server_throughput(
        TIMINGS, dataclasses.replace(SPREAD), ttft_bound_s=0.5, tpot_bound_s=0.02
    )
    assert first == again


def test_shapes_and_traces_it_cannot_simulate_are_refused() -> None:
    with pytest.raises(LlmServingInputError, match="need max_num_seqs"):
        dataclasses.replace(SPREAD, max_num_seqs=None)
    with pytest.raises(LlmServingInputError, match="below max_seqs"):
        dataclasses.replace(SPREAD, max_num_seqs=32)
    with pytest.raises(LlmServingInputError, match="caps the sequences"):
        dataclasses.replace(SPREAD, lengths=None)
    cost = IterationCost(TIMINGS, prompt_tokens=512)
    with pytest.raises(LlmServingInputError, match="KV token slots"):
        run_arrivals(cost, SPREAD, [0.0], prompts=[50_000], outputs=[1])
    with pytest.raises(LlmServingInputError, match="ascending"):
        run_arrivals(cost, SPREAD, [1.0, 0.0], prompts=[1, 1], outputs=[1, 1])
    with pytest.raises(LlmServingInputError, match="go together"):
        run_arrivals(cost, SPREAD, [0.0], prompts=[1])
