"""CPU vs GPU (vs MIG slice) inference recommendations: assess and rank (pure).

Every candidate is a prediction (:mod:`app.domain.performance.roofline`) at one device,
precision and batch size, with the memory engine's verdict on whether it fits. It is eligible
when it fits, meets the latency SLO with its margin (latency <= SLO x (1 - margin)), and has
what the objective needs (a price of the requested kind for cost, a TDP for energy). Costs
compare like with like: only prices of one kind (on-demand, reserved or spot) are ranked
together; a device whose price is of another kind has no cost figure, with the reason.
Per device and precision the batch that serves the objective best among the eligible ones is
kept; the survivors are ranked by the objective, and the first is explained in plain words
against the best candidate of the other kind (a CPU against an accelerator, and back:
:mod:`app.domain.performance.explanation`).
"""

from __future__ import annotations

import math
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from enum import StrEnum

from app.domain.errors import DomainError
from app.domain.fit import fits
from app.domain.hardware import HardwareSpec, PriceKind
from app.domain.performance.llm_server import (
    IterationCost,
    IterationTiming,
    LlmServerLoad,
    LlmServerShape,
    llm_server_throughput,
    rate_ceiling_per_s,
)
from app.domain.performance.prediction import Prediction
from app.domain.performance.request_lengths import RequestLengths
from app.domain.performance.serving import BatchTiming, ServerLoad, server_throughput
from app.domain.performance.serving import rate_ceiling_per_s as server_rate_ceiling_per_s

SECONDS_PER_HOUR = 3600.0
# Headroom kept under the latency SLO: a prediction within this fraction of the SLO is not a
# pass. A policy default, not a bound on the model's error (benchmarks/calibration/README.md:
# out-of-sample p90 latency, median predicted / measured 0.72 for ResNet-50, 1.17 for BERT).
DEFAULT_SLO_MARGIN_FRACTION = 0.1
MAX_SLO_MARGIN_FRACTION = 0.9


class RecommendationInputError(DomainError):
    """A requirement or figure a recommendation cannot be computed from."""


_MAX_FLOAT = sys.float_info.max
_MIN_NORMAL = sys.float_info.min


def _positive(name: str, value: float) -> None:
    """``value`` is a finite number at least the smallest normal float (dividing by it is safe)."""
    if type(value) is float and _MIN_NORMAL <= value <= _MAX_FLOAT:
        return  # the common case, which passes every check below (a search checks thousands)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise RecommendationInputError(f"{name} must be a number, got {value!r}")
    if not (math.isfinite(value) and value >= sys.float_info.min):
        raise RecommendationInputError(f"{name} must be a positive, finite number, got {value!r}")


def _non_negative(name: str, value: float) -> None:
    if type(value) is float and 0.0 <= value <= _MAX_FLOAT:
        return  # the common case, which passes every check below
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
        latency = f"latency {in_ms(judged_s)}"
        if slo is None or budget is None:
            reasons.append("latency over the SLO")
        elif judged_s > slo:
            reasons.append(f"{latency} exceeds the {in_ms(slo)} SLO")
        else:
            reasons.append(
                f"{latency} is within the {requirements.slo_margin_fraction:.0%} margin of the "
                f"{in_ms(slo)} SLO (the budget is {in_ms(budget)})"
            )
    needed, unpriced, cost, fleet, energy = _figures(
        device,
        throughput,
        prediction.latency_s,
        prediction.batch,
        requirements,
        at_rate=server is not None or llm_server is not None,
    )
    reasons += _objective_reasons(device, cost, unpriced, requirements.objective)
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


def _figures(
    device: HardwareSpec,
    throughput_per_s: float,
    latency_s: float,
    batch: int,
    requirements: Requirements,
    *,
    at_rate: bool,
) -> tuple[int | None, str | None, float | None, float | None, float | None]:
    """:func:`assess`'s devices needed, reason for no price, cost per million, fleet cost
    and energy per inference (``at_rate``: TDP / rate, else TDP x latency / batch)."""
    target = requirements.throughput_target_per_s
    needed = None if target is None else devices_needed(target, throughput_per_s)
    price, unpriced = price_of_kind(device, requirements.price_kind)
    cost = fleet = None
    if price is not None:
        cost = cost_per_million_usd(price, throughput_per_s)
        fleet = None if needed is None else _finite("fleet_cost_usd_per_hour", needed * price)
    energy = None
    if device.tdp_watts is not None and at_rate:
        energy = energy_per_inference_j(device.tdp_watts, 1 / throughput_per_s, 1)
    elif device.tdp_watts is not None:
        energy = energy_per_inference_j(device.tdp_watts, latency_s, batch)
    return needed, unpriced, cost, fleet, energy


def _objective_reasons(
    device: HardwareSpec, cost: float | None, unpriced: str | None, objective: Objective
) -> list[str]:
    """Why the objective has no figure: no price of the requested kind for cost, no TDP for
    energy (empty when it has one)."""
    if cost is None and objective is Objective.COST and unpriced is not None:
        return [unpriced]
    if device.tdp_watts is None and objective is Objective.ENERGY:
        return ["no TDP in the hardware profile: energy unknown"]
    return []


