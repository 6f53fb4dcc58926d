"""The domain never divides by a value it did not check: inputs built directly (no schema in
front) that are zero, subnormal, negative or not finite raise the domain's own errors, with the
exact message (golden), instead of ZeroDivisionError, OverflowError or an infinite figure."""

from __future__ import annotations

import dataclasses
import math
import sys
from dataclasses import replace
from typing import Any

import pytest

from app.domain.errors import DomainError
from app.domain.graph.analysis import InputDecl, analyze
from app.domain.hardware import (
    DeviceKind,
    FrameworkOverhead,
    HardwareInputError,
    PriceKind,
    mig_slice,
)
from app.domain.memory.estimate import MemoryInputError, MemoryRequest
from app.domain.mig.layout import MigGeometry, MigProfileSpec
from app.domain.performance.errors import RooflineInputError
from app.domain.performance.phases import Phase, PhasedRequest, forward_request
from app.domain.performance.precision_schemes import PRECISION_SCHEMES
from app.domain.performance.recommend import (
    MemoryFit,
    RecommendationInputError,
    Requirements,
    assess,
    cost_per_million_usd,
    devices_needed,
    energy_per_inference_j,
)
from app.domain.performance.roofline import (
    implausible_figures,
    kernel_points,
    predict,
    unsupported_reason,
)
from app.domain.precision import DType, Precision
from app.domain.workload import Mode, Parallelism, WorkloadInputError
from tests.domain.test_roofline import HAND_CAL, HAND_GPU

FP32 = PRECISION_SCHEMES[Precision.FP32]
SUBNORMAL = sys.float_info.min / 2
# The roofline golden tests' round-number device, under a short slug (messages name it).
GPU = dataclasses.replace(HAND_GPU, slug="g", name="G", price_kind=PriceKind.ON_DEMAND)
CAL = HAND_CAL


def _workload(batch: int = 2) -> PhasedRequest:
    layers = [{"name": "fc", "op": "linear", "out_features": 16}]
    decls = (InputDecl(name="x", shape=("batch", 8)),)
    analysis = analyze(decls, layers, {"batch": batch}, training=False)
    return forward_request(analysis, FP32, batch=batch)


# --------------------------------------------------------------------------------------------
# Device figures (roofline.py:952 divided by a 1e-308 peak; the chart by a 5e-324 one)
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("changes", "golden"),
    [
        (
            {"peak_flops_per_s": {DType.FP32: 1e-308}},
            "peak_flops_per_s[fp32] 1e-308 is outside [1e+06, 1e+21] FLOP/s",
        ),
        (
            {"peak_flops_per_s": {DType.FP32: 5e-324}},
            "peak_flops_per_s[fp32] 5e-324 is outside [1e+06, 1e+21] FLOP/s",
        ),
        (
            {"peak_flops_per_s": {DType.FP32: -1.0}},
            "peak_flops_per_s[fp32] -1.0 is outside [1e+06, 1e+21] FLOP/s",
        ),
        (
            {"peak_flops_per_s": {DType.FP32: math.inf}},
            "peak_flops_per_s[fp32] inf is outside [1e+06, 1e+21] FLOP/s",
        ),
        (
            {"peak_flops_per_s": {DType.FP32: math.nan}},
            "peak_flops_per_s[fp32] nan is outside [1e+06, 1e+21] FLOP/s",
        ),
        (
            {"memory_bandwidth_bytes_per_s": 0.0},
            "memory_bandwidth_bytes_per_s 0.0 is outside [1e+06, 1e+18] B/s",
        ),
        (
            {"memory_bandwidth_bytes_per_s": SUBNORMAL},
            "memory_bandwidth_bytes_per_s 1.1125369292536007e-308 is outside [1e+06, 1e+18] B/s",
        ),
        (
            {"host_link_bytes_per_s": 1e-308},
            "host_link.bandwidth_bytes_per_s 1e-308 is outside [1e+06, 1e+18] B/s",
        ),
        ({"compute_fraction": 0.0}, "compute_fraction 0.0 is outside [0.000976562, 1]"),
        ({"bandwidth_fraction": 2.0}, "bandwidth_fraction 2.0 is outside [0.000976562, 1]"),
        ({"tdp_watts": math.inf}, "tdp_watts inf is outside [0, 100000] W"),
        ({"price_usd_per_hour": -1.0}, "price_usd_per_hour -1.0 is outside [0, 100000] USD/h"),
        # One limit on write and before dividing (app.domain.hardware, imported by the schema):
        # a figure the API refuses is refused here too.
        ({"tdp_watts": 100_000.5}, "tdp_watts 100000.5 is outside [0, 100000] W"),
        (
            {"price_usd_per_hour": 1e6},
            "price_usd_per_hour 1000000.0 is outside [0, 100000] USD/h",
        ),
        ({"memory_bytes": -1}, "memory_bytes -1 is not a size"),
    ],
)
def test_non_physical_device_figures_are_named_and_predict_refuses_them(
    changes: dict[str, Any], golden: str
) -> None:
    device = replace(GPU, **changes)
    expected = f"non-physical figures in the hardware profile: {golden}"
    assert implausible_figures(device, DType.FP32) == expected
    assert unsupported_reason(device, FP32) == expected
    with pytest.raises(RooflineInputError) as raised:
        predict(_workload(), device, CAL)
    assert str(raised.value) == f"g cannot run fp32: {expected}"


