"""Score the decoder path against published LLM-serving measurements (no fit).

    .venv/bin/python benchmarks/calibration/llm_serving.py [--write-results]

Reads the ``llm_serving`` rows of ``framework_measurements.yaml`` (TensorRT-LLM throughput and
time-to-first-token tables with their input / output lengths; sources per row) and predicts
each single-GPU row the model can map (device in the catalog, Llama-2-7B, Llama-3.1-8B or
Mistral-7B, fp16 or fp8) the way TensorRT-LLM serves it: continuous (in-flight) batching with a
paged KV cache (``batching: continuous``; the rows' fixed input / output lengths are the mean
and the maximum), the batch the row states or else as many requests as the paged KV cache holds
beside one request's memory-engine peak (plus the service's margin), at most ``MAX_BATCH``.
``--static`` gives the previous baseline: static batches, the largest power of two whose peak
with the whole prompt + output reserved per sequence fits. An A100 whose variant the source
does not state is read as the 80 GB SXM part, the TensorRT-LLM methodology's H100 as the SXM
part. Throughput rows compare output tokens per second; TTFT rows the batch-1 prefill. Tensor-
parallel rows run as the recommender's groups (``shard``: 1/t of the work per GPU, two all-
reduces per layer over the GPU link) and compare the whole group's tokens per second; pipeline-
parallel rows as the recommender's pipeline groups (``split_stages``: consecutive blocks per GPU,
the hidden state sent between stages, ``min(batch, p)`` micro-batches), rows published per GPU
compared per GPU. A row whose device has no peak for its precision is listed with the reason.
Rows left
out (llama.cpp, percentages) are listed with the reason. Nothing is fitted for TensorRT-LLM.

The ``vllm`` rows the meta's ``vllm_rule`` takes (written before any was predicted) are scored
apart: unfitted, then with the ``vllm`` runtime profile fitted here (compute-efficiency scale
and host time per sequence per engine step, :func:`vllm_fit`), in sample and leaving each
device out; ``vllm_profile.md`` is that report, and the exit status is 1 when the shipped
profile (:mod:`app.domain.performance.runtimes`) is not the fit.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Generic, TypeVar

import yaml

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import calibrate  # noqa: E402  (the calibration script beside this one)

from app.domain.hardware import HardwareSpec  # noqa: E402
from app.domain.performance.calibration import (  # noqa: E402
    DEFAULT_CALIBRATIONS,
    GPU_CLASSES,
    HALF_PRECISION_DTYPES,
    calibration_class,
)
from app.domain.performance.candidates import (  # noqa: E402
    Candidate,
    pipeline_group,
    tensor_parallel_group,
)
from app.domain.performance.decoding import Batching, DecoderServing  # noqa: E402
from app.domain.performance.phases import PhasedRequest  # noqa: E402
from app.domain.performance.pipeline import micro_batching, predict_pipeline  # noqa: E402
from app.domain.performance.precision_schemes import (  # noqa: E402
    PRECISION_SCHEMES,
    PrecisionScheme,
    compute_dtype_for,
)
from app.domain.performance.roofline import predict, unsupported_reason  # noqa: E402
from app.domain.performance.runtimes import (  # noqa: E402
    RUNTIME_PROFILES,
    RuntimeProfile,
    ServingRuntime,
    with_decode_host_overhead,
)
from app.domain.performance.tensor_parallel import shard  # noqa: E402
from app.domain.precision import Precision  # noqa: E402
from app.domain.zoo import ZOO, llama  # noqa: E402
from app.services.recommendation_source import ModelSource  # noqa: E402

DATA = HERE / "framework_measurements.yaml"
RESULTS = HERE / "llm_serving.md"
MAX_BATCH = 4096  # serving engines run hundreds to thousands of sequences at once
WITHIN, WITHIN_WORST = 1.5, 2.0
VLLM_SCALE_GRID = tuple(round(0.05 * i, 2) for i in range(1, 41))  # 0.05 .. 2.0
HALF_SCALE_GRID = tuple(round(0.5 + 0.01 * i, 2) for i in range(151))  # 0.50 .. 2.00
# host time per sequence per engine step [us]
VLLM_HOST_LADDER_US = (0, 5, 10, 15, 20, 30, 40, 50, 60, 70, 80, 90, 100, 120, 150, 200)


def _graph(model: str) -> tuple[str, list[Any], list[Any]] | None:
    text = model.lower()
    if "llama-2-7b" in text or "llama 7b" in text or text == "llama7b":
        zoo = ZOO["llama-2-7b"]
        return "Llama-2-7B", list(zoo.inputs), list(zoo.layers)
    if "llama-3-8b" in text:
        zoo = ZOO["llama-3-8b"]
        return "Llama-3-8B", list(zoo.inputs), list(zoo.layers)
    if "llama-3.1-8b" in text:
        zoo = ZOO["llama-3-8b"]  # Llama 3.1 8B: Llama 3 8B's shapes (RoPE scaling aside)
        return "Llama-3.1-8B (as Llama-3-8B)", list(zoo.inputs), list(zoo.layers)
    if "llama-3.3-70b" in text or "llama-3.1-70b" in text:
        built = llama(
            layers=80, hidden=8192, heads=64, kv_heads=8, intermediate=28672, vocab=128256
        )  # Llama 3.x 70B's shapes
        return "Llama-3.x-70B", list(built.inputs), list(built.layers)
    if "mistral-7b" in text:
        built = llama(
            layers=32, hidden=4096, heads=32, kv_heads=8, intermediate=14336, vocab=32000
        )  # Mistral 7B v0.1's shapes; its sliding window is not modelled
        return "Mistral-7B", list(built.inputs), list(built.layers)
    return None


DEVICES = {  # the rows' device text -> catalog slug (what the mapping assumes is in the note)
    "nvidia-a100 (variant not stated)": "nvidia-a100-80gb-sxm",
    "nvidia-h100 (SXM per methodology: H100-HBM3-80GB)": "nvidia-h100-sxm",
}


@dataclass(frozen=True, slots=True)
class Row:
    """One measurement the decoder path can be asked for."""

    id: str
    slug: str
    label: str
    precision: Precision
    batch: int | None  # None: the engine chose
    prompt: int
    generated: int
    metric: str  # "throughput" [output tokens/s], "ttft" [ms] or "decode_rate" [tokens/s]
    measured: float
    tensor_parallel: int  # GPUs (the measured figure is the whole group's)
    inputs: list[Any]
    layers: list[Any]
    pipeline_parallel: int = 1  # stages (of tensor_parallel GPUs each)
    runtime: str = "tensorrt_llm"


def rows(
    raw: Iterable[Mapping[str, Any]], devices: Mapping[str, HardwareSpec]
) -> tuple[list[Row], list[tuple[str, str]]]:
    """The rows the decoder path can predict, and the others with the reason."""
    used: list[Row] = []
    skipped: list[tuple[str, str]] = []
    for row in raw:
        if row.get("category") != "llm_serving":
            continue
        rid = str(row["id"])
        metric = str(row["metric"])
        graph = _graph(str(row["model"]))
        precision = {"FP16": Precision.FP16, "FP8": Precision.FP8, "FP4": Precision.FP4}.get(
            str(row["precision"])
        )
        tp = row.get("tensor_parallel")
        pp = int(row.get("pipeline_parallel") or 1)
        per_gpu = str(row.get("per", "")).startswith("GPU")
        slug = DEVICES.get(str(row["device"]), str(row["device"]))
        if str(row["runtime"]) == "vllm":
            skipped.append((rid, "runtime 'vllm': scored in the vLLM section below"))
        elif str(row["runtime"]) != "tensorrt_llm":
            skipped.append((rid, f"runtime {row['runtime']!r}: no profile for it"))
        elif tp not in (1, 2, 4, 8, None):
            skipped.append((rid, f"tensor parallel {tp}: not a group the recommender forms"))
        elif metric not in ("throughput", "time_to_first_token"):
            skipped.append((rid, f"metric {metric!r}"))
        elif slug not in devices:
            skipped.append((rid, f"device {row['device']!r} not in the catalog"))
        elif graph is None or precision is None:
            skipped.append((rid, f"model {row['model']!r} / precision {row['precision']!r}"))
        elif pp not in (1, 2, 4, 8):
            skipped.append((rid, f"pipeline parallel {pp}: not a group the recommender forms"))
        elif (why := unsupported_reason(devices[slug], PRECISION_SCHEMES[precision])) is not None:
            skipped.append((rid, f"{slug} at {precision.value}: {why}"))
        else:
            batch = row.get("batch")
            label, inputs, layers = graph
            used.append(
                Row(
                    id=rid,
                    slug=slug,
                    label=label,
                    precision=precision,
                    batch=batch if isinstance(batch, int) else None,
                    prompt=int(row["input_tokens"]),
                    generated=int(row["output_tokens"]),
                    metric="throughput" if metric == "throughput" else "ttft",
                    measured=float(row["value"]) * (int(tp or 1) * pp if per_gpu else 1),
                    tensor_parallel=int(tp or 1),
                    inputs=inputs,
                    layers=layers,
                    pipeline_parallel=pp,
                )
            )
    return used, skipped


VLLM_PRECISIONS = {  # the vLLM rows' precision text -> the service's (vllm_rule (3))
    "BF16": Precision.BF16,
    "FP16": Precision.FP16,
    "not stated (the checkpoint's BF16, vLLM dtype auto)": Precision.BF16,
}


def _mean_tokens(row: Mapping[str, Any], which: str) -> int | None:
    """A row's fixed length, or the mean over its completed requests (vllm_rule (5))."""
    fixed = row.get(f"{which}_tokens")
    if isinstance(fixed, int):
        return fixed
    total, completed = row.get(f"total_{which}_tokens"), row.get("completed")
    if isinstance(total, int) and isinstance(completed, int) and completed > 0:
        return max(round(total / completed), 1)
    return None


