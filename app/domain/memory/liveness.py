"""When each tensor of a step is live: the storage plan (what every layer allocates and keeps
for backward), full checkpointing, and the timeline walked forward and backward for its peaks.

References
----------
Korthikanti et al., "Reducing Activation Recomputation in Large Transformer Models", 2022.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from fractions import Fraction
from functools import lru_cache
from itertools import accumulate, compress
from operator import add, attrgetter, mul, sub
from typing import NamedTuple

from app.domain.graph.analysis import GraphAnalysis, LayerAnalysis
from app.domain.graph.ops import Saved, TensorKind, Transient
from app.domain.graph.ops.core import CUDNN_WORKSPACE
from app.domain.graph.traits import CONV_OPS, INTERNAL_TENSOR_OPS, LOOKUP_OPS
from app.domain.memory.compiled import compiled_kept
from app.domain.memory.formulas import Sizer
from app.domain.memory.frozen import WEIGHT_GRAD_LABELS, FrozenBase
from app.domain.memory.memo import LayerColumns, layer_columns
from app.domain.memory.request import MemoryRequest
from app.domain.workload import Checkpointing, Runtime

_IN0, _OUT, _NEW = 0, 1, 2


_INPUT = 3  # _INPUT + k: the op's k-th input (``in1``, ``in2``, ...)


class OpSizes(NamedTuple):
    """Byte figures of one op result (shared by every repeat of a block)."""

    kept_inputs: tuple[int, ...]  # which of its inputs it keeps for backward (0: the first)
    keeps_input: bool  # kept_inputs is exactly (0,): the common case, handled inline
    keeps_output: bool  # keeps its output for backward
    new_kept: tuple[tuple[int, int], ...]  # (slot, bytes) of tensors it creates to keep
    new_total: int  # their bytes
    forward_transient: int
    backward_internal: int
    output: int
    backward_extra: int  # kernel buffers in this layer's backward beyond the gradients
    output_storage: int  # bytes of the output value in its own dtype (ids are 8 B)
    backward_static: int  # output gradient + internal gradients + kernel buffers


# Transients of a composite op that are row-parallel outputs (full hidden size on every
# tensor-parallel rank before their all-reduce); every other transient of attention / MLP / MoE
# is a column-parallel output (QKV, scores, MLP intermediates) split over the ranks.
_ROW_PARALLEL_TRANSIENTS = frozenset({"expert_outputs"})


def transient_numel(layer: LayerAnalysis, transient: Transient, tp: int) -> int:
    """Elements of one of ``layer``'s forward transients on one tensor-parallel rank:
    Megatron-style, the column-parallel ones (attention heads' q/k/v, scores and
    probabilities, MLP up/gate intermediates) are split ``ceil(numel / tp)``, the row-parallel
    ones are whole (Shoeybi et al., "Megatron-LM", 2019) [elements]."""
    if tp > 1 and layer.op in INTERNAL_TENSOR_OPS:
        if transient.label not in _ROW_PARALLEL_TRANSIENTS:
            return -(-transient.numel // tp)
    return transient.numel


def _transient_bytes(layer: LayerAnalysis, sizer: Sizer, tp: int) -> int:
    """Bytes of the tensors ``layer`` holds only inside its forward on one rank."""
    return sum(
        sizer.storage_bytes(transient_numel(layer, t, tp), t.storage)
        for t in layer.result.transients
    )


def _cudnn_backward_workspace(layer: LayerAnalysis, sizer: Sizer, tp: int) -> int:
    """Bytes of the work space a cuDNN convolution's or RNN's backward takes on CUDA: the
    forward's. A convolution's (:func:`app.domain.graph.ops.convolution.
    cudnn_conv_workspace_numel`) stands for the larger of the backward-data and backward-filter
    calls, which run one after the other in ``cudnn_convolution_backward`` and each allocate
    ``plan.getWorkspaceSize()`` through the caching allocator
    (aten/src/ATen/native/cudnn/Conv_v8.cpp ``run_conv_plan``); the probe
    (benchmarks/fidelity/cuda, ``cudnn_conv_transient``: a 3x3 64->64 conv at 56 px, batch 32,
    H100) measured input + output + 3.0 MiB (fp32) and + 1.9 MiB (bf16) beyond the gradients.
    An RNN's backward (RNN.cpp ``_cudnn_rnn_backward_input``) allocates the training work
    space again (:mod:`app.domain.graph.ops.recurrent`)."""
    return sum(
        sizer.storage_bytes(transient_numel(layer, t, tp), t.storage)
        for t in layer.result.transients
        if t.label == CUDNN_WORKSPACE
    )


def saved_for_backward(layer: LayerAnalysis, request: MemoryRequest) -> tuple[Saved, ...]:
    """What ``layer`` keeps for backward: eager mode's, or under ``torch.compile`` what
    Inductor's partitioner keeps (:func:`app.domain.memory.compiled.compiled_kept`)."""
    if request.training_options.compile:
        return compiled_kept(layer.op, layer.result.saved)
    return layer.result.saved


