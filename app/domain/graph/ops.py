"""Per-op semantics: output shape, parameters, FLOPs, and the tensors autograd keeps.

Shapes are batch-first (``[N, C, H, W]`` for images, ``[N, S, D]`` for sequences). FLOPs count
a multiply-add as two operations. Saved tensors follow PyTorch's autograd formulas
(``derivatives.yaml``) for the eager kernels: what a layer keeps alive from its forward until
its backward. A saved tensor names its storage (an input, the output, or a new internal
tensor), so that a storage kept by two layers is counted once.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Any, NamedTuple

from app.domain.errors import GraphError
from app.domain.precision import Precision
from app.domain.workload import (
    FUSED_ATTENTION,
    Attention,
    GpuTraits,
    Runtime,
    default_attention,
)


class TensorKind(StrEnum):
    """What a value flowing between layers holds."""

    FLOAT = "float"  # stored in the compute dtype
    INDEX = "int64"  # token ids, labels


class Storage(StrEnum):
    """Element type of a saved or transient tensor; resolved to bytes by the memory model."""

    ACT = "activation"  # the compute (activation) dtype
    FP32 = "fp32"  # always 4 bytes (norm statistics, upcast softmax)
    INT64 = "int64"  # indices
    MASK = "dropout_mask"  # runtime dependent: 1 B on CUDA, the activation dtype on CPU
    # Hugging Face eager attention's materialised [N, 1, S, S] causal mask: the activation dtype
    # on CUDA; not counted on CPU, whose attention rule is the one measured (benchmarks/fidelity)
    CAUSAL_MASK = "causal_mask"


@dataclass(frozen=True, slots=True, kw_only=True)
class Saved:
    """A tensor an op keeps for backward: ``source`` is ``in0``.., ``out`` or ``new``."""

    label: str
    source: str
    numel: int
    storage: Storage = Storage.ACT


@dataclass(frozen=True, slots=True, kw_only=True)
class Transient:
    """A tensor that exists only inside the op's forward (its internal peak)."""

    label: str
    numel: int
    storage: Storage = Storage.ACT


@dataclass(frozen=True, slots=True, kw_only=True)
class OpResult:
    """What one layer does to its inputs."""

    shape: tuple[int, ...]
    kind: TensorKind = TensorKind.FLOAT
    param_shapes: tuple[tuple[int, ...], ...] = ()
    flops: int = 0
    saved: tuple[Saved, ...] = ()
    alias_of: int | None = None  # output shares storage with this input (views, in-place ops)
    transients: tuple[Transient, ...] = ()
    buffers_bytes: int = 0  # non-trainable state (batchnorm running statistics)
    kv_cache_numel: int = 0  # keys + values cached per forward for decoding
    materialized: bool = True  # False: the output is a weight (or a view of one), no activation
    attention: Attention | None = None  # attention layers: the implementation that ran
    attention_reason: str = ""
    num_heads: int = 0  # attention layers: query heads (tensor parallelism splits them)
    num_kv_heads: int = 0  # attention layers: key/value heads (replicated past tensor = them)
    params: int = field(init=False)  # trainable parameters, derived from param_shapes

    def __post_init__(self) -> None:
        object.__setattr__(self, "params", sum(math.prod(s) for s in self.param_shapes))


class Value(NamedTuple):
    """A tensor flowing between layers."""

    shape: tuple[int, ...]
    kind: TensorKind = TensorKind.FLOAT

    @property
    def numel(self) -> int:
        """Number of elements."""
        return math.prod(self.shape)


@dataclass(frozen=True, slots=True, kw_only=True)
class OpContext:
    """What an op implementation may read: its attributes, inputs and name."""

    name: str
    attrs: Mapping[str, Any]
    inputs: Sequence[Value]
    training: bool = True
    tied_params: Mapping[str, int] = field(default_factory=dict)
    attention: Attention | None = None  # None: PyTorch SDPA's choice for runtime and precision
    runtime: Runtime = Runtime.CUDA
    precision: Precision = Precision.FP32
    gpu: GpuTraits | None = None  # the GPU SDPA's default is chosen for (None: none named)

    def fail(self, message: str, field_name: str) -> GraphError:
        """A GraphError for this layer."""
        return GraphError(message, layer=self.name, field=field_name)

    @property
    def x(self) -> Value:
        """The first input."""
        return self.inputs[0]

    def attr(self, key: str, default: Any) -> Any:
        """An attribute with its PyTorch default."""
        return self.attrs.get(key, default)


def _pair(value: Any) -> tuple[int, int]:
    if isinstance(value, list):
        return int(value[0]), int(value[1])
    return int(value), int(value)


def _rank(ctx: OpContext, rank: int, what: str) -> None:
    if len(ctx.x.shape) != rank:
        raise ctx.fail(
            f"expects a {rank}-d input ({what}), got shape {list(ctx.x.shape)}", "inputs"
        )


def _float_input(ctx: OpContext) -> None:
    if ctx.x.kind is not TensorKind.FLOAT:
        raise ctx.fail("expects a floating-point input, got token ids", "inputs")


def _conv_out(size: int, kernel: int, stride: int, pad: int, dilation: int, ctx: OpContext) -> int:
    out = (size + 2 * pad - dilation * (kernel - 1) - 1) // stride + 1
    if out < 1:
        raise ctx.fail(
            f"kernel {kernel} (dilation {dilation}) does not fit input size {size} "
            f"with padding {pad}",
            "kernel_size",
        )
    return out


def _spatial(value: Any, rank: int) -> tuple[int, ...]:
    """An int or a list of ``rank`` ints as a tuple of ``rank`` ints (kernel, stride, ...)."""
    if isinstance(value, list):
        return tuple(int(v) for v in value)
    return (int(value),) * rank


_CONV_LAYOUTS = {2: "N, C, H, W", 3: "N, C, D, H, W"}


def _check_channels(ctx: OpContext, in_channels: int, out_channels: int, groups: int) -> None:
    """The declared ``in_channels`` (if any) match the input, and ``groups`` divides both."""
    declared = ctx.attrs.get("in_channels")
    if declared is not None and declared != in_channels:
        raise ctx.fail(f"in_channels {declared} does not match input {in_channels}", "in_channels")
    if in_channels % groups or out_channels % groups:
        raise ctx.fail(
            f"groups {groups} must divide in_channels {in_channels} and out_channels "
            f"{out_channels}",
            "groups",
        )


