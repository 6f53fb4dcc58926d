"""Shape inference over a layer graph: per-layer shapes, parameters, FLOPs and saved tensors.

``analyze`` expands ``block`` and ``repeat`` layers into a flat execution order with qualified
names (``layers.3.attn``), binds symbolic input dims (``batch``, ``seq``, ``image``), runs every
op's semantics from :mod:`app.domain.ops`, and tracks which storage each value lives in so that
views and in-place ops share memory with their input.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from app.domain.errors import GraphError
from app.domain.graph import BLOCK_INPUT, validate_graph
from app.domain.ops import (
    OP_IMPLEMENTATIONS,
    OpContext,
    OpResult,
    Saved,
    TensorKind,
    Transient,
    Value,
)

MAX_NUMEL = 2**50  # elements in one tensor; beyond this no device has the memory (2^53 B fp64)


@dataclass(frozen=True, slots=True, kw_only=True)
class InputDecl:
    """A model input: name, dims (ints or symbols), and whether it holds floats or ids."""

    name: str
    shape: tuple[int | str, ...]
    kind: TensorKind = TensorKind.FLOAT


class LayerAnalysis(NamedTuple):
    """One executed layer (a named tuple: thousands are built per estimate)."""

    name: str
    op: str
    input_names: tuple[str, ...]
    input_storages: tuple[int, ...]
    output_shape: tuple[int, ...]
    output_kind: TensorKind
    output_storage: int
    allocates_output: bool
    result: OpResult
    output_numel: int

    @property
    def params(self) -> int:
        """Trainable parameters."""
        return self.result.params

    @property
    def flops(self) -> int:
        """Forward FLOPs."""
        return self.result.flops

    @property
    def saved(self) -> tuple[Saved, ...]:
        """Tensors kept for backward."""
        return self.result.saved

    @property
    def transients(self) -> tuple[Transient, ...]:
        """Tensors alive only inside the forward."""
        return self.result.transients


@dataclass(frozen=True, slots=True, kw_only=True)
class InputAnalysis:
    """A bound model input."""

    name: str
    shape: tuple[int, ...]
    kind: TensorKind
    storage: int

    @property
    def numel(self) -> int:
        """Elements of the input."""
        return math.prod(self.shape)


@dataclass(frozen=True, slots=True, kw_only=True)
class GraphAnalysis:
    """Every layer in execution order, with totals."""

    inputs: tuple[InputAnalysis, ...]
    layers: tuple[LayerAnalysis, ...]
    output_shape: tuple[int, ...]
    output_kind: TensorKind
    output_storage: int

    @property
    def params(self) -> int:
        """Trainable parameters of the whole model."""
        return sum(layer.result.params for layer in self.layers)

    @property
    def flops(self) -> int:
        """Forward FLOPs of the whole model."""
        return sum(layer.flops for layer in self.layers)

    @property
    def param_shapes(self) -> list[tuple[int, ...]]:
        """Shapes of every parameter tensor."""
        return [shape for layer in self.layers for shape in layer.result.param_shapes]


class _Binding(NamedTuple):
    value: Value
    storage: int
    weight_numel: int | None = None


@dataclass(slots=True)
class _State:
    training: bool
    bindings: Mapping[str, int]
    layers: list[LayerAnalysis] = field(default_factory=list)
    next_storage: int = 0
    cache: dict[tuple[int, tuple[tuple[int, ...], ...]], OpResult] = field(default_factory=dict)

    def new_storage(self) -> int:
        self.next_storage += 1
        return self.next_storage


def _bind_dims(dims: Sequence[Any], bindings: Mapping[str, int], where: str) -> tuple[int, ...]:
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


def analyze(
    inputs: Sequence[InputDecl],
    layers: Sequence[Mapping[str, Any]],
    bindings: Mapping[str, int],
    *,
    training: bool,
) -> GraphAnalysis:
    """Infer every layer's shapes, parameters, FLOPs and saved tensors.

    Raises
    ------
    GraphError
        Naming the layer and field of the first shape mismatch, unbound symbol or bad size.
    """
    validate_graph(layers, [decl.name for decl in inputs])
    state = _State(training=training, bindings=bindings)
    env: dict[str, _Binding] = {}
    bound: list[InputAnalysis] = []
    for index, decl in enumerate(inputs):
        shape = _bind_dims(decl.shape, bindings, f"inputs[{index}].shape")
        _check_size(shape, f"input '{decl.name}'", None)
        storage = state.new_storage()
        env[decl.name] = _Binding(Value(shape=shape, kind=decl.kind), storage)
        bound.append(InputAnalysis(name=decl.name, shape=shape, kind=decl.kind, storage=storage))
    first = env[inputs[0].name]
    last = _walk(layers, env, first, state, prefix="")
    return GraphAnalysis(
        inputs=tuple(bound),
        layers=tuple(state.layers),
        output_shape=last.value.shape,
        output_kind=last.value.kind,
        output_storage=last.storage,
    )


def _check_size(shape: tuple[int, ...], what: str, layer: str | None) -> None:
    if any(dim < 1 for dim in shape) or math.prod(shape) > MAX_NUMEL:
        raise GraphError(
            f"{what} has shape {list(shape)}: every dim must be >= 1 and the tensor at most "
            f"2^50 elements",
            layer=layer,
            field="shape",
        )


def _walk(
    layers: Sequence[Mapping[str, Any]],
    env: dict[str, _Binding],
    current: _Binding,
    state: _State,
    *,
    prefix: str,
) -> _Binding:
    for raw in layers:
        name, op = raw["name"], raw["op"]
        if op in ("block", "repeat"):
            for iteration in range(raw.get("times", 1) if op == "repeat" else 1):
                scope = dict(env)
                scope[BLOCK_INPUT] = current
                inner = f"{prefix}{name}.{iteration}." if op == "repeat" else f"{prefix}{name}."
                current = _walk(raw["layers"], scope, current, state, prefix=inner)
        else:
            current = _run(raw, env, current, state, prefix=prefix)
        env[name] = current
    return current


def _run(
    raw: Mapping[str, Any],
    env: dict[str, _Binding],
    current: _Binding,
    state: _State,
    *,
    prefix: str,
) -> _Binding:
    name = prefix + raw["name"]
    refs = raw.get("inputs")
    sources = [env[ref] for ref in refs] if refs is not None else [current]
    attrs = raw
    if raw["op"] == "reshape":
        attrs = {**raw, "shape": list(_bind_dims(raw["shape"], state.bindings, "shape"))}
    key = (id(raw), tuple(src.value.shape for src in sources))
    result = state.cache.get(key) if "tied_to" not in raw else None
    if result is None:
        ctx = OpContext(
            name=name,
            attrs=attrs,
            inputs=[src.value for src in sources],
            training=state.training,
            tied_params={
                ref: binding.weight_numel
                for ref, binding in env.items()
                if binding.weight_numel is not None
            }
            if "tied_to" in raw
            else {},
        )
        result = OP_IMPLEMENTATIONS[raw["op"]](ctx)
        if result.shape:
            _check_size(result.shape, "output", name)
        state.cache[key] = result
    if result.alias_of is not None:
        storage = sources[result.alias_of].storage
    else:
        storage = state.new_storage()
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
    return _Binding(Value(shape=result.shape, kind=result.kind), storage, weight)