def vllm_rows(
    raw: Iterable[Mapping[str, Any]], devices: Mapping[str, HardwareSpec]
) -> tuple[list[Row], list[tuple[str, str]]]:
    """The vLLM rows the meta's ``vllm_rule`` takes, and the others with the reason."""
    used: list[Row] = []
    skipped: list[tuple[str, str]] = []
    for row in raw:
        if row.get("category") != "llm_serving" or row.get("runtime") != "vllm":
            continue
        rid, metric = str(row["id"]), str(row["metric"])
        graph = _graph(str(row["model"]))
        precision = VLLM_PRECISIONS.get(str(row.get("precision")))
        slug = str(row["device"])
        prompt, generated = _mean_tokens(row, "input"), _mean_tokens(row, "output")
        concurrency = row.get("concurrency")
        if row.get("excluded"):
            skipped.append((rid, f"excluded: {row['excluded']}"))
        elif slug not in devices:
            skipped.append((rid, f"device {row['device']!r} not in the catalog"))
        elif graph is None:
            skipped.append((rid, f"model {row['model']!r} not mapped"))
        elif precision is None:
            skipped.append((rid, f"precision {row.get('precision')!r}"))
        elif prompt is None or generated is None:
            skipped.append((rid, "input / output lengths (or their means) not stated"))
        elif not isinstance(concurrency, int):
            skipped.append((rid, "concurrency not stated"))
        elif metric not in ("throughput", "decode_rate"):
            skipped.append((rid, f"metric {metric!r}"))
        else:
            label, inputs, layers = graph
            used.append(
                Row(
                    id=rid,
                    slug=slug,
                    label=label,
                    precision=precision,
                    batch=concurrency,
                    prompt=prompt,
                    generated=generated,
                    metric=metric,
                    measured=float(row["value"]),
                    tensor_parallel=int(row.get("tensor_parallel") or 1),
                    inputs=inputs,
                    layers=layers,
                    runtime="vllm",
                )
            )
    return used, skipped


