"""Assessing, ranking and explaining inference candidates."""

from dataclasses import replace

import pytest

from app.domain.graph.analysis import InputDecl, analyze
from app.domain.hardware import DeviceKind, HardwareSpec, PriceKind
from app.domain.performance.calibration import (
    DEFAULT_CALIBRATIONS,
    CalibrationClass,
    calibration_class,
)
from app.domain.performance.explanation import explain, quantization_sentence
from app.domain.performance.phases import PhasedRequest, forward_request
from app.domain.performance.precision_schemes import PRECISION_SCHEMES
from app.domain.performance.prediction import Bound
from app.domain.performance.recommend import (
    DEFAULT_SLO_MARGIN_FRACTION,
    Assessment,
    MemoryFit,
    Objective,
    RecommendationInputError,
    Requirements,
    assess,
    assess_server,
    best_batch,
    cost_per_million_usd,
    devices_needed,
    energy_per_inference_j,
    latency_budget_s,
    rank,
)
from app.domain.performance.roofline import predict
from app.domain.precision import DType, Precision
from app.domain.zoo import ZOO

FITS = MemoryFit(required_bytes=1, available_bytes=2, detail="test")
TOO_BIG = MemoryFit(required_bytes=3 * 2**30, available_bytes=2**30, detail="test")

GPU = HardwareSpec(
    slug="gpu",
    name="Big GPU",
    kind=DeviceKind.GPU,
    peak_flops_per_s={DType.INT8: 624e12, DType.FP32: 19.5e12},
    memory_bandwidth_bytes_per_s=2.039e12,
    memory_bytes=80 * 2**30,
    host_link_bytes_per_s=31.5e9,
    host_link_source="test",
    tdp_watts=400.0,
    price_usd_per_hour=4.0,
    price_kind=PriceKind.ON_DEMAND,
)
CPU = HardwareSpec(
    slug="cpu",
    name="Big CPU",
    kind=DeviceKind.CPU,
    peak_flops_per_s={DType.INT8: 229.4e12, DType.FP32: 7.168e12},
    memory_bandwidth_bytes_per_s=307.2e9,
    memory_bytes=512 * 2**30,
    host_link_bytes_per_s=None,
    host_link_source="test",
    tdp_watts=350.0,
    price_usd_per_hour=1.0,
    price_kind=PriceKind.ON_DEMAND,
    simd="AVX-512 + AMX",
)


def test_formulas() -> None:
    assert cost_per_million_usd(3.6, 1000) == pytest.approx(1.0)  # 3.6 / 3600 / 1000 * 1e6
    assert energy_per_inference_j(300, 0.01, 4) == pytest.approx(0.75)  # 300 W * 10 ms / 4
    assert devices_needed(1000, 300) == 4
    assert devices_needed(900, 300) == 3
    assert devices_needed(1, 300) == 1


def _resnet(batch: int, precision: Precision = Precision.INT8) -> PhasedRequest:
    model = ZOO["resnet-50"]
    analysis = analyze(model.inputs, model.layers, {"batch": batch, "image": 224}, training=False)
    return forward_request(analysis, PRECISION_SCHEMES[precision], batch=batch)


def _assess(
    device: HardwareSpec, batch: int, requirements: Requirements, fit: MemoryFit = FITS
) -> Assessment:
    request = _resnet(batch)
    prediction = predict(
        request, device, DEFAULT_CALIBRATIONS[calibration_class(device, request.scheme)]
    )
    return assess(prediction, fit, requirements)


