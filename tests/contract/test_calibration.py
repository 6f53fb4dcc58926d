"""The roofline calibration still reproduces the committed measurements (in-process, fast).

`benchmarks/calibration/calibrate.py` derives the efficiency factors and overheads of
`DEFAULT_CALIBRATIONS` from `calibration_benchmarks.yaml` (MLPerf ResNet-50 Offline, host-link
copies, kernel launches) and prints predicted vs measured for every row. This runs the same
functions, so a change to the roofline, the op semantics or the catalog that breaks the
calibration, or a default edited by hand, fails CI. The committed report also holds the
out-of-sample evaluation of both files (`calibration_more.yaml` too); its targets are printed,
not asserted (see test_calibration_out_of_sample.py).
"""

from types import ModuleType
from typing import Any

import pytest
import yaml

from app.config import PROJECT_ROOT
from app.domain.hardware import DeviceKind
from app.domain.performance.calibration import DEFAULT_CALIBRATIONS, CalibrationClass

CALIBRATION = PROJECT_ROOT / "benchmarks" / "calibration"


@pytest.fixture(scope="module")
def results(
    calibrate: ModuleType,
    calibration_fit_rows: list[dict[str, Any]],
    calibration_devices: dict[str, Any],
) -> Any:
    return calibrate.evaluate(calibration_fit_rows, calibration_devices)


@pytest.mark.parametrize("name", ["calibration_benchmarks.yaml", "calibration_more.yaml"])
def test_the_copy_is_the_shared_reference(name: str) -> None:
    shared = PROJECT_ROOT.parent / "shared" / "reference" / name
    if not shared.exists():
        pytest.skip("../shared/reference is not checked out next to the repository")
    text = (CALIBRATION / name).read_text(encoding="utf-8")
    body = "".join(text.splitlines(keepends=True)[3:])  # after the three comment lines
    assert body == shared.read_text(encoding="utf-8")


def test_every_row_is_printed(
    calibration_rows: list[dict[str, Any]], calibration_fit_rows: list[dict[str, Any]], results: Any
) -> None:
    assert len(calibration_rows) == 33
    assert len(calibration_fit_rows) == 33 + 23  # + calibration_cpu.yaml's ResNet-50 Offline
    assert [r.index for r in results] == list(range(len(calibration_fit_rows)))
    assert all(r.measured is not None and r.predicted is not None for r in results)
    metrics = {r.metric for r in results}
    assert metrics == {
        "ResNet-50 Offline INT8",
        "host-to-device copy",
        "kernel launch",
        "launch path above cuLaunchKernel",
    }


def test_throughput_targets_hold(calibrate: ModuleType, results: Any) -> None:
    within, total, worst, ok = calibrate.targets(results)
    assert total == 22 + 23
    assert within >= 0.8 * total
    assert worst <= 2.0
    assert ok


def test_shipped_defaults_are_the_derivation(
    calibrate: ModuleType,
    calibration_fit_rows: list[dict[str, Any]],
    calibration_more_rows: list[dict[str, Any]],
    calibration_devices: dict[str, Any],
) -> None:
    derivation = calibrate.derive(
        calibration_fit_rows,
        calibration_devices,
        calibrate.latency_rows(calibration_more_rows, calibration_devices),
    )
    assert calibrate.shipped_matches(derivation) == []


def test_committed_report_is_current(
    calibrate: ModuleType,
    calibration_fit_rows: list[dict[str, Any]],
    calibration_more_rows: list[dict[str, Any]],
    calibration_devices: dict[str, Any],
    results: Any,
    calibration_every_row: Any,
) -> None:
    report, ok = calibrate.render(
        results,
        calibrate.derive(
            calibration_fit_rows,
            calibration_devices,
            calibrate.latency_rows(calibration_more_rows, calibration_devices),
        ),
    )
    assert ok
    report += calibrate.render_bandwidth(calibration_devices)
    report += calibrate.render_out_of_sample(calibration_every_row)
    assert report == (CALIBRATION / "results.md").read_text(encoding="utf-8"), (
        "benchmarks/calibration/results.md is stale; run .venv/bin/python "
        "benchmarks/calibration/calibrate.py --write-results"
    )


def test_memory_efficiency_is_the_bandwidth_fit(
    calibrate: ModuleType, calibration_devices: dict[str, Any]
) -> None:
    """The shipped GPU memory efficiency is the geometric mean of measured / peak bandwidth of
    memory_bandwidth.yaml; every row has a source and names a catalog device."""
    rows = calibrate.load_rows(calibrate.BANDWIDTH)
    assert len(rows) >= 5
    assert all(row["source"].startswith("https://") and row["description"] for row in rows)
    fitted = calibrate.fit_memory_efficiency(calibrate.bandwidth_rows(calibration_devices))
    assert fitted == {DeviceKind.GPU: DEFAULT_CALIBRATIONS[CalibrationClass.GPU].memory_efficiency}


CATALOG_CPU_FILES = ("intel-xeon.yaml", "amd-epyc.yaml", "aws-graviton.yaml")


