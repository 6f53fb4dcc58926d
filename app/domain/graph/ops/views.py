"""Ops that move or select data without computing it: views (flatten, reshape, transpose,
select, slice), concatenation, stored tensors, and ops the importer did not understand.
"""

from __future__ import annotations

import math

from app.domain.graph.ops.core import (
    OpContext,
    OpResult,
    dim_index,
)


def flatten(ctx: OpContext) -> OpResult:
    """Merge dims ``start_dim..end_dim`` (a view)."""
    rank = len(ctx.x.shape)
    start = dim_index(ctx, ctx.attr("start_dim", 1), rank, "start_dim")
    end = dim_index(ctx, ctx.attr("end_dim", -1), rank, "end_dim")
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
    a = dim_index(ctx, ctx.attrs["dim0"], rank, "dim0")
    b = dim_index(ctx, ctx.attrs["dim1"], rank, "dim1")
    shape = list(ctx.x.shape)
    shape[a], shape[b] = shape[b], shape[a]
    return OpResult(shape=tuple(shape), kind=ctx.x.kind, alias_of=0)


def select(ctx: OpContext) -> OpResult:
    """Pick one index along a dim, removing it (a view)."""
    rank = len(ctx.x.shape)
    dim = dim_index(ctx, ctx.attrs["dim"], rank, "dim")
    index = ctx.attrs["index"]
    if not -ctx.x.shape[dim] <= index < ctx.x.shape[dim]:
        raise ctx.fail(f"index {index} out of range for size {ctx.x.shape[dim]}", "index")
    return OpResult(shape=ctx.x.shape[:dim] + ctx.x.shape[dim + 1 :], kind=ctx.x.kind, alias_of=0)


def concat(ctx: OpContext) -> OpResult:
    """Concatenate along ``dim`` (default 1, channels); keeps nothing."""
    rank = len(ctx.x.shape)
    dim = dim_index(ctx, ctx.attr("dim", 1), rank, "dim")
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


def slice_(ctx: OpContext) -> OpResult:
    """``x[..., start:end:step, ...]`` along ``dim`` (Python bounds, clamped); a view."""
    rank = len(ctx.x.shape)
    dim = dim_index(ctx, ctx.attrs["dim"], rank, "dim")
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