def test_assess_gives_reasons() -> None:
    slo = Requirements(latency_slo_s=1e-6, throughput_target_per_s=1000)
    item = _assess(GPU, 1, slo, TOO_BIG)
    assert not item.eligible
    assert not item.meets_latency_slo
    assert any("does not fit" in r and "3.00 GiB" in r for r in item.reasons)
    assert any("exceeds the 0.001 ms SLO" in r for r in item.reasons)
    assert item.devices_needed == devices_needed(1000, item.prediction.throughput_per_s)
    assert item.fleet_cost_usd_per_hour == pytest.approx(item.devices_needed * 4.0)
    unpriced = _assess(replace(CPU, price_usd_per_hour=None), 1, Requirements())
    assert unpriced.cost_usd_per_million is None
    assert unpriced.unpriced_reason is not None
    assert "no on_demand price: give prices_usd_per_hour" in unpriced.unpriced_reason
    assert unpriced.unpriced_reason in unpriced.reasons
    by_energy = _assess(
        replace(CPU, price_usd_per_hour=None), 1, Requirements(objective=Objective.ENERGY)
    )
    assert by_energy.eligible
    p = by_energy.prediction
    assert by_energy.energy_j_per_inference == pytest.approx(350 * p.latency_s / 1)


def test_best_batch_is_the_largest_within_the_slo_for_cost() -> None:
    # throughput grows with batch, so cost per inference falls until the SLO binds
    requirements = Requirements(latency_slo_s=0.02)
    options = [_assess(CPU, b, requirements) for b in (1, 4, 16, 64, 256)]
    within = [o for o in options if o.meets_latency_slo]
    assert 1 < len(within) < len(options)
    chosen = best_batch(options, Objective.COST)
    assert chosen.prediction.batch == max(o.prediction.batch for o in within)
    fastest = best_batch(options, Objective.LATENCY)
    assert fastest.prediction.batch == 1
    nothing_fits = [replace(o, memory=TOO_BIG, reasons=("does not fit",)) for o in options]
    assert best_batch(nothing_fits, Objective.COST).prediction.batch == 1


def test_rank_puts_eligible_first_by_objective() -> None:
    requirements = Requirements(latency_slo_s=0.02)
    cheap = _assess(CPU, 1, requirements)
    dear = _assess(GPU, 1, requirements)
    broken = _assess(replace(CPU, slug="cpu-2", price_usd_per_hour=0.01), 1, requirements, TOO_BIG)
    ranked = rank([broken, dear, cheap], Objective.COST)
    assert [a.prediction.device.slug for a in ranked] == ["cpu", "gpu", "cpu-2"]
    by_latency = rank([broken, dear, cheap], Objective.LATENCY)
    assert by_latency[-1] is broken
    assert by_latency[0].prediction.latency_s <= by_latency[1].prediction.latency_s


def test_explain_names_the_winner_the_reason_and_the_alternative() -> None:
    requirements = Requirements(latency_slo_s=0.02, throughput_target_per_s=500)
    ranked = rank([_assess(GPU, 1, requirements), _assess(CPU, 1, requirements)], Objective.COST)
    text = explain(ranked, requirements, model="resnet-50", unpriced=2, excluded=3)
    best = ranked[0].prediction
    assert text.startswith(f"Run resnet-50 on {best.device.name}")
    assert "against the 20 ms SLO" in text
    assert "1 device for 500/s" in text
    assert f"{best.bound.value}-bound" in text
    assert "ridge point" in text
    assert "The best accelerator option, Big GPU" in text or "The best CPU option, Big CPU" in text
    assert "needs 4.0x the cost ($4/h against $1/h for 500/s)" in text
    assert "costs compare on_demand prices only" in text
    assert "2 device(s) have no on_demand price and are not ranked by cost" in text
    assert "3 device/precision pair(s) were excluded" in text
    assert "with AMX tiles" in text
    assert "int8 is W8A8: 8-bit weights and activations, math at the int8 peak." in text
    none_fit = [replace(a, memory=TOO_BIG, reasons=("does not fit",)) for a in ranked]
    failed = explain(none_fit, requirements, model="resnet-50")
    assert failed.startswith("No candidate meets every requirement for resnet-50")
    assert "does not fit" in failed


