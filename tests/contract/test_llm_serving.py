"""benchmarks/calibration/llm_serving.py scores the decoder path on published TensorRT-LLM
measurements, fits the GPUs' 16-bit compute scale on their fp16 throughput rows and the vllm
runtime profile on published vLLM rows; its reports must be current, its mapping complete and
the shipped scale and vllm profile its fits."""

import statistics
from types import ModuleType
from typing import Any

import pytest

from app.domain.performance.calibration import DEFAULT_CALIBRATIONS, CalibrationClass
from app.domain.performance.runtimes import RUNTIME_PROFILES, ServingRuntime
from tests.contract.conftest import CALIBRATION
from tests.support import load_script


@pytest.fixture(scope="module")
def llm(calibrate: ModuleType) -> ModuleType:
    return load_script(CALIBRATION / "llm_serving.py", "llm_serving")


@pytest.fixture(scope="module")
def scored(llm: ModuleType, calibration_devices: dict[str, Any]) -> Any:
    document = llm.yaml.safe_load(llm.DATA.read_text(encoding="utf-8"))
    items, skipped = llm.rows(document["results"], calibration_devices)
    return items, skipped, llm.evaluate(items, calibration_devices)


def test_every_serving_row_is_predicted_or_says_why(llm: ModuleType, scored: Any) -> None:
    items, skipped, results = scored
    document = llm.yaml.safe_load(llm.DATA.read_text(encoding="utf-8"))
    serving = [r for r in document["results"] if r["category"] == "llm_serving"]
    assert len(items) + len(skipped) == len(serving)
    assert all(reason for _, reason in skipped)
    assert all(r.predicted is not None for r in results)


def test_the_report_is_current(llm: ModuleType, scored: Any) -> None:
    _, skipped, results = scored
    assert llm.render(results, skipped) == (CALIBRATION / "llm_serving.md").read_text(
        encoding="utf-8"
    ), "run .venv/bin/python benchmarks/calibration/llm_serving.py --write-results"


def test_baseline_shares(scored: Any) -> None:
    """Pin (the figures the docs quote, not a target): under continuous batching 35 of 35
    throughput rows within 1.5x (the 3 tensor-parallel 70B rows and the 7 RTX PRO 6000
    pipeline rows among them; 28 under static batching), all within 2x; 3 of 4
    time-to-first-token rows within 1.5x."""
    _, _, results = scored
    assert sum(1 for r in results if r.row.tensor_parallel > 1) == 3
    for metric, (within, total) in {"throughput": (35, 35), "ttft": (3, 4)}.items():
        ratios = [r.ratio for r in results if r.row.metric == metric]
        assert len(ratios) == total
        assert sum(1 for x in ratios if 1 / 1.5 <= x <= 1.5) == within
        assert all(0.5 <= x <= 2.0 for x in ratios)


def test_static_batching_is_the_previous_baseline(
    llm: ModuleType, scored: Any, calibration_devices: dict[str, Any]
) -> None:
    """Static batching keeps the reservation of the whole context per sequence: fewer
    sequences fit, and no row the engine chose the batch for gets more throughput."""
    items, _, continuous = scored
    static = llm.evaluate(items, calibration_devices, llm.Batching.STATIC)
    chosen = [(s, c) for s, c in zip(static, continuous, strict=True) if s.row.batch is None]
    chosen = [(s, c) for s, c in chosen if s.row.metric == "throughput"]
    assert chosen
    assert all(c.batch >= s.batch for s, c in chosen)
    assert all(c.predicted >= s.predicted * 0.999 for s, c in chosen)
    ratios = [s.ratio for s in static if s.row.metric == "throughput"]
    # pin: 28 (27 before the GPUs' 16-bit scale; 26 from wave quantization, which put
    # Llama-3.1-8B fp16 128/128 on the A100 at 0.66x, until the Ampere class's 0.54 efficiency)
    assert sum(1 for x in ratios if 1 / 1.5 <= x <= 1.5) == 28


def test_pipeline_rows_are_scored_with_the_fp4_peak(scored: Any) -> None:
    """Pin: the 7 TensorRT-LLM Llama-3.3-70B NVFP4 rows on the RTX PRO 6000 (TP1 PP1 and TP1
    PP2) are predicted once the catalog has the fp4 peak (2000 dense TFLOPS, NVIDIA's 4,000
    sparse AI TOPS / 2): PP1 1.14-1.15x, PP2 1.06-1.21x of measured; nothing is fitted."""
    _, skipped, results = scored
    assert not [row for row, reason in skipped if "fp4" in reason]
    rows = [r for r in results if r.row.slug == "nvidia-rtx-pro-6000-blackwell"]
    assert len(rows) == 7
    assert all(r.row.precision.value == "fp4" for r in rows)
    assert sorted(r.row.pipeline_parallel for r in rows) == [1, 1, 1, 2, 2, 2, 2]
    ratios = [r.ratio for r in rows if r.ratio is not None]
    assert len(ratios) == 7
    assert all(1.0 <= x <= 1.25 for x in ratios)


@pytest.fixture(scope="module")
def vllm_fitted(llm: ModuleType, calibration_devices: dict[str, Any]) -> Any:
    document = llm.yaml.safe_load(llm.DATA.read_text(encoding="utf-8"))
    items, skipped = llm.vllm_rows(document["results"], calibration_devices)
    fitted = llm.vllm_fit(items, calibration_devices)
    return items, skipped, fitted, llm.vllm_evaluate(items, calibration_devices, fitted)


