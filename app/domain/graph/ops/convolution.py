"""Image and volume layers: convolutions, pooling, batch and instance norm (``[N, C, H, W]``,
``[N, C, D, H, W]``).
"""

from __future__ import annotations

import math
from typing import Any

from app.domain.graph.ops.core import (
    CUDNN_WORKSPACE,
    OpContext,
    OpResult,
    Saved,
    Storage,
    Transient,
    pair,
    require_float,
    require_rank,
)
from app.domain.workload import Runtime


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


def cudnn_conv_workspace_numel(
    input_numel: int, output_numel: int, weight_numel: int, kernel_numel: int
) -> int:
    """Elements of the workspace one cuDNN 2-d convolution forward takes from PyTorch's
    caching allocator on CUDA: the input and the output, plus the weight unless its kernel is
    1x1 [elements of the compute dtype].

    Source: aten/src/ATen/native/cudnn/Conv_v8.cpp (PyTorch 2.x, cuDNN >= 8): ``run_conv_plan``
    allocates the chosen engine's ``plan.getWorkspaceSize()`` bytes through
    ``c10::cuda::CUDACachingAllocator`` for the call and frees them after it, so they count in
    ``max_memory_allocated``; without ``cudnn.benchmark`` the plan is the first heuristic
    (``CUDNN_HEUR_MODE_INSTANT``) engine that runs. cuDNN does not document the sizes; on an
    H100 (torch 2.11, cuDNN 9.19, benchmarks/fidelity/cuda) they are those of NHWC copies of
    the NCHW tensors (our reading; a 1x1 weight is the same in both layouts):
    VGG-16 inference peaks in conv1_2 (64->64, 3x3, 224 px) at input + output + this work space
    to the byte (+512 B of rounding) at batch 8 and 32 in fp32 and at batch 1 and 32 in bf16
    (batch 8 bf16: 1 MiB more); ResNet-50 fp32 at batch 32 peaks at 3.5 x its 256x56x56
    activation, a layer1 1x1 conv's input + output + a work space of both. Engines differ by
    shape, so the rule is an upper bound where a leaner engine wins: VGG-16 fp32 at batch 1
    and the probe's 3x3 64->64 conv at 56 px in fp32 took input + weight only, MobileNetV2's
    16->96 1x1 expansion at most its output (3 MiB more). ``cudnn.benchmark`` chose engines of
    the same work space in the probe (``cudnn_conv_transient``).
    """
    weight = weight_numel if kernel_numel > 1 else 0
    return input_numel + output_numel + weight


def _conv(
    ctx: OpContext,
    out_channels: int,
    kernel: Any,
    groups: int,
    bias: bool,
    spatial_dims: int = 2,
    cudnn: bool = True,
) -> OpResult:
    require_rank(ctx, spatial_dims + 2, _CONV_LAYOUTS[spatial_dims])
    require_float(ctx)
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
    transients: tuple[Transient, ...] = ()
    if cudnn and spatial_dims == 2 and ctx.runtime is Runtime.CUDA:
        workspace = cudnn_conv_workspace_numel(
            ctx.x.numel, n * out_channels * math.prod(out_sizes), math.prod(weight),
            math.prod(kernels),
        )  # fmt: skip
        transients = (Transient(label=CUDNN_WORKSPACE, numel=workspace),)
    return OpResult(
        shape=(n, out_channels, *out_sizes),
        param_shapes=params,
        flops=2 * macs,
        saved=(Saved(label="input", source="in0", numel=ctx.x.numel),),
        transients=transients,
    )


def _declared_conv(ctx: OpContext, spatial_dims: int) -> OpResult:
    """A convolution whose channels, kernel, groups and bias are its attributes."""
    return _conv(
        ctx,
        ctx.attrs["out_channels"],
        ctx.attrs["kernel_size"],
        ctx.attr("groups", 1),
        ctx.attr("bias", True),
        spatial_dims,
    )


def conv2d(ctx: OpContext) -> OpResult:
    """2-d convolution (cross-correlation) with stride, padding, dilation and groups."""
    return _declared_conv(ctx, spatial_dims=2)


def depthwise_conv2d(ctx: OpContext) -> OpResult:
    """Depthwise convolution: groups = in_channels.

    On CUDA PyTorch runs it with its own kernel (``conv_depthwise2d``), not cuDNN, for fp32
    and bf16 (aten/src/ATen/native/Convolution.cpp ``use_cudnn_depthwise``: cuDNN only for
    fp16 inputs of some shapes, or channels-last), so no cuDNN workspace is charged; the fp16
    cuDNN case is not modelled.
    """
    require_rank(ctx, 4, "N, C, H, W")
    channels = ctx.x.shape[1]
    out = channels * ctx.attr("channel_multiplier", 1)
    return _conv(ctx, out, ctx.attrs["kernel_size"], channels, ctx.attr("bias", True), cudnn=False)


def pointwise_conv2d(ctx: OpContext) -> OpResult:
    """1x1 convolution."""
    return _conv(ctx, ctx.attrs["out_channels"], 1, 1, ctx.attr("bias", True))


def conv3d(ctx: OpContext) -> OpResult:
    """3-d convolution (``torch.nn.Conv3d``) over ``[N, C, D, H, W]``: stride, padding,
    dilation and groups per spatial dim; an implicit GEMM of ``C_in/groups * kd*kh*kw``."""
    return _declared_conv(ctx, spatial_dims=3)


def conv_transpose3d(ctx: OpContext) -> OpResult:
    """Transposed 3-d convolution (``torch.nn.ConvTranspose3d``), as U-Nets upsample.

    Output size per spatial dim: ``(in - 1) * stride - 2 * padding + dilation * (kernel - 1)
    + output_padding + 1``; weight ``[C_in, C_out/groups, kd, kh, kw]``; FLOPs: every input
    voxel multiplies its ``C_in/groups`` channels into ``C_out * kd*kh*kw`` outputs. Autograd
    keeps the input (``convolution_backward`` needs it for the weight gradient).
    """
    require_rank(ctx, 5, _CONV_LAYOUTS[3])
    require_float(ctx)
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
    require_rank(ctx, 4, "N, C, H, W")
    n, c, h, w = ctx.x.shape
    kh, kw = pair(ctx.attrs["kernel_size"])
    sh, sw = pair(ctx.attr("stride", ctx.attrs["kernel_size"]))
    ph, pw = pair(ctx.attr("padding", 0))
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
    kh, kw = pair(ctx.attrs["kernel_size"])
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
    kh, kw = pair(ctx.attrs["kernel_size"])
    return OpResult(
        shape=shape,
        flops=math.prod(shape) * kh * kw,
        saved=(Saved(label="input", source="in0", numel=ctx.x.numel),),
    )


def _adaptive(ctx: OpContext, indices: bool) -> OpResult:
    require_rank(ctx, 4, "N, C, H, W")
    n, c, _, _ = ctx.x.shape
    oh, ow = pair(ctx.attrs["output_size"])
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
    require_rank(ctx, 4, "N, C, H, W")
    require_float(ctx)
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
    require_rank(ctx, 5, _CONV_LAYOUTS[3])
    require_float(ctx)
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
