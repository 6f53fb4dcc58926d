"""Training and inference memory footprints with a breakdown, a peak phase and assumptions.

The model replays one step over the analysed graph (:mod:`app.domain.analysis`):

* forward: every layer allocates its output (views and in-place ops do not) and keeps the
  tensors autograd saves; other values die after their last consumer;
* backward, layer by layer in reverse: the gradient of the output and of the inputs are live,
  parameter gradients accumulate, and saved tensors are freed after the backward of the
  earliest layer that kept them;
* optimizer step: weights + gradients + optimizer state + the step's temporaries.

The reported peak is the largest of those moments in steady state (optimizer state exists
from the second iteration on); the first iteration, when optimizer state is created in the
step, is reported beside it. Sizes are integer bytes.

References
----------
Korthikanti et al., "Reducing Activation Recomputation in Large Transformer Models", 2022.
Rajbhandari et al., "ZeRO: Memory Optimizations Toward Training Trillion Parameter Models", 2020.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from itertools import accumulate, repeat
from operator import add, sub
from typing import Any, NamedTuple, Protocol, TypeVar, cast

from app.domain.budget import CHECK_EVERY_MASK, checkpoint
from app.domain.graph.analysis import GraphAnalysis, InputDecl, LayerAnalysis, analyze
from app.domain.graph.ops import Storage, TensorKind
from app.domain.graph.traits import CONV_OPS, INTERNAL_TENSOR_OPS, QUANTIZABLE_OPS
from app.domain.hardware import FrameworkOverhead
from app.domain.memory.cuda_allocator import (
    AllocatorPeaks,
    Event,
    EventsKey,
    ReplayMemo,
    replay_steady,
)
from app.domain.precision import (
    CONVENTIONS,
    DType,
    Precision,
    PrecisionConvention,
    bytes_per_element,
    convention,
    scale_bytes,
)
from app.domain.units import MIB
from app.domain.workload import (
    Attention,
    Checkpointing,
    Logits,
    Mode,
    Optimizer,
    OptimizerImpl,
    Parallelism,
    Runtime,
    WorkloadInputError,
)


class MemoryInputError(WorkloadInputError):
    """A combination of options that cannot be estimated."""


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


def _memoised(
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


class _LayerTotals(NamedTuple):
    """Sums over an analysis's layers that every estimate of it reads."""

    params: int  # parameters (GraphAnalysis.params)
    buffers_bytes: int  # buffers (batch norm statistics)
    kv_cache_numel: int  # KV cache elements, all attention layers
    kv_layers: int  # layers that cache keys and values


def _layer_totals(plans: PlanMemo | None, analysis: GraphAnalysis) -> _LayerTotals:
    """The analysis's :class:`_LayerTotals` (summed once per analysis with ``plans``)."""

    def build() -> _LayerTotals:
        results = [layer.result for layer in analysis.layers]
        return _LayerTotals(
            params=sum(result.params for result in results),
            buffers_bytes=sum(result.buffers_bytes for result in results),
            kv_cache_numel=sum(result.kv_cache_numel for result in results),
            kv_layers=sum(1 for result in results if result.kv_cache_numel),
        )

    return _memoised(plans, analysis, ("layer totals",), build)


@dataclass(frozen=True, slots=True, kw_only=True)
class MemoryRequest:
    """Everything besides the graph that a footprint depends on."""

    mode: Mode
    precision: Precision = Precision.FP32
    optimizer: Optimizer = Optimizer.ADAMW
    optimizer_impl: OptimizerImpl = OptimizerImpl.AUTO
    checkpointing: Checkpointing = Checkpointing.NONE
    runtime: Runtime = Runtime.CUDA
    parallelism: Parallelism = field(default_factory=Parallelism)
    accumulation_steps: int = 1
    kv_cache: bool | None = None  # None: decoders (causal attention) yes; encoders never
    fp32_grad_buffer: bool = False
    overhead: FrameworkOverhead = field(default_factory=FrameworkOverhead)
    attention: Attention | None = None  # None: PyTorch SDPA's choice per attention layer
    logits: Logits = Logits.ALL  # LAST: decoder inference computes the last position's logits

    def __post_init__(self) -> None:
        steps = self.accumulation_steps
        if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
            raise MemoryInputError(f"accumulation_steps must be an integer >= 1, got {steps!r}")


@dataclass(frozen=True, slots=True, kw_only=True)
class PrecisionPlan:
    """Bytes per element of each kind of state under one precision convention."""

    weight: Fraction
    grad: Fraction
    master: int
    state_slot: int
    activation: int
    weight_cache: int
    convention: str


def _bytes(dtype: DType | None) -> int:
    return 0 if dtype is None else int(bytes_per_element(dtype))


def _plan(row: PrecisionConvention) -> PrecisionPlan:
    return PrecisionPlan(
        weight=bytes_per_element(row.weight_dtype),
        grad=Fraction(_bytes(row.grad_dtype)),
        master=_bytes(row.master_weight_dtype),
        state_slot=_bytes(row.optimizer_state_dtype),
        activation=_bytes(row.activation_dtype),
        weight_cache=_bytes(row.weight_cache_dtype),
        convention=row.description,
    )


_PLANS: Mapping[Precision, PrecisionPlan] = {p: _plan(row) for p, row in CONVENTIONS.items()}

# Optimizer state slots per trainable parameter element.
_STATE_SLOTS: Mapping[Optimizer, int] = {
    Optimizer.SGD: 0,
    Optimizer.SGD_MOMENTUM: 1,
    Optimizer.ADAM: 2,
    Optimizer.ADAMW: 2,
    Optimizer.ADAGRAD: 1,
    Optimizer.RMSPROP: 1,
    Optimizer.LION: 1,
    Optimizer.ADAM_8BIT: 2,
    Optimizer.ADAFACTOR: 0,  # factored, computed from shapes
}
ADAM_8BIT_BLOCK = 2048  # bitsandbytes block size: one fp32 absmax per block per state


def precision_plan(precision: Precision) -> PrecisionPlan:
    """Bytes per element for a precision convention."""
    return _PLANS[precision]


@dataclass(frozen=True, slots=True, kw_only=True)
class MemoryLine:
    """One line of the breakdown at the peak."""

    key: str
    bytes: int
    formula: str  # arithmetic over the numbers ``bytes`` was computed from; see below
    assumptions: tuple[str, ...] = ()

    # ``formula`` grammar: ``<expression> = <bytes> B`` where the expression is integers (thousands
    # separators), decimals, ``+``, ``-``, ``x``, ``/``, parentheses, ``ceil(...)`` and
    # ``floor(...)`` (where the engine rounds), and words in ``[...]`` saying what the number
    # before them is (ignored by the arithmetic). Evaluated exactly it equals ``bytes``
    # (tests/domain/test_formulas.py). Lines that are sums over the step's timeline (activations,
    # transient, gradients in backward) list their components, e.g. activations per producing op.


@dataclass(frozen=True, slots=True, kw_only=True)
class KeptTensor:
    """A tensor a layer keeps for backward, with the dtype it is stored in."""

    label: str
    source: str  # "input", "output" or "new" (created by the layer)
    elements: int
    dtype: str
    bytes: int