def test_several_bad_figures_are_listed_together() -> None:
    device = replace(GPU, peak_flops_per_s={DType.FP32: 1e-308}, memory_bandwidth_bytes_per_s=0.0)
    assert implausible_figures(device, DType.FP32) == (
        "non-physical figures in the hardware profile: peak_flops_per_s[fp32] 1e-308 is outside "
        "[1e+06, 1e+21] FLOP/s; memory_bandwidth_bytes_per_s 0.0 is outside [1e+06, 1e+18] B/s"
    )


def test_a_zero_peak_is_a_missing_peak() -> None:
    device = replace(GPU, peak_flops_per_s={DType.FP32: 0.0})
    assert unsupported_reason(device, FP32) == (
        "no fp32 peak in the hardware profile (it lists: fp32)"
    )


def test_sane_extremes_predict_finite_positive_figures() -> None:
    """The smallest accepted figures with the smallest accepted efficiency still give a finite,
    positive latency (nothing overflows or underflows)."""
    slow = replace(
        GPU,
        peak_flops_per_s={DType.FP32: 1e6},
        memory_bandwidth_bytes_per_s=1e6,
        host_link_bytes_per_s=1e6,
        compute_fraction=1 / 1024,
        bandwidth_fraction=1 / 1024,
    )
    cal = replace(CAL, compute_efficiency=1e-4, memory_efficiency=1e-4, host_link_efficiency=1e-4)
    p = predict(_workload(), slow, cal)
    assert math.isfinite(p.latency_s)
    assert p.latency_s > 0
    assert math.isfinite(p.throughput_per_s)
    assert p.throughput_per_s > 0
    fast = replace(
        GPU,
        peak_flops_per_s={DType.FP32: 1e21},
        memory_bandwidth_bytes_per_s=1e18,
        host_link_bytes_per_s=1e18,
    )
    assert predict(_workload(), fast, CAL).latency_s > 0


# --------------------------------------------------------------------------------------------
# Calibration, predictions, chart points
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("changes", "golden"),
    [
        (
            {"compute_efficiency": 5e-324},
            "compute_efficiency must be a finite number in [0.0001, 1], got 5e-324",
        ),
        (
            {"memory_efficiency": 0.0},
            "memory_efficiency must be a finite number in [0.0001, 1], got 0.0",
        ),
        (
            {"host_link_efficiency": math.nan},
            "host_link_efficiency must be a finite number in [0.0001, 1], got nan",
        ),
        ({"activation_cache_share": 1.0}, "activation_cache_share must be in [0, 1), got 1.0"),
        (
            {"kernel_launch_overhead_s": -1e-6},
            "kernel_launch_overhead_s must be a finite number in [0, 3600], got -1e-06",
        ),
        (
            {"request_overhead_s": math.inf},
            "request_overhead_s must be a finite number in [0, 3600], got inf",
        ),
        (
            {"host_dispatch_s": math.nan},
            "host_dispatch_s must be a finite number in [0, 3600], got nan",
        ),
        (
            {"half_precision_scale": 0.0},
            "half_precision_scale must be a finite number in [0.0001, 10], got 0.0",
        ),
        (
            {"half_precision_scale": 11.0},
            "half_precision_scale must be a finite number in [0.0001, 10], got 11.0",
        ),
    ],
)
def test_a_calibration_out_of_range_cannot_be_built(changes: dict[str, Any], golden: str) -> None:
    with pytest.raises(RooflineInputError) as raised:
        replace(CAL, **changes)
    assert str(raised.value) == golden


