"""An analysis's layer columns and op-result groups (:func:`app.domain.memory.memo.layer_columns`,
:func:`~app.domain.memory.memo.op_result_groups`) and what reads them (the weights' events, the
storage plan, a rank's share) against the same figures walked layer by layer, on zoo models
(repeated blocks cloned, grouped-query attention, tied heads) at two batch sizes."""

from __future__ import annotations

import math
from fractions import Fraction

import pytest

from app.domain.graph.analysis import GraphAnalysis
from app.domain.memory.allocator_events import _weight_events
from app.domain.memory.estimate import MemoryRequest, analyze_for
from app.domain.memory.formulas import Sizer, ceil_fraction, kv_cache_bytes, precision_plan
from app.domain.memory.liveness import _op_sizes, build_plan
from app.domain.memory.memo import layer_columns, op_groups, op_result_groups
from app.domain.memory.rank_share import _kv_replicated_elements, _layers_share, kv_rank_numel
from app.domain.precision import Precision
from app.domain.workload import Mode, Runtime
from app.domain.zoo import ZOO

MODELS = ("gpt-2", "bert-base", "llama-3-8b", "resnet-50", "lstm-classifier")


class _Memo(dict[tuple[object, ...], object]):
    """A :class:`~app.domain.memory.memo.PlanMemo` without a bound."""

    def put(self, key: tuple[object, ...], value: object) -> None:
        self[key] = value


@pytest.fixture(scope="module")
def analyses() -> list[GraphAnalysis]:
    found = []
    for slug in MODELS:
        model = ZOO[slug]
        for batch in (1, 3):
            for mode in (Mode.INFERENCE, Mode.TRAINING):
                request = MemoryRequest(mode=mode)
                bindings = {**model.default_bindings, "batch": batch}
                found.append(analyze_for(model.inputs, model.layers, bindings, request))
    return found


def test_layer_columns_are_the_layers_fields(analyses: list[GraphAnalysis]) -> None:
    memo = _Memo()
    for analysis in analyses:
        columns = layer_columns(memo, analysis)
        assert layer_columns(memo, analysis) is columns  # once per analysis
        layers = analysis.layers
        assert columns.ids == [id(layer.result) for layer in layers]
        assert columns.storages == tuple(layer.output_storage for layer in layers)
        assert columns.allocates == [layer.allocates_output for layer in layers]
        last = {id(layer.result): layer for layer in layers}
        assert list(columns.distinct) == list(dict.fromkeys(columns.ids))
        assert all(columns.distinct[key] is layer for key, layer in last.items())
    assert any(len(c.distinct) < len(c.ids) for c in (layer_columns(None, a) for a in analyses))


def test_op_result_groups_count_every_layer_once(analyses: list[GraphAnalysis]) -> None:
    """Per (op, result) in order of first occurrence, its first layer and its count; and
    the rank share's sums over the groups are the sums over the layers, at every degree."""
    memo = _Memo()
    for analysis in analyses:
        layers = analysis.layers
        groups = op_groups(memo, analysis)
        assert op_groups(memo, analysis) is groups
        keys = [(layer.op, id(layer.result)) for layer in layers]
        first = {key: layers[keys.index(key)] for key in dict.fromkeys(keys)}
        assert [(layer.op, id(layer.result)) for layer, _ in groups] == list(first)
        assert all(layer is first[(layer.op, id(layer.result))] for layer, _ in groups)
        assert [count for _, count in groups] == [keys.count(key) for key in first]
        assert op_result_groups(layers) == groups
        for tp in (1, 2, 4, 8, 16):
            walked = (
                sum((_kv_replicated_elements(layer, tp) for layer in layers), Fraction(0)),
                sum(kv_rank_numel(layer, tp) for layer in layers),
            )
            assert _layers_share(groups, tp) == walked


def test_weight_events_are_the_layers_tensors(analyses: list[GraphAnalysis]) -> None:
    for analysis in analyses:
        for weight, shard in ((Fraction(2), 1), (Fraction(1, 2), 4), (Fraction(4), 3)):
            events = _weight_events(analysis, weight, shard, layer_columns(None, analysis))
            num, den = weight.numerator, weight.denominator * shard
            sizes = [
                [-(-math.prod(shape) * num // den) for shape in layer.result.param_shapes]
                for layer in analysis.layers
            ]
            allocated = [
                size
                for layer, tensors in zip(analysis.layers, sizes, strict=True)
                for size in tensors
                + ([layer.result.buffers_bytes] * bool(layer.result.buffers_bytes))
            ]
            assert events.sizes == sizes
            assert events.events == ((("keep", tuple(allocated), 0),) if allocated else ())


def test_plans_read_from_the_columns_are_the_layers_figures(
    analyses: list[GraphAnalysis],
) -> None:
    """The figures build_plan reads from the columns, walked layer by layer: each layer's op
    sizes (those of the last layer with its result), the output it allocates, the sizes of the
    inputs then of the allocated outputs (in that order), the earliest keepers (none at
    inference)."""
    memo = _Memo()
    for index, analysis in enumerate(analyses):
        training = bool(index % 2)  # the fixture alternates inference and training analyses
        for precision in (Precision.FP32, Precision.BF16):
            for runtime in (Runtime.CUDA, Runtime.CPU):
                mode = Mode.TRAINING if training else Mode.INFERENCE
                request = MemoryRequest(mode=mode, precision=precision, runtime=runtime)
                sizer = Sizer(precision_plan(precision), runtime)
                columns = layer_columns(memo, analysis)
                plan = build_plan(analysis, sizer, request, training, columns=columns)
                assert build_plan(analysis, sizer, request, training) == plan
                layers = analysis.layers
                last = {id(layer.result): layer for layer in layers}
                ops = [_op_sizes(last[id(layer.result)], sizer, request) for layer in layers]
                assert plan.op_sizes == ops
                out_alloc = [
                    op.output_storage if layer.allocates_output else 0
                    for layer, op in zip(layers, ops, strict=True)
                ]
                assert plan.out_alloc == out_alloc
                sizes = {b.storage: sizer.value_bytes(b.numel, b.kind) for b in analysis.inputs}
                for layer, size in zip(layers, out_alloc, strict=True):
                    if layer.allocates_output:
                        sizes[layer.output_storage] = size
                assert list(plan.sizes.items()) == list(sizes.items())
                first_saver: dict[int, int] = {}
                for at, keys in enumerate(plan.reused):
                    for key in keys:
                        first_saver.setdefault(key, at)
                assert plan.first_saver == first_saver
                assert training or not first_saver


def test_kv_cache_bytes_is_the_ceiling_of_the_fraction() -> None:
    """kv_cache_bytes in integers is ``ceil_fraction(Fraction(elements x bytes, shard))``."""
    for elements in (0, 1, 7, 4096, 3 * 2**40 + 5):
        for element_bytes in (1, 2, 4):
            for shard in (1, 2, 3, 4, 6, 8, 16):
                expected = ceil_fraction(Fraction(elements * element_bytes, shard))
                assert kv_cache_bytes(elements, element_bytes, shard) == expected