def test_explain_the_overhead_of_the_losing_gpu() -> None:
    requirements = Requirements(latency_slo_s=0.02)
    ranked = rank([_assess(GPU, 1, requirements), _assess(CPU, 1, requirements)], Objective.COST)
    assert ranked[0].prediction.device is CPU
    gpu = ranked[1].prediction
    split = gpu.time_split_s
    share = (split[Bound.TRANSFER] + split[Bound.OVERHEAD]) / gpu.latency_s
    assert share > 0.3
    text = explain(ranked, requirements, model="resnet-50")
    assert f"at batch 1 it spends {share:.0%} of its" in text
    assert "on host-link transfer and launch/serving overhead" in text


@pytest.mark.parametrize("objective", list(Objective))
def test_every_objective_ranks(objective: Objective) -> None:
    inputs = (InputDecl(name="x", shape=("batch", 64)),)
    layers = [{"name": "fc", "op": "linear", "out_features": 10}]
    analysis = analyze(inputs, layers, {"batch": 1}, training=False)
    request = forward_request(analysis, PRECISION_SCHEMES[Precision.FP32], batch=1)
    requirements = Requirements(objective=objective)
    items = [
        assess(
            predict(request, d, DEFAULT_CALIBRATIONS[calibration_class(d, request.scheme)]),
            FITS,
            requirements,
        )
        for d in (GPU, CPU)
    ]
    ranked = rank(items, objective)
    assert all(a.eligible for a in ranked)
    assert explain(ranked, requirements, model="tiny").startswith("Run tiny on ")


# precision: the sentence the explanation adds (empty: not quantized)
QUANTIZATION_SENTENCES = {
    Precision.FP32: "",
    Precision.BF16: "",
    Precision.INT8: "int8 is W8A8: 8-bit weights and activations, math at the int8 peak.",
    Precision.FP8: "fp8 is W8A8: 8-bit weights and activations, math at the fp8 peak.",
    Precision.INT8_WEIGHT_ONLY: "int8_weight_only is weight-only W8A16: 8-bit weights "
    "dequantized to fp16, math at the fp16 peak.",
    Precision.INT4: "int4 is weight-only W4A16: 4-bit weights dequantized to fp16, math at the "
    "fp16 peak.",
}


@pytest.mark.parametrize("precision", list(QUANTIZATION_SENTENCES))
def test_the_explanation_names_weight_only_and_w8a8(precision: Precision) -> None:
    every_peak = replace(GPU, peak_flops_per_s=dict.fromkeys(DType, 100e12))
    inputs = (InputDecl(name="x", shape=("batch", 64)),)
    layers = [{"name": "fc", "op": "linear", "out_features": 10}]
    analysis = analyze(inputs, layers, {"batch": 1}, training=False)
    request = forward_request(analysis, PRECISION_SCHEMES[precision], batch=1)
    prediction = predict(request, every_peak, DEFAULT_CALIBRATIONS[CalibrationClass.GPU])
    assert quantization_sentence(prediction) == QUANTIZATION_SENTENCES[precision]
    ranked = rank([assess(prediction, FITS, Requirements())], Objective.LATENCY)
    assert ranked[0].eligible  # precondition: the explanation describes this candidate
    text = explain(ranked, Requirements(), model="tiny")
    assert text.startswith(f"Run tiny on Big GPU at {precision.value}, batch 1: ")
    assert QUANTIZATION_SENTENCES[precision] in text
    assert ("-bit weights" in text) is bool(QUANTIZATION_SENTENCES[precision])


# --------------------------------------------------------------------------------------------
# Prices of one kind; the SLO margin
# --------------------------------------------------------------------------------------------

RESERVED = replace(
    GPU, slug="gpu-reserved", name="Reserved GPU", price_usd_per_hour=0.5,
    price_kind=PriceKind.RESERVED,
)  # fmt: skip