def test_cpu_bandwidth_rows_follow_the_rule(
    calibrate: ModuleType, calibration_devices: dict[str, Any]
) -> None:
    """memory_bandwidth.yaml's CPU rows (STREAM / BabelStream Triad per socket) name a CPU of
    the catalog's Xeon, EPYC or Graviton files, say how many sockets the figure covered and
    have a source. The CPU kind's memory efficiency is the fit when the rows come from at least
    3 CPUs, else it stays the shipped assumption (0.7) and the fit leaves the CPU kind out."""
    catalog = PROJECT_ROOT / "hardware_catalog"
    slugs = {
        entry["slug"]
        for name in CATALOG_CPU_FILES
        for entry in yaml.safe_load((catalog / name).read_text(encoding="utf-8"))["devices"]
    }
    rows = calibrate.load_rows(calibrate.BANDWIDTH)
    cpu_rows = [row for row in rows if calibration_devices[row["device"]].kind is DeviceKind.CPU]
    for row in cpu_rows:
        assert row["device"] in slugs
        assert row["source"].startswith("https://")
        assert row["description"]
        assert "STREAM" in row["tool"] or "BabelStream" in row["tool"]
        assert int(row["sockets"]) >= 1
    cpus = {row["device"] for row in cpu_rows}
    fitted = calibrate.fit_memory_efficiency(calibrate.bandwidth_rows(calibration_devices))
    for cls in (CalibrationClass.CPU, CalibrationClass.CPU_AMX):
        shipped = DEFAULT_CALIBRATIONS[cls].memory_efficiency
        if len(cpus) >= calibrate.MIN_MEMORY_FIT_DEVICES:
            assert shipped == fitted[DeviceKind.CPU]
        else:
            assert DeviceKind.CPU not in fitted
            assert shipped == 0.7


def test_memory_fit_needs_rows_of_three_devices(
    calibrate: ModuleType,
    calibration_fit_rows: list[dict[str, Any]],
    calibration_more_rows: list[dict[str, Any]],
    calibration_devices: dict[str, Any],
) -> None:
    """A kind's memory efficiency is fitted only on rows from 3 or more devices: 2 CPUs'
    rows leave the CPU classes at the assumption, a third CPU applies the fit."""
    xeons = ["intel-xeon-platinum-8380", "intel-xeon-platinum-8480plus", "amd-epyc-9654"]
    half = [
        (calibration_devices[s], 0.5 * calibration_devices[s].memory_bandwidth_bytes_per_s)
        for s in xeons
    ]
    gpus = calibrate.bandwidth_rows(calibration_devices)
    assert DeviceKind.CPU not in calibrate.fit_memory_efficiency(gpus + half[:2])
    assert calibrate.fit_memory_efficiency(gpus + half)[DeviceKind.CPU] == 0.5
    latency = calibrate.latency_rows(calibration_more_rows, calibration_devices)
    two = calibrate.derive(calibration_fit_rows, calibration_devices, latency, gpus + half[:2])
    assert two.calibrations[CalibrationClass.CPU].memory_efficiency == 0.7
    assert two.calibrations[CalibrationClass.CPU_AMX].memory_efficiency == 0.7
    three = calibrate.derive(calibration_fit_rows, calibration_devices, latency, gpus + half)
    assert three.calibrations[CalibrationClass.CPU].memory_efficiency == 0.5


def test_cpus_are_fitted_per_matrix_engine(
    calibrate: ModuleType,
    calibration_fit_rows: list[dict[str, Any]],
    calibration_more_rows: list[dict[str, Any]],
    calibration_devices: dict[str, Any],
) -> None:
    """cpu_amx is fitted on the AMX Xeons' rows only (the other Xeons' rows do not move it); cpu
    (the 25 rows of 8 Xeons without AMX, compute-bound) fits its efficiency at the share of the
    pooled fit over every CPU row. Pins: results.md."""
    latency = calibrate.latency_rows(calibration_more_rows, calibration_devices)
    derivation = calibrate.derive(calibration_fit_rows, calibration_devices, latency)
    assert derivation.pooled == {}
    assert derivation.pooled_cpu == (0.63, 0.4, 29)  # pin: the pooled fit over every CPU row
    cpu = derivation.calibrations[CalibrationClass.CPU]
    amx = derivation.calibrations[CalibrationClass.CPU_AMX]
    assert cpu.activation_cache_share == derivation.pooled_cpu[1]
    assert (cpu.compute_efficiency, cpu.activation_cache_share) == (0.63, 0.4)  # pin
    assert (amx.compute_efficiency, amx.activation_cache_share) == (0.4, 0.85)  # pin

    def vector_cpu(row: dict[str, Any]) -> bool:
        device = calibration_devices.get(calibrate.CATALOG_SLUGS.get(row["device"], ""))
        return (
            device is not None
            and device.kind is DeviceKind.CPU
            and "AMX" not in (device.simd or "")
        )

    without_vnni = [r for r in calibration_fit_rows if not vector_cpu(r)]
    assert len(calibration_fit_rows) - len(without_vnni) == 25
    refit = calibrate.derive(without_vnni, calibration_devices, latency)
    assert refit.calibrations[CalibrationClass.CPU_AMX] == amx
    # a CPU class without rows of its own takes the pooled CPU fit (here: the AMX rows')
    assert CalibrationClass.CPU in refit.pooled
    pooled = refit.calibrations[CalibrationClass.CPU]
    assert (pooled.compute_efficiency, pooled.activation_cache_share) == refit.pooled_cpu[:2]


