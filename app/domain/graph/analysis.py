"""Shape inference over a layer graph: per-layer shapes, parameters, FLOPs and saved tensors.

``analyze`` expands ``block`` and ``repeat`` layers into a flat execution order with qualified
names (``layers.3.attn``), binds symbolic input dims (``batch``, ``seq``, ``image``), runs every
op's semantics from :mod:`app.domain.ops`, and tracks which storage each value lives in so that
views and in-place ops share memory with their input.

It is on the hot path of every estimate (GPT-3: 96 blocks, 773 layers, well under a
millisecond). Op results are cached per (layer, input shapes), so each distinct layer runs its
semantics once; and once a repeat's iterations are steady, the remaining ones are not walked
but cloned from the last walked iteration's records (see :func:`_repeat`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from app.domain.budget import CHECK_EVERY, checkpoint
from app.domain.errors import GraphError
from app.domain.graph.format import BLOCK_INPUT, validate_graph
from app.domain.graph.ops import (
    OP_IMPLEMENTATIONS,
    OpContext,
    OpResult,
    Saved,
    TensorKind,
    Transient,
    Value,
)
from app.domain.precision import Precision
from app.domain.workload import Attention, GpuTraits, Logits, Runtime

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
    attention_used: tuple[tuple[Attention, str], ...] = ()  # distinct (implementation, why)
    is_decoder: bool = False  # has causal attention
    logits: Logits = Logits.ALL  # LAST: the output head ran on the last position only
    logits_head: str | None = None  # the layer that ran on the last position only (LAST)
    attention_requested: Attention | None = None  # the ``attention`` option it was analysed with
    logits_requested: Logits = Logits.ALL  # the ``logits`` option it was analysed with
    batchnorm_folded: int = 0  # convolutions an eval-mode export may have folded batch norm into

    @property
    def params(self) -> int:
        """Trainable parameters of the whole model."""
        return sum([layer.result.params for layer in self.layers])

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


class _Computed(NamedTuple):
    """One op evaluation, shared by every layer with the same layer dict and input shapes."""

    result: OpResult
    value: Value  # the output value (shape and kind of ``result``)
    numel: int  # elements of the output
    weight_numel: int | None  # elements of the weight a later layer may tie to


_CacheKey = tuple[int, tuple[tuple[int, ...], ...]]  # (id of the layer dict, input shapes)

# ``tuple.__new__(SomeNamedTuple, fields)`` builds a named tuple from its fields in order without
# the Python-level ``__new__`` that NamedTuple generates: half the cost, and thousands of records
# are built per estimate. The fields must be passed in declaration order, all of them.
_make = tuple.__new__


@dataclass(slots=True)
class _State:
    training: bool
    bindings: Mapping[str, int]
    attention: Attention | None = None
    runtime: Runtime = Runtime.CUDA
    precision: Precision = Precision.FP32
    gpu: GpuTraits | None = None  # the GPU SDPA's default attention is chosen for
    head: int | None = None  # id of the layer dict computed at the last position only
    head_name: str | None = None  # its name, once it ran on a [N, S, D] input
    layers: list[LayerAnalysis] = field(default_factory=list)
    next_storage: int = 0
    cache: dict[_CacheKey, _Computed] = field(default_factory=dict)
    tied_runs: int = 0  # evaluations of layers with ``tied_to`` (never cached)

    def new_storage(self) -> int:
        self.next_storage += 1
        return self.next_storage


# Symbolic dims that take another dim's value unless bound themselves: an encoder-decoder's
# decoder length (``decoder_seq``: T5's decoder_input_ids, in training the right-shifted labels)
# is its encoder's (``seq``) unless a request binds it (``decoder_sequence_length``).
DERIVED_DIMS: Mapping[str, str] = {"decoder_seq": "seq"}


def with_derived_dims(bindings: Mapping[str, int], inputs: Sequence[InputDecl]) -> dict[str, int]:
    """``bindings`` plus each :data:`DERIVED_DIMS` symbol the ``inputs`` declare and
    ``bindings`` leave unbound, at the value of the symbol it follows (when that one is bound).
    A graph whose inputs name no derived symbol gets none (its errors list only what the caller
    bound)."""
    declared = {dim for decl in inputs for dim in decl.shape if isinstance(dim, str)}
    derived = {
        dim: bindings[source]
        for dim, source in DERIVED_DIMS.items()
        if dim in declared and dim not in bindings and source in bindings
    }
    return {**bindings, **derived}


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
    attention: Attention | None = None,
    runtime: Runtime = Runtime.CUDA,
    precision: Precision = Precision.FP32,
    logits: Logits = Logits.ALL,
    gpu: GpuTraits | None = None,
) -> GraphAnalysis:
    """Infer every layer's shapes, parameters, FLOPs and saved tensors.

    ``attention`` is how attention layers compute (None: PyTorch SDPA's choice for ``runtime``
    and ``precision``, per layer, on ``gpu``'s compute capability; see
    :func:`app.domain.graph.ops.attention`). With
    ``logits=last`` at inference, a decoder's output head (the last top-level ``linear`` layer,
    when it reads a [N, S, D] hidden state) runs on ``hidden[:, -1:, :]`` only, as serving
    stacks do: its output is [N, 1, V]. Training always computes every position (the loss reads
    them all); so does an encoder.

    Raises
    ------
    GraphError
        Naming the layer and field of the first shape mismatch, unbound symbol or bad size.
    """
    validate_graph(layers, [decl.name for decl in inputs])
    bindings = with_derived_dims(bindings, inputs)
    decoder = _has_causal_attention(layers)
    head = None
    if decoder and not training and logits is Logits.LAST:
        head = next((id(raw) for raw in reversed(layers) if raw["op"] == "linear"), None)
    state = _State(
        training=training,
        bindings=bindings,
        attention=attention,
        runtime=runtime,
        precision=precision,
        gpu=gpu,
        head=head,
    )
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
        attention_used=tuple(
            dict.fromkeys(
                (layer.result.attention, layer.result.attention_reason)
                for layer in state.layers
                if layer.result.attention is not None
            )
        ),
        is_decoder=decoder,
        logits=Logits.LAST if state.head_name is not None else Logits.ALL,
        logits_head=state.head_name,
        attention_requested=attention,
        logits_requested=logits,
        batchnorm_folded=_folded_batchnorm(layers),
    )


def _folded_batchnorm(layers: Sequence[Mapping[str, Any]]) -> int:
    """Convolutions marked ``batchnorm_folded``, repeats counted."""
    found = 0
    for raw in layers:
        if raw["op"] == "conv2d" and raw.get("batchnorm_folded", False):
            found += 1
        elif raw["op"] in ("block", "repeat"):
            found += _folded_batchnorm(raw["layers"]) * int(raw.get("times", 1))
    return found


def effective_options(
    layers: Sequence[Mapping[str, Any]],
    *,
    training: bool,
    attention: Attention | None,
    logits: Logits,
) -> tuple[Attention | None, Logits]:
    """The ``attention`` and ``logits`` options :func:`analyze` records the same layers with as
    with the ones given, for this graph: ``attention`` only changes ``attention`` layers (None
    when there is none) and ``logits=last`` only a decoder's head at inference (``all``
    otherwise). Only ``attention_requested`` and ``logits_requested`` tell the two analyses
    apart; a cache keyed by these options computes one of them."""
    if not _has_op(layers, "attention"):
        attention = None
    if training or not _has_causal_attention(layers):
        logits = Logits.ALL
    return attention, logits


def _has_op(layers: Sequence[Mapping[str, Any]], op: str) -> bool:
    for raw in layers:
        if raw["op"] == op:
            return True
        if raw["op"] in ("block", "repeat") and _has_op(raw["layers"], op):
            return True
    return False


def _has_causal_attention(layers: Sequence[Mapping[str, Any]]) -> bool:
    for raw in layers:
        if raw["op"] == "attention" and raw.get("causal", False):
            return True
        if raw["op"] in ("block", "repeat") and _has_causal_attention(raw["layers"]):
            return True
    return False


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
        checkpoint()  # app.domain.budget: stop here past the request's deadline
        op = raw["op"]
        if op == "repeat":
            current = _repeat(raw, env, current, state, prefix=prefix)
        elif op == "block":
            scope = dict(env)
            scope[BLOCK_INPUT] = current
            current = _walk(raw["layers"], scope, current, state, prefix=f"{prefix}{raw['name']}.")
        else:
            current = _run(raw, env, current, state, prefix=prefix)
        env[raw["name"]] = current
    return current


def _repeat(
    raw: Mapping[str, Any],
    env: dict[str, _Binding],
    current: _Binding,
    state: _State,
    *,
    prefix: str,
) -> _Binding:
    """Walk a ``repeat`` body ``times`` times, cloning the iterations once they repeat exactly.

    What an iteration records depends only on the enclosing scope ``env`` (the same for every
    iteration: the body writes into a copy), the value entering it, the op cache and the storage
    counter. Suppose an iteration

    * leaves with the same value (shape and kind) it entered with, and
    * evaluated no ``tied_to`` layer: those are never cached; every other cache entry is written
      once, so the next iteration finds exactly the results this one used or computed.

    Then the next iteration feeds every layer the same input values, so it gets the same
    ``OpResult`` objects in the same order, allocates as many storages, evaluates no op (so
    raises nothing) and leaves with the same value again. It differs from this one only in its
    names and storage ids, and so do all later iterations: :func:`_clone_iterations` writes
    them from this one's records instead of walking the body again.
    """
    times = raw.get("times", 1)
    stem = f"{prefix}{raw['name']}."
    for iteration in range(times):
        entering = current
        first_record = len(state.layers)
        base = state.next_storage
        tied_runs = state.tied_runs
        scope = dict(env)
        scope[BLOCK_INPUT] = current
        current = _walk(raw["layers"], scope, current, state, prefix=f"{stem}{iteration}.")
        if (
            iteration + 1 < times
            and state.tied_runs == tied_runs
            and current.value == entering.value
            and _storages_unambiguous(env, entering, current)
        ):
            return _clone_iterations(
                state,
                first_record=first_record,
                base=base,
                entering=entering,
                leaving=current,
                template_prefix=f"{stem}{iteration}.",
                clone_prefixes=[f"{stem}{i}." for i in range(iteration + 1, times)],
            )
    return current


def _storages_unambiguous(
    env: Mapping[str, _Binding], entering: _Binding, leaving: _Binding
) -> bool:
    """Whether cloning can tell the entering value's storage from outer values' storages.

    Cloning moves the entering storage to the next iteration's (this one's leaving storage) and
    keeps the storages of values read by name from outside the repeat. If the entering value
    shares its storage with such a value (the layer just before the repeat; an outer tensor
    that an in-place op of the previous iteration wrote into) and the two moves differ, an id
    alone does not say which applies: walk this iteration instead of cloning from it.
    """
    if entering.storage == leaving.storage:  # the entering storage stays put, like outer ones
        return True
    return all(binding.storage != entering.storage for binding in env.values())


class _Template(NamedTuple):
    """One record of the template iteration, ready to be rewritten for clone ``j``."""

    suffix: str  # the name after the ``stem.{i}.`` prefix of the iteration
    arity: int  # number of inputs
    input_ids: tuple[int, ...]  # ``a0, step0, a1, step1, ...``: input k is ``ak + j * stepk``
    output_id: int  # the output storage is ``output_id + j * output_step``
    output_step: int
    op: str  # the rest is the same in every clone
    input_names: tuple[str, ...]
    output_shape: tuple[int, ...]
    output_kind: TensorKind
    allocates_output: bool
    result: OpResult
    output_numel: int


def _clone_iterations(
    state: _State,
    *,
    first_record: int,
    base: int,
    entering: _Binding,
    leaving: _Binding,
    template_prefix: str,
    clone_prefixes: Sequence[str],
) -> _Binding:
    """Append the records of the iterations after a steady one, rewritten from its records.

    The template iteration (records ``first_record:``, names under ``template_prefix``) found
    the storage counter at ``base`` and allocated ``allocated`` storages. Clone ``j`` (1, 2, ...,
    named by ``clone_prefixes[j - 1]``) allocates the same number in the same order, from
    ``base + j * allocated + 1`` on. A storage id ``s`` of the template becomes in clone ``j``:

    * ``s + j * allocated`` if the template allocated it (``s > base``);
    * clone ``j``'s entering storage if ``s`` is the template's: that is clone ``j - 1``'s
      leaving storage, itself one of these three cases (see ``entering_id``);
    * ``s`` otherwise: a value from outside the repeat, read by name (or a view of one).

    So every id is ``a + j * step`` with ``step`` either ``allocated`` or 0. Ops, shapes,
    results and input names are the template's. Returns the last clone's leaving binding and
    moves the storage counter past the last clone.
    """
    allocated = state.next_storage - base
    if leaving.storage > base:  # clone j enters with template leaving + (j - 1) * allocated
        entering_id = (leaving.storage - allocated, allocated)
    else:  # the template leaves with its entering storage or an outer one: so do the clones
        entering_id = (leaving.storage, 0)

    def affine(storage: int) -> tuple[int, int]:
        """``(a, step)`` such that the template's ``storage`` is ``a + j * step`` in clone j."""
        if storage > base:
            return storage, allocated
        if storage == entering.storage:
            return entering_id
        return storage, 0

    cut = len(template_prefix)
    plan = [
        _Template(
            record.name[cut:],
            len(record.input_storages),
            tuple([n for storage in record.input_storages for n in affine(storage)]),
            *affine(record.output_storage),
            record.op,
            record.input_names,
            record.output_shape,
            record.output_kind,
            record.allocates_output,
            record.result,
            record.output_numel,
        )
        for record in state.layers[first_record:]
    ]
    layers = state.layers
    numbered = list(enumerate(clone_prefixes, start=1))
    for first in range(0, len(numbered), CHECK_EVERY):
        checkpoint()  # app.domain.budget: a 99,999-iteration repeat clones for ~0.3 s
        # one comprehension per CHECK_EVERY clones (not one per clone: a one-layer body)
        layers.extend(
            [
                _make(
                    LayerAnalysis,
                    (
                        head + suffix,
                        op,
                        names,
                        # one and two inputs spelled out: nearly every layer, and much faster
                        (ids[0] + j * ids[1],)
                        if arity == 1
                        else (ids[0] + j * ids[1], ids[2] + j * ids[3])
                        if arity == 2
                        else tuple([ids[2 * k] + j * ids[2 * k + 1] for k in range(arity)]),
                        shape,
                        kind,
                        output + j * step,
                        allocates,
                        result,
                        numel,
                    ),
                )
                for j, head in numbered[first : first + CHECK_EVERY]
                for (
                    suffix,
                    arity,
                    ids,
                    output,
                    step,
                    op,
                    names,
                    shape,
                    kind,
                    allocates,
                    result,
                    numel,
                ) in plan
            ]
        )
    clones = len(clone_prefixes)
    state.next_storage += clones * allocated
    last, last_step = affine(leaving.storage)
    return _make(_Binding, (leaving.value, last + clones * last_step, leaving.weight_numel))


