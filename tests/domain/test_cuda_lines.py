"""Golden tests (issue 32): the CUDA context table, eager attention's saved tensors on CUDA and
the reserve's explanation."""

from __future__ import annotations

import pytest

from app.domain.cuda_context import CONTEXT_TABLE, ModuleLoading, cuda_context, loading_for
from app.domain.graph.analysis import analyze
from app.domain.graph.ops import Storage
from app.domain.memory.cuda_allocator import AllocatorPeaks
from app.domain.memory.estimate import MemoryRequest, analyze_for, estimate_memory
from app.domain.memory.reserve import (
    ReservePoint,
    explain_reserve,
    monotone_report,
    reserve_bound,
)
from app.domain.precision import ComputeCapability, Precision
from app.domain.units import MIB
from app.domain.workload import Attention, Mode, Runtime
from app.domain.zoo import gpt2


@pytest.mark.parametrize(
    ("capability", "cuda_major", "loading", "mib", "gpu"),
    [
        (None, 12, ModuleLoading.LAZY, 400, "unnamed"),  # the default: CUDA 12, lazy
        (ComputeCapability(9, 0), 12, ModuleLoading.LAZY, 400, "unnamed"),  # no H100 figure
        (ComputeCapability(8, 6), 12, ModuleLoading.LAZY, 256, "RTX 3090"),
        (ComputeCapability(8, 6), 13, ModuleLoading.LAZY, 256, "RTX 3090"),  # CUDA 12's row
        # measured here (benchmarks/fidelity/cuda/cuda_measurements_3.json, torch 2.11+cu130)
        (ComputeCapability(9, 0), 13, ModuleLoading.LAZY, 767, "H100 80GB HBM3"),
        (ComputeCapability(8, 0), 13, ModuleLoading.LAZY, 400, "unnamed"),  # any GPU, CUDA 12
        (ComputeCapability(7, 0), 11, ModuleLoading.EAGER, 1343, "V100 16 GB"),  # issue 32
        (ComputeCapability(7, 5), 10, ModuleLoading.EAGER, 1005, "Titan V (sm70)"),  # sm7x
        (ComputeCapability(8, 0), 11, ModuleLoading.LAZY, 274, "unnamed"),  # PR #86509
        (ComputeCapability(8, 0), 10, ModuleLoading.LAZY, 1343, "the largest"),  # read eager
    ],
)
def test_the_context_table_picks_the_gpu_then_its_generation_then_any(
    capability: ComputeCapability | None,
    cuda_major: int,
    loading: ModuleLoading,
    mib: int,
    gpu: str,
) -> None:
    choice = cuda_context(capability, cuda_major=cuda_major, loading=loading)
    assert choice.context_bytes == mib * MIB
    assert choice.figure.gpu.startswith(gpu)
    assert choice.source.startswith("CUDA context table: ")
    assert f"{mib:,} MiB" in choice.assumption
    assert "Lazy Loading" in choice.assumption  # NVIDIA's documentation is cited


def test_every_context_figure_names_a_source_and_lazy_starts_at_cuda_11_7() -> None:
    assert all(f.source and f.context_bytes > 0 for f in CONTEXT_TABLE)
    lazy = [f.context_bytes for f in CONTEXT_TABLE if f.loading is ModuleLoading.LAZY]
    eager = [f.context_bytes for f in CONTEXT_TABLE if f.loading is ModuleLoading.EAGER]
    assert max(lazy) < min(eager)  # lazy loading is the smaller context everywhere published
    assert loading_for((11, 6)) is ModuleLoading.EAGER
    assert loading_for((11, 7)) is ModuleLoading.LAZY


def _attention_saved(
    precision: Precision, runtime: Runtime, dropout: float = 0.0
) -> dict[str, tuple[int, Storage]]:
    model = gpt2(layers=1, hidden=64, heads=4, vocab=100, positions=64, dropout=dropout)
    analysis = analyze(
        model.inputs,
        model.layers,
        {"batch": 2, "seq": 33},
        training=True,
        attention=Attention.EAGER,
        runtime=runtime,
        precision=precision,
    )
    (layer,) = [layer for layer in analysis.layers if layer.op == "attention"]
    return {s.label: (s.numel, s.storage) for s in layer.result.saved}


SCORES = 2 * 4 * 33 * 33  # batch x heads x S x S


@pytest.mark.parametrize("precision", [Precision.FP16, Precision.BF16, Precision.AMP_BF16])
def test_eager_attention_on_cuda_keeps_the_fp32_softmax_and_its_cast_copy(
    precision: Precision,
) -> None:
    saved = _attention_saved(precision, Runtime.CUDA)
    assert saved["probs"] == (SCORES, Storage.FP32)  # softmax(..., dtype=float32)'s output
    assert saved["probs_cast"] == (SCORES, Storage.ACT)  # .to(query.dtype), kept by P x V
    assert "probs_mask" not in saved


