"""The step as PyTorch's caching allocator sees it: every allocation and free, in order, for
the replay in :mod:`app.domain.memory.cuda_allocator`."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from fractions import Fraction
from typing import NamedTuple

from app.domain.budget import CHECK_EVERY_MASK, checkpoint
from app.domain.graph.analysis import GraphAnalysis
from app.domain.hardware import FrameworkOverhead
from app.domain.memory.context import Estimation
from app.domain.memory.cuda_allocator import Event, EventsKey
from app.domain.memory.liveness import StoragePlan, checkpoint_unit
from app.domain.memory.memo import layer_totals, memoised


def _param_tensor_bytes(
    analysis: GraphAnalysis, element: Fraction, divisor: int
) -> list[list[int]]:
    """Per layer, the bytes of each of its parameter tensors at ``element`` B per element."""
    num, den = element.numerator, element.denominator * divisor
    per_result: dict[int, list[int]] = {}  # the repeats of a block share their op result
    tensors: list[list[int]] = []
    for layer in analysis.layers:
        sizes = per_result.get(id(layer.result))
        if sizes is None:
            shapes = layer.result.param_shapes
            sizes = per_result[id(layer.result)] = [-(-math.prod(s) * num // den) for s in shapes]
        tensors.append(sizes)
    return tensors


def _spread(total: int, sizes: Sequence[int]) -> list[int]:
    """``total`` bytes split over tensors in proportion to ``sizes`` (state per parameter)."""
    whole = sum(sizes)
    return [total * size // whole for size in sizes] if whole and total else []


class _WeightEvents(NamedTuple):
    """The weights' (and buffers') allocations, the first events of every step."""

    sizes: list[list[int]]  # per layer, its parameter tensors' bytes
    events: tuple[Event, ...]  # one "keep" event: never freed
    key: EventsKey  # the events as the replay memo's key (hashed once)


def _weight_events(analysis: GraphAnalysis, weight: Fraction, model_shard: int) -> _WeightEvents:
    """The weights' events at ``weight`` B per element, split over ``model_shard`` GPUs."""
    num, den = weight.numerator, weight.denominator * model_shard
    # once per distinct op result (the repeats of a block share theirs), as _param_tensor_bytes
    per_result: dict[int, tuple[list[int], list[int]]] = {}
    for layer in analysis.layers:
        result = layer.result
        if id(result) not in per_result:
            tensors = [-(-math.prod(shape) * num // den) for shape in result.param_shapes]
            with_buffers = tensors + [result.buffers_bytes] if result.buffers_bytes else tensors
            per_result[id(result)] = (tensors, with_buffers)
    sizes = [per_result[id(layer.result)][0] for layer in analysis.layers]
    allocated = [size for layer in analysis.layers for size in per_result[id(layer.result)][1]]
    events = _kept(allocated)
    return _WeightEvents(sizes=sizes, events=events, key=EventsKey(events))


def _kept(sizes: Sequence[int]) -> tuple[Event, ...]:
    """Allocations never freed in the step, as one "keep" event (none for no tensor)."""
    return (("keep", tuple(sizes), 0),) if sizes else ()


# Keys of the forward's own tensors: their position in the forward plus this, above any index of
# a step's events (which key the head's and the backward's tensors), so the forward's events
# can be built once and follow any head.
_FORWARD_KEYS = 1 << 48


class _ForwardEvents(NamedTuple):
    """The forward's events, as :func:`step_allocator_events` describes them."""

    events: list[Event]
    cache_keys: list[int]  # autocast's 16-bit weight copies
    new_keys: list[list[int]]  # per layer, the tensors it creates to keep
    live: set[int]  # storages it allocated that are still live at its end


def _forward_events(
    analysis: GraphAnalysis,
    plan: StoragePlan,
    cache: Sequence[Sequence[int]],
    training: bool,
    recompute: Mapping[str, int] | None = None,
) -> _ForwardEvents:
    """Per layer: autocast's weight copies (``cache``), its output and the tensors it creates
    to keep (training), its forward transient (allocated and freed), and the values whose last
    reader it is.

    ``recompute``: full checkpointing's units (:func:`apply_full_checkpointing`). A layer of a
    checkpointed unit creates nothing to keep: ``torch.utils.checkpoint`` runs the unit's
    forward with saved-tensor hooks that store no tensor (non-reentrant: ``_checkpoint_hook``
    packs a placeholder; reentrant: under ``torch.no_grad()``), so its intermediates die after
    their last reader and the unit's backward recomputes them (``recompute``'s bytes)."""
    inputs = {bound.storage for bound in analysis.inputs}
    freed_after: dict[int, list[int]] = {}
    for storage, index in plan.last_use.items():
        if storage not in plan.first_saver and storage not in plan.pinned:
            freed_after.setdefault(index, []).append(storage)
    events: list[Event] = []
    add = events.append
    cache_keys: list[int] = []
    new_keys: list[list[int]] = []
    forward_live: set[int] = set()
    for index, layer in enumerate(analysis.layers):
        if not index & CHECK_EVERY_MASK:
            checkpoint()  # app.domain.budget: stop here past the request's deadline
        op = plan.op_sizes[index]
        for size in cache[index]:
            cache_keys.append(_FORWARD_KEYS + len(events))
            add(("alloc", cache_keys[-1], size))
        if plan.out_alloc[index]:
            add(("alloc", ~layer.output_storage, plan.out_alloc[index]))
            forward_live.add(layer.output_storage)
        kept: list[int] = []
        if training and not (recompute and checkpoint_unit(layer.name) in recompute):
            for _, size in op.new_kept:
                kept.append(_FORWARD_KEYS + len(events))
                add(("alloc", kept[-1], size))
        new_keys.append(kept)
        if op.forward_transient:  # allocated and freed at once
            add(("scratch", _FORWARD_KEYS + len(events), op.forward_transient))
        for storage in freed_after.get(index, ()):
            if storage in forward_live and storage not in inputs:
                forward_live.discard(storage)
                add(("free", ~storage, 0))
    return _ForwardEvents(events, cache_keys, new_keys, forward_live)


def forward_events_key(e: Estimation) -> tuple[object, ...]:
    """What an inference forward's events depend on besides the analysis: the bytes of the
    activation dtype and the runtime (dropout masks, oneDNN buffers), and the tensor-parallel
    degree past 1 (a rank's share of the transients)."""
    tp = e.request.parallelism.tensor
    if tp > 1:
        return ("forward", e.plan.activation, e.sizer.runtime, tp)
    return ("forward", e.plan.activation, e.sizer.runtime)


def step_allocator_events(
    e: Estimation, overhead: FrameworkOverhead, handles: int
) -> tuple[list[Event], int, _WeightEvents, int]:
    """The step as the caching allocator sees it, tensor by tensor, where steady state starts
    (the event index of the second iteration; 0 at inference), the weights' events, the
    first ones (they depend only on the model's parameters, the precision and the sharding),
    and where the forward's events start.

    Persistent first (weights, buffers, master weights, KV cache, inputs and labels, the
    cuBLAS workspaces, DDP's buckets or FSDP's gather buffers), then per layer in forward: its
    output and the tensors it creates to keep, its forward transient (allocated and freed), and
    the values whose last reader it is. Training
    adds the loss, the backward (per layer, last first: the gradient of its inputs, its kernel
    buffers, its parameters' gradients; then the gradient of its output and the tensors only it
    kept are freed), the optimizer step's temporaries, and ``zero_grad(set_to_none=True)``
    freeing the gradients before the next iteration. Two iterations: the first creates the
    optimizer state lazily inside ``step()``, as PyTorch's optimizers do.

    Keys are ints: a storage's is ``~storage`` (negative), a forward tensor's its position in
    the forward plus ``_FORWARD_KEYS``, any other tensor's the index of the event that
    allocates it; tensors never freed in the step (weights, master weights, KV cache, labels,
    workspaces, communication buffers, optimizer state, and a layer's gradients where no
    ``zero_grad`` or hook frees them) have none: each run of them is one "keep" event. The
    forward's events are the same in both iterations (and, at inference, in every estimate of
    the analysis with the activation dtype and runtime): built once.
    """
    analysis, plan, request = e.analysis, e.storage_plan, e.request
    layers = analysis.layers
    model_shard = request.parallelism.tensor * request.parallelism.pipeline
    weight = e.plan.weight
    weights = memoised(
        e.plans,
        analysis,
        ("weights", weight, model_shard),
        lambda: _weight_events(analysis, weight, model_shard),
    )
    if e.weight_tensors is not None:  # QLoRA: the 4-bit base's own tensors, per layer
        replayed = _kept([size for sizes in e.weight_tensors for size in sizes])
        weights = _WeightEvents(list(e.weight_tensors), replayed, EventsKey(replayed))
    events: list[Event] = list(weights.events)
    add = events.append
    flat = [size for sizes in weights.sizes for size in sizes]
    if e.grad_tensors is not None:  # LoRA: state and temporaries follow the trainable tensors
        flat = [size for sizes in e.grad_tensors for size in sizes]
    step = e.step
    kept: list[int] = []  # allocations never freed, in order (one "keep" event)
    if step is not None and step.master_total:
        kept += _spread(step.master_total, flat)
    kv_layers = layer_totals(e.plans, analysis).kv_layers
    kept += _spread(e.kv_bytes, [1] * (2 * kv_layers))  # K and V
    events += _kept(kept)
    inputs = {bound.storage for bound in analysis.inputs}
    for bound in analysis.inputs:
        add(("alloc", ~bound.storage, plan.sizes[bound.storage]))
    kept = [step.labels_bytes] if step is not None and step.labels_bytes else []
    kept += [overhead.workspace_bytes] * (handles if overhead.workspace_bytes else 0)
    kept += e.comm_buffers  # held for the whole step (FSDP's: reused unit after unit)
    events += _kept(kept)
    if step is None:
        shared = memoised(
            e.plans,
            analysis,
            forward_events_key(e),
            lambda: _forward_events(analysis, plan, [[] for _ in layers], False),
        )
        forward_from = len(events)
        events += shared.events
        return events, 0, weights, forward_from
    kept_after: dict[int, list[int]] = {}
    for storage, index in plan.first_saver.items():
        if storage not in plan.pinned:
            kept_after.setdefault(index, []).append(storage)
    cache = (
        (
            e.cast_tensors
            if e.cast_tensors is not None
            else _param_tensor_bytes(analysis, Fraction(e.plan.weight_cache), model_shard)
        )
        if step.cache_total
        else [[] for _ in layers]
    )
    forward, cache_keys, new_keys, forward_live = _forward_events(
        analysis, plan, cache, True, e.recompute
    )
    forward_from = len(events)
    events += forward
    grads = (
        e.grad_tensors
        if e.grad_tensors is not None
        else _param_tensor_bytes(analysis, step.grad_element, step.grad_shard)
    )
    grad_keys: list[list[int]] = [[] for _ in layers]  # per layer, as zero_grad frees them
    out_grad = plan.sizes.get(analysis.output_storage, 0)
    units = [checkpoint_unit(layer.name) if e.recompute else None for layer in layers]
    temporaries: list[int] = []
    if step.temporaries_total and not step.in_backward:  # in backward: stepped in the hooks
        if step.temporaries_largest:
            temporaries = [step.temporaries_total // 2] * 2
        else:
            temporaries = _spread(step.temporaries_total, flat)
    steady_from = 0
    recompute, grad_in_bytes, in_backward = e.recompute, plan.grad_in, step.in_backward
    buffers_of = [2 * op.backward_internal + op.backward_extra for op in plan.op_sizes]
    for iteration in range(2):
        if iteration == 1:
            steady_from = len(events)
            events.extend(forward)
        live = set(forward_live)
        if step.loss_bytes:
            loss = len(events)
            add(("alloc", loss, step.loss_bytes))
        for key in cache_keys:  # autocast's cache ends with the forward
            add(("free", key, 0))
        grad_in = len(events)  # the gradient of the output of the layer after
        add(("alloc", grad_in, out_grad))
        recomputing: str | None = None
        recompute_key = 0
        with_grads = iteration == 0 or not step.accumulate
        for index in reversed(range(len(layers))):
            if not index & CHECK_EVERY_MASK:
                checkpoint()
            if recompute:  # without, every unit is None
                unit = units[index]
                if unit != recomputing:
                    if recomputing is not None:
                        add(("free", recompute_key, 0))
                    if unit is not None and recompute.get(unit):
                        recompute_key = len(events)
                        add(("alloc", recompute_key, recompute[unit]))
                    recomputing = unit if unit is not None and recompute.get(unit) else None
            key = len(events)
            add(("alloc", key, grad_in_bytes[index]))
            buffers = buffers_of[index]
            if buffers:  # allocated and freed at once
                add(("scratch", key + 1, buffers))
            if with_grads and grads[index]:
                if in_backward or (iteration == 0 and not step.accumulate):
                    keys = grad_keys[index]  # freed: by its hook at once, or by zero_grad
                    for size in grads[index]:
                        keys.append(len(events))
                        add(("alloc", len(events), size))
                        if in_backward:  # optimizer_in_backward: freed by its hook at once
                            add(("free", keys.pop(), 0))
                else:  # kept to the end of the step (accumulated, or the last iteration's)
                    events += _kept(grads[index])
            add(("free", grad_in, 0))
            grad_in = key
            for storage in kept_after.get(index, ()):
                if storage in live:
                    live.discard(storage)
                    add(("free", ~storage, 0))
            for key in new_keys[index]:
                add(("free", key, 0))
        if recomputing is not None:
            add(("free", recompute_key, 0))
        add(("free", grad_in, 0))
        if step.loss_bytes:
            add(("free", loss, 0))
        if iteration == 0 and step.state_total:  # lazy state: created by the first step()
            events += _kept(_spread(step.state_total, flat))
        first = len(events)
        for size in temporaries:
            add(("alloc", len(events), size))
        for key in range(first, len(events)):
            add(("free", key, 0))
        for storage in sorted(live - inputs):  # the caller drops the output
            add(("free", ~storage, 0))
        if iteration == 0 and not step.accumulate:  # zero_grad(set_to_none=True)
            for keys in grad_keys:
                for key in keys:
                    add(("free", key, 0))
    return events, steady_from, weights, forward_from
