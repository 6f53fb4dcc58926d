"""The closed-form memory rules: bytes per element of each kind of state, stored weights,
optimizer state, the optimizer step's temporaries, the KV cache, gradients, DDP's buckets and
the loss. Plain values in, integer bytes out; each rule names its source.

References
----------
Rajbhandari et al., "ZeRO: Memory Optimizations Toward Training Trillion Parameter Models", 2020.
Dettmers et al., "8-bit Optimizers via Block-wise Quantization", 2022.
Shazeer and Stern, "Adafactor: Adaptive Learning Rates with Sublinear Memory Cost", 2018.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from enum import Enum
from fractions import Fraction
from typing import NamedTuple

from app.domain.graph.analysis import GraphAnalysis
from app.domain.graph.ops import Storage, TensorKind
from app.domain.graph.traits import QUANTIZABLE_OPS
from app.domain.memory.checkpoint import checkpoint_weights_bytes, unquantized_dtype_bytes
from app.domain.memory.request import MemoryRequest
from app.domain.precision import (
    CONVENTIONS,
    DType,
    Precision,
    PrecisionConvention,
    bytes_per_element,
    convention,
    scale_bytes,
)
from app.domain.quantization import CheckpointLayout
from app.domain.units import MIB
from app.domain.workload import BNB_OPTIMIZERS, Optimizer, OptimizerImpl, Runtime


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

# bitsandbytes 0.45+, bitsandbytes/optim/optimizer.py (Optimizer2State.init_state,
# Optimizer8bit.get_state_buffer / fill_qmap): block-wise 8-bit state has one fp32 absmax per
# 256 values per state (releases up to 0.44 used 2048: the legacy ``adam_8bit`` option keeps
# that); tensors of fewer than ``min_8bit_size`` = 4096 elements keep fp32 state; the two
# quantization maps (signed and unsigned dynamic, 256 fp32 values each) are created once per
# optimizer; a paged optimizer allocates state1/state2 of tensors of at least 1e5 elements with
# ``F.get_paged`` (cudaMallocManaged unified memory), the rest with ``torch.zeros_like``.
BNB_BLOCK = 256
BNB_MIN_8BIT_SIZE = 4096
BNB_PAGED_MIN_NUMEL = 100_000
BNB_QMAP_BYTES = 2 * 256 * 4


class BnbState(NamedTuple):
    """A bitsandbytes AdamW's state: on the GPU through PyTorch's allocator, in unified
    (paged) memory outside it, and the words for them."""

    device_bytes: int
    paged_bytes: int
    note: str


def bnb_adamw_state(shapes: Sequence[tuple[int, ...]], optimizer: Optimizer) -> BnbState:
    """The state of bitsandbytes' AdamW8bit, PagedAdamW8bit or PagedAdamW32bit, unsharded.

    Parameters
    ----------
    shapes : sequence of tuple of int
        The trainable parameter tensors' shapes [elements per dimension].
    optimizer : Optimizer
        ``adamw_8bit``, ``paged_adamw_8bit`` or ``paged_adamw_32bit``.

    Returns
    -------
    BnbState
        ``device_bytes`` [B]: per tensor of n elements, 8-bit (n >= 4096): ``2 x n x 1`` (uint8
        state1, state2) + ``2 x ceil(n / 256) x 4`` (fp32 absmax1, absmax2), else ``2 x n x 4``
        (fp32 state1, state2); + 2,048 B of quantization maps once when any tensor is 8-bit.
        Paged optimizers move state1/state2 of tensors of n >= 100,000 to ``paged_bytes`` [B]
        (their absmax stays on the GPU).

    References
    ----------
    bitsandbytes 0.45+, bitsandbytes/optim/optimizer.py and bitsandbytes/optim/adamw.py;
    Dettmers et al., "8-bit Optimizers via Block-wise Quantization", 2022.
    """
    eight = optimizer in (Optimizer.ADAMW_8BIT, Optimizer.PAGED_ADAMW_8BIT)
    paged = optimizer in (Optimizer.PAGED_ADAMW_8BIT, Optimizer.PAGED_ADAMW_32BIT)
    device = moved = absmax = small = quantized = 0
    for shape in shapes:
        n = math.prod(shape)
        if eight and n >= BNB_MIN_8BIT_SIZE:
            states = 2 * n
            quantized += n
            absmax += 2 * -(-n // BNB_BLOCK) * 4
        else:
            states = 2 * n * 4
            small += n
        if paged and n >= BNB_PAGED_MIN_NUMEL:
            moved += states
        else:
            device += states
    qmaps = BNB_QMAP_BYTES if quantized else 0
    words = []
    if eight:
        words.append(
            f"{quantized:,} elements in 8 bits (2 x 1 B + 2 x 4 B absmax per {BNB_BLOCK} values)"
        )
        words.append(f"{small:,} in tensors under {BNB_MIN_8BIT_SIZE:,} elements at 2 x 4 B")
        if qmaps:
            words.append(f"{qmaps:,} B quantization maps")
    else:
        words.append(f"{small:,} elements at 2 x 4 B (fp32 state1, state2)")
    if paged:
        words.append(
            f"state1/state2 of tensors of >= {BNB_PAGED_MIN_NUMEL:,} elements paged "
            "(cudaMallocManaged, outside the allocator)"
        )
    note = f"bitsandbytes {optimizer.value}: " + "; ".join(words)
    return BnbState(device + absmax + qmaps, moved, note)


def precision_plan(precision: Precision) -> PrecisionPlan:
    """Bytes per element for a precision convention."""
    return _PLANS[precision]


def ceil_fraction(value: Fraction | int) -> int:
    """The smallest integer not below ``value`` (bytes of a fractional total, rounded up)."""
    fraction = Fraction(value)
    return -(-fraction.numerator // fraction.denominator)


class Sizer:
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
        if storage is Storage.CAUSAL_MASK:  # eager's causal mask: counted on CUDA (issue 32)
            return numel * self.plan.activation if self.runtime is Runtime.CUDA else 0
        # Dropout mask: a bool tensor on CUDA; on CPU the mask has the input's dtype.
        return numel if self.runtime is Runtime.CUDA else numel * self.plan.activation

    def value_bytes(self, numel: int, kind: TensorKind) -> int:
        return numel * (8 if kind is TensorKind.INDEX else self.plan.activation)


def weights_bytes(
    analysis: GraphAnalysis,
    plan: PrecisionPlan,
    precision: Precision,
    only: Collection[int] | None = None,
    checkpoint: CheckpointLayout | None = None,
) -> tuple[int, tuple[str, ...]]:
    """Bytes of the stored weights, with the quantization scales of weight-only formats.

    Parameters
    ----------
    analysis : GraphAnalysis
        The model; its layers' parameter shapes and ops decide what is quantized.
    plan : PrecisionPlan
        Bytes per element under ``precision`` (``plan.weight`` [B], fractional for 4-bit).
    precision : Precision
        The convention; a quantized one stores matmul/conv weights in its weight dtype.
    only : collection of int, optional
        The indices of the layers to count (a pipeline stage's); None: every layer.
    checkpoint : CheckpointLayout, optional
        A pre-quantized checkpoint: priced as stored (:mod:`app.domain.memory.checkpoint`).

    Returns
    -------
    tuple of (int, tuple of str)
        The stored bytes of every weight, unsharded [B], and a note for quantized formats.

    Notes
    -----
    Unquantized: ``ceil(params x weight bytes)``. Quantized:
    ``ceil(quantized x weight bytes + scales + other x 16-bit bytes)``, where ``quantized``
    counts the elements of matrices (rank >= 2) of quantizable ops except the output head, and
    ``scales`` is :func:`app.domain.precision.scale_bytes` per quantized tensor.

    References
    ----------
    Frantar et al., "GPTQ: Accurate Post-Training Quantization for Generative Pre-trained
    Transformers", 2023 (group-wise scales, the 16-bit output head).
    Lin et al., "AWQ: Activation-aware Weight Quantization for LLM Compression", 2024.
    """
    row = convention(precision)
    if checkpoint is not None:
        return checkpoint_weights_bytes(
            analysis, checkpoint, unquantized_dtype_bytes(precision), only
        )
    if not row.quantized:
        if only is not None:
            params = sum(analysis.layers[i].result.params for i in only)
            return ceil_fraction(params * plan.weight), ()
        return ceil_fraction(analysis.params * plan.weight), ()
    other_weight = bytes_per_element(row.other_weight_dtype)
    # The output head (the last layer with weights) stays 16-bit, as GPTQ/AWQ/bitsandbytes keep
    # lm_head; so do embeddings, norms and biases.
    layers = analysis.layers  # from the end: the last one with weights, -1 without
    head = next((i for i in reversed(range(len(layers))) if layers[i].result.params), -1)
    # Each distinct op result (one per repeated block) is summed once, times its uses, in
    # integers: total = quantized x weight + scales + other x other weight, the same exact sum
    # as per tensor without Fraction arithmetic per tensor.
    uses: Counter[tuple[int, bool]] = Counter()
    shapes_of: dict[int, tuple[tuple[int, ...], ...]] = {}
    for index, layer in enumerate(analysis.layers):
        if only is not None and index not in only:
            continue
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
    if only is not None:
        return ceil_fraction(total), ()
    note = (
        f"{quantized:,} of {analysis.params:,} parameters quantized (matmul/conv weights); "
        "embeddings, norms, biases and the output head stay 16-bit"
    )
    return ceil_fraction(total), (note,)


def optimizer_state_bytes(
    shapes: Sequence[tuple[int, ...]], total_params: int, optimizer: Optimizer, plan: PrecisionPlan
) -> tuple[int, str]:
    """Bytes of the optimizer's state for every trainable parameter, unsharded.

    Parameters
    ----------
    shapes : sequence of tuple of int
        The trainable parameter tensors' shapes [elements per dimension].
    total_params : int
        Trainable parameter elements (the sum over ``shapes``) [elements].
    optimizer : Optimizer
        The optimizer.
    plan : PrecisionPlan
        ``plan.state_slot``: bytes per element of a state tensor [B].

    Returns
    -------
    tuple of (int, str)
        The state's bytes [B] and what they are made of.

    Notes
    -----
    ``slots x total_params x state_slot`` with slots SGD 0, SGD momentum / Adagrad / RMSprop /
    Lion 1, Adam / AdamW 2. 8-bit Adam: ``2 x total_params + 2 x blocks x 4`` (two 1-byte
    moments and an fp32 absmax per block of :data:`ADAM_8BIT_BLOCK` elements per tensor).
    Adafactor: fp32 ``rows + cols`` per matrix (rows: the product of all but the last
    dimension, cols: all but the second-to-last), the whole tensor for vectors.

    References
    ----------
    Loshchilov and Hutter, "Decoupled Weight Decay Regularization", 2019 (AdamW).
    Dettmers et al., "8-bit Optimizers via Block-wise Quantization", 2022.
    Shazeer and Stern, "Adafactor: Adaptive Learning Rates with Sublinear Memory Cost", 2018.
    """
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
    if optimizer in BNB_OPTIMIZERS:
        state = bnb_adamw_state(shapes, optimizer)
        return state.device_bytes, state.note
    if optimizer is Optimizer.ADAM_8BIT:
        blocks = sum(-(-math.prod(s) // ADAM_8BIT_BLOCK) for s in shapes)
        return 2 * params + 2 * blocks * 4, (
            "8-bit Adam: two 1-byte moments + one fp32 absmax per 2048-element block per moment"
        )
    slots = _STATE_SLOTS[optimizer]
    return slots * params * plan.state_slot, (
        f"{optimizer.value}: {slots} state tensor(s) per parameter x {plan.state_slot} B"
    )


class TemporariesLayout(Enum):
    """How the optimizer step's temporaries are laid out in memory (the allocator replay
    allocates them so)."""

    IN_PLACE = "in place"  # SGD or a fused step: no temporaries
    LARGEST_TWICE = "largest twice"  # for-loop step: two temporaries of the largest parameter
    PER_PARAMETER = "per parameter"  # foreach step: one temporary per parameter, all at once


class StepTemporaries(NamedTuple):
    """The optimizer step's temporaries: their bytes, their layout and the words for them."""

    bytes: int
    layout: TemporariesLayout
    note: str


