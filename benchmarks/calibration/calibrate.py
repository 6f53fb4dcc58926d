"""Derive the roofline calibration from measured figures and check the model against them.

    .venv/bin/python benchmarks/calibration/calibrate.py [--reference PATH] [--write-results]

Reads ``calibration_benchmarks.yaml`` (a committed copy of
``../shared/reference/calibration_benchmarks.yaml``; ``--reference`` reads another copy) and:

1. derives the per-kind defaults of :data:`app.domain.roofline.DEFAULT_CALIBRATIONS`:
   * compute efficiency per device kind (gpu, cpu, edge): for every MLPerf ResNet-50 Offline
     INT8 row, the efficiency at which the model predicts the measured throughput (per
     accelerator, per CPU socket) of ResNet-50 v1.5 at batch 256 with the shipped overheads;
     the default is the geometric mean over the kind's rows (it balances over- and
     under-prediction in ratio terms);
   * host-link efficiency: the median of measured pinned host-to-device copy bandwidth over
     the theoretical per-direction bandwidth of the device's link;
   * per-kernel launch overhead: the median of the per-kernel launch figures; per-request
     overhead: the median of the end-to-end call figures;
2. prints predicted vs measured for every row (throughput, copy bandwidth, launch time), with
   the shipped defaults, and whether the targets hold: predicted throughput within 1.5x of
   measured for at least 80 % of the throughput rows and within 2x for every one.

Exit status 1 when a target fails or the shipped defaults differ from the derivation.
``tests/contract/test_calibration.py`` runs the same functions in CI.
"""

from __future__ import annotations

import argparse
import math
import re
import statistics
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import yaml

from app.config import PROJECT_ROOT
from app.db.models import Hardware
from app.domain.graph.analysis import analyze
from app.domain.hardware import DeviceKind, HardwareSpec, pcie_bandwidth_bytes_per_s
from app.domain.performance.roofline import (
    DEFAULT_CALIBRATIONS,
    PRECISION_SCHEMES,
    Calibration,
    PhasedRequest,
    forward_request,
    predict,
)
from app.domain.precision import Precision
from app.domain.zoo import ZOO
from app.services.catalog import load_catalog
from app.services.convert import apply_hardware_fields, hardware_spec

HERE = Path(__file__).resolve().parent
DATA = HERE / "calibration_benchmarks.yaml"
RESULTS = HERE / "results.md"
BATCH = 256  # MLPerf Offline: the submitter picks a large batch; see README
TARGET_WITHIN = 1.5
TARGET_SHARE = 0.8
TARGET_WORST = 2.0

# Reference ids -> catalog slugs (the reference names devices its own way).
CATALOG_SLUGS = {
    "nvidia_t4": "nvidia-t4",
    "nvidia_a10": "nvidia-a10",
    "nvidia_a30": "nvidia-a30",
    "nvidia_a100_40gb_sxm": "nvidia-a100-40gb-sxm",
    "nvidia_a100_80gb_pcie": "nvidia-a100-80gb-pcie",
    "nvidia_a100_80gb_sxm": "nvidia-a100-80gb-sxm",
    "nvidia_h100_sxm": "nvidia-h100-sxm",
    "nvidia_h100_sxm (cluster, 8 GPUs)": "nvidia-h100-sxm",
    "nvidia_h100_pcie": "nvidia-h100-pcie",
    "nvidia_h200_sxm": "nvidia-h200-sxm",
    "nvidia_l4": "nvidia-l4",
    "nvidia_l40s": "nvidia-l40s",
    "nvidia_jetson_agx_orin": "nvidia-jetson-agx-orin-64gb",
    "nvidia_jetson_orin_nx": "nvidia-jetson-orin-nx-16gb",
    "nvidia_titan_x_maxwell": "nvidia-titan-x-maxwell",
    "intel_xeon_platinum_8380": "intel-xeon-platinum-8380",
    "intel_xeon_platinum_8480plus": "intel-xeon-platinum-8480plus",
    "intel_xeon_platinum_8592plus_emr": "intel-xeon-platinum-8592plus",
    "intel_xeon_6980p_gnr": "intel-xeon-6980p",
}


