"""Serving scenarios: throughput under a p99 latency bound with Poisson arrivals (pure).

MLPerf's *Server* scenario (and most online services) send one request at a time at random
(Poisson) instants; the serving stack groups whatever is waiting into a batch (dynamic
batching) and the figure that matters is the largest arrival rate whose 99th-percentile
latency stays within a bound. The *Offline* figure (batches back to back, always full) is an
upper bound of it; at a tight bound the gap is large: waiting for the device to free up and
for the batch to finish both count against the bound.

:func:`server_throughput` answers it from the roofline's timings of whole batches by a
discrete-event queue: greedy dynamic batching (when the device frees up it takes everything
waiting, up to a batch cap), service times interpolated between the timed batch sizes, a
fixed stream of exponential inter-arrival times scaled to the rate under test (so the answer
is reproducible and monotone in the rate up to the stream's noise), the largest rate found by
bisection, and the batch cap chosen among the timed sizes.
"""

from __future__ import annotations

import math
import random
from bisect import bisect_left, bisect_right
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

from app.domain.errors import DomainError

SERVER_REQUESTS = 1000  # simulated arrivals per rate tried, at least
BATCHES_PER_RUN = 40  # and enough for this many full batches of the cap (queues must build up)
MAX_REQUESTS = 20_000
RELAXATIONS = 10  # relaxation times a run must cover to be trusted near saturation
WARMUP_SHARE = 0.1  # the first arrivals meet an empty queue: left out of the percentile
BISECTION_STEPS = 8  # rate resolution: 2**-8 of the cap's back-to-back throughput
PERCENTILE = 0.99
SEED = 20261124


class ServingInputError(DomainError):
    """Timings or a bound a serving scenario cannot use."""


@dataclass(frozen=True, slots=True, kw_only=True)
class BatchTiming:
    """One batch size as the roofline times it."""

    batch: int
    latency_s: float  # a batch's inputs in to its last output out
    interval_s: float  # until the device can start the next batch (copies overlap kernels)

    def __post_init__(self) -> None:
        if isinstance(self.batch, bool) or not isinstance(self.batch, int) or self.batch < 1:
            raise ServingInputError(f"batch must be an integer >= 1, got {self.batch!r}")
        for name in ("latency_s", "interval_s"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0):
                raise ServingInputError(f"{name} must be a positive, finite time, got {value!r}")
        if self.interval_s > self.latency_s * (1 + 1e-9):
            raise ServingInputError(
                f"interval_s ({self.interval_s!r}) cannot exceed latency_s ({self.latency_s!r})"
            )

    @property
    def throughput_per_s(self) -> float:
        """Back-to-back full batches: batch / interval [1/s]."""
        return self.batch / self.interval_s


@dataclass(frozen=True, slots=True, kw_only=True)
class ServerLoad:
    """The largest Poisson arrival rate whose p99 latency stays within the bound."""

    arrival_rate_per_s: float  # sustained throughput at the bound [1/s]
    p99_latency_s: float  # simulated at that rate
    p99_bound_s: float
    batch_cap: int  # the dynamic batcher's largest batch (a timed size)
    mean_batch: float  # requests per batch at that rate
    utilisation: float  # share of the time the device is busy [-]
    offline_throughput_per_s: float  # the best back-to-back figure of the timed sizes
    requests: int  # simulated arrivals per rate tried

    @property
    def offline_share(self) -> float:
        """Server throughput / offline throughput [-]."""
        return self.arrival_rate_per_s / self.offline_throughput_per_s

    def note(self) -> str:
        """One line: what was simulated and what came out."""
        return (
            f"server scenario: Poisson arrivals, greedy dynamic batching up to "
            f"{self.batch_cap}; {self.arrival_rate_per_s:.4g}/s keeps the simulated p99 at "
            f"{self.p99_latency_s * 1e3:.4g} ms within the {self.p99_bound_s * 1e3:.4g} ms bound "
            f"({self.offline_share:.0%} of the {self.offline_throughput_per_s:.4g}/s offline "
            f"figure; mean batch {self.mean_batch:.3g}, device busy {self.utilisation:.0%}; "
            f"{self.requests} arrivals per rate tried, the first {WARMUP_SHARE:.0%} left out)"
        )


