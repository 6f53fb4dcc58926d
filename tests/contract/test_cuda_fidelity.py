"""The CUDA fidelity comparison (`benchmarks/fidelity/cuda/compare.py`) works on the records
`measure.py` writes, before any GPU has produced them.

No CUDA measurement is committed yet (no session has had a GPU): these tests feed the
comparison a SYNTHETIC record with made-up figures to check its arithmetic and its verdicts,
not the estimates' fidelity. When measurements are committed, a replay like
`tests/contract/test_fidelity.py` (CPU) joins them.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

import pytest

from app.config import PROJECT_ROOT
from tests.support import load_script

CUDA = PROJECT_ROOT / "benchmarks" / "fidelity" / "cuda"


@pytest.fixture(scope="module")
def compare() -> ModuleType:
    return load_script(CUDA / "compare.py", "cuda_fidelity_compare")


def _record(compare: ModuleType, scale: float) -> dict[str, Any]:
    """A synthetic GPT-2 training record whose 'measured' figures are the estimate x scale."""
    record: dict[str, Any] = {
        "key": "gpt2_small|training|fp32|adamw_foreach|sdpa|bs2|seq64",
        "model": "gpt2_small",
        "mode": "training",
        "dtype": "fp32",
        "optimizer": "adamw_foreach",
        "batch": 2,
        "seq_len": 64,
        "attn_implementation": "sdpa",
        "attention_kernel": "aten::_efficient_attention_forward",
        "environment": {"capability": "9.0", "PYTORCH_CUDA_ALLOC_CONF": None},
    }
    cuda = compare.estimate(record).cuda
    context = cuda.context_bytes
    step = {
        "max_memory_allocated": round(cuda.allocated_bytes * scale),
        "max_memory_reserved": round(cuda.reserved_bytes * scale),
        "context_bytes": round(context * scale),
    }
    record["steps"] = [{**step, "warmup": True}, {**step, "warmup": False}]
    record["params"] = 124_439_808  # GPT-2 small
    return record


def test_an_exact_record_meets_every_target(compare: ModuleType) -> None:
    row = compare.row(_record(compare, 1.0))
    for figure in ("allocated", "reserved", "device_total"):
        assert row.error_pct(figure) == pytest.approx(0.0, abs=1e-6), figure
    text, ok = compare.render([row])
    assert ok
    assert "targets: met" in text


def test_an_under_estimate_beyond_the_margin_fails(compare: ModuleType) -> None:
    row = compare.row(_record(compare, 1.25))  # measured 25 % above the estimate
    assert row.error_pct("device_total") == pytest.approx(-20.0, abs=0.01)
    _, ok = compare.render([row])
    assert not ok


def test_no_measurements_is_a_failure_not_a_pass(compare: ModuleType) -> None:
    text, ok = compare.render([])
    assert not ok
    assert "no CUDA measurements yet" in text


def test_memory_an_earlier_configuration_left_allocated_is_subtracted(compare: ModuleType) -> None:
    """measure.py's H200 run of 2026-11-28 began 37 configurations with an earlier one's model
    still allocated (the optimizer-in-backward hooks): the peaks count it, the row must not."""
    record = _record(compare, 1.0)
    leaked = 1_498_808_320
    record["before"] = {"allocated": leaked, "reserved": leaked + 2**21}
    for step in record["steps"]:
        step["max_memory_allocated"] += leaked
        step["max_memory_reserved"] += leaked + 2**21
    row = compare.row(record)
    assert row.leaked == leaked
    assert row.error_pct("allocated") == pytest.approx(0.0, abs=1e-6)
    assert row.error_pct("reserved") == pytest.approx(0.0, abs=1e-6)


def test_a_second_gpu_is_compared_configuration_by_configuration(compare: ModuleType) -> None:
    h100 = compare.row(_record(compare, 1.0))
    record = _record(compare, 1.0)
    record["steps"][1]["max_memory_allocated"] += 2**20  # the second GPU allocates 1 MiB more
    h200 = compare.row(record)
    text = compare.cross_gpu({"A": {h100.key: h100}, "B": {h200.key: h200}}, "A", "B")
    assert "identical to the byte in 0 of 1" in text
    share = 100.0 * 2**20 / h100.measured["allocated"]
    assert f"median {share:+.2f} %" in text
