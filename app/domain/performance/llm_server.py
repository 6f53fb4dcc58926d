"""Decoder serving under load: TTFT and TPOT percentiles of continuous batching (pure).

An LLM server (vLLM, TensorRT-LLM, SGLang) does not batch whole requests: every *iteration*
runs one decode step of every sequence in flight plus a slice of the prompts waiting to be
prefilled, a finished sequence leaves at once and a waiting one takes its place (Orca's
iteration-level scheduling). Users see two latencies, bounded separately by MLPerf's LLM Server
scenarios and by serving SLOs: the *time to first token* (TTFT: arrival to the end of the
iteration that completes the prompt's prefill, queueing included) and the *time per output
token* (TPOT: the time from the first token to the last, over the tokens after the first).

:func:`llm_server_throughput` answers "the largest Poisson arrival rate whose TTFT p99 and
TPOT p99 stay within their bounds" by a discrete-event simulation of that scheduler:

* arrivals: one fixed stream of exponential inter-arrival times (unit rate, scaled to the rate
  under test, so the answer is reproducible and monotone in the rate up to the stream's noise);
* lengths: without a distribution every request has the mean prompt and the mean output
  length, and at most ``max_seqs`` (the KV pool's concurrency of mean requests, decided before
  this module is called) are in flight. With one (:class:`LlmServerShape` ``lengths``, module
  :mod:`app.domain.performance.request_lengths`) each arrival draws its own prompt and output
  (stratified samples from a fixed seed) and is admitted while fewer than ``max_num_seqs`` are
  in flight and its own KV blocks (prompt + output, rounded up to ``kv_block_tokens``, reserved
  at admission as TensorRT-LLM's GUARANTEED_NO_EVICT scheduler does; vLLM allocates blocks as
  tokens come and preempts on exhaustion, which this does not model) fit in the pool beside
  those of the requests in flight; a request that does not fit blocks the ones behind it
  (FCFS, as vLLM's ``schedule`` stops at the first waiting request it cannot allocate);
* every iteration (vLLM V1's scheduler, ``vllm/v1/core/sched/scheduler.py`` ``schedule``:
  running requests first, then waiting ones, FCFS, within ``max_num_batched_tokens`` and
  ``max_num_seqs``): one decode token per sequence past its prefill, then prompt tokens of the
  sequences still in prefill (chunked prefill), then new sequences admitted while they fit and
  tokens are left;
* an iteration costs :meth:`IterationCost.iteration_s`: the decode step of ``d`` sequences at
  the mean context plus the prefill of the iteration's prompt tokens (each request's own),
  both from the roofline's timings (conservative: a mixed iteration reads the weights once,
  not twice). The decode step does not follow the contexts actually in flight: with spread
  lengths the long requests stay longer, so the contexts in flight are longer than the mean
  request's and the decode steps are priced low (the timings do not separate the KV cache's
  reads from the weights');
* iterations between events (an arrival, a finish) that change nothing are skipped in bulk, so
  a run costs O(requests), not O(tokens).

The rate is bisected between 0 and :func:`trusted_share` of the back-to-back capacity at
``max_seqs`` over :data:`MIN_REQUESTS` arrivals; the answer's rate is then simulated over twice
the arrivals and lowered by :data:`BACKOFF` until that run also meets both bounds and moves
each p99 by less than :data:`STABLE_RELATIVE` (a queue near saturation has not reached its
steady state in a finite run; the answer says how far doubling moved it).

References
----------
Yu et al., "Orca: A Distributed Serving System for Transformer-Based Generative Models", OSDI
2022. Kwon et al., "Efficient Memory Management for Large Language Model Serving with
PagedAttention", SOSP 2023. MLPerf Inference rules, LLM Server scenario (TTFT and TPOT
99th-percentile bounds: Llama-2-70B 2 s / 200 ms): https://github.com/mlcommons/inference_policies
"""

from __future__ import annotations

import math
import random
from bisect import bisect_right
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import lru_cache, partial
from heapq import heappop, heappush
from typing import Any

