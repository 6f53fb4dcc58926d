"""What a trace is made of, shared by the recorder (:mod:`app.client.torch_import`, which
needs torch) and the conversion (torch-free): the inputs, the leaf modules and the
attributes recorded, and the merge of the two probe runs into symbolic shapes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

SYMBOLS = ("batch", "seq")
# Two runs at different sizes: a dimension that follows them is symbolic.
PROBES: tuple[dict[str, int], ...] = ({"batch": 2, "seq": 5}, {"batch": 3, "seq": 7})


class TraceError(Exception):
    """A model, factory or input that cannot be traced or converted (the message says why)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class TraceInput:
    """One model input: name, dims (ints or the symbols ``batch`` / ``seq``), dtype."""

    name: str
    shape: tuple[int | str, ...]
    dtype: str = "float"  # "float" | "int64"


def parse_input(text: str) -> TraceInput:
    """Parse ``NAME:DIM,DIM,...[:DTYPE]``, e.g. ``input_ids:batch,seq:int64``."""
    parts = text.split(":")
    if len(parts) not in (2, 3) or not parts[0] or not parts[1]:
        raise TraceError(
            f"--input {text!r}: expected NAME:DIMS[:DTYPE], e.g. input_ids:batch,seq:int64 "
            "or pixel_values:batch,3,224,224"
        )
    name = parts[0]
    if not name.replace("_", "a").replace(".", "a").isalnum() or not name[0].isalpha():
        raise TraceError(f"--input {text!r}: {name!r} is not a valid input name")
    dims: list[int | str] = []
    for raw in parts[1].split(","):
        dim = raw.strip()
        if dim in SYMBOLS:
            dims.append(dim)
        elif dim.isdigit() and int(dim) >= 1:
            dims.append(int(dim))
        else:
            raise TraceError(
                f"--input {text!r}: dimension {dim!r} must be a positive integer, batch or seq"
            )
    dtype = parts[2] if len(parts) == 3 else "float"
    if dtype not in ("float", "int64"):
        raise TraceError(f"--input {text!r}: dtype {dtype!r} must be float or int64")
    if len(dims) > 8:
        raise TraceError(f"--input {text!r}: at most 8 dimensions")
    return TraceInput(name=name, shape=tuple(dims), dtype=dtype)


# Modules the service has no op for: leaves, so that the refusal names the module type and
# why, rather than the functions it would call (conv_transpose2d, max_pool3d, ...).
REFUSED_MODULE_TYPES: dict[str, str] = {
    "ConvTranspose1d": "no 1-d transposed convolution op",
    "ConvTranspose2d": "no 2-d transposed convolution op, only ConvTranspose3d",
    "MaxPool3d": "no 3-d pooling op",
    "AvgPool3d": "no 3-d pooling op",
    "AdaptiveAvgPool3d": "no 3-d pooling op",
    "AdaptiveMaxPool3d": "no 3-d pooling op",
    "BatchNorm3d": "no 3-d batch norm op",
    "InstanceNorm1d": "no 1-d instance norm op, only InstanceNorm3d",
    "InstanceNorm2d": "no 2-d instance norm op, only InstanceNorm3d",
}

# Modules converted as one layer from their type and attributes: the tracer does not record
# the calls inside them. Names ending in RMSNorm are leaves too (Hugging Face's *RMSNorm).
LEAF_MODULE_TYPES = frozenset({
    "Linear", "Conv1D", "Conv2d", "BatchNorm2d", "LayerNorm", "RMSNorm", "Embedding",
    "ReLU", "ReLU6", "GELU", "SiLU", "Tanh", "Sigmoid", "Softmax", "Dropout", "Identity",
    "NewGELUActivation", "GELUActivation", "GELUTanh", "PytorchGELUTanh", "FastGELUActivation",
    "SiLUActivation", "MaxPool2d", "AvgPool2d", "AdaptiveAvgPool2d", "AdaptiveMaxPool2d",
    "Flatten", "LSTM", "GRU", "RNN", "MultiheadAttention", "Conv3d", "ConvTranspose3d",
    "InstanceNorm3d", *REFUSED_MODULE_TYPES,
})  # fmt: skip

# Simple attributes recorded for every module call (when present and plain).
MODULE_ATTRIBUTES = (
    "in_features", "out_features", "bias", "weight", "nf", "nx", "in_channels", "out_channels",
    "kernel_size", "stride", "padding", "dilation", "groups", "padding_mode", "eps", "momentum",
    "affine", "track_running_stats", "normalized_shape", "elementwise_affine",
    "variance_epsilon", "num_embeddings", "embedding_dim", "padding_idx", "max_norm", "inplace",
    "approximate", "p", "output_size", "ceil_mode", "return_indices", "start_dim", "end_dim",
    "input_size", "hidden_size", "num_layers", "bidirectional", "batch_first", "proj_size",
    "embed_dim", "num_heads", "kdim", "vdim", "dropout", "dim", "is_causal", "head_dim",
    "attention_dropout", "training", "nonlinearity", "output_padding",
)  # fmt: skip


def _merge_dim(a: Any, b: Any, probes: tuple[dict[str, int], dict[str, int]]) -> Any:
    """One value seen at both probe sizes: itself, a symbol, or -1 (another function of them)."""
    if a == b or not all(isinstance(v, int) and not isinstance(v, bool) for v in (a, b)):
        return a
    for symbol in SYMBOLS:
        if a == probes[0][symbol] and b == probes[1][symbol]:
            return symbol
    return -1


def _merge_value(a: Any, b: Any, probes: tuple[dict[str, int], dict[str, int]]) -> Any:
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        return [_merge_value(x, y, probes) for x, y in zip(a, b, strict=True)]
    if isinstance(a, dict) and isinstance(b, dict) and a.keys() == b.keys():
        return {k: _merge_value(a[k], b[k], probes) for k in a}
    return _merge_dim(a, b, probes)


def merge_probes(runs: list[dict[str, Any]], inputs: Any) -> dict[str, Any]:
    """Merge the two probe runs: dims that follow the probe sizes become ``batch`` / ``seq``."""
    first, second = runs
    probes = (first["probe"], second["probe"])
    same = len(first["events"]) == len(second["events"]) and len(first["tensors"]) == len(
        second["tensors"]
    )
    same = same and all(
        (a["kind"], a.get("fn"), a.get("type")) == (b["kind"], b.get("fn"), b.get("type"))
        for a, b in zip(first["events"], second["events"], strict=True)
    )
    if not same:
        raise TraceError(
            "the model runs different operations at two batch/sequence sizes "
            f"({probes[0]} and {probes[1]}): its graph depends on the input size"
        )
    tensors = []
    for a, b in zip(first["tensors"], second["tensors"], strict=True):
        merged = dict(a)
        merged["shape"] = _merge_value(a["shape"], b["shape"], probes)
        tensors.append(merged)
    events = [
        _merge_value(a, b, probes) for a, b in zip(first["events"], second["events"], strict=True)
    ]
    params = first["params"]
    return {
        "format": 1,
        "inputs": [
            {"name": spec.name, "shape": list(spec.shape), "dtype": spec.dtype} for spec in inputs
        ],
        "params": params,
        "param_count": sum(_prod(shape) for shape in params.values()),
        "guesses": first.get("guesses", {}),
        "tensors": tensors,
        "events": events,
    }


def _prod(shape: list[int]) -> int:
    total = 1
    for dim in shape:
        total *= dim
    return total
