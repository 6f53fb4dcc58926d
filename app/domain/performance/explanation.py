"""The recommendation in plain words: what to run, why (its bound, its quantization), and what
the best candidate of the other device kind (a CPU against an accelerator, and back) would
need instead (pure)."""

from __future__ import annotations

from collections.abc import Sequence

from app.domain.hardware import DeviceKind
from app.domain.performance.calibration import cpu_compute_unit
from app.domain.performance.precision_schemes import PRECISION_SCHEMES
from app.domain.performance.prediction import Bound, Prediction
from app.domain.performance.recommend import (
    Assessment,
    Objective,
    Requirements,
    in_ms,
    objective_key,
    rate_text,
)
from app.domain.precision import Quantization


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
            f"TTFT p99 {in_ms(load.ttft_p99_s)} (bound {in_ms(load.ttft_bound_s)}) and TPOT p99 "
            f"{in_ms(load.tpot_p99_s)} (bound {in_ms(load.tpot_bound_s)}) under Poisson arrivals "
            f"(continuous batching, up to {load.max_seqs} sequences in flight)"
        ]
    elif item.server is None:
        parts = [f"{in_ms(p.latency_s)} per request"]
    else:
        parts = [
            f"p99 {in_ms(item.latency_s)} per request under Poisson arrivals (batches of up to "
            f"{item.server.batch_cap})"
        ]
    slo, budget = requirements.latency_slo_s, requirements.latency_budget_s
    if slo is not None and budget is not None:
        parts[0] += f" against the {in_ms(slo)} SLO"
        if requirements.slo_margin_fraction > 0:
            parts[0] += (
                f" ({in_ms(budget)} budget with its {requirements.slo_margin_fraction:.0%} margin)"
            )
    if p.first_token_s is not None and p.per_token_s is not None:
        parts.append(
            f"{in_ms(p.first_token_s)} to the first token then {in_ms(p.per_token_s)} per token"
        )
    unit = "sequences" if p.first_token_s is not None else "inferences"
    if item.llm_server is not None:
        unit = "requests"
    parts.append(f"{rate_text(item.throughput_per_s)} {unit}/s per device")
    if item.devices_needed is not None and requirements.throughput_target_per_s is not None:
        count = item.devices_needed
        parts.append(
            f"{count} device{'s' if count != 1 else ''} for "
            f"{rate_text(requirements.throughput_target_per_s)}/s"
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
            return f"${item.fleet_cost_usd_per_hour:.3g}/h for {rate_text(target)}/s"
        return f"${item.cost_usd_per_million or 0:.3g} per million inferences"
    if objective is Objective.ENERGY:
        return f"{item.energy_j_per_inference or 0:.3g} J per inference"
    return in_ms(item.latency_s)


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
            f": at batch {p.batch} it spends {share:.0%} of its {in_ms(p.latency_s)} on "
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