@dataclass(frozen=True, slots=True, kw_only=True)
class LayerMemory:
    """Per-layer view: what the layer produces and keeps."""

    name: str
    op: str
    output_shape: tuple[int, ...]
    params: int
    flops: int
    output_bytes: int
    saved_bytes: int  # new storages this layer keeps for backward (training)
    kept: tuple[KeptTensor, ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class MemoryEstimate:
    """A footprint: lines that add up to the peak, the phase of the peak, and the rest."""

    mode: Mode
    runtime: Runtime
    params: int
    trainable_params: int
    lines: tuple[MemoryLine, ...]
    peak_bytes: int
    peak_phase: str
    phase_peaks: Mapping[str, int]
    first_iteration_peak_bytes: int | None
    first_iteration_peak_phase: str | None
    seed_rule_bytes: int | None
    layers: tuple[LayerMemory, ...]
    assumptions: tuple[str, ...]
    cuda: CudaMemory | None = None  # runtime pytorch_cuda: the allocator's figures


@dataclass(frozen=True, slots=True, kw_only=True)
class CudaMemory:
    """What PyTorch reports on a CUDA device for the step [B]: ``allocated`` is
    ``torch.cuda.max_memory_allocated()`` (the tensors, rounded by the caching allocator, and
    the cuBLAS workspace it allocates), ``reserved`` is ``torch.cuda.max_memory_reserved()``
    (allocated + cached free segments), and ``device_total`` adds the CUDA context: the device
    memory the process holds, which decides an out-of-memory error on a GPU or MIG slice."""

    allocated_bytes: int
    reserved_bytes: int
    context_bytes: int
    device_total_bytes: int
    first_iteration_allocated_bytes: int | None  # training: the step that creates the state
    first_iteration_reserved_bytes: int | None
    expandable_segments: bool


@dataclass(slots=True)
class _Moment:
    """Composition of live memory at one moment."""

    phase: str
    parts: dict[str, int]
    at: str = "step"  # "forward" (during layer ``index``), "end" (of forward), "backward", "step"
    index: int = -1  # the layer, for "forward" and "backward"

    @property
    def total(self) -> int:
        return sum(self.parts.values())


def _ceil(value: Fraction | int) -> int:
    fraction = Fraction(value)
    return -(-fraction.numerator // fraction.denominator)


class _Sizer:
    """Bytes of storages under one precision and runtime."""

    def __init__(self, plan: PrecisionPlan, runtime: Runtime) -> None:
        self.plan = plan
        self.runtime = runtime

    def storage_bytes(self, numel: int, storage: Storage) -> int:
        if storage is Storage.ACT:
            return numel * self.plan.activation
        if storage is Storage.FP32:
            return numel * 4
        if storage is Storage.INT64:
            return numel * 8
        # Dropout mask: a bool tensor on CUDA; on CPU the mask has the input's dtype.
        return numel if self.runtime is Runtime.CUDA else numel * self.plan.activation

    def value_bytes(self, numel: int, kind: TensorKind) -> int:
        return numel * (8 if kind is TensorKind.INDEX else self.plan.activation)


def _weights_bytes(
    analysis: GraphAnalysis, plan: PrecisionPlan, precision: Precision
) -> tuple[int, tuple[str, ...]]:
    """Stored weight bytes, with quantization scales for weight-only formats."""
    row = convention(precision)
    if not row.quantized:
        return _ceil(analysis.params * plan.weight), ()
    other_weight = bytes_per_element(row.other_weight_dtype)
    # The output head (the last layer with weights) stays 16-bit, as GPTQ/AWQ/bitsandbytes keep
    # lm_head; so do embeddings, norms and biases.
    head = max((i for i, layer in enumerate(analysis.layers) if layer.result.params), default=-1)
    # Each distinct op result (one per repeated block) is summed once, times its uses, in
    # integers: total = quantized x weight + scales + other x other weight, the same exact sum
    # as per tensor without Fraction arithmetic per tensor.
    uses: Counter[tuple[int, bool]] = Counter()
    shapes_of: dict[int, tuple[tuple[int, ...], ...]] = {}
    for index, layer in enumerate(analysis.layers):
        uses[(id(layer.result), layer.op in QUANTIZABLE_OPS and index != head)] += 1
        shapes_of[id(layer.result)] = layer.result.param_shapes
    quantized = other = 0
    scales = Fraction(0)
    for (result_id, quantizable), count in uses.items():
        for shape in shapes_of[result_id]:
            numel = math.prod(shape)
            if quantizable and len(shape) >= 2:
                quantized += count * numel
                scales += count * scale_bytes(precision, shape)
            else:
                other += count * numel
    total = quantized * plan.weight + scales + other * other_weight
    note = (
        f"{quantized:,} of {analysis.params:,} parameters quantized (matmul/conv weights); "
        "embeddings, norms, biases and the output head stay 16-bit"
    )
    return _ceil(total), (note,)


def _optimizer_state_bytes(
    shapes: Sequence[tuple[int, ...]], total_params: int, optimizer: Optimizer, plan: PrecisionPlan
) -> tuple[int, str]:
    if optimizer is Optimizer.ADAFACTOR:
        elements = 0
        for shape in shapes:
            if len(shape) >= 2:
                rows = math.prod(shape[:-1])
                cols = math.prod(shape[:-2]) * shape[-1]
                elements += rows + cols
            else:
                elements += math.prod(shape)
        return elements * 4, "Adafactor: factored fp32 second moment (rows + cols), no momentum"
    params = total_params
    if optimizer is Optimizer.ADAM_8BIT:
        blocks = sum(-(-math.prod(s) // ADAM_8BIT_BLOCK) for s in shapes)
        return 2 * params + 2 * blocks * 4, (
            "8-bit Adam: two 1-byte moments + one fp32 absmax per 2048-element block per moment"
        )
    slots = _STATE_SLOTS[optimizer]
    return slots * params * plan.state_slot, (
        f"{optimizer.value}: {slots} state tensor(s) per parameter x {plan.state_slot} B"
    )


def _step_temporaries(
    shapes: Sequence[tuple[int, ...]],
    total_params: int,
    request: MemoryRequest,
    plan: PrecisionPlan,
) -> tuple[int, str]:
    impl = request.optimizer_impl
    if impl is OptimizerImpl.AUTO:
        if request.precision in (Precision.MIXED_BF16, Precision.MIXED_FP16):
            impl = OptimizerImpl.FUSED  # DeepSpeed / Megatron fused Adam
        elif request.runtime is Runtime.CUDA:
            impl = OptimizerImpl.FOREACH
        else:
            impl = OptimizerImpl.FOR_LOOP
    if request.optimizer in (Optimizer.SGD, Optimizer.SGD_MOMENTUM) or impl is OptimizerImpl.FUSED:
        return 0, f"{impl.value} {request.optimizer.value} step updates in place"
    element = max(plan.state_slot, 2)
    if impl is OptimizerImpl.FOR_LOOP:
        largest = max((math.prod(s) for s in shapes), default=0)
        return 2 * largest * element, (
            f"for-loop step: two temporaries the size of the largest parameter ({largest:,})"
        )
    return total_params * element, "foreach step: one temporary per parameter, all at once"


_IN0, _OUT, _NEW = 0, 1, 2
_INPUT = 3  # _INPUT + k: the op's k-th input (``in1``, ``in2``, ...)


class _OpSizes(NamedTuple):
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


def _op_sizes(layer: LayerAnalysis, sizer: _Sizer, request: MemoryRequest) -> _OpSizes:
    tp = request.parallelism.tensor
    selective = request.checkpointing is Checkpointing.SELECTIVE
    fp32_acts = sizer.plan.activation == 4
    kept: list[tuple[int, int]] = []  # (_IN0 | _OUT | _NEW, bytes) in saved order
    internal = 0
    for item in layer.result.saved:
        numel = item.numel
        if tp > 1 and layer.op in INTERNAL_TENSOR_OPS and item.source == "new":
            numel = -(-numel // tp)
        size = sizer.storage_bytes(numel, item.storage)
        if item.source == "new" and layer.op in INTERNAL_TENSOR_OPS:
            # Gradients of a composite op's internal tensors (S x S scores, MLP intermediates)
            # are live in its backward; recomputed ones (selective checkpointing) too.
            internal = max(internal, size)
        if selective and item.label in _ATTENTION_MATRICES:
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
        _CPU_BACKWARD_EXTRA.get(layer.op, 0) * output if sizer.runtime is Runtime.CPU else 0
    )
    kept_inputs = tuple(
        dict.fromkeys(
            source - _INPUT if source >= _INPUT else 0
            for source, _ in kept
            if source == _IN0 or source >= _INPUT
        )
    )
    return _OpSizes(
        kept_inputs=kept_inputs,
        keeps_input=kept_inputs == (0,),
        keeps_output=any(source == _OUT for source, _ in kept),
        new_kept=tuple((slot, size) for slot, (source, size) in enumerate(kept) if source == _NEW),
        new_total=sum(size for source, size in kept if source == _NEW),
        forward_transient=sum(
            sizer.storage_bytes(t.numel, t.storage) for t in layer.result.transients
        )
        # oneDNN computes into its own output buffer and copies out (2x output, measured)
        + (output if sizer.runtime is Runtime.CPU and layer.op in CONV_OPS else 0),
        backward_internal=internal,
        output=output,
        backward_extra=backward_extra,
        output_storage=sizer.value_bytes(layer.output_numel, layer.output_kind)
        if layer.result.materialized
        else 0,
        backward_static=output + 2 * internal + backward_extra,
    )


@dataclass(slots=True)
class _Plan:
    """Resolved storage sizes and, per layer, which storages it keeps for backward.

    Storage ids are the analysis's (positive: model inputs and layer outputs); tensors a layer
    creates only to keep for backward get negative ids.
    """

    sizes: dict[int, int]  # storage -> bytes
    reused: list[tuple[int, ...]]  # per layer: its input/output storages it keeps for backward
    layer_saved: list[list[int]] | None  # per layer: every storage it keeps (built on demand)
    last_use: dict[int, int]  # storage -> last layer reading it in forward
    pinned: set[int]  # model inputs and the final output: held by the caller
    op_sizes: list[_OpSizes]
    out_alloc: list[int]  # per layer: bytes of the output it allocates (0: a view, in place)
    grad_in: list[int]  # per layer: bytes of the gradients of its inputs (training)
    first_saver: dict[int, int]  # kept storage -> earliest layer keeping it
    # Layer -> kept storages that are not its input or output. None until a caller needs their
    # ids (full checkpointing, the per-layer view): until then each layer's new tensors are
    # implied by its op sizes, kept only by it and freed after its own backward.
    adds: dict[int, list[int]] | None


class _Timeline(NamedTuple):
    """Per layer, the bytes that appear and disappear around it, derived from the plan."""

    alloc: list[int]  # allocated in its forward: its output and the new tensors it keeps
    free_forward: list[int]  # values whose last consumer it is (and that nothing keeps)
    free_backward: list[int]  # kept tensors released after its backward (earliest keeper)


def _checkpoint_unit(name: str) -> str | None:
    """Repeated blocks are the checkpoint units: ``layers.3.attn`` -> ``layers.3``."""
    parts = name.split(".", 2)
    if len(parts) == 3 and parts[1].isdigit():
        return f"{parts[0]}.{parts[1]}"
    return None


_ATTENTION_MATRICES = frozenset({"probs", "probs_mask", "probs_dropped"})
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

_RUNTIME_NOTES: Mapping[Runtime, str] = {
    Runtime.CPU: (
        "runtime pytorch_cpu, calibrated on PyTorch 2.13 CPU measurements "
        "(benchmarks/fidelity): dropout masks in the activation dtype; oneDNN convolutions "
        "hold an output-sized buffer in forward; backward kernel buffers in outputs: conv 2, "
        "batch norm 1, ReLU/ReLU6 1, RMSNorm 3, LSTM 5; GRU and RNN run PyTorch's native "
        "cell step by step (input gates, per-step tensors, a seq-first input copy); in-place "
        "ReLU6 keeps an input clone; SDPA with dropout runs the math kernel; default optimizer "
        "step: for-loop"
    ),
    Runtime.CUDA: (
        "runtime pytorch_cuda, rules read from PyTorch 2.13's source, not yet measured on a "
        "GPU: allocator_rounding and fragmentation_reserve replay the caching allocator "
        "(c10/cuda/CUDACachingAllocator.cpp); workspace: one cuBLAS workspace per handle and "
        "stream, two in training (aten/src/ATen/cuda/CublasHandlePool.cpp); dropout masks are "
        "1-byte bool (aten native_dropout); flash / memory-efficient attention keep the output "
        "and an fp32 log-sum-exp, padded to 32 rows by the memory-efficient kernel "
        "(aten/src/ATen/native/transformers/cuda/attention.cu); autocast caches 16-bit copies "
        "of fp32 weights until it exits (aten/src/ATen/autocast_mode.cpp); the default "
        "optimizer step is foreach (torch/optim/adamw.py: one parameter-sized temporary list), "
        "fused for mixed_*; DDP buckets (torch/csrc/distributed/c10d/reducer.cpp); the CUDA "
        "context is a documented default; per-kernel cuDNN workspaces are not added"
    ),
}


def _last_use(analysis: GraphAnalysis) -> dict[int, int]:
    """Storage -> the last layer reading it in forward."""
    return {
        storage: index
        for index, layer in enumerate(analysis.layers)
        for storage in layer.input_storages
    }


def _build_plan(
    analysis: GraphAnalysis,
    sizer: _Sizer,
    request: MemoryRequest,
    training: bool,
    last_use: dict[int, int] | None = None,
) -> _Plan:
    """The storage plan; ``last_use``: :func:`_last_use` of the analysis, if known. Inference
    leaves out the gradients of the layers' inputs (``grad_in``: only backward reads them)."""
    layers = analysis.layers
    # Byte figures once per distinct op result: the iterations of a repeat share theirs.
    distinct = {id(layer.result): layer for layer in layers}
    derived = {key: _op_sizes(layer, sizer, request) for key, layer in distinct.items()}
    op_sizes = [derived[id(layer.result)] for layer in layers]
    sizes = {bound.storage: sizer.value_bytes(bound.numel, bound.kind) for bound in analysis.inputs}
    out_alloc = [
        op.output_storage if layer.allocates_output else 0
        for layer, op in zip(layers, op_sizes, strict=True)
    ]
    sizes.update(
        {
            layer.output_storage: op.output_storage
            for layer, op in zip(layers, op_sizes, strict=True)
            if layer.allocates_output
        }
    )
    # Every storage a layer reads is a model input or an earlier layer's (allocated) output.
    grad_in = (
        [sum([sizes[storage] for storage in layer.input_storages]) for layer in layers]
        if training
        else []
    )
    if last_use is None:
        last_use = _last_use(analysis)
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
    # Earliest keeper: walk backwards so that earlier layers overwrite later ones.
    first_saver = {key: index for index in range(n - 1, -1, -1) for key in reused[index]}
    pinned = {bound.storage for bound in analysis.inputs}
    pinned.add(analysis.output_storage)
    return _Plan(
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


def _reused(layer: LayerAnalysis, op: _OpSizes) -> tuple[int, ...]:
    """The storages of the inputs (any of them) and output a layer keeps, each once."""
    keys = [layer.input_storages[k] for k in op.kept_inputs]
    if op.keeps_output:
        keys.append(layer.output_storage)
    return tuple(dict.fromkeys(keys))


def _new_storages(plan: _Plan) -> dict[int, list[int]]:
    """Give the tensors layers create to keep their ids (negative, unique per layer and slot)."""
    if plan.adds is None:
        plan.adds = {
            index: [-(index * 64) - 1 - slot for slot, _ in op.new_kept]
            for index, op in enumerate(plan.op_sizes)
            if op.new_kept
        }
        plan.sizes.update(
            {
                -(index * 64) - 1 - slot: size
                for index, op in enumerate(plan.op_sizes)
                for slot, size in op.new_kept
            }
        )
        plan.first_saver.update({key: index for index, keys in plan.adds.items() for key in keys})
    return plan.adds


def _layer_saved(plan: _Plan) -> list[list[int]]:
    """Per layer, the storages it keeps for backward: kept inputs/outputs, then new tensors."""
    if plan.layer_saved is None:
        adds = _new_storages(plan)
        plan.layer_saved = [[*keys, *adds.get(index, ())] for index, keys in enumerate(plan.reused)]
    return plan.layer_saved


def _apply_full_checkpointing(analysis: GraphAnalysis, plan: _Plan) -> dict[str, int]:
    """Keep only each unit's input; return the bytes each unit holds while recomputed."""
    units: dict[str, set[int]] = {}
    layer_saved = _layer_saved(plan)  # gives new tensors their ids
    for index, layer in enumerate(analysis.layers):
        unit = _checkpoint_unit(layer.name)
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


def _timeline(plan: _Plan) -> _Timeline:
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
    for storage, index in plan.last_use.items():
        if storage not in first_saver and storage not in pinned:
            free_forward[index] += sizes[storage]
    for key, index in first_saver.items():
        if key not in pinned:
            free_backward[index] += sizes[key]
    return _Timeline(alloc=alloc, free_forward=free_forward, free_backward=free_backward)


@dataclass(frozen=True, slots=True)
class _Peak:
    """The largest dynamic moment of a phase: activations, transients, gradients."""

    activations: int = 0
    transient: int = 0
    gradients: int = 0
    at: str = "end"  # "forward" (during layer ``index``), "end" (of forward) or "backward"
    index: int = -1

    @property
    def total(self) -> int:
        return self.activations + self.transient + self.gradients


def _forward(plan: _Plan, timeline: _Timeline, inputs_bytes: int) -> tuple[_Peak, int]:
    """Replay the forward; return its peak and the bytes live at its end.

    Before layer ``i`` the live bytes are the inputs plus everything allocated by layers
    ``< i`` minus what died after them; at layer ``i`` its allocations and its forward
    transient join them. Running sums, so the walk is C loops over per-layer figures.
    """
    alloc = timeline.alloc
    if not alloc:
        return _Peak(), inputs_bytes
    before = list(accumulate(map(sub, alloc, timeline.free_forward), initial=inputs_bytes))
    during = list(map(add, before, alloc))  # zip-like: stops after the last layer
    transients = [op.forward_transient for op in plan.op_sizes]
    totals = list(map(add, during, transients))
    index = max(range(len(totals)), key=totals.__getitem__)  # the first largest
    peak = _Peak(activations=during[index], transient=transients[index], at="forward", index=index)
    return peak, before[-1]


def _backward(
    analysis: GraphAnalysis,
    plan: _Plan,
    timeline: _Timeline,
    live_bytes: int,
    grad_bytes_per_layer: list[int],
    recompute: dict[str, int],
) -> _Peak:
    """Replay the backward in reverse layer order; return its peak.

    At layer ``i`` (walking from the last): the kept tensors of layers ``<= i`` (all live
    bytes at the end of forward minus those released after the backward of layers ``> i``),
    the block being recomputed, the output/input gradients and kernel buffers of ``i``, and
    the parameter gradients of layers ``>= i``.
    """
    n = len(analysis.layers)
    if not n:
        return _Peak()
    live = list(accumulate(reversed(timeline.free_backward), sub, initial=live_bytes))
    if recompute:
        extra = [recompute.get(_checkpoint_unit(layer.name) or "", 0) for layer in analysis.layers]
        live = list(map(add, live, reversed(extra)))
    grads = list(accumulate(reversed(grad_bytes_per_layer)))
    transients = list(
        map(add, [op.backward_static for op in reversed(plan.op_sizes)], reversed(plan.grad_in))
    )
    totals = list(map(add, map(add, live, transients), grads))
    k = max(range(n), key=totals.__getitem__)  # the first largest, walking backwards
    return _Peak(
        activations=live[k],
        transient=transients[k],
        gradients=grads[k],
        at="backward",
        index=n - 1 - k,
    )


def _storage_sizes(plan: _Plan) -> Counter[int]:
    """How many storages of each size the step allocates (new tensors without ids included)."""
    counts = Counter(plan.sizes.values())
    if plan.adds is None:
        per_op = Counter(map(id, plan.op_sizes))
        for op in {id(op): op for op in plan.op_sizes}.values():
            for _, size in op.new_kept:
                counts[size] += per_op[id(op)]
    return counts


def _input_bytes(analysis: GraphAnalysis, plan: _Plan) -> int:
    """Bytes of the model inputs' storages (live from the start)."""
    return sum(plan.sizes[storage] for storage in {bound.storage for bound in analysis.inputs})


def _grad_bytes_per_layer(analysis: GraphAnalysis, plan_bytes: Fraction, shard: int) -> list[int]:
    num, den = plan_bytes.numerator, plan_bytes.denominator * shard
    return [-(-layer.result.params * num // den) for layer in analysis.layers]


def _seed_rule(analysis: GraphAnalysis, sizer: _Sizer) -> int | None:
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


@dataclass(slots=True)
class _Estimation:
    """What the parts of one estimate read, and the explanations they add to."""

    analysis: GraphAnalysis
    request: MemoryRequest
    plan: PrecisionPlan
    sizer: _Sizer
    storage_plan: _Plan
    params: int
    static: dict[str, int]  # lines present in every phase (weights, buffers)
    inputs_bytes: int
    formulas: dict[str, str]
    notes: dict[str, list[str]]
    assumptions: list[str]
    # Training, for the formulas of the lines at the peak:
    grad_layers: list[int] = field(default_factory=list)  # per layer: gradient bytes
    grad_term: str = ""  # "ceil(<params> x <B> / <shard>)" of one layer, with {params}
    held_grads: str = ""  # the held gradients' expression (gradient accumulation)
    recompute: dict[str, int] = field(default_factory=dict)
    labels_rows: int = 0
    loss: str = ""  # the loss line's expression
    step_transient: str = ""  # the optimizer step's temporaries' expression
    step: _StepTensors | None = None  # training: the step's tensors, for the allocator replay
    allocator: tuple[AllocatorPeaks, AllocatorPeaks] | None = None  # first, steady iteration
    kv_bytes: int = 0  # inference: the KV cache
    comm_buffers: list[int] = field(default_factory=list)  # DDP buckets / FSDP gather buffers
    replays: ReplayMemo | None = None  # the caller's memo of allocator states after the weights
    plans: PlanMemo | None = None  # the caller's memo of what one analysis derives
    plan_key: tuple[object, ...] = ()  # inference: what the storage plan depends on


@dataclass(frozen=True, slots=True)
class _StepTensors:
    """Sizes of a training step's own tensors, as the allocator replay allocates them."""

    grad_element: Fraction  # bytes per gradient element
    grad_shard: int
    state_total: int  # optimizer state [B] (all shards' divisor applied)
    master_total: int
    cache_total: int  # autocast weight copies
    labels_bytes: int
    loss_bytes: int
    temporaries_total: int  # the optimizer step's temporaries [B]
    temporaries_largest: bool  # for-loop step: two temporaries of the largest parameter
    accumulate: bool  # gradients held across micro-batches (never freed in the step)


def _training_moments(e: _Estimation) -> tuple[list[_Moment], list[_Moment]]:
    """First-iteration and steady-state moments of one training step."""
    analysis, request, plan, sizer = e.analysis, e.request, e.plan, e.sizer
    storage_plan, lines_static, inputs_bytes = e.storage_plan, e.static, e.inputs_bytes
    formulas, notes, assumptions = e.formulas, e.notes, e.assumptions
    par = request.parallelism
    model_shard = par.tensor * par.pipeline
    params, shapes = e.params, analysis.param_shapes
    first_moments: list[_Moment] = []
    steady_moments: list[_Moment] = []
    grad_shard = model_shard * (par.data if par.zero_stage >= 2 else 1)
    grad_element = plan.grad
    if plan.master and request.fp32_grad_buffer:
        # Megatron's main_grad: gradients accumulate straight into an fp32 buffer.
        grad_element = Fraction(4)
        assumptions.append("gradients accumulate in an fp32 buffer (Megatron main_grad)")
    grad_bytes = _ceil(params * grad_element / grad_shard)
    state_full, state_note = _optimizer_state_bytes(shapes, params, request.optimizer, plan)
    state_shard = model_shard * (par.data if par.zero_stage >= 1 else 1)
    state_bytes = _ceil(Fraction(state_full, state_shard))
    master = _ceil(Fraction(params * plan.master, state_shard))
    labels_rows = math.prod(analysis.output_shape[:-1]) if analysis.output_shape else 1
    labels_bytes = labels_rows * 8
    temporaries_full, temp_note = _step_temporaries(shapes, params, request, plan)
    shard_words = _shard_words(par)
    temporaries = _ceil(Fraction(temporaries_full, state_shard))
    e.step = _StepTensors(
        grad_element=grad_element,
        grad_shard=grad_shard,
        state_total=state_bytes,
        master_total=master,
        cache_total=params * plan.weight_cache // model_shard if plan.weight_cache else 0,
        labels_bytes=labels_bytes,
        loss_bytes=_loss_bytes(analysis, sizer),
        temporaries_total=_ceil(Fraction(temporaries_full, state_shard)),
        temporaries_largest="for-loop" in temp_note,
        accumulate=request.accumulation_steps > 1,
    )
    e.step_transient = (
        f"ceil({temporaries_full:,} [B: {temp_note}] / {state_shard} [{shard_words(1)}])"
    )
    cache = params * plan.weight_cache // model_shard if plan.weight_cache else 0
    recompute: dict[str, int] = {}
    if request.checkpointing is Checkpointing.FULL:
        recompute = _apply_full_checkpointing(analysis, storage_plan)
        if not recompute:
            assumptions.append("full checkpointing: the graph has no repeated blocks; no effect")
    base = {**lines_static, "inputs": inputs_bytes + labels_bytes}
    if master:
        base["master_weights"] = master
    if cache:
        base["weight_cast_cache"] = cache
    buckets = _ddp_buckets(e, grad_bytes)
    if buckets:
        base["ddp_buckets"] = buckets
    gathered = _fsdp_buffers(e, grad_element)
    if gathered:
        base["fsdp_buffers"] = gathered
    loss = _loss_bytes(analysis, sizer)
    accumulate = request.accumulation_steps > 1
    grad_layers = (
        [0] * len(analysis.layers)
        if accumulate
        else _grad_bytes_per_layer(analysis, grad_element, grad_shard)
    )
    timeline = _timeline(storage_plan)
    fwd_peak, end_bytes = _forward(storage_plan, timeline, _input_bytes(analysis, storage_plan))
    fwd_end = _Peak(activations=end_bytes)
    bwd_peak = _backward(analysis, storage_plan, timeline, end_bytes, grad_layers, recompute)
    held_grads = {"gradients": grad_bytes} if accumulate else {}
    step_parts = {
        **lines_static,
        **({"ddp_buckets": buckets} if buckets else {}),
        "inputs": inputs_bytes + labels_bytes,
        **({"master_weights": master} if master else {}),
        "gradients": grad_bytes,
        "optimizer_state": state_bytes,
        "transient": temporaries,
    }
    for steady in (False, True):
        static = {**base, **held_grads}
        if steady:
            static["optimizer_state"] = state_bytes
        moments = [
            _moment("forward", static, fwd_peak, 0),
            _moment("forward", static, fwd_end, loss),
            _moment("backward", static, bwd_peak, loss),
            _Moment(phase="optimizer_step", parts=dict(step_parts)),
        ]
        (steady_moments if steady else first_moments).extend(moments)
    grad_expression = (
        f"ceil({params:,} [trainable params] x {grad_element} [B] / {grad_shard} "
        f"[{shard_words(2)}])"
    )
    e.grad_layers = grad_layers
    e.grad_term = (
        f"ceil({{params:,}} [params] x {grad_element} [B] / {grad_shard} [{shard_words(2)}])"
    )
    e.held_grads = grad_expression if accumulate else ""
    e.recompute = recompute
    e.labels_rows = labels_rows
    e.loss = _loss_expression(analysis, sizer)
    formulas.update(
        gradients=f"{grad_expression} = {grad_bytes:,} B",
        optimizer_state=f"ceil({state_full:,} [B: {state_note}] / {state_shard} "
        f"[{shard_words(1)}]) = {state_bytes:,} B",
        master_weights=f"ceil({params:,} [params] x {plan.master} [B fp32 master copy] / "
        f"{state_shard} [{shard_words(1)}]) = {master:,} B",
        weight_cast_cache=f"floor({params:,} [params] x {plan.weight_cache} [B autocast weight "
        f"copy] / {model_shard} [tensor x pipeline]) = {cache:,} B",
    )
    notes["transient"] = [temp_note]
    if request.accumulation_steps > 1:
        assumptions.append(
            f"gradient accumulation over {request.accumulation_steps} micro-batches: "
            "gradients persist across micro-batches; activations are per micro-batch"
        )
    if request.checkpointing is Checkpointing.SELECTIVE:
        assumptions.append("selective checkpointing: attention S x S tensors recomputed")
    if request.checkpointing is Checkpointing.FULL and recompute:
        assumptions.append(
            f"full checkpointing over {len(recompute)} repeated blocks: block inputs kept, one "
            "block recomputed at a time in backward"
        )
    return first_moments, steady_moments


DDP_BUCKET_BYTES = 25 * MIB  # DistributedDataParallel(bucket_cap_mb=25)
DDP_FIRST_BUCKET_BYTES = 1 * MIB  # torch.distributed._DEFAULT_FIRST_BUCKET_BYTES


def _ddp_buckets(e: _Estimation, grad_bytes: int) -> int:
    """DistributedDataParallel's flat communication buckets (data > 1 without ZeRO): a second
    copy of every gradient unless gradient_as_bucket_view (torch/nn/parallel/distributed.py,
    torch/csrc/distributed/c10d/reducer.cpp; buckets are allocated when DDP wraps the model)."""
    par = e.request.parallelism
    if par.data < 2 or par.zero_stage or par.gradient_as_bucket_view or not grad_bytes:
        return 0
    count = 1 + -(-max(0, grad_bytes - DDP_FIRST_BUCKET_BYTES) // DDP_BUCKET_BYTES)
    rest = grad_bytes - min(grad_bytes, DDP_FIRST_BUCKET_BYTES)
    e.comm_buffers += [min(grad_bytes, DDP_FIRST_BUCKET_BYTES)]
    e.comm_buffers += [min(DDP_BUCKET_BYTES, rest - i) for i in range(0, rest, DDP_BUCKET_BYTES)]
    e.formulas["ddp_buckets"] = (
        f"{grad_bytes:,} [B: every gradient, copied into {count:,} flat bucket(s) of at most "
        f"25 MiB (the first 1 MiB), DDP's default gradient_as_bucket_view=False] = "
        f"{grad_bytes:,} B"
    )
    return grad_bytes


def _fsdp_buffers(e: _Estimation, grad_element: Fraction) -> int:
    """FSDP / ZeRO-3: the largest wrapped unit's parameters gathered unsharded, twice (the unit
    running and the one prefetched: FSDP limit_all_gathers allows two in flight), and its
    gradients unsharded before their reduce-scatter (torch/distributed/fsdp). Units are the
    repeated blocks; the rest of the model is one unit."""
    par = e.request.parallelism
    if par.zero_stage < 3 or par.data < 2:
        return 0
    units: dict[str, int] = {}
    for layer in e.analysis.layers:
        unit = _checkpoint_unit(layer.name) or "(root)"
        units[unit] = units.get(unit, 0) + layer.result.params
    largest = max(units.values(), default=0)
    if not largest:
        return 0
    shard = par.tensor * par.pipeline
    weight = _ceil(largest * e.plan.weight / shard)
    grads = _ceil(largest * grad_element / shard)
    total = 2 * weight + grads
    e.comm_buffers += [weight, weight, grads]
    e.formulas["fsdp_buffers"] = (
        f"2 [units: running and prefetched] x {weight:,} [B: the largest unit's "
        f"{largest:,} params gathered] + {grads:,} [B: its gradients before the reduce-scatter] "
        f"= {total:,} B"
    )
    return total


def _inference_moments(e: _Estimation) -> list[_Moment]:
    """The forward pass of inference, with the KV cache of attention layers."""
    analysis, request, storage_plan = e.analysis, e.request, e.storage_plan
    formulas, assumptions, par = e.formulas, e.assumptions, request.parallelism
    static = {**e.static, "inputs": e.inputs_bytes}
    kv = 0
    if not analysis.is_decoder and request.kv_cache is not False:
        assumptions.append(
            "no KV cache: an encoder (no causal attention) attends over its whole input once"
            + (" (kv_cache=true asked for: encoders never cache)" if request.kv_cache else "")
        )
    if analysis.is_decoder and request.kv_cache is not False:
        kv_numel = _layer_totals(e.plans, analysis).kv_cache_numel
        kv_bytes = int(bytes_per_element(convention(request.precision).kv_cache_dtype))
        # tensor parallel: each GPU caches its heads; pipeline parallel: its stage's layers
        kv_shard = par.tensor * par.pipeline
        kv = _ceil(Fraction(kv_numel * kv_bytes, kv_shard))
        if kv:
            static["kv_cache"] = kv
            e.kv_bytes = kv
            formulas["kv_cache"] = (
                f"ceil({kv_numel:,} [elements: 2 x layers x kv_heads x head_dim x seq x batch] "
                f"x {kv_bytes} [B] / {kv_shard} "
                f"[{'tensor x pipeline' if par.pipeline > 1 else 'tensor'}]) = {kv:,} B"
            )
    fwd_peak = _memoised(  # a function of the (memoised) storage plan
        e.plans,
        analysis,
        ("forward peak", *e.plan_key[1:]),
        lambda: _forward(
            storage_plan, _timeline(storage_plan), _input_bytes(analysis, storage_plan)
        )[0],
    )
    assumptions.append("activations live from their producer to their last consumer")

    return [_moment("forward", static, fwd_peak, 0)]


def _shard_words(par: Parallelism) -> Callable[[int], str]:
    """Words for the divisor of state sharded from ZeRO stage ``stage`` on."""

    def words(stage: int) -> str:
        parts = ["tensor x pipeline"]
        if par.zero_stage >= stage:
            parts.append(f"ZeRO-{par.zero_stage} data ranks")
        return " x ".join(parts)

    return words


def _param_tensor_bytes(
    analysis: GraphAnalysis, element: Fraction, divisor: int
) -> list[list[int]]:
    """Per layer, the bytes of each of its parameter tensors at ``element`` B per element."""
    num, den = element.numerator, element.denominator * divisor
    return [
        [-(-math.prod(shape) * num // den) for shape in layer.result.param_shapes]
        for layer in analysis.layers
    ]


def _spread(total: int, sizes: Sequence[int]) -> list[int]:
    """``total`` bytes split over tensors in proportion to ``sizes`` (state per parameter)."""
    whole = sum(sizes)
    return [total * size // whole for size in sizes] if whole and total else []


class _WeightEvents(NamedTuple):
    """The weights' (and buffers') allocations, the first events of every step."""

    sizes: list[list[int]]  # per layer, its parameter tensors' bytes
    events: tuple[Event, ...]  # keys 0, 1, ...: their positions
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
    events = tuple(zip(repeat("alloc"), range(len(allocated)), allocated, strict=False))
    return _WeightEvents(sizes=sizes, events=events, key=EventsKey(events))


# Keys of the forward's own tensors: their position in the forward plus this, above any index of
# a step's events (which key the head's and the backward's tensors), so the forward's events
# can be built once and follow any head.
_FORWARD_KEYS = 1 << 48


class _ForwardEvents(NamedTuple):
    """The forward's events, as :func:`_allocator_events` describes them."""

    events: list[Event]
    cache_keys: list[int]  # autocast's 16-bit weight copies
    new_keys: list[list[int]]  # per layer, the tensors it creates to keep
    live: set[int]  # storages it allocated that are still live at its end


def _forward_events(
    analysis: GraphAnalysis, plan: _Plan, cache: Sequence[Sequence[int]], training: bool
) -> _ForwardEvents:
    """Per layer: autocast's weight copies (``cache``), its output and the tensors it creates
    to keep (training), its forward transient (allocated and freed), and the values whose last
    reader it is."""
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
        if training:
            for _, size in op.new_kept:
                kept.append(_FORWARD_KEYS + len(events))
                add(("alloc", kept[-1], size))
        new_keys.append(kept)
        if op.forward_transient:
            key = _FORWARD_KEYS + len(events)
            add(("alloc", key, op.forward_transient))
            add(("free", key, 0))
        for storage in freed_after.get(index, ()):
            if storage in forward_live and storage not in inputs:
                forward_live.discard(storage)
                add(("free", ~storage, 0))
    return _ForwardEvents(events, cache_keys, new_keys, forward_live)


def _forward_key(e: _Estimation) -> tuple[object, ...]:
    """What an inference forward's events depend on besides the analysis: the bytes of the
    activation dtype and the runtime (dropout masks, oneDNN buffers)."""
    return ("forward", e.plan.activation, e.sizer.runtime)


def _allocator_events(
    e: _Estimation, overhead: FrameworkOverhead
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
    allocates it. The forward's events are the same in both iterations (and, at inference, in
    every estimate of the analysis with the activation dtype and runtime): built once.
    """
    analysis, plan, request = e.analysis, e.storage_plan, e.request
    layers = analysis.layers
    model_shard = request.parallelism.tensor * request.parallelism.pipeline
    weight = e.plan.weight
    weights = _memoised(
        e.plans,
        analysis,
        ("weights", weight, model_shard),
        lambda: _weight_events(analysis, weight, model_shard),
    )
    events: list[Event] = list(weights.events)
    add = events.append
    flat = [size for sizes in weights.sizes for size in sizes]
    step = e.step
    if step is not None and step.master_total:
        for size in _spread(step.master_total, flat):
            add(("alloc", len(events), size))
    kv_layers = _layer_totals(e.plans, analysis).kv_layers
    for size in _spread(e.kv_bytes, [1] * (2 * kv_layers)):  # K and V
        add(("alloc", len(events), size))
    inputs = {bound.storage for bound in analysis.inputs}
    for bound in analysis.inputs:
        add(("alloc", ~bound.storage, plan.sizes[bound.storage]))
    if step is not None and step.labels_bytes:
        add(("alloc", len(events), step.labels_bytes))
    for _ in range(_cublas_handles(e) if overhead.workspace_bytes else 0):
        add(("alloc", len(events), overhead.workspace_bytes))
    for size in e.comm_buffers:  # held for the whole step (FSDP's: reused unit after unit)
        add(("alloc", len(events), size))
    if step is None:
        shared = _memoised(
            e.plans,
            analysis,
            _forward_key(e),
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
        _param_tensor_bytes(analysis, Fraction(e.plan.weight_cache), model_shard)
        if step.cache_total
        else [[] for _ in layers]
    )
    forward, cache_keys, new_keys, forward_live = _forward_events(analysis, plan, cache, True)
    forward_from = len(events)
    events += forward
    grads = _param_tensor_bytes(analysis, step.grad_element, step.grad_shard)
    grad_keys: list[list[int]] = [[] for _ in layers]  # per layer, as zero_grad frees them
    out_grad = plan.sizes.get(analysis.output_storage, 0)
    units = [_checkpoint_unit(layer.name) if e.recompute else None for layer in layers]
    temporaries: list[int] = []
    if step.temporaries_total:
        if step.temporaries_largest:
            temporaries = [step.temporaries_total // 2] * 2
        else:
            temporaries = _spread(step.temporaries_total, flat)
    steady_from = 0
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
            op = plan.op_sizes[index]
            unit = units[index]
            if unit != recomputing:
                if recomputing is not None:
                    add(("free", recompute_key, 0))
                if unit is not None and e.recompute.get(unit):
                    recompute_key = len(events)
                    add(("alloc", recompute_key, e.recompute[unit]))
                recomputing = unit if unit is not None and e.recompute.get(unit) else None
            key = len(events)
            add(("alloc", key, plan.grad_in[index]))
            buffers = 2 * op.backward_internal + op.backward_extra
            if buffers:
                add(("alloc", len(events), buffers))
                add(("free", len(events) - 1, 0))
            if with_grads:
                for size in grads[index]:
                    grad_keys[index].append(len(events))
                    add(("alloc", len(events), size))
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
            for size in _spread(step.state_total, flat):
                add(("alloc", len(events), size))
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


_HANDLE_WORDS = {
    1: "cuBLAS handle: the inference thread's",
    2: "cuBLAS handles: the forward's thread and autograd's backward thread, one workspace each",
}


def _cublas_handles(e: _Estimation) -> int:
    """cuBLAS handles that get a workspace: PyTorch keeps one per (handle, stream) and a handle
    per thread (CublasHandlePool.cpp); autograd runs a CUDA backward on its own device thread,
    so training has two (source-derived; benchmarks/fidelity/cuda probes measure it)."""
    return 2 if e.step is not None else 1


def _cuda_lines(e: _Estimation, parts: dict[str, int]) -> None:
    """CUDA runtime: allocator rounding and cached segments (from a replay of PyTorch's caching
    allocator over the step's tensors), the cuBLAS workspace and the CUDA context."""
    request, formulas = e.request, e.formulas
    overhead = request.overhead
    handles = _cublas_handles(e)
    workspace = handles * overhead.workspace_bytes
    if overhead.round_allocations:
        events, steady_from, weights, forward_from = _allocator_events(e, overhead)
        expandable = overhead.expandable_segments

        def replayed() -> tuple[AllocatorPeaks, AllocatorPeaks]:
            return replay_steady(
                events,
                steady_from,
                expandable=expandable,
                shared_prefix=len(weights.events),
                memo=e.replays,
                prefix_key=weights.key,
            )

        if steady_from or e.plans is None:
            e.allocator = replayed()
        else:  # inference: the weights, the head, then the forward of (analysis, dtype, runtime)
            head = tuple(events[len(weights.events) : forward_from])
            e.allocator = _memoised(
                e.plans,
                e.analysis,
                ("replayed", *_forward_key(e)[1:], weights.key, head, expandable),
                replayed,
            )
        steady = e.allocator[1]
        rounding = max(0, steady.allocated_bytes - steady.requested_bytes)
        parts["allocator_rounding"] = rounding
        formulas["allocator_rounding"] = (
            f"{steady.allocated_bytes:,} [B: peak allocated, max_memory_allocated] - "
            f"{steady.requested_bytes:,} [B: peak requested] = {rounding:,} B"
        )
    else:
        parts["allocator_rounding"] = 0
        formulas["allocator_rounding"] = (
            "0 [B: allocator not replayed (round_allocations=false)] = 0 B"
        )
    allocated = sum(parts.values())
    if overhead.fragmentation_fraction is not None or not overhead.round_allocations:
        fraction = overhead.fragmentation_fraction or 0.0
        parts["fragmentation_reserve"] = int(allocated * fraction)
        formulas["fragmentation_reserve"] = (
            f"floor({allocated:,} [B allocated] x {fraction!r} [fragmentation_fraction]) = "
            f"{parts['fragmentation_reserve']:,} B"
        )
    else:
        assert e.allocator is not None  # replayed above (round_allocations)
        steady = e.allocator[1]
        cached = max(0, steady.reserved_bytes - steady.allocated_bytes)
        parts["fragmentation_reserve"] = cached
        formulas["fragmentation_reserve"] = (
            f"{steady.reserved_bytes:,} [B: peak reserved, max_memory_reserved] - "
            f"{steady.allocated_bytes:,} [B: peak allocated] = {cached:,} B"
        )
    parts["workspace"] = workspace
    parts["cuda_context"] = overhead.cuda_context_bytes
    formulas.update(
        workspace=f"{handles} [{_HANDLE_WORDS[handles]}] x {overhead.workspace_bytes:,} "
        f"[B: {overhead.workspace_source}] = {workspace:,} B",
        cuda_context=f"{overhead.cuda_context_bytes:,} [B: {overhead.context_source}] = "
        f"{overhead.cuda_context_bytes:,} B",
    )


def _term(size: int, words: str, times: int = 1) -> tuple[int, str]:
    """A term of a sum: its value and its text, ``[times x ]size [words]``."""
    return size * times, (f"{times} x " if times != 1 else "") + f"{size:,} [{words}]"


def _sum(terms: Sequence[tuple[int, str]], total: int, empty: str) -> str:
    """``a [words] + b [words] = total B`` over the non-zero terms (``0 [empty]`` if none)."""
    shown = [text for value, text in terms if value]
    return f"{' + '.join(shown) or f'0 [{empty}]'} = {total:,} B"


def _live_groups(e: _Estimation, at: str, index: int, exclude: int | None) -> list[tuple[int, str]]:
    """The tensors live at a moment of the step, summed per producing op (largest first).

    ``at``: "forward" (during layer ``index``: what earlier layers allocated and that is still
    read or kept, and what the layer allocates), "end" (of forward) or "backward" (during the
    backward of layer ``index``: tensors kept by layers up to it, the caller's inputs and output,
    and the block being recomputed). The same storages the timeline adds and frees, so the sum
    is the activations of the moment.
    """
    analysis, plan = e.analysis, e.storage_plan
    layers = analysis.layers
    sites = {bound.storage: -1 for bound in analysis.inputs}
    for position, layer in enumerate(layers):
        if layer.allocates_output:
            sites[layer.output_storage] = position
    for position, keys in (plan.adds or {}).items():
        sites.update(dict.fromkeys(keys, position))
    kept, pinned = plan.first_saver, plan.pinned
    groups: dict[str, list[int]] = {}

    def put(site: int, size: int, count: int = 1) -> None:
        label = "the model inputs" if site < 0 else f"{layers[site].op} layers"
        group = groups.setdefault(label, [0, 0])
        group[0] += size
        group[1] += count

    for storage, site in sites.items():
        size = plan.sizes[storage]
        if not size or storage == exclude:
            continue
        freed = (
            plan.last_use.get(storage) if storage not in kept and storage not in pinned else None
        )
        if at == "forward":
            if site > index or (freed is not None and freed < index):
                continue
        elif freed is not None:
            continue
        elif at == "backward" and storage not in pinned and kept.get(storage, -1) > index:
            continue
        put(site, size)
    if plan.adds is None:  # each layer's new kept tensors, freed after its own backward
        for position, op in enumerate(plan.op_sizes):
            if op.new_total and (at == "end" or position <= index):
                put(position, op.new_total, len(op.new_kept))
    terms = [
        _term(size, f"B: {count:,} tensor{'s' if count > 1 else ''} from {label}")
        for label, (size, count) in sorted(groups.items(), key=lambda item: -item[1][0])
    ]
    if at == "backward" and e.recompute:
        unit = _checkpoint_unit(layers[index].name) or ""
        if e.recompute.get(unit):
            terms.append(_term(e.recompute[unit], f"B: block '{unit}' recomputed"))
    return terms


def _transient_terms(e: _Estimation, at: str, index: int) -> list[tuple[int, str]]:
    """The temporaries of layer ``index`` in its forward or backward."""
    if at not in ("forward", "backward"):
        return []
    layer, op = e.analysis.layers[index], e.storage_plan.op_sizes[index]
    name = layer.name
    if at == "forward":
        terms = [
            _term(e.sizer.storage_bytes(t.numel, t.storage), f"B: '{name}' {t.label}")
            for t in layer.result.transients
        ]
        extra = op.forward_transient - sum(size for size, _ in terms)
        if extra:  # oneDNN convolutions compute into their own buffer (CPU)
            terms.append(_term(extra, f"B: '{name}' oneDNN output buffer"))
        return terms
    return [
        _term(op.output, f"B: gradient of the output of '{name}'"),
        _term(
            op.backward_internal,
            f"B: gradients of the largest internal tensor of '{name}' and of its input",
            times=2,
        ),
        _term(op.backward_extra, "B: CPU backward kernel buffers"),
        _term(e.storage_plan.grad_in[index], f"B: gradients of the inputs of '{name}'"),
    ]


def _explain_peak(e: _Estimation, peak: _Moment, parts: Mapping[str, int]) -> None:
    """Formulas of the lines that depend on the moment of the peak, from their components."""
    analysis, sizer, formulas = e.analysis, e.sizer, e.formulas
    training = e.request.mode is Mode.TRAINING
    where = (
        f"during the {peak.at} of '{analysis.layers[peak.index].name}'"
        if peak.index >= 0
        else {"end": "at the end of forward", "step": "in the optimizer step"}[peak.at]
    )
    inputs = [
        f"{bound.numel:,} [{bound.name} elements] x {sizer.value_bytes(1, bound.kind)} [B]"
        for bound in analysis.inputs
    ]
    if training:
        inputs.append(f"{e.labels_rows:,} [int64 labels] x 8 [B]")
    formulas["inputs"] = f"{' + '.join(inputs) or '0'} = {parts['inputs']:,} B"
    if "buffers" in parts:
        buffers: dict[str, list[int]] = {}
        for layer in analysis.layers:
            if layer.result.buffers_bytes:
                group = buffers.setdefault(layer.op, [0, 0])
                group[0] += layer.result.buffers_bytes
                group[1] += 1
        formulas["buffers"] = _sum(
            [
                _term(
                    size, f"B: {count:,} {op} layer{'s' if count > 1 else ''}: running statistics"
                )
                for op, (size, count) in buffers.items()
            ],
            parts["buffers"],
            "B",
        )
    if "activations" in parts:
        exclude = analysis.output_storage if "outputs" in parts else None
        formulas["activations"] = f"[{where}] " + _sum(
            _live_groups(e, peak.at, peak.index, exclude), parts["activations"], "B: none"
        )
    if "transient" in parts:
        if peak.at == "step":
            formulas["transient"] = f"{e.step_transient} = {parts['transient']:,} B"
        else:
            formulas["transient"] = f"[{where}] " + _sum(
                _transient_terms(e, peak.at, peak.index), parts["transient"], "B: none"
            )
    if training and peak.at != "step":
        terms = [f"{e.held_grads} [held across micro-batches]"] if e.held_grads else []
        if peak.at == "backward":
            grads = Counter(
                layer.result.params
                for layer, size in zip(
                    analysis.layers[peak.index :], e.grad_layers[peak.index :], strict=True
                )
                if size
            )
            terms += [
                f"{count:,} [layers] x {e.grad_term.format(params=params)}"
                for params, count in sorted(grads.items(), key=lambda item: -item[0])
            ]
        ran = (
            f"[{where}: gradients of the layers whose backward ran] "
            if peak.at == "backward"
            else f"[{where}: no backward has run yet] "
        )
        formulas["gradients"] = f"{ran}{' + '.join(terms) or '0'} = {parts['gradients']:,} B"
    if "loss" in parts:
        formulas["loss"] = f"{e.loss} = {parts['loss']:,} B"


def _layer_view(e: _Estimation) -> tuple[LayerMemory, ...]:
    """Per layer: output, parameters, FLOPs and what it keeps for backward."""
    analysis, request, sizer, storage_plan = e.analysis, e.request, e.sizer, e.storage_plan
    training = request.mode is Mode.TRAINING
    layers_view: list[LayerMemory] = []
    first_saver = storage_plan.first_saver
    layer_saved = _layer_saved(storage_plan)
    for index, layer in enumerate(analysis.layers):
        new_saved = sum(
            storage_plan.sizes.get(key, 0)
            for key in layer_saved[index]
            if first_saver.get(key) == index
        )
        layers_view.append(
            LayerMemory(
                name=layer.name,
                op=layer.op,
                output_shape=layer.output_shape,
                params=layer.params,
                flops=layer.flops,
                output_bytes=sizer.value_bytes(layer.output_numel, layer.output_kind),
                saved_bytes=new_saved,
                kept=_kept_tensors(layer, sizer, request) if training else (),
            )
        )
    return tuple(layers_view)


def analyze_for(
    inputs: Sequence[InputDecl],
    layers: Sequence[Mapping[str, Any]],
    bindings: Mapping[str, int],
    request: MemoryRequest,
) -> GraphAnalysis:
    """The graph analysed the way ``request`` runs it: its mode, attention implementation
    (None: PyTorch SDPA's default for its runtime and precision), runtime, precision and
    logits. The analysis :func:`estimate_memory` expects for ``request``."""
    return analyze(
        inputs,
        layers,
        bindings,
        training=request.mode is Mode.TRAINING,
        attention=request.attention,
        runtime=request.runtime,
        precision=request.precision,
        logits=request.logits,
    )


def _check_analysis(analysis: GraphAnalysis, request: MemoryRequest) -> None:
    """The request's attention and logits options are the ones the graph was analysed with."""
    if request.attention is not None and analysis.attention_requested is not request.attention:
        asked = analysis.attention_requested
        raise MemoryInputError(
            f"the request asks for attention={request.attention.value} but the graph was "
            f"analysed with attention={asked.value if asked else 'default'}: analyse it with "
            "analyze_for(..., request)"
        )
    if request.logits is not analysis.logits_requested and request.logits is Logits.LAST:
        raise MemoryInputError(
            "the request asks for logits=last but the graph was analysed with logits="
            f"{analysis.logits_requested.value}: analyse it with analyze_for(..., request)"
        )


def estimate_memory(
    analysis: GraphAnalysis,
    request: MemoryRequest,
    *,
    per_layer: bool = False,
    replays: ReplayMemo | None = None,
    plans: PlanMemo | None = None,
    explain: bool = True,
) -> MemoryEstimate:
    """Peak memory per device for one training step or one inference forward pass.

    Parameters
    ----------
    analysis : GraphAnalysis
        The model analysed at the micro-batch size (batch per device per forward), with the
        request's attention implementation and logits (:func:`analyze_for`).
    request : MemoryRequest
        Mode, precision convention, optimizer, checkpointing, parallelism, runtime.
    per_layer : bool
        Whether to return the per-layer view.
    replays : ReplayMemo, optional
        A bounded cache the caller keeps across estimates: the CUDA allocator's state after the
        weights is replayed once per distinct weights (estimates of one model at several batch
        sizes or workspace sizes share it). Speed only: the result is the same without it.
    plans : PlanMemo, optional
        A bounded cache the caller keeps across estimates of the same analysis objects: the
        inference storage plan (per precision, runtime, tensor split and checkpointing), the
        forward's allocator events (per activation dtype and runtime) and the weights' events
        (per bytes per weight and model shard) are derived once. Speed only, as ``replays``.
    explain : bool
        False: the formulas that describe the moment of the peak (inputs, buffers,
        activations, transient, gradients, loss) are left as the line's key, for a caller that
        reads only the bytes (a fit). Speed only: every figure is the same.

    Returns
    -------
    MemoryEstimate
        Lines that add up to ``peak_bytes`` at ``peak_phase``, and the assumptions.

    Notes
    -----
    Weights: params x bytes(weight dtype) / (tensor x pipeline) / (data if ZeRO-3).
    Gradients: trainable params x bytes(grad dtype), sharded by ZeRO-2/3.
    Optimizer state: per trainable param (SGD 0, momentum 1, Adam/AdamW 2 slots of the state
    dtype; 8-bit Adam 2 B; Adafactor rows + cols), sharded by ZeRO-1+.
    KV cache (inference): 2 x layers x kv_heads x head_dim x seq x batch x bytes.
    """
    training = request.mode is Mode.TRAINING
    precision = request.precision
    plan = precision_plan(precision)
    if training and not convention(precision).trainable:
        trainable = ", ".join(p.value for p, row in CONVENTIONS.items() if row.trainable)
        raise MemoryInputError(
            f"precision '{precision.value}' is for inference (quantized weights); train in "
            f"{trainable}"
        )
    par = request.parallelism
    if par.zero_stage and par.data < 2:
        raise MemoryInputError("ZeRO sharding needs a data-parallel degree of at least 2")
    _check_analysis(analysis, request)
    sizer = _Sizer(plan, request.runtime)
    assumptions: list[str] = [plan.convention, _RUNTIME_NOTES[request.runtime]]
    assumptions += [f"attention: {impl.value} ({why})" for impl, why in analysis.attention_used]
    if analysis.is_decoder and not training:
        assumptions.append(_logits_note(analysis))
    elif training and request.logits is Logits.LAST:
        assumptions.append("logits: every position (training: the loss reads every position)")
    if training and analysis.batchnorm_folded:
        assumptions.append(
            f"cannot see batch norm: {analysis.batchnorm_folded} convolution(s) of this graph "
            "may carry a batch norm that an eval-mode export folded into their weights; a "
            "training step keeps batch norm's inputs and statistics, which this estimate "
            "misses (export with training=torch.onnx.TrainingMode.TRAINING, or with dynamo=True, "
            "whose provenance lets the importer restore the batch norm)"
        )
    model_shard = par.tensor * par.pipeline
    params = _layer_totals(plans, analysis).params

    weights_full, weight_notes = _memoised(
        plans,
        analysis,
        ("weights bytes", precision),
        lambda: _weights_bytes(analysis, plan, precision),
    )
    weights = _ceil(Fraction(weights_full, model_shard))
    if convention(precision).quantized:
        expression = f"{weights_full:,} [B: quantized weights, scales and 16-bit rest]"
    else:
        expression = f"{params:,} [params] x {plan.weight} [B]"
    if model_shard > 1:
        expression = f"ceil({expression} / {model_shard} [tensor x pipeline])"
    if par.zero_stage >= 3:
        weights = _ceil(Fraction(weights, par.data))
        expression = f"ceil({expression} / {par.data} [ZeRO-3 data ranks])"
    lines_static: dict[str, int] = {"weights": weights}
    formulas: dict[str, str] = {"weights": f"{expression} = {weights:,} B"}
    notes: dict[str, list[str]] = {"weights": list(weight_notes)}
    buffers = _layer_totals(plans, analysis).buffers_bytes
    if buffers:
        lines_static["buffers"] = buffers

    # An inference plan reads the activation bytes (bf16 = fp16) and the runtime only: the
    # tensor split, checkpointing and weight bytes change what a layer keeps for backward, which
    # inference never reads (no tensor is kept: reused (), adds {}). It is built for one tensor
    # and no checkpointing, whatever the request's.
    plan_key: tuple[object, ...] = ("plan", plan.activation, request.runtime)
    if training:  # full checkpointing and the per-layer view edit a training plan
        storage_plan = _build_plan(analysis, sizer, request, training)
    else:  # an inference plan is only read (adds {}: its layer_saved is built once, the same)
        storage_plan = _memoised(
            plans,
            analysis,
            plan_key,
            lambda: _build_plan(
                analysis,
                sizer,
                _INFERENCE_PLAN_REQUEST,
                training,
                _memoised(plans, analysis, ("last use",), lambda: _last_use(analysis)),
            ),
        )
    e = _Estimation(
        analysis=analysis,
        request=request,
        plan=plan,
        sizer=sizer,
        storage_plan=storage_plan,
        params=params,
        static=lines_static,
        inputs_bytes=sum(sizer.value_bytes(b.numel, b.kind) for b in analysis.inputs),
        formulas=formulas,
        notes=notes,
        assumptions=assumptions,
        replays=replays,
        plans=plans,
        plan_key=plan_key,
    )
    if training:
        first_moments, steady_moments = _training_moments(e)
    else:
        first_moments, steady_moments = [], _inference_moments(e)

    peak = max(steady_moments, key=lambda m: m.total)
    first_peak = max(first_moments, key=lambda m: m.total) if first_moments else None
    parts = dict(peak.parts)
    if training and peak.phase == "backward" and parts.get("activations", 0):
        # The model's output (the logits) is alive through backward because the caller holds
        # it, not because a layer kept it: its own line.
        out_bytes = storage_plan.sizes.get(analysis.output_storage, 0)
        if 0 < out_bytes <= parts["activations"]:
            parts["activations"] -= out_bytes
            parts["outputs"] = out_bytes
            shape = "x".join(str(d) for d in analysis.output_shape)
            formulas["outputs"] = (
                f"{out_bytes:,} [B: the model's output, {shape}, returned to the caller] = "
                f"{out_bytes:,} B"
            )
    if request.runtime is Runtime.CUDA:
        _cuda_lines(e, parts)
    if explain:
        _explain_peak(e, peak, parts)
    order = [
        "weights", "master_weights", "weight_cast_cache", "gradients", "ddp_buckets",
        "fsdp_buffers", "optimizer_state", "buffers", "inputs", "outputs", "activations", "loss",
        "transient", "kv_cache", "workspace",
        "allocator_rounding", "fragmentation_reserve", "cuda_context",
    ]  # fmt: skip
    lines = tuple(
        MemoryLine(
            key=key,
            bytes=parts[key],
            formula=formulas.get(key, key),
            assumptions=tuple(notes.get(key, [])),
        )
        for key in order
        if key in parts and (training or key != "gradients")  # inference has no gradients
    )
    layers_view = _layer_view(e) if per_layer else ()
    phase_peaks: dict[str, int] = {}
    for moment in steady_moments:
        phase_peaks[moment.phase] = max(phase_peaks.get(moment.phase, 0), moment.total)
    extra = sum(parts.values()) - peak.total
    cuda = _cuda_memory(e, parts, first_peak.total if first_peak else None)
    return MemoryEstimate(
        mode=request.mode,
        runtime=request.runtime,
        params=params,
        trainable_params=params if training else 0,
        lines=lines,
        peak_bytes=sum(parts.values()),
        peak_phase=peak.phase,
        phase_peaks={k: v + extra for k, v in phase_peaks.items()},
        first_iteration_peak_bytes=first_peak.total + extra if first_peak else None,
        first_iteration_peak_phase=first_peak.phase if first_peak else None,
        seed_rule_bytes=(
            weights + seed if (seed := _seed_rule(analysis, sizer)) is not None else None
        ),
        layers=layers_view,
        assumptions=tuple(assumptions),
        cuda=cuda,
    )


# What an inference storage plan is built with besides the activation bytes and the runtime
# (the sizer's): one GPU, no checkpointing (see estimate_memory)
_INFERENCE_PLAN_REQUEST = MemoryRequest(mode=Mode.INFERENCE)


def inference_floor_bytes(
    analysis: GraphAnalysis, request: MemoryRequest, *, plans: PlanMemo | None = None
) -> int:
    """A floor under ``estimate_memory(analysis, request).peak_bytes`` at inference, found
    without replaying the step: the weights and the KV cache (as the estimate's lines have
    them), and on CUDA the cuBLAS workspace and the CUDA context; the estimate's other lines
    (inputs, activations, transients, allocator rounding and cached segments) are never
    negative. A caller that only needs to know whether a peak exceeds a budget can skip the
    estimate when this floor already does. ``plans``: as :func:`estimate_memory`'s."""
    if request.mode is not Mode.INFERENCE:
        raise MemoryInputError("inference_floor_bytes is for inference")
    precision = request.precision
    plan = precision_plan(precision)
    par = request.parallelism
    weights_full, _ = _memoised(
        plans,
        analysis,
        ("weights bytes", precision),
        lambda: _weights_bytes(analysis, plan, precision),
    )
    floor = _ceil(Fraction(weights_full, par.tensor * par.pipeline))
    if par.zero_stage >= 3:
        floor = _ceil(Fraction(floor, par.data))
    if analysis.is_decoder and request.kv_cache is not False:
        kv_numel = _layer_totals(plans, analysis).kv_cache_numel
        kv_bytes = int(bytes_per_element(convention(precision).kv_cache_dtype))
        floor += _ceil(Fraction(kv_numel * kv_bytes, par.tensor * par.pipeline))
    if request.runtime is Runtime.CUDA:  # one cuBLAS handle at inference (_cublas_handles)
        floor += request.overhead.workspace_bytes + request.overhead.cuda_context_bytes
    return floor


def _cuda_memory(
    e: _Estimation, parts: Mapping[str, int], first_total: int | None
) -> CudaMemory | None:
    """The CUDA figures of an estimate from its lines (and the first iteration's replay)."""
    if e.request.runtime is not Runtime.CUDA:
        return None
    context = parts["cuda_context"]
    cached = parts["fragmentation_reserve"]
    allocated = sum(parts.values()) - context - cached
    first_allocated = first_reserved = None
    if first_total is not None:
        rounding = cache = 0
        if e.allocator is not None:
            first = e.allocator[0]
            rounding = max(0, first.allocated_bytes - first.requested_bytes)
            cache = max(0, first.reserved_bytes - first.allocated_bytes)
        elif cached:
            cache = cached
        first_allocated = first_total + rounding + parts["workspace"]
        first_reserved = first_allocated + cache
    return CudaMemory(
        allocated_bytes=allocated,
        reserved_bytes=allocated + cached,
        context_bytes=context,
        device_total_bytes=allocated + cached + context,
        first_iteration_allocated_bytes=first_allocated,
        first_iteration_reserved_bytes=first_reserved,
        expandable_segments=e.request.overhead.expandable_segments,
    )


def _logits_note(analysis: GraphAnalysis) -> str:
    """Which positions a decoder's output head computed at inference."""
    if analysis.logits is not Logits.LAST:
        if analysis.logits_requested is Logits.LAST:
            return (
                "logits: every position (logits=last asked for, but no linear output head reads "
                "a [N, S, D] hidden state at the top level)"
            )
        return "logits: every position"
    shape = ", ".join(f"{d:,}" for d in analysis.output_shape)
    return (
        f"logits: last position only: '{analysis.logits_head}' runs on hidden[:, -1:, :] and "
        f"outputs [{shape}], as serving stacks do (logits=last)"
    )


_SOURCES = {"in0": "input", "in0_fp32": "input", "out": "output", "new": "new"}


def _kept_tensors(
    layer: LayerAnalysis, sizer: _Sizer, request: MemoryRequest
) -> tuple[KeptTensor, ...]:
    """What a layer keeps for backward, with storage dtypes for this precision and runtime."""
    act = convention(request.precision).activation_dtype.value
    kept = []
    for item in layer.result.saved:
        if request.checkpointing is Checkpointing.SELECTIVE and item.label in _ATTENTION_MATRICES:
            continue
        source = _SOURCES.get(item.source, "new")
        storage = item.storage
        if item.source == "in0_fp32" and act != "fp32":
            source = "new"  # a fp32 copy of a 16-bit input
        if storage is Storage.ACT:
            dtype = act
        elif storage is Storage.MASK:
            dtype = "bool" if request.runtime is Runtime.CUDA else act
        else:
            dtype = storage.value
        kept.append(
            KeptTensor(
                label=item.label,
                source=source,
                elements=item.numel,
                dtype=dtype,
                bytes=sizer.storage_bytes(item.numel, storage),
            )
        )
    return tuple(kept)


def _moment(phase: str, static: Mapping[str, int], peak: _Peak, loss: int) -> _Moment:
    parts = dict(static)
    parts["gradients"] = parts.get("gradients", 0) + peak.gradients
    parts["activations"] = peak.activations
    parts["transient"] = peak.transient
    if loss:
        parts["loss"] = loss
    return _Moment(phase=phase, parts=parts, at=peak.at, index=peak.index)


def _loss_expression(analysis: GraphAnalysis, sizer: _Sizer) -> str:
    """The arithmetic of :func:`_loss_bytes`."""
    numel = math.prod(analysis.output_shape) if analysis.output_shape else 1
    if len(analysis.output_shape) >= 3:
        return f"{numel:,} [logits elements] x 4 [B: fp32 log-probabilities, HF ForCausalLMLoss]"
    element = sizer.storage_bytes(1, Storage.ACT)
    return f"{numel:,} [logits elements] x {element} [B: log-probabilities kept for backward]"


def _loss_bytes(analysis: GraphAnalysis, sizer: _Sizer) -> int:
    """Cross-entropy over the final output: log-probabilities kept for backward.

    Token-level losses (logits of rank 3, language models) follow Hugging Face's
    ForCausalLMLoss, which upcasts the logits to fp32 first: the kept log-probabilities are
    fp32 whatever the activation dtype. Classification losses keep them in the logits' dtype.
    """
    if analysis.layers and analysis.layers[-1].op == "cross_entropy":
        return 0
    numel = math.prod(analysis.output_shape) if analysis.output_shape else 1
    storage = Storage.FP32 if len(analysis.output_shape) >= 3 else Storage.ACT
    return sizer.storage_bytes(numel, storage)
