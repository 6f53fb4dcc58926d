"""Every breakdown line's formula evaluates to the line's bytes.

A formula is arithmetic over the numbers the engine used (thousands separators, ``x``, ``/``,
``+``, ``-``, parentheses, ``ceil(...)`` and ``floor(...)`` where the engine rounds), with words
in ``[...]`` saying what each number is, then ``= <bytes> B``. The test strips the words,
evaluates the arithmetic exactly (fractions) and compares both sides with the line's value.
Lines that are sums over the step's timeline (activations, transient, gradients in backward)
list their components, so they evaluate too. ``test_memory_snapshot.py`` runs the same check
over all of its ~3,600 configurations.
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

from app.domain.hardware import FrameworkOverhead
from app.domain.memory.estimate import MemoryEstimate, MemoryRequest, analyze_for, estimate_memory
from app.domain.precision import Precision
from app.domain.workload import (
    Attention,
    Checkpointing,
    Logits,
    LossKind,
    Mode,
    Parallelism,
    Runtime,
    TrainingOptions,
)
from app.domain.zoo import ZOO

_BINARY: dict[type, Any] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
}

_ROUNDING: dict[str, Any] = {"ceil": math.ceil, "floor": math.floor}


def _value(node: ast.AST) -> Any:
    if isinstance(node, ast.Expression):
        return _value(node.body)
    if isinstance(node, ast.Constant) and isinstance(node.value, int | float):
        return Fraction(node.value) if isinstance(node.value, int) else node.value
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        return _BINARY[type(node.op)](_value(node.left), _value(node.right))
    if (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id in _ROUNDING
        and len(node.args) == 1
    ):
        return Fraction(_ROUNDING[node.func.id](_value(node.args[0])))
    raise ValueError(f"not formula arithmetic: {ast.dump(node)}")


def evaluate(formula: str) -> tuple[int, int]:
    """(value of the arithmetic, the stated result) of ``<arithmetic> = <n> B``."""
    match = re.fullmatch(r"(.*) = ([\d,]+) B", formula)
    assert match, f"formula has no '= <bytes> B' result: {formula!r}"
    arithmetic = re.sub(r"\[[^\]]*\]", "", match.group(1))
    arithmetic = arithmetic.replace(",", "").replace(" x ", " * ").strip()
    value = Fraction(_value(ast.parse(arithmetic, mode="eval")))
    assert value.denominator == 1, f"{formula!r} is not a whole number of bytes"
    return int(value), int(match.group(2).replace(",", ""))


def test_the_evaluator_reads_the_grammar() -> None:
    assert evaluate("ceil(1,001 [params] x 2 [B] / 4 [shards]) = 501 B") == (501, 501)
    assert evaluate("floor(1,000 [B] x 0.05) = 50 B") == (50, 50)
    assert evaluate("1,234 [B: sum] = 1,234 B") == (1234, 1234)
    assert evaluate("[at 'fc'] 2 x 3 [B: a] + 4 [B: b] = 10 B") == (10, 10)
    assert evaluate("3 [layers] x ceil(5 [params] x 1/2 [B] / 1) = 9 B") == (9, 9)


def test_the_evaluator_catches_a_wrong_formula() -> None:
    assert evaluate("1,000 [params] x 2 [B] = 2,001 B") == (2000, 2001)
    with pytest.raises(AssertionError, match="no '= <bytes> B'"):
        evaluate("8,030,261,248 trainable params x 2 B")
    with pytest.raises(ValueError, match="not formula arithmetic"):
        evaluate("round(3 [B]) = 3 B")


_MODELS = ("gpt-2", "bert-base", "resnet-50", "llama-3-8b", "lstm-classifier", "vit-b-16")
_PARALLEL = (
    Parallelism(),
    Parallelism(data=8, zero_stage=3),
    Parallelism(data=4, tensor=2, zero_stage=2),
    Parallelism(data=2, pipeline=2, zero_stage=1),
)
_PRECISIONS = (
    Precision.FP32,
    Precision.BF16,
    Precision.AMP_BF16,
    Precision.MIXED_BF16,
    Precision.FP8,
    Precision.INT4,
)


def _cases() -> list[tuple[str, Mode, Precision, Runtime, Parallelism]]:
    cases = []
    for slug, mode, precision, runtime, par in itertools.product(
        _MODELS, Mode, _PRECISIONS, Runtime, _PARALLEL
    ):
        if mode is Mode.INFERENCE and par.zero_stage:
            continue
        if mode is Mode.TRAINING and precision in (Precision.INT4, Precision.FP8):
            continue  # inference-only conventions
        cases.append((slug, mode, precision, runtime, par))
    return cases


def _estimate(slug: str, request: MemoryRequest, batch: int = 2, seq: int = 128) -> MemoryEstimate:
    model = ZOO[slug]
    bindings = {**model.default_bindings, "batch": batch}
    if "seq" in bindings:
        bindings["seq"] = seq
    return estimate_memory(analyze_for(model.inputs, model.layers, bindings, request), request)


def _assert_formulas(estimate: MemoryEstimate) -> None:
    assert estimate.lines
    for line in estimate.lines:
        value, stated = evaluate(line.formula)
        assert (value, stated) == (line.bytes, line.bytes), (line.key, line.formula)


@pytest.mark.parametrize(("slug", "mode", "precision", "runtime", "par"), _cases())
def test_every_formula_evaluates_to_its_line(
    slug: str, mode: Mode, precision: Precision, runtime: Runtime, par: Parallelism
) -> None:
    """Default attention (SDPA's pick for the runtime and precision), last-position logits."""
    request = MemoryRequest(
        mode=mode,
        precision=precision,
        runtime=runtime,
        parallelism=par,
        overhead=FrameworkOverhead(),
        logits=Logits.LAST if mode is Mode.INFERENCE else Logits.ALL,
    )
    _assert_formulas(_estimate(slug, request))


@pytest.mark.parametrize(
    "options",
    [
        {"attention": Attention.EAGER},
        {"attention": Attention.SDPA_MATH, "runtime": Runtime.CPU},
        {"attention": Attention.MEM_EFFICIENT},
        {"checkpointing": Checkpointing.SELECTIVE, "attention": Attention.EAGER},
        {"checkpointing": Checkpointing.FULL},
        {"checkpointing": Checkpointing.FULL, "runtime": Runtime.CPU},
        {"accumulation_steps": 4},
        {"accumulation_steps": 4, "parallelism": Parallelism(data=8, zero_stage=3)},
        {"fp32_grad_buffer": True, "precision": Precision.MIXED_BF16},
        {"overhead": FrameworkOverhead(round_allocations=False)},
    ],
    ids=str,
)
@pytest.mark.parametrize("slug", ["gpt-2", "resnet-50", "bert-base"])
def test_training_options_keep_formulas_evaluable(slug: str, options: dict[str, Any]) -> None:
    request = MemoryRequest(mode=Mode.TRAINING, **options)
    _assert_formulas(_estimate(slug, request))


@pytest.mark.parametrize("kv_cache", [None, True, False])
@pytest.mark.parametrize("slug", ["llama-3-8b", "bert-base", "gpt-2"])
def test_inference_options_keep_formulas_evaluable(slug: str, kv_cache: bool | None) -> None:
    for logits, par in itertools.product(Logits, (Parallelism(), Parallelism(tensor=4))):
        request = MemoryRequest(
            mode=Mode.INFERENCE,
            precision=Precision.BF16,
            kv_cache=kv_cache,
            logits=logits,
            parallelism=par,
        )
        _assert_formulas(_estimate(slug, request))


def _formulas(request: MemoryRequest, slug: str = "llama-3-8b") -> dict[str, str]:
    return {line.key: line.formula for line in _estimate(slug, request, batch=1).lines}


def test_sharded_state_shows_its_divisors() -> None:
    """Issue 12's named bugs: the gradients line showed "8,030,261,248 trainable params x 2 B"
    beside a sharded figure, and ZeRO-3's master-weights formula omitted the "/8"."""
    request = MemoryRequest(
        mode=Mode.TRAINING,
        precision=Precision.MIXED_BF16,
        parallelism=Parallelism(data=8, zero_stage=3),
    )
    estimate = _estimate("llama-3-8b", request, batch=1)
    formulas = {line.key: line.formula for line in estimate.lines}
    _assert_formulas(estimate)
    assert formulas["master_weights"].startswith("ceil(8,030,261,248 [params] x 4 ")
    assert "/ 8 [tensor x pipeline x ZeRO-3 data ranks]" in formulas["master_weights"]
    assert "/ 8 [tensor x pipeline x ZeRO-3 data ranks]" in formulas["optimizer_state"]
    assert "/ 8 [ZeRO-3 data ranks]" in formulas["weights"]
    # gradients: whole (optimizer step) or accumulated per layer (backward), divided by 8
    assert "x 2 [B] / 8" in formulas["gradients"]


def test_held_gradients_name_the_whole_model_and_the_divisor() -> None:
    request = MemoryRequest(
        mode=Mode.TRAINING,
        precision=Precision.MIXED_BF16,
        parallelism=Parallelism(data=8, zero_stage=3),
        accumulation_steps=2,  # gradients held whole through the step
    )
    formulas = _formulas(request)
    # the peak: the loss's backward (the fp32 log-probabilities' two gradients,
    # app.domain.memory.loss), before any layer's backward; the held gradients are whole
    assert formulas["gradients"].startswith(
        "[in the loss's backward: no backward has run yet] "
        "ceil(8,030,261,248 [trainable params] x 2 [B] / 8 [tensor x pipeline x ZeRO-3 data "
        "ranks]) [held across micro-batches] = "
    ), formulas["gradients"]


def test_timeline_lines_list_their_components() -> None:
    """Activations: the live tensors per producing op, at the moment of the peak (the logits
    summed, as benchmark loops do: the head's backward; with Hugging Face's loss the peak is
    the loss's backward, tests/domain/test_loss_rule.py)."""
    request = MemoryRequest(
        mode=Mode.TRAINING,
        precision=Precision.AMP_BF16,
        training_options=TrainingOptions(loss=LossKind.LOGITS_SUM),
    )
    estimate = _estimate("gpt-2", request, batch=8, seq=1024)
    formulas = {line.key: line.formula for line in estimate.lines}
    assert estimate.peak_phase == "backward"
    assert formulas["activations"].startswith("[during the backward of 'lm_head'] ")
    for op in ("attention", "mlp", "layernorm", "dropout"):
        assert f"from {op} layers]" in formulas["activations"]
    # under CUDA autocast a LayerNorm keeps an fp32 input of its own (ops/transformer.py
    # _layernorm_input), not the residual add's output: no add output is kept
    assert "from add layers]" not in formulas["activations"]
    assert formulas["transient"].count(" + ") >= 1
    assert "gradient of the output of 'lm_head'" in formulas["transient"]
    _assert_formulas(estimate)
