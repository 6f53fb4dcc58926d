"""Assessing, ranking and explaining inference candidates."""

from dataclasses import replace

import pytest

from app.domain.graph.analysis import InputDecl, analyze
from app.domain.hardware import DeviceKind, HardwareSpec
from app.domain.performance.recommend import (
    Assessment,
    MemoryFit,
    Objective,
    Requirements,
    assess,
    best_batch,
    cost_per_million_usd,
    devices_needed,
    energy_per_inference_j,
    explain,
    quantization_sentence,
    rank,
)
from app.domain.performance.roofline import (
    DEFAULT_CALIBRATIONS,
    PRECISION_SCHEMES,
    Bound,
    PhasedRequest,
    forward_request,
    predict,
)
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
    prediction = predict(request, device, DEFAULT_CALIBRATIONS[device.kind])
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
    assert any("no price" in r for r in unpriced.reasons)
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
    assert "2 candidate(s) have no price" in text
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
        assess(predict(request, d, DEFAULT_CALIBRATIONS[d.kind]), FITS, requirements)
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
    prediction = predict(request, every_peak, DEFAULT_CALIBRATIONS[DeviceKind.GPU])
    assert quantization_sentence(prediction) == QUANTIZATION_SENTENCES[precision]
    ranked = rank([assess(prediction, FITS, Requirements())], Objective.LATENCY)
    assert ranked[0].eligible  # precondition: the explanation describes this candidate
    text = explain(ranked, Requirements(), model="tiny")
    assert text.startswith(f"Run tiny on Big GPU at {precision.value}, batch 1: ")
    assert QUANTIZATION_SENTENCES[precision] in text
    assert ("-bit weights" in text) is bool(QUANTIZATION_SENTENCES[precision])