def optimizer_step_temporaries(
    shapes: Sequence[tuple[int, ...]],
    total_params: int,
    request: MemoryRequest,
    plan: PrecisionPlan,
) -> StepTemporaries:
    """The temporaries ``optimizer.step()`` allocates beside the state, unsharded.

    Parameters
    ----------
    shapes : sequence of tuple of int
        The trainable parameter tensors' shapes [elements per dimension].
    total_params : int
        Trainable parameter elements [elements].
    request : MemoryRequest
        The optimizer, its implementation (``auto``: fused for mixed_*, foreach on CUDA,
        for-loop on CPU), the precision and the runtime.
    plan : PrecisionPlan
        ``plan.state_slot``: bytes per element of a state tensor [B] (at least 2 per
        temporary).

    Returns
    -------
    StepTemporaries
        Their bytes [B], their layout and the words for them.

    Notes
    -----
    SGD and fused steps update in place: 0. For-loop: ``2 x largest tensor x element``.
    Foreach: ``total_params x element`` (one parameter-sized temporary list at once).

    References
    ----------
    PyTorch 2.13, torch/optim/adamw.py (``_single_tensor_adamw``, ``_multi_tensor_adamw``).
    """
    impl = request.optimizer_impl
    if impl is OptimizerImpl.AUTO:
        if request.precision in (Precision.MIXED_BF16, Precision.MIXED_FP16):
            impl = OptimizerImpl.FUSED  # DeepSpeed / Megatron fused Adam
        elif request.runtime is Runtime.CUDA:
            impl = OptimizerImpl.FOREACH
        else:
            impl = OptimizerImpl.FOR_LOOP
    if request.optimizer in BNB_OPTIMIZERS:  # one in-place update kernel per parameter
        return StepTemporaries(
            0,
            TemporariesLayout.IN_PLACE,
            f"bitsandbytes {request.optimizer.value}: one in-place update kernel per parameter "
            "(optimizer_update_8bit_blockwise / optimizer_update_32bit)",
        )
    if request.optimizer in (Optimizer.SGD, Optimizer.SGD_MOMENTUM) or impl is OptimizerImpl.FUSED:
        return StepTemporaries(
            0,
            TemporariesLayout.IN_PLACE,
            f"{impl.value} {request.optimizer.value} step updates in place",
        )
    element = max(plan.state_slot, 2)
    if impl is OptimizerImpl.FOR_LOOP:
        largest = max((math.prod(s) for s in shapes), default=0)
        return StepTemporaries(
            2 * largest * element,
            TemporariesLayout.LARGEST_TWICE,
            f"for-loop step: two temporaries the size of the largest parameter ({largest:,})",
        )
    return StepTemporaries(
        total_params * element,
        TemporariesLayout.PER_PARAMETER,
        "foreach step: one temporary per parameter, all at once",
    )