@dataclass(frozen=True, slots=True)
class RowResult:
    """One row of the reference: what was measured and what the model predicts."""

    index: int
    device: str
    metric: str
    unit: str
    measured: float | None
    predicted: float | None
    note: str

    @property
    def ratio(self) -> float | None:
        """predicted / measured."""
        if self.measured is None or self.predicted is None or self.measured == 0:
            return None
        return self.predicted / self.measured

    @property
    def factor(self) -> float | None:
        """max(ratio, 1 / ratio): how far off, either way."""
        ratio = self.ratio
        return None if ratio is None else max(ratio, 1 / ratio)


@dataclass(frozen=True, slots=True)
class Derivation:
    """What the reference rows give for each default."""

    calibrations: Mapping[DeviceKind, Calibration]  # gpu, cpu, edge as derived
    implied: Mapping[int, float]  # row index -> compute efficiency that reproduces it
    link_ratios: Mapping[int, float]  # row index -> measured copy / theoretical link
    raw_launch_s: float  # median raw cuLaunchKernel figure


def load_rows(path: Path = DATA) -> list[dict[str, Any]]:
    """The ``results`` rows of a calibration file."""
    document = yaml.safe_load(path.read_text(encoding="utf-8"))
    rows: list[dict[str, Any]] = document["results"]
    return rows


def catalog_devices() -> dict[str, HardwareSpec]:
    """Every shipped catalog device as the recommendation service sees it (no database)."""
    devices = {}
    for entry in load_catalog(PROJECT_ROOT / "hardware_catalog"):
        row = Hardware(slug=entry.slug)
        apply_hardware_fields(row, entry)
        devices[entry.slug] = hardware_spec(row)
    return devices


def resnet50_int8(batch: int = BATCH) -> PhasedRequest:
    """MLPerf's model: ResNet-50 v1.5 at 224 x 224, INT8, one forward per batch."""
    model = ZOO["resnet-50"]
    analysis = analyze(model.inputs, model.layers, {"batch": batch, "image": 224}, training=False)
    return forward_request(analysis, PRECISION_SCHEMES[Precision.INT8], batch=batch)


def measured_throughput(row: Mapping[str, Any]) -> float:
    """Samples/s per accelerator (per socket for CPU systems)."""
    for key in ("value_per_accelerator", "value_per_socket"):
        if key in row:
            return float(row[key])
    return float(row["value"])


def _numbers(text: str) -> list[float]:
    return [float(n) for n in re.findall(r"\d+(?:\.\d+)?", text)]


def launch_figures(row: Mapping[str, Any]) -> tuple[float | None, list[float]]:
    """(per-kernel launch figure, end-to-end call figures) of a launch row [us].

    ``value`` is a number, ``~x``, a range ``a-b`` (its midpoint) or ``~x raw vs ~y e2e``
    (x per kernel, y end to end); end-to-end figures in the note (``e2e 44.3/42.4 us``) count
    too.
    """
    value = str(row["value"])
    end_to_end = [float(n) for n in re.findall(r"~?(\d+(?:\.\d+)?) e2e", value)]
    end_to_end += _numbers(m) if (m := _note_e2e(row.get("note", ""))) else []
    head = value.split(" vs ")[0]
    numbers = _numbers(head)
    per_kernel = statistics.mean(numbers) if numbers else None
    return per_kernel, end_to_end


def _note_e2e(note: str) -> str | None:
    found = re.search(r"e2e ([\d./]+) us", note)
    return found.group(1) if found else None


def link_bandwidth(
    row: Mapping[str, Any], devices: Mapping[str, HardwareSpec]
) -> tuple[float, str]:
    """Theoretical per-direction link of a copy row: the catalog's, else from the scenario."""
    slug = CATALOG_SLUGS.get(row["device"])
    if slug is not None:
        link = devices[slug].host_link_bytes_per_s
        if link is not None:
            return link, f"catalog {slug}"
    found = re.search(r"PCIe (?:Gen)?(\d)(?:\.0)?(?: x(\d+))?", row["scenario"])
    if found is None:
        raise ValueError(f"no PCIe generation in {row['scenario']!r}")
    gen, lanes = int(found.group(1)), int(found.group(2) or 16)
    bandwidth = pcie_bandwidth_bytes_per_s(gen, lanes)
    assert bandwidth is not None
    return bandwidth, f"not in catalog: PCIe Gen{gen} x{lanes} from the scenario"


