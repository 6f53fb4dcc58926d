"""Autocast's cached 16-bit copies of trainable weights (the weight_cast_cache line): which
parameters autocast casts (:func:`app.domain.memory.liveness.cast_params`), per layer, and
which of a LoRA model's trainable copies it never casts."""

from __future__ import annotations

import math

from app.domain.memory.context import Estimation
from app.domain.memory.liveness import UNCAST_OPS, cast_params
from app.domain.peft import LoraPlan


def uncast_copies(e: Estimation, lora: LoraPlan) -> int:
    """The params of modules_to_save copies autocast never casts (:data:`UNCAST_OPS`: an
    embedding's or a norm's trainable copy runs on its own weight), out of the cache line."""
    layers = e.analysis.layers
    return sum(
        math.prod(shape)
        for index, shapes in zip(lora.saved_layers, lora.saved_shapes, strict=True)
        if layers[index].op in UNCAST_OPS
        for shape in shapes
    )


def released_casts(e: Estimation, cache: int, model_shard: int) -> list[int] | None:
    """Per layer, the weight_cast_cache bytes its backward frees (:func:`cast_params`): a
    LoRA model's are its adapters' copies (the frozen base is not cached). Sets the
    replay's per-layer copies (``cast_tensors``) for a model without LoRA."""
    if not cache:
        return None
    if e.cast_tensors is None:  # each cast parameter tensor, a tied weight as one more
        cast = int(e.plan.weight_cache)
        e.cast_tensors = []
        for layer, numel in zip(e.analysis.layers, cast_params(e.analysis), strict=True):
            sizes = [math.prod(shape) for shape in layer.result.param_shapes] if numel else []
            if numel > sum(sizes):
                sizes.append(numel - sum(sizes))
            e.cast_tensors.append([-(-size * cast // model_shard) for size in sizes])
    return [sum(sizes) for sizes in e.cast_tensors]
