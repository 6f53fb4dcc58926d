"""The committed PyTorch measurements still agree with the estimates (no torch needed).

`benchmarks/fidelity/measure.py` measured what PyTorch 2.13 really allocates on CPU; this
replays those records through `benchmarks/fidelity/compare.py` so a change to the op semantics
or the memory model that breaks fidelity fails CI. Deterministic: nothing is timed.
"""

import json
import statistics
from types import ModuleType
from typing import Any

import pytest

from app.config import PROJECT_ROOT
from tests.support import load_script

FIDELITY = PROJECT_ROOT / "benchmarks" / "fidelity"


@pytest.fixture(scope="module")
def compare() -> ModuleType:
    return load_script(FIDELITY / "compare.py", "fidelity_compare")


@pytest.fixture(scope="module")
def rows(compare: ModuleType) -> list[Any]:
    records = json.loads((FIDELITY / "measurements.json").read_text())
    measured = [record for record in records if "skipped" not in record]
    assert len(measured) >= 100
    return [compare.estimate_row(record) for record in measured]


def test_parameter_counts_are_exact(rows: list[Any]) -> None:
    assert all(row.params_measured == row.params_estimated for row in rows)


def test_training_within_targets(rows: list[Any]) -> None:
    errors = [abs(r.error_pct) for r in rows if r.mode == "training"]
    assert statistics.median(errors) <= 5.0
    assert max(errors) <= 15.0


def test_inference_within_targets(rows: list[Any]) -> None:
    errors = [abs(r.error_pct) for r in rows if r.mode == "inference"]
    assert statistics.median(errors) <= 10.0


def test_committed_report_is_current(compare: ModuleType, rows: list[Any]) -> None:
    report, ok = compare.render(rows)
    assert ok
    assert report in (FIDELITY / "results.md").read_text(), (
        "benchmarks/fidelity/results.md is stale; run .venv/bin/python "
        "benchmarks/fidelity/compare.py"
    )
