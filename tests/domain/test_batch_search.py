"""The recommendation model's small rules: batch sizes, the concurrency bisection, the paged KV
cache per request and GPU, multi-GPU groups and calibration overrides (golden numbers worked by
hand)."""

from dataclasses import replace

import pytest

from app.domain.hardware import DeviceKind, HardwareSpec
from app.domain.performance.batch_search import batch_sizes, largest_fitting
from app.domain.performance.calibration import (
    DEFAULT_CALIBRATIONS,
    GPU_CLASSES,
    CalibrationClass,
)
from app.domain.performance.candidates import (
    Candidate,
    pipeline_group,
    pipeline_shapes,
    supported,
    tensor_parallel_group,
)
from app.domain.performance.decoding import Batching, DecoderServing, kv_bytes_per_request
from app.domain.performance.pipeline import ParallelStrategy
from app.domain.performance.precision_schemes import PRECISION_SCHEMES
from app.domain.performance.recommend import Scenario
from app.domain.performance.runtimes import RUNTIME_PROFILES, ServingRuntime, calibrations_for
from app.domain.precision import DType, Precision

GPU = HardwareSpec(  # A100-80GB-SXM-like
    slug="gpu",
    name="GPU",
    kind=DeviceKind.GPU,
    peak_flops_per_s={DType.FP32: 19.5e12, DType.FP16: 312e12, DType.INT8: 624e12},
    memory_bandwidth_bytes_per_s=2.039e12,
    memory_bytes=80 * 2**30,
    host_link_bytes_per_s=31.5e9,
    host_link_source="test",
    tdp_watts=300.0,
    price_usd_per_hour=2.0,
)


@pytest.mark.parametrize(
    ("scenario", "given", "most", "expected"),
    [
        (Scenario.OFFLINE, None, 64, [1, 2, 4, 8, 16, 32, 64]),
        (Scenario.OFFLINE, None, 48, [1, 2, 4, 8, 16, 32]),  # powers of two up to the maximum
        (Scenario.SERVER, [8, 3, 8, 1], 64, [1, 3, 8]),  # the request's own, sorted, each once
        (Scenario.SINGLE_STREAM, [8], 64, [1]),
    ],
)
def test_batch_sizes(
    scenario: Scenario, given: list[int] | None, most: int, expected: list[int]
) -> None:
    assert batch_sizes(scenario, given, most) == expected


@pytest.mark.parametrize(
    ("fit_up_to", "limit", "expected"), [(37, 100, 37), (0, 100, 0), (500, 100, 100), (1, 1, 1)]
)
def test_largest_fitting_bisects(fit_up_to: int, limit: int, expected: int) -> None:
    asked: list[int] = []

    def fits(n: int) -> bool:
        asked.append(n)
        return n <= fit_up_to

    assert largest_fitting(limit, fits) == expected
    assert len(asked) <= limit.bit_length() + 1  # a bisection, not a scan


def test_paged_kv_bytes_per_request_per_gpu() -> None:
    # continuous, 1 beam: ceil((100 + 20) / 16) = 8 blocks of 16 = 128 slots; 4,096 B per token
    serving = DecoderServing(
        prompt_tokens_max=200,
        prompt_tokens_mean=100,
        generated_tokens_max=40,
        generated_tokens_mean=20,
        batching=Batching.CONTINUOUS,
        kv_block_tokens=16,
    )
    assert kv_bytes_per_request(serving, 4096) == 128 * 4096
    assert kv_bytes_per_request(serving, 4096, gpus=3) == -(-128 * 4096 // 3)  # rounded up
    static = replace(serving, batching=Batching.STATIC)  # every row padded: 200 + 40 slots
    assert kv_bytes_per_request(static, 10, gpus=4) == 600


def _gpu() -> Candidate:
    return Candidate(device=GPU, runtime=GPU.runtime, overhead=GPU.overhead)


def test_groups_price_their_gpus_and_keep_one_gpus_memory() -> None:
    one = _gpu()
    tensor = tensor_parallel_group(one, 4)
    assert (tensor.gpus, tensor.device.price_usd_per_hour, tensor.device.tdp_watts) == (
        4,
        8.0,
        1200.0,
    )
    assert tensor.device.memory_bytes == one.device.memory_bytes
    assert tensor.device.slug == f"{one.device.slug} x4"
    both = pipeline_group(one, 2, 4)
    assert (both.gpus, both.tensor_parallel, both.pipeline_parallel) == (8, 4, 2)
    assert both.device.slug == f"{one.device.slug} x8 (tensor 4 x pipeline 2)"
    assert both.device.price_usd_per_hour == 16.0


def test_pipeline_shapes_fewest_gpus_first_more_tensor_at_equal_size() -> None:
    assert pipeline_shapes(ParallelStrategy.PIPELINE, 8, 8) == [(1, 2), (1, 4), (1, 8)]
    assert pipeline_shapes(ParallelStrategy.BOTH, 8, 4) == [
        (1, 2), (2, 2), (1, 4), (4, 2), (2, 4),
    ]  # fmt: skip
    assert pipeline_shapes(ParallelStrategy.BOTH, 2, 2) == [(1, 2), (2, 2)]


def test_supported_leaves_out_what_a_device_has_no_peak_for() -> None:
    one = _gpu()
    no_int8 = replace(
        one,
        device=replace(
            one.device,
            slug="no-int8",
            peak_flops_per_s={
                d: v for d, v in one.device.peak_flops_per_s.items() if d is not DType.INT8
            },
        ),
    )
    schemes = [PRECISION_SCHEMES[Precision.FP16], PRECISION_SCHEMES[Precision.INT8]]
    runnable, excluded = supported([one, no_int8], schemes)
    assert [(c.device.slug, s.precision) for c, s in runnable] == [
        (one.device.slug, Precision.FP16),
        (one.device.slug, Precision.INT8),
        ("no-int8", Precision.FP16),
    ]
    assert [(e.device, e.precision) for e in excluded] == [("no-int8", Precision.INT8)]
    assert excluded[0].reason.startswith("no int8 peak in the hardware profile")


def test_calibration_overrides_gpu_reaches_every_gpu_class_and_its_own_wins() -> None:
    ampere = CalibrationClass.GPU_AMPERE
    cals = calibrations_for(
        ServingRuntime.TENSORRT,
        {CalibrationClass.GPU: {"compute_efficiency": 0.5}, ampere: {"compute_efficiency": 0.7}},
    )
    for cls in GPU_CLASSES:
        expected = 0.7 if cls is ampere else 0.5
        assert cals[cls].compute_efficiency == expected
        assert cals[cls].basis.startswith("request override of compute_efficiency; otherwise: ")
    cpu = CalibrationClass.CPU
    assert cals[cpu] == RUNTIME_PROFILES[ServingRuntime.TENSORRT].apply(
        DEFAULT_CALIBRATIONS[cpu], DeviceKind.CPU
    )
    assert calibrations_for(ServingRuntime.TENSORRT, {cpu: {}})[cpu] == cals[cpu]  # empty: none