# An option as :func:`best_option` reads it: its sort key (:func:`sort_key`), whether it is
# eligible, whether it fits, its latency [s] and its batch
OptionRow = tuple[tuple[object, ...], bool, bool, float, int]


def option_row(
    device: HardwareSpec,
    precision: str,
    batch: int,
    latency_s: float,
    interval_s: float,
    fits: bool,
    requirements: Requirements,
) -> OptionRow:
    """The row of ``assess(prediction, memory, requirements)`` for an offline prediction with
    these figures and a memory verdict of ``fits``, without building either (a search judges
    every batch of a candidate by it and builds the assessment of the batch it shows): the
    same figures, checks and errors as :func:`assess`. ``precision``: its value (``fp16``)."""
    throughput = batch / interval_s  # Prediction.throughput_per_s
    budget = requirements.latency_budget_s
    meets = budget is None or latency_s <= budget
    _, unpriced, cost, fleet, energy = _figures(
        device, throughput, latency_s, batch, requirements, at_rate=False
    )
    objective = requirements.objective
    eligible = fits and meets and not _objective_reasons(device, cost, unpriced, objective)
    key = (
        not eligible,
        not fits,
        not meets,
        *_objective_key(objective, cost, fleet, energy, latency_s, throughput),
        device.slug,
        precision,
        batch,
    )
    return key, eligible, fits, latency_s, batch


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
            f"{in_ms(budget)} over twice the arrivals, moving by less than 5 % "
            f"({load.drift:.1%} at {rate_text(load.arrival_rate_per_s)}/s)",
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
            f"a lone request misses the bounds: {in_ms(first.first_token_s or 0)} to the first "
            f"token (bound {in_ms(ttft)}), {in_ms(first.per_token_s or 0)} per token (bound "
            f"{in_ms(tpot)})",
        )
    widest = plan.widest
    return assess(widest.prediction, widest.memory, requirements, llm_server=load)


def with_reason(item: Assessment, reason: str) -> Assessment:
    """``item`` made ineligible for ``reason`` (kept with its figures, ranked after)."""
    return replace(item, meets_latency_slo=False, reasons=(*item.reasons, reason))


def objective_key(item: Assessment, objective: Objective) -> tuple[float, ...]:
    """What the objective ranks by, smallest first (cost or energy, then latency; or latency,
    then the negated throughput)."""
    return _objective_key(
        objective,
        item.cost_usd_per_million,
        item.fleet_cost_usd_per_hour,
        item.energy_j_per_inference,
        item.latency_s,
        item.throughput_per_s,
    )


def _objective_key(
    objective: Objective,
    cost_usd_per_million: float | None,
    fleet_cost_usd_per_hour: float | None,
    energy_j_per_inference: float | None,
    latency_s: float,
    throughput_per_s: float,
) -> tuple[float, float]:
    """:func:`objective_key` of an assessment with these figures."""
    inf = math.inf
    if objective is Objective.COST:
        cost = fleet_cost_usd_per_hour
        if cost is None:
            cost = cost_usd_per_million
        return (inf if cost is None else cost, latency_s)
    if objective is Objective.ENERGY:
        energy = energy_j_per_inference
        return (inf if energy is None else energy, latency_s)
    return (latency_s, -throughput_per_s)


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
    rows = [
        (
            sort_key(o, objective),
            o.eligible,
            o.memory.fits,
            o.prediction.latency_s,
            o.prediction.batch,
        )
        for o in options
    ]
    return options[best_option(rows)]


def best_option(rows: Sequence[OptionRow]) -> int:
    """Which of one device's options at one precision :func:`best_batch` shows (its index),
    from their rows (:data:`OptionRow`)."""
    if not rows:
        raise ValueError("no options")
    indices = range(len(rows))
    eligible = [i for i in indices if rows[i][1]]
    if eligible:
        return min(eligible, key=lambda i: rows[i][0])
    fitting = [i for i in indices if rows[i][2]]
    if fitting:
        return min(fitting, key=lambda i: (rows[i][3], rows[i][4]))
    return min(indices, key=lambda i: rows[i][4])


def rank(assessments: Iterable[Assessment], objective: Objective) -> list[Assessment]:
    """Eligible candidates by the objective, then the rest (fitting before not fitting)."""
    return sorted(assessments, key=lambda o: sort_key(o, objective))


def in_ms(seconds: float) -> str:
    """A time in milliseconds, in words: 3 significant digits below a second."""
    value = seconds * 1e3
    return f"{value:.3g} ms" if value < 1000 else f"{value:,.0f} ms"


def rate_text(value: float) -> str:
    """A rate in words: whole numbers from 100, else 3 significant digits."""
    return f"{value:,.0f}" if value >= 100 else f"{value:.3g}"
