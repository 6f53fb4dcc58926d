"""Fit the serving-runtime profiles on published framework-level measurements.

    .venv/bin/python benchmarks/calibration/runtimes.py [--write-results]

Reads ``framework_measurements.yaml`` (published same-model, same-device measurements under
PyTorch eager, ``torch.compile``, TensorFlow, TensorFlow XLA, TensorRT, ONNX Runtime; sources
per row) and, for every ``runtime_comparison`` row it can map (device to the catalog, model to
a graph, precision to the service's), predicts the row with the shipped calibration and the
runtime's profile (:mod:`app.domain.performance.runtimes`):

* per runtime other than TensorRT, fits the compute-efficiency scale (grid of 0.05) and the
  framework's host time per kernel (``host_dispatch_s``, a ladder of 1 to 150 us; overlapped
  with the GPU's work, the GPU's own launch overhead staying the calibration's) that minimise
  the sum of squared log(predicted / measured) over its rows, with element-wise fusion fixed
  by what the runtime does (eager PyTorch and TensorFlow run one kernel per layer; ONNX
  Runtime's graph optimizer fuses them); which ONNX Runtime rows count is the file's
  ``onnxruntime_rule`` (CUDA execution provider only: TensorRT-provider rows are TensorRT's
  engine);
* TensorRT rows are predicted with the shipped calibration, unfitted: its error here is out of
  sample (the calibration was fitted on MLPerf rows only);
* leave-one-device-out: each row again with its runtime refitted without its device's rows;
* CPUs (``cpu_eager_rule``): the ``pytorch_eager`` profile's CPU compute-efficiency scale,
  fitted on published ratios of Intel's optimized PyTorch (IPEX) to stock PyTorch, the
  optimized side at the shipped CPU calibration; each ratio also with its model's and with its
  CPU's rows left out of the fit.

Prints every row (in sample and left out), per runtime the fitted constants and the share of
rows within 1.5x and 2x; exit 1 when the shipped profiles differ from the fit.
``tests/contract/test_runtime_profiles.py`` runs the same functions in CI.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import yaml

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import calibrate  # noqa: E402  (the calibration script beside this one)

from app.domain.graph.analysis import analyze  # noqa: E402
from app.domain.hardware import DeviceKind, HardwareSpec  # noqa: E402
from app.domain.performance.calibration import DEFAULT_CALIBRATIONS, calibration_class  # noqa: E402
from app.domain.performance.phases import PhasedRequest, forward_request  # noqa: E402
from app.domain.performance.precision_schemes import PRECISION_SCHEMES  # noqa: E402
from app.domain.performance.roofline import predict, unsupported_reason  # noqa: E402
from app.domain.performance.runtimes import (  # noqa: E402
    DECODER_ONLY,
    DEFAULT_RUNTIME,
    RUNTIME_PROFILES,
    RuntimeProfile,
    ServingRuntime,
)
from app.domain.precision import Precision  # noqa: E402
from app.domain.zoo import ZOO, bert  # noqa: E402

DATA = HERE / "framework_measurements.yaml"
RESULTS = HERE / "runtimes.md"
SCALE_GRID = tuple(round(0.05 * i, 2) for i in range(1, 41))  # 0.05 .. 2.0
HOST_DISPATCH_LADDER_US = (1, 2, 3, 4, 6, 8, 10, 12, 15, 20, 25, 30, 40, 50, 60, 80, 100, 120, 150)
WITHIN, WITHIN_WORST = 1.5, 2.0
IMAGE_MODELS = ("resnet-50", "vit-b-16", "mobilenet-v2")

RUNTIMES = {
    "tensorrt": ServingRuntime.TENSORRT,
    "pytorch_eager": ServingRuntime.PYTORCH_EAGER,
    "torch_compile (mode=default)": ServingRuntime.TORCH_COMPILE,
    "tensorflow": ServingRuntime.TENSORFLOW,
    "onnxruntime (CUDA execution provider)": ServingRuntime.ONNXRUNTIME,
}
NOT_USED = {
    "tensorflow_xla": "3 rows on 2 devices: leaving one device out leaves too few to fit "
    "(tried: 0 of 3 within 1.5x); no profile",
    "torch_compile (mode=reduce-overhead, CUDA graphs)": "CUDA graphs replay the whole model "
    "without per-kernel launches: one row, no profile of its own",
    "onnxruntime_tensorrt_ep (Triton Inference Server)": "ONNX Runtime's TensorRT execution "
    "provider (TensorRT builds the engine: not the onnxruntime profile), measured at the Triton "
    "client (network and queueing included); onnxruntime_rule (1)",
}
DEVICES = {  # the rows' device text -> catalog slug, with what the mapping assumes
    "nvidia-v100-16gb-sxm2 (DGX-1; not in catalog, nearest nvidia-v100-32gb-sxm2)": (
        "nvidia-v100-32gb-sxm2",
        "V100 16 GB SXM2 as the 32 GB part (same compute and bandwidth)",
    ),
    "nvidia-a100 (variant not stated)": ("nvidia-a100-40gb-sxm", "A100 variant not stated: SXM"),
    "nvidia-v100 (variant not stated)": (
        "nvidia-v100-32gb-sxm2",
        "V100 variant not stated: SXM2",
    ),
    "nvidia-v100-16gb-pcie (Tesla V100-PCIE-16GB; not in catalog, nearest nvidia-v100-32gb-pcie)": (
        "nvidia-v100-32gb-pcie",
        "V100 16 GB PCIe as the 32 GB part (same compute and bandwidth)",
    ),
    "nvidia-a100-40gb (demo says A100 40GB; form factor not stated)": (
        "nvidia-a100-40gb-sxm",
        "A100 40 GB form factor not stated: SXM",
    ),
}


@dataclass(frozen=True, slots=True)
class Row:
    """One measurement the fit can use."""

    id: str
    runtime: ServingRuntime
    slug: str
    model: str  # graph key
    precision: Precision
    batch: int
    seq: int | None
    metric: str  # "throughput" [1/s] or "latency" [ms per batch]
    measured: float
    note: str


@dataclass(frozen=True, slots=True)
class CpuRow:
    """One published ratio of an optimized PyTorch stack to stock PyTorch on a CPU."""

    id: str
    slug: str
    model: str  # graph key
    precision: Precision
    batch: int
    seq: int | None
    cores: int | None  # cores per instance (None: one instance on the whole socket)
    measured: float  # optimized throughput / stock throughput
    note: str


@dataclass(frozen=True, slots=True)
class Skipped:
    """A row the fit does not use, and why."""

    id: str
    runtime: str
    reason: str


def load(path: Path = DATA) -> list[dict[str, Any]]:
    """The ``results`` rows of the framework file."""
    document = yaml.safe_load(path.read_text(encoding="utf-8"))
    rows: list[dict[str, Any]] = document["results"]
    return rows


def _model(text: str) -> tuple[str | None, str]:
    lowered = text.lower()
    if "resnet50" in lowered or "resnet-50" in lowered:
        return "resnet-50", ""
    if "vit-base-patch16-224" in lowered:
        return "vit-b-16", ""
    if "mobilenet v2" in lowered or "mobilenet-v2" in lowered:
        return "mobilenet-v2", ""
    if "distilbert-base" in lowered:
        return "distilbert-base", "DistilBERT-base as a 6-layer BERT-base encoder with a QA head"
    if "bert-large" in lowered:
        return "bert-large", "BERT-large encoder with a 2-logit QA head"
    if "bert-base" in lowered:
        return "bert-base", "BERT-base encoder with a 2-logit QA head"
    if "roberta-large" in lowered:
        return "roberta-large", "RoBERTa-large as a 24-layer BERT encoder (hidden 1024)"
    if "roberta-base" in lowered:
        return "roberta-base", "RoBERTa-base as a BERT-base encoder (vocabulary 50265)"
    if "minilm-l6-h384" in lowered:
        return "minilm-l6", "MiniLM-L6-H384 as a 6-layer BERT encoder, hidden 384"
    return None, ""


def _precision(text: str) -> tuple[Precision | None, str]:
    if "INT8" in text:
        return Precision.INT8, ""
    if text.strip() == "BF16":
        return Precision.BF16, ""
    if "FP16" in text or "AMP" in text:
        return Precision.FP16, ""
    if "TF32" in text:
        return Precision.TF32, ""
    if "FP32" in text:
        return Precision.FP32, ""
    if text == "not stated":  # the HF torch.compile benchmark runs the models' default fp32
        return Precision.FP32, "precision not stated: fp32 (the benchmark's default dtype)"
    return None, ""


def _pytorch_tf32(
    runtime: ServingRuntime, model: str, precision: Precision, device: HardwareSpec
) -> tuple[Precision, str]:
    """PyTorch runs fp32 convolutions in TF32 on GPUs that have it (cuDNN's allow_tf32
    defaults to True; matmuls stay fp32): a convolutional model's fp32 row is a tf32 one."""
    if (
        runtime in (ServingRuntime.PYTORCH_EAGER, ServingRuntime.TORCH_COMPILE)
        and precision is Precision.FP32
        and model == "resnet-50"
        and unsupported_reason(device, PRECISION_SCHEMES[Precision.TF32]) is None
    ):
        return Precision.TF32, (
            "fp32 convolutions run in TF32 (PyTorch's cudnn.allow_tf32 defaults to True)"
        )
    return precision, ""


