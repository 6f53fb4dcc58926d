"""Request length distributions of an LLM server's traffic, and their seeded samples (pure).

A served decoder does not see one prompt length and one output length: chat and RAG traffic
has a long right tail of prompts, and outputs stop at an end-of-sequence token or at
``max_tokens``. The p99 time to first token is set by the long prompts, the TPOT p99 by the
iterations that prefill them beside the decoding sequences, and the KV pool's concurrency by
the mix of short and long requests in it. A :class:`LengthDistribution` describes one side
(prompt or output):

* ``fixed``: every request at one length (the mean: the behaviour before distributions);
* ``uniform``: integers ``min_tokens .. max_tokens``, each equally likely;
* ``lognormal``: ``exp(mu + sigma Z)`` rounded to whole tokens, given by its mean and sigma
  (or its mean and p99: :func:`lognormal_sigma`), clipped to ``[1, limit_tokens]`` (a prompt
  beyond the maximum is not served; an output stops at ``max_tokens``);
* ``histogram``: lengths with weights (a measured trace's histogram).

:func:`sample_lengths` draws a run's lengths by *stratified* (Latin hypercube) sampling: each
block of :data:`STRATUM_REQUESTS` consecutive requests takes one draw from each of as many
equal-probability strata, in a seeded random order. The sample's percentiles are then the
distribution's to within a stratum, so a finite run does not add the sampling noise of the
lengths to the p99s it measures (plain sampling of a lognormal with sigma 0.6 over 1,800
requests moves its p99 by about 5 % from seed to seed: the relative standard error of a
quantile is ``sqrt(p (1 - p) / n) sigma / phi(z_p)``); and a longer run extends a shorter one
(its first requests are the same), as the arrival stream does.

References
----------
McKay, Beckman and Conover, "A Comparison of Three Methods for Selecting Values of Input
Variables in the Analysis of Output from a Computer Code", Technometrics 21(2), 1979 (Latin
hypercube sampling). Percentile standard error: Kendall and Stuart, The Advanced Theory of
Statistics, vol. 1, 10.10.
"""

from __future__ import annotations

import math
import random
from bisect import bisect_right
from dataclasses import dataclass
from enum import StrEnum
from functools import lru_cache
from statistics import NormalDist

from app.domain.errors import DomainError

STRATUM_REQUESTS = 100  # requests per stratified block: each draws one of 100 percentile strata
P99 = 0.99
Z_P99 = NormalDist().inv_cdf(P99)  # 2.3263...: the standard normal's 99th percentile
# A lognormal's p99 / mean is exp(z sigma - sigma^2 / 2), largest at sigma = z: exp(z^2 / 2).
MAX_P99_OVER_MEAN = math.exp(Z_P99 * Z_P99 / 2)  # 14.97...
MAX_HISTOGRAM_BINS = 1000
LENGTH_SAMPLING = (
    f"stratified (Latin hypercube) in blocks of {STRATUM_REQUESTS} requests: one draw per "
    "percentile stratum per block, in a seeded random order; prompts and outputs independent"
)
_UNIT = NormalDist()


class LengthDistributionError(DomainError):
    """A length distribution that cannot describe request lengths."""


class LengthKind(StrEnum):
    """How request lengths are spread."""

    FIXED = "fixed"
    UNIFORM = "uniform"
    LOGNORMAL = "lognormal"
    HISTOGRAM = "histogram"