def test_every_vllm_row_is_used_or_says_why(llm: ModuleType, vllm_fitted: Any) -> None:
    items, skipped, _, _ = vllm_fitted
    document = llm.yaml.safe_load(llm.DATA.read_text(encoding="utf-8"))
    vllm = [r for r in document["results"] if r.get("runtime") == "vllm"]
    assert len(items) + len(skipped) == len(vllm) == 16
    assert len(items) == 5
    assert {r.slug for r in items} == {
        "nvidia-a100-80gb-sxm",
        "nvidia-h100-sxm",
        "nvidia-a100-40gb-sxm",
    }
    assert all(reason for _, reason in skipped)


def test_the_shipped_vllm_profile_is_the_fit(llm: ModuleType, vllm_fitted: Any) -> None:
    _, _, fitted, _ = vllm_fitted
    assert llm.vllm_shipped_matches(fitted) == []
    assert RUNTIME_PROFILES[ServingRuntime.VLLM].host_overhead_per_sequence_step_s > 0


def test_the_vllm_report_is_current(llm: ModuleType, vllm_fitted: Any) -> None:
    _, skipped, fitted, results = vllm_fitted
    report, ok = llm.render_vllm(results, skipped, fitted)
    assert ok
    assert report == (CALIBRATION / "vllm_profile.md").read_text(encoding="utf-8"), (
        "run .venv/bin/python benchmarks/calibration/llm_serving.py --write-results"
    )


def test_vllm_error_in_sample_and_left_out(vllm_fitted: Any) -> None:
    """Pin (the figures the profile's basis quotes): unfitted 1 of 5 within 1.5x (3 of 5
    before the GPUs' 16-bit scale made the TensorRT-LLM-grade default faster); fitted, in
    sample and leaving each device out, 5 of 5 (left out 0.74-1.24x)."""
    _, _, _, results = vllm_fitted
    for which, within in (("default", 1), ("in_sample", 5), ("device_out", 5)):
        ratios = [r.ratio(which) for r in results]
        assert all(x is not None for x in ratios)
        assert sum(1 for x in ratios if 1 / 1.5 <= x <= 1.5) == within
    left_out = [r.ratio() for r in results]
    assert 0.7 <= min(left_out)
    assert max(left_out) <= 1.25


@pytest.fixture(scope="module")
def half_fitted(llm: ModuleType, scored: Any, calibration_devices: dict[str, Any]) -> Any:
    items, _, _ = scored
    half = llm.half_rows(items, calibration_devices)
    fitted = llm.half_precision_fit(half, calibration_devices)
    results = llm.half_evaluate(half, calibration_devices, fitted)
    return half, fitted, results, llm.half_checks(items, calibration_devices)


def test_the_half_precision_scale_is_fitted_on_the_fp16_throughput_rows(
    half_fitted: Any,
) -> None:
    half, _, _, checks = half_fitted
    assert len(half) == 15
    assert {r.slug for r in half} == {"nvidia-a100-80gb-sxm", "nvidia-h100-sxm"}
    assert all(r.metric == "throughput" and r.precision.value == "fp16" for r in half)
    assert [base.row.metric for base, _ in checks] == ["ttft", "ttft"]


def test_the_shipped_half_precision_scale_is_the_fit(llm: ModuleType, half_fitted: Any) -> None:
    _, fitted, _, _ = half_fitted
    assert llm.half_shipped_matches(fitted) == []
    assert DEFAULT_CALIBRATIONS[CalibrationClass.GPU_HOPPER].half_precision_scale == fitted
    assert DEFAULT_CALIBRATIONS[CalibrationClass.CPU].half_precision_scale == 1.0


def test_the_half_precision_report_is_current(llm: ModuleType, half_fitted: Any) -> None:
    _, fitted, results, checks = half_fitted
    report, ok = llm.render_half(results, checks, fitted)
    assert ok
    assert report == (CALIBRATION / "half_precision.md").read_text(encoding="utf-8"), (
        "run .venv/bin/python benchmarks/calibration/llm_serving.py --write-results"
    )


def test_half_precision_error_at_scale_1_in_sample_and_left_out(half_fitted: Any) -> None:
    """Pin (the figures the calibration's basis and the docs quote): the int8 fits alone put
    the 15 fp16 rows at a median 0.83x of measured (prefill-heavy rows 0.71-0.79x); the fit
    1.28 (1.27 and 1.29 with the H100 or the A100 left out) puts them at 1.02 in sample and
    1.01 left out, every row within 1.5x either way, the worst left out 0.88x and 1.21x."""
    _, fitted, results, _ = half_fitted
    assert fitted == pytest.approx(1.28)
    assert sorted({r.refit for r in results}) == pytest.approx([1.27, 1.29])
    medians = {}
    for which in ("default", "in_sample", "device_out"):
        ratios = [r.ratio(which) for r in results]
        assert all(x is not None and 1 / 1.5 <= x <= 1.5 for x in ratios)
        medians[which] = statistics.median(ratios)
    assert medians["default"] == pytest.approx(0.83, abs=0.005)
    assert medians["device_out"] == pytest.approx(1.01, abs=0.005)
    left_out = [r.ratio() for r in results]
    assert min(left_out) >= 0.88
    assert max(left_out) <= 1.22