def rows(
    raw: Iterable[Mapping[str, Any]], devices: Mapping[str, HardwareSpec]
) -> tuple[list[Row], list[Skipped]]:
    """The runtime-comparison rows mapped to a device, a graph and a precision, and the rest
    with the reason they are not used."""
    used: list[Row] = []
    skipped: list[Skipped] = []
    for row in raw:
        if row.get("category") != "runtime_comparison":
            continue
        rid, runtime_text = str(row["id"]), str(row["runtime"])
        if runtime_text not in RUNTIMES:
            reason = NOT_USED.get(runtime_text, "runtime not profiled")
            skipped.append(Skipped(rid, runtime_text, reason))
            continue
        device_text = str(row["device"])
        slug, device_note = DEVICES.get(device_text, (device_text, ""))
        model, model_note = _model(str(row["model"]))
        precision, precision_note = _precision(str(row.get("precision", "")))
        unit = str(row.get("unit", ""))
        metric = "latency" if str(row["metric"]).startswith("latency") else "throughput"
        if slug not in devices:
            skipped.append(Skipped(rid, runtime_text, f"device {device_text!r} not in catalog"))
        elif model is None:
            skipped.append(Skipped(rid, runtime_text, f"model {row['model']!r} not mapped"))
        elif precision is None:
            skipped.append(Skipped(rid, runtime_text, f"precision {row['precision']!r}"))
        elif metric == "latency" and "ms" not in unit:
            skipped.append(Skipped(rid, runtime_text, f"unit {unit!r}"))
        else:
            precision, tf32_note = _pytorch_tf32(
                RUNTIMES[runtime_text], model, precision, devices[slug]
            )
            precision_note = "; ".join(n for n in (precision_note, tf32_note) if n)
            seq = row.get("seq_len")
            used.append(
                Row(
                    id=rid,
                    runtime=RUNTIMES[runtime_text],
                    slug=slug,
                    model=model,
                    precision=precision,
                    batch=int(row["batch"]),
                    seq=int(seq) if seq is not None else None,
                    metric=metric,
                    measured=float(row["value"]),
                    note="; ".join(n for n in (device_note, model_note, precision_note) if n),
                )
            )
    return used, skipped


