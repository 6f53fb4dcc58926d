"""Kernel plans: which layers of a graph's structure form which kernels, found once per
structure and reused for every batch size and context a search prices (pure).

:func:`app.domain.performance.kernels.kernel_counts` walks every layer of an analysis in Python
(GPT-3 175B: 773 layers, 388 kernels), and a cold recommendation counts 18 analyses of one model
that differ only in their sizes (9 batch sizes, a prefill and a decode step each). Which layers
fuse into which kernel, and which tensors each kernel reads, depend on the structure only: the
layers' ops, input and output storages, output kinds and view flags. A :class:`_Plan` records
that grouping by layer index, with the kernels that must have equal figures because they are
made of the same op results (the repeats of a block share theirs, app.domain.graph.analysis), so
a later analysis of the same structure is counted from one kernel per class. Reading the
structure of an analysis is a few C-level passes over its layers; a plan is used only when the
structure is equal to the plan's and the op results are shared at least as in the analysis the
plan was made from, else the layers are walked (:func:`kernel_counts`). The figures are the
same in every case: the same sums of the same integers (a layer's output elements are fixed by
its op result: ``prod(result.shape)``).
"""

from __future__ import annotations

from operator import is_, itemgetter
from typing import NamedTuple

from app.domain.graph.analysis import GraphAnalysis
from app.domain.graph.ops import TensorKind
from app.domain.graph.traits import FUSABLE_EPILOGUE_OPS
from app.domain.performance.kernels import (
    KernelCounts,
    _Head,
    _head_figures,
    _Key,
    check_shared_tokens,
    kernel_counts,
)

# op, input storages, output kind, output storage, allocates its output (no alias)
_STRUCTURE = tuple(itemgetter(i) for i in (1, 3, 5, 6, 7))
_RESULT = itemgetter(8)
# A kernel of a plan: its head layer, ops, fused layers, float and index sources (a layer's
# index, or -1 - k for model input k), and the layer whose output it writes
_Recipe = tuple[int, tuple[str, ...], tuple[int, ...], tuple[int, ...], tuple[int, ...], int]


class _Plan(NamedTuple):
    """How the layers of one structure form kernels (layer indices of the planned analysis)."""

    aliased: tuple[int, ...]  # layers that alias an input
    views: list[bool]  # and whether each is a view (no FLOPs): moves nothing
    rep: list[int]  # per layer: the first layer with the same op result
    heads: list[int]  # per kernel: its head layer
    classes: list[int]  # per kernel: its class (kernels of one class have equal figures)
    recipes: tuple[_Recipe, ...]  # per class: how its first kernel is made
    runs: tuple[tuple[int, int], ...]  # per class: (first kernel, kernels)


_PLANS: dict[tuple[object, ...], _Plan] = {}
_PLANS_KEPT = 32  # structures remembered (a model's prefill and decode; cleared when full)
# Larger graphs are walked every time: a plan and its key hold a few entries per layer, kept
# after the request (GPT-3 175B has 773 layers; a 99,999-iteration repeat would have 10^5+)
PLAN_MAX_LAYERS = 20_000


def clear_plans() -> None:
    """Forget every plan (they are pure: only speed changes; a cold benchmark starts empty)."""
    _PLANS.clear()


