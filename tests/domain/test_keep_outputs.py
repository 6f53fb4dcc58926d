"""keep_outputs: a loop that holds ``outputs = model(**batch)`` keeps the previous step's
logits (and a decoder's returned key/value cache) through the next step's forward."""

from __future__ import annotations

from app.domain.memory.estimate import MemoryRequest, analyze_for, estimate_memory
from app.domain.precision import Precision
from app.domain.workload import (
    Attention,
    Checkpointing,
    LossKind,
    Mode,
    Optimizer,
    Runtime,
    TrainingOptions,
)
from app.domain.zoo import ZOO
from app.domain.zoo.transformers import gpt_neox
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


# pythia-410m as transformers wrote GPT-NeoX in mid-2024 (fused q/k/v, fp32 rotary caches)
PYTHIA_TOKENS = 2 * 512
PYTHIA_LOGITS = PYTHIA_TOKENS * 50304 * 2  # fp16 logits
PYTHIA_KEY_FP32 = 24 * PYTHIA_TOKENS * 1024 * 4  # per layer the rotated key, fp32
PYTHIA_QKV = 24 * PYTHIA_TOKENS * 3 * 1024 * 2  # per layer the fused q/k/v the value views


def test_gpt_neox_mid_2024_returns_an_fp32_key_and_a_view_of_the_fused_qkv() -> None:
    """Cluster B's published pythia-410m SDPA peaks were low by 148,270 B a token: the returned
    cache keeps the fp32 rotated key and the whole fused q/k/v storage (6 B x hidden x layers
    = 147,456 B a token more than one K and one V in fp16)."""
    inputs, layers = gpt_neox(
        layers=24, hidden=1024, heads=16, intermediate=4096, vocab=50304, positions=2048
    )
    request = MemoryRequest(
        mode=Mode.TRAINING,
        precision=Precision.FP16,
        optimizer=Optimizer.SGD,
        runtime=Runtime.CUDA,
        attention=Attention.FLASH,
        training_options=TrainingOptions(loss=LossKind.LOGITS_SUM, keep_outputs=True),
    )
    analysis = analyze_for(inputs, layers, {"batch": 2, "seq": 512}, request)
    lines = {line.key: line for line in estimate_memory(analysis, request).lines}
    expected = PYTHIA_LOGITS + PYTHIA_KEY_FP32 + PYTHIA_QKV
    assert expected == 103_022_592 + 100_663_296 + 150_994_944
    assert lines["previous_outputs"].bytes == expected
    assert evaluate(lines["previous_outputs"].formula) == (expected, expected)
    plain_cache = 24 * 2 * PYTHIA_TOKENS * 1024 * 2  # one K and one V in fp16
    assert (PYTHIA_KEY_FP32 + PYTHIA_QKV - plain_cache) // PYTHIA_TOKENS == 147_456