def _graph(model: str) -> tuple[list[Any], list[Any]]:
    qa = {"name": "qa_outputs", "op": "linear", "out_features": 2}
    if model in IMAGE_MODELS:
        zoo = ZOO[model]
        return list(zoo.inputs), list(zoo.layers)
    if model == "distilbert-base":
        zoo = bert(layers=6)
        return list(zoo.inputs), [*zoo.layers, qa]
    if model == "bert-large":
        zoo = bert(layers=24, hidden=1024, heads=16, intermediate=4096, pooler=False)
        return list(zoo.inputs), [*zoo.layers, qa]
    if model == "bert-base":
        zoo = bert(pooler=False)
        return list(zoo.inputs), [*zoo.layers, qa]
    if model == "roberta-base":
        zoo = bert(vocab=50265, positions=514, type_vocab=1)
        return list(zoo.inputs), list(zoo.layers)
    if model == "roberta-large":
        zoo = bert(
            layers=24,
            hidden=1024,
            heads=16,
            intermediate=4096,
            vocab=50265,
            positions=514,
            type_vocab=1,
        )
        return list(zoo.inputs), list(zoo.layers)
    zoo = bert(layers=6, hidden=384, heads=12, intermediate=1536)  # minilm-l6
    return list(zoo.inputs), list(zoo.layers)