def test_eager_attention_with_dropout_keeps_the_mask_and_the_dropped_copy_not_the_cast() -> None:
    saved = _attention_saved(Precision.FP16, Runtime.CUDA, dropout=0.1)
    assert saved["probs"] == (SCORES, Storage.FP32)
    assert saved["probs_mask"] == (SCORES, Storage.MASK)  # 1 B bool on CUDA
    assert saved["probs_dropped"] == (SCORES, Storage.ACT)
    assert "probs_cast" not in saved  # dropout's backward needs only its mask


@pytest.mark.parametrize(
    ("precision", "runtime"),
    [(Precision.FP32, Runtime.CUDA), (Precision.TF32, Runtime.CUDA), (Precision.FP16, Runtime.CPU)],
)
def test_no_cast_copy_at_fp32_compute_nor_on_cpu(precision: Precision, runtime: Runtime) -> None:
    saved = _attention_saved(precision, runtime)
    assert "probs_cast" not in saved  # fp32: a no-op cast; CPU: the measured rule stays


def test_the_cast_copy_adds_two_bytes_per_score_per_layer_to_the_cuda_peak() -> None:
    model = gpt2(layers=2, hidden=64, heads=4, vocab=100, positions=256, dropout=0.0)
    peaks = {}
    for attention in (Attention.EAGER, Attention.FLASH):
        request = MemoryRequest(mode=Mode.TRAINING, precision=Precision.FP16, attention=attention)
        analysis = analyze_for(model.inputs, model.layers, {"batch": 2, "seq": 256}, request)
        result = estimate_memory(analysis, request)
        assert result.cuda is not None
        peaks[attention] = result.cuda.allocated_bytes
    scores = 2 * 4 * 256 * 256
    # eager keeps at least fp32 probs (4 B) + the fp16 copy (2 B) per score in each of 2 layers
    assert peaks[Attention.EAGER] - peaks[Attention.FLASH] >= 2 * 6 * scores * 9 // 10


def test_the_reserve_is_explained_step_by_step_with_its_floor() -> None:
    first = AllocatorPeaks(
        requested_bytes=100 * MIB, allocated_bytes=101 * MIB, reserved_bytes=120 * MIB, segments=4
    )
    steady = AllocatorPeaks(
        requested_bytes=150 * MIB + 1,
        allocated_bytes=151 * MIB,
        reserved_bytes=180 * MIB,
        segments=6,
    )
    bound = reserve_bound(steady)
    assert bound.floor_bytes == 152 * MIB  # 151 MiB up to whole 2 MiB pages
    assert bound.cached_bytes == 29 * MIB
    assert bound.fragmentation_bytes == 28 * MIB
    lines = explain_reserve(first, steady, expandable=False, workspace_bytes=64 * MIB)
    assert [line.split(",")[0] for line in lines] == [
        "reserved step 1",
        "reserved step 2",
        "reserved step 3",
        "reserved step 4",
        "reserved bound: at least the allocated peak rounded up to whole 2 MiB pages",
    ]
    assert "CUDACachingAllocator.cpp" in lines[0]
    assert "20 MiB segments (kLargeBuffer)" in lines[1]
    assert f"{180 * MIB:,} B reserved = {151 * MIB:,} B allocated + {29 * MIB:,} B" in lines[2]
    assert "No upper bound: a request no cached block holds maps a new segment" in lines[4]


def test_a_fall_in_reserved_while_allocated_grows_is_reported_with_its_reason() -> None:
    points = [
        ReservePoint(label=f"S={s}", allocated_bytes=a * MIB, reserved_bytes=r * MIB, segments=n)
        for s, a, r, n in ((512, 100, 130, 9), (1024, 110, 120, 7), (2048, 120, 140, 8))
    ]
    (line,) = monotone_report(points)
    assert line.startswith("S=512 -> S=1024: allocated grows")
    assert "30.0 MiB to 10.0 MiB" in line
    assert monotone_report(points[1:]) == []


def test_a_cuda_estimate_prints_the_reserve_explanation_on_its_line() -> None:
    model = gpt2(layers=2, hidden=64, heads=4, vocab=100, positions=64, dropout=0.0)
    request = MemoryRequest(mode=Mode.TRAINING, precision=Precision.FP16)
    analysis = analyze_for(model.inputs, model.layers, {"batch": 2, "seq": 16}, request)
    result = estimate_memory(analysis, request)
    (line,) = [line for line in result.lines if line.key == "fragmentation_reserve"]
    assert sum(note.startswith("reserved step") for note in line.assumptions) == 4
    assert result.cuda is not None
    reserve = result.cuda.reserved_bytes - result.cuda.allocated_bytes
    assert line.bytes == reserve
