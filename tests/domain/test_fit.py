"""The one requirement and verdict (app.domain.fit): golden bytes and evaluable formulas."""

from __future__ import annotations

import pytest

from app.domain.fit import FitInputError, fit, required_bytes, requirement
from app.domain.memory.estimate import MemoryLine
from tests.domain.test_formulas import evaluate

MIB = 2**20
LINES = (
    MemoryLine(key="weights", bytes=1_000_000_000, formula="", assumptions=()),
    MemoryLine(key="workspace", bytes=32 * MIB, formula="", assumptions=()),
    MemoryLine(key="cuda_context", bytes=512 * MIB, formula="", assumptions=()),
)
PEAK = 1_000_000_000 + 32 * MIB + 512 * MIB


def test_requirement_lines_and_margin_are_exact() -> None:
    need = requirement(PEAK, LINES, safety_margin_fraction=0.05)
    lines = {line.key: line.bytes for line in need.lines}
    assert lines == {
        "memory_estimate": 1_000_000_000,
        "cuda_context": 536_870_912,
        "workspace": 33_554_432,
        "safety_margin": 78_521_268,  # ceil(1,570,425,344 x 0.05) = ceil(78,521,267.2)
    }
    assert need.required_bytes == PEAK + 78_521_268
    for line in need.lines:
        assert evaluate(line.formula) == (line.bytes, line.bytes), line.formula


def test_cpu_estimates_have_no_context_or_workspace() -> None:
    need = requirement(4096, (), safety_margin_fraction=0.0)
    assert [(line.key, line.bytes) for line in need.lines] == [
        ("memory_estimate", 4096),
        ("cuda_context", 0),
        ("workspace", 0),
        ("safety_margin", 0),
    ]


def test_the_verdict_is_required_against_usable() -> None:
    need = requirement(PEAK, LINES, safety_margin_fraction=0.05)
    exact = fit(need, need.required_bytes)
    assert (exact.fits, exact.headroom_bytes) == (True, 0)
    short = fit(need, need.required_bytes - 1)
    assert (short.fits, short.headroom_bytes) == (False, -1)


@pytest.mark.parametrize("fraction", [-0.01, 1.0, float("nan"), True])
def test_a_margin_outside_zero_to_one_is_refused(fraction: float) -> None:
    with pytest.raises(FitInputError):
        requirement(PEAK, LINES, safety_margin_fraction=fraction)
    with pytest.raises(FitInputError):
        required_bytes(PEAK, safety_margin_fraction=fraction)


def test_the_number_alone_is_the_requirements_total() -> None:
    # golden: ceil(1,570,425,344 x 0.05) = 78,521,268, as in the lines above
    assert required_bytes(PEAK, safety_margin_fraction=0.05) == PEAK + 78_521_268
    # 0.1 is the decimal 1/10, not the double just above it: ceil(10 x 0.1) is 1, not 2
    assert required_bytes(10, safety_margin_fraction=0.1) == 11
    for peak in (0, 1, 4096, 999_999_937, PEAK):
        for fraction in (0.0, 0.05, 0.1, 0.15, 0.333, 0.9):
            whole = requirement(peak, LINES, safety_margin_fraction=fraction)
            assert required_bytes(peak, safety_margin_fraction=fraction) == whole.required_bytes


def test_sources_are_named_in_the_formulas() -> None:
    need = requirement(
        PEAK,
        LINES,
        safety_margin_fraction=0.05,
        sources={"cuda_context": "request override", "workspace": "hardware profile 'x'"},
    )
    formulas = {line.key: line.formula for line in need.lines}
    assert (
        formulas["cuda_context"] == "536,870,912 [B CUDA context: request override] = 536,870,912 B"
    )
    assert "hardware profile 'x'" in formulas["workspace"]