_WORKLOADS: dict[tuple[str, int, int | None, Precision, bool], PhasedRequest] = {}


def workload(row: Row | CpuRow, fuse: bool) -> PhasedRequest:
    """The row's model at its batch, sequence and precision, fused or not."""
    key = (row.model, row.batch, row.seq, row.precision, fuse)
    found = _WORKLOADS.get(key)
    if found is None:
        inputs, layers = _graph(row.model)
        bindings = {"batch": row.batch}
        if row.seq is not None:
            bindings["seq"] = row.seq
        if row.model in IMAGE_MODELS:
            bindings["image"] = 224
        analysis = analyze(inputs, layers, bindings, training=False)
        found = _WORKLOADS[key] = forward_request(
            analysis, PRECISION_SCHEMES[row.precision], batch=row.batch, fuse_elementwise=fuse
        )
    return found


def predicted(row: Row, profile: RuntimeProfile, devices: Mapping[str, HardwareSpec]) -> float:
    """The row's figure (throughput [1/s] or latency [ms per batch]) under ``profile``."""
    device = devices[row.slug]
    request = workload(row, profile.fuse_elementwise)
    calibration = profile.apply(
        DEFAULT_CALIBRATIONS[calibration_class(device, request.scheme)], device.kind
    )
    p = predict(request, device, calibration)
    return p.throughput_per_s if row.metric == "throughput" else p.latency_s * 1e3


def fit(
    runtime: ServingRuntime, items: list[Row], devices: Mapping[str, HardwareSpec]
) -> RuntimeProfile:
    """The profile of ``runtime`` whose scale and host dispatch time fit ``items`` best."""
    shipped = RUNTIME_PROFILES[runtime]
    return calibrate.grid_best(
        (
            replace(shipped, compute_efficiency_scale=scale, host_dispatch_s=host_us * 1e-6)
            for host_us in HOST_DISPATCH_LADDER_US
            for scale in SCALE_GRID
        ),
        lambda trial: sum(math.log(predicted(r, trial, devices) / r.measured) ** 2 for r in items),
    )


@dataclass(frozen=True, slots=True)
class Result:
    """One row: measured, in sample, and with its device left out of the fit."""

    row: Row
    in_sample: float
    device_out: float | None  # None: no other device's rows to fit on (or TensorRT: unfitted)

    def ratio(self, which: str = "device_out") -> float | None:
        value = self.in_sample if which == "in_sample" else self.device_out
        return None if value is None else value / self.row.measured


