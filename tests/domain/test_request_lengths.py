"""Request length distributions and their stratified, seeded samples (golden numbers derived
by hand from the inverse CDFs)."""

from __future__ import annotations

import math
from typing import Any

import pytest

from app.domain.performance.request_lengths import (
    MAX_P99_OVER_MEAN,
    LengthDistribution,
    LengthDistributionError,
    LengthKind,
    lognormal_sigma,
    sample_lengths,
    summarise,
)

UNIFORM = LengthDistribution(
    kind=LengthKind.UNIFORM, min_tokens=1, max_tokens=100, limit_tokens=100
)
HISTOGRAM = LengthDistribution(
    kind=LengthKind.HISTOGRAM, bins=((10, 1.0), (30, 3.0)), limit_tokens=64
)


def test_each_block_of_100_uniform_draws_takes_every_length_once() -> None:
    # u in stratum j of 100 maps to 1 + floor(u x 100) = 1 + j: one of each length per block
    drawn = sample_lengths(UNIFORM, 300, 7)
    for block in range(3):
        assert sorted(drawn[100 * block : 100 * (block + 1)]) == list(range(1, 101))
    assert drawn[:100] != tuple(range(1, 101))  # in a shuffled order, not ascending


def test_a_histogram_block_draws_each_length_in_proportion_to_its_weight() -> None:
    drawn = sample_lengths(HISTOGRAM, 200, 3)
    assert drawn.count(10) == 50  # weight 1 of 4: strata 0..24 of each block of 100
    assert drawn.count(30) == 150
    assert HISTOGRAM.mean() == pytest.approx((10 + 3 * 30) / 4)
    summary = summarise(drawn)
    assert summary.mean_tokens == pytest.approx(25.0)
    assert summary.p99_tokens == 30
    assert summary.max_tokens == 30


def test_a_longer_run_extends_a_shorter_one_and_the_same_seed_gives_the_same_lengths() -> None:
    lognormal = LengthDistribution(
        kind=LengthKind.LOGNORMAL, mean_tokens=512, sigma=0.8, limit_tokens=8192
    )
    assert sample_lengths(lognormal, 4000, 11)[:2000] == sample_lengths(lognormal, 2000, 11)
    assert sample_lengths(lognormal, 2000, 11) != sample_lengths(lognormal, 2000, 12)


def test_lognormal_sigma_from_mean_and_p99() -> None:
    # sigma^2 - 2 z sigma + 2 ln(q / m) = 0, z = 2.3263: for q / m = 3.5,
    # sigma = 2.3263 - sqrt(5.4119 - 2.5055) = 0.6215
    sigma = lognormal_sigma(200, 700)
    assert sigma == pytest.approx(0.62154, abs=1e-5)
    mu = math.log(200) - sigma**2 / 2
    assert math.exp(mu + sigma * 2.3263479) == pytest.approx(700)
    assert lognormal_sigma(200, 200) == 0.0
    with pytest.raises(LengthDistributionError, match="below mean_tokens"):
        lognormal_sigma(200, 199)
    with pytest.raises(LengthDistributionError, match="no lognormal"):
        lognormal_sigma(10, 10 * MAX_P99_OVER_MEAN * 1.01)


def test_the_drawn_lognormal_has_its_mean_and_p99_and_is_clipped_to_the_longest() -> None:
    lognormal = LengthDistribution(
        kind=LengthKind.LOGNORMAL,
        mean_tokens=200,
        sigma=lognormal_sigma(200, 700),
        limit_tokens=768,
    )
    drawn = sample_lengths(lognormal, 2000, 5)
    summary = summarise(drawn)
    assert summary.mean_tokens == pytest.approx(lognormal.mean(), rel=0.005)
    # the 1,980th of 2,000 is the largest draw of the 98-99 % stratum: between the
    # distribution's 98th percentile (590.5) and its 99th (700)
    assert 590 <= summary.p99_tokens <= 700
    assert summary.max_tokens == 768  # the top stratum reaches the clip
    assert lognormal.longest_tokens() == 768
    # the clip moves the mean below the unclipped 200: E[min(X, 768)]
    assert lognormal.mean() < 200


@pytest.mark.parametrize(
    "bad",
    [
        {"kind": LengthKind.FIXED, "tokens": 0, "limit_tokens": 8},
        {"kind": LengthKind.FIXED, "tokens": 9, "limit_tokens": 8},
        {"kind": LengthKind.UNIFORM, "min_tokens": 5, "max_tokens": 4, "limit_tokens": 8},
        {"kind": LengthKind.UNIFORM, "min_tokens": 1, "max_tokens": 9, "limit_tokens": 8},
        {"kind": LengthKind.LOGNORMAL, "mean_tokens": -1.0, "sigma": 1.0, "limit_tokens": 8},
        {"kind": LengthKind.LOGNORMAL, "mean_tokens": 4.0, "sigma": -1.0, "limit_tokens": 8},
        {"kind": LengthKind.HISTOGRAM, "bins": (), "limit_tokens": 8},
        {"kind": LengthKind.HISTOGRAM, "bins": ((4, 0.0),), "limit_tokens": 8},
        {"kind": LengthKind.HISTOGRAM, "bins": ((4, -1.0),), "limit_tokens": 8},
        {"kind": LengthKind.HISTOGRAM, "bins": ((4, 1.0), (16, 1.0)), "limit_tokens": 8},
        {"kind": LengthKind.HISTOGRAM, "bins": ((6, 1.0), (4, 1.0)), "limit_tokens": 8},
    ],
)
def test_distributions_that_cannot_describe_lengths_are_refused(bad: dict[str, Any]) -> None:
    with pytest.raises(LengthDistributionError):
        LengthDistribution(**bad)