def _run(
    raw: Mapping[str, Any],
    env: dict[str, _Binding],
    current: _Binding,
    state: _State,
    *,
    prefix: str,
) -> _Binding:
    """Record one op layer, evaluating the op unless the cache already holds its result."""
    name = prefix + raw["name"]
    refs = raw.get("inputs")
    if refs is None and raw["op"] == "tensor":
        refs = ()  # a stored tensor reads nothing
    if refs is None:
        sources: tuple[_Binding, ...] = (current,)
        names: tuple[str, ...] = ()
        storages: tuple[int, ...] = (current.storage,)
        shapes: tuple[tuple[int, ...], ...] = (current.value.shape,)
    else:
        sources = tuple([env[ref] for ref in refs])
        names = tuple(refs)
        storages = tuple([source.storage for source in sources])
        shapes = tuple([source.value.shape for source in sources])
    if state.head is not None and id(raw) == state.head and len(shapes[0]) == 3:
        # serving: hidden[:, -1:, :] (a view of the hidden state) feeds the head
        n, _, d = shapes[0]
        first = sources[0]
        sliced = _make(_Binding, (Value((n, 1, d), first.value.kind), first.storage, None))
        sources = (sliced, *sources[1:])
        shapes = ((n, 1, d), *shapes[1:])
        state.head_name = name
    if "tied_to" in raw:
        state.tied_runs += 1
        computed = _evaluate(raw, env, sources, state, name=name)
    else:
        key = (id(raw), shapes)
        cached = state.cache.get(key)
        if cached is None:
            cached = state.cache[key] = _evaluate(raw, env, sources, state, name=name)
        computed = cached
    result = computed.result
    alias = result.alias_of
    if alias is None:
        state.next_storage += 1
        storage = state.next_storage
    else:
        storage = sources[alias].storage
    state.layers.append(
        _make(
            LayerAnalysis,
            (
                name,
                raw["op"],
                names,
                storages,
                result.shape,
                result.kind,
                storage,
                alias is None,
                result,
                computed.numel,
            ),
        )
    )
    return _make(_Binding, (computed.value, storage, computed.weight_numel))