def derive(
    items: list[Row], devices: Mapping[str, HardwareSpec]
) -> dict[ServingRuntime, RuntimeProfile]:
    """Every profile the rows determine (TensorRT: the shipped calibration, not fitted)."""
    profiles = {DEFAULT_RUNTIME: RUNTIME_PROFILES[DEFAULT_RUNTIME]}
    for runtime in ServingRuntime:
        if runtime is DEFAULT_RUNTIME or runtime in DECODER_ONLY:
            continue  # decoder-serving profiles are fitted by llm_serving.py
        mine = [r for r in items if r.runtime is runtime]
        if mine:
            profiles[runtime] = fit(runtime, mine, devices)
    return profiles


def evaluate(
    items: list[Row],
    devices: Mapping[str, HardwareSpec],
    profiles: Mapping[ServingRuntime, RuntimeProfile],
) -> list[Result]:
    """Each row in sample and leaving its device out of its runtime's fit."""
    refits: dict[tuple[ServingRuntime, str], RuntimeProfile | None] = {}
    results = []
    for row in items:
        in_sample = predicted(row, profiles[row.runtime], devices)
        device_out = None
        if row.runtime is DEFAULT_RUNTIME:
            device_out = in_sample  # unfitted here: out of sample already
        else:
            key = (row.runtime, row.slug)
            if key not in refits:
                others = [r for r in items if r.runtime is row.runtime and r.slug != row.slug]
                refits[key] = fit(row.runtime, others, devices) if others else None
            refit = refits[key]
            device_out = None if refit is None else predicted(row, refit, devices)
        results.append(Result(row, in_sample, device_out))
    return results


def shipped_matches(profiles: Mapping[ServingRuntime, RuntimeProfile]) -> list[str]:
    """Differences between the shipped profiles and the derivation (empty: they agree)."""
    problems = []
    for runtime, derived in profiles.items():
        shipped = RUNTIME_PROFILES[runtime]
        for name in ("fuse_elementwise", "compute_efficiency_scale", "host_dispatch_s"):
            a, b = getattr(derived, name), getattr(shipped, name)
            if a != b and not (
                isinstance(a, float) and isinstance(b, float) and math.isclose(a, b)
            ):
                problems.append(f"{runtime.value} {name}: derived {a!r}, shipped {b!r}")
    missing = set(RUNTIME_PROFILES) - set(profiles) - DECODER_ONLY
    problems += [f"{r.value}: no rows to fit" for r in sorted(missing)]
    return problems


def _count_within(ratios: Iterable[float | None], limit: float) -> tuple[int, int]:
    """Ratios within ``limit`` either way, and ratios known."""
    known = [x for x in ratios if x is not None]
    return sum(1 for x in known if max(x, 1 / x) <= limit), len(known)


def _share(results: list[Result], which: str, limit: float) -> tuple[int, int]:
    return _count_within((r.ratio(which) for r in results), limit)


