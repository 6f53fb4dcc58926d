"""kernel_counts: the kernels of count_kernels kept as rows, each KernelCount built when read,
with runs and notes found from the rows (pins, and the same answers as the KernelCount path)."""

from __future__ import annotations

from dataclasses import fields

import pytest

from app.domain.graph.analysis import GraphAnalysis, InputDecl, analyze
from app.domain.performance.kernels import (
    KernelCount,
    KernelCounts,
    _head_figures,
    count_kernels,
    kernel_counts,
)
from app.domain.performance.phases import PhaseShape
from app.domain.performance.tiling import Gemm
from app.domain.workload import Attention
from app.domain.zoo import gpt2

MODEL = gpt2(layers=2, hidden=64, heads=4, vocab=100, positions=256)


def _at(batch: int, seq: int, attention: Attention | None = None) -> GraphAnalysis:
    return analyze(
        MODEL.inputs,
        MODEL.layers,
        {"batch": batch, "seq": seq},
        training=False,
        attention=attention,
    )


def _figures(count: KernelCount) -> tuple[object, ...]:
    return tuple(getattr(count, f.name) for f in fields(KernelCount))


def _shape(counts: tuple[KernelCount, ...] | KernelCounts) -> PhaseShape:
    return PhaseShape(name="decode", counts=counts, h2d_float=0, h2d_index=0, d2h_float=0,
                      d2h_index=0)  # fmt: skip


@pytest.mark.parametrize(
    "options",
    [
        {},
        {"fuse_elementwise": False},
        {"kv_cache": True},
        {"kv_cache": True, "kv_context_tokens": 40, "kv_shared_tokens": 30, "beam_width": 3},
    ],
)
@pytest.mark.parametrize("attention", [None, Attention.EAGER])
def test_kernel_counts_read_as_count_kernels(
    options: dict[str, int], attention: Attention | None
) -> None:
    analysis = _at(3, 5, attention)
    lazy = kernel_counts(analysis, **options)  # type: ignore[arg-type]
    eager = count_kernels(analysis, **options)  # type: ignore[arg-type]
    assert len(lazy) == len(eager)
    assert lazy[0] == eager[0]
    assert lazy[-1] == eager[-1]
    assert lazy[1:3] == eager[1:3]
    assert lazy == eager
    assert eager == lazy
    assert tuple(lazy) == eager
    assert hash(lazy) == hash(eager)
    assert repr(lazy) == repr(eager)
    # runs and notes from the rows: as grouping the KernelCounts by their figures
    assert _shape(lazy).runs == _shape(eager).runs
    assert _shape(lazy).notes == _shape(eager).notes
    with pytest.raises(IndexError):
        lazy[len(eager)]


def test_kernel_counts_pinned() -> None:
    """GPT-2 (2 blocks, hidden 64) decoding 3 rows at a context of 40, eager attention (the
    figures count_kernels gave before kernel_counts)."""
    counts = kernel_counts(_at(3, 1, Attention.EAGER), kv_cache=True, kv_context_tokens=40)
    assert [c.name for c in counts] == [
        "wte", "wpe", "h.0.ln_1", "h.0.attn", "h.0.ln_2", "h.0.mlp",
        "h.1.ln_1", "h.1.attn", "h.1.ln_2", "h.1.mlp", "ln_f", "lm_head",
    ]  # fmt: skip
    attn = counts[3]
    assert attn.ops == ("attention", "add")
    assert (attn.flops, attn.weight_elements, attn.kv_elements) == (130_044, 16_640, 15_744)
    assert (attn.float_inputs, attn.float_outputs, attn.launches) == (384, 192, 5)
    assert (attn.spilled_fp32, attn.heads, attn.kv_heads) == (1_968, 4, 4)
    assert attn.gemms[-1] == Gemm(m=3, n=64, k=41, count=1, flops=31_548)
    # the layer norms (ln_1, ln_2, ln_f) are alike
    assert _shape(counts).runs == ((0, 1), (1, 1), (2, 5), (3, 2), (5, 2), (11, 1))
    assert counts.runs() == _shape(counts).runs
    assert counts.notes() == (
        "eager attention writes and reads back its S x S scores and probabilities: 1,968 "
        "elements moved per layer (1 queries x 41 keys per head, twice each; flash / "
        "mem_efficient keep them on chip)",
    )


def test_runs_merge_kernels_of_distinct_heads_with_equal_figures() -> None:
    """Two linear layers of the same shape are two op results (two heads) but alike kernels:
    one run, as grouping the KernelCounts finds."""
    layers = [
        {"name": "a", "op": "linear", "out_features": 16},
        {"name": "b", "op": "linear", "out_features": 16},
        {"name": "c", "op": "linear", "out_features": 8},
    ]
    analysis = analyze((InputDecl(name="x", shape=("batch", 16)),), layers, {"batch": 2},
                       training=False)  # fmt: skip
    counts = kernel_counts(analysis)
    assert analysis.layers[0].result is not analysis.layers[1].result
    assert counts.runs() == ((0, 2), (2, 1)) == _shape(count_kernels(analysis)).runs
    assert [_figures(c)[1:] for c in counts][0] == [_figures(c)[1:] for c in counts][1]


def test_head_figures_of_a_decode_attention() -> None:
    """The kernel an attention layer heads, at a context of 40 tokens: its own FLOPs plus
    4 x tokens x context x q_dim, this step's keys and values plus the cached ones."""
    analysis = _at(3, 1)
    layer = next(layer for layer in analysis.layers if layer.op == "attention")
    ops, notes, flops, weights, kv, fp32, act, launches, gemms, heads, kv_heads = _head_figures(
        layer, kv_cache=True, kv_context_tokens=40, kv_shared_tokens=0, beam_width=1
    )
    assert ops == ("attention",)
    assert notes == ()
    assert flops == layer.flops + 4 * 3 * 40 * 64
    assert kv == layer.result.kv_cache_numel * 41
    assert (weights, fp32, act, launches, heads, kv_heads) == (16_640, 0, 0, 5, 4, 4)
    assert len(gemms) == 5
    assert gemms[-1].k == 41