def _source(row: Row, batching: Batching) -> ModelSource:
    return ModelSource(
        inputs=[calibrate._input_spec(decl) for decl in row.inputs],
        layers=row.layers,
        defaults={},
        label=row.label,
        key="",
        extra={},
        sequence_length=None,
        image_size=None,
        decoder=True,
        prompt_tokens=row.prompt,
        generated_tokens=row.generated,
        fuse_elementwise=True,
        memo={},
        serving=DecoderServing(
            prompt_tokens_max=row.prompt,
            prompt_tokens_mean=row.prompt,
            generated_tokens_max=row.generated,
            generated_tokens_mean=row.generated,
            batching=batching,
        ),
    )


@dataclass(frozen=True, slots=True)
class Result:
    """A row and the model's answer."""

    row: Row
    predicted: float | None
    batch: int | None
    note: str

    @property
    def ratio(self) -> float | None:
        return None if self.predicted is None else self.predicted / self.row.measured


def _workload(source: ModelSource, scheme: PrecisionScheme, tp: int, batch: int) -> PhasedRequest:
    whole = source.workload(batch, scheme)
    return whole if tp == 1 else shard(whole, tp)


_SOURCES: dict[tuple[str, Batching], ModelSource] = {}


def _cached_source(row: Row, batching: Batching) -> ModelSource:
    """The row's model source, built once per batching (the fit predicts each row many times)."""
    key = (row.id, batching)
    found = _SOURCES.get(key)
    if found is None:
        found = _SOURCES[key] = _source(row, batching)
    return found


