"""``analyze`` must not change: its output is pinned two ways.

* A snapshot (``analysis_snapshot.json``, generated before repeats were cloned) holds a digest of
  every field of every layer of every zoo model and of hand-written graphs. When op semantics
  change on purpose (``app/domain/graph/ops/``), regenerate it with
  ``UPDATE_ANALYSIS_SNAPSHOT=1 .venv/bin/pytest tests/domain/test_analysis.py``.
* A reference walk (:func:`reference_analyze`, the plain pre-optimisation algorithm: every
  iteration of every repeat walked layer by layer) must agree with ``analyze`` exactly, on the
  same graphs and on the errors. It keeps working when op semantics change.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any, NamedTuple

import pytest

import app.domain.graph.analysis as analysis_module
from app.domain.errors import GraphError
from app.domain.graph.analysis import (
    GraphAnalysis,
    InputAnalysis,
    InputDecl,
    LayerAnalysis,
    analyze,
    effective_options,
)
from app.domain.graph.format import BLOCK_INPUT, validate_graph
from app.domain.graph.ops import OP_IMPLEMENTATIONS, OpContext, OpResult, TensorKind, Value
from app.domain.workload import Attention, Logits, Runtime
from app.domain.zoo import ZOO

SNAPSHOT = Path(__file__).with_name("analysis_snapshot.json")
SEQ_CAP = 64
Layer = dict[str, Any]
Analyzer = Callable[..., GraphAnalysis]


# --------------------------------------------------------------------------------------------
# Hand-written graphs: the shapes of repeat that cloning must get right.
# --------------------------------------------------------------------------------------------


def _lin(name: str, out: int, **attrs: Any) -> Layer:
    return {"name": name, "op": "linear", "out_features": out, **attrs}


def _add(name: str, *inputs: str, inplace: bool = False) -> Layer:
    layer: Layer = {"name": name, "op": "add", "inputs": list(inputs)}
    if inplace:
        layer["inplace"] = True
    return layer


def _repeat(name: str, times: int, *layers: Layer) -> Layer:
    return {"name": name, "op": "repeat", "times": times, "layers": list(layers)}


def _block(name: str, *layers: Layer) -> Layer:
    return {"name": name, "op": "block", "layers": list(layers)}


X = (InputDecl(name="x", shape=("batch", "seq", 16)),)
X_AND_CONTEXT = (
    InputDecl(name="x", shape=("batch", "seq", 16)),
    InputDecl(name="context", shape=("batch", "seq", 16)),
)
TOKENS = (InputDecl(name="ids", shape=("batch", "seq"), kind=TensorKind.INDEX),)
IMAGE = (InputDecl(name="image", shape=("batch", 4, "image", "image")),)

CUSTOM: dict[str, tuple[tuple[InputDecl, ...], list[Layer], dict[str, int]]] = {
    # A repeat inside a repeat; the inner body reads both @inputs and an outer-body name.
    "nested_repeat": (
        X,
        [
            _lin("proj", 16),
            _repeat(
                "outer",
                5,
                {"name": "ln", "op": "layernorm"},
                _repeat(
                    "inner",
                    3,
                    _lin("fc", 16),
                    {"name": "act", "op": "gelu", "inplace": True},
                    _add("res", BLOCK_INPUT, "act"),
                    _add("skip", "res", "ln"),
                ),
                _add("res", BLOCK_INPUT, "inner"),
            ),
            _lin("head", 4),
        ],
        {"batch": 2, "seq": 8},
    ),
    # The body reads the layer just before the repeat (whose storage is iteration 0's input),
    # an earlier layer and the second model input, all by name.
    "outer_names": (
        X_AND_CONTEXT,
        [
            _lin("a", 16),
            _lin("b", 16),
            _repeat(
                "blocks",
                6,
                _add("mix", BLOCK_INPUT, "b"),
                _add("ctx", "mix", "context"),
                _add("far", "ctx", "a"),
                _lin("fc", 16),
                {"name": "view", "op": "transpose", "dim0": 1, "dim1": 2},
                {"name": "back", "op": "transpose", "dim0": 1, "dim1": 2},
            ),
            _add("out", "blocks", "b"),
        ],
        {"batch": 2, "seq": 8},
    ),
    # Strided convs: the shape shrinks for a few iterations, then stays at 1 x 1.
    "shrinking_conv": (
        IMAGE,
        [
            {"name": "stem", "op": "conv2d", "out_channels": 8, "kernel_size": 3, "padding": 1},
            _repeat(
                "down",
                8,
                {
                    "name": "conv",
                    "op": "conv2d",
                    "out_channels": 8,
                    "kernel_size": 3,
                    "stride": 2,
                    "padding": 1,
                },
                {"name": "bn", "op": "batchnorm2d"},
                {"name": "relu", "op": "relu", "inplace": True},
            ),
            {"name": "pool", "op": "adaptive_avgpool2d", "output_size": 1},
            {"name": "flat", "op": "flatten"},
            _lin("fc", 10),
        ],
        {"batch": 2, "image": 20},
    ),
    # The body only views or writes in place: every iteration's output is its input's storage.
    "views_and_inplace": (
        X,
        [
            _lin("fc", 16),
            _repeat(
                "views",
                4,
                {"name": "relu", "op": "relu", "inplace": True},
                {"name": "t", "op": "transpose", "dim0": 1, "dim1": 2},
                {"name": "t2", "op": "transpose", "dim0": 1, "dim1": 2},
                {"name": "r", "op": "reshape", "shape": ["batch", -1, 16]},
                {"name": "drop", "op": "dropout", "p": 0.1, "inplace": True},
            ),
            _lin("head", 4),
        ],
        {"batch": 2, "seq": 8},
    ),
    # The body ends writing in place into an outer tensor: iterations alias an outer storage.
    "inplace_into_outer": (
        X,
        [
            _lin("acc", 16),
            _lin("src", 16),
            _repeat(
                "accumulate",
                5,
                _lin("fc", 16),
                _add("into", "acc", "fc", inplace=True),
            ),
            _repeat(
                "chain",
                4,
                {"name": "sig", "op": "sigmoid", "inplace": True},
                _add("into", "src", BLOCK_INPUT, inplace=True),
            ),
            _lin("head", 4),
        ],
        {"batch": 2, "seq": 8},
    ),
    # Repeats inside blocks inside repeats; a block reads the enclosing repeat's names.
    "blocks_in_repeats": (
        X,
        [
            _lin("in_proj", 16),
            _repeat(
                "stages",
                4,
                _block(
                    "pre",
                    {"name": "norm", "op": "rmsnorm"},
                    _repeat("mlps", 2, {"name": "mlp", "op": "mlp", "intermediate_size": 32}),
                    _add("res", BLOCK_INPUT, "mlps"),
                ),
                _block(
                    "post",
                    _add("both", "pre", BLOCK_INPUT),
                    {"name": "drop", "op": "dropout", "p": 0.2},
                ),
                _repeat("once", 1, _lin("fc", 16)),
            ),
            _lin("head", 4),
        ],
        {"batch": 2, "seq": 8},
    ),
    # A layer tied to an outer weight: never cloned, results are recomputed every iteration.
    "tied_in_repeat": (
        TOKENS,
        [
            {"name": "wte", "op": "embedding", "num_embeddings": 16, "embedding_dim": 16},
            _repeat(
                "blocks",
                4,
                _lin("decode", 16, tied_to="wte", bias=False),
                {"name": "attn", "op": "attention", "num_heads": 2, "causal": True},
                _add("res", BLOCK_INPUT, "attn"),
            ),
            _lin("lm_head", 16, tied_to="wte", bias=False),
        ],
        {"batch": 2, "seq": 8},
    ),
    # The output of an iteration is wider than its input for one iteration only.
    "width_changes_once": (
        (InputDecl(name="x", shape=("batch", "seq", 12)),),
        [
            _repeat(
                "grow",
                5,
                _lin("fc", 16),
                {"name": "act", "op": "silu", "inplace": True},
                {"name": "fix", "op": "reshape", "shape": ["batch", -1, 16]},
                {"name": "cat", "op": "concat", "inputs": ["fix", "act"], "dim": 1},
                {"name": "half", "op": "select", "dim": 1, "index": -1},
                _lin("fc2", 16),
                {"name": "back", "op": "reshape", "shape": ["batch", 1, 16]},
                {"name": "again", "op": "reshape", "shape": ["batch", "seq", -1]},
                _add("out", "again", "fix"),
            ),
        ],
        {"batch": 2, "seq": 1},
    ),
}


# --------------------------------------------------------------------------------------------
# Reference: the plain walk ``analyze`` replaced (same output, no cloning, no fast paths).
# --------------------------------------------------------------------------------------------


class _RefBinding(NamedTuple):
    value: Value
    storage: int
    weight_numel: int | None = None


class _RefState:
    def __init__(self, training: bool, bindings: Mapping[str, int]) -> None:
        self.training = training
        self.bindings = bindings
        self.attention: Attention | None = None
        self.layers: list[LayerAnalysis] = []
        self.next_storage = 0
        self.cache: dict[tuple[int, tuple[tuple[int, ...], ...]], OpResult] = {}

    def new_storage(self) -> int:
        self.next_storage += 1
        return self.next_storage


def _ref_bind(dims: Sequence[Any], bindings: Mapping[str, int], where: str) -> tuple[int, ...]:
    shape: list[int] = []
    for dim in dims:
        if isinstance(dim, str):
            if dim not in bindings:
                raise GraphError(
                    f"symbol '{dim}' is not bound; known: {', '.join(sorted(bindings)) or 'none'}",
                    field=where,
                )
            shape.append(bindings[dim])
        else:
            shape.append(int(dim))
    return tuple(shape)


def _ref_check_size(shape: tuple[int, ...], what: str, layer: str | None) -> None:
    if any(dim < 1 for dim in shape) or math.prod(shape) > 2**50:
        raise GraphError(
            f"{what} has shape {list(shape)}: every dim must be >= 1 and the tensor at most "
            f"2^50 elements",
            layer=layer,
            field="shape",
        )


def reference_analyze(
    inputs: Sequence[InputDecl],
    layers: Sequence[Mapping[str, Any]],
    bindings: Mapping[str, int],
    *,
    training: bool,
    attention: Attention | None = None,
) -> GraphAnalysis:
    """The original ``analyze``: every layer of every iteration run through the op cache."""
    validate_graph(layers, [decl.name for decl in inputs])
    state = _RefState(training, bindings)
    state.attention = attention
    env: dict[str, _RefBinding] = {}
    bound: list[InputAnalysis] = []
    for index, decl in enumerate(inputs):
        shape = _ref_bind(decl.shape, bindings, f"inputs[{index}].shape")
        _ref_check_size(shape, f"input '{decl.name}'", None)
        storage = state.new_storage()
        env[decl.name] = _RefBinding(Value(shape=shape, kind=decl.kind), storage)
        bound.append(InputAnalysis(name=decl.name, shape=shape, kind=decl.kind, storage=storage))
    last = _ref_walk(layers, env, env[inputs[0].name], state, prefix="")
    used = [
        (r.attention, r.attention_reason)
        for r in (x.result for x in state.layers)
        if r.attention is not None
    ]
    return GraphAnalysis(
        inputs=tuple(bound),
        layers=tuple(state.layers),
        output_shape=last.value.shape,
        output_kind=last.value.kind,
        output_storage=last.storage,
        attention_used=tuple(dict.fromkeys(used)),
        is_decoder=any(x.op == "attention" and x.result.kv_cache_numel for x in state.layers)
        or '"causal": true' in json.dumps(layers),
    )


def _ref_walk(
    layers: Sequence[Mapping[str, Any]],
    env: dict[str, _RefBinding],
    current: _RefBinding,
    state: _RefState,
    *,
    prefix: str,
) -> _RefBinding:
    for raw in layers:
        name, op = raw["name"], raw["op"]
        if op in ("block", "repeat"):
            for iteration in range(raw.get("times", 1) if op == "repeat" else 1):
                scope = dict(env)
                scope[BLOCK_INPUT] = current
                inner = f"{prefix}{name}.{iteration}." if op == "repeat" else f"{prefix}{name}."
                current = _ref_walk(raw["layers"], scope, current, state, prefix=inner)
        else:
            current = _ref_run(raw, env, current, state, prefix=prefix)
        env[name] = current
    return current


def _ref_run(
    raw: Mapping[str, Any],
    env: dict[str, _RefBinding],
    current: _RefBinding,
    state: _RefState,
    *,
    prefix: str,
) -> _RefBinding:
    name = prefix + raw["name"]
    refs = raw.get("inputs")
    sources = [env[ref] for ref in refs] if refs is not None else [current]
    attrs = raw
    if raw["op"] == "reshape":
        attrs = {**raw, "shape": list(_ref_bind(raw["shape"], state.bindings, "shape"))}
    key = (id(raw), tuple(src.value.shape for src in sources))
    result = state.cache.get(key) if "tied_to" not in raw else None
    if result is None:
        tied = {ref: b.weight_numel for ref, b in env.items() if b.weight_numel is not None}
        ctx = OpContext(
            name=name,
            attrs=attrs,
            inputs=[src.value for src in sources],
            training=state.training,
            attention=state.attention,
            tied_params=tied if "tied_to" in raw else {},
        )
        result = OP_IMPLEMENTATIONS[raw["op"]](ctx)
        if result.shape:
            _ref_check_size(result.shape, "output", name)
        state.cache[key] = result
    storage = (
        sources[result.alias_of].storage if result.alias_of is not None else state.new_storage()
    )
    state.layers.append(
        LayerAnalysis(
            name=name,
            op=raw["op"],
            input_names=tuple(refs) if refs is not None else (),
            input_storages=tuple(src.storage for src in sources),
            output_shape=result.shape,
            output_kind=result.kind,
            output_storage=storage,
            allocates_output=result.alias_of is None,
            result=result,
            output_numel=math.prod(result.shape),
        )
    )
    has_weight = raw["op"] == "embedding" or (raw["op"] == "linear" and "tied_to" not in raw)
    weight = math.prod(result.param_shapes[0]) if has_weight else None
    return _RefBinding(Value(shape=result.shape, kind=result.kind), storage, weight)


# --------------------------------------------------------------------------------------------
# Cases and fingerprints.
# --------------------------------------------------------------------------------------------


class Case(NamedTuple):
    """One graph to analyze, in one mode."""

    inputs: Sequence[InputDecl]
    layers: Sequence[Mapping[str, Any]]
    bindings: Mapping[str, int]
    training: bool

    def run(self, analyzer: Analyzer = analyze) -> GraphAnalysis:
        # Pinned to eager attention, the implementation the snapshot was taken with.
        return analyzer(
            self.inputs,
            self.layers,
            self.bindings,
            training=self.training,
            attention=Attention.EAGER,
        )


def _cases() -> dict[str, Case]:
    """Every zoo model (batch 2, ``seq`` capped) and every hand-written graph, in both modes."""
    cases: dict[str, Case] = {}
    for training in (True, False):
        mode = "training" if training else "inference"
        for slug, model in ZOO.items():
            bindings = {"batch": 2, **model.default_bindings}
            if "seq" in bindings:
                bindings["seq"] = min(bindings["seq"], SEQ_CAP)
            cases[f"zoo:{slug}:{mode}"] = Case(model.inputs, model.layers, bindings, training)
        for label, (inputs, layers, bindings) in CUSTOM.items():
            cases[f"custom:{label}:{mode}"] = Case(inputs, layers, bindings, training)
    return cases


CASES = _cases()


def _result_fields(result: OpResult) -> list[Any]:
    return [
        list(result.shape),
        result.kind.value,
        [list(shape) for shape in result.param_shapes],
        result.params,
        result.flops,
        [[s.label, s.source, s.numel, s.storage.value] for s in result.saved],
        result.alias_of,
        [[t.label, t.numel, t.storage.value] for t in result.transients],
        result.buffers_bytes,
        result.kv_cache_numel,
    ]


def layer_fingerprints(analysis: GraphAnalysis) -> list[str]:
    """One JSON line per layer with every field, and which earlier layer shares its OpResult."""
    first_user: dict[int, int] = {}
    lines = []
    for index, layer in enumerate(analysis.layers):
        shared = first_user.setdefault(id(layer.result), index)
        fields = [
            layer.name,
            layer.op,
            list(layer.input_names),
            list(layer.input_storages),
            list(layer.output_shape),
            layer.output_kind.value,
            layer.output_storage,
            layer.allocates_output,
            layer.output_numel,
            shared,
            _result_fields(layer.result),
        ]
        lines.append(json.dumps(fields, separators=(",", ":")))
    return lines


def summary_fingerprint(analysis: GraphAnalysis) -> str:
    """The inputs and the output of the whole graph."""
    inputs = [[b.name, list(b.shape), b.kind.value, b.storage] for b in analysis.inputs]
    output = [list(analysis.output_shape), analysis.output_kind.value, analysis.output_storage]
    return json.dumps([inputs, output], separators=(",", ":"))


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def snapshot_entry(analysis: GraphAnalysis) -> dict[str, Any]:
    """What the snapshot keeps per case: counts, totals, and a digest per layer."""
    lines = layer_fingerprints(analysis)
    return {
        "layers": len(lines),
        "params": analysis.params,
        "flops": analysis.flops,
        "summary": _digest(summary_fingerprint(analysis)),
        "layer_digests": [_digest(line) for line in lines],
    }


def _load_snapshot() -> dict[str, Any]:
    if os.environ.get("UPDATE_ANALYSIS_SNAPSHOT"):
        entries = {label: snapshot_entry(case.run()) for label, case in CASES.items()}
        SNAPSHOT.write_text(json.dumps(entries, indent=0, sort_keys=True) + "\n")
    data: dict[str, Any] = json.loads(SNAPSHOT.read_text())
    return data


@pytest.fixture(scope="module")
def snapshot() -> dict[str, Any]:
    return _load_snapshot()


# --------------------------------------------------------------------------------------------
# Tests.
# --------------------------------------------------------------------------------------------


def test_snapshot_covers_every_case(snapshot: dict[str, Any]) -> None:
    assert sorted(snapshot) == sorted(CASES)


@pytest.mark.parametrize("label", list(CASES))
def test_matches_snapshot(label: str, snapshot: dict[str, Any]) -> None:
    """Pin: every layer of every case digests as the snapshot says (eager attention)."""
    analysis = CASES[label].run()
    expected = snapshot[label]
    actual = snapshot_entry(analysis)
    for index, (want, got) in enumerate(
        zip(expected["layer_digests"], actual["layer_digests"], strict=False)
    ):
        assert got == want, f"layer {index} ({analysis.layers[index].name}) changed"
    assert actual == expected


@pytest.mark.parametrize("label", list(CASES))
def test_matches_reference_walk(label: str) -> None:
    fast = CASES[label].run()
    slow = CASES[label].run(reference_analyze)
    assert fast.inputs == slow.inputs
    assert (fast.output_shape, fast.output_kind, fast.output_storage) == (
        slow.output_shape,
        slow.output_kind,
        slow.output_storage,
    )
    assert len(fast.layers) == len(slow.layers)
    for got, want in zip(fast.layers, slow.layers, strict=True):
        assert type(got) is LayerAnalysis
        assert got == want, f"layer {want.name} differs"
    assert layer_fingerprints(fast) == layer_fingerprints(slow)


def test_gpt3_at_full_length_matches_reference() -> None:
    model = ZOO["gpt-3-175b"]
    bindings = {"batch": 1, "seq": 2048}
    fast = analyze(model.inputs, model.layers, bindings, training=True)
    slow = reference_analyze(model.inputs, model.layers, bindings, training=True)
    assert fast == slow
    assert layer_fingerprints(fast) == layer_fingerprints(slow)


def test_repeat_names_and_storages_are_per_iteration() -> None:
    inputs, layers, bindings = CUSTOM["outer_names"]
    analysis = analyze(inputs, layers, bindings, training=True)
    by_name = {layer.name: layer for layer in analysis.layers}
    a, b = by_name["a"].output_storage, by_name["b"].output_storage
    context = analysis.inputs[1].storage
    for i in range(6):
        mix = by_name[f"blocks.{i}.mix"]
        entry = b if i == 0 else by_name[f"blocks.{i - 1}.back"].output_storage
        assert mix.input_storages == (entry, b)
        assert by_name[f"blocks.{i}.ctx"].input_storages[1] == context
        assert by_name[f"blocks.{i}.far"].input_storages[1] == a
        fc = by_name[f"blocks.{i}.fc"]
        assert by_name[f"blocks.{i}.back"].output_storage == fc.output_storage
    storages = [layer.output_storage for layer in analysis.layers if layer.allocates_output]
    assert len(storages) == len(set(storages))


# Which iteration each repeat clones from, so that the comparisons above exercise cloning.
CLONED_FROM = {
    "zoo:gpt-3-175b:training": ["h.1."],  # iteration 0 enters with "drop", an outer name
    # each stage's repeat enters with unit "0", an outer name; 2-iteration repeats never clone
    "zoo:resnet-50:training": ["layer2.blocks.1.", "layer3.blocks.1."],
    "custom:nested_repeat:training": [
        "outer.0.inner.1.",
        "outer.1.inner.1.",
        "outer.1.",  # outer iterations 2-4, inner repeats included, are cloned
    ],
    "custom:outer_names:training": ["blocks.1."],
    "custom:shrinking_conv:training": ["down.5."],  # 20, 10, 5, 3, 2, then 1 x 1 for good
    "custom:views_and_inplace:training": ["views.0."],  # leaves in the storage it entered
    "custom:inplace_into_outer:training": ["accumulate.1.", "chain.1."],
    "custom:blocks_in_repeats:training": ["stages.1."],
    "custom:tied_in_repeat:training": [],  # tied layers are evaluated every time
    "custom:width_changes_once:training": ["grow.1."],
}


@pytest.mark.parametrize(("label", "expected"), list(CLONED_FROM.items()))
def test_repeats_clone_once_steady(
    label: str, expected: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    templates: list[str] = []
    clone = analysis_module._clone_iterations

    def spy(state: Any, **kwargs: Any) -> Any:
        templates.append(kwargs["template_prefix"])
        return clone(state, **kwargs)

    monkeypatch.setattr(analysis_module, "_clone_iterations", spy)
    CASES[label].run()
    assert templates == expected


# Errors: the same layer, field and message as the reference walk.

ERRORS: dict[str, tuple[tuple[InputDecl, ...], list[Layer], dict[str, int], str | None, str]] = {
    "unbound input symbol": (X, [_lin("fc", 4)], {"batch": 2}, None, "inputs[0].shape"),
    "unbound reshape symbol": (
        X,
        [_repeat("blocks", 3, {"name": "r", "op": "reshape", "shape": ["heads", -1]})],
        {"batch": 2, "seq": 8},
        None,
        "shape",
    ),
    "shape mismatch": (
        X,
        [_lin("wide", 32), _repeat("blocks", 3, _lin("fc", 16), _add("res", "fc", "wide"))],
        {"batch": 2, "seq": 8},
        "blocks.0.res",
        "inputs",
    ),
    "mismatch in a later iteration": (
        X,
        [_repeat("blocks", 4, _lin("fc", 16, in_features=16), _lin("grow", 32))],
        {"batch": 2, "seq": 8},
        "blocks.1.fc",
        "in_features",
    ),
    "kernel too big after shrinking": (
        IMAGE,
        [
            _repeat(
                "down",
                6,
                {"name": "conv", "op": "conv2d", "out_channels": 4, "kernel_size": 3, "stride": 2},
            )
        ],
        {"batch": 2, "image": 16},
        "down.3.conv",
        "kernel_size",
    ),
    "nested failure after inner cloning": (
        IMAGE,
        [
            _repeat(
                "stages",
                5,
                {"name": "conv", "op": "conv2d", "out_channels": 4, "kernel_size": 2, "stride": 2},
                _repeat(
                    "same",
                    3,
                    {"name": "c", "op": "conv2d", "out_channels": 4, "kernel_size": 1},
                    {"name": "relu", "op": "relu", "inplace": True},
                ),
            )
        ],
        {"batch": 2, "image": 8},
        "stages.3.conv",
        "kernel_size",
    ),
    "tied weight of the wrong size": (
        TOKENS,
        [
            {"name": "wte", "op": "embedding", "num_embeddings": 16, "embedding_dim": 8},
            _repeat("blocks", 2, _lin("head", 8, tied_to="wte")),
        ],
        {"batch": 2, "seq": 8},
        "blocks.0.head",
        "tied_to",
    ),
    "output too large": (
        X,
        [_repeat("blocks", 2, _lin("huge", 2**40))],
        {"batch": 2**10, "seq": 8},
        "blocks.0.huge",
        "shape",
    ),
}


@pytest.mark.parametrize("label", list(ERRORS))
def test_errors_name_the_layer_and_field(label: str) -> None:
    inputs, layers, bindings, layer, field = ERRORS[label]
    with pytest.raises(GraphError) as fast:
        analyze(inputs, layers, bindings, training=True)
    with pytest.raises(GraphError) as slow:
        reference_analyze(inputs, layers, bindings, training=True)
    assert (fast.value.layer, fast.value.field) == (layer, field)
    assert str(fast.value) == str(slow.value)


# --------------------------------------------------------------------------------------------
# Request options: attention implementation and logits.
# --------------------------------------------------------------------------------------------


def _llama(**options: Any) -> GraphAnalysis:
    model = ZOO["llama-3-8b"]
    bindings = {**model.default_bindings, "batch": 2, "seq": 16}
    return analyze(model.inputs, model.layers, bindings, **options)


def test_last_position_logits_run_the_head_on_one_position() -> None:
    """logits=last at inference: lm_head reads hidden[:, -1:, :]; everything else unchanged."""
    every = _llama(training=False)
    last = _llama(training=False, logits=Logits.LAST)
    assert (every.logits, every.logits_head, every.output_shape) == (
        Logits.ALL,
        None,
        (2, 16, 128_256),
    )
    assert (last.logits, last.logits_head, last.output_shape) == (
        Logits.LAST,
        "lm_head",
        (2, 1, 128_256),
    )
    assert last.params == every.params
    head = {layer.name: layer for layer in last.layers}["lm_head"]
    assert head.output_shape == (2, 1, 128_256)
    assert head.flops == 2 * 2 * 4096 * 128_256
    assert [x.output_shape for x in last.layers[:-1]] == [x.output_shape for x in every.layers[:-1]]


def test_training_and_encoders_compute_every_position() -> None:
    trained = _llama(training=True, logits=Logits.LAST)
    assert (trained.logits, trained.output_shape) == (Logits.ALL, (2, 16, 128_256))
    assert trained.logits_requested is Logits.LAST
    model = ZOO["bert-base"]
    bindings = {**model.default_bindings, "batch": 2, "seq": 16}
    encoder = analyze(model.inputs, model.layers, bindings, training=False, logits=Logits.LAST)
    assert (encoder.is_decoder, encoder.logits) == (False, Logits.ALL)


def test_a_decoder_head_on_a_pooled_state_is_not_sliced() -> None:
    """The last top-level linear reads [N, D] (a classifier on the last token's state): there
    is nothing to slice, and the analysis says every position."""
    layers = [
        {"name": "attn", "op": "attention", "num_heads": 2, "causal": True},
        {"name": "pool", "op": "select", "dim": 1, "index": -1},
        {"name": "head", "op": "linear", "out_features": 3},
    ]
    inputs = (InputDecl(name="x", shape=("batch", "seq", 8)),)
    analysis = analyze(inputs, layers, {"batch": 2, "seq": 4}, training=False, logits=Logits.LAST)
    assert analysis.is_decoder
    assert (analysis.logits, analysis.logits_head, analysis.output_shape) == (
        Logits.ALL,
        None,
        (2, 3),
    )


def test_attention_implementations_keep_their_tensors() -> None:
    """eager/sdpa_math keep the fp32 S x S probabilities; flash/mem_efficient the output and
    the fp32 log-sum-exp; the parameters are the same."""
    saved = {}
    for impl in Attention:
        analysis = _llama(training=True, attention=impl)
        attention = next(layer for layer in analysis.layers if layer.op == "attention")
        saved[impl] = {item.label for item in attention.saved}
        assert analysis.attention_used == ((impl, "requested"),)
    assert "probs" in saved[Attention.EAGER] == saved[Attention.SDPA_MATH]
    assert saved[Attention.FLASH] == saved[Attention.MEM_EFFICIENT]
    assert {"attn_out", "logsumexp"} <= saved[Attention.FLASH]
    assert "probs" not in saved[Attention.FLASH]


def test_default_attention_is_chosen_per_layer_with_its_reason() -> None:
    cuda = _llama(training=False, runtime=Runtime.CUDA)
    assert [impl for impl, _ in cuda.attention_used] == [Attention.MEM_EFFICIENT]  # fp32
    cpu = ZOO["gpt-2"]
    bindings = {**cpu.default_bindings, "batch": 1, "seq": 8}
    flash_cpu = analyze(
        cpu.inputs, cpu.layers, bindings, training=True, attention=Attention.FLASH,
        runtime=Runtime.CPU,
    )  # fmt: skip
    ((impl, reason),) = flash_cpu.attention_used
    assert impl is Attention.SDPA_MATH
    assert reason.startswith("flash asked for, but PyTorch's fused CPU kernel has no dropout")


@pytest.mark.parametrize("slug", sorted(ZOO))
@pytest.mark.parametrize("training", [False, True])
def test_effective_options_analyse_the_same(slug: str, training: bool) -> None:
    """Every attention and logits option gives the layers of the options effective_options
    names for it (a cache may compute those instead): only the options asked for differ."""
    model = ZOO[slug]
    bindings = {**model.default_bindings, "batch": 2}
    if "seq" in bindings:
        bindings["seq"] = 16
    found = {
        (attention, logits): analyze(
            model.inputs,
            model.layers,
            bindings,
            training=training,
            attention=attention,
            logits=logits,
        )
        for attention in (None, *Attention)
        for logits in Logits
    }
    effective = {
        asked: effective_options(
            model.layers, training=training, attention=asked[0], logits=asked[1]
        )
        for asked in found
    }
    for (attention, logits), analysis in found.items():
        assert (analysis.attention_requested, analysis.logits_requested) == (attention, logits)
        target = effective[attention, logits]
        assert effective[target] == target  # the options named are their own
        assert replace(analysis, attention_requested=None, logits_requested=Logits.ALL) == (
            replace(found[target], attention_requested=None, logits_requested=Logits.ALL)
        )
    attends = any(layer.op == "attention" for layer in found[None, Logits.ALL].layers)
    decoder = found[None, Logits.ALL].is_decoder and not training
    assert len(set(effective.values())) == (len(Attention) + 1 if attends else 1) * (
        2 if decoder else 1
    )
