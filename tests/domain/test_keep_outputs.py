"""keep_outputs: a loop that holds ``outputs = model(**batch)`` keeps the previous step's
logits (and a decoder's returned key/value cache) through the next step's forward."""

from __future__ import annotations

from app.domain.memory.estimate import MemoryRequest, analyze_for, estimate_memory
from app.domain.precision import Precision
from app.domain.workload import (
    Checkpointing,
    LossKind,
    Mode,
    Optimizer,
    Runtime,
    TrainingOptions,
)
from app.domain.zoo import ZOO
from tests.domain.test_formulas import evaluate

GPT2_LOGITS = 2 * 256 * 50257 * 2  # batch 2 x 256 tokens x vocab, fp16
GPT2_CACHE = 12 * 2 * 768 * 2 * 256 * 2  # layers x (K, V) x hidden x tokens x 2 B


def _estimate(keep: bool, checkpointing: Checkpointing = Checkpointing.NONE):  # type: ignore[no-untyped-def]
    model = ZOO["gpt-2"]
    request = MemoryRequest(
        mode=Mode.TRAINING,
        precision=Precision.FP16,
        optimizer=Optimizer.SGD,
        runtime=Runtime.CUDA,
        checkpointing=checkpointing,
        training_options=TrainingOptions(loss=LossKind.LOGITS_SUM, keep_outputs=keep),
    )
    analysis = analyze_for(model.inputs, model.layers, {"batch": 2, "seq": 256}, request)
    return estimate_memory(analysis, request)


def test_the_previous_outputs_line_is_logits_plus_the_returned_cache() -> None:
    held = _estimate(True)
    lines = {line.key: line for line in held.lines}
    assert lines["previous_outputs"].bytes == GPT2_LOGITS + GPT2_CACHE == 70_337_536
    formula = lines["previous_outputs"].formula
    assert evaluate(formula) == (70_337_536, 70_337_536)
    assert held.peak_phase == "forward"


def test_the_previous_outputs_are_held_in_the_steady_forward_only() -> None:
    plain, held = _estimate(False), _estimate(True)
    # the forward's moment gains the previous outputs; the replay's rounding and cached blocks
    # (in the phase peaks) move by a few MiB with the extra allocations
    grown = held.phase_peaks["forward"] - plain.phase_peaks["forward"]
    assert 0 <= grown - (GPT2_LOGITS + GPT2_CACHE) < 8 * 2**20
    assert held.first_iteration_peak_bytes is not None
    assert plain.first_iteration_peak_bytes is not None
    # the first step has no previous outputs: its peak is the plain loop's but for the
    # runtime's lines (the replay's reserve, read from the steady step)
    grown = held.first_iteration_peak_bytes - plain.first_iteration_peak_bytes
    assert 0 <= grown < 8 * 2**20 < GPT2_LOGITS


def test_checkpointing_returns_no_cache() -> None:
    """transformers turns use_cache off under gradient checkpointing: the logits alone."""
    held = _estimate(True, Checkpointing.FULL)
    lines = {line.key: line.bytes for line in held.lines}
    assert lines.get("previous_outputs", GPT2_LOGITS) == GPT2_LOGITS
    assert any("keep_outputs" in text for text in held.assumptions)