def evaluate(
    items: list[Row],
    devices: Mapping[str, HardwareSpec],
    batching: Batching = Batching.CONTINUOUS,
    profile: RuntimeProfile | None = None,
    half_scale: float | None = None,
) -> list[Result]:
    """Each row as the recommender serves it with ``batching`` (and a runtime ``profile``:
    its calibration change and its host time per engine step; ``half_scale``: the GPU classes'
    16-bit scale in place of the shipped one)."""
    host_s = 0.0 if profile is None else profile.host_overhead_per_sequence_step_s
    results = []
    for row in items:
        device = devices[row.slug]
        scheme = PRECISION_SCHEMES[row.precision]
        reason = unsupported_reason(device, scheme)
        if reason is not None:
            results.append(Result(row, None, None, reason))
            continue
        source = _cached_source(row, batching)
        cls = calibration_class(device, scheme)
        calibration = DEFAULT_CALIBRATIONS[cls]
        if half_scale is not None and cls in GPU_CLASSES:
            calibration = replace(calibration, half_precision_scale=half_scale)
        if profile is not None:
            calibration = profile.apply(calibration, device.kind)
        tp = row.tensor_parallel
        if row.metric == "ttft":
            p = with_decode_host_overhead(
                predict(_workload(source, scheme, tp, 1), device, calibration), host_s
            )
            assert p.first_token_s is not None
            results.append(Result(row, p.first_token_s * 1e3, 1, "batch 1 prefill"))
            continue
        if row.metric == "decode_rate":
            assert row.batch is not None
            p = with_decode_host_overhead(
                predict(_workload(source, scheme, tp, row.batch), device, calibration), host_s
            )
            assert p.per_token_s is not None
            note = f"1 / decode step at batch {row.batch}, mean context"
            results.append(Result(row, 1 / p.per_token_s, row.batch, note))
            continue
        candidate = Candidate(device=device, runtime=device.runtime, overhead=device.overhead)
        pp = row.pipeline_parallel
        if pp > 1:
            candidate = pipeline_group(candidate, pp, tp)
        elif tp > 1:
            candidate = tensor_parallel_group(candidate, tp)
        batch, how = row.batch, "the row's batch"
        if batch is None and source.plan.continuous:
            batch = max(source.max_concurrent_requests(scheme, candidate, MAX_BATCH), 1)
            how = (
                f"continuous: as many as the paged KV cache holds "
                f"({source.plan.kv_tokens_per_request()} token slots each)"
            )
        elif batch is None:
            batch, how = 1, "largest power of two that fits"
            while batch * 2 <= MAX_BATCH and source.memory_fit(batch * 2, scheme, candidate).fits:
                batch *= 2
        if pp > 1:
            micro, size = micro_batching(batch, pp)
            how += f", pipeline parallel {pp} x tensor {tp}, {micro} micro-batches (the group's)"
            p = predict_pipeline(
                source.staged(size, scheme, pp, tp),
                candidate.device,
                calibration,
                batch=batch,
                micro_batches=micro,
            )
            p = with_decode_host_overhead(p, host_s)
            results.append(Result(row, p.throughput_per_s * row.generated, batch, how))
            continue
        if tp > 1:
            how += f", tensor parallel {tp} (the group's tokens/s)"
        p = predict(_workload(source, scheme, tp, batch), candidate.device, calibration)
        p = with_decode_host_overhead(p, host_s)
        results.append(Result(row, p.throughput_per_s * row.generated, batch, how))
    return results


