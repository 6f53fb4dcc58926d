"""Golden numbers for the allocator replay's events under the options that change what the GPU
holds: full checkpointing, activation offloading and ZeRO-3 CPU offload. Bytes derived by hand
in each test; the replay's peaks are read where the estimate runs it."""

from __future__ import annotations

from typing import Any

import pytest

import app.domain.memory.cuda_allocator as cuda_allocator
import app.domain.memory.cuda_runtime as engine
from app.domain.graph.analysis import GraphAnalysis, InputDecl, analyze
from app.domain.memory.cuda_allocator import AllocatorPeaks
from app.domain.memory.estimate import MemoryEstimate, MemoryRequest, estimate_memory
from app.domain.precision import Precision
from app.domain.workload import Checkpointing, Mode, Optimizer, Runtime

MIB = 1 << 20
WORKSPACES = 2 * 32 * MIB  # training: two cuBLAS handles, 32 MiB each (the default)


def _replayed(
    monkeypatch: pytest.MonkeyPatch, analysis: GraphAnalysis, request: MemoryRequest
) -> tuple[MemoryEstimate, tuple[AllocatorPeaks, AllocatorPeaks]]:
    """The estimate and the replay's (first, steady) peaks."""
    captured: list[tuple[AllocatorPeaks, AllocatorPeaks]] = []
    original = cuda_allocator.replay_steady

    def capture(*args: Any, **kwargs: Any) -> tuple[AllocatorPeaks, AllocatorPeaks]:
        captured.append(original(*args, **kwargs))
        return captured[-1]

    monkeypatch.setattr(engine, "replay_steady", capture)
    estimate = estimate_memory(analysis, request)
    assert len(captured) == 1
    return estimate, captured[0]


# --- full checkpointing ----------------------------------------------------------------------

# Four blocks of Linear(256, 256, bias=False) then Dropout(0.1), a Linear(256, 256) head, on a
# [4096, 256] fp32 input: every value 4096 x 256 x 4 = 4 MiB, a dropout mask 4096 x 256 x 1 B
# = 1 MiB, a weight 256 x 256 x 4 = 256 KiB.
BLOCKS = [
    layer
    for i in range(4)
    for layer in (
        {"name": f"layers.{i}.fc", "op": "linear", "out_features": 256, "bias": False},
        {"name": f"layers.{i}.drop", "op": "dropout", "p": 0.1},
    )
] + [{"name": "head", "op": "linear", "out_features": 256, "bias": False}]
VALUE, MASK, WEIGHT = 4 * MIB, MIB, 256 * 1024


def _blocks() -> GraphAnalysis:
    return analyze([InputDecl(name="x", shape=(4096, 256))], BLOCKS, {}, training=True)


def test_full_checkpointing_keeps_no_dropout_mask_in_forward(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """torch.utils.checkpoint stores nothing a checkpointed block's ops save (non-reentrant:
    a placeholder per saved tensor; reentrant: no_grad): the four dropout masks are not held
    from the forward to their backward, only the block being recomputed has its mask."""
    request = MemoryRequest(
        mode=Mode.TRAINING,
        precision=Precision.FP32,
        optimizer=Optimizer.SGD,
        checkpointing=Checkpointing.FULL,
        runtime=Runtime.CUDA,
    )
    _, (_, steady) = _replayed(monkeypatch, _blocks(), request)
    # The steady step's peak: the head's backward, as its weight's gradient is allocated.
    expected = (
        5 * WEIGHT  # four blocks' and the head's weights
        + VALUE  # x (the caller's input)
        + 4096 * 8  # int64 labels
        + WORKSPACES
        + 3 * VALUE  # the inputs of blocks 1..3 (the outputs of blocks 0..2), kept
        + VALUE  # the head's input (block 3's output), kept by the head
        + VALUE  # the logits, held by the caller
        + VALUE  # the loss's saved tensor (loss_bytes: one logits-sized value)
        + VALUE  # the gradient of the logits
        + VALUE  # the gradient of the head's input
        + WEIGHT  # the head's weight gradient
    )
    assert expected == 106_463_232
    # Before: the forward allocated every block's mask (kept to its backward): + 4 x 1 MiB.
    assert steady.requested_bytes == expected