def test_a_request_that_takes_no_time_is_refused() -> None:
    """No kernels, nothing to copy (a CPU) and no overheads: the latency would be 0 s and the
    throughput batch / 0."""
    cpu = replace(GPU, kind=DeviceKind.CPU, host_link_bytes_per_s=None)
    empty = PhasedRequest(
        batch=1, scheme=FP32, phases=(Phase(name="forward", kernels=(), h2d_bytes=0, d2h_bytes=0),)
    )
    idle = replace(CAL, kernel_launch_overhead_s=0.0, request_overhead_s=0.0)
    with pytest.raises(RooflineInputError) as raised:
        predict(empty, cpu, idle)
    assert str(raised.value) == (
        "g at fp32, batch 1: the latency would be 0 s: the model runs no kernel and copies "
        "nothing, and the calibration sets no launch or request overhead"
    )
    assert predict(empty, cpu, CAL).throughput_per_s == pytest.approx(1 / 1e-4)


def test_a_prediction_cannot_hold_a_zero_rate_or_time() -> None:
    p = predict(_workload(), GPU, CAL)
    with pytest.raises(RooflineInputError, match="effective_flops_per_s must be positive"):
        replace(p, effective_flops_per_s=0.0)
    with pytest.raises(RooflineInputError, match="effective_bandwidth_bytes_per_s"):
        replace(p, effective_bandwidth_bytes_per_s=SUBNORMAL)
    with pytest.raises(RooflineInputError, match=r"the interval is not a finite time \(inf\)"):
        replace(p, interval_s=math.inf)
    with pytest.raises(RooflineInputError, match="batch must be >= 1, got 0"):
        replace(p, batch=0)


def test_kernel_points_of_a_kernel_that_takes_no_time_have_no_rate() -> None:
    p = predict(_workload(), GPU, replace(CAL, kernel_launch_overhead_s=0.0))
    (phase,) = _workload().phases
    free = replace(phase.kernels[0], flops=0, weight_bytes=0, input_bytes=0, output_bytes=0)
    points = kernel_points(replace(phase, kernels=(free,)), p)
    assert [(pt.achieved_flops_per_s, pt.intensity_flops_per_byte) for pt in points] == [
        (0.0, math.inf)
    ]


def test_a_mig_profile_larger_than_its_gpu_is_refused() -> None:
    profile = MigProfileSpec(
        name="1g.5gb", memory_mib=4864, compute_slices=1, memory_slices=1, max_instances=7,
        placements=(0,),
    )  # fmt: skip
    empty = MigGeometry(
        gpu="g", total_compute_slices=0, total_memory_slices=8, max_gpu_instances=7,
        profiles=(profile,),
    )  # fmt: skip
    with pytest.raises(HardwareInputError) as raised:
        mig_slice(GPU, empty, profile)
    assert str(raised.value) == (
        "g MIG 1g.5gb: compute slices 1 must be between 1 and the GPU's total of 0"
    )