def test_costs_are_ranked_among_prices_of_one_kind() -> None:
    on_demand = Requirements(latency_slo_s=0.02)
    items = [_assess(d, 1, on_demand) for d in (RESERVED, GPU, CPU)]
    ranked = rank(items, Objective.COST)
    # the reserved 0.5 USD/h is the cheapest figure, but it is not an on-demand price
    assert [a.prediction.device.slug for a in ranked] == ["cpu", "gpu", "gpu-reserved"]
    reserved = ranked[-1]
    assert reserved.cost_usd_per_million is None
    assert reserved.fleet_cost_usd_per_hour is None
    assert not reserved.eligible
    assert reserved.unpriced_reason == (
        "no on_demand price: its price is reserved (0.5 USD/h), not compared with on_demand "
        "prices (price_kind=reserved ranks by those)"
    )
    assert reserved.reasons == (reserved.unpriced_reason,)
    cpu = ranked[0]
    assert cpu.cost_usd_per_million == pytest.approx(
        1.0 / 3600 / cpu.prediction.throughput_per_s * 1e6
    )

    by_reserved = Requirements(latency_slo_s=0.02, price_kind=PriceKind.RESERVED)
    ranked = rank([_assess(d, 1, by_reserved) for d in (RESERVED, GPU, CPU)], Objective.COST)
    first = ranked[0]
    assert first.prediction.device.slug == "gpu-reserved"
    assert first.cost_usd_per_million == pytest.approx(
        0.5 / 3600 / first.prediction.throughput_per_s * 1e6
    )
    assert [a.eligible for a in ranked] == [True, False, False]
    assert all("its price is on_demand" in (a.unpriced_reason or "") for a in ranked[1:])
    text = explain(ranked, by_reserved, model="resnet-50", unpriced=2)
    assert "costs compare reserved prices only" in text
    assert "2 device(s) have no reserved price and are not ranked by cost" in text


def test_a_price_without_a_kind_is_not_ranked() -> None:
    legacy = _assess(replace(CPU, price_kind=None), 1, Requirements())
    assert legacy.cost_usd_per_million is None
    assert legacy.unpriced_reason is not None
    assert "does not say its kind" in legacy.unpriced_reason
    # other objectives keep the device eligible, still without a cost figure
    by_energy = _assess(replace(CPU, price_kind=None), 1, Requirements(objective=Objective.ENERGY))
    assert by_energy.eligible
    assert by_energy.cost_usd_per_million is None


@pytest.mark.parametrize(
    ("slo_s", "margin", "budget_s"),
    [(5.0, 0.1, 4.5), (0.02, 0.1, 0.018), (0.02, 0.0, 0.02), (1.0, 0.25, 0.75)],
)
def test_latency_budget(slo_s: float, margin: float, budget_s: float) -> None:
    assert latency_budget_s(slo_s, margin) == pytest.approx(budget_s)
    requirements = Requirements(latency_slo_s=slo_s, slo_margin_fraction=margin)
    assert requirements.latency_budget_s == pytest.approx(budget_s)


def test_default_margin_is_ten_percent() -> None:
    assert DEFAULT_SLO_MARGIN_FRACTION == 0.1
    assert Requirements(latency_slo_s=5.0).latency_budget_s == pytest.approx(4.5)
    assert Requirements().latency_budget_s is None


@pytest.mark.parametrize("margin", [-0.01, 0.95, 1.0, float("nan"), float("inf")])
def test_margin_out_of_range_is_refused(margin: float) -> None:
    with pytest.raises(RecommendationInputError, match="slo_margin_fraction"):
        Requirements(latency_slo_s=1.0, slo_margin_fraction=margin)


def test_a_latency_within_the_margin_does_not_meet_the_slo() -> None:
    latency = _assess(CPU, 1, Requirements()).prediction.latency_s
    # the case: 4,976 ms against 5,000 ms, 99.5 % of the SLO
    slo = latency / 0.995
    tight = _assess(CPU, 1, Requirements(latency_slo_s=slo))
    assert not tight.meets_latency_slo
    assert not tight.eligible
    (reason,) = tight.reasons
    assert "is within the 10% margin of the" in reason
    assert f"(the budget is {slo * 0.9 * 1e3:.3g} ms)" in reason
    exact = _assess(CPU, 1, Requirements(latency_slo_s=slo, slo_margin_fraction=0.0))
    assert exact.meets_latency_slo
    assert exact.eligible
    roomy = _assess(CPU, 1, Requirements(latency_slo_s=latency / 0.85))
    assert roomy.meets_latency_slo
    assert roomy.eligible
    over = _assess(CPU, 1, Requirements(latency_slo_s=latency / 1.5))
    assert any(r.endswith("SLO") and "exceeds the" in r for r in over.reasons)