# oneDNN holds two output-sized buffers in these (_onednn_buffer)
TRANSPOSED_CONV_OPS = frozenset({"conv_transpose3d"})


def _onednn_buffer(layer: LayerAnalysis, sizer: Sizer, output: int) -> int:
    """The buffers a oneDNN convolution holds while it runs on CPU, beyond its input and output:
    one of the larger of its input and output (a convolution), two of its output (a transposed
    convolution).

    Measured on PyTorch 2.13 CPU (``torch.profiler``'s allocator timeline of one forward under
    ``torch.no_grad()``, fp32; benchmarks/fidelity/README.md, "oneDNN convolution"): the peak
    beyond the output is 1.000 x the input for a stride-2 3x3 depthwise conv (96 channels,
    112 -> 56: input 4 x output), a 96 -> 16 1x1 conv and a stride-2 3x3x3 Conv3d (32 -> 64,
    64^3 -> 32^3); 1.000 x the output for a 16 -> 96 1x1 conv, a 7x7 stride-2 3 -> 64 conv and
    a 1 -> 32 Conv3d; 1.00-1.08 x the larger of the two for stride-1 3x3 and stride-2 3x3 / 1x1
    convs and 1.4 x the input for a 32 -> 3 1x1x1 Conv3d (the rest: weight reorders, not
    counted); 2.00-2.04 x the output for ConvTranspose3d 2x2x2 stride 2 (64 -> 32 and
    256 -> 32). The rule was "1 x the output" (probed with equal input and output), which
    missed 3 / 4 of the input of a stride-2 convolution.
    """
    if layer.op not in CONV_OPS:
        return 0
    if layer.op in TRANSPOSED_CONV_OPS:
        return 2 * output
    inputs = max((item.numel for item in layer.result.saved if item.source == "in0"), default=0)
    return max(output, sizer.value_bytes(inputs, TensorKind.FLOAT))


