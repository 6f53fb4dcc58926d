"""Every breakdown line's formula evaluates to the line's bytes.

A formula is arithmetic over the numbers the engine used (thousands separators, ``x``, ``/``,
``+``, ``ceil(...)``, ``floor(...)``), with words in ``[...]`` saying what each number is, then
``= <bytes> B``. The test strips the words, evaluates the arithmetic exactly and compares both
sides with the line's value.
"""

from __future__ import annotations

import ast
import itertools
import math
import operator
import re
from fractions import Fraction
from typing import Any

import pytest

from app.domain.graph.analysis import analyze
from app.domain.hardware import FrameworkOverhead
from app.domain.memory.estimate import MemoryRequest, estimate_memory
from app.domain.precision import Precision
from app.domain.workload import Attention, Mode, Parallelism, Runtime
from app.domain.zoo import ZOO

_BINARY: dict[type, Any] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
}


def _value(node: ast.AST) -> Any:
    if isinstance(node, ast.Expression):
        return _value(node.body)
    if isinstance(node, ast.Constant) and isinstance(node.value, int | float):
        return Fraction(node.value) if isinstance(node.value, int) else node.value
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        return _BINARY[type(node.op)](_value(node.left), _value(node.right))
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and len(node.args) == 1:
        rounding = {"ceil": math.ceil, "floor": math.floor}[node.func.id]
        return Fraction(rounding(_value(node.args[0])))
    raise ValueError(f"not formula arithmetic: {ast.dump(node)}")


def evaluate(formula: str) -> tuple[int, int]:
    """(value of the arithmetic, the stated result) of ``<arithmetic> = <n> B``."""
    match = re.fullmatch(r"(.*) = ([\d,]+) B", formula)
    assert match, f"formula has no '= <bytes> B' result: {formula!r}"
    arithmetic = re.sub(r"\[[^\]]*\]", "", match.group(1))
    arithmetic = arithmetic.replace(",", "").replace(" x ", " * ")
    value = Fraction(_value(ast.parse(arithmetic, mode="eval")))
    assert value.denominator == 1, f"{formula!r} is not a whole number of bytes"
    return int(value), int(match.group(2).replace(",", ""))


def test_the_evaluator_reads_the_grammar() -> None:
    assert evaluate("ceil(1,001 [params] x 2 [B] / 4 [shards]) = 501 B") == (501, 501)
    assert evaluate("floor(1,000 [B] x 0.05) = 50 B") == (50, 50)
    assert evaluate("1,234 [B: sum] = 1,234 B") == (1234, 1234)


_MODELS = ("gpt-2", "bert-base", "resnet-50", "llama-2-7b")
_PARALLEL = (
    Parallelism(),
    Parallelism(data=8, zero_stage=3),
    Parallelism(data=4, tensor=2, zero_stage=2),
    Parallelism(data=2, pipeline=2, zero_stage=1),
)


def _cases() -> list[tuple[str, Mode, Precision, Runtime, Parallelism]]:
    cases = []
    for slug, mode, precision, runtime, par in itertools.product(
        _MODELS,
        Mode,
        (Precision.FP32, Precision.AMP_BF16, Precision.MIXED_BF16, Precision.INT4),
        Runtime,
        _PARALLEL,
    ):
        if mode is Mode.INFERENCE and par.zero_stage:
            continue
        if mode is Mode.TRAINING and precision is Precision.INT4:
            continue  # inference-only convention
        cases.append((slug, mode, precision, runtime, par))
    return cases


@pytest.mark.parametrize(("slug", "mode", "precision", "runtime", "par"), _cases())
def test_every_formula_evaluates_to_its_line(
    slug: str, mode: Mode, precision: Precision, runtime: Runtime, par: Parallelism
) -> None:
    model = ZOO[slug]
    bindings = {**model.default_bindings, "batch": 2}
    if "seq" in bindings:
        bindings["seq"] = 128
    training = mode is Mode.TRAINING
    analysis = analyze(
        model.inputs, model.layers, bindings, training=training, attention=Attention.FLASH
    )
    request = MemoryRequest(
        mode=mode,
        precision=precision,
        runtime=runtime,
        parallelism=par,
        overhead=FrameworkOverhead(),
    )
    estimate = estimate_memory(analysis, request)
    assert estimate.lines
    for line in estimate.lines:
        value, stated = evaluate(line.formula)
        assert (value, stated) == (line.bytes, line.bytes), (line.key, line.formula)


def test_sharded_state_shows_its_divisors() -> None:
    """ZeRO-3 over 8 ranks divides gradients, master weights and optimizer state by 8."""
    model = ZOO["gpt-2"]
    analysis = analyze(
        model.inputs,
        model.layers,
        {**model.default_bindings, "batch": 1, "seq": 128},
        training=True,
    )
    request = MemoryRequest(
        mode=Mode.TRAINING,
        precision=Precision.MIXED_BF16,
        parallelism=Parallelism(data=8, zero_stage=3),
    )
    formulas = {line.key: line.formula for line in estimate_memory(analysis, request).lines}
    params = analysis.params
    assert formulas["master_weights"].startswith(f"ceil({params:,} [params] x 4 ")
    assert "/ 8 [tensor x pipeline x ZeRO-3 data ranks]" in formulas["master_weights"]
    assert "/ 8 [tensor x pipeline x ZeRO-3 data ranks]" in formulas["optimizer_state"]
    assert "/ 8 [ZeRO-3 data ranks]" in formulas["weights"]