def gradient_bytes(params: int, element_bytes: Fraction, shard: int) -> int:
    """Bytes of the gradients of ``params`` parameter elements on one device.

    Parameters
    ----------
    params : int
        Trainable parameter elements [elements].
    element_bytes : Fraction
        Bytes per gradient element [B] (the gradient dtype's; 4 with an fp32 main_grad).
    shard : int
        Devices the gradients are split over: tensor x pipeline, x data ranks from ZeRO-2 on.

    Returns
    -------
    int
        ``ceil(params x element_bytes / shard)`` [B].

    References
    ----------
    Rajbhandari et al., "ZeRO: Memory Optimizations Toward Training Trillion Parameter Models",
    2020 (stage 2 partitions the gradients).
    """
    return ceil_fraction(params * element_bytes / shard)


def kv_cache_bytes(elements: int, element_bytes: int, shard: int) -> int:
    """Bytes of a decoder's KV cache on one device.

    Parameters
    ----------
    elements : int
        Cached elements of every attention layer: ``2 x layers x kv_heads x head_dim x seq x
        batch`` [elements].
    element_bytes : int
        Bytes per cached element (the convention's KV cache dtype) [B].
    shard : int
        Devices the cache is split over: tensor (each caches its heads) x pipeline (each its
        stage's layers).

    Returns
    -------
    int
        ``ceil(elements x element_bytes / shard)`` [B].

    References
    ----------
    Pope et al., "Efficiently Scaling Transformer Inference", 2022 (the KV cache's size).
    """
    return -(-(elements * element_bytes) // shard)  # ceil_fraction's, without a Fraction


def fsdp_buffer_bytes(
    unit_params: int, weight_bytes: Fraction, grad_bytes: Fraction, shard: int
) -> tuple[int, int, int]:
    """The buffers FSDP (ZeRO-3) holds for its largest wrapped unit on one device.

    Parameters
    ----------
    unit_params : int
        Parameter elements of the largest wrapped unit (a repeated block, or the rest of the
        model) [elements].
    weight_bytes : Fraction
        Bytes per weight element [B].
    grad_bytes : Fraction
        Bytes per gradient element [B].
    shard : int
        Devices each unit's parameters stay split over when gathered: tensor x pipeline.

    Returns
    -------
    tuple of (int, int, int)
        The unit's gathered parameters twice (the unit running and the one prefetched) and its
        unsharded gradients [B]: ``ceil(unit_params x weight_bytes / shard)``, the same, and
        ``ceil(unit_params x grad_bytes / shard)``.

    References
    ----------
    Zhao et al., "PyTorch FSDP: Experiences on Scaling Fully Sharded Data Parallel", 2023
    (``limit_all_gathers``: at most two units' parameters in flight); PyTorch 2.13,
    torch/distributed/fsdp (gradients unsharded before their reduce-scatter).
    """
    weight = ceil_fraction(unit_params * weight_bytes / shard)
    grads = ceil_fraction(unit_params * grad_bytes / shard)
    return weight, weight, grads


DDP_BUCKET_BYTES = 25 * MIB  # DistributedDataParallel(bucket_cap_mb=25)
DDP_FIRST_BUCKET_BYTES = 1 * MIB  # torch.distributed._DEFAULT_FIRST_BUCKET_BYTES


def ddp_bucket_sizes_bytes(total_bytes: int) -> list[int]:
    """The flat buckets DistributedDataParallel copies ``total_bytes`` of gradients into.

    Parameters
    ----------
    total_bytes : int
        Bytes of every gradient on the device [B].

    Returns
    -------
    list of int
        Each bucket's bytes [B], in order: the first holds at most
        :data:`DDP_FIRST_BUCKET_BYTES`, the others at most :data:`DDP_BUCKET_BYTES`; they add
        up to ``total_bytes``.

    References
    ----------
    PyTorch 2.13, torch/nn/parallel/distributed.py (``bucket_cap_mb=25``,
    ``_DEFAULT_FIRST_BUCKET_BYTES``) and torch/csrc/distributed/c10d/reducer.cpp.
    """
    first = min(total_bytes, DDP_FIRST_BUCKET_BYTES)
    rest = total_bytes - first
    return [first] + [min(DDP_BUCKET_BYTES, rest - i) for i in range(0, rest, DDP_BUCKET_BYTES)]


def loss_expression(analysis: GraphAnalysis, sizer: Sizer) -> str:
    """The arithmetic of :func:`loss_bytes`."""
    numel = math.prod(analysis.output_shape) if analysis.output_shape else 1
    if len(analysis.output_shape) >= 3:
        return f"{numel:,} [logits elements] x 4 [B: fp32 log-probabilities, HF ForCausalLMLoss]"
    element = sizer.storage_bytes(1, Storage.ACT)
    return f"{numel:,} [logits elements] x {element} [B: log-probabilities kept for backward]"


def loss_bytes(analysis: GraphAnalysis, sizer: Sizer) -> int:
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
