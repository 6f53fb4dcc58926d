"""Compare the service's memory estimates with what PyTorch really allocated.

Reads ``measurements.json`` (written by ``measure.py`` in this folder's own venv with torch)
and, for every record, estimates the same configuration with the service's pure domain code
(no torch needed: run it with the service's venv), then prints a table and writes
``results.md``.

    .venv/bin/python benchmarks/fidelity/compare.py

Training is compared with the estimate's first-iteration peak (the measurement times the first
step, when the optimizer state is created); inference with the forward peak. Both are for the
``pytorch_cpu`` runtime, where there is no CUDA context or caching allocator.

Targets (issue 3): parameter counts exact; training within +-5 % median and +-15 % every case;
inference within +-10 % median. Issue 12: every case together within 1 % median and 7 % worst
(where the figures were when the attention implementation became a request option).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from app.domain.memory.estimate import MemoryRequest, analyze_for, estimate_memory
from app.domain.precision import Precision
from app.domain.workload import Attention, Mode, Optimizer, OptimizerImpl, Runtime
from app.domain.zoo import ZOO, ZooModel, bert, gpt2, llama, lstm_classifier, vit

HERE = Path(__file__).resolve().parent
TARGETS = {
    "training_median": 5.0,
    "training_max": 15.0,
    "inference_median": 10.0,
    # issue 12: the figures stay where they were when attention became a request option
    "all_median": 1.0,
    "all_max": 7.0,
}
HEAVY_SHARE = 0.25


@dataclass(frozen=True, slots=True)
class Row:
    """One measured configuration with its estimate."""

    key: str
    mode: str
    measured_bytes: int
    estimated_bytes: int
    params_measured: int
    params_estimated: int
    measured_phase: str
    estimated_phase: str
    dynamic_share: float  # measured peak share not explained by weights, grads, state, inputs

    @property
    def error_pct(self) -> float:
        """Signed error of the estimate [%]."""
        return 100.0 * (self.estimated_bytes - self.measured_bytes) / self.measured_bytes


def _model_for(record: dict[str, Any]) -> ZooModel:
    name = record["model"]
    cnn = {
        "alexnet": "alexnet",
        "vgg16": "vgg-16",
        "googlenet": "googlenet",
        "resnet50": "resnet-50",
        "mobilenet_v2": "mobilenet-v2",
    }
    if name in cnn:
        return ZOO[cnn[name]]
    if name.startswith("vit"):
        return vit()
    if name.startswith("bert"):
        return bert()
    if name.startswith("gpt2"):
        return gpt2()
    if name.endswith("_classifier"):  # lstm / gru / rnn
        return lstm_classifier(cell=name.removesuffix("_classifier"))
    if name.startswith("llama"):
        layers = record.get("layers") or 32
        return llama(
            layers=layers,
            hidden=4096,
            heads=32,
            kv_heads=32,
            intermediate=11008,
            vocab=32000,
        )
    raise KeyError(f"no zoo model for '{name}'")


def _request(record: dict[str, Any]) -> MemoryRequest:
    mode = Mode(record["mode"])
    precision = Precision.BF16 if record["dtype"] == "bf16" else Precision.FP32
    optimizer_name = record.get("optimizer") or "sgd"
    impl = OptimizerImpl.FOR_LOOP
    if optimizer_name.endswith("_foreach"):
        impl, optimizer_name = OptimizerImpl.FOREACH, optimizer_name.removesuffix("_foreach")
    elif optimizer_name.endswith("_fused"):
        impl, optimizer_name = OptimizerImpl.FUSED, optimizer_name.removesuffix("_fused")
    # Measured with Hugging Face attn_implementation "sdpa" (PyTorch's CPU dispatcher: the fused
    # flash kernel; the math kernel in training with attention dropout, which the analysis
    # applies on CPU) or "eager". Explicit, so the figures do not follow the default table.
    sdpa = record.get("attn_implementation") == "sdpa"
    return MemoryRequest(
        mode=mode,
        precision=precision,
        optimizer=Optimizer(optimizer_name),
        optimizer_impl=impl,
        runtime=Runtime.CPU,
        kv_cache=bool(record.get("use_cache")),
        attention=Attention.FLASH if sdpa else Attention.EAGER,
    )


def estimate_row(record: dict[str, Any]) -> Row:
    """Estimate one measured configuration."""
    model = _model_for(record)
    request = _request(record)
    bindings = {**model.default_bindings, "batch": record["batch"]}
    if record.get("seq_len"):
        bindings["seq"] = record["seq_len"]
    if record.get("image_size"):
        bindings["image"] = record["image_size"]
    training = request.mode is Mode.TRAINING
    analysis = analyze_for(model.inputs, model.layers, bindings, request)
    estimate = estimate_memory(analysis, request)
    if training and estimate.first_iteration_peak_bytes is not None:
        estimated, phase = estimate.first_iteration_peak_bytes, estimate.first_iteration_peak_phase
    else:
        estimated, phase = estimate.peak_bytes, estimate.peak_phase
    return Row(
        key=record["key"],
        mode=request.mode.value,
        measured_bytes=record["peak_bytes"],
        estimated_bytes=estimated,
        params_measured=record["params"],
        params_estimated=analysis.params,
        measured_phase=record.get("peak_phase") or "?",
        estimated_phase=phase or "?",
        dynamic_share=_dynamic_share(record),
    )


def _dynamic_share(record: dict[str, Any]) -> float:
    """Share of the measured peak beyond parameters, inputs, gradients and optimizer state."""
    static = record["baseline_bytes"]
    if record["mode"] == "training":
        static += record.get("grad_bytes", 0) + record.get("optimizer_state_bytes", 0)
    peak = record["peak_bytes"]
    return max(0.0, (peak - static) / peak)


def _mib(value: int) -> str:
    return f"{value / 2**20:,.1f}"


def render(rows: list[Row]) -> tuple[str, bool]:
    """A markdown report and whether every target holds."""
    lines = [
        "| configuration | measured MiB | estimated MiB | error % | phase (measured / est.) "
        "| activation share | params |",
        "|---|---:|---:|---:|---|---:|---|",
    ]
    for row in rows:
        params = (
            "exact"
            if row.params_measured == row.params_estimated
            else (f"{row.params_estimated:,} vs {row.params_measured:,}")
        )
        lines.append(
            f"| {row.key} | {_mib(row.measured_bytes)} | {_mib(row.estimated_bytes)} "
            f"| {row.error_pct:+.1f} | {row.measured_phase} / {row.estimated_phase} "
            f"| {row.dynamic_share:.0%} | {params} |"
        )
    summary, ok = [], True
    for mode in ("training", "inference"):
        errors = [abs(r.error_pct) for r in rows if r.mode == mode]
        if not errors:
            continue
        median, worst = statistics.median(errors), max(errors)
        target_median = TARGETS[f"{mode}_median"]
        median_ok = median <= target_median
        worst_ok = mode != "training" or worst <= TARGETS["training_max"]
        ok = ok and median_ok and worst_ok
        summary.append(
            f"- {mode}: {len(errors)} cases, median |error| {median:.1f} % "
            f"(target {target_median:g} %: {'met' if median_ok else 'NOT met'}), worst "
            f"{worst:.1f} %"
            + (
                f" (target {TARGETS['training_max']:g} %: {'met' if worst_ok else 'NOT met'})"
                if mode == "training"
                else ""
            )
        )
    errors = [abs(r.error_pct) for r in rows]
    if errors:
        median, worst = statistics.median(errors), max(errors)
        all_ok = median <= TARGETS["all_median"] and worst <= TARGETS["all_max"]
        ok = ok and all_ok
        summary.append(
            f"- all: {len(errors)} cases, median |error| {median:.1f} %, worst {worst:.1f} % "
            f"(target {TARGETS['all_median']:g} % / {TARGETS['all_max']:g} %: "
            f"{'met' if all_ok else 'NOT met'})"
        )
    heavy = [abs(r.error_pct) for r in rows if r.dynamic_share >= HEAVY_SHARE]
    if heavy:
        summary.append(
            f"- activation-heavy cases (activations etc. >= {HEAVY_SHARE:.0%} of the measured "
            f"peak): {len(heavy)}, median |error| {statistics.median(heavy):.1f} %, worst "
            f"{max(heavy):.1f} %"
        )
    exact = all(r.params_measured == r.params_estimated for r in rows)
    ok = ok and exact
    summary.append(f"- parameter counts: {'all exact' if exact else 'MISMATCH'}")
    return "\n".join([*summary, "", *lines]), ok


def main() -> int:
    """Compare, print and write the report; exit 1 when a target is missed."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--measurements", type=Path, default=HERE / "measurements.json")
    parser.add_argument("--out", type=Path, default=HERE / "results.md")
    args = parser.parse_args()
    records = json.loads(args.measurements.read_text())
    measured = [record for record in records if "skipped" not in record]
    rows = [estimate_row(record) for record in measured]
    report, ok = render(rows)
    skipped = [f"- skipped {r['key']}: {r['skipped']}" for r in records if "skipped" in r]
    if skipped:
        report += "\n\nNot measured:\n" + "\n".join(skipped)
    meta = measured[0] if measured else {}
    header = (
        "# Fidelity: estimated vs measured peak memory (PyTorch CPU)\n\n"
        f"Measured with torch {meta.get('torch_version', '?')}, transformers "
        f"{meta.get('transformers_version', '?')} by `measure.py`; estimated by the service's "
        "domain code for runtime `pytorch_cpu` (`compare.py`). Training compares the first "
        "iteration's peak.\n\n"
    )
    args.out.write_text(header + report + "\n")
    print(report)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
