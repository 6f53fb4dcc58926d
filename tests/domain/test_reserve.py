"""The reserve over allocated, taken apart (app.domain.memory.reserve): golden bytes for a hand
sequence, the identity reserved = allocated peak + cached at it + mapped after it on a real
step, and the sequence that shows no upper bound follows from the allocated peak."""

from __future__ import annotations

from typing import Any

import pytest

from app.domain.graph.analysis import InputDecl, analyze
from app.domain.graph.ops import TensorKind
from app.domain.memory import cuda_allocator, cuda_runtime
from app.domain.memory.cuda_allocator import AllocatorPeaks, CachingAllocator, Event
from app.domain.memory.estimate import MemoryRequest, estimate_memory
from app.domain.memory.reserve import NO_UPPER_BOUND, anatomy_lines, reserve_anatomy
from app.domain.precision import Precision
from app.domain.units import MIB
from app.domain.workload import Mode, Optimizer, Runtime


def test_growing_requests_reserve_their_sum() -> None:
    """k requests of 10, 12, 14, ... MiB, each freed before the next: no cached block fits the
    next one (best fit, no block moves, segments of one request >= 10 MiB), so every request
    maps its own segment. Reserved is the sum, allocated the largest: the ratio grows with k."""
    ratios = []
    for k in (8, 16):
        allocator = CachingAllocator()
        for i in range(k):
            allocator.free(allocator.malloc((10 + 2 * i) * MIB))
        peaks = allocator.peaks()
        assert peaks.allocated_bytes == (10 + 2 * (k - 1)) * MIB
        assert peaks.reserved_bytes == (10 * k + k * (k - 1)) * MIB
        ratios.append(peaks.reserved_bytes / peaks.allocated_bytes)
    # 8: 136 MiB over 24 MiB; 16: 400 MiB over 40 MiB
    assert ratios == [136 / 24, 400 / 40]
    assert "without limit" in NO_UPPER_BOUND


def test_anatomy_of_a_hand_sequence() -> None:
    """A 1,000 B tensor kept (a 2 MiB small segment, 1,024 B allocated); a = 30 MiB (its own
    segment S0), freed; b = 12 MiB split off S0 (18 MiB stay cached there); c = 24 MiB: the
    18 MiB block does not hold it, a new segment S1: the allocated peak, 36 MiB + 1,024 B.
    Then b and c are freed and d = 32 MiB fits no cached block (S0's 30, S1's 24): a segment
    mapped after the peak."""
    events: list[Event] = [
        ("keep", (1000,), 0),
        ("alloc", "a", 30 * MIB),
        ("free", "a", 0),
        ("alloc", "b", 12 * MIB),
        ("alloc", "c", 24 * MIB),
        ("free", "b", 0),
        ("free", "c", 0),
        ("alloc", "d", 32 * MIB),
    ]
    anatomy = reserve_anatomy(events, 0)
    assert anatomy is not None
    assert anatomy.allocated_bytes == 36 * MIB + 1024 == 37_749_760
    assert anatomy.peak_request_bytes == 24 * MIB
    kinds = {kind.kind: kind for kind in anatomy.kinds}
    assert (kinds["small"].segments, kinds["small"].free_bytes) == (1, 2 * MIB - 1024)
    assert kinds["large_buffer"].segments == 0
    assert (kinds["exact"].segments, kinds["exact"].mapped_bytes) == (2, 54 * MIB)
    assert (kinds["exact"].free_bytes, kinds["exact"].free_blocks) == (18 * MIB, 1)
    assert anatomy.after_peak == (32 * MIB,)
    # reserved = allocated peak + cached at the peak + mapped after it = 88 MiB
    assert (
        anatomy.reserved_bytes
        == 88 * MIB
        == (anatomy.allocated_bytes + anatomy.cached_at_peak_bytes + sum(anatomy.after_peak))
    )
    assert cuda_allocator.replay(events).reserved_bytes == anatomy.reserved_bytes
    lines = anatomy_lines(anatomy)
    assert lines[-1].startswith(
        "4. max_memory_reserved = 37,749,760 + 20,970,496 + 33,554,432 = 92,274,688 B"
    )


def test_anatomy_matches_the_estimates_replay(monkeypatch: pytest.MonkeyPatch) -> None:
    """On a training step's events (an LM over 1,024 bf16 tokens, as tests/domain/
    test_loss_rule.py), the anatomy's steady peaks are the replay's and its three terms add
    up to the reserve."""
    captured: list[tuple[list[Event], int, tuple[AllocatorPeaks, AllocatorPeaks]]] = []
    replay = cuda_allocator.replay_steady

    def capture(events: Any, steady_from: int, **kwargs: Any) -> Any:
        peaks = replay(events, steady_from, **kwargs)
        captured.append((list(events), steady_from, peaks))
        return peaks

    monkeypatch.setattr(cuda_runtime, "replay_steady", capture)
    layers = [
        {"name": "embed", "op": "embedding", "num_embeddings": 1000, "embedding_dim": 64},
        {"name": "lm_head", "op": "linear", "out_features": 1000, "bias": False},
    ]
    ids = InputDecl(name="ids", shape=(2, 1024), kind=TensorKind.INDEX)
    request = MemoryRequest(
        mode=Mode.TRAINING,
        precision=Precision.BF16,
        optimizer=Optimizer.SGD,
        runtime=Runtime.CUDA,
    )
    estimate_memory(analyze([ids], layers, {}, training=True), request)
    events, steady_from, (_, steady) = captured[-1]
    anatomy = reserve_anatomy(events, steady_from)
    assert anatomy is not None
    assert anatomy.allocated_bytes == steady.allocated_bytes
    assert anatomy.reserved_bytes == steady.reserved_bytes
    assert anatomy.reserved_bytes == (
        anatomy.allocated_bytes + anatomy.cached_at_peak_bytes + sum(anatomy.after_peak)
    )
