"""Arithmetic on activations: activation functions, dropout, sums, matrix products,
element-wise functions, reductions, softmax and the cross-entropy loss.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from app.domain.graph.ops.core import (
    OpContext,
    OpResult,
    Saved,
    Storage,
    TensorKind,
    broadcast_shapes,
    dim_index,
    require_float,
    row_count,
)


def _activation(saves: str) -> Callable[[OpContext], OpResult]:
    def run(ctx: OpContext) -> OpResult:
        require_float(ctx)
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
    require_float(ctx)
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


def softmax(ctx: OpContext) -> OpResult:
    """Softmax along ``dim``; keeps its output."""
    require_float(ctx)
    dim_index(ctx, ctx.attr("dim", -1), len(ctx.x.shape), "dim")
    return OpResult(
        shape=ctx.x.shape,
        flops=5 * ctx.x.numel,
        saved=(Saved(label="output", source="out", numel=ctx.x.numel),),
    )


def cross_entropy(ctx: OpContext) -> OpResult:
    """Mean cross-entropy over the last dim: log_softmax (kept) then NLL against int64 labels."""
    require_float(ctx)
    rows = row_count(ctx)
    return OpResult(
        shape=(),
        flops=6 * ctx.x.numel,
        saved=(
            Saved(label="log_probs", source="new", numel=ctx.x.numel),
            Saved(label="labels", source="new", numel=rows, storage=Storage.INT64),
        ),
    )


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
    batch = broadcast_shapes(ctx, [left[:-2], right[:-2]], "inputs")
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
    shape = broadcast_shapes(ctx, shapes, "inputs") if len(shapes) > 1 else shapes[0]
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
    require_float(ctx)
    rank = len(ctx.x.shape)
    dim = dim_index(ctx, ctx.attrs["dim"], rank, "dim")
    keep = ctx.attr("keepdim", False)
    shape = ctx.x.shape[:dim] + ((1,) if keep else ()) + ctx.x.shape[dim + 1 :]
    function = ctx.attr("function", "mean")
    saved = (
        ()
        if function in ("mean", "sum")
        else (Saved(label="input", source="in0", numel=ctx.x.numel),)
    )
    return OpResult(shape=shape, flops=ctx.x.numel, saved=saved)