def _op_sizes(
    layer: LayerAnalysis,
    sizer: Sizer,
    request: MemoryRequest,
    frozen: tuple[object, ...] | None = None,
) -> OpSizes:
    """``frozen``: :meth:`app.domain.memory.frozen.FrozenBase.variant` of the layer (None: its
    weights train, or nothing is frozen)."""
    tp = request.parallelism.tensor
    selective = request.checkpointing is Checkpointing.SELECTIVE
    fp32_acts = sizer.plan.activation == 4
    kept: list[tuple[int, int]] = []  # (_IN0 | _OUT | _NEW, bytes) in saved order
    internal = 0
    saved = saved_for_backward(layer, request)
    if frozen is not None:
        saved = _frozen_saved(layer, saved, frozen)
    for item in saved:
        numel = item.numel
        if tp > 1 and layer.op in INTERNAL_TENSOR_OPS and item.source == "new":
            numel = -(-numel // tp)
        size = sizer.storage_bytes(numel, item.storage)
        if item.source == "new" and layer.op in INTERNAL_TENSOR_OPS:
            # Gradients of a composite op's internal tensors (S x S scores, MLP intermediates)
            # are live in its backward; recomputed ones (selective checkpointing) too.
            internal = max(internal, size)
        if selective and item.label in ATTENTION_MATRICES:
            continue
        if item.source == "in0" or (item.source == "in0_fp32" and fp32_acts):
            kept.append((_IN0, size))
        elif item.source == "out":
            kept.append((_OUT, size))
        elif item.source[:2] == "in" and item.source[2:].isdigit():
            kept.append((_INPUT + int(item.source[2:]), size))
        else:
            kept.append((_NEW, size))
    # A stored tensor's output is the weight itself: no activation bytes, no gradient buffer.
    output = (
        sizer.value_bytes(layer.output_numel, TensorKind.FLOAT) if layer.result.materialized else 0
    )
    backward_extra = (
        _CPU_BACKWARD_EXTRA.get(layer.op, 0) * output
        if sizer.runtime is Runtime.CPU
        else _cudnn_backward_workspace(layer, sizer, tp)
    )
    cast_numel = frozen[2] if frozen is not None and frozen[0] == "frozen" else 0
    if cast_numel:  # autocast's 16-bit casts of frozen weights, kept by their mm (frozen.py)
        assert isinstance(cast_numel, int)
        cast = -(-cast_numel // tp) if layer.op in INTERNAL_TENSOR_OPS else cast_numel
        kept.append((_NEW, cast * sizer.plan.weight_cache))
    kept_inputs = tuple(
        dict.fromkeys(
            source - _INPUT if source >= _INPUT else 0
            for source, _ in kept
            if source == _IN0 or source >= _INPUT
        )
    )
    return OpSizes(
        kept_inputs=kept_inputs,
        keeps_input=kept_inputs == (0,),
        keeps_output=any(source == _OUT for source, _ in kept),
        new_kept=tuple((slot, size) for slot, (source, size) in enumerate(kept) if source == _NEW),
        new_total=sum(size for source, size in kept if source == _NEW),
        forward_transient=_transient_bytes(layer, sizer, tp)
        + (_onednn_buffer(layer, sizer, output) if sizer.runtime is Runtime.CPU else 0)
        # tensor parallel: the row-parallel partial sum and the all-reduced output coexist
        + (output if tp > 1 and layer.op in INTERNAL_TENSOR_OPS else 0),
        backward_internal=internal,
        output=output,
        backward_extra=backward_extra,
        output_storage=sizer.value_bytes(layer.output_numel, layer.output_kind)
        if layer.result.materialized
        else 0,
        backward_static=output + 2 * internal + backward_extra,
    )


def _frozen_saved(
    layer: LayerAnalysis, saved: tuple[Saved, ...], frozen: tuple[object, ...]
) -> tuple[Saved, ...]:
    """What a layer of a frozen base keeps (:mod:`app.domain.memory.frozen`): nothing before
    the first trainable tensor; else its saved tensors less those kept only for its weights'
    gradients, but for those an adapter keeps as they are."""
    if frozen[0] == "nothing":
        return ()
    kept = frozen[1]
    assert isinstance(kept, frozenset)
    dropped = WEIGHT_GRAD_LABELS.get(layer.op, frozenset()) - kept
    return tuple(item for item in saved if item.label not in dropped)


@dataclass(slots=True)
class StoragePlan:
    """Resolved storage sizes and, per layer, which storages it keeps for backward.

    Storage ids are the analysis's (positive: model inputs and layer outputs); tensors a layer
    creates only to keep for backward get negative ids.
    """

    sizes: dict[int, int]  # storage -> bytes
    reused: list[tuple[int, ...]]  # per layer: its input/output storages it keeps for backward
    layer_saved: list[list[int]] | None  # per layer: every storage it keeps (built on demand)
    last_use: dict[int, int]  # storage -> last layer reading it in forward
    pinned: set[int]  # model inputs and the final output: held by the caller
    op_sizes: list[OpSizes]
    out_alloc: list[int]  # per layer: bytes of the output it allocates (0: a view, in place)
    grad_in: list[int]  # per layer: bytes of the gradients of its inputs (training)
    first_saver: dict[int, int]  # kept storage -> earliest layer keeping it
    # Layer -> kept storages that are not its input or output. None until a caller needs their
    # ids (full checkpointing, the per-layer view): until then each layer's new tensors are
    # implied by its op sizes, kept only by it and freed after its own backward.
    adds: dict[int, list[int]] | None


class Timeline(NamedTuple):
    """Per layer, the bytes that appear and disappear around it, derived from the plan."""

    alloc: list[int]  # allocated in its forward: its output and the new tensors it keeps
    free_forward: list[int]  # values whose last consumer it is (and that nothing keeps)
    free_backward: list[int]  # kept tensors released after its backward (earliest keeper)


# A numbered block: the name up to its first all-digit segment after the first, followed by more
_NUMBERED_BLOCK = re.compile(r"(.+?\.\d+)\.")


@lru_cache(maxsize=1 << 16)
def checkpoint_unit(name: str) -> str | None:
    """The checkpoint unit a layer belongs to: the numbered block it is in, named up to the
    first all-digit segment after the first (``layers.3.attn`` -> ``layers.3``,
    ``layer1.blocks.0.conv1`` -> ``layer1.blocks.0``; None: in no numbered block).

    Gradient checkpointing wraps each block of a sequence: Hugging Face's
    ``gradient_checkpointing_enable()`` each decoder/encoder layer (``model.layers[i]``), and
    a CNN's recipe each residual block of each stage (``torch.utils.checkpoint`` around
    ``resnet.layer1[i]``, torchvision's ``mobilenet_v2.features[i]``). The top-level repeats
    (``app.domain.memory.rank_share.repeated_block``, also the pipeline stages' blocks) are
    such blocks; so are the iterations of a repeat inside a group (``layer1.blocks.0``), which
    a rule reading only the top level left outside every unit (checkpointing then kept their
    activations: ResNet-50 and MobileNet-V2 with full checkpointing over-estimated by 24-66 %
    on an H100, benchmarks/fidelity/cuda/results.md)."""
    match = _NUMBERED_BLOCK.match(name)
    return match.group(1) if match else None


ATTENTION_MATRICES = frozenset({"probs", "probs_cast", "probs_mask", "probs_dropped"})


# Extra output-sized buffers an op's backward holds beyond the input/output gradients,
# measured per op on PyTorch 2.13 CPU (benchmarks/fidelity/probes.md): oneDNN convolutions
# reorder the incoming gradient and hold a workspace; batch norm, ReLU and HF RMSNorm (fp32
# upcast, several pointwise steps) keep temporaries.
_CPU_BACKWARD_EXTRA: Mapping[str, int] = {
    "conv2d": 2,
    "depthwise_conv2d": 2,
    "pointwise_conv2d": 2,
    # 3-d ops probed once on PyTorch 2.13 CPU (a stride-1 3x3x3 Conv3d, an InstanceNorm3d);
    # conv_transpose3d not measured (no extra assumed)
    "conv3d": 2,
    "batchnorm2d": 1,
    "instancenorm3d": 1,  # runs as a batch norm over [1, N*C, D, H, W]
    "relu": 1,
    "relu6": 1,
    "rmsnorm": 3,
    "lstm": 5,  # oneDNN RNN backward: ~4.8 outputs of gate gradients and buffers
}


_INPUT_STORAGES = attrgetter("input_storages")
_OUTPUT_BYTES = attrgetter("output_storage")  # of an OpSizes
_FORWARD_TRANSIENT = attrgetter("forward_transient")


def last_reads(analysis: GraphAnalysis) -> dict[int, int]:
    """Storage -> the last layer reading it in forward."""
    return {
        storage: index
        for index, storages in enumerate(map(_INPUT_STORAGES, analysis.layers))
        for storage in storages
    }


def build_plan(
    analysis: GraphAnalysis,
    sizer: Sizer,
    request: MemoryRequest,
    training: bool,
    last_use: dict[int, int] | None = None,
    frozen: FrozenBase | None = None,
    columns: LayerColumns | None = None,
) -> StoragePlan:
    """The storage plan; ``last_use``: :func:`last_reads` of the analysis, if known. Inference
    leaves out the gradients of the layers' inputs (``grad_in``: only backward reads them).
    ``frozen``: a frozen base's rules (LoRA training, :mod:`app.domain.memory.frozen`).
    ``columns``: the analysis's :func:`layer_columns`, if known."""
    layers = analysis.layers
    if columns is None:
        columns = layer_columns(None, analysis)
    ids = columns.ids
    # Byte figures once per distinct op result: the iterations of a repeat share theirs.
    if frozen is None or not training:
        derived = {
            key: _op_sizes(layer, sizer, request)  # the last layer of each result
            for key, layer in columns.distinct.items()
        }
        op_sizes = list(map(derived.__getitem__, ids))
    else:
        variants = [frozen.variant(index) for index in range(len(layers))]
        keyed = {
            (id(layer.result), variant): (layer, variant)
            for layer, variant in zip(layers, variants, strict=True)
        }
        by_key = {
            key: _op_sizes(layer, sizer, request, variant)
            for key, (layer, variant) in keyed.items()
        }
        op_sizes = [
            by_key[(id(layer.result), variant)]
            for layer, variant in zip(layers, variants, strict=True)
        ]
    sizes = {bound.storage: sizer.value_bytes(bound.numel, bound.kind) for bound in analysis.inputs}
    out_alloc = list(map(mul, columns.allocates, map(_OUTPUT_BYTES, op_sizes)))  # False x n: 0
    allocated = compress(columns.storages, columns.allocates)
    sizes.update(zip(allocated, compress(out_alloc, columns.allocates), strict=True))
    # Every storage a layer reads is a model input or an earlier layer's (allocated) output.
    size_of = sizes.__getitem__
    grad_in = (
        [sum(map(size_of, storages)) for storages in map(_INPUT_STORAGES, layers)]
        if training
        else []
    )
    if last_use is None:
        last_use = last_reads(analysis)
    n = len(layers)
    # Kept inputs/outputs per layer (an in-place op keeps one storage once), then the tensors
    # layers create only to keep: negative ids, unique per (layer, slot).
    reused: list[tuple[int, ...]] = [()] * n
    if training:
        reused = [
            (
                ((layer.input_storages[0],) if op.keeps_input else ())
                + (
                    (layer.output_storage,)
                    if op.keeps_output
                    and not (op.keeps_input and layer.output_storage == layer.input_storages[0])
                    else ()
                )
            )
            if op.keeps_input or (op.keeps_output and not op.kept_inputs)
            else _reused(layer, op)
            if op.kept_inputs
            else ()
            for layer, op in zip(layers, op_sizes, strict=True)
        ]
    # Earliest keeper: walk backwards so that earlier layers overwrite later ones (inference
    # keeps nothing: no walk).
    first_saver = (
        {key: index for index in range(n - 1, -1, -1) for key in reused[index]} if training else {}
    )
    pinned = {bound.storage for bound in analysis.inputs}
    pinned.add(analysis.output_storage)
    return StoragePlan(
        sizes=sizes,
        reused=reused,
        layer_saved=None,
        last_use=last_use,
        pinned=pinned,
        op_sizes=op_sizes,
        out_alloc=out_alloc,
        grad_in=grad_in,
        first_saver=first_saver,
        adds=None if training else {},  # inference keeps nothing for backward
    )


def _reused(layer: LayerAnalysis, op: OpSizes) -> tuple[int, ...]:
    """The storages of the inputs (any of them) and output a layer keeps, each once."""
    keys = [layer.input_storages[k] for k in op.kept_inputs]
    if op.keeps_output:
        keys.append(layer.output_storage)
    return tuple(dict.fromkeys(keys))


def new_tensor_id(index: int, slot: int) -> int:
    """The id of the tensor layer ``index`` creates to keep in ``slot`` (negative, unique)."""
    return -(index * 64) - 1 - slot


def _new_storages(plan: StoragePlan) -> dict[int, list[int]]:
    """Give the tensors layers create to keep their ids (negative, unique per layer and slot)."""
    if plan.adds is None:
        plan.adds = {
            index: [new_tensor_id(index, slot) for slot, _ in op.new_kept]
            for index, op in enumerate(plan.op_sizes)
            if op.new_kept
        }
        plan.sizes.update(
            {
                new_tensor_id(index, slot): size
                for index, op in enumerate(plan.op_sizes)
                for slot, size in op.new_kept
            }
        )
        plan.first_saver.update({key: index for index, keys in plan.adds.items() for key in keys})
    return plan.adds


def kept_storages(plan: StoragePlan) -> list[list[int]]:
    """Per layer, the storages it keeps for backward: kept inputs/outputs, then new tensors."""
    if plan.layer_saved is None:
        adds = _new_storages(plan)
        plan.layer_saved = [[*keys, *adds.get(index, ())] for index, keys in enumerate(plan.reused)]
    return plan.layer_saved


def apply_full_checkpointing(analysis: GraphAnalysis, plan: StoragePlan) -> dict[str, int]:
    """Keep only each unit's input; return the bytes each unit holds while recomputed."""
    units: dict[str, set[int]] = {}
    layer_saved = kept_storages(plan)  # gives new tensors their ids
    for index, layer in enumerate(analysis.layers):
        unit = checkpoint_unit(layer.name)
        if unit is None:
            continue
        first = unit not in units
        units.setdefault(unit, set()).update(layer_saved[index])
        layer_saved[index] = [layer.input_storages[0]] if first and layer.input_storages else []
    plan.first_saver = {}
    adds: dict[int, list[int]] = {}
    for index, kept in enumerate(layer_saved):
        layer = analysis.layers[index]
        for key in kept:
            if key not in plan.first_saver:
                plan.first_saver[key] = index
                if key not in layer.input_storages and key != layer.output_storage:
                    adds.setdefault(index, []).append(key)
    plan.adds = adds
    still_kept = set(plan.first_saver)
    return {
        unit: sum(plan.sizes[k] for k in keys if k not in still_kept)
        for unit, keys in units.items()
    }


def build_timeline(plan: StoragePlan) -> Timeline:
    """Bytes allocated and freed around each layer, in forward and in backward."""
    sizes, first_saver, pinned = plan.sizes, plan.first_saver, plan.pinned
    if plan.adds is None:  # new tensors: kept by their creator only, freed after its backward
        new = [op.new_total for op in plan.op_sizes]
        alloc = list(map(add, plan.out_alloc, new))
        free_backward = new
    else:
        alloc = list(plan.out_alloc)
        for index, keys in plan.adds.items():
            alloc[index] += sum([sizes[key] for key in keys])
        free_backward = [0] * len(alloc)
    free_forward = [0] * len(alloc)
    last_use = plan.last_use  # the dead values, by set operations (their order: sums only)
    for storage in last_use.keys() - first_saver.keys() - pinned:
        free_forward[last_use[storage]] += sizes[storage]
    for key, index in first_saver.items():
        if key not in pinned:
            free_backward[index] += sizes[key]
    return Timeline(alloc=alloc, free_forward=free_forward, free_backward=free_backward)


@dataclass(frozen=True, slots=True)
class Peak:
    """The largest dynamic moment of a phase: activations, transients, gradients."""

    activations: int = 0
    transient: int = 0
    gradients: int = 0
    at: str = "end"  # "forward" (during layer ``index``), "end" (of forward) or "backward"
    index: int = -1
    cache_released: int = 0  # autocast's weight copies freed by then (their GEMM's backward ran)

    @property
    def total(self) -> int:
        return self.activations + self.transient + self.gradients


def forward_peak(plan: StoragePlan, timeline: Timeline) -> tuple[Peak, int]:
    """Replay the forward; return its peak and the bytes live at its end.

    Before layer ``i`` the live bytes are everything allocated by layers ``< i`` minus what
    died after them; at layer ``i`` its allocations and its forward transient join them.
    Running sums, so the walk is C loops over per-layer figures. The model's inputs are not
    among them: they are live from the start to the end of the step (the caller holds them)
    and are the estimate's own ``inputs`` line, so a moment's activations leave them out.
    """
    alloc = timeline.alloc
    if not alloc:
        return Peak(), 0
    before = list(accumulate(map(sub, alloc, timeline.free_forward), initial=0))
    during = list(map(add, before, alloc))  # zip-like: stops after the last layer
    transients = list(map(_FORWARD_TRANSIENT, plan.op_sizes))
    totals = list(map(add, during, transients))
    index = totals.index(max(totals))  # the first largest
    peak = Peak(activations=during[index], transient=transients[index], at="forward", index=index)
    return peak, before[-1]


def backward_peak(
    analysis: GraphAnalysis,
    plan: StoragePlan,
    timeline: Timeline,
    live_bytes: int,
    grad_bytes_per_layer: list[int],
    recompute: dict[str, int],
    cast_bytes_per_layer: list[int] | None = None,
) -> Peak:
    """Replay the backward in reverse layer order; return its peak.

    At layer ``i`` (walking from the last): the kept tensors of layers ``<= i`` (all live
    bytes at the end of forward minus those released after the backward of layers ``> i``),
    the block being recomputed, the output/input gradients and kernel buffers of ``i``, and
    the parameter gradients of layers ``>= i``; less ``cast_bytes_per_layer`` of layers
    ``> i`` (:func:`cast_params`: autocast's weight copies their backward freed).
    """
    n = len(analysis.layers)
    if not n:
        return Peak()
    live = list(accumulate(reversed(timeline.free_backward), sub, initial=live_bytes))
    if recompute:
        extra = [recompute.get(checkpoint_unit(layer.name) or "", 0) for layer in analysis.layers]
        live = list(map(add, live, reversed(extra)))
    grads = list(accumulate(reversed(grad_bytes_per_layer)))
    transients = list(
        map(add, [op.backward_static for op in reversed(plan.op_sizes)], reversed(plan.grad_in))
    )
    released = [0] * n
    if cast_bytes_per_layer is not None:  # walking from the last: the layers after i
        released = list(accumulate(reversed(cast_bytes_per_layer), initial=0))[:n]
    totals = list(map(sub, map(add, map(add, live, transients), grads), released))
    k = max(range(n), key=totals.__getitem__)  # the first largest, walking backwards
    return Peak(
        activations=live[k],
        transient=transients[k],
        gradients=grads[k],
        at="backward",
        index=n - 1 - k,
        cache_released=released[k],
    )


# The ops whose weights autocast does not cast (PyTorch 2.13 aten/src/ATen/autocast_mode.cpp:
# embedding is in no list, the norms run in fp32, the class token is concatenated (cat
# promotes)): their parameters have no 16-bit copy. Every other op with parameters (GEMMs,
# convolutions, recurrent cells: the lower_precision_fp list) casts them.
UNCAST_OPS = LOOKUP_OPS | frozenset(
    {"layernorm", "rmsnorm", "batchnorm2d", "instancenorm3d", "groupnorm", "cls_token"}
)


def cast_params(analysis: GraphAnalysis) -> list[int]:
    """Per layer, the parameters autocast casts to 16 bits and caches [elements].

    Autocast caches the cast of a leaf weight that requires grad for the whole forward
    (PyTorch 2.13 aten/src/ATen/autocast_mode.cpp ``cached_cast``) and clears the cache at
    the context's exit; the GEMM that read the copy saved it for its input's gradient
    (``MmBackward`` / ``AddmmBackward`` keep ``mat2``), so it lives until that layer's
    backward releases its saved variables. The ops of :data:`UNCAST_OPS` cast nothing
    (embedding and the norms run on the fp32 weight); a linear tied to an earlier weight
    (``tied_to``: GPT-2's head reads wte) casts that weight, ``flops / (2 x rows)``
    elements. Measured on an H200 (benchmarks/fidelity/cuda/cuda_measurements_peft.json):
    Llama-3-8B-2L fp32 AMP with bitsandbytes AdamW8bit, allocated 14,482 MiB; with every
    parameter's copy held through the backward the estimate was 17,142 (the embedding's
    1,002 MiB was never cast).
    """
    params: list[int] = []
    for layer in analysis.layers:
        if layer.op in UNCAST_OPS:
            params.append(0)
            continue
        own = layer.result.params
        shapes = layer.result.param_shapes
        if layer.op == "linear" and not any(len(shape) == 2 for shape in shapes):
            rows = math.prod(layer.output_shape[:-1]) if layer.output_shape else 1
            own += layer.result.flops // (2 * rows) if rows else 0  # the tied weight
        params.append(own)
    return params


def storage_size_counts(plan: StoragePlan) -> Counter[int]:
    """How many storages of each size the step allocates (new tensors without ids included)."""
    counts = Counter(plan.sizes.values())
    if plan.adds is None:
        per_op = Counter(map(id, plan.op_sizes))
        for op in {id(op): op for op in plan.op_sizes}.values():
            for _, size in op.new_kept:
                counts[size] += per_op[id(op)]
    return counts


def layer_gradient_bytes(analysis: GraphAnalysis, plan_bytes: Fraction, shard: int) -> list[int]:
    num, den = plan_bytes.numerator, plan_bytes.denominator * shard
    return [-(-layer.result.params * num // den) for layer in analysis.layers]


def seed_rule(analysis: GraphAnalysis, sizer: Sizer) -> int | None:
    """'Parameters + the two largest consecutive feature maps' for chains; None otherwise."""
    if any(layer.input_names for layer in analysis.layers):
        return None
    best = 0
    previous = sizer.value_bytes(analysis.inputs[0].numel, analysis.inputs[0].kind)
    for layer in analysis.layers:
        current = sizer.value_bytes(layer.output_numel, layer.output_kind)
        best = max(best, previous + current)
        previous = current
    return best


class OffloadPeaks(NamedTuple):
    """The step's moments with activation offloading, and the terms of their activations."""

    forward: Peak
    end: Peak
    backward: Peak
    host_bytes: int  # pinned host copies of every offloaded tensor [B]
    offloaded: int  # how many tensors
    terms: dict[str, list[tuple[int, str]]]  # at ("forward", "end", "backward") -> terms


def offload_peaks(
    analysis: GraphAnalysis,
    plan: StoragePlan,
    grad_bytes_per_layer: list[int],
    recompute: dict[str, int],
    adapters: Mapping[int, int] | None = None,
    dropped: int = 0,
) -> OffloadPeaks:
    """Forward and backward with the tensors kept for backward offloaded to pinned host memory
    (torchtune 0.6 torchtune/training/_activation_offloading.py ``OffloadActivations``, its
    pack hook copying each saved tensor to a pinned CPU buffer on a side stream; PyTorch
    ``torch.autograd.graph.save_on_cpu``).

    Rule: a kept tensor stays on the GPU while the forward still reads it and for one layer
    after its keeper (the copy in flight: released after layer ``max(last read, keeper) + 1``);
    in backward it is back on the GPU from the backward of the layer after its last keeper
    (prefetched one layer ahead) until the backward of its earliest keeper. The model's inputs
    and output stay (the caller holds them); every other kept tensor has a pinned host copy.
    The inputs are the estimate's own ``inputs`` line, not among the activations here.

    Both pack every saved tensor that is not an ``nn.Parameter`` (torchtune: of at least
    1,024 B), whoever saves it: ``adapters`` (layer -> bytes) are the LoRA adapters' saved
    tensors outside checkpointed units (lora_A's output, its input copy, the dropout mask),
    offloaded like the layer's own (measured on an H200, benchmarks/fidelity/cuda/
    cuda_measurements_peft.json: Llama-3-8B-2L bf16 LoRA r16 all-linear, allocated 5,936 MiB
    with save_on_cpu and 5,968 with torchtune, without the adapters' 610 MiB kept on the GPU).
    ``dropped``: the output's bytes when the caller drops it after the loss (``del logits``
    in torchtune's recipes, Trainer.compute_loss keeping the loss only): not held in backward.
    """
    layers = analysis.layers
    n = len(layers)
    timeline = build_timeline(plan)
    sizes, pinned = plan.sizes, plan.pinned
    last_keeper = offload_last_keepers(analysis, plan, recompute)
    # id -> (earliest keeper, bytes, released before forward layer, last keeper)
    offloaded: dict[int, tuple[int, int, int, int]] = {
        k: (i, sizes[k], released_at(plan, k, i), last_keeper.get(k, i))
        for k, i in plan.first_saver.items()
        if k not in pinned and sizes.get(k)
    }
    allocated = [0] * n  # the adapters' tensors, created in their layer's forward
    for index, size in (adapters or {}).items():
        if size:
            offloaded[adapter_tensor_id(index)] = (index, size, index + 2, index)
            allocated[index] += size
    released = [0] * n
    for _, size, at, _ in offloaded.values():
        if at < n:
            released[at] += size
    live = 0
    forward = Peak()
    best = -1
    for i in range(n):
        live -= released[i]
        during = live + timeline.alloc[i] + allocated[i]
        transient = plan.op_sizes[i].forward_transient
        if during + transient > best:
            best = during + transient
            forward = Peak(activations=during, transient=transient, at="forward", index=i)
        live = during - timeline.free_forward[i]
    still = sum(size for _, size, at, _ in offloaded.values() if at >= n)
    resident = live - still  # the output: held by the caller and not offloaded
    held = resident - dropped  # in backward: the output unless the caller dropped it
    end = Peak(activations=live, at="end")
    backward = Peak()
    best = -1
    grads = 0
    output_words = "B: the model's output, held by the caller"
    terms: dict[str, list[tuple[int, str]]] = {
        "forward": [
            (
                forward.activations,
                "B: on the GPU: values the forward still reads and kept tensors whose copy to "
                "the host is in flight",
            )
        ],
        "end": [
            (resident, output_words),
            (still, "B: kept tensors of the last layers, their copy to the host in flight"),
        ],
        "loss": [(held, output_words)],
    }
    for i in range(n - 1, -1, -1):
        window = sum(
            size for keeper, size, _, last in offloaded.values() if keeper <= i and last >= i - 1
        )
        extra = recompute.get(checkpoint_unit(layers[i].name) or "", 0) if recompute else 0
        grads += grad_bytes_per_layer[i]
        op = plan.op_sizes[i]
        transient = op.backward_static + plan.grad_in[i]
        activations = held + window + extra
        if activations + transient + grads > best:
            best = activations + transient + grads
            backward = Peak(
                activations=activations,
                transient=transient,
                gradients=grads,
                at="backward",
                index=i,
            )
            terms["backward"] = [
                (held, output_words),
                (window, f"B: kept tensors of '{layers[i].name}' and of the layer before, back "
                 "from the host (prefetched one layer ahead; a checkpointed unit's input from "
                 "the backward of its last layer, which recomputes the unit)"),
                (extra, "B: the block being recomputed"),
            ]  # fmt: skip
    host = sum(size for _, size, _, _ in offloaded.values())
    return OffloadPeaks(forward, end, backward, host, len(offloaded), terms)


def adapter_tensor_id(index: int) -> int:
    """The id of what layer ``index``'s LoRA adapters keep for backward, as one tensor (apart
    from the storage ids, positive, and :func:`new_tensor_id`'s, down to ``-64 x layers``)."""
    return -(1 << 40) - index


def offload_last_keepers(
    analysis: GraphAnalysis, plan: StoragePlan, recompute: Mapping[str, int]
) -> dict[int, int]:
    """Kept tensor -> the last layer whose backward reads it: its last keeper, or for the
    input a checkpointed unit keeps (full checkpointing), the unit's last layer, whose
    backward recomputes the unit from it (``torch.utils.checkpoint``: the unit's forward runs
    again when backward first reaches it)."""
    last_keeper: dict[int, int] = {}
    kept = kept_storages(plan)
    for index, keys in enumerate(kept):
        for key in keys:
            last_keeper[key] = index
    if recompute:
        units = [checkpoint_unit(layer.name) for layer in analysis.layers]
        unit_last = {unit: index for index, unit in enumerate(units) if unit is not None}
        for index, keys in enumerate(kept):
            unit = units[index]
            if unit is not None and unit in recompute:
                for key in keys:
                    last_keeper[key] = max(last_keeper[key], unit_last[unit])
    return last_keeper


def released_at(plan: StoragePlan, key: int, keeper: int) -> int:
    """The forward layer before which an offloaded kept tensor has left the GPU: two after the
    later of its last forward read and its keeper (the copy finishes during the next layer)."""
    return max(plan.last_use.get(key, -1), keeper) + 2