def _conv(
    ctx: OpContext,
    out_channels: int,
    kernel: Any,
    groups: int,
    bias: bool,
    spatial_dims: int = 2,
) -> OpResult:
    _rank(ctx, spatial_dims + 2, _CONV_LAYOUTS[spatial_dims])
    _float_input(ctx)
    n, c, *sizes = ctx.x.shape
    _check_channels(ctx, c, out_channels, groups)
    kernels = _spatial(kernel, spatial_dims)
    strides = _spatial(ctx.attr("stride", 1), spatial_dims)
    dilations = _spatial(ctx.attr("dilation", 1), spatial_dims)
    padding = ctx.attr("padding", 0)
    if padding == "same":
        if any(s != 1 for s in strides):
            raise ctx.fail("padding 'same' needs stride 1", "padding")
        pads = tuple(d * (k - 1) // 2 for d, k in zip(dilations, kernels, strict=True))
    elif padding == "valid":
        pads = (0,) * spatial_dims
    else:
        pads = _spatial(padding, spatial_dims)
    out_sizes = tuple(
        _conv_out(size, k, s, p, d, ctx)
        for size, k, s, p, d in zip(sizes, kernels, strides, pads, dilations, strict=True)
    )
    weight = (out_channels, c // groups, *kernels)
    params = (weight, (out_channels,)) if bias else (weight,)
    macs = n * out_channels * math.prod(out_sizes) * (c // groups) * math.prod(kernels)
    return OpResult(
        shape=(n, out_channels, *out_sizes),
        param_shapes=params,
        flops=2 * macs,
        saved=(Saved(label="input", source="in0", numel=ctx.x.numel),),
    )


def conv2d(ctx: OpContext) -> OpResult:
    """2-d convolution (cross-correlation) with stride, padding, dilation and groups."""
    return _conv(
        ctx,
        ctx.attrs["out_channels"],
        ctx.attrs["kernel_size"],
        ctx.attr("groups", 1),
        ctx.attr("bias", True),
    )


def depthwise_conv2d(ctx: OpContext) -> OpResult:
    """Depthwise convolution: groups = in_channels."""
    _rank(ctx, 4, "N, C, H, W")
    channels = ctx.x.shape[1]
    out = channels * ctx.attr("channel_multiplier", 1)
    return _conv(ctx, out, ctx.attrs["kernel_size"], channels, ctx.attr("bias", True))


def pointwise_conv2d(ctx: OpContext) -> OpResult:
    """1x1 convolution."""
    return _conv(ctx, ctx.attrs["out_channels"], 1, 1, ctx.attr("bias", True))


def conv3d(ctx: OpContext) -> OpResult:
    """3-d convolution (``torch.nn.Conv3d``) over ``[N, C, D, H, W]``: stride, padding,
    dilation and groups per spatial dim; an implicit GEMM of ``C_in/groups * kd*kh*kw``."""
    return _conv(
        ctx,
        ctx.attrs["out_channels"],
        ctx.attrs["kernel_size"],
        ctx.attr("groups", 1),
        ctx.attr("bias", True),
        spatial_dims=3,
    )


def conv_transpose3d(ctx: OpContext) -> OpResult:
    """Transposed 3-d convolution (``torch.nn.ConvTranspose3d``), as U-Nets upsample.

    Output size per spatial dim: ``(in - 1) * stride - 2 * padding + dilation * (kernel - 1)
    + output_padding + 1``; weight ``[C_in, C_out/groups, kd, kh, kw]``; FLOPs: every input
    voxel multiplies its ``C_in/groups`` channels into ``C_out * kd*kh*kw`` outputs. Autograd
    keeps the input (``convolution_backward`` needs it for the weight gradient).
    """
    _rank(ctx, 5, _CONV_LAYOUTS[3])
    _float_input(ctx)
    n, c, *sizes = ctx.x.shape
    out_channels = ctx.attrs["out_channels"]
    groups = ctx.attr("groups", 1)
    _check_channels(ctx, c, out_channels, groups)
    kernels = _spatial(ctx.attrs["kernel_size"], 3)
    strides = _spatial(ctx.attr("stride", 1), 3)
    pads = _spatial(ctx.attr("padding", 0), 3)
    dilations = _spatial(ctx.attr("dilation", 1), 3)
    extra = _spatial(ctx.attr("output_padding", 0), 3)
    out_sizes = []
    for size, k, s, p, d, e in zip(sizes, kernels, strides, pads, dilations, extra, strict=True):
        if e >= max(s, d):
            raise ctx.fail(
                f"output_padding {e} must be smaller than stride {s} or dilation {d}",
                "output_padding",
            )
        out = (size - 1) * s - 2 * p + d * (k - 1) + e + 1
        if out < 1:
            raise ctx.fail(
                f"padding {p} leaves no output for input size {size} and kernel {k}", "padding"
            )
        out_sizes.append(out)
    weight = (c, out_channels // groups, *kernels)
    bias = ctx.attr("bias", True)
    macs = ctx.x.numel * (out_channels // groups) * math.prod(kernels)
    return OpResult(
        shape=(n, out_channels, *out_sizes),
        param_shapes=(weight, (out_channels,)) if bias else (weight,),
        flops=2 * macs,
        saved=(Saved(label="input", source="in0", numel=ctx.x.numel),),
    )


def _pool_out(ctx: OpContext) -> tuple[int, int, int, int]:
    _rank(ctx, 4, "N, C, H, W")
    n, c, h, w = ctx.x.shape
    kh, kw = _pair(ctx.attrs["kernel_size"])
    sh, sw = _pair(ctx.attr("stride", ctx.attrs["kernel_size"]))
    ph, pw = _pair(ctx.attr("padding", 0))
    if ph > kh // 2 or pw > kw // 2:
        raise ctx.fail("padding must be at most half the kernel size", "padding")
    dims = []
    for size, k, s, p in ((h, kh, sh, ph), (w, kw, sw, pw)):
        if ctx.attr("ceil_mode", False):
            out = -(-(size + 2 * p - k) // s) + 1
            if (out - 1) * s >= size + p:  # last window must start inside the input
                out -= 1
        else:
            out = (size + 2 * p - k) // s + 1
        if out < 1:
            raise ctx.fail(f"kernel {k} does not fit input size {size}", "kernel_size")
        dims.append(out)
    return n, c, dims[0], dims[1]


def maxpool2d(ctx: OpContext) -> OpResult:
    """Max pooling; backward needs the input and int64 argmax indices."""
    shape = _pool_out(ctx)
    kh, kw = _pair(ctx.attrs["kernel_size"])
    out = math.prod(shape)
    return OpResult(
        shape=shape,
        flops=out * kh * kw,
        saved=(
            Saved(label="input", source="in0", numel=ctx.x.numel),
            Saved(label="indices", source="new", numel=out, storage=Storage.INT64),
        ),
    )


def avgpool2d(ctx: OpContext) -> OpResult:
    """Average pooling; autograd keeps the input."""
    shape = _pool_out(ctx)
    kh, kw = _pair(ctx.attrs["kernel_size"])
    return OpResult(
        shape=shape,
        flops=math.prod(shape) * kh * kw,
        saved=(Saved(label="input", source="in0", numel=ctx.x.numel),),
    )


def _adaptive(ctx: OpContext, indices: bool) -> OpResult:
    _rank(ctx, 4, "N, C, H, W")
    n, c, _, _ = ctx.x.shape
    oh, ow = _pair(ctx.attrs["output_size"])
    shape = (n, c, oh, ow)
    saved = [Saved(label="input", source="in0", numel=ctx.x.numel)]
    if indices:
        saved.append(
            Saved(label="indices", source="new", numel=n * c * oh * ow, storage=Storage.INT64)
        )
    return OpResult(shape=shape, flops=ctx.x.numel, saved=tuple(saved))


def adaptive_avgpool2d(ctx: OpContext) -> OpResult:
    """Adaptive average pooling to a fixed output size."""
    return _adaptive(ctx, indices=False)


def adaptive_maxpool2d(ctx: OpContext) -> OpResult:
    """Adaptive max pooling to a fixed output size."""
    return _adaptive(ctx, indices=True)


def batchnorm2d(ctx: OpContext) -> OpResult:
    """Batch norm over channels; keeps input and fp32 per-channel mean and inverse std."""
    _rank(ctx, 4, "N, C, H, W")
    _float_input(ctx)
    channels = ctx.x.shape[1]
    affine = ctx.attr("affine", True)
    saved = [Saved(label="input", source="in0", numel=ctx.x.numel)]
    if ctx.training:
        saved += [
            Saved(label="save_mean", source="new", numel=channels, storage=Storage.FP32),
            Saved(label="save_invstd", source="new", numel=channels, storage=Storage.FP32),
        ]
    return OpResult(
        shape=ctx.x.shape,
        param_shapes=((channels,), (channels,)) if affine else (),
        flops=4 * ctx.x.numel,
        saved=tuple(saved),
        buffers_bytes=2 * channels * 4 + 8,  # running mean/var fp32 + num_batches_tracked
    )


def instancenorm3d(ctx: OpContext) -> OpResult:
    """Instance norm over ``D, H, W`` per sample and channel (``torch.nn.InstanceNorm3d``,
    ``track_running_stats=False``: statistics from the input in training and inference alike).

    PyTorch runs it as a batch norm over the ``[1, N*C, D, H, W]`` view
    (aten/src/ATen/native/Normalization.cpp ``instance_norm``), so autograd keeps the input
    and fp32 mean and inverse std per ``(sample, channel)``. ``affine`` defaults to False, as
    in PyTorch.
    """
    _rank(ctx, 5, _CONV_LAYOUTS[3])
    _float_input(ctx)
    n, channels = ctx.x.shape[:2]
    saved = [Saved(label="input", source="in0", numel=ctx.x.numel)]
    if ctx.training:
        saved += [
            Saved(label="save_mean", source="new", numel=n * channels, storage=Storage.FP32),
            Saved(label="save_invstd", source="new", numel=n * channels, storage=Storage.FP32),
        ]
    return OpResult(
        shape=ctx.x.shape,
        param_shapes=((channels,), (channels,)) if ctx.attr("affine", False) else (),
        flops=5 * ctx.x.numel,
        saved=tuple(saved),
    )


def _rows(ctx: OpContext) -> int:
    return ctx.x.numel // ctx.x.shape[-1]


def layernorm(ctx: OpContext) -> OpResult:
    """Layer norm over the last dim; keeps input and fp32 per-row mean and rstd."""
    _float_input(ctx)
    dim = ctx.x.shape[-1]
    affine = ctx.attr("elementwise_affine", True)
    params: tuple[tuple[int, ...], ...] = ()
    if affine:
        params = ((dim,), (dim,)) if ctx.attr("bias", True) else ((dim,),)
    rows = _rows(ctx)
    return OpResult(
        shape=ctx.x.shape,
        param_shapes=params,
        flops=5 * ctx.x.numel,
        saved=(
            Saved(label="input", source="in0", numel=ctx.x.numel),
            Saved(label="mean", source="new", numel=rows, storage=Storage.FP32),
            Saved(label="rstd", source="new", numel=rows, storage=Storage.FP32),
        ),
    )


def rmsnorm(ctx: OpContext) -> OpResult:
    """RMS norm as Hugging Face Llama computes it (in fp32, then cast back).

    Keeps the fp32 input (a copy when activations are 16-bit), the normalized tensor in the
    activation dtype (multiplied by the weight), and the fp32 per-row rsqrt.
    """
    _float_input(ctx)
    rows = _rows(ctx)
    return OpResult(
        shape=ctx.x.shape,
        param_shapes=((ctx.x.shape[-1],),),
        flops=4 * ctx.x.numel,
        saved=(
            Saved(label="input_fp32", source="in0_fp32", numel=ctx.x.numel, storage=Storage.FP32),
            Saved(label="normalized", source="new", numel=ctx.x.numel),
            Saved(label="rstd", source="new", numel=rows, storage=Storage.FP32),
        ),
    )


def _activation(saves: str) -> Callable[[OpContext], OpResult]:
    def run(ctx: OpContext) -> OpResult:
        _float_input(ctx)
        inplace = bool(ctx.attr("inplace", False))
        # In-place ops write into their input's storage; what they keep is that storage.
        source = "in0" if (saves == "in0" or inplace) else "out"
        return OpResult(
            shape=ctx.x.shape,
            flops=ctx.x.numel,
            saved=(Saved(label=saves, source=source, numel=ctx.x.numel),),
            alias_of=0 if inplace else None,
        )

    return run


relu = _activation("out")  # threshold_backward(grad, result)


def relu6(ctx: OpContext) -> OpResult:
    """ReLU6 (hardtanh 0..6): its backward needs the input, so in place autograd keeps a clone.

    ``hardtanh_backward(grad, self)`` needs the values before clamping; for the in-place form
    autograd saves a copy of the input before overwriting it (measured on PyTorch 2.13 CPU:
    one input-sized clone per in-place ReLU6 in MobileNetV2).
    """
    _float_input(ctx)
    if ctx.attr("inplace", False):
        return OpResult(
            shape=ctx.x.shape,
            flops=ctx.x.numel,
            saved=(Saved(label="input_clone", source="new", numel=ctx.x.numel),),
            alias_of=0,
        )
    return OpResult(
        shape=ctx.x.shape,
        flops=ctx.x.numel,
        saved=(Saved(label="input", source="in0", numel=ctx.x.numel),),
    )


gelu = _activation("in0")
silu = _activation("in0")
tanh = _activation("out")
sigmoid = _activation("out")


def dropout(ctx: OpContext) -> OpResult:
    """Dropout: identity in inference; in training keeps a mask (and writes a new output)."""
    p = ctx.attr("p", 0.5)
    if not ctx.training or p == 0:
        return OpResult(shape=ctx.x.shape, alias_of=0)
    return OpResult(
        shape=ctx.x.shape,
        flops=2 * ctx.x.numel,
        saved=(Saved(label="mask", source="new", numel=ctx.x.numel, storage=Storage.MASK),),
        alias_of=0 if ctx.attr("inplace", False) else None,
    )


def linear(ctx: OpContext) -> OpResult:
    """Fully connected layer over the last dim; keeps its input."""
    _float_input(ctx)
    if not ctx.x.shape:
        raise ctx.fail("expects at least a 1-d input", "inputs")
    features = ctx.x.shape[-1]
    declared = ctx.attrs.get("in_features")
    if declared is not None and declared != features:
        raise ctx.fail(f"in_features {declared} does not match input {features}", "in_features")
    out = ctx.attrs["out_features"]
    rows = _rows(ctx)
    weight = out * features
    tied = ctx.attrs.get("tied_to")
    if tied is not None:
        shared = ctx.tied_params.get(tied)
        if shared is None:
            raise ctx.fail(f"'{tied}' is not an earlier layer with a weight", "tied_to")
        if shared != weight:
            raise ctx.fail(
                f"cannot tie to '{tied}': its weight has {shared} elements, this layer needs "
                f"{weight} ({out} x {features})",
                "tied_to",
            )
    params: list[tuple[int, ...]] = [] if tied is not None else [(out, features)]
    if ctx.attr("bias", True):
        params.append((out,))
    return OpResult(
        shape=(*ctx.x.shape[:-1], out),
        param_shapes=tuple(params),
        flops=2 * rows * features * out,
        saved=(Saved(label="input", source="in0", numel=ctx.x.numel),),
    )


def _dim(ctx: OpContext, dim: int, rank: int, field_name: str) -> int:
    if not -rank <= dim < rank:
        raise ctx.fail(f"dim {dim} out of range for a {rank}-d input", field_name)
    return dim % rank


def flatten(ctx: OpContext) -> OpResult:
    """Merge dims ``start_dim..end_dim`` (a view)."""
    rank = len(ctx.x.shape)
    start = _dim(ctx, ctx.attr("start_dim", 1), rank, "start_dim")
    end = _dim(ctx, ctx.attr("end_dim", -1), rank, "end_dim")
    if start > end:
        raise ctx.fail("start_dim must not come after end_dim", "start_dim")
    shape = (*ctx.x.shape[:start], math.prod(ctx.x.shape[start : end + 1]), *ctx.x.shape[end + 1 :])
    return OpResult(shape=shape, kind=ctx.x.kind, alias_of=0)


def reshape(ctx: OpContext) -> OpResult:
    """Reshape to ``shape`` (one -1 inferred; symbols resolved by the graph); a view."""
    target = list(ctx.attrs["shape"])
    if any(not isinstance(d, int) for d in target):
        raise ctx.fail("symbols in shape must be bound before shape inference", "shape")
    if target.count(-1) > 1:
        raise ctx.fail("at most one dimension may be -1", "shape")
    known = math.prod(d for d in target if d != -1)
    numel = ctx.x.numel
    if -1 in target:
        if numel % known:
            raise ctx.fail(f"cannot reshape {list(ctx.x.shape)} into {target}", "shape")
        target[target.index(-1)] = numel // known
    if math.prod(target) != numel:
        raise ctx.fail(f"cannot reshape {list(ctx.x.shape)} into {target}", "shape")
    return OpResult(shape=tuple(target), kind=ctx.x.kind, alias_of=0)


def transpose(ctx: OpContext) -> OpResult:
    """Swap two dims (a view)."""
    rank = len(ctx.x.shape)
    a = _dim(ctx, ctx.attrs["dim0"], rank, "dim0")
    b = _dim(ctx, ctx.attrs["dim1"], rank, "dim1")
    shape = list(ctx.x.shape)
    shape[a], shape[b] = shape[b], shape[a]
    return OpResult(shape=tuple(shape), kind=ctx.x.kind, alias_of=0)


def select(ctx: OpContext) -> OpResult:
    """Pick one index along a dim, removing it (a view)."""
    rank = len(ctx.x.shape)
    dim = _dim(ctx, ctx.attrs["dim"], rank, "dim")
    index = ctx.attrs["index"]
    if not -ctx.x.shape[dim] <= index < ctx.x.shape[dim]:
        raise ctx.fail(f"index {index} out of range for size {ctx.x.shape[dim]}", "index")
    return OpResult(shape=ctx.x.shape[:dim] + ctx.x.shape[dim + 1 :], kind=ctx.x.kind, alias_of=0)


def add(ctx: OpContext) -> OpResult:
    """Element-wise sum of same-shaped inputs (residual connections); keeps nothing."""
    shapes = {value.shape for value in ctx.inputs}
    if len(shapes) != 1:
        raise ctx.fail(
            "inputs must have the same shape, got " + ", ".join(str(list(s)) for s in shapes),
            "inputs",
        )
    # In place (`out += identity` in torchvision's ResNet) writes into the first input.
    return OpResult(
        shape=ctx.x.shape,
        flops=ctx.x.numel * (len(ctx.inputs) - 1),
        alias_of=0 if ctx.attr("inplace", False) else None,
    )


def concat(ctx: OpContext) -> OpResult:
    """Concatenate along ``dim`` (default 1, channels); keeps nothing."""
    rank = len(ctx.x.shape)
    dim = _dim(ctx, ctx.attr("dim", 1), rank, "dim")
    for value in ctx.inputs:
        if len(value.shape) != rank or any(
            a != b
            for i, (a, b) in enumerate(zip(value.shape, ctx.x.shape, strict=True))
            if i != dim
        ):
            raise ctx.fail(
                f"inputs must match except in dim {dim}: "
                + ", ".join(str(list(v.shape)) for v in ctx.inputs),
                "inputs",
            )
    size = sum(value.shape[dim] for value in ctx.inputs)
    return OpResult(shape=(*ctx.x.shape[:dim], size, *ctx.x.shape[dim + 1 :]))


def embedding(ctx: OpContext) -> OpResult:
    """Lookup table; keeps the int64 indices (its input)."""
    if ctx.x.kind is not TensorKind.INDEX:
        raise ctx.fail("expects int64 token ids as input", "inputs")
    vocab, dim = ctx.attrs["num_embeddings"], ctx.attrs["embedding_dim"]
    return OpResult(
        shape=(*ctx.x.shape, dim),
        param_shapes=((vocab, dim),),
        saved=(Saved(label="indices", source="in0", numel=ctx.x.numel, storage=Storage.INT64),),
    )


def embedding_add(ctx: OpContext) -> OpResult:
    """Add a learned embedding indexed by position (positions, token types); keeps nothing big."""
    _float_input(ctx)
    if len(ctx.x.shape) != 3:
        raise ctx.fail("expects [N, S, D]", "inputs")
    _, seq, dim = ctx.x.shape
    rows = ctx.attrs["num_embeddings"]
    if ctx.attr("positional", True) and rows < seq:
        raise ctx.fail(f"{rows} positions cannot cover sequence length {seq}", "num_embeddings")
    return OpResult(shape=ctx.x.shape, param_shapes=((rows, dim),), flops=ctx.x.numel)


def cls_token(ctx: OpContext) -> OpResult:
    """Prepend one learned token to a sequence (ViT's class token)."""
    _float_input(ctx)
    if len(ctx.x.shape) != 3:
        raise ctx.fail("expects [N, S, D]", "inputs")
    n, seq, dim = ctx.x.shape
    return OpResult(shape=(n, seq + 1, dim), param_shapes=((1, 1, dim),))


# Eager attention on CUDA (issue 32): the softmax runs in fp32 and the probabilities are cast
# back to the compute dtype before the P x V matmul, which keeps that copy for its backward
# (2 B/score beside softmax's fp32 output, 4 B). Sources: Hugging Face's eager_attention_forward
# (transformers/models/llama/modeling_llama.py: ``nn.functional.softmax(attn_weights, dim=-1,
# dtype=torch.float32).to(query.dtype)``, the rule of Llama, Mistral, Qwen2, Gemma and the models
# copied from them); GPT-NeoX's eager ``_attn`` (transformers mid-2024, modeling_gpt_neox.py)
# whose fp32 rotary cos/sin cache promotes q and k to fp32, so its scores and softmax run in fp32
# and ``attn_weights.to(value.dtype)`` is the copy; autocast (torch/amp, CUDA ops that autocast
# to float32: softmax), whose next matmul casts the fp32 probabilities to the autocast dtype.
# With attention dropout the dropped probabilities (compute dtype) are what the matmul keeps
# and the cast copy is freed (dropout's backward needs only its 1 B bool mask). At fp32 compute
# the cast is a no-op. HF's eager path also materialises the causal mask, [N, 1, S, S] in the
# compute dtype (modeling_attn_mask_utils._prepare_4d_causal_attention_mask), where SDPA's
# is_causal needs none: a transient of the forward. The CPU rule is the one measured on PyTorch
# 2.13 CPU (benchmarks/fidelity) and is left as it is.
_FP32_COMPUTE = frozenset({Precision.FP32, Precision.TF32})


def attention(ctx: OpContext) -> OpResult:
    """Multi-head self-attention with q/k/v/o projections (MHA, GQA, MQA).

    How attention is computed is the request's ``attention`` option (``ctx.attention``; None:
    what PyTorch's SDPA dispatcher picks, :func:`app.domain.workload.default_attention`).
    eager / sdpa_math: keep the block input, q, k and v (k and v expanded to every query head
    for GQA), the fp32 softmax probabilities, a dropout mask and dropped probabilities when
    attention dropout is on (on CUDA at a 16-bit compute dtype without dropout: the
    probabilities' cast copy the P x V matmul keeps, see :data:`_FP32_COMPUTE`), and the context
    fed to the output projection; the S x S scores and probabilities (and on CUDA a causal
    model's materialised [N, 1, S, S] mask) are transients in forward. flash / mem_efficient:
    keep q, k, v, the output and the fp32 log-sum-exp, never an S x S matrix. On CPU, PyTorch's
    fused kernel has no dropout: flash or mem_efficient asked for in training with attention
    dropout runs SDPA's math kernel (sdpa_math, measured on PyTorch 2.13 CPU; the reason says
    so). Only causal (decoder) attention fills a KV cache at inference; an encoder attends over
    its whole input once and caches nothing.
    """
    _float_input(ctx)
    if len(ctx.x.shape) != 3:
        raise ctx.fail("expects [N, S, D]", "inputs")
    n, seq, hidden = ctx.x.shape
    declared = ctx.attrs.get("hidden_size")
    if declared is not None and declared != hidden:
        raise ctx.fail(f"hidden_size {declared} does not match input {hidden}", "hidden_size")
    heads = ctx.attrs["num_heads"]
    kv_heads = ctx.attr("num_kv_heads", heads)
    if heads % kv_heads:
        raise ctx.fail(f"num_kv_heads {kv_heads} must divide num_heads {heads}", "num_kv_heads")
    head_dim = ctx.attrs.get("head_dim")
    if head_dim is None:
        if hidden % heads:
            raise ctx.fail(f"num_heads {heads} must divide hidden size {hidden}", "num_heads")
        head_dim = hidden // heads
    q_dim, kv_dim = heads * head_dim, kv_heads * head_dim
    qkv_bias, out_bias = ctx.attr("qkv_bias", True), ctx.attr("out_bias", True)
    params: list[tuple[int, ...]] = [
        (q_dim, hidden),
        (kv_dim, hidden),
        (kv_dim, hidden),
        (hidden, q_dim),
    ]
    if qkv_bias:
        params += [(q_dim,), (kv_dim,), (kv_dim,)]
    if out_bias:
        params.append((hidden,))
    tokens = n * seq
    causal = ctx.attr("causal", False)
    score_pairs = n * heads * seq * seq
    attended = score_pairs // 2 + n * heads * seq // 2 if causal else score_pairs
    flops = 2 * tokens * hidden * (q_dim + 2 * kv_dim) + 2 * tokens * q_dim * hidden
    flops += 2 * 2 * attended * head_dim + 5 * attended
    q_numel = tokens * q_dim
    expanded_kv = tokens * q_dim  # k/v repeated to every query head before the matmuls
    dropout_p = ctx.attr("dropout", 0.0) if ctx.training else 0.0
    saved = [
        Saved(label="input", source="in0", numel=ctx.x.numel),
        Saved(label="q", source="new", numel=q_numel),
        Saved(label="k", source="new", numel=expanded_kv),
        Saved(label="v", source="new", numel=expanded_kv),
        Saved(label="context", source="new", numel=q_numel),
    ]
    transients = [Transient(label="qkv", numel=q_numel + 2 * expanded_kv)]
    if ctx.attention is None:
        impl, reason = default_attention(
            ctx.runtime,
            ctx.precision,
            training=ctx.training,
            dropout=dropout_p > 0,
            gpu=ctx.gpu,
            head_dim=head_dim,
        )
    else:
        impl, reason = ctx.attention, "requested"
    # PyTorch's fused CPU kernel has no dropout: with dropout in training SDPA runs the math
    # path, which keeps the same tensors as the unfused implementation (measured, 2.13 CPU).
    if impl in FUSED_ATTENTION and ctx.runtime is Runtime.CPU and dropout_p > 0:
        impl, reason = (
            Attention.SDPA_MATH,
            f"{impl.value} asked for, but PyTorch's fused CPU kernel has no dropout: SDPA runs "
            "the math kernel in training with attention dropout",
        )
    if impl in FUSED_ATTENTION:
        # The fp32 log-sum-exp is [N, heads, S] for flash; the CUDA memory-efficient kernel pads
        # S to a multiple of 32 (kAlignLSE in aten/src/ATen/native/transformers/cuda/
        # attention.cu, _efficient_attention_forward).
        lse_seq = seq
        if impl is Attention.MEM_EFFICIENT and ctx.runtime is Runtime.CUDA:
            lse_seq = -(-seq // 32) * 32
        saved += [
            Saved(label="attn_out", source="new", numel=q_numel),
            Saved(label="logsumexp", source="new", numel=n * heads * lse_seq, storage=Storage.FP32),
        ]
    else:
        saved.append(Saved(label="probs", source="new", numel=score_pairs, storage=Storage.FP32))
        # Scores and softmax probabilities coexist while the softmax runs.
        transients += [
            Transient(label="scores", numel=score_pairs, storage=Storage.FP32),
            Transient(label="probs", numel=score_pairs, storage=Storage.FP32),
        ]
        if dropout_p > 0:
            saved += [
                Saved(label="probs_mask", source="new", numel=score_pairs, storage=Storage.MASK),
                Saved(label="probs_dropped", source="new", numel=score_pairs),
            ]
        elif ctx.runtime is Runtime.CUDA and ctx.precision not in _FP32_COMPUTE:
            saved.append(Saved(label="probs_cast", source="new", numel=score_pairs))
        if causal:
            transients.append(
                Transient(label="causal_mask", numel=n * seq * seq, storage=Storage.CAUSAL_MASK)
            )
    return OpResult(
        shape=ctx.x.shape,
        param_shapes=tuple(params),
        flops=flops,
        saved=tuple(saved),
        transients=tuple(transients),
        kv_cache_numel=2 * tokens * kv_dim if causal else 0,
        attention=impl,
        attention_reason=reason,
        num_heads=heads,
        num_kv_heads=kv_heads,
    )


_GATED = {"swiglu": "silu", "geglu": "gelu"}
# Hugging Face NewGELUActivation (GPT-2's gelu_new) is a composite of pow/mul/add/tanh: autograd
# keeps three intermediate-sized tensors besides its input (measured, PyTorch 2.13 CPU).
_COMPOSITE_EXTRA = {"gelu_new": 3}


def _ffn_params(hidden: int, inner: int, *, gated: bool, bias: bool) -> list[tuple[int, ...]]:
    """Weights (and biases) of one feed-forward network: up (and gate) and down projections."""
    projections = 3 if gated else 2
    params: list[tuple[int, ...]] = [(inner, hidden)] * (projections - 1)
    params.append((hidden, inner))
    if bias:
        params += [(inner,)] * (projections - 1) + [(hidden,)]
    return params


def _ffn_saved(activation: str, wide: int) -> list[Saved]:
    """What a feed-forward network keeps besides its input, for ``wide`` intermediate values."""
    if activation in _GATED:
        return [
            Saved(label="gate", source="new", numel=wide),
            Saved(label="activated_gate", source="new", numel=wide),
            Saved(label="up", source="new", numel=wide),
            Saved(label="product", source="new", numel=wide),
        ]
    return [
        Saved(label="pre_activation", source="new", numel=wide),
        Saved(label="activated", source="new", numel=wide),
    ] + [
        Saved(label=f"activation_part{i}", source="new", numel=wide)
        for i in range(_COMPOSITE_EXTRA.get(activation, 0))
    ]


def mlp(ctx: OpContext) -> OpResult:
    """Transformer feed-forward: up projection, activation (or gated), down projection.

    Plain (GELU/ReLU/SiLU): keeps the input, the pre-activation and the activation output.
    Gated (SwiGLU/GeGLU, no bias in Llama): keeps the input, gate, activated gate, up, and the
    product fed to the down projection.
    """
    _float_input(ctx)
    hidden = ctx.x.shape[-1]
    inner = ctx.attrs["intermediate_size"]
    activation = ctx.attr("activation", "gelu")
    rows = _rows(ctx)
    wide = rows * inner
    gated = activation in _GATED
    projections = 3 if gated else 2
    params = _ffn_params(hidden, inner, gated=gated, bias=ctx.attr("bias", True))
    saved = [Saved(label="input", source="in0", numel=ctx.x.numel), *_ffn_saved(activation, wide)]
    return OpResult(
        shape=ctx.x.shape,
        param_shapes=tuple(params),
        flops=2 * rows * hidden * inner * projections + 4 * wide,
        saved=tuple(saved),
        transients=(Transient(label="intermediate", numel=(3 if gated else 2) * wide),),
    )


_RNN_WORKSPACE_PER_GATE = 15.585 / 4  # workspace floats per output element per gate


# PyTorch's CPU GRU and vanilla RNN run its native cell step by step (only LSTM goes to oneDNN):
# tensors of the output's size ([N, S, H] per layer) that each keeps besides its input and
# output. Training: the per-step tensors autograd saves (RNN: each step's state; GRU: the gates
# (3), clones of the two in-place products' operands (2), the candidate and the state).
# Inference: the steps' states; GRU keeps one more output-sized set of step tensors under
# torch.no_grad() and none under torch.inference_mode(), which a request cannot tell apart: half
# of one is assumed (each measured case within 6 %). Both also hold the input gates for every
# step ([N, S, gates x H]) while they run, and training keeps a seq-first copy of the input for
# the input projection's backward (measured on PyTorch 2.13 CPU: benchmarks/fidelity, the GRU
# and RNN classifiers at batch 32 x 128 tokens, checked at batch 64 x 256: within 0.1 %).
_NATIVE_CELL_SAVED = {1: 1, 3: 7}
_NATIVE_CELL_INFERENCE = {1: 1.0, 3: 1.5}


def _native_cell(ctx: OpContext, gates: int, result: OpResult) -> OpResult:
    """``result`` (the oneDNN form) with the tensors of PyTorch's native CPU cell instead."""
    out_numel = math.prod(result.shape)
    layers = ctx.attr("num_layers", 1)
    input_gates = Transient(label="input_gates", numel=gates * out_numel * layers)
    if not ctx.training:
        held = math.ceil(_NATIVE_CELL_INFERENCE[gates] * out_numel * layers)
        steps = Transient(label="step_states", numel=held)
        return replace(result, saved=(), transients=(input_gates, steps))
    # Backward reads the seq-first input copy and the step tensors, not the input or the
    # stacked output (stack's backward needs nothing).
    saved = (
        Saved(label="input_seq_first", source="new", numel=ctx.x.numel),
        Saved(label="step_tensors", source="new",
              numel=_NATIVE_CELL_SAVED[gates] * out_numel * layers),
    )  # fmt: skip
    return replace(result, saved=saved, transients=(input_gates,))


def _recurrent(gates: int) -> Callable[[OpContext], OpResult]:
    def run(ctx: OpContext) -> OpResult:
        _float_input(ctx)
        if len(ctx.x.shape) != 3:
            raise ctx.fail("expects batch-first [N, S, D]", "inputs")
        n, seq, features = ctx.x.shape
        size = ctx.attrs["hidden_size"]
        layers = ctx.attr("num_layers", 1)
        directions = 2 if ctx.attr("bidirectional", False) else 1
        bias = ctx.attr("bias", True)
        params: list[tuple[int, ...]] = []
        flops = 0
        for layer in range(layers):
            width = features if layer == 0 else size * directions
            for _ in range(directions):
                params += [(gates * size, width), (gates * size, size)]
                if bias:
                    params += [(gates * size,), (gates * size,)]
                flops += 2 * n * seq * gates * size * (width + size) + 8 * n * seq * size
        out_numel = n * seq * size * directions
        # oneDNN's RNN layer keeps its input, output and a byte workspace of ~15.6 floats per
        # output element per layer (gates and states of every step; measured for LSTM on
        # PyTorch 2.13 CPU), and briefly ~4.5 outputs more; on CUDA, cuDNN's reserve space for
        # every cell is assumed alike, scaled by gates (not measured). GRU and RNN on CPU run
        # PyTorch's native cell instead (_native_cell).
        workspace = math.ceil(out_numel * layers * _RNN_WORKSPACE_PER_GATE * gates)
        result = OpResult(
            shape=(n, seq, size * directions),
            param_shapes=tuple(params),
            flops=flops,
            saved=(
                Saved(label="input", source="in0", numel=ctx.x.numel),
                Saved(label="output", source="out", numel=out_numel),
                Saved(label="workspace", source="new", numel=workspace, storage=Storage.FP32),
            ),
            transients=(
                Transient(label="layer_buffers", numel=math.ceil(4.5 * out_numel * layers)),
            ),
        )
        if gates in _NATIVE_CELL_SAVED and ctx.runtime is Runtime.CPU:
            return _native_cell(ctx, gates, result)
        return result

    return run


lstm = _recurrent(4)
gru = _recurrent(3)
rnn = _recurrent(1)  # Elman RNN, tanh or relu


def softmax(ctx: OpContext) -> OpResult:
    """Softmax along ``dim``; keeps its output."""
    _float_input(ctx)
    _dim(ctx, ctx.attr("dim", -1), len(ctx.x.shape), "dim")
    return OpResult(
        shape=ctx.x.shape,
        flops=5 * ctx.x.numel,
        saved=(Saved(label="output", source="out", numel=ctx.x.numel),),
    )


def cross_entropy(ctx: OpContext) -> OpResult:
    """Mean cross-entropy over the last dim: log_softmax (kept) then NLL against int64 labels."""
    _float_input(ctx)
    rows = _rows(ctx)
    return OpResult(
        shape=(),
        flops=6 * ctx.x.numel,
        saved=(
            Saved(label="log_probs", source="new", numel=ctx.x.numel),
            Saved(label="labels", source="new", numel=rows, storage=Storage.INT64),
        ),
    )


def moe(ctx: OpContext) -> OpResult:
    """Sparse mixture-of-experts feed-forward (Mixtral): a router and ``num_experts`` MLPs.

    Every token goes to its ``experts_per_token`` best experts (a bias-free router linear,
    softmax, top-k) and their outputs are summed with the routing weights. Parameters: the
    router (experts x hidden) plus every expert's projections; FLOPs and saved tensors count
    only the experts a token visits (k per token): the router logits (fp32), the routing
    weights, each routed copy of the input, and each expert's intermediates as in ``mlp``.
    """
    _float_input(ctx)
    hidden = ctx.x.shape[-1]
    experts = ctx.attrs["num_experts"]
    top_k = ctx.attrs["experts_per_token"]
    if top_k > experts:
        raise ctx.fail(
            f"experts_per_token {top_k} exceeds num_experts {experts}", "experts_per_token"
        )
    inner = ctx.attrs["intermediate_size"]
    activation = ctx.attr("activation", "swiglu")
    gated = activation in _GATED
    projections = 3 if gated else 2
    rows = _rows(ctx)
    routed = rows * top_k  # (token, expert) pairs
    wide = routed * inner
    params: list[tuple[int, ...]] = [(experts, hidden)]
    for _ in range(experts):
        params += _ffn_params(hidden, inner, gated=gated, bias=ctx.attr("bias", False))
    saved = [
        Saved(label="input", source="in0", numel=ctx.x.numel),
        Saved(label="router_logits", source="new", numel=rows * experts, storage=Storage.FP32),
        Saved(label="routing_weights", source="new", numel=routed, storage=Storage.FP32),
        Saved(label="routed_input", source="new", numel=routed * hidden),
        *_ffn_saved(activation, wide),
    ]
    return OpResult(
        shape=ctx.x.shape,
        param_shapes=tuple(params),
        flops=2 * rows * hidden * experts
        + 5 * rows * experts
        + 2 * routed * hidden * inner * projections
        + 4 * wide
        + 2 * routed * hidden,
        saved=tuple(saved),
        transients=(
            Transient(label="intermediate", numel=(3 if gated else 2) * wide),
            Transient(label="expert_outputs", numel=routed * hidden),
        ),
    )


def _broadcast(
    ctx: OpContext, shapes: Sequence[tuple[int, ...]], field_name: str
) -> tuple[int, ...]:
    """The numpy broadcast of ``shapes`` (right-aligned; sizes equal or 1)."""
    rank = max(len(s) for s in shapes)
    out: list[int] = []
    for axis in range(rank):
        sizes = {s[axis - rank + len(s)] for s in shapes if axis - rank + len(s) >= 0} - {1}
        if len(sizes) > 1:
            raise ctx.fail(
                "shapes do not broadcast: " + ", ".join(str(list(s)) for s in shapes), field_name
            )
        out.append(sizes.pop() if sizes else 1)
    return tuple(out)


def matmul(ctx: OpContext) -> OpResult:
    """Matrix product of two activations (``torch.matmul``: batch dims broadcast).

    Attention written out as ops (q @ k^T, probabilities @ v) is a pair of these. Autograd
    keeps both inputs.
    """
    for value in ctx.inputs:
        if value.kind is not TensorKind.FLOAT or not value.shape:
            raise ctx.fail("expects two floating-point inputs of rank >= 1", "inputs")
    a, b = ctx.inputs[0].shape, ctx.inputs[1].shape
    left = a if len(a) > 1 else (1, *a)
    right = b if len(b) > 1 else (*b, 1)
    if left[-1] != right[-2]:
        raise ctx.fail(f"cannot multiply {list(a)} by {list(b)}: inner sizes differ", "inputs")
    batch = _broadcast(ctx, [left[:-2], right[:-2]], "inputs")
    m, k, n = left[-2], left[-1], right[-1]
    shape = (*batch, *((m,) if len(a) > 1 else ()), *((n,) if len(b) > 1 else ()))
    return OpResult(
        shape=shape,
        flops=2 * math.prod(batch) * m * k * n,
        saved=(
            Saved(label="a", source="in0", numel=ctx.inputs[0].numel),
            Saved(label="b", source="in1", numel=ctx.inputs[1].numel),
        ),
    )


# What autograd keeps for each element-wise function: nothing, its inputs, or its output.
_KEEPS_NOTHING = frozenset({"add", "sub", "neg", "identity", "where", "round", "floor", "ceil",
                            "sign"})  # fmt: skip
_KEEPS_OUTPUT = frozenset({"exp", "sqrt", "rsqrt", "reciprocal"})


def elementwise(ctx: OpContext) -> OpResult:
    """An element-wise function of one or more inputs, broadcast like numpy.

    Keeps what ``derivatives.yaml`` keeps: nothing for add/sub/neg, the output for
    exp/sqrt/rsqrt/reciprocal, the inputs otherwise (mul keeps both factors).
    """
    for value in ctx.inputs:
        if value.kind is not TensorKind.FLOAT:
            raise ctx.fail("expects floating-point inputs, got token ids", "inputs")
    shapes = [value.shape for value in ctx.inputs]
    shape = _broadcast(ctx, shapes, "inputs") if len(shapes) > 1 else shapes[0]
    function = ctx.attrs["function"]
    numel = math.prod(shape)
    saved: tuple[Saved, ...] = ()
    if function in _KEEPS_OUTPUT:
        saved = (Saved(label="output", source="out", numel=numel),)
    elif function not in _KEEPS_NOTHING:
        saved = tuple(
            Saved(label=f"input{i}", source=f"in{i}", numel=value.numel)
            for i, value in enumerate(ctx.inputs)
        )
    return OpResult(shape=shape, flops=numel * max(1, len(shapes) - 1), saved=saved)


def reduce(ctx: OpContext) -> OpResult:
    """Reduce one dim (mean, sum, max, ...), keeping it as size 1 or dropping it.

    Mean and sum keep nothing for backward; the others keep their input.
    """
    _float_input(ctx)
    rank = len(ctx.x.shape)
    dim = _dim(ctx, ctx.attrs["dim"], rank, "dim")
    keep = ctx.attr("keepdim", False)
    shape = ctx.x.shape[:dim] + ((1,) if keep else ()) + ctx.x.shape[dim + 1 :]
    function = ctx.attr("function", "mean")
    saved = (
        ()
        if function in ("mean", "sum")
        else (Saved(label="input", source="in0", numel=ctx.x.numel),)
    )
    return OpResult(shape=shape, flops=ctx.x.numel, saved=saved)


def slice_(ctx: OpContext) -> OpResult:
    """``x[..., start:end:step, ...]`` along ``dim`` (Python bounds, clamped); a view."""
    rank = len(ctx.x.shape)
    dim = _dim(ctx, ctx.attrs["dim"], rank, "dim")
    size = len(
        range(
            *slice(ctx.attrs["start"], ctx.attrs["end"], ctx.attr("step", 1)).indices(
                ctx.x.shape[dim]
            )
        )
    )
    if size < 1:
        raise ctx.fail(f"selects nothing from size {ctx.x.shape[dim]}", "start")
    shape = (*ctx.x.shape[:dim], size, *ctx.x.shape[dim + 1 :])
    return OpResult(shape=shape, kind=ctx.x.kind, alias_of=0)


def tensor(ctx: OpContext) -> OpResult:
    """A tensor stored in the model (a learned parameter, or a constant when not trainable).

    Imported graphs use it for weights that feed generic ops (a position embedding added to
    the patches, a class token concatenated to them). ``output_shape``, when given, is the shape
    of what the model feeds on (an expansion, slice or lookup of the stored tensor, a view in
    PyTorch); either way it takes no activation memory: weights are counted apart.
    """
    stored = tuple(ctx.attrs["shape"])
    shape = tuple(ctx.attrs.get("output_shape", stored))
    if any(not isinstance(d, int) or d < 1 for d in shape):
        raise ctx.fail("dims must be bound positive sizes", "output_shape")
    trainable = ctx.attr("trainable", True)
    return OpResult(
        shape=shape,
        param_shapes=(stored,) if trainable else (),
        buffers_bytes=0 if trainable else 4 * math.prod(stored),
        materialized=False,
    )


def opaque(ctx: OpContext) -> OpResult:
    """An op the importer did not understand (lenient import): passes its first input's shape
    through, with no parameters, FLOPs or saved tensors. Estimates are a lower bound there."""
    return OpResult(shape=ctx.x.shape, kind=ctx.x.kind)


OP_IMPLEMENTATIONS: Mapping[str, Callable[[OpContext], OpResult]] = {
    "conv2d": conv2d,
    "depthwise_conv2d": depthwise_conv2d,
    "pointwise_conv2d": pointwise_conv2d,
    "conv3d": conv3d,
    "conv_transpose3d": conv_transpose3d,
    "maxpool2d": maxpool2d,
    "avgpool2d": avgpool2d,
    "adaptive_avgpool2d": adaptive_avgpool2d,
    "adaptive_maxpool2d": adaptive_maxpool2d,
    "batchnorm2d": batchnorm2d,
    "instancenorm3d": instancenorm3d,
    "layernorm": layernorm,
    "rmsnorm": rmsnorm,
    "relu": relu,
    "relu6": relu6,
    "gelu": gelu,
    "silu": silu,
    "tanh": tanh,
    "sigmoid": sigmoid,
    "dropout": dropout,
    "linear": linear,
    "flatten": flatten,
    "reshape": reshape,
    "transpose": transpose,
    "select": select,
    "add": add,
    "concat": concat,
    "embedding": embedding,
    "embedding_add": embedding_add,
    "cls_token": cls_token,
    "attention": attention,
    "mlp": mlp,
    "lstm": lstm,
    "gru": gru,
    "rnn": rnn,
    "softmax": softmax,
    "cross_entropy": cross_entropy,
    "moe": moe,
    "matmul": matmul,
    "elementwise": elementwise,
    "reduce": reduce,
    "slice": slice_,
    "tensor": tensor,
    "opaque": opaque,
}
