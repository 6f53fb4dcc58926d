"""Request length distributions of decoder serving under TTFT / TPOT p99 bounds: what a
request says (one side: prompts or outputs) and what an answer echoes (the distribution with
the lengths its simulated requests drew)."""

from __future__ import annotations

from typing import Self

from pydantic import Field, model_validator

from app.domain.performance.request_lengths import (
    MAX_HISTOGRAM_BINS,
    MAX_P99_OVER_MEAN,
    STRATUM_REQUESTS,
    LengthKind,
)
from app.schemas.base import Schema, located_error
from app.schemas.estimates import Length

MAX_LENGTH_TOKENS = 16_777_216  # the Length type's bound

# Which parameters each kind takes (the others must be left out).
KIND_FIELDS: dict[LengthKind, tuple[str, ...]] = {
    LengthKind.FIXED: (),
    LengthKind.UNIFORM: ("min_tokens", "max_tokens"),
    LengthKind.LOGNORMAL: ("mean_tokens", "p99_tokens", "sigma"),
    LengthKind.HISTOGRAM: ("bins",),
}
PARAMETERS = ("min_tokens", "max_tokens", "mean_tokens", "p99_tokens", "sigma", "bins")


class LengthBin(Schema):
    """One bar of a length histogram."""

    tokens: Length = Field(description="A length [tokens].", examples=[256])
    weight: float = Field(
        ge=0,
        le=1e12,
        allow_inf_nan=False,
        description="Its relative frequency (counts or shares: the weights are normalised; "
        "they must sum to more than 0).",
        examples=[3.0],
    )


class LengthDistributionSpec(Schema):
    """How one side of the requests' lengths (prompt or output) is spread.

    Each simulated request draws its lengths from these (prompts and outputs independently),
    by stratified sampling from a fixed seed: the same request gives the same answer.
    """

    kind: LengthKind = Field(
        default=LengthKind.FIXED,
        description="fixed (default): every request at the mean (prompt_tokens_mean / "
        "generated_tokens_mean, else the maximum), the behaviour without a distribution. "
        "uniform: every whole length from min_tokens to max_tokens equally likely. lognormal: "
        "exp(mu + sigma Z) rounded to whole tokens, given by mean_tokens and either p99_tokens "
        "or sigma, clipped to [1, prompt_tokens] (outputs: [1, generated_tokens], as "
        "max_tokens stops a generation). histogram: bins of (tokens, weight), e.g. a measured "
        "trace's.",
        examples=["lognormal"],
    )
    min_tokens: Length | None = Field(
        default=None, description="uniform: the shortest length [tokens].", examples=[None]
    )
    max_tokens: Length | None = Field(
        default=None,
        description="uniform: the longest length, at most prompt_tokens (outputs: "
        "generated_tokens) [tokens].",
        examples=[None],
    )
    mean_tokens: float | None = Field(
        default=None,
        gt=0,
        le=MAX_LENGTH_TOKENS,
        allow_inf_nan=False,
        description="lognormal: the mean of the (unclipped) distribution [tokens].",
        examples=[512.0],
    )
    p99_tokens: float | None = Field(
        default=None,
        gt=0,
        le=MAX_LENGTH_TOKENS,
        allow_inf_nan=False,
        description="lognormal: its 99th percentile, from mean_tokens to "
        f"{MAX_P99_OVER_MEAN:.4g} x mean_tokens (no lognormal has a higher p99 for its mean) "
        "and at most prompt_tokens (outputs: generated_tokens); sets sigma = z - sqrt(z^2 - "
        "2 ln(p99 / mean)), z = 2.326. Give this or sigma [tokens].",
        examples=[2048.0],
    )
    sigma: float | None = Field(
        default=None,
        ge=0,
        le=4,
        allow_inf_nan=False,
        description="lognormal: the standard deviation of the length's logarithm (0: every "
        "request at the mean). Give this or p99_tokens [-].",
        examples=[None],
    )
    bins: list[LengthBin] | None = Field(
        default=None,
        min_length=1,
        max_length=MAX_HISTOGRAM_BINS,
        description=f"histogram: 1 to {MAX_HISTOGRAM_BINS} bins, each length at most "
        "prompt_tokens (outputs: generated_tokens) and given once.",
        examples=[None],
    )

    @model_validator(mode="after")
    def _parameters_of_the_kind(self) -> Self:
        name = type(self).__name__
        wanted = KIND_FIELDS[self.kind]
        for field in PARAMETERS:
            if field not in wanted and getattr(self, field) is not None:
                raise located_error(
                    name,
                    (field,),
                    f"{field} is not a parameter of kind {self.kind.value} (it takes "
                    f"{', '.join(wanted) or 'none'})",
                )
        if self.kind is LengthKind.UNIFORM:
            for field in wanted:
                if getattr(self, field) is None:
                    raise located_error(name, (field,), f"kind uniform needs {field}")
            assert self.min_tokens is not None
            assert self.max_tokens is not None
            if self.min_tokens > self.max_tokens:
                raise located_error(
                    name,
                    ("min_tokens",),
                    f"min_tokens {self.min_tokens} exceeds max_tokens {self.max_tokens}",
                )
        elif self.kind is LengthKind.LOGNORMAL:
            self._lognormal(name)
        elif self.kind is LengthKind.HISTOGRAM:
            if self.bins is None:
                raise located_error(name, ("bins",), "kind histogram needs bins")
            seen: set[int] = set()
            for index, item in enumerate(self.bins):
                if item.tokens in seen:
                    raise located_error(
                        name, ("bins", index, "tokens"), f"length {item.tokens} is given twice"
                    )
                seen.add(item.tokens)
            if not sum(item.weight for item in self.bins) > 0:
                raise located_error(
                    name, ("bins",), "the weights must sum to more than 0 (all are 0)"
                )
        return self

    def _lognormal(self, name: str) -> None:
        if self.mean_tokens is None:
            raise located_error(name, ("mean_tokens",), "kind lognormal needs mean_tokens")
        if (self.p99_tokens is None) == (self.sigma is None):
            raise located_error(
                name,
                ("p99_tokens",),
                "kind lognormal takes p99_tokens or sigma (one of them) beside mean_tokens",
            )
        if self.p99_tokens is not None:
            if self.p99_tokens < self.mean_tokens:
                raise located_error(
                    name,
                    ("p99_tokens",),
                    f"p99_tokens {self.p99_tokens:g} is below mean_tokens "
                    f"{self.mean_tokens:g}: a lognormal's p99 is at least its mean",
                )
            if self.p99_tokens > MAX_P99_OVER_MEAN * self.mean_tokens:
                raise located_error(
                    name,
                    ("p99_tokens",),
                    f"p99_tokens {self.p99_tokens:g} is over {MAX_P99_OVER_MEAN:.4g} x "
                    f"mean_tokens: no lognormal has that mean and p99 (give sigma, or a "
                    "histogram)",
                )

    def longest_tokens(self, limit_tokens: int) -> int:
        """The longest length a request can draw (lognormal: the clip) [tokens]."""
        if self.kind is LengthKind.UNIFORM and self.max_tokens is not None:
            return self.max_tokens
        if self.kind is LengthKind.HISTOGRAM and self.bins is not None:
            return max(item.tokens for item in self.bins if item.weight > 0)
        return limit_tokens

    def beyond(self, limit_tokens: int) -> tuple[tuple[str | int, ...], str] | None:
        """The first parameter above ``limit_tokens`` (its location and value), or None."""
        if self.kind is LengthKind.UNIFORM and (self.max_tokens or 0) > limit_tokens:
            return ("max_tokens",), f"max_tokens {self.max_tokens}"
        if self.kind is LengthKind.LOGNORMAL:
            for field in ("mean_tokens", "p99_tokens"):
                value = getattr(self, field)
                if value is not None and value > limit_tokens:
                    return (field,), f"{field} {value:g}"
        if self.kind is LengthKind.HISTOGRAM:
            for index, item in enumerate(self.bins or []):
                if item.tokens > limit_tokens:
                    return ("bins", index, "tokens"), f"a bin's tokens {item.tokens}"
        return None


