"""What an op reads and returns (its context, result, saved and transient tensors), and the
input checks every op shares.

A saved tensor names its storage (an input, the output, or a new internal tensor), so that a
storage kept by two layers is counted once.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, NamedTuple

from app.domain.errors import GraphError
from app.domain.precision import Precision
from app.domain.workload import (
    Attention,
    GpuTraits,
    Runtime,
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


# The label of a cuDNN work space transient (convolutions, RNNs on CUDA): taken from the caching
# allocator per call, in the forward and again in the backward (app.domain.memory.liveness).
CUDNN_WORKSPACE = "cudnn_workspace"


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
    # Training with use_cache: the storages the layer's returned cache (``present``) keeps,
    # where they are not one K and one V in the activations' dtype (GPT-NeoX mid-2024: an fp32
    # rotated key, a value viewing the fused q/k/v output). Empty: K and V.
    returned_cache: tuple[Saved, ...] = ()
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


def pair(value: Any) -> tuple[int, int]:
    if isinstance(value, list):
        return int(value[0]), int(value[1])
    return int(value), int(value)


def require_rank(ctx: OpContext, rank: int, what: str) -> None:
    if len(ctx.x.shape) != rank:
        raise ctx.fail(
            f"expects a {rank}-d input ({what}), got shape {list(ctx.x.shape)}", "inputs"
        )


def require_float(ctx: OpContext) -> None:
    if ctx.x.kind is not TensorKind.FLOAT:
        raise ctx.fail("expects a floating-point input, got token ids", "inputs")


def row_count(ctx: OpContext) -> int:
    return ctx.x.numel // ctx.x.shape[-1]


def dim_index(ctx: OpContext, dim: int, rank: int, field_name: str) -> int:
    if not -rank <= dim < rank:
        raise ctx.fail(f"dim {dim} out of range for a {rank}-d input", field_name)
    return dim % rank


def broadcast_shapes(
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
