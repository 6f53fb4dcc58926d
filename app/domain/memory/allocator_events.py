"""The step as PyTorch's caching allocator sees it: every allocation and free, in order, for
the replay in :mod:`app.domain.memory.cuda_allocator`."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from fractions import Fraction
from itertools import chain
from typing import NamedTuple

from app.domain.budget import CHECK_EVERY_MASK, checkpoint
from app.domain.graph.analysis import GraphAnalysis
from app.domain.graph.traits import CUBLAS_GEMM_OPS
from app.domain.hardware import FrameworkOverhead
from app.domain.memory.context import Estimation, StepTensors
from app.domain.memory.cuda_allocator import Blocks, Event, EventsKey
from app.domain.memory.inference_forward import FORWARD_KEYS, Template, fill, forward_template
from app.domain.memory.liveness import (
    StoragePlan,
    adapter_tensor_id,
    checkpoint_unit,
    new_tensor_id,
    offload_last_keepers,
    released_at,
)
from app.domain.memory.memo import LayerColumns, layer_columns, memoised
from app.domain.memory.repeated_blocks import find_blocks_like, shifted


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
    if not whole or not total:
        return []
    # once per distinct size: a model's parameters come in a few sizes (its repeated blocks')
    share = {size: total * size // whole for size in set(sizes)}
    return list(map(share.__getitem__, sizes))


class _WeightEvents(NamedTuple):
    """The weights' (and buffers') allocations, the first events of every step."""

    sizes: list[list[int]]  # per layer, its parameter tensors' bytes
    events: tuple[Event, ...]  # one "keep" event: never freed
    key: EventsKey  # the events as the replay memo's key (hashed once)


def _weight_events(
    analysis: GraphAnalysis, weight: Fraction, model_shard: int, columns: LayerColumns
) -> _WeightEvents:
    """The weights' events at ``weight`` B per element, split over ``model_shard`` GPUs
    (``columns``: the analysis's :func:`layer_columns`)."""
    num, den = weight.numerator, weight.denominator * model_shard
    # once per distinct op result (the repeats of a block share theirs), as _param_tensor_bytes;
    # the layers' lists then joined by C loops (map, chain) rather than a step per layer
    tensors_of: dict[int, list[int]] = {}
    allocated_of: dict[int, list[int]] = {}
    for key, layer in columns.distinct.items():
        result = layer.result
        tensors = [-(-math.prod(shape) * num // den) for shape in result.param_shapes]
        tensors_of[key] = tensors
        allocated_of[key] = tensors + [result.buffers_bytes] if result.buffers_bytes else tensors
    sizes = list(map(tensors_of.__getitem__, columns.ids))
    events = _kept(list(chain.from_iterable(map(allocated_of.__getitem__, columns.ids))))
    return _WeightEvents(sizes=sizes, events=events, key=EventsKey(events))


def _buffer_events(analysis: GraphAnalysis) -> _WeightEvents:
    """ZeRO-3 CPU offload: the parameters' shards live on the host, the GPU keeps the buffers
    (the weights line is 0, the gathered units are FSDP's buffers in ``e.comm_buffers``)."""
    buffers = [layer.result.buffers_bytes for layer in analysis.layers]
    events = _kept([size for size in buffers if size])
    return _WeightEvents(sizes=[[] for _ in buffers], events=events, key=EventsKey(events))


def _kept(sizes: Sequence[int]) -> tuple[Event, ...]:
    """Allocations never freed in the step, as one "keep" event (none for no tensor)."""
    return (("keep", tuple(sizes), 0),) if sizes else ()


# Keys of the forward's own tensors (their position in the forward plus this)
_FORWARD_KEYS = FORWARD_KEYS


class _ForwardEvents(NamedTuple):
    """The forward's events, as :func:`step_allocator_events` describes them."""

    events: list[Event]
    # per layer, the frees of autocast's 16-bit weight copies it made (built once, replayed in
    # both iterations' backward)
    cache_frees: list[list[Event]]
    # per layer, the frees of the tensors it creates to keep (still on the GPU)
    new_frees: list[list[Event]]
    live: set[int]  # storages it allocated that are still live at its end
    on_gpu: dict[int, int]  # offloaded: kept tensor (plan id) -> its key, still on the GPU


class _Offload(NamedTuple):
    """Activation offloading's schedule of the tensors kept for backward, by plan id (a
    storage, or :func:`new_tensor_id`): the breakdown's rule
    (:func:`app.domain.memory.liveness.offload_peaks`), so that the replay's step is the
    breakdown's. Pack (``torch.autograd.graph.save_on_cpu`` / torchtune
    ``OffloadActivations``): the tensor is copied to pinned host memory when it is saved and
    the GPU tensor is freed once the forward no longer reads it and its copy has left (one
    layer after the later of its last read and its keeper). Unpack: a new GPU tensor copied
    back for the backward, from the backward of the layer after its last keeper (prefetched
    one layer ahead; :func:`offload_last_keepers`: a checkpointed unit's input is read by the
    unit's last layer, which recomputes it) until its earliest keeper's backward has run."""

    release_after: dict[int, list[int]]  # forward layer -> ids whose GPU tensor is freed after
    at_backward: list[int]  # ids still on the GPU at the end of forward (copy in flight)
    back_at: dict[int, list[int]]  # backward layer -> ids copied back before it
    keeper: dict[int, int]  # id -> its earliest keeper (the copy back is freed after it)
    sizes: dict[int, int]  # id -> bytes
    adapters: dict[int, int]  # layer -> the id of its LoRA adapters' kept tensors, offloaded


def _offload_schedule(
    analysis: GraphAnalysis,
    plan: StoragePlan,
    recompute: Mapping[str, int],
    adapters: Mapping[int, int],
) -> _Offload:
    """:class:`_Offload` of ``plan``: every kept tensor but the model's inputs and output (the
    caller holds them), and the LoRA adapters' kept tensors of ``adapters`` (layer -> bytes),
    as :func:`offload_peaks` offloads them."""
    layers = len(analysis.layers)
    last_keeper = offload_last_keepers(analysis, plan, recompute)
    release_after: dict[int, list[int]] = {}
    at_backward: list[int] = []
    back_at: dict[int, list[int]] = {}
    keeper: dict[int, int] = {}
    sizes: dict[int, int] = {}
    # id -> (earliest keeper, released before this forward layer, last keeper)
    schedule = {
        key: (first, released_at(plan, key, first), last_keeper.get(key, first))
        for key, first in plan.first_saver.items()
        if key not in plan.pinned and plan.sizes.get(key)
    }
    ids = {index: adapter_tensor_id(index) for index, size in adapters.items() if size}
    for index, key in ids.items():
        schedule[key] = (index, index + 2, index)
        sizes[key] = adapters[index]
    for key, (first, released, last) in schedule.items():
        keeper[key] = first
        sizes.setdefault(key, plan.sizes.get(key, 0))
        if released < layers:
            release_after.setdefault(released - 1, []).append(key)
        else:
            at_backward.append(key)
        back_at.setdefault(min(layers - 1, last + 1), []).append(key)
    return _Offload(release_after, at_backward, back_at, keeper, sizes, ids)


def _forward_events(
    analysis: GraphAnalysis,
    plan: StoragePlan,
    cache: Sequence[Sequence[int]],
    training: bool,
    recompute: Mapping[str, int] | None = None,
    offload: _Offload | None = None,
    adapter_saved: Mapping[int, int] | None = None,
) -> _ForwardEvents:
    """Per layer: autocast's weight copies (``cache``), its output and the tensors it creates
    to keep (training), its forward transient (allocated and freed), and the values whose last
    reader it is.

    ``recompute``: full checkpointing's units (:func:`apply_full_checkpointing`). A layer of a
    checkpointed unit creates nothing to keep: ``torch.utils.checkpoint`` runs the unit's
    forward with saved-tensor hooks that store no tensor (non-reentrant: ``_checkpoint_hook``
    packs a placeholder; reentrant: under ``torch.no_grad()``), so its intermediates die after
    their last reader and the unit's backward recomputes them (``recompute``'s bytes).

    ``offload``: activation offloading's schedule; a kept tensor's GPU copy is freed after
    the layer its schedule names, or stays to the end of forward (``on_gpu``).
    ``adapter_saved``: LoRA, per layer, what its adapters keep for backward (one tensor, freed
    after the layer's backward; a checkpointed unit's come with its recompute), on the GPU as
    the breakdown's adapter_activations line has them."""
    inputs = {bound.storage for bound in analysis.inputs}
    first_saver, pinned = plan.first_saver, plan.pinned
    freed_after: dict[int, list[int]] = {}
    for storage, index in plan.last_use.items():
        if storage not in first_saver and storage not in pinned and storage not in inputs:
            freed_after.setdefault(index, []).append(storage)
    events: list[Event] = []
    add = events.append
    cache_frees: list[list[Event]] = []
    new_frees: list[list[Event]] = []
    forward_live: set[int] = set()
    on_gpu: dict[int, int] = {}  # offloaded kept tensors allocated and not yet released
    offloaded = offload.keeper if offload is not None else {}
    units = recompute or {}
    adapters = adapter_saved or {}
    for index, (layer, op, out_bytes, copies) in enumerate(
        zip(analysis.layers, plan.op_sizes, plan.out_alloc, cache, strict=True)
    ):
        if not index & CHECK_EVERY_MASK:
            checkpoint()  # app.domain.budget: stop here past the request's deadline
        frees: list[Event] = []
        for size in copies:
            key = _FORWARD_KEYS + len(events)
            add(("alloc", key, size))
            frees.append(("free", key, 0))
        cache_frees.append(frees)
        if out_bytes:
            storage = layer.output_storage
            add(("alloc", ~storage, out_bytes))
            forward_live.add(storage)
            if storage in offloaded:
                on_gpu[storage] = ~storage
        frees = []
        if training and not (units and checkpoint_unit(layer.name) in units):
            if adapters.get(index):
                key = _FORWARD_KEYS + len(events)
                add(("alloc", key, adapters[index]))
                if offload is not None and index in offload.adapters:  # packed to the host
                    on_gpu[offload.adapters[index]] = key
                else:
                    frees.append(("free", key, 0))
            for slot, size in op.new_kept:
                key = _FORWARD_KEYS + len(events)
                add(("alloc", key, size))
                if offloaded and new_tensor_id(index, slot) in offloaded:
                    on_gpu[new_tensor_id(index, slot)] = key
                else:
                    frees.append(("free", key, 0))
        new_frees.append(frees)
        if op.forward_transient:  # allocated and freed at once
            add(("scratch", _FORWARD_KEYS + len(events), op.forward_transient))
        if index in freed_after:
            for storage in freed_after[index]:
                if storage in forward_live:
                    forward_live.discard(storage)
                    add(("free", ~storage, 0))
        if offload is not None:
            for released in offload.release_after.get(index, ()):
                if released in on_gpu:  # its copy to the host is done: the GPU tensor goes
                    forward_live.discard(released)
                    add(("free", on_gpu.pop(released), 0))
    return _ForwardEvents(events, cache_frees, new_frees, forward_live, on_gpu)


class _Recompute(NamedTuple):
    """A checkpointed unit's recompute, tensor by tensor: its events with slots for keys
    (``("alloc", slot, bytes)``, ``("scratch", 0, bytes)``, ``("free", slot, 0)``), emitted
    with fresh keys each time, and per layer the slots its backward releases."""

    events: list[tuple[str, int, int]]
    released_after: dict[int, list[int]]  # layer -> slots freed after its backward


def _recompute_events(
    analysis: GraphAnalysis,
    plan: StoragePlan,
    layer_units: Sequence[str | None],
    recompute: Mapping[str, int],
    adapter_saved: Mapping[int, int],
) -> dict[str, _Recompute]:
    """Per checkpointed unit, the forward ``torch.utils.checkpoint`` runs again in backward
    (non-reentrant: at the first unpack of one of the unit's saved tensors), as
    :func:`_forward_events` emits a layer: its output, the tensors it creates to keep (and its
    adapters' saved tensor), its forward transient (allocated and freed), and the values whose
    last reader it is, freed unless a layer of the unit keeps them. The recomputed saved
    tensors are the breakdown's (:func:`apply_full_checkpointing`: what the unit's layers kept
    before checkpointing, less what is still kept, e.g. the unit's input), so their bytes sum
    to ``recompute[unit]`` plus the adapters'; each is freed after the backward of the
    earliest layer keeping it (the autograd node drops the unpacked tensor, and the
    checkpoint's frame holds it by a weak handle). A kept storage no layer of the unit
    produces is allocated first. Early stop (``torch.utils.checkpoint``'s default): the
    recompute ends with the last layer whose output or new tensors are kept, so the unit's
    output (the next unit's input, still held) is not made again; what is left of the
    recomputed forward's other values is freed when it stops. Autocast's weight copies are not
    replayed (not in the breakdown's recompute line)."""
    units: dict[str, list[int]] = {}
    for index, unit in enumerate(layer_units):  # each layer's checkpoint_unit
        if unit is not None and recompute.get(unit):
            units.setdefault(unit, []).append(index)
    return {
        unit: _unit_recompute(analysis, plan, indices, adapter_saved)
        for unit, indices in units.items()
    }


def _unit_recompute(
    analysis: GraphAnalysis,
    plan: StoragePlan,
    indices: Sequence[int],
    adapter_saved: Mapping[int, int],
) -> _Recompute:
    """:func:`_recompute_events` of the unit of layers ``indices``."""
    keeper: dict[int, int] = {}  # recomputed storage -> earliest layer of the unit keeping it
    for index in indices:
        saved = [*plan.reused[index]]
        saved += [new_tensor_id(index, slot) for slot, _ in plan.op_sizes[index].new_kept]
        for key in saved:
            if key not in plan.first_saver and key not in keeper:  # not still kept
                keeper[key] = index
    produced = {analysis.layers[index].output_storage for index in indices if plan.out_alloc[index]}
    stop = max(
        (
            index
            for index in indices
            if adapter_saved.get(index)
            or plan.op_sizes[index].new_kept
            or analysis.layers[index].output_storage in keeper
        ),
        default=indices[-1],
    )
    events: list[tuple[str, int, int]] = []
    released_after: dict[int, list[int]] = {}
    slot_of: dict[int, int] = {}  # recomputed value no layer of the unit keeps -> its slot

    def alloc(size: int, keeper_index: int | None) -> int:
        slot = len(events)  # unique: one alloc per slot
        events.append(("alloc", slot, size))
        if keeper_index is not None:
            released_after.setdefault(keeper_index, []).append(slot)
        return slot

    for key, index in keeper.items():  # kept, made by no layer of the unit: at the start
        if key >= 0 and key not in produced:
            alloc(plan.sizes[key], index)
    freed_at: dict[int, list[int]] = {}  # layer -> recomputed values it reads last
    for index in indices:
        if index > stop:
            break
        layer, op = analysis.layers[index], plan.op_sizes[index]
        storage = layer.output_storage
        if plan.out_alloc[index]:
            if storage in keeper:
                alloc(plan.sizes[storage], keeper[storage])
            else:
                slot_of[storage] = alloc(plan.out_alloc[index], None)
                last = max(index, min(plan.last_use.get(storage, index), stop))
                freed_at.setdefault(last, []).append(storage)
        if adapter_saved.get(index):
            alloc(adapter_saved[index], index)
        for slot, size in op.new_kept:
            alloc(size, keeper.get(new_tensor_id(index, slot), index))
        if op.forward_transient:
            events.append(("scratch", 0, op.forward_transient))
        # the rest of the recomputed forward never runs (early stop): freed at ``stop``
        for value in freed_at.pop(index, ()):
            events.append(("free", slot_of[value], 0))
    return _Recompute(events, released_after)


def _loss_backward(events: list[Event], step: StepTensors, loss: int, out_grad: int) -> int:
    """The loss's backward (:mod:`app.domain.memory.loss`), appended to ``events``; returns the
    key of the gradient of the model's output. Without a cross-entropy (``loss`` < 0) that
    gradient alone. Else ``NllLossBackward``'s gradient of the log-probabilities, then
    ``LogSoftmaxBackward``'s of its input, after which the nll gradient and the kept
    log-probabilities (key ``loss``) are freed; with an upcast, ``ToCopyBackward`` casts the
    fp32 gradient to the logits' dtype and the fp32 one is freed. Chunked
    (``loss_chunk_bytes``): every chunk's loss backward runs before the head's, each with two
    fp32 chunk gradients; the first's, then the log-probabilities freed and the logits' whole
    gradient (the chunks' together) allocated."""
    add = events.append
    if loss >= 0 and step.loss_chunk_bytes:
        nll = _alloc(events, step.loss_chunk_bytes)
        grad = _alloc(events, step.loss_chunk_bytes)
        add(("free", nll, 0))
        add(("free", grad, 0))
        add(("free", loss, 0))
        return _alloc(events, out_grad)
    if loss < 0 or not step.loss_grad_bytes:
        return _alloc(events, out_grad)
    nll = _alloc(events, step.loss_grad_bytes)
    grad = _alloc(events, step.loss_grad_bytes if step.loss_upcast_bytes else out_grad)
    add(("free", nll, 0))
    add(("free", loss, 0))
    if not step.loss_upcast_bytes:
        return grad
    cast = _alloc(events, out_grad)
    add(("free", grad, 0))
    return cast


def _alloc(events: list[Event], size: int) -> int:
    """Append an allocation keyed by its index; return the key."""
    key = len(events)
    events.append(("alloc", key, size))
    return key


def _first_gemm(analysis: GraphAnalysis) -> int | None:
    """The key of the output of the first layer that runs a cuBLAS GEMM (None: no such layer,
    or it allocates no output)."""
    for layer in analysis.layers:
        if layer.op in CUBLAS_GEMM_OPS:
            return ~layer.output_storage if layer.allocates_output else None
    return None


def _warm_up_forward(
    forward: Sequence[Event],
    first_gemm: int,
    workspaces: Sequence[int],
    template: Template | None = None,
) -> tuple[list[Event], int]:
    """Inference's warm-up forward: PyTorch allocates a cuBLAS workspace at the first GEMM of
    the process (``getCurrentCUDABlasHandle`` / ``getCUDABlasLtWorkspace``,
    aten/src/ATen/cuda/CublasHandlePool.cpp), inside blocks the forward has cached by then,
    and keeps it; the caller then drops what the forward returned. The steady forward that
    follows can find a cached block split by it (measured on an H100, benchmarks/fidelity/cuda:
    22 of the 28 CNN inferences add a segment in their first steady step, VGG-16 fp32 at batch
    32 786 MiB, conv1_2's work space). Also returns the index of the forward's event before
    which the workspaces' "keep" is inserted. ``template``: the forward's (its kinds and keys
    and the keys live at its end, found once per template rather than by a walk per call)."""
    if template is None:
        allocs = (
            i for i, (kind, key, _) in enumerate(forward) if (kind, key) == ("alloc", first_gemm)
        )
        at = next(allocs, -1) + 1
        live: dict[object, None] = {}
        for kind, key, _ in forward:
            if kind == "alloc":
                live[key] = None
            elif kind == "free":
                live.pop(key, None)
        live_keys: Sequence[object] = list(live)
    else:
        at = template.first_alloc(first_gemm) + 1
        live_keys = template.live_keys
    events = [*forward[:at], *_kept(workspaces), *forward[at:]]
    events += [("free", key, 0) for key in live_keys]
    return events, at


def _inference_forward(
    analysis: GraphAnalysis, plan: StoragePlan, e: Estimation
) -> tuple[Template, list[Event], list[int]]:
    """An inference forward's template, its events and their bytes
    (:mod:`~app.domain.memory.inference_forward`)."""
    template = forward_template(analysis, plan, e.plans, e.columns)
    return template, *fill(template, plan)


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
) -> tuple[list[Event], int, _WeightEvents, int, list[Blocks]]:
    """The step as the caching allocator sees it, tensor by tensor, where steady state starts
    (the event index of the second iteration, or of inference's steady forward; 0 at inference
    without a GEMM layer or a workspace), the weights' events, the
    first ones (they depend only on the model's parameters, the precision and the sharding),
    where the forward's events start, and at inference the runs of identical blocks in the
    forwards (:func:`~app.domain.memory.repeated_blocks.find_blocks`, for the replay to skip).

    Persistent first (weights, buffers, master weights, KV cache, inputs and labels, the
    cuBLAS workspaces, DDP's buckets; FSDP's gather buffers from the forward to the end of the
    backward), then per layer in forward: its
    output and the tensors it creates to keep, its forward transient (allocated and freed), and
    the values whose last reader it is. Training
    adds the loss, the backward (per layer, last first: the gradient of its inputs, its kernel
    buffers, its parameters' gradients; then the gradient of its output and the tensors only it
    kept are freed), the optimizer step's temporaries, and ``zero_grad(set_to_none=True)``
    freeing the gradients before the next iteration. Two iterations: the first creates the
    optimizer state lazily inside ``step()``, as PyTorch's optimizers do. Inference: a warm-up
    forward that allocates the cuBLAS workspace at its first GEMM (:func:`_warm_up_forward`),
    then the steady forward.

    The offload options change what the GPU holds as the breakdown says: with
    ``activation_offload`` a kept tensor is freed in forward once its copy to the host has
    left and copied back for backward (:class:`_Offload`); with ``parallelism.cpu_offload``
    no weight, gradient, master weight, optimizer state or step temporary is allocated (the
    host's), FSDP's buffers stand for the unit in flight. A checkpointed unit's layers keep
    nothing in forward (:func:`_forward_events`); at its backward the unit's forward runs
    again, tensor by tensor, and its layers' backward free what it recomputed
    (:func:`_recompute_events`).

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
    # CPU offload (parallelism.cpu_offload), as the breakdown has it (app.domain.memory
    # .moments): the gradients', optimizer state's and master weights' partitions are host
    # lines and the optimizer steps on the host; from ZeRO-3 the weights' shards too, the GPU
    # holding the buffers and what is gathered (FSDP's or DeepSpeed's buffers, e.comm_buffers,
    # through forward and backward); ZeRO-2 (DeepSpeed offload_optimizer) keeps the weights.
    on_host = request.parallelism.cpu_offload
    weights_on_host = on_host and request.parallelism.zero_stage >= 3
    # ZeRO-3 / FSDP: a rank stores 1 / data of every parameter (the weights line's divisor;
    # the gathered units are FSDP's buffers)
    weight_shard = model_shard
    if request.parallelism.zero_stage >= 3:
        weight_shard *= request.parallelism.data
    weights = memoised(
        e.plans,
        analysis,
        ("buffers",) if weights_on_host else ("weights", weight, weight_shard),
        (lambda: _buffer_events(analysis))
        if weights_on_host
        else lambda: _weight_events(
            analysis, weight, weight_shard, e.columns or layer_columns(e.plans, analysis)
        ),
    )
    if e.weight_tensors is not None and not weights_on_host:  # QLoRA: the 4-bit base's own
        replayed = _kept([size for sizes in e.weight_tensors for size in sizes])
        weights = _WeightEvents(list(e.weight_tensors), replayed, EventsKey(replayed))
    events: list[Event] = list(weights.events)
    add = events.append
    step = e.step
    flat: list[int] = []  # the trainable tensors (training's state and temporaries)
    if step is not None:
        flat = [size for sizes in weights.sizes for size in sizes]
    if step is not None and e.grad_tensors is not None:  # LoRA: they follow the trainable ones
        flat = [size for sizes in e.grad_tensors for size in sizes]
    kept: list[int] = []  # allocations never freed, in order (one "keep" event)
    if e.adapter_tensors is not None:  # LoRA: the adapters (and modules_to_save copies)
        kept += [size for sizes in e.adapter_tensors for size in sizes]
    if step is not None and step.master_total and not on_host:
        kept += _spread(step.master_total, flat)
    kv_layers = e.totals.kv_layers
    kept += _spread(e.kv_bytes, [1] * (2 * kv_layers))  # K and V
    events += _kept(kept)
    inputs = {bound.storage for bound in analysis.inputs}
    for bound in analysis.inputs:
        add(("alloc", ~bound.storage, plan.sizes[bound.storage]))
    kept = [step.labels_bytes] if step is not None and step.labels_bytes else []
    workspaces = [overhead.workspace_bytes] * (handles if overhead.workspace_bytes else 0)
    first_gemm = _first_gemm(analysis) if step is None and workspaces else None
    if first_gemm is None:
        kept += workspaces
    # DDP's buckets: allocated when DDP wraps the model, held. ZeRO's buffers (training: FSDP's
    # gather buffers, DeepSpeed's gathered parameters and reduce bucket): reused through
    # forward and backward, freed once the last gradients are reduced (FSDP reshards after
    # backward), so not held by the optimizer step (the breakdown's optimizer_step moment has
    # no fsdp_buffers / zero_* line).
    gathered = e.comm_buffers if step is not None and request.parallelism.zero_stage else []
    if not gathered:
        kept += e.comm_buffers
    events += _kept(kept)
    if step is None:
        # the events of _forward_events(analysis, plan, [[] for _ in layers], False), from
        # the template the model's forwards share (inference_forward)
        template, forward, sizes = memoised(
            e.plans, analysis, forward_events_key(e), lambda: _inference_forward(analysis, plan, e)
        )
        repeated = memoised(
            e.plans,
            analysis,
            ("forward blocks", *forward_events_key(e)[1:]),
            lambda: find_blocks_like(forward, e.plans, (template.kinds, template.keys, sizes)),
        )
        forward_from = len(events)
        if first_gemm is None:
            events += forward
            return events, 0, weights, forward_from, shifted(repeated, forward_from)
        warm_up, workspace_at = _warm_up_forward(forward, first_gemm, workspaces, template)
        events += warm_up
        steady_from = len(events)
        events += forward
        blocks = shifted(repeated, forward_from, workspace_at) + shifted(repeated, steady_from)
        return events, steady_from, weights, forward_from, blocks
    kept_after: list[list[int]] = [[] for _ in layers]  # per layer, the storages it keeps first
    for storage, index in plan.first_saver.items():
        if storage not in plan.pinned:
            kept_after[index].append(storage)
    cache = (
        (
            e.cast_tensors
            if e.cast_tensors is not None
            else _param_tensor_bytes(analysis, Fraction(e.plan.weight_cache), model_shard)
        )
        if step.cache_total
        else [[] for _ in layers]
    )
    offload = (
        _offload_schedule(analysis, plan, e.recompute, e.offloaded_adapters)
        if request.training_options.activation_offload
        else None
    )
    forward, cache_frees, new_frees, forward_live, on_gpu = _forward_events(
        analysis, plan, cache, True, e.recompute, offload, e.adapter_saved
    )
    gathered_from = len(events)
    for size in gathered:
        add(("alloc", len(events), size))
    forward_from = len(events)
    events += forward
    grads = (
        [[] for _ in layers]  # on the host: the unit's gradients are in FSDP's buffers
        if on_host
        else e.grad_tensors
        if e.grad_tensors is not None
        else _param_tensor_bytes(analysis, step.grad_element, step.grad_shard)
    )
    grad_frees: list[list[Event]] = [[] for _ in layers]  # per layer, as zero_grad frees them
    out_grad = plan.sizes.get(analysis.output_storage, 0)
    units: list[str | None] = (
        [checkpoint_unit(layer.name) for layer in layers] if e.recompute else [None] * len(layers)
    )
    recomputed = dict(e.recompute)  # a unit's recompute, with its adapters' saved tensors
    for index, size in e.adapter_saved.items():
        unit = units[index]
        if unit is not None and unit in recomputed:
            recomputed[unit] += size
    temporaries: list[int] = []
    # in backward: stepped in the hooks; on the host: no step on the GPU
    if step.temporaries_total and not step.in_backward and not on_host:
        if step.temporaries_largest:
            temporaries = [step.temporaries_total // 2] * 2
        else:
            temporaries = _spread(step.temporaries_total, flat)
    steady_from = 0
    recompute, grad_in_bytes, in_backward = recomputed, plan.grad_in, step.in_backward
    recipes = (
        _recompute_events(analysis, plan, units, recompute, e.adapter_saved) if recompute else {}
    )
    buffers_of = [2 * op.backward_internal + op.backward_extra for op in plan.op_sizes]
    # autocast's cache ends with the forward; a GEMM's copy stays saved until its backward
    saved_casts = e.released_casts or [0] * len(layers)
    # without offloading, what a layer's backward frees after its gradients is the same in
    # both iterations (of the storages it kept first, those live at the backward's start; the
    # tensors it created to keep; its saved autocast copies): built once
    layer_frees: list[list[Event]] = []
    for iteration in range(2):
        if iteration == 1:
            steady_from = gathered_from = len(events)
            for size in gathered:
                add(("alloc", len(events), size))
            # keep_outputs: the previous step's outputs, freed once this forward returns
            previous = []
            for size in e.previous_outputs:
                previous.append(len(events))
                add(("alloc", previous[-1], size))
            events.extend(forward)
            events.extend(("free", key, 0) for key in previous)
        live = set(forward_live)
        if step.loss_bytes:  # HF ForCausalLMLoss: logits.float(), then log_softmax keeps its
            upcast = len(events)  # output; the fp32 copy dies when the loss function returns
            if step.loss_upcast_bytes:
                add(("alloc", upcast, step.loss_upcast_bytes))
            loss = len(events)
            add(("alloc", loss, step.loss_bytes))
            if step.loss_upcast_bytes:
                add(("free", upcast, 0))
            if e.output_dropped and analysis.output_storage in live:  # the caller drops it
                live.discard(analysis.output_storage)
                add(("free", ~analysis.output_storage, 0))
        for index, frees in enumerate(cache_frees):
            if not saved_casts[index]:
                events += frees
        back: dict[int, int] = {}  # offloaded: kept tensor -> its copy back on the GPU
        if offload is not None:  # the last layers' kept tensors: their copies have left
            for kept_id in offload.at_backward:
                if kept_id in on_gpu:
                    live.discard(kept_id)
                    add(("free", on_gpu[kept_id], 0))
        elif not layer_frees:
            layer_frees = [
                [("free", ~storage, 0) for storage in storages if storage in live]
                + new_frees[index]
                + (cache_frees[index] if saved_casts[index] else [])
                for index, storages in enumerate(kept_after)
            ]
        grad_in = _loss_backward(events, step, loss if step.loss_bytes else -1, out_grad)
        recomputing: str | None = None
        recipe: _Recompute | None = None
        recomputed_keys: dict[int, int] = {}  # the recompute's slot -> its key, while live
        with_grads = iteration == 0 or not step.accumulate
        # freed by its hook at once (optimizer in backward), or by zero_grad; else kept to the
        # end of the step (accumulated, or the last iteration's)
        fresh_grads = in_backward or (iteration == 0 and not step.accumulate)
        for index in reversed(range(len(layers))):
            if not index & CHECK_EVERY_MASK:
                checkpoint()
            if recompute:  # without, every unit is None
                unit = units[index]
                if unit != recomputing:
                    for key in recomputed_keys.values():  # none left: each has its keeper
                        add(("free", key, 0))
                    recomputed_keys = {}
                    recipe = recipes.get(unit) if unit is not None else None
                    if recipe is not None:  # the unit's forward again, tensor by tensor
                        for kind, slot, size in recipe.events:
                            if kind == "free":
                                add(("free", recomputed_keys.pop(slot), 0))
                            else:
                                if kind == "alloc":
                                    recomputed_keys[slot] = len(events)
                                add((kind, len(events), size))
                    recomputing = unit if recipe is not None else None
            if offload is not None:  # unpacked: copied back from the host (prefetched)
                for kept_id in offload.back_at.get(index, ()):
                    back[kept_id] = len(events)
                    add(("alloc", len(events), offload.sizes[kept_id]))
            key = len(events)
            add(("alloc", key, grad_in_bytes[index]))
            buffers = buffers_of[index]
            if buffers:  # allocated and freed at once
                add(("scratch", key + 1, buffers))
            if with_grads and grads[index]:
                if not fresh_grads:
                    events += _kept(grads[index])
                elif in_backward:  # optimizer_in_backward: freed by its hook at once
                    for size in grads[index]:
                        add(("alloc", len(events), size))
                        add(("free", len(events) - 1, 0))
                else:
                    frees = grad_frees[index]
                    for size in grads[index]:
                        frees.append(("free", len(events), 0))
                        add(("alloc", len(events), size))
            add(("free", grad_in, 0))
            grad_in = key
            if offload is None:
                events += layer_frees[index]
            else:
                for storage in kept_after[index]:
                    if storage in back:  # offloaded: its copy back, after its earliest keeper
                        add(("free", back.pop(storage), 0))
                    elif storage in live:
                        live.discard(storage)
                        add(("free", ~storage, 0))
                if offload.adapters.get(index) in back:  # LoRA's, back
                    add(("free", back.pop(offload.adapters[index]), 0))
                events += new_frees[index]
                if saved_casts[index]:  # its autocast copies: the GEMM's saved mat2, released
                    events += cache_frees[index]
            if recipe is not None:  # the recomputed tensors only this layer still keeps
                for slot in recipe.released_after.get(index, ()):
                    add(("free", recomputed_keys.pop(slot), 0))
        for key in recomputed_keys.values():
            add(("free", key, 0))
        add(("free", grad_in, 0))
        for key in range(gathered_from, gathered_from + len(gathered)):
            add(("free", key, 0))  # FSDP resharded after backward
        if iteration == 0 and step.state_total and not on_host:  # lazy: by the first step()
            events += _kept(_spread(step.state_total, flat))
        first = len(events)  # the step's temporaries, freed as it ends
        events += [("alloc", key, size) for key, size in enumerate(temporaries, first)]
        events += [("free", key, 0) for key in range(first, len(events))]
        if offload is None:  # the backward freed every storage it kept
            live.difference_update(*kept_after)
        for storage in sorted(live - inputs):  # the caller drops the output
            add(("free", ~storage, 0))
        if iteration == 0 and not step.accumulate:  # zero_grad(set_to_none=True)
            for frees in grad_frees:
                events += frees
    return events, steady_from, weights, forward_from, []