@lru_cache(maxsize=16)  # one per run length in use (powers of two x BATCHES_PER_RUN)
def _arrival_stream(requests: int, seed: int) -> tuple[float, ...]:
    """Arrival instants of a unit-rate Poisson process: cumulative Exp(1) gaps."""
    rng = random.Random(seed)
    instants: list[float] = []
    t = 0.0
    for _ in range(requests):
        t += rng.expovariate(1.0)
        instants.append(t)
    return tuple(instants)


def _ordered(timings: Sequence[BatchTiming], requests: int) -> list[BatchTiming]:
    if not timings:
        raise ServingInputError("no batch timings")
    if isinstance(requests, bool) or not isinstance(requests, int) or requests < 100:
        raise ServingInputError(f"requests must be an integer >= 100, got {requests!r}")
    ordered = sorted(timings, key=lambda t: t.batch)
    if len({t.batch for t in ordered}) != len(ordered):
        raise ServingInputError("batch sizes must be distinct")
    return ordered


class _Service:
    """Latency and interval of a batch of n, linear between the timed sizes."""

    def __init__(self, timings: Sequence[BatchTiming]) -> None:
        self.batches = [t.batch for t in timings]
        self.latency = [t.latency_s for t in timings]
        self.interval = [t.interval_s for t in timings]
        self._tables: dict[int, tuple[list[float], list[float]]] = {}

    def tables(self, cap: int) -> tuple[list[float], list[float]]:
        """Latency and interval of a batch of n = 0..cap (computed once per cap)."""
        found = self._tables.get(cap)
        if found is None:
            latency, interval = [0.0], [0.0]
            for n in range(1, cap + 1):
                lat, ivl = self.at(n)
                latency.append(lat)
                interval.append(ivl)
            found = self._tables[cap] = (latency, interval)
        return found

    def at(self, n: int) -> tuple[float, float]:
        i = bisect_right(self.batches, n) - 1
        if i < 0:  # smaller than the smallest timed batch: its time (conservative)
            return self.latency[0], self.interval[0]
        if self.batches[i] == n or i + 1 == len(self.batches):
            return self.latency[i], self.interval[i]
        lo, hi = self.batches[i], self.batches[i + 1]
        w = (n - lo) / (hi - lo)
        return (
            self.latency[i] + w * (self.latency[i + 1] - self.latency[i]),
            self.interval[i] + w * (self.interval[i + 1] - self.interval[i]),
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class QueueRun:
    """One simulated run at one arrival rate."""

    p99_s: float  # 99th-percentile latency after the warm-up [s]
    mean_latency_s: float  # after the warm-up [s]
    mean_batch: float  # requests per batch [-]
    utilisation: float  # busy share of the device [-]


def _meets(
    service: _Service,
    cap: int,
    rate_per_s: float,
    stream: Sequence[float],
    warmup: int,
    bound_s: float,
) -> bool:
    """Whether the p99 after the warm-up stays within ``bound_s``: counts the requests over
    it (per batch by bisection: latency falls along a batch) and stops once 1 % is over."""
    base_latency, base_interval = service.tables(cap)
    latency = [x * rate_per_s for x in base_latency]  # in the stream's unit-rate time
    interval = [x * rate_per_s for x in base_interval]
    bound = bound_s * rate_per_s
    n = len(stream)
    allowed = math.floor((1 - PERCENTILE) * (n - warmup))
    over = 0
    t = 0.0
    i = 0
    while i < n:
        if stream[i] > t:
            t = stream[i]
        j = bisect_right(stream, t, i, min(n, i + cap))
        done = t + latency[j - i]
        first = max(i, warmup)
        if first < j:
            over += bisect_left(stream, done - bound, first, j) - first
            if over > allowed:
                return False
        t += interval[j - i]
        i = j
    return True


def simulate(
    timings: Sequence[BatchTiming],
    *,
    cap: int,
    rate_per_s: float,
    requests: int = SERVER_REQUESTS,
    seed: int = SEED,
) -> QueueRun:
    """One run of the queue of :func:`server_throughput` at a fixed Poisson rate.

    Parameters
    ----------
    timings : latency and interval at the timed batch sizes (distinct)
    cap : the dynamic batcher's largest batch [-]
    rate_per_s : Poisson arrival rate [1/s]
    requests : simulated arrivals, the first ``WARMUP_SHARE`` left out of the statistics [-]
    seed : of the exponential inter-arrival stream
    """
    ordered = _ordered(timings, requests)
    if isinstance(cap, bool) or not isinstance(cap, int) or cap < 1:
        raise ServingInputError(f"cap must be an integer >= 1, got {cap!r}")
    if not (math.isfinite(rate_per_s) and rate_per_s > 0):
        raise ServingInputError(f"rate_per_s must be positive and finite, got {rate_per_s!r}")
    stream = _arrival_stream(requests, seed)
    return _simulate(_Service(ordered), cap, rate_per_s, stream, int(requests * WARMUP_SHARE))


def _simulate(
    service: _Service, cap: int, rate_per_s: float, stream: Sequence[float], warmup: int
) -> QueueRun:
    arrivals = [a / rate_per_s for a in stream]
    n = len(arrivals)
    latencies: list[float] = []
    t = busy = 0.0
    i = batches = 0
    while i < n:
        if arrivals[i] > t:
            t = arrivals[i]  # idle until the next arrival
        j = bisect_right(arrivals, t, i, min(n, i + cap))
        latency_s, interval_s = service.at(j - i)
        done = t + latency_s
        latencies.extend(done - arrivals[k] for k in range(max(i, warmup), j))
        t += interval_s
        busy += interval_s
        batches += 1
        i = j
    mean = math.fsum(latencies) / len(latencies)
    latencies.sort()
    p99 = latencies[max(0, math.ceil(PERCENTILE * len(latencies)) - 1)]
    return QueueRun(
        p99_s=p99, mean_latency_s=mean, mean_batch=n / batches, utilisation=min(1.0, busy / t)
    )


def trusted_share(requests: int) -> float:
    """Utilisation up to which a run of ``requests`` arrivals reaches its steady state.

    A queue near saturation relaxes over about ``rho / ((1 - rho)^2 b)`` batches; a run of
    ``requests / b`` batches covers ``RELAXATIONS`` of them while
    ``1 - rho >= sqrt(RELAXATIONS / requests)``. Above that the simulated p99 is optimistic
    and :func:`heavy_traffic_share` bounds the rate instead.
    """
    return 1 - math.sqrt(RELAXATIONS / requests)


def heavy_traffic_share(timing: BatchTiming, p99_bound_s: float) -> float:
    """Largest utilisation at which full batches of ``timing.batch`` keep the p99 in bound.

    Parameters
    ----------
    timing : the dynamic batcher's cap and its latency ``L`` and interval ``I``
    p99_bound_s : the latency bound on the 99th percentile [s]

    Returns
    -------
    share : ``R / (1 + R)`` with ``R = (bound - L - I) * b / (ln(100) / 2 * I)``, or 1 when
        ``bound < L + I`` (the queue is then bounded by partial batches, which the simulation
        sees) [-]

    Notes
    -----
    Near saturation every batch is full and the queue beyond it is a random walk per batch
    with drift ``-(1 - rho) b`` and variance ``rho b`` (Poisson arrivals over ``I``), whose
    stationary excess is about exponential with mean ``rho / (2 (1 - rho))`` requests
    (Kingman's heavy-traffic approximation). A request waits for the batch in progress (up to
    ``I``), for the excess ahead of it (``I / b`` each) and its own batch (``L``):
    ``p99 = L + I + ln(100) rho / (2 (1 - rho)) * I / b``. A finite simulation near
    ``rho = 1`` has not reached that steady state, so its rate is capped here.

    References
    ----------
    Kingman, J. F. C. (1962). On queues in heavy traffic. J. R. Stat. Soc. B 24(2), 383-392.
    """
    slack_s = p99_bound_s - timing.latency_s - timing.interval_s
    if slack_s < 0:
        return 1.0
    r = slack_s * timing.batch / (math.log(1 / (1 - PERCENTILE)) / 2 * timing.interval_s)
    return r / (1 + r)


def server_throughput(
    timings: Sequence[BatchTiming],
    p99_bound_s: float,
    *,
    requests: int = SERVER_REQUESTS,
    seed: int = SEED,
) -> ServerLoad | None:
    """Largest Poisson arrival rate whose p99 latency stays within ``p99_bound_s``.

    Parameters
    ----------
    timings : the roofline's latency and interval at each batch size the device can hold
    p99_bound_s : the latency bound on the 99th percentile [s]
    requests : simulated arrivals per rate tried, at least; raised to cover
        ``BATCHES_PER_RUN`` full batches of the cap (up to ``MAX_REQUESTS``) [-]
    seed : of the exponential inter-arrival stream (fixed: the answer is reproducible)

    Returns
    -------
    load : the rate, its p99, the batch cap and the device's busy share; ``None`` when even a
        lone request (batch 1, no queue) misses the bound

    Notes
    -----
    A request arriving at ``a_k`` waits until the device is free and takes part in the next
    batch of ``n = min(waiting, cap)`` requests (greedy dynamic batching, no batching delay);
    it completes at ``start + L(n)`` and the device starts the next batch at
    ``start + I(n)`` (``L``, ``I``: latency and interval, linear between the timed sizes).
    ``p99(rate)`` over the arrivals after the warm-up, bisected for the largest rate with
    ``p99 <= bound`` below ``cap / I(cap)`` times the larger of :func:`trusted_share` and
    :func:`heavy_traffic_share`. The cap: the largest timed size with ``L + I <= bound`` (a
    request that just misses a full batch waits ``I`` and is served in the next, ``L``; the
    smallest size with ``L <= bound`` when none is), and the next larger size with
    ``L <= bound``, the better of the two.

    References
    ----------
    MLPerf Inference rules, Server scenario (Poisson query arrival, one sample per query,
    99th-percentile latency bound): https://github.com/mlcommons/inference_policies
    """
    return _server_throughput(tuple(timings), p99_bound_s, requests, seed)


def clear_server_cache() -> None:
    """Forget remembered queues (a pure function's answers: only speed changes)."""
    _server_throughput.cache_clear()


@lru_cache(maxsize=4096)  # a pure function of its arguments; MIG slices repeat timings
def _server_throughput(
    timings: tuple[BatchTiming, ...], p99_bound_s: float, requests: int, seed: int
) -> ServerLoad | None:
    ordered = _ordered(timings, requests)
    if not (math.isfinite(p99_bound_s) and p99_bound_s > 0):
        raise ServingInputError(f"p99_bound_s must be a positive, finite time, got {p99_bound_s!r}")
    service = _Service(ordered)
    offline = max(t.throughput_per_s for t in ordered)
    feasible = [t for t in ordered if t.latency_s <= p99_bound_s]
    if not feasible:
        return None
    comfortable = [t for t in feasible if t.latency_s + t.interval_s <= p99_bound_s]
    primary = comfortable[-1] if comfortable else feasible[0]
    caps = [t for t in feasible if t.batch >= primary.batch][:2]
    best: tuple[float, int, int] | None = None
    for cap in caps:
        ceiling = cap.throughput_per_s
        if best is not None and ceiling <= best[0]:
            continue
        count = max(requests, min(MAX_REQUESTS, BATCHES_PER_RUN * cap.batch))
        stream = _arrival_stream(count, seed)
        warmup = int(count * WARMUP_SHARE)
        if service.at(1)[0] > p99_bound_s:  # at a vanishing rate every request is alone
            continue
        lo = 0.0
        hi = ceiling * max(trusted_share(count), heavy_traffic_share(cap, p99_bound_s))
        if _meets(service, cap.batch, hi, stream, warmup, p99_bound_s):
            lo = hi  # the bound does not bind below the trusted / heavy-traffic ceiling
        for _ in range(BISECTION_STEPS if lo < hi else 0):
            mid = (lo + hi) / 2
            if _meets(service, cap.batch, mid, stream, warmup, p99_bound_s):
                lo = mid
            else:
                hi = mid
        if lo > 0 and (best is None or lo > best[0]):
            best = (lo, cap.batch, count)
    if best is None:
        return None
    rate, cap_batch, simulated = best
    stream = _arrival_stream(simulated, seed)
    run = _simulate(service, cap_batch, rate, stream, int(simulated * WARMUP_SHARE))
    return ServerLoad(
        arrival_rate_per_s=rate,
        p99_latency_s=run.p99_s,
        p99_bound_s=p99_bound_s,
        batch_cap=cap_batch,
        mean_batch=run.mean_batch,
        utilisation=run.utilisation,
        offline_throughput_per_s=offline,
        requests=simulated,
    )