class DrawnLengthsRead(Schema):
    """One side's lengths as the simulated requests drew them."""

    distribution: LengthDistributionSpec = Field(description="As the request gave it.")
    sigma: float | None = Field(
        default=None,
        description="lognormal: the sigma used (from p99_tokens when that was given) [-].",
        examples=[0.72],
    )
    mean_tokens: float = Field(
        description="Mean length over the answer's simulated requests [tokens].",
        examples=[509.8],
    )
    p99_tokens: int = Field(
        description="99th-percentile length over the answer's simulated requests [tokens].",
        examples=[2041],
    )
    max_tokens: int = Field(
        description="Longest length drawn over the answer's simulated requests [tokens].",
        examples=[4096],
    )


class LengthsSimulatedRead(Schema):
    """The request lengths of the simulated LLM server, when they vary."""

    prompt: DrawnLengthsRead = Field(description="Prompt lengths.")
    generated: DrawnLengthsRead = Field(description="Output lengths (the first token included).")
    kv_pool_tokens: int = Field(
        description="The KV pool's token slots: max_num_seqs mean requests' blocks (or the "
        "longest request's, when larger). Each request is admitted with its own prompt + "
        "output rounded up to kv_block_tokens, FCFS, while they fit beside those in flight.",
        examples=[81920],
    )
    max_num_seqs: int = Field(
        description="Sequences in flight at most whatever their lengths (the engine's "
        "max_num_seqs: the request's, else vLLM's default).",
        examples=[256],
    )
    sampling: str = Field(
        description="How the lengths were drawn.",
        examples=[f"stratified in blocks of {STRATUM_REQUESTS} requests"],
    )