def render(
    results: list[Result],
    skipped: list[Skipped],
    profiles: Mapping[ServingRuntime, RuntimeProfile],
) -> tuple[str, bool]:
    """The report, and whether the shipped profiles are the derivation."""
    lines = [
        "# Serving-runtime profiles: fit and error",
        "",
        "Generated by `benchmarks/calibration/runtimes.py` from `framework_measurements.yaml`. "
        "Ratios are predicted / measured;",
        "*left out*: the runtime refitted without the row's device (TensorRT is not fitted here: "
        "its rows test the MLPerf calibration).",
        "",
        "| runtime | fuses | compute eff. scale | host dispatch [us] | rows | "
        "in sample 1.5x / 2x | left out 1.5x / 2x | median left out |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for runtime, profile in profiles.items():
        mine = [r for r in results if r.row.runtime is runtime]
        if not mine:
            continue
        host_text = f"{profile.host_dispatch_s * 1e6:g}"
        in_15, n_in = _share(mine, "in_sample", WITHIN)
        in_2, _ = _share(mine, "in_sample", WITHIN_WORST)
        out_15, n_out = _share(mine, "device_out", WITHIN)
        out_2, _ = _share(mine, "device_out", WITHIN_WORST)
        ratios = [x for r in mine if (x := r.ratio()) is not None]
        median = f"{statistics.median(ratios):.2f}" if ratios else "n/a"
        lines.append(
            f"| {runtime.value} | {'yes' if profile.fuse_elementwise else 'no'} | "
            f"{profile.compute_efficiency_scale:g} | {host_text} | {len(mine)} | "
            f"{in_15}/{n_in} / {in_2}/{n_in} | {out_15}/{n_out} / {out_2}/{n_out} | {median} |"
        )
    problems = shipped_matches(profiles)
    lines += [
        "",
        "Shipped profiles match the derivation: "
        + ("yes." if not problems else "NO - " + "; ".join(problems) + "."),
        "",
        "| row | runtime | device | model | precision | batch | seq | metric | measured | "
        "in sample | ratio | left out | ratio | notes |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        row = r.row
        unit = "/s" if row.metric == "throughput" else " ms"
        out = "n/a" if r.device_out is None else f"{r.device_out:.4g}"
        out_ratio = "n/a" if r.ratio() is None else f"{r.ratio():.2f}"
        lines.append(
            f"| {row.id} | {row.runtime.value} | {row.slug} | {row.model} | "
            f"{row.precision.value} | {row.batch} | {row.seq or ''} | {row.metric} | "
            f"{row.measured:.4g}{unit} | {r.in_sample:.4g} | {r.ratio('in_sample'):.2f} | "
            f"{out} | {out_ratio} | {row.note} |"
        )
    lines += ["", "Not used:", ""]
    lines += [f"* {s.id} ({s.runtime}): {s.reason}" for s in skipped]
    return "\n".join(lines) + "\n", not problems


# --------------------------------------------------------------------------------------------
# CPUs: the pytorch_eager profile's CPU scale, fitted on optimized / stock PyTorch ratios
# --------------------------------------------------------------------------------------------

CPU_RUNTIME = ServingRuntime.PYTORCH_EAGER
REALTIME_CORES = 4  # the sources' realtime rows: batch 1, 4 cores per instance


def cpu_rows(
    raw: Iterable[Mapping[str, Any]], devices: Mapping[str, HardwareSpec]
) -> tuple[list[CpuRow], list[Skipped]]:
    """The speed-up rows the file's ``cpu_eager_rule`` admits, and the rest with the reason."""
    used: list[CpuRow] = []
    skipped: list[Skipped] = []
    for row in raw:
        if row.get("category") != "cpu" or row.get("metric") != "speedup_ratio":
            continue
        rid, runtime_text = str(row["id"]), str(row["runtime"])
        slug = str(row["device"]).split(" ")[0]
        model, model_note = _model(str(row["model"]))
        precision, _ = _precision(str(row.get("precision", "")))
        device = devices.get(slug)
        scenario = str(row.get("scenario", ""))
        if device is None or device.kind is not DeviceKind.CPU:
            skipped.append(Skipped(rid, runtime_text, f"device {slug!r} is not a catalog CPU"))
        elif model is None:
            skipped.append(Skipped(rid, runtime_text, f"model {row['model']!r} not mapped"))
        elif precision is None:
            skipped.append(Skipped(rid, runtime_text, f"precision {row['precision']!r}"))
        elif (unsupported := unsupported_reason(device, PRECISION_SCHEMES[precision])) is not None:
            skipped.append(Skipped(rid, runtime_text, f"cpu_eager_rule (3): {unsupported}"))
        else:
            realtime = scenario.startswith("realtime")
            seq = row.get("seq_len")
            used.append(
                CpuRow(
                    id=rid,
                    slug=slug,
                    model=model,
                    precision=precision,
                    batch=int(row["batch"]),
                    seq=int(seq) if seq is not None else None,
                    cores=REALTIME_CORES if realtime else None,
                    measured=float(row["value"]),
                    note="; ".join(
                        n
                        for n in (
                            model_note,
                            f"{REALTIME_CORES} cores per instance" if realtime else "one socket",
                        )
                        if n
                    ),
                )
            )
    return used, skipped


def cpu_slice(device: HardwareSpec, cores: int | None) -> HardwareSpec:
    """``device`` as one instance of ``cores`` of its cores, with their share of its memory
    bandwidth (None: the whole socket)."""
    if cores is None or device.cpu_cores is None:
        return device
    share = cores / device.cpu_cores
    return replace(device, cpu_cores=cores, compute_fraction=share, bandwidth_fraction=share)


_OPTIMIZED: dict[str, float] = {}  # row id -> optimized throughput (no scale in it)


def cpu_ratio(row: CpuRow, scale: float, devices: Mapping[str, HardwareSpec]) -> float:
    """Predicted optimized / stock throughput: the shipped calibration with element-wise
    layers fused against the pytorch_eager profile with CPU scale ``scale``."""
    device = cpu_slice(devices[row.slug], row.cores)
    eager = replace(RUNTIME_PROFILES[CPU_RUNTIME], cpu_compute_efficiency_scale=scale)
    stock = workload(row, eager.fuse_elementwise)
    base = DEFAULT_CALIBRATIONS[calibration_class(device, stock.scheme)]
    fast = _OPTIMIZED.get(row.id)
    if fast is None:
        fast = _OPTIMIZED[row.id] = predict(workload(row, True), device, base).throughput_per_s
    slow = predict(stock, device, eager.apply(base, device.kind)).throughput_per_s
    return fast / slow


def cpu_fit(items: list[CpuRow], devices: Mapping[str, HardwareSpec]) -> float:
    """The CPU scale (grid of 0.05) whose predicted ratios fit ``items`` best."""
    return calibrate.grid_best(
        SCALE_GRID,
        lambda scale: sum(math.log(cpu_ratio(r, scale, devices) / r.measured) ** 2 for r in items),
    )


@dataclass(frozen=True, slots=True)
class CpuResult:
    """One ratio row: measured, unscaled (CPUs keeping their calibration), in sample, and
    with its model's or its device's rows left out of the fit."""

    row: CpuRow
    unscaled: float
    in_sample: float
    model_out: float | None  # None: no other model's rows to fit on
    device_out: float | None  # None: no other device's rows to fit on


def cpu_evaluate(
    items: list[CpuRow], devices: Mapping[str, HardwareSpec], scale: float
) -> list[CpuResult]:
    """Each ratio row at scale 1, at ``scale``, and with its model's (its device's) rows left
    out of the fit."""
    refits: dict[tuple[str, str], float | None] = {}

    def refit(field: str, value: str) -> float | None:
        if (field, value) not in refits:
            others = [r for r in items if getattr(r, field) != value]
            refits[field, value] = cpu_fit(others, devices) if others else None
        return refits[field, value]

    results = []
    for row in items:
        by_model, by_device = refit("model", row.model), refit("slug", row.slug)
        results.append(
            CpuResult(
                row,
                unscaled=cpu_ratio(row, 1.0, devices),
                in_sample=cpu_ratio(row, scale, devices),
                model_out=None if by_model is None else cpu_ratio(row, by_model, devices),
                device_out=None if by_device is None else cpu_ratio(row, by_device, devices),
            )
        )
    return results


def cpu_shipped_matches(scale: float | None) -> list[str]:
    """The difference between the shipped CPU scale and the fit (empty: they agree)."""
    shipped = RUNTIME_PROFILES[CPU_RUNTIME].cpu_compute_efficiency_scale
    if scale is None or shipped is None or not math.isclose(scale, shipped):
        return [
            f"{CPU_RUNTIME.value} cpu_compute_efficiency_scale: derived {scale!r}, "
            f"shipped {shipped!r}"
        ]
    return []


def _within(ratios: Iterable[float | None], limit: float) -> str:
    hits, known = _count_within(ratios, limit)
    return f"{hits}/{known}"


def render_cpu(
    results: list[CpuResult], skipped: list[Skipped], scale: float | None
) -> tuple[str, bool]:
    """The CPU section of the report, and whether the shipped scale is the fit."""
    problems = cpu_shipped_matches(scale)
    columns = (
        ("unscaled (CPUs keep their calibration)", [r.unscaled / r.row.measured for r in results]),
        ("in sample", [r.in_sample / r.row.measured for r in results]),
        (
            "its model left out",
            [None if r.model_out is None else r.model_out / r.row.measured for r in results],
        ),
        (
            "its device left out",
            [None if r.device_out is None else r.device_out / r.row.measured for r in results],
        ),
    )
    lines = [
        "",
        "## CPUs: pytorch_eager against Intel's optimized PyTorch",
        "",
        "The file's `cpu_eager_rule`: published ratios of IPEX-optimized to stock PyTorch "
        "throughput on the same CPU, model, batch and precision; the optimized side at the "
        "shipped CPU calibration, element-wise layers fused; stock PyTorch under the "
        "pytorch_eager profile (one kernel per layer) with its CPU compute-efficiency scale; "
        f"realtime rows on {REALTIME_CORES} of the socket's cores with the same share of its "
        "bandwidth. Ratios below are predicted / measured speed-up.",
        "",
        f"Fitted CPU scale: **{scale:g}** (grid of 0.05, least squares on log ratio, "
        f"{len(results)} rows). Shipped profile matches the derivation: "
        + ("yes." if not problems else "NO - " + "; ".join(problems) + "."),
        "",
        "| prediction | rows | within 1.5x | within 2x | median |",
        "|---|---|---|---|---|",
    ]
    for label, ratios in columns:
        known = [x for x in ratios if x is not None]
        median = f"{statistics.median(known):.2f}" if known else "n/a"
        lines.append(
            f"| {label} | {len(known)} | {_within(ratios, WITHIN)} | "
            f"{_within(ratios, WITHIN_WORST)} | {median} |"
        )
    lines += [
        "",
        "| row | device | model | precision | batch | seq | cores | measured speed-up | "
        "unscaled | in sample | model left out | device left out | notes |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        row = r.row
        model_out = "n/a" if r.model_out is None else f"{r.model_out:.2f}"
        device_out = "n/a" if r.device_out is None else f"{r.device_out:.2f}"
        lines.append(
            f"| {row.id} | {row.slug} | {row.model} | {row.precision.value} | {row.batch} | "
            f"{row.seq or ''} | {row.cores or 'socket'} | {row.measured:.2f} | "
            f"{r.unscaled:.2f} | {r.in_sample:.2f} | {model_out} | {device_out} | {row.note} |"
        )
    lines += ["", "Not used:" + ("" if skipped else " none."), ""]
    lines += [f"* {s.id} ({s.runtime}): {s.reason}" for s in skipped]
    return "\n".join(lines) + "\n", not problems


def main(argv: list[str] | None = None) -> int:
    """Print the fit and every row; exit 1 when the shipped profiles differ from the fit."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--write-results", action="store_true", help=f"write {RESULTS.name}")
    args = parser.parse_args(argv)
    devices = calibrate.catalog_devices()
    raw = load()
    items, skipped = rows(raw, devices)
    profiles = derive(items, devices)
    report, ok = render(evaluate(items, devices, profiles), skipped, profiles)
    cpu_items, cpu_skipped = cpu_rows(raw, devices)
    scale = cpu_fit(cpu_items, devices)
    cpu_report, cpu_ok = render_cpu(cpu_evaluate(cpu_items, devices, scale), cpu_skipped, scale)
    report += cpu_report
    ok = ok and cpu_ok
    print(report)
    if args.write_results:
        RESULTS.write_text(report, encoding="utf-8")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