def test_gpus_are_fitted_per_architecture(
    calibrate: ModuleType,
    calibration_fit_rows: list[dict[str, Any]],
    calibration_more_rows: list[dict[str, Any]],
    calibration_devices: dict[str, Any],
) -> None:
    """gpu is the pooled fit over every GPU row (efficiency and share); gpu_ampere (6 rows of 4
    GPUs) and gpu_hopper (5 rows of 3) fit their efficiency at its share. An architecture left
    with rows of fewer than 2 devices takes the pooled fit. Pins: results.md."""
    latency = calibrate.latency_rows(calibration_more_rows, calibration_devices)
    derivation = calibrate.derive(calibration_fit_rows, calibration_devices, latency)
    fitted = derivation.calibrations
    gpu = fitted[CalibrationClass.GPU]
    ampere, hopper = fitted[CalibrationClass.GPU_AMPERE], fitted[CalibrationClass.GPU_HOPPER]
    assert (gpu.compute_efficiency, gpu.activation_cache_share) == (0.51, 0.5)  # pin
    assert (ampere.compute_efficiency, hopper.compute_efficiency) == (0.54, 0.42)  # pins
    assert ampere.activation_cache_share == hopper.activation_cache_share == 0.5

    def architecture(row: dict[str, Any]) -> CalibrationClass | None:
        device = calibration_devices.get(calibrate.CATALOG_SLUGS.get(row["device"], ""))
        if device is None or device.kind is not DeviceKind.GPU or row["metric"] != "throughput":
            return None
        cls: CalibrationClass = calibrate.calibration_class(
            device, calibrate.resnet50_int8(1).scheme
        )
        return cls

    counts: dict[CalibrationClass | None, int] = {}
    for row in calibration_fit_rows:
        counts[architecture(row)] = counts.get(architecture(row), 0) + 1
    assert (counts[CalibrationClass.GPU_AMPERE], counts[CalibrationClass.GPU_HOPPER]) == (6, 5)
    # Without the H100 SXM and the H200, Hopper has one device left: the pooled fit
    left = {"nvidia_h100_sxm", "nvidia_h200_sxm"}
    assert left <= {row["device"] for row in calibration_fit_rows}
    rows = [row for row in calibration_fit_rows if row["device"] not in left]
    refit = calibrate.derive(rows, calibration_devices, latency)
    assert CalibrationClass.GPU_HOPPER in refit.pooled
    assert CalibrationClass.GPU_AMPERE not in refit.pooled
    pooled_hopper = refit.calibrations[CalibrationClass.GPU_HOPPER]
    pooled_gpu = refit.calibrations[CalibrationClass.GPU]
    assert pooled_hopper.compute_efficiency == pooled_gpu.compute_efficiency
    assert pooled_hopper.activation_cache_share == pooled_gpu.activation_cache_share


def test_orin_rows_count_the_gpu_share_of_their_dla_runs(
    calibrate: ModuleType, calibration_fit_rows: list[dict[str, Any]]
) -> None:
    """NVIDIA's Orin ResNet-50 Offline runs use the GPU and both DLAs; the model prices the GPU,
    so a row counts the GPU's share by NVIDIA's own expected split (v3.0 config: AGX Orin 4,500
    of 6,100, Orin NX 1,700 of 2,400). Other rows of those systems, and every other system,
    count in full. Pins: results.md (edge 0.31)."""
    orin = {row["system"]: row for row in calibration_fit_rows if "Orin" in row.get("system", "")}
    assert set(orin) == {"NVIDIA Orin_TRT", "NVIDIA Orin_NX_TRT"}
    agx, nx = orin["NVIDIA Orin_TRT"], orin["NVIDIA Orin_NX_TRT"]
    assert calibrate.gpu_share(agx) == pytest.approx(4500 / 6100)
    assert calibrate.gpu_share(nx) == pytest.approx(1700 / 2400)
    assert calibrate.measured_throughput(agx) == pytest.approx(6438.1 * 4500 / 6100)
    assert calibrate.measured_throughput(nx) == pytest.approx(2517.99 * 1700 / 2400)
    assert calibrate.gpu_share({**agx, "model": "bert-99"}) == 1.0
    assert calibrate.gpu_share({**agx, "scenario": "SingleStream"}) == 1.0
    others = [row for row in calibration_fit_rows if "Orin" not in row.get("system", "")]
    assert others
    assert all(calibrate.gpu_share(row) == 1.0 for row in others)
    assert DEFAULT_CALIBRATIONS[CalibrationClass.EDGE].compute_efficiency == 0.31  # pin
