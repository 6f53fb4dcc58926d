"""An inference forward's events from the template its model's forwards share
(:mod:`app.domain.memory.inference_forward`) against the walk over the layers that builds them
(``allocator_events._forward_events``), on the forwards real estimates build: zoo models,
precisions, batch sizes, runtimes, a tensor-parallel split, one memo for all (so that most
forwards reuse a template stored by another analysis); the warm-up forward from the template
against the walk over its events; and a shape that differs in one layer gets its own
template."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

import app.domain.memory.allocator_events as allocator_events
from app.domain.graph.analysis import GraphAnalysis
from app.domain.memory.allocator_events import _first_gemm, _forward_events, _warm_up_forward
from app.domain.memory.estimate import MemoryRequest, analyze_for, estimate_memory
from app.domain.memory.inference_forward import Template, fill, forward_template
from app.domain.memory.liveness import StoragePlan
from app.domain.memory.repeated_blocks import find_blocks, find_blocks_like
from app.domain.precision import Precision
from app.domain.workload import Mode, Parallelism, Runtime
from app.domain.zoo import ZOO

MODELS = ("gpt-2", "bert-base", "llama-3-8b", "resnet-50", "vit-b-16", "lstm-classifier")
PRECISIONS = (Precision.FP32, Precision.BF16, Precision.INT8)
BATCHES = (1, 3, 16)

Forward = tuple[GraphAnalysis, StoragePlan, Template, list[Any]]


class _Memo(dict[tuple[object, ...], object]):
    """A :class:`~app.domain.memory.memo.PlanMemo` without a bound."""

    def put(self, key: tuple[object, ...], value: object) -> None:
        self[key] = value


@pytest.fixture(scope="module")
def forwards() -> list[Forward]:
    """Every inference forward the grid's estimates build from a template, one memo for all."""
    captured: list[Forward] = []
    original = allocator_events._inference_forward

    def capture(analysis: Any, plan: Any, e: Any) -> Any:
        template, events, sizes = original(analysis, plan, e)
        assert sizes == [size for _, _, size in events]
        captured.append((analysis, plan, template, events))
        return template, events, sizes

    memo = _Memo()
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(allocator_events, "_inference_forward", capture)
        for slug in MODELS:
            model = ZOO[slug]
            for batch in BATCHES:
                for precision in PRECISIONS:
                    requests = [MemoryRequest(mode=Mode.INFERENCE, precision=precision)]
                    if slug in ("gpt-2", "llama-3-8b"):
                        par = Parallelism(tensor=2)
                        requests.append(MemoryRequest(mode=Mode.INFERENCE, parallelism=par))
                    if precision is Precision.FP32:
                        requests.append(MemoryRequest(mode=Mode.INFERENCE, runtime=Runtime.CPU))
                    for request in requests:
                        bindings = {**model.default_bindings, "batch": batch}
                        analysis = analyze_for(model.inputs, model.layers, bindings, request)
                        estimate_memory(analysis, request, plans=memo)
    return captured


def test_filled_template_is_the_walk_over_the_layers(forwards: list[Forward]) -> None:
    """Event for event (kind, key, bytes), and the storages live at the end."""
    assert len(forwards) >= len(MODELS) * len(BATCHES) * len(PRECISIONS)
    for analysis, plan, template, events in forwards:
        walked = _forward_events(analysis, plan, [[] for _ in analysis.layers], False)
        assert events == walked.events
        assert set(template.live) == walked.live
    # precondition: most forwards were filled from a template another analysis stored
    assert len({id(template) for _, _, template, _ in forwards}) < len(forwards) // 4


def test_warm_up_from_the_template_is_the_walk_over_the_events(forwards: list[Forward]) -> None:
    """The warm-up forward (the workspace's place, the frees at its end) is the same."""
    warmed = 0
    for analysis, _, template, events in forwards:
        first_gemm = _first_gemm(analysis)
        if first_gemm is None:
            continue
        warmed += 1
        walked = _warm_up_forward(events, first_gemm, [1 << 20])
        assert _warm_up_forward(events, first_gemm, [1 << 20], template) == walked
    assert warmed
    _, _, template, events = forwards[0]
    assert template.first_alloc(-(1 << 40)) == -1  # no such key: before the first event
    assert _warm_up_forward(events, -(1 << 40), [8], template) == _warm_up_forward(
        events, -(1 << 40), [8]
    )


def test_a_forward_of_another_shape_gets_its_own_template(forwards: list[Forward]) -> None:
    """A plan whose one layer allocates no output (a view) is not filled from the stored
    template of the forward it otherwise equals."""
    analysis, plan, template, _ = forwards[0]
    memo = _Memo()
    assert forward_template(analysis, plan, memo) == template
    stored = memo[("inference forward template", len(analysis.layers))]
    assert forward_template(analysis, plan, memo) is stored  # reused
    index = next(i for i, size in enumerate(plan.out_alloc) if size)
    out_alloc = list(plan.out_alloc)
    out_alloc[index] = 0
    view = dataclasses.replace(plan, out_alloc=out_alloc)
    other = forward_template(analysis, view, memo)
    assert other != template
    walked = _forward_events(analysis, view, [[] for _ in analysis.layers], False)
    assert fill(other, view)[0] == walked.events != fill(template, plan)[0]
    # the same last readers in another order (the order of the frees after a layer)
    reordered = dataclasses.replace(plan, last_use=dict(reversed(plan.last_use.items())))
    assert reordered.last_use == plan.last_use
    again = forward_template(analysis, reordered, memo)
    assert again.shape != template.shape
    walked = _forward_events(analysis, reordered, [[] for _ in analysis.layers], False)
    assert fill(again, reordered)[0] == walked.events


def test_blocks_found_from_the_template_lists_are_the_search_s(forwards: list[Forward]) -> None:
    """Blocks looked up with the template's kinds and keys (shared lists, compared by identity
    first) and the forward's bytes are the forward's own search, in either order, one memo."""
    for order in (forwards, forwards[::-1]):
        memo = _Memo()
        reused = 0
        for _, _, template, events in order:
            sizes = [size for _, _, size in events]
            before = dict(memo)
            found = find_blocks_like(events, memo, (template.kinds, template.keys, sizes))
            assert found == find_blocks(events)
            reused += memo == before
        assert reused >= len(forwards) // 2  # precondition: most forwards reuse a search