def render(results: list[Result], skipped: list[tuple[str, str]]) -> str:
    """The report: per metric the shares within 1.5x and 2x, then every row."""
    lines = [
        "# Decoder serving against published TensorRT-LLM measurements",
        "",
        "Generated by `benchmarks/calibration/llm_serving.py` from `framework_measurements.yaml`."
        " Ratios are predicted / measured, with the shipped calibration. Nothing is fitted on "
        "the fp8 and fp4 rows; the GPUs' 16-bit scale (`half_precision_scale`) is fitted on "
        "the fp16 throughput rows (`half_precision.md`: their error with each device left out "
        "of that fit).",
        "",
        "| metric | rows | within 1.5x | within 2x | median ratio |",
        "|---|---|---|---|---|",
    ]
    for metric in ("throughput", "ttft"):
        ratios = [r.ratio for r in results if r.row.metric == metric and r.ratio is not None]
        if not ratios:
            continue
        within = sum(1 for x in ratios if max(x, 1 / x) <= WITHIN)
        worst = sum(1 for x in ratios if max(x, 1 / x) <= WITHIN_WORST)
        lines.append(
            f"| {metric} | {len(ratios)} | {within} | {worst} | {statistics.median(ratios):.2f} |"
        )
    lines += [
        "",
        "| row | device | model | precision | in | out | metric | measured | batch | predicted "
        "| ratio | how |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        row = r.row
        unit = "ms" if row.metric == "ttft" else "tok/s"
        predicted = "n/a" if r.predicted is None else f"{r.predicted:,.4g}"
        ratio = "n/a" if r.ratio is None else f"{r.ratio:.2f}"
        lines.append(
            f"| {row.id} | {row.slug} | {row.label} | {row.precision.value} | {row.prompt} | "
            f"{row.generated} | {row.metric} | {row.measured:,.4g} {unit} | {r.batch or ''} | "
            f"{predicted} | {ratio} | {r.note} |"
        )
    lines += ["", "Not predicted:", ""]
    lines += [f"* {rid}: {reason}" for rid, reason in skipped]
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------------------------
# Fits scored in sample and with each device left out
# --------------------------------------------------------------------------------------------

Fitted = TypeVar("Fitted")


@dataclass(frozen=True, slots=True)
class FitResult(Generic[Fitted]):
    """A row: unfitted (the default), in sample, and with its device left out of the fit
    (``refit``: that fit)."""

    row: Row
    default: float
    in_sample: float
    device_out: float | None  # None: no other device's rows to fit on
    refit: Fitted | None

    def ratio(self, which: str = "device_out") -> float | None:
        value = {"default": self.default, "in_sample": self.in_sample}.get(which, self.device_out)
        return None if value is None else value / self.row.measured


def _squared_log_error(results: list[Result]) -> float:
    """Sum of squared log(predicted / measured) [-]."""
    total = 0.0
    for result in results:
        assert result.ratio is not None
        total += math.log(result.ratio) ** 2
    return total


def _score(
    items: list[Row],
    default: list[Result],
    in_sample: list[Result],
    refit: Callable[[list[Row]], Fitted],
    predict_with: Callable[[Row, Fitted], float | None],
) -> list[FitResult[Fitted]]:
    """Each row's default and in-sample prediction, and its prediction with the fit refitted
    without its device's rows (``refit``: fit on rows; ``predict_with``: one row under a fit)."""
    refits: dict[str, Fitted | None] = {}
    results = []
    for row, base, fit in zip(items, default, in_sample, strict=True):
        if row.slug not in refits:
            others = [r for r in items if r.slug != row.slug]
            refits[row.slug] = refit(others) if others else None
        fitted = refits[row.slug]
        out = None if fitted is None else predict_with(row, fitted)
        assert base.predicted is not None
        assert fit.predicted is not None
        results.append(FitResult(row, base.predicted, fit.predicted, out, fitted))
    return results


def _summary(results: list[Any], default_label: str) -> list[str]:
    """The report's summary table: shares within 1.5x and 2x unfitted, in sample, left out."""
    lines = [
        "| prediction | rows | within 1.5x | within 2x | median ratio |",
        "|---|---|---|---|---|",
    ]
    for which, label in (
        ("default", default_label),
        ("in_sample", "in sample"),
        ("device_out", "device left out"),
    ):
        ratios = [x for r in results if (x := r.ratio(which)) is not None]
        lines.append(f"| {label} | {_shares(ratios)} |")
    return lines


# --------------------------------------------------------------------------------------------
# The GPUs' 16-bit scale: fitted on the fp16 / bf16 TensorRT-LLM throughput rows
# --------------------------------------------------------------------------------------------

HALF_RESULTS = HERE / "half_precision.md"


def half_rows(items: list[Row], devices: Mapping[str, HardwareSpec]) -> list[Row]:
    """The rows the 16-bit scale is fitted on: throughput rows whose math runs in fp16 or
    bf16 on a device of a GPU class."""
    chosen = []
    for row in items:
        device = devices[row.slug]
        scheme = PRECISION_SCHEMES[row.precision]
        if row.metric != "throughput" or unsupported_reason(device, scheme) is not None:
            continue
        if calibration_class(device, scheme) not in GPU_CLASSES:
            continue
        if compute_dtype_for(device, scheme) in HALF_PRECISION_DTYPES:
            chosen.append(row)
    return chosen


def half_precision_fit(items: list[Row], devices: Mapping[str, HardwareSpec]) -> float:
    """The 16-bit scale (grid of 0.01) that minimises the sum of squared log(predicted /
    measured) over ``items``."""
    return calibrate.grid_best(
        HALF_SCALE_GRID,
        lambda scale: _squared_log_error(evaluate(items, devices, half_scale=scale)),
    )


def half_evaluate(
    items: list[Row], devices: Mapping[str, HardwareSpec], fitted: float
) -> list[FitResult[float]]:
    """Each row at scale 1, at the fit, and at the fit without its device's rows."""
    return _score(
        items,
        evaluate(items, devices, half_scale=1.0),
        evaluate(items, devices, half_scale=fitted),
        lambda others: half_precision_fit(others, devices),
        lambda row, scale: evaluate([row], devices, half_scale=scale)[0].predicted,
    )


def half_shipped_matches(fitted: float) -> list[str]:
    """Differences between the GPU classes' shipped 16-bit scale and the fit (empty: they
    agree); the other classes keep 1."""
    problems = []
    for cls, calibration in DEFAULT_CALIBRATIONS.items():
        want = fitted if cls in GPU_CLASSES else 1.0
        if not math.isclose(calibration.half_precision_scale, want):
            problems.append(
                f"{cls.value} half_precision_scale: fitted {want!r}, shipped "
                f"{calibration.half_precision_scale!r}"
            )
    return problems


def render_half(
    results: list[FitResult[float]], checks: list[tuple[Result, Result]], fitted: float
) -> tuple[str, bool]:
    """The 16-bit report, and whether the shipped scale is the fit. ``checks``: rows not
    fitted on that the scale moves (time to first token in fp16), at scale 1 and shipped."""
    problems = half_shipped_matches(fitted)
    scales = sorted({r.refit for r in results if r.refit is not None})
    lines = [
        "# GPUs' 16-bit compute scale: fit and error",
        "",
        "Generated by `benchmarks/calibration/llm_serving.py` from the fp16 TensorRT-LLM "
        "throughput rows of `framework_measurements.yaml`. The GPU classes' compute "
        "efficiencies are fitted on int8 rows (MLPerf ResNet-50); fp16 / bf16 math runs at "
        "`half_precision_scale` x that efficiency (at most 1). Ratios are predicted / measured;"
        " *scale 1*: the int8 fits alone; *left out*: the scale refitted without the row's "
        "device.",
        "",
        f"Fitted: {fitted:g} (grid of 0.01 over {HALF_SCALE_GRID[0]:g}-{HALF_SCALE_GRID[-1]:g}; "
        "least squares on log predicted/measured); with each device left out: "
        + ", ".join(f"{x:g}" for x in scales)
        + ".",
        "",
        "Shipped scale matches the fit: "
        + ("yes." if not problems else "NO - " + "; ".join(problems) + "."),
        "",
        *_summary(results, "scale 1 (int8 fits alone)"),
    ]
    lines += [
        "",
        "| row | device | model | in | out | measured | scale 1 | ratio | in sample | ratio "
        "| left out (scale) | ratio |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        row = r.row
        out = "n/a"
        if r.device_out is not None and r.refit is not None:
            out = f"{r.device_out:,.4g} ({r.refit:g})"
        out_ratio = "n/a" if (x := r.ratio()) is None else f"{x:.2f}"
        lines.append(
            f"| {row.id} | {row.slug} | {row.label} | {row.prompt} | {row.generated} | "
            f"{row.measured:,.4g} tok/s | {r.default:,.4g} | {r.ratio('default'):.2f} | "
            f"{r.in_sample:,.4g} | {r.ratio('in_sample'):.2f} | {out} | {out_ratio} |"
        )
    lines += [
        "",
        "Not fitted on, moved by the scale (fp16 time to first token, batch-1 prefill):",
        "",
        "| row | device | in | measured | scale 1 | ratio | shipped | ratio |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for base, shipped in checks:
        row = base.row
        assert base.ratio is not None
        assert shipped.ratio is not None
        lines.append(
            f"| {row.id} | {row.slug} | {row.prompt} | {row.measured:,.4g} ms | "
            f"{base.predicted:,.4g} | {base.ratio:.2f} | {shipped.predicted:,.4g} | "
            f"{shipped.ratio:.2f} |"
        )
    return "\n".join(lines) + "\n", not problems


def half_checks(
    items: list[Row], devices: Mapping[str, HardwareSpec]
) -> list[tuple[Result, Result]]:
    """The fp16 / bf16 rows on GPU classes that are not throughput rows, at scale 1 and with
    the shipped scale."""
    fitted = set(map(id, half_rows(items, devices)))
    rest = []
    for row in items:
        if id(row) in fitted:
            continue
        device = devices[row.slug]
        scheme = PRECISION_SCHEMES[row.precision]
        if unsupported_reason(device, scheme) is not None:
            continue
        if calibration_class(device, scheme) not in GPU_CLASSES:
            continue
        if compute_dtype_for(device, scheme) in HALF_PRECISION_DTYPES:
            rest.append(row)
    return list(zip(evaluate(rest, devices, half_scale=1.0), evaluate(rest, devices), strict=True))


# --------------------------------------------------------------------------------------------
# vLLM: the profile fitted on the rows the meta's vllm_rule takes
# --------------------------------------------------------------------------------------------

VLLM_RESULTS = HERE / "vllm_profile.md"


def vllm_fit(items: list[Row], devices: Mapping[str, HardwareSpec]) -> RuntimeProfile:
    """The vllm profile whose compute-efficiency scale (grid of 0.05) and host time per
    sequence per engine step (the ladder) minimise the sum of squared log(predicted /
    measured) over ``items``."""
    shipped = RUNTIME_PROFILES[ServingRuntime.VLLM]
    trials = (
        replace(
            shipped,
            compute_efficiency_scale=scale,
            host_overhead_per_sequence_step_s=host_us * 1e-6,
        )
        for host_us in VLLM_HOST_LADDER_US
        for scale in VLLM_SCALE_GRID
    )
    return calibrate.grid_best(
        trials, lambda trial: _squared_log_error(evaluate(items, devices, profile=trial))
    )


def vllm_evaluate(
    items: list[Row], devices: Mapping[str, HardwareSpec], fitted: RuntimeProfile
) -> list[FitResult[RuntimeProfile]]:
    """Each row unfitted, in sample, and leaving its device out of the fit."""
    return _score(
        items,
        evaluate(items, devices),
        evaluate(items, devices, profile=fitted),
        lambda others: vllm_fit(others, devices),
        lambda row, profile: evaluate([row], devices, profile=profile)[0].predicted,
    )


def vllm_shipped_matches(fitted: RuntimeProfile) -> list[str]:
    """Differences between the shipped vllm profile and the fit (empty: they agree)."""
    shipped = RUNTIME_PROFILES[ServingRuntime.VLLM]
    problems = []
    for name in (
        "fuse_elementwise",
        "compute_efficiency_scale",
        "host_dispatch_s",
        "host_overhead_per_sequence_step_s",
    ):
        a, b = getattr(fitted, name), getattr(shipped, name)
        if a != b and not (isinstance(a, float) and isinstance(b, float) and math.isclose(a, b)):
            problems.append(f"vllm {name}: fitted {a!r}, shipped {b!r}")
    return problems


def _shares(ratios: list[float]) -> str:
    within = sum(1 for x in ratios if max(x, 1 / x) <= WITHIN)
    worst = sum(1 for x in ratios if max(x, 1 / x) <= WITHIN_WORST)
    n = len(ratios)
    median = f"{statistics.median(ratios):.2f}" if ratios else "n/a"
    return f"{n} | {within}/{n} | {worst}/{n} | {median}"


def render_vllm(
    results: list[FitResult[RuntimeProfile]],
    skipped: list[tuple[str, str]],
    fitted: RuntimeProfile,
) -> tuple[str, bool]:
    """The vLLM report, and whether the shipped profile is the fit."""
    problems = vllm_shipped_matches(fitted)
    lines = [
        "# vLLM serving profile: fit and error",
        "",
        "Generated by `benchmarks/calibration/llm_serving.py` from the vLLM rows of "
        "`framework_measurements.yaml` (which rows: the meta's `vllm_rule`, written before any "
        "row was predicted). Ratios are predicted / measured; *default*: the TensorRT-LLM-grade "
        "path unfitted; *left out*: the profile refitted without the row's device.",
        "",
        f"Fitted: compute-efficiency scale {fitted.compute_efficiency_scale:g}, host time "
        f"{fitted.host_overhead_per_sequence_step_s * 1e6:g} us per sequence per engine step "
        "(grid of 0.05 x the ladder of "
        f"{', '.join(str(u) for u in VLLM_HOST_LADDER_US)} us; least squares on "
        "log predicted/measured).",
        "",
        "Shipped profile matches the fit: "
        + ("yes." if not problems else "NO - " + "; ".join(problems) + "."),
        "",
        *_summary(results, "default (unfitted)"),
    ]
    lines += [
        "",
        "| row | device | model | precision | in | out | batch | metric | measured | default "
        "| in sample | ratio | left out | ratio |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        row = r.row
        out = "n/a" if r.device_out is None else f"{r.device_out:,.4g}"
        out_ratio = "n/a" if (x := r.ratio()) is None else f"{x:.2f}"
        lines.append(
            f"| {row.id} | {row.slug} | {row.label} | {row.precision.value} | {row.prompt} | "
            f"{row.generated} | {row.batch} | {row.metric} | {row.measured:,.4g} tok/s | "
            f"{r.default:,.4g} | {r.in_sample:,.4g} | {r.ratio('in_sample'):.2f} | {out} | "
            f"{out_ratio} |"
        )
    lines += ["", "Not predicted:", ""]
    lines += [f"* {rid}: {reason}" for rid, reason in skipped]
    return "\n".join(lines) + "\n", not problems


def main(argv: list[str] | None = None) -> int:
    """Print the report (exit 0: a baseline, not a target)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--write-results", action="store_true", help=f"write {RESULTS.name}")
    parser.add_argument(
        "--static", action="store_true", help="static batching (the previous baseline)"
    )
    args = parser.parse_args(argv)
    devices = calibrate.catalog_devices()
    document = yaml.safe_load(DATA.read_text(encoding="utf-8"))
    items, skipped = rows(document["results"], devices)
    batching = Batching.STATIC if args.static else Batching.CONTINUOUS
    report = render(evaluate(items, devices, batching), skipped)
    print(report)
    vllm_items, vllm_skipped = vllm_rows(document["results"], devices)
    fitted = vllm_fit(vllm_items, devices)
    vllm_report, ok = render_vllm(vllm_evaluate(vllm_items, devices, fitted), vllm_skipped, fitted)
    print(vllm_report)
    half = half_rows(items, devices)
    half_fitted = half_precision_fit(half, devices)
    half_report, half_ok = render_half(
        half_evaluate(half, devices, half_fitted), half_checks(items, devices), half_fitted
    )
    print(half_report)
    if args.write_results:
        RESULTS.write_text(report, encoding="utf-8")
        VLLM_RESULTS.write_text(vllm_report, encoding="utf-8")
        HALF_RESULTS.write_text(half_report, encoding="utf-8")
    return 0 if ok and half_ok else 1


if __name__ == "__main__":
    sys.exit(main())