def _make_plan(analysis: GraphAnalysis, fuse_elementwise: bool) -> _Plan | None:
    """The plan of ``analysis``: :func:`kernel_counts`' walk, recording layer indices (None
    when a layer's ``allocates_output`` does not say whether its op result aliases an input,
    which the plan's check of views relies on; ``analyze`` always says it)."""
    layers = analysis.layers
    if any((layer.result.alias_of is None) is not layer.allocates_output for layer in layers):
        return None
    index_kind = TensorKind.INDEX
    fusable = FUSABLE_EPILOGUE_OPS if fuse_elementwise else frozenset[str]()
    writer = {item.storage: -1 - k for k, item in enumerate(analysis.inputs)}  # last writer
    input_is_index = [item.kind is index_kind for item in analysis.inputs]
    rows: list[tuple[int, list[str], list[int], list[int], list[int], list[int]]] = []
    open_storage: int | None = None
    for j, (_, op, _, storages, _, _, storage, _, result, _) in enumerate(layers):
        if result.alias_of is not None and result.flops == 0:  # a view: moves nothing
            writer[storage] = j
            continue
        if open_storage is not None and op in fusable and open_storage in storages:
            chained = storages.index(open_storage)
            row = rows[-1]
            row[1].append(op)
            row[2].append(j)
            sources = [s for position, s in enumerate(storages) if position != chained]
        else:
            row = (j, [op], [], [], [], [j])
            rows.append(row)
            sources = list(storages)
        for storage_read in sources:
            w = writer.get(storage_read)
            if w is None:  # never written: read as nothing, as kernel_counts does
                continue
            is_index = layers[w].output_kind is index_kind if w >= 0 else input_is_index[-1 - w]
            (row[4] if is_index else row[3]).append(w)
        row[5][0] = j
        writer[storage] = j
        open_storage = storage
    first: dict[int, int] = {}
    rep = [first.setdefault(x, i) for i, x in enumerate(map(id, map(_RESULT, layers)))]

    def same(source: int) -> int:
        return rep[source] if source >= 0 else source

    class_of: dict[tuple[object, ...], int] = {}
    recipes: list[_Recipe] = []
    classes: list[int] = []
    runs: list[list[int]] = []
    for index, (head, ops, fused, floats, indexes, (last,)) in enumerate(rows):
        made_of = (rep[head], tuple(ops), tuple(map(same, fused)), tuple(map(same, floats)),
                   tuple(map(same, indexes)), rep[last])  # fmt: skip
        found = class_of.get(made_of)
        if found is None:
            found = class_of[made_of] = len(recipes)
            recipes.append((head, tuple(ops), tuple(fused), tuple(floats), tuple(indexes), last))
            runs.append([index, 0])
        runs[found][1] += 1
        classes.append(found)
    aliased = tuple(j for j, layer in enumerate(layers) if not layer.allocates_output)
    return _Plan(
        aliased=aliased,
        views=[not layers[j].result.flops for j in aliased],
        rep=rep,
        heads=[row[0] for row in rows],
        classes=classes,
        recipes=tuple(recipes),
        runs=tuple((first_kernel, count) for first_kernel, count in runs),
    )


def planned_kernel_counts(
    analysis: GraphAnalysis,
    *,
    fuse_elementwise: bool = True,
    kv_cache: bool = False,
    kv_context_tokens: int = 0,
    kv_shared_tokens: int = 0,
    beam_width: int = 1,
) -> KernelCounts:
    """:func:`kernel_counts`, from the plan of the analysis's structure when one fits (the
    same kernels, figures and runs)."""

    def walked() -> KernelCounts:
        return kernel_counts(
            analysis,
            fuse_elementwise=fuse_elementwise,
            kv_cache=kv_cache,
            kv_context_tokens=kv_context_tokens,
            kv_shared_tokens=kv_shared_tokens,
            beam_width=beam_width,
        )

    layers = analysis.layers
    if len(layers) > PLAN_MAX_LAYERS:
        return walked()
    structure = (
        fuse_elementwise,
        tuple([(item.storage, item.kind) for item in analysis.inputs]),
        *(tuple(map(get, layers)) for get in _STRUCTURE),
    )
    results = list(map(_RESULT, layers))
    plan = _PLANS.get(structure)
    if plan is None:
        counts = walked()
        if len(_PLANS) >= _PLANS_KEPT:
            _PLANS.clear()
        made = _make_plan(analysis, fuse_elementwise)
        if made is not None:
            _PLANS[structure] = made
        return counts
    if [not results[j].flops for j in plan.aliased] != plan.views or not all(
        map(is_, map(results.__getitem__, plan.rep), results)
    ):  # other views, or op results shared less than in the planned analysis
        return walked()
    check_shared_tokens(kv_context_tokens, kv_shared_tokens)
    index_kind = TensorKind.INDEX
    inputs = [item.numel for item in analysis.inputs]
    head_of: dict[int, int] = {}
    heads: list[_Head] = []
    keys: list[_Key] = []
    for head, ops, fused, floats, indexes, last in plan.recipes:
        layer = layers[head]
        found = head_of.get(id(layer.result))
        if found is None:
            found = head_of[id(layer.result)] = len(heads)
            heads.append(
                _head_figures(
                    layer,
                    kv_cache=kv_cache,
                    kv_context_tokens=kv_context_tokens,
                    kv_shared_tokens=kv_shared_tokens,
                    beam_width=beam_width,
                )
            )
        _, _, flops, weights = heads[found][:4]
        for j in fused:
            flops += results[j].flops
            weights += results[j].params
        float_in = sum([layers[s].output_numel if s >= 0 else inputs[-1 - s] for s in floats])
        index_in = sum([layers[s].output_numel if s >= 0 else inputs[-1 - s] for s in indexes])
        written = layers[last]
        out = written.output_numel
        float_out, index_out = (0, out) if written.output_kind is index_kind else (out, 0)
        keys.append((found, ops, flops, weights, float_in, index_in, float_out, index_out))
    return KernelCounts(
        tuple([layers[h].name for h in plan.heads]),
        tuple([keys[c] for c in plan.classes]),
        tuple(heads),
        [(keys[c], first, count) for c, (first, count) in enumerate(plan.runs)],
    )