def throughput(request: PhasedRequest, device: HardwareSpec, calibration: Calibration) -> float:
    """Modelled samples/s."""
    return predict(request, device, calibration).throughput_per_s


def implied_efficiency(
    request: PhasedRequest, device: HardwareSpec, calibration: Calibration, measured: float
) -> float:
    """The compute efficiency at which the model reproduces ``measured`` (1 if it cannot)."""
    low, high = 1e-4, 1.0
    if throughput(request, device, replace(calibration, compute_efficiency=high)) <= measured:
        return high
    for _ in range(60):
        middle = math.sqrt(low * high)
        if throughput(request, device, replace(calibration, compute_efficiency=middle)) < measured:
            low = middle
        else:
            high = middle
    return math.sqrt(low * high)


EFFICIENCY_GRID = [step / 100 for step in range(5, 101)]
SHARE_GRID = [step / 100 for step in range(0, 91, 5)]


def _squared_log_error(
    request: PhasedRequest, items: list[tuple[HardwareSpec, float]], calibration: Calibration
) -> float:
    return sum(
        math.log(throughput(request, device, calibration) / measured) ** 2
        for device, measured in items
    )


def fit(
    request: PhasedRequest,
    items: list[tuple[HardwareSpec, float]],
    base: Calibration,
    shares: Iterable[float],
) -> tuple[float, float]:
    """(compute efficiency, activation cache share) on the grids that minimise the sum of
    squared log(predicted / measured) over ``items`` (ties: the first on the grid)."""
    best: tuple[float, float, float] | None = None
    for share in shares:
        for efficiency in EFFICIENCY_GRID:
            trial = replace(base, compute_efficiency=efficiency, activation_cache_share=share)
            error = _squared_log_error(request, items, trial)
            if best is None or error < best[0] - 1e-12:
                best = (error, efficiency, share)
    assert best is not None
    return best[1], best[2]


def derive(rows: list[dict[str, Any]], devices: Mapping[str, HardwareSpec]) -> Derivation:
    """Every default the reference determines.

    Memory efficiency (0.8 GPU and SoC, 0.7 CPU) and the CPU's per-primitive dispatch are not
    in the reference: those stay the shipped assumptions. GPUs and CPUs fit compute efficiency
    and activation cache share together; the Jetson SoCs (two rows, Ampere GPUs) take the
    GPUs' share and fit their compute efficiency.
    """
    launch: list[float] = []
    end_to_end: list[float] = []
    raw: list[float] = []
    for row in rows:
        if row["metric"] == "launch_overhead":
            per_kernel, calls = launch_figures(row)
            if per_kernel is not None:
                launch.append(per_kernel)
                if "raw" in row["scenario"]:
                    raw.append(per_kernel)
            end_to_end += calls
    launch_s = statistics.median(launch) * 1e-6
    request_s = round(statistics.median(end_to_end), 1) * 1e-6
    link_ratios = {}
    for index, row in enumerate(rows):
        if row["metric"] == "h2d_bandwidth":
            link, _ = link_bandwidth(row, devices)
            link_ratios[index] = float(row["value"]) * 1e9 / link
    link_efficiency = round(statistics.median(link_ratios.values()), 2)
    request = resnet50_int8()
    items: dict[DeviceKind, list[tuple[HardwareSpec, float]]] = {}
    for row in rows:
        if row["metric"] == "throughput":
            device = devices[CATALOG_SLUGS[row["device"]]]
            items.setdefault(device.kind, []).append((device, measured_throughput(row)))

    def base(kind: DeviceKind) -> Calibration:
        shipped = DEFAULT_CALIBRATIONS[kind]
        if kind is DeviceKind.CPU:
            return replace(shipped, request_overhead_s=request_s)
        return replace(
            shipped,
            host_link_efficiency=link_efficiency if kind is DeviceKind.GPU else 1.0,
            kernel_launch_overhead_s=launch_s,
            request_overhead_s=request_s,
        )

    fitted: dict[DeviceKind, Calibration] = {}
    for kind in (DeviceKind.GPU, DeviceKind.CPU):
        efficiency, share = fit(request, items[kind], base(kind), SHARE_GRID)
        fitted[kind] = replace(
            base(kind), compute_efficiency=efficiency, activation_cache_share=share
        )
    gpu_share = fitted[DeviceKind.GPU].activation_cache_share
    efficiency, _ = fit(request, items[DeviceKind.EDGE], base(DeviceKind.EDGE), [gpu_share])
    fitted[DeviceKind.EDGE] = replace(
        base(DeviceKind.EDGE), compute_efficiency=efficiency, activation_cache_share=gpu_share
    )
    implied: dict[int, float] = {}
    for index, row in enumerate(rows):
        if row["metric"] == "throughput":
            device = devices[CATALOG_SLUGS[row["device"]]]
            implied[index] = implied_efficiency(
                request, device, fitted[device.kind], measured_throughput(row)
            )
    return Derivation(
        calibrations=fitted,
        implied=implied,
        link_ratios=link_ratios,
        raw_launch_s=statistics.median(raw) * 1e-6,
    )


