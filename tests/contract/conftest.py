"""Fixtures the calibration contract tests share: the script is loaded once per session, so its
derivations and leave-one-device-out refits run once for both test modules."""

from types import ModuleType
from typing import Any

import pytest

from app.config import PROJECT_ROOT
from tests.support import load_script

CALIBRATION = PROJECT_ROOT / "benchmarks" / "calibration"


@pytest.fixture(scope="session")
def calibrate() -> ModuleType:
    return load_script(CALIBRATION / "calibrate.py", "calibrate")


@pytest.fixture(scope="session")
def calibration_rows(calibrate: ModuleType) -> list[dict[str, Any]]:
    """The rows of calibration_benchmarks.yaml."""
    loaded: list[dict[str, Any]] = calibrate.load_rows()
    return loaded


@pytest.fixture(scope="session")
def calibration_more_rows(calibrate: ModuleType) -> list[dict[str, Any]]:
    """The rows of calibration_more.yaml."""
    loaded: list[dict[str, Any]] = calibrate.load_rows(calibrate.MORE)
    return loaded


@pytest.fixture(scope="session")
def calibration_cpu_rows(calibrate: ModuleType) -> list[dict[str, Any]]:
    """The rows of calibration_cpu.yaml (Xeons without AMX, collected in this repository)."""
    loaded: list[dict[str, Any]] = calibrate.load_rows(calibrate.CPU_ROWS)
    return loaded


@pytest.fixture(scope="session")
def calibration_fit_rows(
    calibrate: ModuleType,
    calibration_rows: list[dict[str, Any]],
    calibration_cpu_rows: list[dict[str, Any]],
) -> list[dict[str, Any]]:
    """What the fit reads: calibration_benchmarks.yaml and calibration_cpu.yaml's ResNet-50
    Offline rows."""
    found: list[dict[str, Any]] = calibrate.fit_rows(calibration_rows, calibration_cpu_rows)
    return found


@pytest.fixture(scope="session")
def calibration_devices(calibrate: ModuleType) -> dict[str, Any]:
    found: dict[str, Any] = calibrate.catalog_devices()
    return found


@pytest.fixture(scope="session")
def calibration_test_rows(calibrate: ModuleType) -> list[dict[str, Any]]:
    """The rows of calibration_test.yaml (the frozen test split)."""
    loaded: list[dict[str, Any]] = calibrate.load_rows(calibrate.TEST_ROWS)
    return loaded


@pytest.fixture(scope="session")
def calibration_former_test_rows(calibrate: ModuleType) -> list[dict[str, Any]]:
    """The rows of calibration_validation_test_v2_0.yaml: the 506 MLPerf v2.0 rows moved out of
    the test split by its rule (D), validation rows since."""
    loaded: list[dict[str, Any]] = calibrate.load_rows(calibrate.FORMER_TEST_ROWS)
    return loaded


@pytest.fixture(scope="session")
def calibration_every_row(
    calibrate: ModuleType,
    calibration_rows: list[dict[str, Any]],
    calibration_more_rows: list[dict[str, Any]],
    calibration_cpu_rows: list[dict[str, Any]],
    calibration_test_rows: list[dict[str, Any]],
    calibration_former_test_rows: list[dict[str, Any]],
    calibration_devices: dict[str, Any],
) -> list[Any]:
    """Every row of the five files as calibrate.py predicts them (one run: the test split's
    rows and the former test rows are predicted with the others, never fitted on), as
    results.md reports them."""
    found: list[Any] = calibrate.out_of_sample(
        calibration_rows,
        calibration_more_rows,
        calibration_devices,
        calibration_cpu_rows,
        calibration_test_rows,
        calibration_former_test_rows,
    )
    return found


@pytest.fixture(scope="session")
def calibration_out_of_sample(calibration_every_row: list[Any]) -> list[Any]:
    """Every row of the four files that are not the test split (validation and fit rows),
    leave-one-device-out."""
    return [r for r in calibration_every_row if r.case.file != "test"]