def lognormal_sigma(mean_tokens: float, p99_tokens: float) -> float:
    """The sigma of the lognormal with this mean and 99th percentile [-].

    Parameters
    ----------
    mean_tokens : m, the mean [tokens]
    p99_tokens : q, the 99th percentile, ``m <= q <= MAX_P99_OVER_MEAN x m`` [tokens]

    Returns
    -------
    sigma : ``z - sqrt(z^2 - 2 ln(q / m))``, z the standard normal's 99th percentile

    Notes
    -----
    ``m = exp(mu + sigma^2 / 2)`` and ``q = exp(mu + z sigma)`` give
    ``sigma^2 - 2 z sigma + 2 ln(q / m) = 0``; the smaller root is the one whose p99 grows with
    sigma (the larger root, past ``sigma = z``, has a thinner upper tail at the same p99).
    """
    if not (math.isfinite(mean_tokens) and mean_tokens > 0):
        raise LengthDistributionError(f"mean_tokens must be positive, got {mean_tokens!r}")
    if not math.isfinite(p99_tokens) or p99_tokens < mean_tokens:
        raise LengthDistributionError(
            f"p99_tokens {p99_tokens!r} is below mean_tokens {mean_tokens!r}: a lognormal's "
            "p99 is at least its mean"
        )
    ratio = p99_tokens / mean_tokens
    if ratio > MAX_P99_OVER_MEAN:
        raise LengthDistributionError(
            f"p99_tokens / mean_tokens is {ratio:.4g}: no lognormal has a p99 above "
            f"{MAX_P99_OVER_MEAN:.4g} x its mean (give sigma, or a histogram)"
        )
    return Z_P99 - math.sqrt(max(0.0, Z_P99 * Z_P99 - 2 * math.log(ratio)))