def evaluate(
    rows: list[dict[str, Any]],
    devices: Mapping[str, HardwareSpec],
    calibrations: Mapping[DeviceKind, Calibration] = DEFAULT_CALIBRATIONS,
) -> list[RowResult]:
    """Predicted vs measured for every row, with the given (default: shipped) calibration."""
    request = resnet50_int8()
    gpu = calibrations[DeviceKind.GPU]
    results = []
    for index, row in enumerate(rows):
        metric, name = row["metric"], row["device"]
        if metric == "throughput":
            slug = CATALOG_SLUGS[name]
            device = devices[slug]
            per = "per socket" if device.kind is DeviceKind.CPU else "per accelerator"
            results.append(
                RowResult(
                    index=index,
                    device=slug,
                    metric="ResNet-50 Offline INT8",
                    unit=f"samples/s {per}",
                    measured=measured_throughput(row),
                    predicted=throughput(request, device, calibrations[device.kind]),
                    note=f"{row['benchmark']}, {row['system']}",
                )
            )
        elif metric == "h2d_bandwidth":
            link, origin = link_bandwidth(row, devices)
            results.append(
                RowResult(
                    index=index,
                    device=CATALOG_SLUGS.get(name, name),
                    metric="host-to-device copy",
                    unit="GB/s",
                    measured=float(row["value"]),
                    predicted=link * gpu.host_link_efficiency / 1e9,
                    note=f"link {link / 1e9:.2f} GB/s ({origin}) x {gpu.host_link_efficiency}",
                )
            )
        elif metric == "launch_overhead":
            per_kernel, calls = launch_figures(row)
            results.append(
                RowResult(
                    index=index,
                    device=name,
                    metric="kernel launch",
                    unit="us",
                    measured=per_kernel,
                    predicted=gpu.kernel_launch_overhead_s * 1e6,
                    note=f"{row['scenario']}; value {row['value']!r}"
                    + (
                        f"; end-to-end call {calls} us vs request overhead "
                        f"{gpu.request_overhead_s * 1e6:.1f} us"
                        if calls
                        else ""
                    ),
                )
            )
        else:
            raw = statistics.median(
                figure
                for r in rows
                if r["metric"] == "launch_overhead" and "raw" in r["scenario"]
                for figure in [launch_figures(r)[0]]
                if figure is not None
            )
            results.append(
                RowResult(
                    index=index,
                    device=name,
                    metric="launch path above cuLaunchKernel",
                    unit="us",
                    measured=float(row["value"]),
                    predicted=gpu.kernel_launch_overhead_s * 1e6 - raw,
                    note=f"t_launch - median raw cuLaunchKernel ({raw:.2f} us)",
                )
            )
    return results


def targets(results: list[RowResult]) -> tuple[int, int, float, bool]:
    """(rows within 1.5x, throughput rows, worst factor, both targets met)."""
    factors = [r.factor for r in results if r.unit.startswith("samples/s") and r.factor]
    within = sum(1 for f in factors if f <= TARGET_WITHIN)
    worst = max(factors)
    ok = within >= TARGET_SHARE * len(factors) and worst <= TARGET_WORST
    return within, len(factors), worst, ok


