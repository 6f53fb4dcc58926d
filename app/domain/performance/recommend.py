"""CPU vs GPU (vs MIG slice) inference recommendations: assess, rank and explain (pure).

Every candidate is a prediction (:mod:`app.domain.performance.roofline`) at one device,
precision and batch size, with the memory engine's verdict on whether it fits. It is eligible
when it fits, meets the latency SLO with its margin (latency <= SLO x (1 - margin)), and has
what the objective needs (a price of the requested kind for cost, a TDP for energy). Costs
compare like with like: only prices of one kind (on-demand, reserved or spot) are ranked
together; a device whose price is of another kind has no cost figure, with the reason.
Per device and precision the batch that serves the objective best among the eligible ones is
kept; the survivors are ranked by the objective, and the first is explained in plain words
against the best candidate of the other kind (a CPU against an accelerator, and back).
"""

from __future__ import annotations

import math
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from enum import StrEnum

from app.domain.errors import DomainError
from app.domain.fit import fits
from app.domain.hardware import DeviceKind, HardwareSpec, PriceKind
from app.domain.performance.calibration import cpu_compute_unit
from app.domain.performance.llm_server import (
    IterationCost,
    IterationTiming,
    LlmServerLoad,
    LlmServerShape,
    llm_server_throughput,
    rate_ceiling_per_s,
)
from app.domain.performance.precision_schemes import PRECISION_SCHEMES
from app.domain.performance.prediction import Bound, Prediction
from app.domain.performance.request_lengths import RequestLengths
from app.domain.performance.serving import BatchTiming, ServerLoad, server_throughput
from app.domain.performance.serving import rate_ceiling_per_s as server_rate_ceiling_per_s
from app.domain.precision import Quantization

SECONDS_PER_HOUR = 3600.0
# Headroom kept under the latency SLO: a prediction within this fraction of the SLO is not a
# pass. A policy default, not a bound on the model's error (benchmarks/calibration/README.md:
# out-of-sample p90 latency, median predicted / measured 0.72 for ResNet-50, 1.17 for BERT).
DEFAULT_SLO_MARGIN_FRACTION = 0.1
MAX_SLO_MARGIN_FRACTION = 0.9


class RecommendationInputError(DomainError):
    """A requirement or figure a recommendation cannot be computed from."""