def _evaluate(
    raw: Mapping[str, Any],
    env: Mapping[str, _Binding],
    sources: Sequence[_Binding],
    state: _State,
    *,
    name: str,
) -> _Computed:
    """Run the op's semantics on its inputs (the slow path, once per cache key)."""
    attrs = raw
    if raw["op"] == "reshape":
        attrs = {**raw, "shape": list(_bind_dims(raw["shape"], state.bindings, "shape"))}
    elif raw["op"] == "tensor" and "output_shape" in raw:
        bound = _bind_dims(raw["output_shape"], state.bindings, "output_shape")
        attrs = {**raw, "output_shape": list(bound)}
    tied = "tied_to" in raw
    ctx = OpContext(
        name=name,
        attrs=attrs,
        inputs=[source.value for source in sources],
        training=state.training,
        attention=state.attention,
        runtime=state.runtime,
        precision=state.precision,
        gpu=state.gpu,
        tied_params={
            ref: binding.weight_numel
            for ref, binding in env.items()
            if binding.weight_numel is not None
        }
        if tied
        else {},
    )
    result = OP_IMPLEMENTATIONS[raw["op"]](ctx)
    if result.shape:
        _check_size(result.shape, "output", name)
    if result.params > MAX_NUMEL:
        raise GraphError(
            f"{result.params:,} parameters in one layer exceed 2^50; check the sizes",
            layer=name,
            field="params",
        )
    has_weight = raw["op"] in ("embedding", "linear") and not tied
    return _Computed(
        result=result,
        value=Value(shape=result.shape, kind=result.kind),
        numel=math.prod(result.shape),
        weight_numel=math.prod(result.param_shapes[0]) if has_weight else None,
    )