FITTED = (
    "compute_efficiency",
    "memory_efficiency",
    "activation_cache_share",
    "host_link_efficiency",
    "kernel_launch_overhead_s",
    "request_overhead_s",
)


def shipped_matches(derivation: Derivation) -> list[str]:
    """Differences between the derivation and DEFAULT_CALIBRATIONS (empty: they agree); the
    TPU defaults must be the GPU's."""
    problems = []
    derived = {**derivation.calibrations, DeviceKind.TPU: derivation.calibrations[DeviceKind.GPU]}
    for kind, expected in derived.items():
        shipped = DEFAULT_CALIBRATIONS[kind]
        for name in FITTED:
            want, have = getattr(expected, name), getattr(shipped, name)
            if not math.isclose(want, have, rel_tol=1e-9):
                problems.append(f"{kind.value} {name}: derived {want:.6g}, shipped {have:.6g}")
    return problems


def _figure(value: float | None) -> str:
    if value is None:
        return "n/a"
    return f"{value:,.0f}" if value >= 100 else f"{value:.3g}"


def render(results: list[RowResult], derivation: Derivation) -> tuple[str, bool]:
    """A Markdown report and whether everything holds."""
    lines = [
        "# Roofline calibration: predicted vs measured",
        "",
        "Generated by `benchmarks/calibration/calibrate.py` from `calibration_benchmarks.yaml`",
        "(every row of it). Throughput rows: the service's roofline for ResNet-50 v1.5, INT8, "
        f"batch {BATCH},",
        "fused kernels, with the shipped defaults, against MLPerf Offline per accelerator or per",
        "CPU socket; *implied eff.* is the compute efficiency that would reproduce the row exactly",
        "with the kind's other defaults (1.000: the row is out of reach at any efficiency).",
        "Copy rows: the catalog link (or the scenario's PCIe link for devices not in the catalog)",
        "x the host-link efficiency. Launch rows: the per-kernel launch default. Only the",
        "throughput rows count for the targets.",
        "",
        "| # | device | metric | measured | predicted | pred/meas | implied eff. | note |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        measured, predicted = _figure(r.measured), _figure(r.predicted)
        ratio = "n/a" if r.ratio is None else f"{r.ratio:.2f}"
        implied = derivation.implied.get(r.index)
        lines.append(
            f"| {r.index + 1} | {r.device} | {r.metric} [{r.unit}] | {measured} | {predicted} | "
            f"{ratio} | {'' if implied is None else f'{implied:.3f}'} | {r.note} |"
        )
    within, total, worst, ok = targets(results)
    problems = shipped_matches(derivation)
    lines += [
        "",
        "Derived defaults:",
        "",
        "| kind | compute eff. | activation cache share | memory eff. (assumed) | host-link eff. "
        "| launch [us] | request [us] |",
        "|---|---|---|---|---|---|---|",
        *(
            f"| {kind.value} | {c.compute_efficiency} | {c.activation_cache_share} | "
            f"{c.memory_efficiency} | {c.host_link_efficiency} | "
            f"{c.kernel_launch_overhead_s * 1e6:.2f} | {c.request_overhead_s * 1e6:.2f} |"
            for kind, c in derivation.calibrations.items()
        ),
        "",
        f"Throughput within {TARGET_WITHIN}x: {within} of {total} rows "
        f"({within / total:.0%}, target >= {TARGET_SHARE:.0%}); worst {worst:.2f}x "
        f"(target <= {TARGET_WORST}x): {'PASS' if ok else 'FAIL'}.",
        "Shipped defaults match the derivation: "
        + ("yes" if not problems else "NO - " + "; ".join(problems))
        + ".",
    ]
    return "\n".join(lines) + "\n", ok and not problems


def main(argv: list[str] | None = None) -> int:
    """Print the derivation and every row; exit 1 when a target fails."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--reference", type=Path, default=DATA, help="calibration YAML")
    parser.add_argument("--write-results", action="store_true", help=f"write {RESULTS.name}")
    args = parser.parse_args(argv)
    rows = load_rows(args.reference)
    devices = catalog_devices()
    derivation = derive(rows, devices)
    report, ok = render(evaluate(rows, devices), derivation)
    print(report)
    if args.write_results:
        RESULTS.write_text(report, encoding="utf-8")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