def test_the_winner_keeps_the_margin() -> None:
    # the CPU is cheaper but predicted at 99.5 % of the SLO; the GPU is inside the budget (batch
    # 8: at batch 1 the GPU's 152 us per-request overhead puts it behind the CPU)
    cpu_latency = _assess(CPU, 8, Requirements()).prediction.latency_s
    gpu_latency = _assess(GPU, 8, Requirements()).prediction.latency_s
    slo = cpu_latency / 0.995
    assert gpu_latency < 0.9 * slo  # precondition: the GPU meets the SLO with its margin
    with_margin = Requirements(latency_slo_s=slo)
    ranked = rank([_assess(d, 8, with_margin) for d in (CPU, GPU)], Objective.COST)
    assert [a.prediction.device.slug for a in ranked] == ["gpu", "cpu"]
    text = explain(ranked, with_margin, model="resnet-50")
    assert text.startswith("Run resnet-50 on Big GPU")
    assert "budget with its 10% margin" in text
    no_margin = Requirements(latency_slo_s=slo, slo_margin_fraction=0.0)
    ranked = rank([_assess(d, 8, no_margin) for d in (CPU, GPU)], Objective.COST)
    assert [a.prediction.device.slug for a in ranked] == ["cpu", "gpu"]


def test_the_server_scenario_assesses_the_rate_and_its_p99() -> None:
    """assess_server: the queue over the options that fit; throughput, latency, cost and
    energy at the sustained rate and its p99; the batch shown is the batcher's cap."""
    requirements = Requirements(latency_slo_s=5e-3)  # budget 4.5 ms with the 10 % margin
    options = [_assess(GPU, b, requirements) for b in (1, 2, 4, 8, 16, 32, 64)]
    options.append(_assess(GPU, 128, requirements, TOO_BIG))  # not timed: does not fit
    item = assess_server(options, requirements)
    load = item.server
    assert load is not None
    assert item.prediction.batch == load.batch_cap <= 64
    assert item.latency_s == load.p99_latency_s <= 4.5e-3
    assert item.throughput_per_s == load.arrival_rate_per_s
    assert load.offline_throughput_per_s == max(o.prediction.throughput_per_s for o in options[:7])
    assert item.meets_latency_slo
    assert GPU.price_usd_per_hour is not None
    assert item.cost_usd_per_million == cost_per_million_usd(
        GPU.price_usd_per_hour, load.arrival_rate_per_s
    )
    assert GPU.tdp_watts is not None
    assert item.energy_j_per_inference == pytest.approx(GPU.tdp_watts / load.arrival_rate_per_s)
    text = explain([item], requirements, model="resnet-50")
    assert "p99" in text
    assert "under Poisson arrivals" in text


def test_the_server_scenario_needs_an_slo_and_falls_back_when_nothing_serves() -> None:
    options = [_assess(GPU, b, Requirements()) for b in (1, 8)]
    with pytest.raises(RecommendationInputError, match="latency SLO"):
        assess_server(options, Requirements())
    tight = Requirements(latency_slo_s=1e-5)  # a lone request takes longer
    options = [_assess(GPU, b, tight) for b in (1, 8)]
    item = assess_server(options, tight)
    assert item.server is None
    assert not item.meets_latency_slo
    none_fit = [_assess(GPU, b, tight, TOO_BIG) for b in (1, 8)]
    assert assess_server(none_fit, tight).server is None