def _positive(name: str, value: float) -> None:
    """``value`` is a finite number at least the smallest normal float (dividing by it is safe)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise RecommendationInputError(f"{name} must be a number, got {value!r}")
    if not (math.isfinite(value) and value >= sys.float_info.min):
        raise RecommendationInputError(f"{name} must be a positive, finite number, got {value!r}")


def _non_negative(name: str, value: float) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise RecommendationInputError(f"{name} must be a number, got {value!r}")
    if not (math.isfinite(value) and value >= 0):
        raise RecommendationInputError(f"{name} must be a finite number >= 0, got {value!r}")


def _finite(name: str, value: float) -> float:
    if not math.isfinite(value):
        raise RecommendationInputError(f"{name} overflows ({value!r}): the inputs are out of scale")
    return value


class Scenario(StrEnum):
    """How requests reach a device (MLPerf's scenarios)."""

    OFFLINE = "offline"  # batches back to back: throughput = batch / interval
    SERVER = "server"  # Poisson arrivals, dynamic batching, p99 latency within the budget
    SINGLE_STREAM = "single_stream"  # one sample per query, the next after the answer


class Objective(StrEnum):
    """What a recommendation minimises."""

    COST = "cost"  # cost per million inferences (or per hour for a throughput target)
    ENERGY = "energy"  # energy per inference
    LATENCY = "latency"  # latency per request


@dataclass(frozen=True, slots=True, kw_only=True)
class Requirements:
    """The service-level objective and throughput target of a recommendation."""

    objective: Objective = Objective.COST
    latency_slo_s: float | None = None
    throughput_target_per_s: float | None = None
    slo_margin_fraction: float = DEFAULT_SLO_MARGIN_FRACTION
    price_kind: PriceKind = PriceKind.ON_DEMAND  # the one kind of price costs are ranked by
    # Decoder serving under the server scenario: p99 bounds on the time to first token and the
    # time per output token (both or neither; MLPerf's LLM Server scenario bounds).
    ttft_p99_s: float | None = None
    tpot_p99_s: float | None = None
    max_batched_tokens: int | None = None  # tokens per engine iteration (None: vLLM's default)
    max_num_seqs: int | None = None  # sequences in flight at most (None: vLLM's default)
    # The simulated requests' lengths when they vary (None: every request at the means).
    request_lengths: RequestLengths | None = None
    # latency_budget_s, computed once (every assessment of a search reads it)
    _budget_s: float | None = field(init=False, repr=False, compare=False, default=None)

    def __post_init__(self) -> None:
        if self.latency_slo_s is not None:
            _positive("latency_slo_s", self.latency_slo_s)
        if (self.ttft_p99_s is None) != (self.tpot_p99_s is None):
            raise RecommendationInputError("ttft_p99 and tpot_p99 bounds go together")
        for name in ("ttft_p99_s", "tpot_p99_s"):
            value = getattr(self, name)
            if value is not None:
                _positive(name, value)
        for name in ("max_batched_tokens", "max_num_seqs"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise RecommendationInputError(f"{name} must be >= 1")
        if self.throughput_target_per_s is not None:
            _positive("throughput_target_per_s", self.throughput_target_per_s)
        margin = self.slo_margin_fraction
        _non_negative("slo_margin_fraction", margin)
        if margin > MAX_SLO_MARGIN_FRACTION:
            raise RecommendationInputError(
                f"slo_margin_fraction must be at most {MAX_SLO_MARGIN_FRACTION}, got {margin!r}"
            )
        if not isinstance(self.price_kind, PriceKind):
            raise RecommendationInputError(f"unknown price kind {self.price_kind!r}")
        if self.latency_slo_s is not None:
            budget = latency_budget_s(self.latency_slo_s, self.slo_margin_fraction)
            object.__setattr__(self, "_budget_s", budget)

    @property
    def token_bounds(self) -> bool:
        """Whether TTFT and TPOT p99 bounds are set (decoder serving)."""
        return self.ttft_p99_s is not None and self.tpot_p99_s is not None

    @property
    def latency_budget_s(self) -> float | None:
        """The latency a candidate must stay at or under: SLO x (1 - margin) [s]."""
        return self._budget_s


def latency_budget_s(latency_slo_s: float, slo_margin_fraction: float) -> float:
    """The latency a prediction must not exceed to count as meeting the SLO.

    Parameters
    ----------
    latency_slo_s : latency service-level objective [s]
    slo_margin_fraction : headroom kept under the SLO, in [0, 0.9] [-]

    Returns
    -------
    budget : SLO * (1 - margin) [s]
    """
    _positive("latency_slo_s", latency_slo_s)
    _non_negative("slo_margin_fraction", slo_margin_fraction)
    return latency_slo_s * (1.0 - slo_margin_fraction)


def price_of_kind(device: HardwareSpec, kind: PriceKind) -> tuple[float | None, str | None]:
    """The device's price if it is of ``kind`` [USD/h], else None and why it is not used.

    Prices of different kinds (an on-demand list rate, a reservation, a spot rate) are not
    comparable, so only a price of the requested kind gives a cost.
    """
    price = device.price_usd_per_hour
    if price is None:
        return None, f"no {kind.value} price: give prices_usd_per_hour to rank it by cost"
    if device.price_kind is None:
        return None, (
            f"no {kind.value} price: its price ({price:.4g} USD/h) does not say its kind "
            "(stored before prices carried one); give prices_usd_per_hour to rank it by cost"
        )
    if device.price_kind is not kind:
        return None, (
            f"no {kind.value} price: its price is {device.price_kind.value} "
            f"({price:.4g} USD/h), not compared with {kind.value} prices "
            f"(price_kind={device.price_kind.value} ranks by those)"
        )
    return price, None


@dataclass(frozen=True, slots=True, kw_only=True)
class MemoryFit:
    """The memory engine's peak for the workload against the device's memory."""

    required_bytes: int
    available_bytes: int
    detail: str
    exact: bool = True  # False: required_bytes is a floor under the requirement, which overfills

    def __post_init__(self) -> None:
        for name in ("required_bytes", "available_bytes"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise RecommendationInputError(f"{name} must be an integer >= 0, got {value!r}")

    @property
    def fits(self) -> bool:
        """Peak <= device (or MIG profile) memory (app.domain.fit.fits)."""
        return fits(self.required_bytes, self.available_bytes)


def cost_per_million_usd(price_usd_per_hour: float, throughput_per_s: float) -> float:
    """Cost of a million inferences on a fully used device.

    Parameters
    ----------
    price_usd_per_hour : device price [USD/h]
    throughput_per_s : steady-state inferences per second [1/s]

    Returns
    -------
    cost : price / 3600 / throughput * 10^6 [USD]
    """
    _non_negative("price_usd_per_hour", price_usd_per_hour)
    _positive("throughput_per_s", throughput_per_s)
    cost = price_usd_per_hour / SECONDS_PER_HOUR / throughput_per_s * 1e6
    return _finite("cost_usd_per_million", cost)


def energy_per_inference_j(tdp_watts: float, latency_s: float, batch: int) -> float:
    """Energy of one inference, an upper bound: the device at TDP for the whole request.

    Parameters
    ----------
    tdp_watts : thermal design power [W]
    latency_s : latency of a batch [s]
    batch : inferences per batch [-]

    Returns
    -------
    energy : TDP * latency / batch [J]
    """
    _non_negative("tdp_watts", tdp_watts)
    _non_negative("latency_s", latency_s)
    if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
        raise RecommendationInputError(f"batch must be an integer >= 1, got {batch!r}")
    return _finite("energy_j_per_inference", tdp_watts * latency_s / batch)


def devices_needed(target_per_s: float, throughput_per_s: float) -> int:
    """Devices to reach a throughput target: ceil(target / throughput per device) [-]."""
    _positive("throughput_target_per_s", target_per_s)
    _positive("throughput_per_s", throughput_per_s)
    return max(1, math.ceil(_finite("devices_needed", target_per_s / throughput_per_s) - 1e-9))


@dataclass(frozen=True, slots=True, kw_only=True)
class Assessment:
    """A prediction judged against the requirements, with the reasons it is not eligible."""

    prediction: Prediction
    memory: MemoryFit
    meets_latency_slo: bool
    devices_needed: int | None  # None without a throughput target
    cost_usd_per_million: float | None
    fleet_cost_usd_per_hour: float | None  # devices_needed * price
    energy_j_per_inference: float | None
    reasons: tuple[str, ...]  # empty when eligible
    unpriced_reason: str | None = None  # why there is no cost figure (None: priced)
    server: ServerLoad | None = None  # the server scenario's queue (None: offline)
    llm_server: LlmServerLoad | None = None  # decoder serving under TTFT / TPOT p99 bounds

    @property
    def eligible(self) -> bool:
        """Fits, meets the SLO, and has what the objective needs."""
        return not self.reasons

    @property
    def latency_s(self) -> float:
        """The latency judged: the simulated p99 in the server scenario (decoder serving: the
        TTFT p99), else one batch's."""
        if self.llm_server is not None:
            return self.llm_server.ttft_p99_s
        return self.prediction.latency_s if self.server is None else self.server.p99_latency_s

    @property
    def throughput_per_s(self) -> float:
        """Per device: the sustained Poisson rate in the server scenario, else back-to-back
        batches [1/s]."""
        if self.llm_server is not None:
            return self.llm_server.arrival_rate_per_s
        if self.server is None:
            return self.prediction.throughput_per_s
        return self.server.arrival_rate_per_s


def assess(
    prediction: Prediction,
    memory: MemoryFit,
    requirements: Requirements,
    server: ServerLoad | None = None,
    llm_server: LlmServerLoad | None = None,
) -> Assessment:
    """Judge one prediction: SLO, devices for the target, cost, energy, and why it fails.

    With ``server`` (the server scenario at the prediction's batch as the dynamic batcher's
    cap) throughput is the sustained arrival rate and latency its simulated p99; energy is
    then TDP / rate (the device at TDP all the time, as the offline figure assumes).
    """
    device = prediction.device
    throughput = prediction.throughput_per_s if server is None else server.arrival_rate_per_s
    judged_s = prediction.latency_s if server is None else server.p99_latency_s
    if llm_server is not None:
        throughput, judged_s = llm_server.arrival_rate_per_s, llm_server.ttft_p99_s
    reasons: list[str] = []
    if not memory.fits:
        reasons.append(
            f"does not fit: needs {'' if memory.exact else 'at least '}"
            f"{memory.required_bytes / 2**30:.2f} GiB, has "
            f"{memory.available_bytes / 2**30:.2f} GiB"
        )
    slo = requirements.latency_slo_s
    budget = requirements.latency_budget_s
    meets = budget is None or judged_s <= budget
    if not meets:
        latency = f"latency {_ms(judged_s)}"
        if slo is None or budget is None:
            reasons.append("latency over the SLO")
        elif judged_s > slo:
            reasons.append(f"{latency} exceeds the {_ms(slo)} SLO")
        else:
            reasons.append(
                f"{latency} is within the {requirements.slo_margin_fraction:.0%} margin of the "
                f"{_ms(slo)} SLO (the budget is {_ms(budget)})"
            )
    target = requirements.throughput_target_per_s
    needed = None if target is None else devices_needed(target, throughput)
    price, unpriced = price_of_kind(device, requirements.price_kind)
    cost = fleet = None
    if price is not None:
        cost = cost_per_million_usd(price, throughput)
        fleet = None if needed is None else _finite("fleet_cost_usd_per_hour", needed * price)
    elif requirements.objective is Objective.COST and unpriced is not None:
        reasons.append(unpriced)
    energy = None
    if device.tdp_watts is not None and (server is not None or llm_server is not None):
        energy = energy_per_inference_j(device.tdp_watts, 1 / throughput, 1)
    elif device.tdp_watts is not None:
        energy = energy_per_inference_j(device.tdp_watts, prediction.latency_s, prediction.batch)
    elif requirements.objective is Objective.ENERGY:
        reasons.append("no TDP in the hardware profile: energy unknown")
    return Assessment(
        prediction=prediction,
        memory=memory,
        meets_latency_slo=meets,
        devices_needed=needed,
        cost_usd_per_million=cost,
        fleet_cost_usd_per_hour=fleet,
        energy_j_per_inference=energy,
        reasons=tuple(reasons),
        unpriced_reason=unpriced,
        server=server,
        llm_server=llm_server,
    )


def assess_server(options: Sequence[Assessment], requirements: Requirements) -> Assessment:
    """Of one device's options at one precision, the server scenario's answer.

    The options that fit memory time the dynamic batcher's batches
    (:func:`app.domain.performance.serving.server_throughput` at the latency budget as the
    p99 bound); the answer is the option at the chosen batch cap, assessed at the sustained
    rate and its p99 (a rate whose p99 is stable over twice the arrivals; ineligible, with the
    reason, when none settles). When nothing fits, or a lone request already misses the
    budget, the offline answer of :func:`best_batch` (its reasons say why).
    """
    budget = requirements.latency_budget_s
    if budget is None:
        raise RecommendationInputError("the server scenario needs a latency SLO (its p99 bound)")
    fitting = sorted((o for o in options if o.memory.fits), key=lambda o: o.prediction.batch)
    if not fitting:
        return best_batch(options, requirements.objective)
    load = server_throughput(server_timings(fitting), budget)
    if load is None:
        return best_batch(fitting, requirements.objective)
    chosen = next(o for o in fitting if o.prediction.batch == load.batch_cap)
    answer = assess(chosen.prediction, chosen.memory, requirements, server=load)
    if not load.stable:
        return with_reason(
            answer,
            f"no rate down to a thousandth of the first found keeps the simulated p99 within "
            f"{_ms(budget)} over twice the arrivals, moving by less than 5 % "
            f"({load.drift:.1%} at {_rate(load.arrival_rate_per_s)}/s)",
        )
    return answer


@dataclass(frozen=True, slots=True, kw_only=True)
class LlmPlan:
    """One device's fitting options at one precision as an LLM server to simulate."""

    fitting: tuple[Assessment, ...]  # by concurrency; the widest is the KV pool's limit
    timings: tuple[IterationTiming, ...]
    shape: LlmServerShape

    @property
    def widest(self) -> Assessment:
        """The option at the largest fitting concurrency (``max_seqs``)."""
        return self.fitting[-1]


def llm_plan(
    options: Sequence[Assessment],
    *,
    prompt_tokens: int,
    generated_tokens: int,
    max_batched_tokens: int,
    lengths: RequestLengths | None = None,
    kv_block_tokens: int = 1,
    max_num_seqs: int | None = None,
) -> LlmPlan | None:
    """The options that fit memory as continuous batching at that many sequences in flight:
    their prefill (``first_token_s``) and decode step (``per_token_s``) times, with the largest
    fitting concurrency as ``max_seqs`` (the KV pool's limit: every request holds its whole
    context's blocks); None when none fits. With ``lengths`` each simulated request draws its
    own and is admitted into the pool (``max_seqs`` mean requests' blocks of
    ``kv_block_tokens``) with its own blocks, at most ``max_num_seqs`` in flight."""
    fitting = tuple(
        sorted(
            (
                o
                for o in options
                if o.memory.fits
                and o.prediction.first_token_s is not None
                and o.prediction.per_token_s is not None
            ),
            key=lambda o: o.prediction.batch,
        )
    )
    if not fitting:
        return None
    timings = tuple(
        IterationTiming(
            sequences=o.prediction.batch,
            prefill_s=o.prediction.first_token_s or 0.0,
            decode_step_s=o.prediction.per_token_s or 0.0,
        )
        for o in fitting
    )
    shape = LlmServerShape(
        prompt_tokens=prompt_tokens,
        generated_tokens=generated_tokens,
        max_seqs=fitting[-1].prediction.batch,
        max_batched_tokens=max_batched_tokens,
        lengths=lengths,
        kv_block_tokens=kv_block_tokens if lengths is not None else 1,
        max_num_seqs=(
            None if lengths is None else max(max_num_seqs or 0, fitting[-1].prediction.batch)
        ),
    )
    return LlmPlan(fitting=fitting, timings=timings, shape=shape)


def llm_objective_floor(plan: LlmPlan, requirements: Requirements) -> float:
    """A lower bound of the objective's first key (:func:`sort_key`) the simulation can give:
    at the rate ceiling (:func:`app.domain.performance.llm_server.rate_ceiling_per_s`) for
    cost and energy, a lone request's prefill for latency [USD/h, USD per million, J or s]."""
    cost = IterationCost(plan.timings, plan.shape.prompt_tokens)
    rate = rate_ceiling_per_s(cost, plan.shape)
    device = plan.widest.prediction.device
    return _floor_at(device, rate, cost.prefill_s(plan.shape.prompt_tokens), requirements)


def _floor_at(
    device: HardwareSpec, rate_per_s: float, latency_floor_s: float, requirements: Requirements
) -> float:
    """The objective's first key at ``rate_per_s`` (cost, energy) or ``latency_floor_s``."""
    objective = requirements.objective
    if objective is Objective.LATENCY:
        return latency_floor_s
    if objective is Objective.ENERGY:
        return math.inf if device.tdp_watts is None else device.tdp_watts / rate_per_s
    price, _ = price_of_kind(device, requirements.price_kind)
    if price is None:
        return math.inf
    target = requirements.throughput_target_per_s
    if target is not None:
        return devices_needed(target, rate_per_s) * price
    return cost_per_million_usd(price, rate_per_s)


def server_timings(options: Sequence[Assessment]) -> list[BatchTiming]:
    """The dynamic batcher's timings: the options that fit memory, by batch."""
    fitting = sorted((o for o in options if o.memory.fits), key=lambda o: o.prediction.batch)
    return [
        BatchTiming(
            batch=o.prediction.batch,
            latency_s=o.prediction.latency_s,
            interval_s=min(o.prediction.interval_s, o.prediction.latency_s),
        )
        for o in fitting
    ]


def server_objective_floor(
    options: Sequence[Assessment], requirements: Requirements
) -> tuple[float, float] | None:
    """A lower bound of the objective's first key :func:`assess_server` can give, and the rate
    it is taken at: at the queue's rate ceiling
    (:func:`app.domain.performance.serving.rate_ceiling_per_s`) for cost and energy, the
    smallest timed batch's latency for latency; ``None`` when the queue answers no rate."""
    budget = requirements.latency_budget_s
    timings = server_timings(options)
    if budget is None or not timings:
        return None
    rate = server_rate_ceiling_per_s(timings, budget)
    if rate is None:
        return None
    device = options[0].prediction.device
    return _floor_at(device, rate, min(t.latency_s for t in timings), requirements), rate


def assess_llm_server(plan: LlmPlan, requirements: Requirements) -> Assessment:
    """Decoder serving of one device at one precision under TTFT / TPOT p99 bounds.

    :func:`app.domain.performance.llm_server.llm_server_throughput` over the plan's timings;
    the answer is the option at the widest concurrency, assessed at the sustained rate with its
    TTFT p99 as the latency judged. When a lone request already misses a bound, the smallest
    option with the reason.
    """
    ttft, tpot = requirements.ttft_p99_s, requirements.tpot_p99_s
    if ttft is None or tpot is None:
        raise RecommendationInputError("decoder serving needs ttft_p99 and tpot_p99 bounds")
    load = llm_server_throughput(plan.timings, plan.shape, ttft_bound_s=ttft, tpot_bound_s=tpot)
    if load is None:
        first = plan.fitting[0].prediction
        return with_reason(
            plan.fitting[0],
            f"a lone request misses the bounds: {_ms(first.first_token_s or 0)} to the first "
            f"token (bound {_ms(ttft)}), {_ms(first.per_token_s or 0)} per token (bound "
            f"{_ms(tpot)})",
        )
    widest = plan.widest
    return assess(widest.prediction, widest.memory, requirements, llm_server=load)


def with_reason(item: Assessment, reason: str) -> Assessment:
    """``item`` made ineligible for ``reason`` (kept with its figures, ranked after)."""
    return replace(item, meets_latency_slo=False, reasons=(*item.reasons, reason))


def objective_key(item: Assessment, objective: Objective) -> tuple[float, ...]:
    """What the objective ranks by, smallest first (cost or energy, then latency; or latency,
    then the negated throughput)."""
    inf = math.inf
    if objective is Objective.COST:
        cost = item.fleet_cost_usd_per_hour
        if cost is None:
            cost = item.cost_usd_per_million
        return (inf if cost is None else cost, item.latency_s)
    if objective is Objective.ENERGY:
        energy = item.energy_j_per_inference
        return (inf if energy is None else energy, item.latency_s)
    return (item.latency_s, -item.throughput_per_s)


def sort_key(item: Assessment, objective: Objective) -> tuple[object, ...]:
    """Eligible first, then by the objective; ties by slug, precision and batch (stable)."""
    p = item.prediction
    return (
        not item.eligible,
        not item.memory.fits,
        not item.meets_latency_slo,
        *objective_key(item, objective),
        p.device.slug,
        p.precision.value,
        p.batch,
    )


def best_batch(options: Sequence[Assessment], objective: Objective) -> Assessment:
    """Of one device's options at one precision (several batch sizes), the one to show.

    The eligible option that serves the objective best; when none is eligible, one that fits
    with the lowest latency (the closest miss), else the smallest batch.
    """
    if not options:
        raise ValueError("no options")
    eligible = [o for o in options if o.eligible]
    if eligible:
        return min(eligible, key=lambda o: sort_key(o, objective))
    fitting = [o for o in options if o.memory.fits]
    if fitting:
        return min(fitting, key=lambda o: (o.prediction.latency_s, o.prediction.batch))
    return min(options, key=lambda o: o.prediction.batch)


def rank(assessments: Iterable[Assessment], objective: Objective) -> list[Assessment]:
    """Eligible candidates by the objective, then the rest (fitting before not fitting)."""
    return sorted(assessments, key=lambda o: sort_key(o, objective))


# --------------------------------------------------------------------------------------------
# Explanation
# --------------------------------------------------------------------------------------------


def _ms(seconds: float) -> str:
    value = seconds * 1e3
    return f"{value:.3g} ms" if value < 1000 else f"{value:,.0f} ms"


def _rate(value: float) -> str:
    return f"{value:,.0f}" if value >= 100 else f"{value:.3g}"


def _ratio_words(ratio: float) -> str:
    """'a third of', 'half', '2.5x' - how one cost compares with another."""
    for fraction, words in ((1 / 4, "a quarter of"), (1 / 3, "a third of"), (1 / 2, "half")):
        if abs(ratio - fraction) <= 0.03:
            return words
    if ratio < 1:
        return f"{ratio:.0%} of"
    return f"{ratio:.1f}x"


def _is_cpu(item: Assessment) -> bool:
    return item.prediction.device.kind is DeviceKind.CPU


def _bound_sentence(item: Assessment) -> str:
    p = item.prediction
    split = p.time_split_s
    latency = p.latency_s
    intensity = p.arithmetic_intensity_flops_per_byte
    ridge = p.ridge_point_flops_per_byte
    side = "above" if intensity > ridge else "below"
    if p.bound is Bound.COMPUTE:
        why = (
            f"compute-bound: {split[Bound.COMPUTE] / latency:.0%} of the time runs kernels "
            f"limited by its {p.effective_flops_per_s / 1e12:.3g} TFLOP/s effective peak"
        )
    elif p.bound is Bound.MEMORY:
        why = (
            f"memory-bound: {split[Bound.MEMORY] / latency:.0%} of the time waits on memory "
            f"at {p.effective_bandwidth_bytes_per_s / 1e9:.3g} GB/s effective"
        )
    elif p.bound is Bound.TRANSFER:
        why = (
            f"transfer-bound: {split[Bound.TRANSFER] / latency:.0%} of the time copies "
            "inputs and outputs over the host link"
        )
    else:
        dispatch = (
            ", the wait for the framework to dispatch kernels from the host"
            if any(t.host_wait_s > 0 for t in p.phases)
            else ""
        )
        why = (
            f"overhead-bound: {split[Bound.OVERHEAD] / latency:.0%} of the time goes to "
            f"kernel launches{dispatch} and the per-request serving overhead"
        )
    return (
        f"It is {why} (arithmetic intensity {intensity:.3g} FLOP/B, {side} its ridge point of "
        f"{ridge:.3g} FLOP/B)."
    )


def quantization_sentence(p: Prediction) -> str:
    """What a quantized precision means in the figures (weight-only or W8A8), or "" when the
    precision is not quantized (the full convention is in ``Prediction.assumptions``)."""
    scheme = PRECISION_SCHEMES[p.precision]
    weight_bits = int(scheme.weight_bytes * 8)
    activation_bits = scheme.activation_bytes * 8
    label = f"W{weight_bits}A{activation_bits}"
    if scheme.quantization is Quantization.WEIGHT_ONLY:
        return (
            f"{p.precision.value} is weight-only {label}: {weight_bits}-bit weights "
            f"dequantized to {scheme.activation_dtype.value}, math at the "
            f"{p.compute_dtype.value} peak."
        )
    if scheme.quantization is Quantization.W8A8:
        return (
            f"{p.precision.value} is {label}: {weight_bits}-bit weights and activations, math "
            f"at the {p.compute_dtype.value} peak."
        )
    if scheme.quantization is Quantization.W4A4:
        return (
            f"{p.precision.value} is W4A4: 4-bit weights and GEMM inputs (activations between "
            f"kernels {scheme.activation_dtype.value}), math at the {p.compute_dtype.value} "
            "peak."
        )
    return ""


def _headline(item: Assessment, requirements: Requirements) -> str:
    p = item.prediction
    if item.llm_server is not None:
        load = item.llm_server
        parts = [
            f"TTFT p99 {_ms(load.ttft_p99_s)} (bound {_ms(load.ttft_bound_s)}) and TPOT p99 "
            f"{_ms(load.tpot_p99_s)} (bound {_ms(load.tpot_bound_s)}) under Poisson arrivals "
            f"(continuous batching, up to {load.max_seqs} sequences in flight)"
        ]
    elif item.server is None:
        parts = [f"{_ms(p.latency_s)} per request"]
    else:
        parts = [
            f"p99 {_ms(item.latency_s)} per request under Poisson arrivals (batches of up to "
            f"{item.server.batch_cap})"
        ]
    slo, budget = requirements.latency_slo_s, requirements.latency_budget_s
    if slo is not None and budget is not None:
        parts[0] += f" against the {_ms(slo)} SLO"
        if requirements.slo_margin_fraction > 0:
            parts[0] += (
                f" ({_ms(budget)} budget with its {requirements.slo_margin_fraction:.0%} margin)"
            )
    if p.first_token_s is not None and p.per_token_s is not None:
        parts.append(
            f"{_ms(p.first_token_s)} to the first token then {_ms(p.per_token_s)} per token"
        )
    unit = "sequences" if p.first_token_s is not None else "inferences"
    if item.llm_server is not None:
        unit = "requests"
    parts.append(f"{_rate(item.throughput_per_s)} {unit}/s per device")
    if item.devices_needed is not None and requirements.throughput_target_per_s is not None:
        count = item.devices_needed
        parts.append(
            f"{count} device{'s' if count != 1 else ''} for "
            f"{_rate(requirements.throughput_target_per_s)}/s"
        )
    if item.cost_usd_per_million is not None:
        parts.append(f"${item.cost_usd_per_million:.3g} per million inferences")
    if item.energy_j_per_inference is not None:
        parts.append(f"at most {item.energy_j_per_inference:.3g} J per inference")
    return ", ".join(parts)


def _overhead_share(item: Assessment) -> float:
    split = item.prediction.time_split_s
    return (split[Bound.TRANSFER] + split[Bound.OVERHEAD]) / item.prediction.latency_s


def _objective_text(item: Assessment, objective: Objective, requirements: Requirements) -> str:
    if objective is Objective.COST:
        target = requirements.throughput_target_per_s
        if item.fleet_cost_usd_per_hour is not None and target is not None:
            return f"${item.fleet_cost_usd_per_hour:.3g}/h for {_rate(target)}/s"
        return f"${item.cost_usd_per_million or 0:.3g} per million inferences"
    if objective is Objective.ENERGY:
        return f"{item.energy_j_per_inference or 0:.3g} J per inference"
    return _ms(item.latency_s)


def _device_label(p: Prediction) -> str:
    if p.device.kind is DeviceKind.CPU and p.device.simd:
        return f"{p.device.name} with {cpu_compute_unit(p.device.simd, p.compute_dtype)}"
    return p.device.name


def _comparison(
    best: Assessment, other: Assessment, objective: Objective, requirements: Requirements
) -> str:
    p = other.prediction
    label = "CPU" if _is_cpu(other) else "accelerator"
    head = f"The best {label} option, {_device_label(p)} at {p.precision.value} batch {p.batch}"
    if not other.eligible:
        return f"{head}, is not eligible: {'; '.join(other.reasons)}."
    mine, theirs = objective_key(best, objective)[0], objective_key(other, objective)[0]
    measure = {
        Objective.COST: "the cost",
        Objective.ENERGY: "the energy",
        Objective.LATENCY: "the latency",
    }[objective]
    sentence = head
    if mine > 0:
        theirs_text = _objective_text(other, objective, requirements)
        mine_text = _objective_text(best, objective, requirements)
        shared = " for "
        if shared in mine_text and theirs_text.endswith(mine_text[mine_text.index(shared) :]):
            theirs_text = theirs_text[: theirs_text.index(shared)]
        sentence += (
            f", needs {_ratio_words(theirs / mine)} {measure} ({theirs_text} against {mine_text})"
        )
    share = _overhead_share(other)
    if share >= 0.3:
        sentence += (
            f": at batch {p.batch} it spends {share:.0%} of its {_ms(p.latency_s)} on "
            "host-link transfer and launch/serving overhead"
        )
    return sentence + "."


def explain(
    ranked: Sequence[Assessment],
    requirements: Requirements,
    *,
    model: str,
    unpriced: int = 0,
    excluded: int = 0,
) -> str:
    """A paragraph in plain words: what to run, why, and what the alternative costs."""
    objective = requirements.objective
    notes = []
    kind = requirements.price_kind.value
    if objective is Objective.COST:
        notes.append(f"costs compare {kind} prices only")
    if unpriced and objective is Objective.COST:
        notes.append(
            f"{unpriced} device(s) have no {kind} price and are not ranked by cost (their "
            "reasons say why; give prices_usd_per_hour to price them)"
        )
    if excluded:
        notes.append(
            f"{excluded} device/precision pair(s) were excluded (see 'excluded' for the reasons)"
        )
    tail = (" " + "; ".join(notes) + ".") if notes else ""
    if not ranked:
        return f"No candidate could be evaluated for {model}.{tail}"
    best = ranked[0]
    p = best.prediction
    if not best.eligible:
        return (
            f"No candidate meets every requirement for {model}. The closest is "
            f"{p.device.name} at {p.precision.value} batch {p.batch} "
            f"({_headline(best, requirements)}), which fails: {'; '.join(best.reasons)}.{tail}"
        )
    text = (
        f"Run {model} on {_device_label(p)} at {p.precision.value}, batch {p.batch}: "
        f"{_headline(best, requirements)}. {_bound_sentence(best)}"
    )
    if quantized := quantization_sentence(p):
        text += " " + quantized
    if (other := compared_index(ranked)) is not None:
        text += " " + _comparison(best, ranked[other], objective, requirements)
    return text + tail


def compared_index(ranked: Sequence[Assessment]) -> int | None:
    """Where the assessment is that :func:`explain` compares the best one with: the best of
    the other device kind (CPU or accelerator), if any."""
    cpu = bool(ranked) and _is_cpu(ranked[0])
    return next((i for i in range(1, len(ranked)) if _is_cpu(ranked[i]) != cpu), None)