@dataclass(frozen=True, slots=True, kw_only=True)
class LengthDistribution:
    """One side's request lengths (prompt or output), clipped to ``[1, limit_tokens]``."""

    kind: LengthKind
    limit_tokens: int  # the longest a request may be (prompt_tokens / generated_tokens)
    tokens: int | None = None  # fixed
    min_tokens: int | None = None  # uniform
    max_tokens: int | None = None  # uniform
    mean_tokens: float | None = None  # lognormal: the unclipped distribution's mean
    sigma: float | None = None  # lognormal: of the underlying normal [-]
    p99_tokens: float | None = None  # lognormal: the p99 sigma was derived from, if given
    bins: tuple[tuple[int, float], ...] = ()  # histogram: (tokens, weight), by tokens

    def __post_init__(self) -> None:  # noqa: C901 - one check per kind's parameters
        _at_least_one("limit_tokens", self.limit_tokens)
        kind = self.kind
        if kind is LengthKind.FIXED:
            _at_least_one("tokens", self.tokens)
            self._within("tokens", self.tokens)
        elif kind is LengthKind.UNIFORM:
            _at_least_one("min_tokens", self.min_tokens)
            _at_least_one("max_tokens", self.max_tokens)
            assert self.min_tokens is not None
            assert self.max_tokens is not None
            if self.min_tokens > self.max_tokens:
                raise LengthDistributionError(
                    f"min_tokens {self.min_tokens} exceeds max_tokens {self.max_tokens}"
                )
            self._within("max_tokens", self.max_tokens)
        elif kind is LengthKind.LOGNORMAL:
            mean, sigma = self.mean_tokens, self.sigma
            if mean is None or not (math.isfinite(mean) and mean > 0):
                raise LengthDistributionError(f"mean_tokens must be positive, got {mean!r}")
            if sigma is None or not (math.isfinite(sigma) and sigma >= 0):
                raise LengthDistributionError(f"sigma must be >= 0 and finite, got {sigma!r}")
        elif kind is LengthKind.HISTOGRAM:
            if not self.bins or len(self.bins) > MAX_HISTOGRAM_BINS:
                raise LengthDistributionError(
                    f"a histogram needs 1 to {MAX_HISTOGRAM_BINS} bins, got {len(self.bins)}"
                )
            for tokens, weight in self.bins:
                _at_least_one("a bin's tokens", tokens)
                self._within("a bin's tokens", tokens)
                if not (math.isfinite(weight) and weight >= 0):
                    raise LengthDistributionError(f"a bin's weight must be >= 0, got {weight!r}")
            if not math.fsum(w for _, w in self.bins) > 0:
                raise LengthDistributionError("the histogram's weights must sum to more than 0")
            if list(self.bins) != sorted(self.bins):
                raise LengthDistributionError("histogram bins must be sorted by tokens")
        else:  # pragma: no cover - the enum is closed
            raise LengthDistributionError(f"unknown length distribution {kind!r}")

    def _within(self, name: str, value: int | None) -> None:
        if value is not None and value > self.limit_tokens:
            raise LengthDistributionError(
                f"{name} {value} exceeds the longest request, {self.limit_tokens} tokens"
            )

    @property
    def mu(self) -> float:
        """Lognormal: the underlying normal's mean, ``ln(mean) - sigma^2 / 2`` [-]."""
        assert self.mean_tokens is not None
        assert self.sigma is not None
        return math.log(self.mean_tokens) - self.sigma * self.sigma / 2

    def quantile_tokens(self, share: float) -> int:
        """The length at cumulative probability ``share`` in (0, 1): the inverse CDF [tokens]."""
        share = min(max(share, 1e-12), 1 - 1e-12)
        kind = self.kind
        if kind is LengthKind.FIXED:
            assert self.tokens is not None
            return self.tokens
        if kind is LengthKind.UNIFORM:
            assert self.min_tokens is not None
            assert self.max_tokens is not None
            span = self.max_tokens - self.min_tokens + 1
            return self.min_tokens + min(span - 1, int(share * span))
        if kind is LengthKind.LOGNORMAL:
            assert self.sigma is not None
            drawn = math.exp(self.mu + self.sigma * _UNIT.inv_cdf(share))
            return min(self.limit_tokens, max(1, round(drawn)))
        cumulative = _cumulative(self.bins)
        return self.bins[min(len(self.bins) - 1, bisect_right(cumulative, share))][0]

    def mean(self) -> float:
        """The mean length, clipping included [tokens].

        Notes
        -----
        Lognormal clipped above at ``c``: ``E[min(X, c)] = e^(mu + sigma^2/2)
        Phi((ln c - mu - sigma^2) / sigma) + c (1 - Phi((ln c - mu) / sigma))`` (rounding to
        whole tokens and the clip at 1 token are left out: under half a token).
        """
        kind = self.kind
        if kind is LengthKind.FIXED:
            assert self.tokens is not None
            return float(self.tokens)
        if kind is LengthKind.UNIFORM:
            assert self.min_tokens is not None
            assert self.max_tokens is not None
            return (self.min_tokens + self.max_tokens) / 2
        if kind is LengthKind.LOGNORMAL:
            assert self.mean_tokens is not None
            assert self.sigma is not None
            if self.sigma == 0:
                return float(min(self.limit_tokens, max(1, round(self.mean_tokens))))
            mu, sigma, cap = self.mu, self.sigma, self.limit_tokens
            above = (math.log(cap) - mu) / sigma
            return self.mean_tokens * _UNIT.cdf(above - sigma) + cap * (1 - _UNIT.cdf(above))
        total = math.fsum(w for _, w in self.bins)
        return math.fsum(t * w for t, w in self.bins) / total

    def mean_tokens_rounded(self) -> int:
        """:meth:`mean` as whole tokens, at least 1 (the mean request the roofline prices)."""
        return max(1, min(self.limit_tokens, math.floor(self.mean() + 0.5)))

    def longest_tokens(self) -> int:
        """The longest length a request can draw [tokens]."""
        kind = self.kind
        if kind is LengthKind.FIXED:
            assert self.tokens is not None
            return self.tokens
        if kind is LengthKind.UNIFORM:
            assert self.max_tokens is not None
            return self.max_tokens
        if kind is LengthKind.LOGNORMAL:
            return self.quantile_tokens(1.0) if self.sigma else self.mean_tokens_rounded()
        return max(t for t, w in self.bins if w > 0)

    def describe(self) -> str:
        """The distribution in words."""
        kind = self.kind
        if kind is LengthKind.FIXED:
            return f"fixed {self.tokens}"
        if kind is LengthKind.UNIFORM:
            return f"uniform {self.min_tokens}..{self.max_tokens}"
        if kind is LengthKind.LOGNORMAL:
            return (
                f"lognormal mean {self.mean_tokens:.4g} sigma {self.sigma:.3g} "
                f"(clipped to {self.limit_tokens})"
            )
        return f"histogram of {len(self.bins)} bins"


