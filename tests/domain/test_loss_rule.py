"""Golden numbers for the loss as PyTorch runs it (app.domain.memory.loss): Hugging Face's
ForCausalLMLoss upcasts the logits to fp32 (a copy at the end of forward), log_softmax keeps
its fp32 output, the loss's backward holds the two fp32 gradients of the log-probabilities
and of the upcast logits, and the loop drops the logits before backward; ``logits_sum``
(``outputs.logits.sum().backward()``) has none of them. Exact bytes derived by hand."""

from __future__ import annotations

from typing import Any

import pytest

from app.domain.graph.analysis import GraphAnalysis, InputDecl, analyze
from app.domain.graph.ops import TensorKind
from app.domain.memory import cuda_allocator, cuda_runtime
from app.domain.memory.cuda_allocator import AllocatorPeaks
from app.domain.memory.estimate import MemoryEstimate, MemoryRequest, estimate_memory
from app.domain.memory.loss import NO_LOSS, loss_tensors
from app.domain.precision import Precision
from app.domain.workload import (
    LossKind,
    Mode,
    Optimizer,
    Runtime,
    TrainingOptionError,
    TrainingOptions,
)
from tests.domain.test_formulas import evaluate

# Embedding(1000, 64) then a Linear(64, 1000) head without bias over 1 x 1,024 tokens, bf16:
# the logits 1,024 x 1,000 = 1,024,000 elements, 2,048,000 B; fp32, 4,096,000 B.
LM = [
    {"name": "embed", "op": "embedding", "num_embeddings": 1000, "embedding_dim": 64},
    {"name": "lm_head", "op": "linear", "out_features": 1000, "bias": False},
]
LOGITS, FP32 = 2_048_000, 4_096_000
# Held at the end of forward besides the logits and the loss: the weights 2 x 64,000 x 2 B;
# ids + labels 2 x 1,024 x 8 B; the embedding's output 1,024 x 64 x 2 B (the head keeps it).
# (The ids the embedding keeps were counted again in the activations until issue 32 counted
# each input once: 8,192 B more in every figure below.)
HELD = 256_000 + 16_384 + 131_072


def _lm() -> GraphAnalysis:
    ids = InputDecl(name="ids", shape=(1, 1024), kind=TensorKind.INDEX)
    return analyze([ids], LM, {}, training=True)


def _request(runtime: Runtime = Runtime.CPU, **kwargs: Any) -> MemoryRequest:
    return MemoryRequest(
        mode=Mode.TRAINING,
        precision=Precision.BF16,
        optimizer=Optimizer.SGD,
        runtime=runtime,
        **kwargs,
    )


def _lines(estimate: MemoryEstimate) -> dict[str, int]:
    return {line.key: line.bytes for line in estimate.lines}


def test_loss_tensors_of_token_logits() -> None:
    analysis = _lm()
    parts = loss_tensors(analysis, LOGITS, FP32)
    assert (parts.upcast_bytes, parts.grad_bytes) == (FP32, FP32)  # 1,024,000 x 4 B each
    # fp32 logits: Tensor.float() returns the tensor itself, no copy
    assert loss_tensors(analysis, FP32, FP32).upcast_bytes == 0
    assert loss_tensors(analysis, LOGITS, 0) == NO_LOSS  # no loss outside the graph


def test_hf_loss_upcast_and_gradients_in_the_breakdown() -> None:
    estimate = estimate_memory(_lm(), _request())
    # the end of forward: the logits, the fp32 log-probabilities and the fp32 copy
    assert estimate.phase_peaks["forward"] == HELD + LOGITS + FP32 + FP32 == 10_643_456
    # the loss's backward: the logits dropped (the loop keeps the loss), the log-probabilities
    # and their two fp32 gradients (nll_loss's, log_softmax's)
    assert estimate.peak_bytes == HELD + FP32 + 2 * FP32 == 12_691_456
    lines = _lines(estimate)
    assert (lines["loss"], lines["transient"]) == (FP32, 2 * FP32)
    assert "outputs" not in lines
    assert any("the logits are freed before backward" in a for a in estimate.assumptions)
    for line in estimate.lines:
        assert evaluate(line.formula) == (line.bytes, line.bytes), (line.key, line.formula)
    # before the rule: the backward held the logits, the log-probabilities and the logits'
    # gradient, 8,862,720 B, and the forward no copy, 6,555,648 B


def test_logits_sum_has_no_loss_tensors() -> None:
    options = TrainingOptions(loss=LossKind.LOGITS_SUM)
    estimate = estimate_memory(_lm(), _request(training_options=options))
    lines = _lines(estimate)
    assert "loss" not in lines
    assert estimate.phase_peaks["forward"] == HELD + LOGITS == 2_451_456
    # the head's backward: the logits (held by ``outputs``) and their gradient, the gradient
    # of the head's input (1,024 x 64 x 2 B) and the head's weight gradient (64,000 x 2 B)
    assert estimate.peak_bytes == HELD + 2 * LOGITS + 131_072 + 128_000 == 4_758_528
    assert lines["outputs"] == LOGITS


def test_the_replay_allocates_the_loss_tensors(monkeypatch: pytest.MonkeyPatch) -> None:
    captured: list[tuple[AllocatorPeaks, AllocatorPeaks]] = []
    replay = cuda_allocator.replay_steady

    def capture(*args: Any, **kwargs: Any) -> tuple[AllocatorPeaks, AllocatorPeaks]:
        captured.append(replay(*args, **kwargs))
        return captured[-1]

    monkeypatch.setattr(cuda_runtime, "replay_steady", capture)
    estimate = estimate_memory(_lm(), _request(Runtime.CUDA))
    steady = captured[-1][1]
    workspaces = _lines(estimate)["workspace"]
    # the replay's peak is the breakdown's moment less the ids the breakdown's activations
    # repeat: the weights, ids and labels, the cuBLAS workspaces, the embedding's output, the
    # log-probabilities and their two fp32 gradients (the logits freed after the loss)
    expected = 256_000 + 16_384 + workspaces + 131_072 + 3 * FP32
    assert steady.requested_bytes == expected == 12_691_456 + workspaces


def test_logits_sum_contradicts_loss_chunks() -> None:
    options = TrainingOptions(loss=LossKind.LOGITS_SUM, loss_chunks=2)
    with pytest.raises(TrainingOptionError) as raised:
        MemoryRequest(mode=Mode.TRAINING, training_options=options)
    assert raised.value.field == "loss"
