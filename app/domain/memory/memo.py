"""What an estimate derives from one analysis object and hands to the next: the caller's bounded
memo (:class:`PlanMemo`) and the sums over an analysis's layers that every estimate reads."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from operator import attrgetter
from typing import NamedTuple, Protocol, TypeVar, cast

from app.domain.graph.analysis import GraphAnalysis, LayerAnalysis


class PlanMemo(Protocol):
    """A bounded cache the caller keeps across estimates (e.g. ``app.services.cache.LruCache``):
    what :func:`estimate_memory` derives from one analysis object and the few request fields it
    depends on (the inference storage plan, the forward's allocator events, the weights'
    events). Each entry holds its analysis, so an id in a key names a live object."""

    def get(self, key: tuple[object, ...], /) -> object | None:
        """The value stored for ``key``, or None."""

    def put(self, key: tuple[object, ...], value: object, /) -> None:
        """Store ``value`` for ``key``."""


_T = TypeVar("_T")


@dataclass(frozen=True, slots=True)
class _Memoised:
    """A value derived from ``analysis`` (kept so that its id is not reused while stored)."""

    analysis: GraphAnalysis
    value: object


def memoised(
    memo: PlanMemo | None,
    analysis: GraphAnalysis,
    key: tuple[object, ...],
    build: Callable[[], _T],
) -> _T:
    """``build()``, or the value stored for it in ``memo`` by ``analysis`` and ``key`` (which
    must name everything besides the analysis that the value depends on)."""
    if memo is None:
        return build()
    full = (key[0], id(analysis), *key[1:])
    found = memo.get(full)
    if isinstance(found, _Memoised) and found.analysis is analysis:
        return cast(_T, found.value)
    value = build()
    memo.put(full, _Memoised(analysis, value))
    return value


class LayerTotals(NamedTuple):
    """Sums over an analysis's layers that every estimate of it reads."""

    params: int  # parameters (GraphAnalysis.params)
    buffers_bytes: int  # buffers (batch norm statistics)
    kv_cache_numel: int  # KV cache elements, all attention layers
    kv_layers: int  # layers that cache keys and values


def layer_totals(plans: PlanMemo | None, analysis: GraphAnalysis) -> LayerTotals:
    """The analysis's :class:`LayerTotals` (summed once per analysis with ``plans``)."""

    def build() -> LayerTotals:
        # once per distinct op result, times its count (the repeats of a block share theirs)
        results = list(map(attrgetter("result"), analysis.layers))
        by_id = dict(zip(map(id, results), results, strict=True))
        params = buffers = kv = kv_layers = 0
        for result_id, count in Counter(map(id, results)).items():
            result = by_id[result_id]
            params += count * result.params
            buffers += count * result.buffers_bytes
            if result.kv_cache_numel:
                kv += count * result.kv_cache_numel
                kv_layers += count
        return LayerTotals(
            params=params, buffers_bytes=buffers, kv_cache_numel=kv, kv_layers=kv_layers
        )

    return memoised(plans, analysis, ("layer totals",), build)


class LayerColumns(NamedTuple):
    """Per-layer figures of an analysis read column by column (by C loops: ``map``, ``zip``),
    and its distinct op results (the repeats of a block share theirs: what depends only on a
    layer's result is worked out once per result)."""

    ids: list[int]  # per layer, id(layer.result)
    distinct: dict[int, LayerAnalysis]  # result id -> the last layer with that result
    storages: tuple[int, ...]  # per layer, its output storage
    allocates: list[bool]  # per layer, whether it allocates its output


def layer_columns(plans: PlanMemo | None, analysis: GraphAnalysis) -> LayerColumns:
    """The analysis's :class:`LayerColumns` (built once per analysis with ``plans``)."""

    def build() -> LayerColumns:
        layers = analysis.layers
        ids = list(map(id, map(_RESULT, layers)))
        return LayerColumns(
            ids=ids,
            distinct=dict(zip(ids, layers, strict=True)),
            storages=tuple(map(_OUTPUT_STORAGE, layers)),
            allocates=list(map(_ALLOCATES, layers)),
        )

    return memoised(plans, analysis, ("layer columns",), build)


def op_result_groups(layers: Sequence[LayerAnalysis]) -> list[tuple[LayerAnalysis, int]]:
    """Per distinct (op, op result) of ``layers``, in order of first occurrence: its first
    layer and how many layers have it (what depends only on a layer's op and result is worked
    out once per group: the repeats of a block share their result)."""
    keys = list(zip(map(_OP, layers), map(id, map(_RESULT, layers)), strict=True))
    first = dict(zip(reversed(keys), reversed(layers), strict=True))  # a layer per key
    return [(first[key], count) for key, count in Counter(keys).items()]


def op_groups(plans: PlanMemo | None, analysis: GraphAnalysis) -> list[tuple[LayerAnalysis, int]]:
    """:func:`op_result_groups` of the analysis's layers (once per analysis with ``plans``)."""
    return memoised(plans, analysis, ("op groups",), lambda: op_result_groups(analysis.layers))


_RESULT = attrgetter("result")
_OP = attrgetter("op")
_OUTPUT_STORAGE = attrgetter("output_storage")
_ALLOCATES = attrgetter("allocates_output")