def _at_least_one(name: str, value: int | None) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise LengthDistributionError(f"{name} must be an integer >= 1, got {value!r}")


@lru_cache(maxsize=64)
def _cumulative(bins: tuple[tuple[int, float], ...]) -> tuple[float, ...]:
    total = math.fsum(w for _, w in bins)
    running, out = 0.0, []
    for _, weight in bins:
        running += weight
        out.append(running / total)
    return tuple(out)


@dataclass(frozen=True, slots=True, kw_only=True)
class RequestLengths:
    """Both sides of a request's lengths; drawn independently of each other."""

    prompt: LengthDistribution
    generated: LengthDistribution  # the first token (from the prefill) included

    @property
    def fixed(self) -> bool:
        """Every request at one prompt and one output length."""
        return self.prompt.kind is LengthKind.FIXED and self.generated.kind is LengthKind.FIXED

    def describe(self) -> str:
        """Both sides in words."""
        return f"prompts {self.prompt.describe()}, outputs {self.generated.describe()} tokens"


@dataclass(frozen=True, slots=True, kw_only=True)
class LengthSummary:
    """What a run's requests drew on one side [tokens]."""

    mean_tokens: float
    p99_tokens: int
    max_tokens: int


def summarise(lengths: tuple[int, ...]) -> LengthSummary:
    """Mean, p99 (the ``ceil(0.99 n)``-th smallest) and maximum of drawn lengths."""
    ordered = sorted(lengths)
    return LengthSummary(
        mean_tokens=math.fsum(ordered) / len(ordered),
        p99_tokens=ordered[max(0, math.ceil(P99 * len(ordered)) - 1)],
        max_tokens=ordered[-1],
    )


@lru_cache(maxsize=32)  # a run and its doubling, per side, per distribution in use
def sample_lengths(distribution: LengthDistribution, requests: int, seed: int) -> tuple[int, ...]:
    """``requests`` lengths drawn in stratified blocks of :data:`STRATUM_REQUESTS` [tokens].

    Block ``b`` draws ``u_j = (j + U_j) / B`` for ``j = 0 .. B-1`` (``U_j`` uniform in [0, 1)),
    in an order shuffled by the same seeded generator, and maps each through the inverse CDF
    (:meth:`LengthDistribution.quantile_tokens`). Blocks follow one another from one
    generator, so the first ``n`` lengths of a longer run are those of a run of ``n``.
    """
    _at_least_one("requests", requests)
    if distribution.kind is LengthKind.FIXED:
        assert distribution.tokens is not None
        return (distribution.tokens,) * requests
    rng = random.Random(seed)
    drawn: list[int] = []
    block = STRATUM_REQUESTS
    while len(drawn) < requests:
        shares = [(j + rng.random()) / block for j in range(block)]
        rng.shuffle(shares)
        drawn.extend(distribution.quantile_tokens(u) for u in shares)
    return tuple(drawn[:requests])


__all__ = [
    "LENGTH_SAMPLING",
    "MAX_HISTOGRAM_BINS",
    "MAX_P99_OVER_MEAN",
    "STRATUM_REQUESTS",
    "LengthDistribution",
    "LengthDistributionError",
    "LengthKind",
    "LengthSummary",
    "RequestLengths",
    "lognormal_sigma",
    "sample_lengths",
    "summarise",
]