from app.domain.budget import checkpoint
from app.domain.errors import DomainError
from app.domain.performance.decoding import paged_kv_tokens
from app.domain.performance.request_lengths import (
    LengthSummary,
    RequestLengths,
    sample_lengths,
    summarise,
)

PERCENTILE = 0.99
WARMUP_SHARE = 0.1  # the first arrivals meet an empty server: left out of the percentiles
MIN_REQUESTS = 2_000  # simulated arrivals per rate tried (the answer's check: twice as many)
BACKOFF = 0.95  # rate factor per step while the check is not stable
MAX_BACKOFFS = 20
STABLE_RELATIVE = 0.05  # p99 of a run vs a run twice as long: "stable" below this
BISECTION_STEPS = 8  # rate resolution: 2**-8 of the back-to-back capacity
# Relaxation times a run must cover. 10, as serving.RELAXATIONS was until 2026-11-28; the
# dynamic-batching queue moved to 100 after its answers were re-simulated over 10^6 arrivals
# (some passed the doubling check and missed the bound there); this simulation's answers have
# not had that check yet, so 10 stays until they do.
RELAXATIONS = 10
SEED = 20261127


class LlmServingInputError(DomainError):
    """Timings, lengths or bounds the LLM server simulation cannot use."""


def _positive_int(name: str, value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise LlmServingInputError(f"{name} must be an integer >= 1, got {value!r}")


def _positive_time(name: str, value: float) -> None:
    if not (math.isfinite(value) and value > 0):
        raise LlmServingInputError(f"{name} must be a positive, finite time, got {value!r}")


@dataclass(frozen=True, slots=True, kw_only=True)
class IterationTiming:
    """The roofline's timings of one concurrency: ``sequences`` in flight together."""

    sequences: int
    prefill_s: float  # the prefill of ``sequences`` mean prompts, one batch [s]
    decode_step_s: float  # one decode step of ``sequences`` at the mean context [s]

    def __post_init__(self) -> None:
        _positive_int("sequences", self.sequences)
        _positive_time("prefill_s", self.prefill_s)
        _positive_time("decode_step_s", self.decode_step_s)


class IterationCost:
    """What an iteration of ``d`` decode sequences and ``p`` prompt tokens costs [s].

    ``decode(d)``: linear between the timed concurrencies (the smallest's time below it, the
    largest's slope above it); ``prefill(p)``: linear in the prompt tokens between the timed
    prefills (``sequences x prompt_tokens`` tokens each), the smallest's time below it. A mixed
    iteration costs ``decode(d) + prefill(p)``.
    """

    def __init__(self, timings: Sequence[IterationTiming], prompt_tokens: int) -> None:
        if not timings:
            raise LlmServingInputError("no iteration timings")
        _positive_int("prompt_tokens", prompt_tokens)
        ordered = sorted(timings, key=lambda t: t.sequences)
        if len({t.sequences for t in ordered}) != len(ordered):
            raise LlmServingInputError("timed concurrencies must be distinct")
        self._seqs = [t.sequences for t in ordered]
        self._decode = [t.decode_step_s for t in ordered]
        self._tokens = [t.sequences * prompt_tokens for t in ordered]
        self._prefill = [t.prefill_s for t in ordered]

    @staticmethod
    def _interpolate(xs: list[int], ys: list[float], x: int) -> float:
        i = bisect_right(xs, x) - 1
        if i < 0:
            return ys[0]
        if xs[i] == x:
            return ys[i]
        if i + 1 < len(xs):
            lo, hi = xs[i], xs[i + 1]
            return ys[i] + (x - lo) / (hi - lo) * (ys[i + 1] - ys[i])
        if len(xs) == 1:  # one timing: proportional above it
            return ys[0] * x / xs[0]
        slope = (ys[-1] - ys[-2]) / (xs[-1] - xs[-2])
        return ys[-1] + (x - xs[-1]) * max(slope, 0.0)

    def decode_s(self, sequences: int) -> float:
        """One decode step of ``sequences`` (0: none) [s]."""
        return 0.0 if sequences < 1 else self._interpolate(self._seqs, self._decode, sequences)

    def prefill_s(self, tokens: int) -> float:
        """The prefill of ``tokens`` prompt tokens (0: none) [s]."""
        return 0.0 if tokens < 1 else self._interpolate(self._tokens, self._prefill, tokens)

    def iteration_s(self, decoding: int, prompt_tokens: int) -> float:
        """An iteration of ``decoding`` decode sequences and ``prompt_tokens`` prompt tokens."""
        return self.decode_s(decoding) + self.prefill_s(prompt_tokens)


@dataclass(frozen=True, slots=True, kw_only=True)
class LlmServerShape:
    """The requests and the engine's limits.

    Without ``lengths`` every request has the mean lengths and at most ``max_seqs`` are in
    flight. With ``lengths`` each arrival draws its own prompt and output
    (:func:`app.domain.performance.request_lengths.sample_lengths`) and is admitted while
    fewer than ``max_num_seqs`` are in flight and its own KV blocks (prompt + output, rounded
    up to ``kv_block_tokens``) fit in the pool beside those of the requests in flight; the
    pool is :attr:`kv_pool_tokens`.
    """

    prompt_tokens: int  # mean prompt [tokens]
    generated_tokens: int  # mean output, the first token included [tokens]
    max_seqs: int  # mean requests the KV pool holds (and max_num_seqs allows) at once
    max_batched_tokens: int  # tokens per iteration (vLLM max_num_batched_tokens)
    lengths: RequestLengths | None = None  # None: every request at the means
    kv_block_tokens: int = 1  # a request's KV cache is reserved in blocks of this many tokens
    max_num_seqs: int | None = None  # with lengths: sequences in flight at most (the engine's)

    def __post_init__(self) -> None:
        for name in ("prompt_tokens", "generated_tokens", "max_seqs", "max_batched_tokens",
                     "kv_block_tokens"):  # fmt: skip
            _positive_int(name, getattr(self, name))
        if self.lengths is None:
            if self.max_num_seqs is not None:
                raise LlmServingInputError("max_num_seqs caps the sequences of varied lengths")
            return
        if self.max_num_seqs is None:
            raise LlmServingInputError("sequences of varied lengths need max_num_seqs")
        _positive_int("max_num_seqs", self.max_num_seqs)
        if self.max_num_seqs < self.max_seqs:
            raise LlmServingInputError(
                f"max_num_seqs {self.max_num_seqs} is below max_seqs {self.max_seqs}"
            )

    @property
    def seqs_cap(self) -> int:
        """Sequences in flight at most, whatever their lengths."""
        return self.max_seqs if self.max_num_seqs is None else self.max_num_seqs

    def kv_slots(self, prompt_tokens: int, generated_tokens: int) -> int:
        """KV token slots a request of these lengths reserves at admission: its whole
        context rounded up to whole blocks (one sequence per request) [tokens]."""
        return paged_kv_tokens(
            prompt_tokens, generated_tokens, beam_width=1, block_tokens=self.kv_block_tokens
        )

    @property
    def kv_pool_tokens(self) -> int:
        """The KV pool's token slots: ``max_seqs`` mean requests' blocks, or the longest
        request's when larger (the memory fit holds one request at the maximum lengths)."""
        pool = self.max_seqs * self.kv_slots(self.prompt_tokens, self.generated_tokens)
        if self.lengths is None:
            return pool
        longest = self.kv_slots(
            self.lengths.prompt.longest_tokens(), self.lengths.generated.longest_tokens()
        )
        return max(pool, longest)


@dataclass(frozen=True, slots=True, kw_only=True)
class LlmRun:
    """One simulated run at one arrival rate (percentiles after the warm-up)."""

    ttft_p99_s: float
    tpot_p99_s: float
    ttft_mean_s: float
    tpot_mean_s: float
    mean_sequences: float  # sequences in flight, time-weighted [-]
    iterations: int  # engine iterations simulated (skipped ones included)
    requests: int  # simulated arrivals


@lru_cache(maxsize=8)  # one per run length in use (doublings of MIN_REQUESTS)
def _arrival_stream(requests: int, seed: int) -> tuple[float, ...]:
    """Arrival instants of a unit-rate Poisson process: cumulative Exp(1) gaps."""
    rng = random.Random(seed)
    instants: list[float] = []
    t = 0.0
    for _ in range(requests):
        t += rng.expovariate(1.0)
        instants.append(t)
    return tuple(instants)


def _percentile(values: list[float]) -> float:
    values.sort()
    return values[max(0, math.ceil(PERCENTILE * len(values)) - 1)]


def simulate(
    cost: IterationCost,
    shape: LlmServerShape,
    *,
    rate_per_s: float,
    requests: int = MIN_REQUESTS,
    seed: int = SEED,
) -> LlmRun:
    """One run of the iteration-level scheduler at a fixed Poisson rate.

    Parameters
    ----------
    cost : iteration times from the roofline's timings
    shape : lengths (means, or a distribution each arrival draws from) and the engine's limits
    rate_per_s : Poisson arrival rate [1/s]
    requests : simulated arrivals, the first ``WARMUP_SHARE`` left out of the percentiles [-]
    seed : of the exponential inter-arrival stream (the lengths use ``seed + 1``, ``seed + 2``)
    """
    _positive_time("rate_per_s", rate_per_s)
    if isinstance(requests, bool) or not isinstance(requests, int) or requests < 100:
        raise LlmServingInputError(f"requests must be an integer >= 100, got {requests!r}")
    arrivals = [a / rate_per_s for a in _arrival_stream(requests, seed)]
    drawn = request_lengths(shape, requests, seed)
    return _run(cost, shape, arrivals, int(requests * WARMUP_SHARE), drawn)


def run_arrivals(
    cost: IterationCost,
    shape: LlmServerShape,
    arrivals_s: Sequence[float],
    *,
    prompts: Sequence[int] | None = None,
    outputs: Sequence[int] | None = None,
    warmup: int = 0,
) -> LlmRun:
    """One run of the scheduler over given arrivals (a trace), each request with its own
    lengths when ``prompts`` and ``outputs`` are given (else the shape's means).

    Parameters
    ----------
    cost : iteration times
    shape : the engine's limits (with ``lengths``: the KV pool and ``max_num_seqs``)
    arrivals_s : arrival instants, ascending [s]
    prompts, outputs : each request's prompt and output tokens (both or neither) [tokens]
    warmup : first requests left out of the percentiles [-]
    """
    times = [float(a) for a in arrivals_s]
    if not times or any(b < a for a, b in zip(times, times[1:], strict=False)):
        raise LlmServingInputError("arrivals must be a non-empty ascending sequence")
    if (prompts is None) != (outputs is None):
        raise LlmServingInputError("prompts and outputs go together")
    drawn = None
    if prompts is not None and outputs is not None:
        if shape.lengths is None:
            raise LlmServingInputError("per-request lengths need a shape with lengths")
        if not (len(prompts) == len(outputs) == len(times)):
            raise LlmServingInputError("one prompt and one output length per arrival")
        for length in (*prompts, *outputs):
            _positive_int("a request's length", length)
        drawn = (tuple(prompts), tuple(outputs))
    if isinstance(warmup, bool) or not 0 <= warmup < len(times):
        raise LlmServingInputError(f"warmup must be in [0, {len(times)}), got {warmup!r}")
    return _run(cost, shape, times, warmup, drawn)


def request_lengths(
    shape: LlmServerShape, requests: int, seed: int = SEED
) -> tuple[tuple[int, ...], tuple[int, ...]] | None:
    """Each simulated request's prompt and output lengths (None: all at the means) [tokens]:
    stratified samples (:func:`app.domain.performance.request_lengths.sample_lengths`) of the
    shape's distributions, the prompts from ``seed + 1``, the outputs from ``seed + 2``."""
    if shape.lengths is None:
        return None
    return (
        sample_lengths(shape.lengths.prompt, requests, seed + 1),
        sample_lengths(shape.lengths.generated, requests, seed + 2),
    )


def _run(  # noqa: C901 - one scheduler loop; splitting it would hide the state it shares
    cost: IterationCost,
    shape: LlmServerShape,
    arrivals: list[float],
    warmup: int,
    drawn: tuple[tuple[int, ...], tuple[int, ...]] | None = None,
) -> LlmRun:
    n = len(arrivals)
    budget_tokens, seqs_cap = shape.max_batched_tokens, shape.seqs_cap
    if drawn is None:
        prompts: Sequence[int] = (shape.prompt_tokens,) * n
        outputs: Sequence[int] = (shape.generated_tokens,) * n
        pool = None  # max_seqs alone limits the requests in flight (all alike)
        slots: list[int] = []
    else:
        prompts, outputs = drawn[0][:n], drawn[1][:n]
        pool = shape.kv_pool_tokens
        slots = [shape.kv_slots(p, g) for p, g in zip(prompts, outputs, strict=True)]
        if max(slots) > pool:
            raise LlmServingInputError(
                f"a request needs {max(slots)} KV token slots, the pool holds {pool}"
            )
    decode_table = [cost.decode_s(d) for d in range(seqs_cap + 1)]
    prefill_memo: dict[int, float] = {}
    # Decoding sequences by the iteration that produces their last token: (that index, the
    # request, the index of the iteration that produced its first token, that iteration's end).
    # All alike, they finish in the order they started (a queue); else a heap.
    decoding: Any = deque() if drawn is None else []
    push: Callable[[tuple[int, int, int, float]], None]
    pop: Callable[[], tuple[int, int, int, float]]
    if drawn is None:
        push, pop = decoding.append, decoding.popleft
    else:
        push, pop = partial(heappush, decoding), partial(heappop, decoding)
    prefilling: deque[list[int]] = deque()  # [request, prompt tokens left]
    ttft: list[float] = []
    tpot: list[float] = []
    t = 0.0
    k = 0  # iterations done
    admitted = 0  # next arrival to admit
    finished = 0
    reserved = 0  # KV token slots held by the requests in flight (with a pool)
    seq_time = 0.0  # integral of sequences in flight over time

    while finished < n:
        checkpoint()
        in_flight = len(decoding) + len(prefilling)
        if in_flight == 0 and arrivals[admitted] > t:
            t = arrivals[admitted]  # idle until the next arrival
        waiting = bisect_right(arrivals, t, admitted) - admitted
        d = len(decoding)
        tokens_left = budget_tokens - d
        # Whether the next arrival may join now (FCFS: it blocks those behind it).
        head_fits = (
            in_flight < seqs_cap
            and tokens_left >= 1
            and (pool is None or (admitted < n and reserved + slots[admitted] <= pool))
        )
        if not prefilling and (waiting == 0 or not head_fits):
            # Pure decode iterations until something changes: the next finish, or the next
            # arrival that could be admitted.
            dt = decode_table[d]
            steps = decoding[0][0] - k
            if waiting == 0 and admitted < n and head_fits:
                steps = min(steps, max(1, math.ceil((arrivals[admitted] - t) / dt)))
            steps = max(1, steps)
            t0, k0 = t, k
            t += steps * dt
            k += steps
            seq_time += steps * dt * d
        else:
            # One iteration with prefill work: continue chunked prompts, then admit new ones.
            prompt_tokens = 0
            for item in prefilling:
                if tokens_left < 1:
                    break
                take = min(item[1], tokens_left)
                item[1] -= take
                tokens_left -= take
                prompt_tokens += take
            while (
                waiting
                and tokens_left >= 1
                and in_flight < seqs_cap
                and (pool is None or reserved + slots[admitted] <= pool)
            ):
                prompt = prompts[admitted]
                take = min(prompt, tokens_left)
                prefilling.append([admitted, prompt - take])
                if pool is not None:
                    reserved += slots[admitted]
                tokens_left -= take
                prompt_tokens += take
                admitted += 1
                waiting -= 1
                in_flight += 1
            prefill_s = prefill_memo.get(prompt_tokens)
            if prefill_s is None:
                prefill_s = prefill_memo[prompt_tokens] = cost.prefill_s(prompt_tokens)
            dt = decode_table[d] + prefill_s
            t0, k0 = t, k
            t += dt
            k += 1
            seq_time += dt * in_flight
            while prefilling and prefilling[0][1] == 0:
                request = prefilling.popleft()[0]
                if request >= warmup:
                    ttft.append(t - arrivals[request])
                if outputs[request] == 1:
                    finished += 1
                    if pool is not None:
                        reserved -= slots[request]
                else:
                    push((k + outputs[request] - 1, request, k, t))
        # Sequences whose last token came out in the iterations just run (all of equal time
        # dt, the last one ending at t).
        while decoding and decoding[0][0] <= k:
            last_k, request, first_k, first_t = pop()
            if request >= warmup:
                done_t = t0 + (last_k - k0) * dt
                tpot.append((done_t - first_t) / (last_k - first_k))
            finished += 1
            if pool is not None:
                reserved -= slots[request]
    if not ttft or (any(g > 1 for g in outputs[warmup:]) and not tpot):
        raise LlmServingInputError("too few requests after the warm-up to take percentiles")
    return LlmRun(
        ttft_p99_s=_percentile(ttft),
        tpot_p99_s=_percentile(tpot) if tpot else 0.0,
        ttft_mean_s=math.fsum(ttft) / len(ttft),
        tpot_mean_s=math.fsum(tpot) / len(tpot) if tpot else 0.0,
        mean_sequences=seq_time / t if t > 0 else 0.0,
        iterations=k,
        requests=n,
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class LlmServerLoad:
    """The largest Poisson arrival rate whose TTFT p99 and TPOT p99 stay within their bounds."""

    arrival_rate_per_s: float  # sustained requests per second at the bounds [1/s]
    ttft_p99_s: float
    tpot_p99_s: float
    ttft_bound_s: float
    tpot_bound_s: float
    max_seqs: int
    max_batched_tokens: int
    mean_sequences: float  # in flight at that rate [-]
    capacity_per_s: float  # back-to-back requests per second at max_seqs (the rate's ceiling)
    requests: int  # simulated arrivals of the answer's run
    ttft_p99_doubled_s: float  # the same rate over twice the arrivals: the stability evidence
    tpot_p99_doubled_s: float
    stable: bool  # the doubled run met both bounds and moved the p99s by < STABLE_RELATIVE
    binding: str  # "ttft", "tpot", "capacity" or "stability": what stops a higher rate
    # With a length distribution (None without): what was drawn, the answer's run's lengths,
    # the KV pool each request's own blocks were admitted into and the engine's sequence cap.
    lengths: RequestLengths | None = None
    prompt_drawn: LengthSummary | None = None
    generated_drawn: LengthSummary | None = None
    kv_pool_tokens: int | None = None
    max_num_seqs: int | None = None

    @property
    def drift(self) -> float:
        """Largest relative move of a p99 when the simulated arrivals are doubled [-]."""
        return max(
            _relative(self.ttft_p99_s, self.ttft_p99_doubled_s),
            _relative(self.tpot_p99_s, self.tpot_p99_doubled_s),
        )

    def note(self) -> str:
        """One line: what was simulated and what came out."""
        return (
            f"LLM server (continuous batching, up to {self.max_seqs} sequences and "
            f"{self.max_batched_tokens} tokens per iteration): {self.arrival_rate_per_s:.4g} "
            f"requests/s keeps TTFT p99 at {self.ttft_p99_s * 1e3:.4g} ms (bound "
            f"{self.ttft_bound_s * 1e3:.4g} ms) and TPOT p99 at {self.tpot_p99_s * 1e3:.4g} ms "
            f"(bound {self.tpot_bound_s * 1e3:.4g} ms); {self.mean_sequences:.3g} sequences in "
            f"flight on average; limited by {self.binding}; {self.requests} simulated arrivals, "
            f"doubling them moves the p99s by {self.drift:.1%}"
            + ("" if self.stable else " (NOT stable within 5 %: treat the rate as optimistic)")
            + self._lengths_note()
        )

    def _lengths_note(self) -> str:
        if self.lengths is None or self.prompt_drawn is None or self.generated_drawn is None:
            return ""
        prompt, generated = self.prompt_drawn, self.generated_drawn
        return (
            f"; lengths drawn per request ({self.lengths.describe()}): prompts mean "
            f"{prompt.mean_tokens:.4g}, p99 {prompt.p99_tokens}, outputs mean "
            f"{generated.mean_tokens:.4g}, p99 {generated.p99_tokens} tokens; each admitted "
            f"with its own KV blocks into a pool of {self.kv_pool_tokens} token slots, at most "
            f"{self.max_num_seqs} sequences in flight"
        )


def _relative(a: float, b: float) -> float:
    if a == b:
        return 0.0
    return abs(a - b) / max(abs(a), abs(b))


def capacity_per_s(cost: IterationCost, shape: LlmServerShape) -> float:
    """Requests per second with ``max_seqs`` always in flight [1/s]: each request's prefill
    plus ``generated - 1`` decode steps at full concurrency, ``max_seqs`` at a time."""
    seqs = shape.max_seqs
    per_request_s = cost.prefill_s(shape.prompt_tokens) + (
        shape.generated_tokens - 1
    ) * cost.decode_s(seqs) / max(1, seqs)
    return 1.0 / per_request_s if per_request_s > 0 else math.inf


def llm_server_throughput(
    timings: Sequence[IterationTiming],
    shape: LlmServerShape,
    *,
    ttft_bound_s: float,
    tpot_bound_s: float,
    seed: int = SEED,
) -> LlmServerLoad | None:
    """Largest Poisson arrival rate whose TTFT p99 and TPOT p99 stay within their bounds.

    Parameters
    ----------
    timings : the roofline's prefill and decode-step times at timed concurrencies
    shape : mean lengths and the engine's limits (``max_seqs``: the KV pool's concurrency)
    ttft_bound_s : bound on the 99th-percentile time to first token [s]
    tpot_bound_s : bound on the 99th-percentile time per output token [s]
    seed : of the arrival stream (fixed: the answer is reproducible)

    Returns
    -------
    load : the rate, both p99s at it and their stability; ``None`` when even a lone request
        (no queue) misses a bound

    Notes
    -----
    Bisection over ``(0, trusted_share x capacity]`` (:func:`capacity_per_s`) at
    ``MIN_REQUESTS`` arrivals for the largest rate whose run meets both bounds; then that rate
    over twice the arrivals, lowered by ``BACKOFF`` (at most ``MAX_BACKOFFS`` times) until the
    doubled run meets both bounds and moves each p99 by less than ``STABLE_RELATIVE``.
    """
    _positive_time("ttft_bound_s", ttft_bound_s)
    _positive_time("tpot_bound_s", tpot_bound_s)
    return _search(tuple(timings), shape, ttft_bound_s, tpot_bound_s, seed)


@lru_cache(maxsize=1024)  # a pure function of its arguments; MIG slices repeat timings
def _search(
    timings: tuple[IterationTiming, ...],
    shape: LlmServerShape,
    ttft_bound_s: float,
    tpot_bound_s: float,
    seed: int,
) -> LlmServerLoad | None:
    cost = IterationCost(timings, shape.prompt_tokens)
    lone_ttft = cost.iteration_s(0, shape.prompt_tokens)
    lone_tpot = cost.decode_s(1)
    if lone_ttft > ttft_bound_s or (shape.generated_tokens > 1 and lone_tpot > tpot_bound_s):
        return None
    ceiling = capacity_per_s(cost, shape)
    short = _arrival_stream(MIN_REQUESTS, seed)
    long = _arrival_stream(2 * MIN_REQUESTS, seed)
    drawn = {len(short): request_lengths(shape, len(short), seed)}
    drawn[len(long)] = request_lengths(shape, len(long), seed)

    def run(rate: float, stream: tuple[float, ...]) -> LlmRun:
        return _run(
            cost,
            shape,
            [a / rate for a in stream],
            int(len(stream) * WARMUP_SHARE),
            drawn[len(stream)],
        )

    def meets(found: LlmRun) -> bool:
        return found.ttft_p99_s <= ttft_bound_s and found.tpot_p99_s <= tpot_bound_s

    lo, lo_run = 0.0, None
    hi = ceiling * trusted_share(MIN_REQUESTS)
    top = run(hi, short)
    if meets(top):
        lo, lo_run = hi, top
    else:
        for _ in range(BISECTION_STEPS):
            mid = (lo + hi) / 2
            found = run(mid, short)
            if meets(found):
                lo, lo_run = mid, found
            else:
                hi = mid
    if lo_run is None:
        return None
    # The answer's rate must hold over twice the arrivals, within STABLE_RELATIVE: back off
    # by BACKOFF until it does (a queue near saturation has not reached its steady state).
    backoffs = 0
    check = run(lo, long)
    while (
        not meets(check) or _drift(lo_run, check) >= STABLE_RELATIVE
    ) and backoffs < MAX_BACKOFFS:
        lo *= BACKOFF
        backoffs += 1
        lo_run, check = run(lo, short), run(lo, long)
    binding = (
        "capacity"
        if lo >= ceiling * trusted_share(MIN_REQUESTS)
        else "stability"
        if backoffs
        else "ttft"
        if lo_run.ttft_p99_s / ttft_bound_s >= lo_run.tpot_p99_s / tpot_bound_s
        else "tpot"
    )
    return LlmServerLoad(
        arrival_rate_per_s=lo,
        ttft_p99_s=lo_run.ttft_p99_s,
        tpot_p99_s=lo_run.tpot_p99_s,
        ttft_bound_s=ttft_bound_s,
        tpot_bound_s=tpot_bound_s,
        max_seqs=shape.max_seqs,
        max_batched_tokens=shape.max_batched_tokens,
        mean_sequences=lo_run.mean_sequences,
        capacity_per_s=ceiling,
        requests=lo_run.requests,
        ttft_p99_doubled_s=check.ttft_p99_s,
        tpot_p99_doubled_s=check.tpot_p99_s,
        stable=meets(check) and _drift(lo_run, check) < STABLE_RELATIVE,
        binding=binding,
        **_lengths_fields(shape, drawn[len(short)]),
    )


def _lengths_fields(
    shape: LlmServerShape, drawn: tuple[tuple[int, ...], tuple[int, ...]] | None
) -> dict[str, Any]:
    """The answer's length fields: what was drawn over its run, the pool and the cap."""
    if shape.lengths is None or drawn is None:
        return {}
    return {
        "lengths": shape.lengths,
        "prompt_drawn": summarise(drawn[0]),
        "generated_drawn": summarise(drawn[1]),
        "kv_pool_tokens": shape.kv_pool_tokens,
        "max_num_seqs": shape.seqs_cap,
    }


def _drift(first: LlmRun, second: LlmRun) -> float:
    return max(
        _relative(first.ttft_p99_s, second.ttft_p99_s),
        _relative(first.tpot_p99_s, second.tpot_p99_s),
    )


def rate_ceiling_per_s(cost: IterationCost, shape: LlmServerShape) -> float:
    """The highest rate :func:`llm_server_throughput` can answer [1/s]: the bisection's upper
    end, ``trusted_share(MIN_REQUESTS) x capacity_per_s``."""
    return capacity_per_s(cost, shape) * trusted_share(MIN_REQUESTS)


def trusted_share(requests: int) -> float:
    """Share of the capacity up to which a run of ``requests`` arrivals reaches its steady
    state: ``1 - sqrt(RELAXATIONS / requests)`` (a queue at utilisation ``rho`` relaxes over
    about ``1 / (1 - rho)^2`` arrivals; the run must cover ``RELAXATIONS`` of them, the rule of
    :func:`app.domain.performance.serving.trusted_share` with this module's own count)."""
    return 1 - math.sqrt(RELAXATIONS / requests)


def clear_llm_server_cache() -> None:
    """Forget remembered searches (a pure function's answers: only speed changes)."""
    _search.cache_clear()


__all__ = [
    "IterationCost",
    "IterationTiming",
    "LlmRun",
    "LlmServerLoad",
    "LlmServerShape",
    "LlmServingInputError",
    "capacity_per_s",
    "clear_llm_server_cache",
    "llm_server_throughput",
    "rate_ceiling_per_s",
    "request_lengths",
    "run_arrivals",
    "simulate",
]
