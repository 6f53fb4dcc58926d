"""Kernel plans: a structure's grouping of layers into kernels, reused for other sizes of the
same graph, must give kernel_counts' kernels, runs and notes; other structures, other sharing of
op results and other views fall back to the walk."""

from __future__ import annotations

import dataclasses

import pytest

from app.domain.graph.analysis import GraphAnalysis, analyze
from app.domain.performance import kernel_plans
from app.domain.performance.kernel_plans import _make_plan, planned_kernel_counts
from app.domain.performance.kernels import kernel_counts
from app.domain.workload import Attention
from app.domain.zoo import ZOO, gpt2

MODEL = gpt2(layers=3, hidden=64, heads=4, vocab=100, positions=256)


def _at(batch: int, seq: int, attention: Attention | None = None) -> GraphAnalysis:
    return analyze(MODEL.inputs, MODEL.layers, {"batch": batch, "seq": seq}, training=False,
                   attention=attention)  # fmt: skip


def _same(analysis: GraphAnalysis, **options: int) -> None:
    planned = planned_kernel_counts(analysis, **options)  # type: ignore[arg-type]
    walked = kernel_counts(analysis, **options)  # type: ignore[arg-type]
    assert tuple(planned) == tuple(walked)
    assert planned.runs() == walked.runs()
    assert planned.notes() == walked.notes()


@pytest.fixture(autouse=True)
def _no_plans() -> None:
    kernel_plans._PLANS.clear()


@pytest.mark.parametrize("attention", [None, Attention.EAGER])
def test_a_plan_counts_other_sizes_as_the_walk(attention: Attention | None) -> None:
    _same(_at(2, 16, attention), kv_cache=True)  # makes the plan
    assert len(kernel_plans._PLANS) == 1
    for batch, seq in ((1, 1), (4, 7), (8, 1)):  # counted from it
        _same(_at(batch, seq, attention), kv_cache=True)
        _same(_at(batch, seq, attention), kv_cache=True, kv_context_tokens=50,
              kv_shared_tokens=20, beam_width=4)  # fmt: skip
        _same(_at(batch, seq, attention))
    _same(_at(3, 5), fuse_elementwise=False)  # another structure: another plan
    assert len(kernel_plans._PLANS) == 2


@pytest.mark.parametrize("slug", sorted(ZOO))
def test_zoo_models_planned_as_walked(slug: str) -> None:
    model = ZOO[slug]
    for batch in (1, 3):
        analysis = analyze(model.inputs, model.layers, {**model.default_bindings, "batch": batch},
                           training=False)  # fmt: skip
        _same(analysis)
        _same(analysis, fuse_elementwise=False)


def test_the_plan_pinned() -> None:
    """GPT-2, 3 blocks: 4 kernels a block (ln_1, attention + add, ln_2, MLP + add), then ln_f
    and the head. Kernels made of the same op results and reading the same op results' outputs
    form a class: block 0 reads the embeddings' dropout where blocks 1 and 2 read the previous
    MLP + add, so its ln_1 and attention are classes of their own (runs merge equal figures)."""
    plan = _make_plan(_at(2, 8), fuse_elementwise=True)
    assert plan is not None
    assert len(plan.heads) == 2 + 3 * 4 + 2
    assert plan.runs == ((0, 1), (1, 1), (2, 1), (3, 1), (4, 3), (5, 3), (6, 2), (7, 2),
                         (14, 1), (15, 1))  # fmt: skip
    # h.0.attn (layer 4) + h.0.attn_add (6): reads ln_1's output (3) and the dropout's (2)
    assert plan.recipes[3] == (4, ("attention", "add"), (6,), (3, 2), (), 6)
    assert plan.aliased == (2, 5, 9, 13, 17, 21, 25)  # the dropouts (8 layers a block): views
    assert all(plan.views)


def test_less_sharing_falls_back_to_the_walk() -> None:
    """Op results shared less than in the planned analysis (a copy of one): walked."""
    planned_kernel_counts(_at(2, 8))
    analysis = _at(4, 8)
    layers = list(analysis.layers)
    target = next(i for i, layer in enumerate(layers) if layer.op == "attention")
    layers[target] = layers[target]._replace(result=dataclasses.replace(layers[target].result))
    copied = dataclasses.replace(analysis, layers=tuple(layers))
    plan = next(iter(kernel_plans._PLANS.values()))
    results = [layer.result for layer in copied.layers]
    assert any(results[r] is not results[i] for i, r in enumerate(plan.rep))
    _same(copied, kv_cache=True, kv_context_tokens=9)


def test_shared_tokens_beyond_the_context_are_refused_from_a_plan() -> None:
    from app.domain.performance.errors import RooflineInputError

    planned_kernel_counts(_at(2, 8))
    with pytest.raises(RooflineInputError, match="kv_shared_tokens"):
        planned_kernel_counts(_at(2, 1), kv_cache=True, kv_context_tokens=3, kv_shared_tokens=4)


def test_other_views_fall_back_to_the_walk() -> None:
    """A layer aliasing its input that runs FLOPs (an in-place op, not a view): walked."""
    planned_kernel_counts(_at(2, 8))
    analysis = _at(4, 8)
    layers = list(analysis.layers)
    for target in (5, 9):  # dropouts after the first block's attention and MLP
        assert layers[target].op == "dropout"
        busy = dataclasses.replace(layers[target].result, flops=7)
        layers[target] = layers[target]._replace(result=busy)
    _same(dataclasses.replace(analysis, layers=tuple(layers)))


def test_large_graphs_are_walked_without_a_plan(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(kernel_plans, "PLAN_MAX_LAYERS", 10)
    _same(_at(2, 8))
    _same(_at(3, 8))
    assert not kernel_plans._PLANS