# --------------------------------------------------------------------------------------------
# Recommendations (recommend.py:66 divided by a zero throughput)
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("call", "golden"),
    [
        (
            lambda: cost_per_million_usd(1.0, 0.0),
            "throughput_per_s must be a positive, finite number, got 0.0",
        ),
        (
            lambda: cost_per_million_usd(1.0, 5e-324),
            "throughput_per_s must be a positive, finite number, got 5e-324",
        ),
        (
            lambda: cost_per_million_usd(math.nan, 1.0),
            "price_usd_per_hour must be a finite number >= 0, got nan",
        ),
        (
            lambda: cost_per_million_usd(1e308, 1e-300),
            "cost_usd_per_million overflows (inf): the inputs are out of scale",
        ),
        (
            lambda: energy_per_inference_j(100.0, 1e-3, 0),
            "batch must be an integer >= 1, got 0",
        ),
        (
            lambda: energy_per_inference_j(-1.0, 1e-3, 1),
            "tdp_watts must be a finite number >= 0, got -1.0",
        ),
        (
            lambda: devices_needed(10.0, 0.0),
            "throughput_per_s must be a positive, finite number, got 0.0",
        ),
        (
            lambda: devices_needed(math.inf, 1.0),
            "throughput_target_per_s must be a positive, finite number, got inf",
        ),
        (
            lambda: Requirements(latency_slo_s=0.0),
            "latency_slo_s must be a positive, finite number, got 0.0",
        ),
        (
            lambda: Requirements(throughput_target_per_s=math.nan),
            "throughput_target_per_s must be a positive, finite number, got nan",
        ),
        (
            lambda: MemoryFit(required_bytes=-1, available_bytes=1, detail=""),
            "required_bytes must be an integer >= 0, got -1",
        ),
    ],
)
def test_recommendation_arithmetic_checks_its_inputs(call: Any, golden: str) -> None:
    with pytest.raises(RecommendationInputError) as raised:
        call()
    assert str(raised.value) == golden


def test_golden_recommendation_arithmetic_on_sane_inputs() -> None:
    assert cost_per_million_usd(3.6, 1000.0) == pytest.approx(1.0)
    assert cost_per_million_usd(0.0, 1.0) == 0.0
    assert energy_per_inference_j(100.0, 0.01, 4) == pytest.approx(0.25)
    assert devices_needed(2500.0, 1000.0) == 3
    p = predict(_workload(), GPU, CAL)
    fit = MemoryFit(required_bytes=1, available_bytes=2, detail="")
    item = assess(p, fit, Requirements(throughput_target_per_s=1e12))
    assert item.devices_needed == math.ceil(1e12 / p.throughput_per_s)
    assert item.fleet_cost_usd_per_hour == pytest.approx(item.devices_needed * 3.6)


# --------------------------------------------------------------------------------------------
# Memory engine (divides by the parallel degrees)
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("build", "golden"),
    [
        (lambda: Parallelism(tensor=0), "parallelism.tensor must be an integer >= 1, got 0"),
        (lambda: Parallelism(data=-2), "parallelism.data must be an integer >= 1, got -2"),
        (
            lambda: Parallelism(pipeline=True),
            "parallelism.pipeline must be an integer >= 1, got True",
        ),
        (lambda: Parallelism(zero_stage=4), "parallelism.zero_stage must be 0-3, got 4"),
        (
            lambda: MemoryRequest(mode=Mode.TRAINING, accumulation_steps=0),
            "accumulation_steps must be an integer >= 1, got 0",
        ),
        (
            lambda: FrameworkOverhead(fragmentation_fraction=math.nan),
            "fragmentation_fraction must be a number, got nan",
        ),
        (
            lambda: FrameworkOverhead(fragmentation_fraction=1.5),
            "fragmentation_fraction must be in [0, 1], got 1.5",
        ),
        (
            lambda: FrameworkOverhead(workspace_bytes=-1),
            "workspace_bytes must be an integer >= 0, got -1",
        ),
    ],
)
def test_memory_inputs_are_checked_when_built(build: Any, golden: str) -> None:
    with pytest.raises((MemoryInputError, WorkloadInputError, HardwareInputError)) as raised:
        build()
    assert str(raised.value) == golden


def test_every_guard_error_is_a_domain_error() -> None:
    """The API maps DomainError to a 422 problem."""
    for error in (
        RooflineInputError,
        RecommendationInputError,
        MemoryInputError,
        WorkloadInputError,
        HardwareInputError,
    ):
        assert issubclass(error, DomainError)
