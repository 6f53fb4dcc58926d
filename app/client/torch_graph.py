"""Turn a recorded PyTorch trace into the service's layer graph (no torch needed here).

:mod:`app.client.torch_import` runs a module on meta tensors and records plain JSON: every
module call (type, path, simple attributes, its own parameters, argument and output tensors)
and every torch function call, with tensors numbered by version. This module merges the two
probe runs into symbolic shapes (:func:`merge_probes`) and converts the record into layers
(:func:`convert_trace`), mirroring the built-in zoo graphs (:mod:`app.domain.zoo`).
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


# --------------------------------------------------------------------------- probes


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


# --------------------------------------------------------------------------- conversion

# Values a tensor can hold during conversion.
LIVE, PARAM, CONST = "live", "param", "const"


@dataclass(slots=True)
class _Value:
    """What a traced tensor is: a layer's output (live), derived from weights only, or a
    constant (masks, positions). ``ref`` is the layer or input name of a live value."""

    kind: str
    ref: str = ""
    param: str = ""  # PARAM: the parameter it derives from
    embedding_rows: int = 0  # PARAM: a lookup in an embedding table of this many rows
    positional: bool = False  # indexed by positions (arange / position buffers)


_PASSTHROUGH = frozenset({
    "contiguous", "to", "float", "type_as", "clone", "detach", "requires_grad_", "cpu",
    "cuda", "type", "bfloat16", "half", "double",
})  # fmt: skip
_ADD = frozenset({"add", "__add__", "__radd__", "__iadd__", "add_"})
_ELEMENTWISE = {
    "mul": "mul", "__mul__": "mul", "__rmul__": "mul", "__imul__": "mul", "mul_": "mul",
    "sub": "sub", "__sub__": "sub", "__rsub__": "sub", "div": "div", "__truediv__": "div",
    "neg": "neg", "__neg__": "neg", "exp": "exp", "sqrt": "sqrt", "rsqrt": "rsqrt",
    "abs": "abs", "pow": "pow", "__pow__": "pow", "erf": "erf",
}  # fmt: skip
_ACTIVATIONS = {
    "relu": "relu", "relu_": "relu", "relu6": "relu6", "silu": "silu", "silu_": "silu",
    "tanh": "tanh", "sigmoid": "sigmoid", "gelu": "gelu",
}  # fmt: skip
_MODULE_ACTIVATIONS = {
    "ReLU": ("relu", "relu"), "ReLU6": ("relu6", "relu"), "SiLU": ("silu", "silu"),
    "SiLUActivation": ("silu", "silu"), "Tanh": ("tanh", ""), "Sigmoid": ("sigmoid", ""),
    "GELUActivation": ("gelu", "gelu"), "NewGELUActivation": ("gelu", "gelu_new"),
    "GELUTanh": ("gelu", "gelu_tanh"), "PytorchGELUTanh": ("gelu", "gelu_tanh"),
    "FastGELUActivation": ("gelu", "gelu_tanh"),
}  # fmt: skip
_PROJECTIONS = frozenset({"Linear", "Conv1D"})
_GATED = {"silu": "swiglu", "gelu": "geglu", "gelu_tanh": "geglu"}


def _tensor_refs(value: Any) -> list[int]:
    """Tensor numbers in an encoded argument, in order."""
    if isinstance(value, dict):
        if "t" in value and len(value) == 1:
            return [value["t"]]
        return [n for v in value.values() for n in _tensor_refs(v)]
    if isinstance(value, list):
        return [n for v in value for n in _tensor_refs(v)]
    return []


def _arg(event: dict[str, Any], index: int, name: str, default: Any = None) -> Any:
    """Argument ``index`` (positional) or ``name`` (keyword) of a call."""
    args = event.get("args", [])
    if index < len(args):
        return args[index]
    return event.get("kwargs", {}).get(name, default)


def _int_or_pair(value: Any) -> Any:
    if isinstance(value, list) and len(value) == 2 and value[0] == value[1]:
        return value[0]
    if isinstance(value, list) and len(value) == 1:
        return value[0]
    return value


def _triple(value: Any) -> list[Any]:
    return list(value) if isinstance(value, list) else [value] * 3


def _int_or_triple(value: Any) -> Any:
    """An int where all three spatial dims agree (``[3, 3, 3]`` -> 3), else the list."""
    if isinstance(value, list) and len(value) in (1, 3) and len(set(value)) == 1:
        return value[0]
    return value


class _Converter:
    """Walks a merged trace record and emits layers (see :func:`convert_trace`)."""

    def __init__(self, record: dict[str, Any]) -> None:
        self.record = record
        self.tensors: list[dict[str, Any]] = record["tensors"]
        self.events: list[dict[str, Any]] = record["events"]
        self.children: dict[int | None, list[int]] = {}
        for event in self.events:
            self.children.setdefault(event["parent"], []).append(event["id"])
        self.values: dict[int, _Value] = {}
        self.layers: list[dict[str, Any]] = []
        self.meta: dict[str, dict[str, Any]] = {}  # layer name -> conversion notes
        self.names: set[str] = set()
        self.owner: dict[str, str] = {}  # parameter -> the layer that holds it
        self.pending_out: dict[str, dict[str, Any]] = {}  # attention awaiting its o-projection
        self.unsupported: dict[str, list[str]] = {}
        self.assumptions: list[str] = []
        self._candidates: dict[int, bool] = {}

    # -- values
    def value(self, number: int) -> _Value:
        known = self.values.get(number)
        if known is not None:
            return known
        tensor = self.tensors[number]
        if "input" in tensor:
            found = _Value(LIVE, ref=tensor["input"])
        elif "param" in tensor:
            found = _Value(PARAM, param=tensor["param"])
        elif "buffer" in tensor:
            found = _Value(CONST, positional="position" in tensor["buffer"])
        else:
            found = _Value(CONST)
        self.values[number] = found
        return found

    def shape(self, number: int) -> list[Any]:
        shape: list[Any] = self.tensors[number]["shape"]
        return shape

    def inputs_of(self, event: dict[str, Any]) -> list[int]:
        return _tensor_refs(event.get("args", [])) + _tensor_refs(event.get("kwargs", {}))

    def outputs_of(self, event: dict[str, Any]) -> list[int]:
        return _tensor_refs(event.get("out"))

    def set_outputs(
        self, event: dict[str, Any], value: _Value, *, first_only: bool = False
    ) -> None:
        outputs = self.outputs_of(event)
        for index, number in enumerate(outputs):
            if first_only and index:
                self.values[number] = _Value(CONST, ref=f"unsupported:{event_name(event)}")
            else:
                self.values[number] = value

    # -- layers
    def unique(self, base: str) -> str:
        base = (base or "layer")[:120]
        name, index = base, 1
        while name in self.names:
            name = f"{base}_{index}"
            index += 1
        self.names.add(name)
        return name

    def emit(
        self,
        event: dict[str, Any],
        op: str,
        sources: list[str],
        *,
        base: str | None = None,
        params: tuple[str, ...] = (),
        act: str | None = None,
        **attrs: Any,
    ) -> str:
        for ref in sources:
            self.claim(ref)
        name = self.unique(base or self.call_name(event))
        layer = {"name": name, "op": op, "inputs": list(sources)}
        layer.update({k: v for k, v in attrs.items() if v is not None})
        self.layers.append(layer)
        self.meta[name] = {"params": params, "act": act, "event": event["id"]}
        for param in params:
            self.owner.setdefault(param, name)
        return name

    def claim(self, ref: str) -> None:
        """A layer reads ``ref``: an attention still waiting for its o-projection cannot."""
        if ref in self.pending_out:
            raise TraceError(
                f"attention '{ref}' has no output projection (a linear layer reading it)"
            )

    def call_name(self, event: dict[str, Any]) -> str:
        parent = event["parent"]
        prefix = ""
        while parent is not None:
            path = self.events[parent].get("path", "")
            if path and path != "?":
                prefix = path + "."
                break
            parent = self.events[parent]["parent"]
        return prefix + str(event.get("fn") or event.get("type", "layer")).strip("_")

    def unsupported_op(self, event: dict[str, Any], what: str) -> None:
        where = event.get("path") or self.call_name(event)
        self.unsupported.setdefault(what, []).append(where)
        self.set_outputs(event, _Value(CONST, ref=f"unsupported:{what}"))

    # -- the walk
    def walk(self, parent: int | None) -> None:
        for child in self.children.get(parent, []):
            self.visit(self.events[child])

    def visit(self, event: dict[str, Any]) -> None:
        if event["kind"] == "module":
            type_name = event["type"]
            if type_name in LEAF_MODULE_TYPES or type_name.endswith("RMSNorm"):
                self.module(event)
            elif self.is_attention(event["id"]):
                self.attention(event)
            else:
                self.walk(event["id"])
        else:
            self.call(event)

    def live_inputs(self, event: dict[str, Any]) -> list[tuple[int, _Value]]:
        found = []
        for number in self.inputs_of(event):
            value = self.value(number)
            if value.kind == LIVE:
                if value.ref.startswith("unsupported:"):
                    raise TraceError(
                        f"'{event_name(event)}' reads the output of an unsupported op "
                        f"({value.ref.removeprefix('unsupported:')})"
                    )
                found.append((number, value))
            elif value.ref.startswith("unsupported:"):
                what = value.ref.removeprefix("unsupported:")
                self.unsupported.setdefault(what, []).append(event_name(event))
        return found

    def not_live(self, event: dict[str, Any]) -> None:
        """An op on weights and constants only: its result is a weight or a constant."""
        values = [self.value(n) for n in self.inputs_of(event)]
        params = [v for v in values if v.kind == PARAM]
        # Positions follow the data argument (gather(token_types, index=positions) is not).
        positional = bool(values and values[0].positional) or event.get("fn") == "arange"
        if params:
            base = params[0]
            self.set_outputs(
                event,
                _Value(
                    PARAM,
                    param=base.param,
                    embedding_rows=base.embedding_rows,
                    positional=base.positional or positional,
                ),
            )
        else:
            self.set_outputs(event, _Value(CONST, positional=positional))

    # -- leaf modules
    def module(self, event: dict[str, Any]) -> None:
        type_name: str = event["type"]
        attrs: dict[str, Any] = event["attrs"]
        params = tuple(event["params"].values())
        live = self.live_inputs(event)
        if not live:
            if type_name == "Embedding":
                index = [self.value(n) for n in self.inputs_of(event)]
                positional = any(v.positional for v in index)
                weight = event["params"].get("weight", "")
                self.set_outputs(
                    event,
                    _Value(
                        PARAM,
                        param=weight,
                        embedding_rows=attrs["num_embeddings"],
                        positional=positional,
                    ),
                )
            else:
                self.not_live(event)
            return
        number, source = live[0]
        src = [source.ref]
        path = event["path"]
        if type_name in _PROJECTIONS:
            self.projection(event, src)
            return
        if type_name == "Dropout" or type_name == "Identity":
            p = attrs.get("p", 0.0)
            if type_name == "Identity" or not p or not attrs.get("training", True):
                self.set_outputs(event, source)
                return
            name = self.emit(
                event, "dropout", src, base=path, p=p, inplace=attrs.get("inplace") or None
            )
        elif type_name in _MODULE_ACTIVATIONS:
            op, act = _MODULE_ACTIVATIONS[type_name]
            extra: dict[str, Any] = {}
            if attrs.get("inplace"):
                extra["inplace"] = True
            if op == "gelu" and act != "gelu":
                extra["approximate"] = "tanh"
            name = self.emit(event, op, src, base=path, act=act or None, **extra)
        elif type_name == "GELU":
            tanh = attrs.get("approximate") == "tanh"
            name = self.emit(
                event,
                "gelu",
                src,
                base=path,
                act="gelu_tanh" if tanh else "gelu",
                approximate="tanh" if tanh else None,
            )
        elif type_name == "Conv2d":
            name = self.conv2d(event, src)
        elif type_name in ("Conv3d", "ConvTranspose3d", "InstanceNorm3d"):
            if len(self.shape(number)) != 5:
                self.unsupported_op(event, f"{type_name} on an unbatched (4-d) input")
                return
            if type_name == "InstanceNorm3d":
                if attrs.get("track_running_stats"):
                    self.unsupported_op(event, "InstanceNorm3d with track_running_stats")
                    return
                name = self.emit(
                    event,
                    "instancenorm3d",
                    src,
                    base=path,
                    params=params,
                    eps=_unless(attrs.get("eps"), 1e-5),
                    affine=True if attrs.get("affine") else None,
                )
            else:
                conv = self.conv3d(event, src, number)
                if conv is None:
                    return
                name = conv
        elif type_name == "BatchNorm2d":
            name = self.emit(
                event,
                "batchnorm2d",
                src,
                base=path,
                params=params,
                eps=_unless(attrs.get("eps"), 1e-5),
                momentum=_unless(attrs.get("momentum"), 0.1),
                affine=False if attrs.get("affine") is False else None,
            )
        elif type_name == "LayerNorm":
            if len(attrs.get("normalized_shape", [0])) != 1:
                self.unsupported_op(event, "LayerNorm over several dims")
                return
            affine = attrs.get("elementwise_affine", True)
            name = self.emit(
                event,
                "layernorm",
                src,
                base=path,
                params=params,
                eps=attrs.get("eps"),
                elementwise_affine=False if not affine else None,
                bias=False if affine and "bias" not in event["params"] else None,
            )
        elif type_name == "RMSNorm" or type_name.endswith("RMSNorm"):
            eps = attrs.get("eps", attrs.get("variance_epsilon"))
            name = self.emit(event, "rmsnorm", src, base=path, params=params, eps=eps)
        elif type_name == "Embedding":
            name = self.emit(
                event,
                "embedding",
                src,
                base=path,
                params=params,
                num_embeddings=attrs["num_embeddings"],
                embedding_dim=attrs["embedding_dim"],
                padding_idx=attrs.get("padding_idx"),
            )
        elif type_name in ("MaxPool2d", "AvgPool2d"):
            if _int_or_pair(attrs.get("dilation", 1)) != 1 or attrs.get("return_indices"):
                self.unsupported_op(event, f"{type_name} with dilation or indices")
                return
            name = self.emit(
                event,
                "maxpool2d" if type_name == "MaxPool2d" else "avgpool2d",
                src,
                base=path,
                kernel_size=_int_or_pair(attrs["kernel_size"]),
                stride=_int_or_pair(attrs.get("stride") or attrs["kernel_size"]),
                padding=_int_or_pair(attrs.get("padding", 0)) or None,
                ceil_mode=True if attrs.get("ceil_mode") else None,
            )
        elif type_name in ("AdaptiveAvgPool2d", "AdaptiveMaxPool2d"):
            name = self.emit(
                event,
                "adaptive_avgpool2d" if type_name == "AdaptiveAvgPool2d" else "adaptive_maxpool2d",
                src,
                base=path,
                output_size=_int_or_pair(attrs["output_size"]),
            )
        elif type_name == "Flatten":
            name = self.emit(
                event,
                "flatten",
                src,
                base=path,
                start_dim=attrs.get("start_dim", 1),
                end_dim=attrs.get("end_dim", -1),
            )
        elif type_name == "Softmax":
            name = self.emit(event, "softmax", src, base=path, dim=attrs.get("dim"))
        elif type_name in ("LSTM", "GRU", "RNN"):
            if not attrs.get("batch_first") or attrs.get("proj_size"):
                self.unsupported_op(event, f"{type_name} without batch_first or with proj_size")
                return
            name = self.emit(
                event,
                type_name.lower(),
                src,
                base=path,
                params=params,
                hidden_size=attrs["hidden_size"],
                num_layers=_unless(attrs.get("num_layers"), 1),
                bidirectional=True if attrs.get("bidirectional") else None,
                bias=False if attrs.get("bias") is False else None,
                nonlinearity=_unless(attrs.get("nonlinearity"), "tanh"),
            )
            self.set_outputs(event, _Value(LIVE, ref=name), first_only=True)
            return
        elif type_name == "MultiheadAttention":
            self.multihead(event, live)
            return
        elif type_name in REFUSED_MODULE_TYPES:
            self.unsupported_op(event, f"{type_name}: {REFUSED_MODULE_TYPES[type_name]}")
            return
        else:
            self.unsupported_op(event, type_name)
            return
        self.set_outputs(event, _Value(LIVE, ref=name))

    def conv2d(self, event: dict[str, Any], src: list[str]) -> str:
        attrs = event["attrs"]
        if attrs.get("padding_mode", "zeros") != "zeros":
            raise TraceError(f"'{event['path']}': padding_mode {attrs['padding_mode']!r}")
        groups, inputs, outputs = (
            attrs.get("groups", 1),
            attrs["in_channels"],
            attrs["out_channels"],
        )
        padding = attrs.get("padding", 0)
        common: dict[str, Any] = {
            "kernel_size": _int_or_pair(attrs["kernel_size"]),
            "stride": _unless(_int_or_pair(attrs.get("stride", 1)), 1),
            "padding": padding if isinstance(padding, str) else (_int_or_pair(padding) or None),
            "dilation": _unless(_int_or_pair(attrs.get("dilation", 1)), 1),
            "bias": False if not attrs.get("bias", True) else None,
        }
        params = tuple(event["params"].values())
        if groups > 1 and groups == inputs:
            multiplier = outputs // inputs
            return self.emit(
                event,
                "depthwise_conv2d",
                src,
                base=event["path"],
                params=params,
                channel_multiplier=_unless(multiplier, 1),
                **common,
            )
        return self.emit(
            event,
            "conv2d",
            src,
            base=event["path"],
            params=params,
            out_channels=outputs,
            groups=_unless(groups, 1),
            **common,
        )

    def conv3d(self, event: dict[str, Any], src: list[str], number: int) -> str | None:
        """``Conv3d`` -> ``conv3d``, ``ConvTranspose3d`` -> ``conv_transpose3d`` (attributes as
        the domain ops take them: an int where all three dims agree, defaults left out)."""
        attrs = event["attrs"]
        type_name = event["type"]
        transposed = type_name == "ConvTranspose3d"
        mode = attrs.get("padding_mode", "zeros")
        if mode != "zeros":
            self.unsupported_op(event, f"{type_name} with padding_mode {mode!r}")
            return None
        padding = attrs.get("padding", 0)
        common: dict[str, Any] = {
            "out_channels": attrs["out_channels"],
            "kernel_size": _int_or_triple(attrs["kernel_size"]),
            "stride": _unless(_int_or_triple(attrs.get("stride", 1)), 1),
            "padding": padding if isinstance(padding, str) else _unless(_int_or_triple(padding), 0),
            "dilation": _unless(_int_or_triple(attrs.get("dilation", 1)), 1),
            "groups": _unless(attrs.get("groups", 1), 1),
            "bias": False if not attrs.get("bias", True) else None,
        }
        if common["padding"] == "valid":
            common["padding"] = None
        if transposed:
            extra = attrs.get("output_padding", 0)
            if _arg(event, 1, "output_size") is not None:
                # forward(x, output_size=...) picks the output padding from the size asked for
                extra = self.output_padding(event, number)
                if extra is None:
                    return None
            common["output_padding"] = _unless(_int_or_triple(extra), 0)
        return self.emit(
            event,
            "conv_transpose3d" if transposed else "conv3d",
            src,
            base=event["path"],
            params=tuple(event["params"].values()),
            **common,
        )

    def output_padding(self, event: dict[str, Any], number: int) -> list[int] | None:
        """The output padding a ``ConvTranspose3d`` called with ``output_size`` used, from the
        traced input and output sizes: ``out - ((in - 1) * s - 2 * p + d * (k - 1) + 1)``."""
        outputs = self.outputs_of(event)
        sizes, out_sizes = self.shape(number)[2:], self.shape(outputs[0])[2:] if outputs else []
        if len(out_sizes) != 3 or not all(
            isinstance(v, int) and v > 0 for v in [*sizes, *out_sizes]
        ):
            self.unsupported_op(event, "ConvTranspose3d with a size-dependent output_size")
            return None
        attrs = event["attrs"]
        per_dim = [
            _triple(attrs["kernel_size"]),
            _triple(attrs.get("stride", 1)),
            _triple(attrs.get("padding", 0)),
            _triple(attrs.get("dilation", 1)),
        ]
        return [
            out - ((size - 1) * s - 2 * p + d * (k - 1) + 1)
            for size, out, k, s, p, d in zip(sizes, out_sizes, *per_dim, strict=True)
        ]

    def projection(self, event: dict[str, Any], src: list[str]) -> None:
        """A Linear / Conv1D (or F.linear): an attention's o-projection, or a linear layer."""
        attrs = event["attrs"]
        weight = event["params"].get("weight", "")
        if event["kind"] == "call":
            weight = self.value(self.inputs_of(event)[1]).param
        out_features = attrs.get("out_features") or attrs.get("nf")
        has_bias = bool(attrs.get("bias", True))
        attention = self.pending_out.pop(src[0], None)
        if attention is not None:
            attention["out_bias"] = has_bias
            for param in event["params"].values():
                self.owner.setdefault(param, attention["name"])
            self.meta[attention["name"]]["params"] += tuple(event["params"].values())
            self.set_outputs(event, _Value(LIVE, ref=attention["name"]))
            return
        tied = self.owner.get(weight)
        in_features = self.shape(self.inputs_of(event)[0])[-1]
        name = self.emit(
            event,
            "linear",
            src,
            base=event.get("path") or None,
            params=tuple(p for p in event["params"].values() if p != weight or tied is None),
            out_features=out_features,
            bias=False if not has_bias else None,
            tied_to=tied,
        )
        self.meta[name]["in_features"] = in_features
        self.set_outputs(event, _Value(LIVE, ref=name))

    def multihead(self, event: dict[str, Any], live: list[tuple[int, _Value]]) -> None:
        attrs = event["attrs"]
        refs = self.inputs_of(event)[:3]
        if len({self.value(n).ref for n in refs}) != 1 or len(refs) < 3:
            self.unsupported_op(event, "MultiheadAttention (cross-attention)")
            return
        if not attrs.get("batch_first"):
            self.unsupported_op(event, "MultiheadAttention without batch_first")
            return
        embed = attrs["embed_dim"]
        if attrs.get("kdim", embed) != embed or attrs.get("vdim", embed) != embed:
            self.unsupported_op(event, "MultiheadAttention with kdim/vdim")
            return
        params = event["params"]
        name = self.emit(
            event,
            "attention",
            [live[0][1].ref],
            base=event["path"],
            params=tuple(params.values()),
            num_heads=attrs["num_heads"],
            causal=True if event["kwargs"].get("is_causal") else None,
            qkv_bias="in_proj_bias" in params,
            out_bias="out_proj.bias" in params,
            dropout=attrs.get("dropout") or None,
        )
        self.set_outputs(event, _Value(LIVE, ref=name), first_only=True)

    # -- function calls
    def call(self, event: dict[str, Any]) -> None:
        fn: str = event["fn"]
        live = self.live_inputs(event)
        if not live:
            self.not_live(event)
            return
        number, source = live[0]
        src = [source.ref]
        outputs = self.outputs_of(event)
        out_shape = self.shape(outputs[0]) if outputs else []
        in_shape = self.shape(number)
        name: str | None = None
        if fn in _PASSTHROUGH or (
            fn in ("view", "reshape", "view_as", "__getitem__", "expand", "expand_as")
            and out_shape == in_shape
        ):
            self.set_outputs(event, source)
            return
        if fn in ("view", "reshape", "unsqueeze", "squeeze", "view_as"):
            target = [
                d if d in SYMBOLS or (isinstance(d, int) and d > 0) else -1 for d in out_shape
            ]
            if target.count(-1) > 1:
                self.unsupported_op(event, f"{fn} to a shape with several size-dependent dims")
                return
            name = self.emit(event, "reshape", src, shape=target)
        elif fn == "flatten":
            name = self.emit(
                event,
                "flatten",
                src,
                start_dim=_arg(event, 1, "start_dim", 0),
                end_dim=_arg(event, 2, "end_dim", -1),
            )
        elif fn in ("transpose", "swapaxes"):
            name = self.emit(
                event, "transpose", src, dim0=_arg(event, 1, "dim0"), dim1=_arg(event, 2, "dim1")
            )
        elif fn == "permute":
            dims = (
                event["args"][1] if isinstance(_arg(event, 1, "dims"), list) else event["args"][1:]
            )
            moved = [i for i, d in enumerate(dims) if d != i]
            if len(moved) != 2:
                self.unsupported_op(event, "permute of more than two dims")
                return
            name = self.emit(event, "transpose", src, dim0=moved[0], dim1=moved[1])
        elif fn == "__getitem__":
            name = self.getitem(event, src, in_shape)
            if name is None:
                return
        elif fn in _ADD:
            name = self.add(event, live)
        elif fn in _ELEMENTWISE:
            name = self.emit(
                event, "elementwise", [v.ref for _, v in live], function=_ELEMENTWISE[fn]
            )
        elif fn in ("cat", "concat", "concatenate"):
            name = self.concat(event)
        elif fn in ("matmul", "bmm", "__matmul__") and len(live) == 2:
            name = self.emit(event, "matmul", [v.ref for _, v in live])
        elif fn in _ACTIVATIONS:
            op = _ACTIVATIONS[fn]
            inplace = fn.endswith("_") or bool(_arg(event, 1, "inplace", False)) and op != "gelu"
            approximate = event["kwargs"].get("approximate", "none") if op == "gelu" else "none"
            act = {"relu": "relu", "silu": "silu", "gelu": "gelu"}.get(op)
            if op == "gelu" and approximate == "tanh":
                act = "gelu_tanh"
            name = self.emit(
                event,
                op,
                src,
                act=act,
                inplace=True if inplace else None,
                approximate="tanh" if approximate == "tanh" else None,
            )
        elif fn == "softmax":
            name = self.emit(event, "softmax", src, dim=_arg(event, 1, "dim", -1))
        elif fn == "dropout":
            p = _arg(event, 1, "p", 0.5)
            if not p or not _arg(event, 2, "training", True):
                self.set_outputs(event, source)
                return
            name = self.emit(event, "dropout", src, p=p, inplace=_arg(event, 3, "inplace") or None)
        elif fn == "adaptive_avg_pool2d":
            name = self.emit(
                event,
                "adaptive_avgpool2d",
                src,
                output_size=_int_or_pair(_arg(event, 1, "output_size")),
            )
        elif fn in ("max_pool2d", "avg_pool2d"):
            kernel = _int_or_pair(_arg(event, 1, "kernel_size"))
            name = self.emit(
                event,
                "maxpool2d" if fn == "max_pool2d" else "avgpool2d",
                src,
                kernel_size=kernel,
                stride=_int_or_pair(_arg(event, 2, "stride") or kernel),
                padding=_int_or_pair(_arg(event, 3, "padding", 0)) or None,
                ceil_mode=True
                if _arg(event, 5 if fn == "max_pool2d" else 4, "ceil_mode")
                else None,
            )
        elif fn == "linear":
            weight = self.value(self.inputs_of(event)[1])
            if weight.kind != PARAM:
                self.unsupported_op(event, "linear with a computed weight")
                return
            shape = self.tensors[self.inputs_of(event)[1]]["shape"]
            bias = _arg(event, 2, "bias")
            event = {**event, "params": {"weight": weight.param}, "attrs": {
                "out_features": shape[0], "bias": bias is not None}}  # fmt: skip
            if bias is not None:
                event["params"]["bias"] = self.value(bias["t"]).param
            self.projection(event, src)
            return
        elif fn == "mean" and isinstance(_arg(event, 1, "dim"), int):
            name = self.emit(
                event,
                "reduce",
                src,
                dim=_arg(event, 1, "dim"),
                keepdim=True if _arg(event, 2, "keepdim") else None,
            )
        else:
            self.unsupported_op(event, fn)
            return
        self.set_outputs(event, _Value(LIVE, ref=name))

    def getitem(self, event: dict[str, Any], src: list[str], in_shape: list[Any]) -> str | None:
        index = event["args"][1]
        items = index if isinstance(index, list) else [index]
        picks: list[tuple[int, Any]] = []
        for dim, item in enumerate(items):
            if isinstance(item, dict) and "slice" in item:
                start, stop, step = item["slice"]
                size = in_shape[dim] if dim < len(in_shape) else None
                full = start in (None, 0) and (stop is None or stop == size) and step in (None, 1)
                if not full:
                    picks.append((dim, item["slice"]))
            elif isinstance(item, int) and not isinstance(item, bool):
                picks.append((dim, item))
            else:
                self.unsupported_op(event, "indexing with tensors, None or ...")
                return None
        if len(picks) != 1:
            self.unsupported_op(event, "indexing several dims at once")
            return None
        dim, pick = picks[0]
        if isinstance(pick, int):
            return self.emit(event, "select", src, base=self.call_name(event) + "_select",
                             dim=dim, index=pick)  # fmt: skip
        start, stop, step = pick
        if not all(isinstance(v, int) or v is None for v in (start, stop)):
            self.unsupported_op(event, "slicing with size-dependent bounds")
            return None
        return self.emit(
            event,
            "slice",
            src,
            base=self.call_name(event) + "_slice",
            dim=dim,
            start=start or 0,
            end=2**40 if stop is None else stop,
            step=_unless(step, 1),
        )

    def add(self, event: dict[str, Any], live: list[tuple[int, _Value]]) -> str:
        inplace = event["fn"] in ("__iadd__", "add_")
        if len(live) >= 2:
            return self.emit(
                event, "add", [v.ref for _, v in live], inplace=True if inplace else None
            )
        number, source = live[0]
        others = [self.value(n) for n in self.inputs_of(event) if n != number]
        weights = [(n, v) for n, v in zip(
            [n for n in self.inputs_of(event) if n != number], others, strict=True
        ) if v.kind == PARAM]  # fmt: skip
        if not weights:
            return self.emit(event, "elementwise", [source.ref], function="add")
        weight_number, weight = weights[0]
        shape, live_shape = self.shape(weight_number), self.shape(number)
        if weight.embedding_rows:
            rows, positional = weight.embedding_rows, weight.positional
        elif len(shape) in (2, 3) and len(live_shape) == 3 and shape[-1] == live_shape[-1]:
            rows = self.record["params"].get(weight.param, shape)[-2]
            positional = True
        else:
            tensor = self.tensor_layer(event, weight)
            return self.emit(event, "add", [source.ref, tensor], inplace=True if inplace else None)
        return self.emit(
            event,
            "embedding_add",
            [source.ref],
            base=self.call_name(event) + "_" + weight.param.rsplit(".", 2)[-2],
            params=(weight.param,),
            num_embeddings=rows,
            positional=None if positional else False,
        )

    def tensor_layer(self, event: dict[str, Any], weight: _Value) -> str:
        stored = self.record["params"][weight.param]
        name = self.unique(weight.param)
        self.layers.append({"name": name, "op": "tensor", "shape": stored})
        self.meta[name] = {"params": (weight.param,), "act": None, "event": event["id"]}
        return name

    def concat(self, event: dict[str, Any]) -> str:
        dim = _arg(event, 1, "dim", 0)
        parts = [self.value(n) for n in _tensor_refs(event["args"][0])]
        numbers = _tensor_refs(event["args"][0])
        if all(v.kind == LIVE for v in parts):
            return self.emit(event, "concat", [v.ref for v in parts], dim=dim)
        live = [v for v in parts if v.kind == LIVE]
        first = numbers[0]
        if (
            len(parts) == 2
            and parts[0].kind == PARAM
            and dim == 1
            and self.shape(first)[1] == 1
            and len(self.shape(first)) == 3
        ):
            return self.emit(
                event,
                "cls_token",
                [live[0].ref],
                base=self.call_name(event) + "_" + parts[0].param.rsplit(".", 1)[-1],
                params=(parts[0].param,),
            )
        refs = [
            v.ref if v.kind == LIVE else self.tensor_layer(event, v)
            for v in parts
            if v.kind != CONST
        ]
        return self.emit(event, "concat", refs, dim=dim)

    # -- attention
    def subtree(self, event_id: int) -> list[dict[str, Any]]:
        found: list[dict[str, Any]] = []
        for child in self.children.get(event_id, []):
            found.append(self.events[child])
            found += self.subtree(child)
        return sorted(found, key=lambda e: int(e["id"]))

    def cores(self, events: list[dict[str, Any]]) -> list[dict[str, Any]]:
        sdpa = [e for e in events if e.get("fn") == "scaled_dot_product_attention"]
        has_matmul = any(e.get("fn") in ("matmul", "bmm", "__matmul__", "einsum") for e in events)
        softmax = [
            e for e in events if e.get("fn") == "softmax" or e.get("type") == "Softmax"
        ] if has_matmul else []  # fmt: skip
        return sdpa + softmax

    def is_candidate(self, event_id: int) -> bool:
        known = self._candidates.get(event_id)
        if known is None:
            events = self.subtree(event_id)
            cores = self.cores(events)
            known = len(cores) == 1 and any(
                _is_projection(e) and e["id"] < cores[0]["id"] for e in events
            )
            self._candidates[event_id] = known
        return known

    def is_attention(self, event_id: int) -> bool:
        if not self.is_candidate(event_id):
            return False
        return not any(
            self.events[c]["kind"] == "module" and self.is_candidate(c)
            for c in self.children.get(event_id, [])
        )

    def origin(self, number: int, projections: dict[int, dict[str, Any]]) -> dict[str, Any] | None:
        """The projection a tensor inside an attention module was computed from."""
        seen = 0
        while seen < 200:
            seen += 1
            tensor = self.tensors[number]
            producer = tensor.get("src")
            if producer is None:
                return None
            if producer in projections:
                return projections[producer]
            event = self.events[producer]
            refs = [n for n in self.inputs_of(event) if self.tensors[n].get("dtype") == "float"]
            refs = [n for n in refs if "param" not in self.tensors[n]]
            if not refs:
                return None
            number = refs[0]
        return None

    def attention(self, module: dict[str, Any]) -> None:
        events = self.subtree(module["id"])
        core = self.cores(events)[0]
        live = self.live_inputs(module)
        if not live:
            self.not_live(module)
            return
        source = live[0][1]
        projections = {e["id"]: e for e in events if _is_projection(e)}
        before = [e for e in projections.values() if e["id"] < core["id"]]
        after = [e for e in projections.values() if e["id"] > core["id"]]
        if core.get("fn") == "scaled_dot_product_attention":
            query_n, key_n = _tensor_refs(core["args"])[:2]
            dropout = core["kwargs"].get("dropout_p", _arg(core, 4, "dropout_p", 0.0)) or 0.0
            causal = bool(core["kwargs"].get("is_causal", False))
        else:
            scores = self.tensors[_tensor_refs(core["args"])[0]]["src"]
            matmul = self.events[scores] if scores is not None else {}
            while matmul and matmul.get("fn") not in ("matmul", "bmm", "__matmul__"):
                refs = self.inputs_of(matmul)
                matmul = self.events[self.tensors[refs[0]]["src"]] if refs else {}
            if not matmul:
                self.unsupported_op(module, f"{module['type']} (attention scores not a matmul)")
                return
            query_n, key_n = _tensor_refs(matmul["args"])[:2]
            dropout = 0.0
            causal = False
            for e in events:
                if e["id"] > core["id"] and (after and e["id"] < after[0]["id"] or not after):
                    if e.get("type") == "Dropout":
                        dropout = max(dropout, e["attrs"].get("p", 0.0))
                    elif e.get("fn") == "dropout":
                        dropout = max(dropout, _arg(e, 1, "p", 0.5))
        causal = causal or module["attrs"].get("is_causal") is True
        head_dim = self.shape(query_n)[-1]
        q_proj, k_proj = self.origin(query_n, projections), self.origin(key_n, projections)
        if q_proj is None or not isinstance(head_dim, int):
            self.unsupported_op(module, f"{module['type']} (no query projection found)")
            return
        width = _out_features(q_proj)
        if k_proj is None or k_proj is q_proj:
            heads = self.shape(query_n)[1]
            kv_heads = self.shape(key_n)[1]
            q_dim = heads * head_dim if isinstance(heads, int) else width
            kv_dim = (width - q_dim) // 2 if k_proj is q_proj else kv_heads * head_dim
        else:
            q_dim, kv_dim = width, _out_features(k_proj)
        hidden = self.shape(live[0][0])[-1]
        heads, kv_heads = q_dim // head_dim, kv_dim // head_dim
        rotary = "position_embeddings" in module["kwargs"] or (
            any(e.get("fn") in ("neg", "__neg__") for e in events if e["id"] < core["id"])
            and any(e.get("fn") == "cat" for e in events if e["id"] < core["id"])
        )
        params = tuple(p for e in before for p in e["params"].values())
        name = self.emit(
            module,
            "attention",
            [source.ref],
            base=module["path"],
            params=params,
            num_heads=heads,
            num_kv_heads=kv_heads if kv_heads != heads else None,
            head_dim=head_dim if heads * head_dim != hidden else None,
            causal=True if causal else None,
            qkv_bias=bool(q_proj["attrs"].get("bias", True)),
            out_bias=True,
            rotary=True if rotary else None,
            dropout=dropout or None,
        )
        layer = self.layers[-1]
        if after:
            out_proj = after[0]
            layer["out_bias"] = bool(out_proj["attrs"].get("bias", True))
            self.meta[name]["params"] += tuple(out_proj["params"].values())
            self.set_outputs(out_proj, _Value(LIVE, ref=name))
            for event in events:  # what follows the o-projection (a residual dropout, ...)
                parent = event["parent"]
                if event["id"] > out_proj["id"] and (
                    parent == module["id"] or parent < out_proj["id"]
                ):
                    self.visit(event)
        else:
            self.pending_out[name] = layer
            self.set_outputs(module, _Value(LIVE, ref=name), first_only=True)


def _is_projection(event: dict[str, Any]) -> bool:
    return event.get("type") in _PROJECTIONS or event.get("fn") == "linear"


def _out_features(event: dict[str, Any]) -> int:
    attrs = event.get("attrs", {})
    value = attrs.get("out_features") or attrs.get("nf")
    return int(value) if value else 0


def _unless(value: Any, default: Any) -> Any:
    return None if value is None or value == default else value


def event_name(event: dict[str, Any]) -> str:
    return str(event.get("path") or event.get("fn") or event.get("type"))


# --------------------------------------------------------------------------- after the walk


def _readers(layers: list[dict[str, Any]]) -> dict[str, list[str]]:
    readers: dict[str, list[str]] = {}
    for layer in layers:
        for ref in layer.get("inputs", []):
            readers.setdefault(ref, []).append(layer["name"])
    return readers


def _fuse_mlps(layers: list[dict[str, Any]], meta: dict[str, dict[str, Any]]) -> list[str]:
    """linear -> activation -> linear (and gated: act(gate(x)) * up(x) -> down) into ``mlp``."""
    by_name = {layer["name"]: layer for layer in layers}
    readers = _readers(layers)
    fused: list[str] = []
    removed: set[str] = set()

    def only_reader(name: str) -> str | None:
        found = readers.get(name, [])
        return found[0] if len(found) == 1 else None

    def plain_linear(name: str | None) -> dict[str, Any] | None:
        layer = by_name.get(name or "")
        if layer is None or layer["op"] != "linear" or "tied_to" in layer or name in removed:
            return None
        return layer

    for up in list(layers):
        if up["name"] in removed or plain_linear(up["name"]) is None:
            continue
        act = by_name.get(only_reader(up["name"]) or "")
        if act is None or meta.get(act["name"], {}).get("act") is None:
            continue
        activation = meta[act["name"]]["act"]
        if act.get("inputs") != [up["name"]]:
            continue
        bias = up.get("bias", True)
        next_name = only_reader(act["name"])
        down = plain_linear(next_name)
        parts = [up, act]
        gated = None
        if down is None and next_name is not None:
            product = by_name[next_name]
            others = [r for r in product.get("inputs", []) if r != act["name"]]
            if (
                product["op"] == "elementwise"
                and product["function"] == "mul"
                and len(others) == 1
                and activation in _GATED
            ):
                gate_up = plain_linear(others[0])
                if (
                    gate_up is not None
                    and gate_up.get("inputs") == up.get("inputs")
                    and gate_up["out_features"] == up["out_features"]
                    and only_reader(gate_up["name"]) == product["name"]
                ):
                    down = plain_linear(only_reader(product["name"]))
                    parts += [gate_up, product]
                    gated = _GATED[activation]
        if (
            down is None
            or down.get("bias", True) != bias
            or down["out_features"] != meta[up["name"]].get("in_features")
        ):
            continue
        name = _common_prefix(up["name"], down["name"])
        if name in by_name and by_name[name] is not down:
            name = f"{name}.mlp"
        down.clear()
        down.update({
            "name": name, "op": "mlp", "inputs": up["inputs"],
            "intermediate_size": up["out_features"], "activation": gated or activation,
        })  # fmt: skip
        if not bias:
            down["bias"] = False
        meta[name] = {
            "params": tuple(
                p for part in [*parts, down] for p in meta.get(part["name"], {}).get("params", ())
            ),
            "act": None,
        }
        removed |= {part["name"] for part in parts}
        fused.append(name)
        old_down = [k for k, v in by_name.items() if v is down and k != name]
        for old in old_down:
            for layer in layers:
                layer["inputs"] = [name if r == old else r for r in layer.get("inputs", [])]
        by_name[name] = down
    layers[:] = [layer for layer in layers if layer["name"] not in removed]
    return fused


def _common_prefix(first: str, second: str) -> str:
    a, b = first.split("."), second.split(".")
    common: list[str] = []
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        common.append(x)
    return ".".join(common) if common else first + "_mlp"


def convert_trace(record: dict[str, Any], *, sequence_length: int | None = None) -> dict[str, Any]:
    """Convert a merged trace record into ``{"inputs", "layers", "default_bindings",
    "assumptions"}`` (the first three as ``POST /v1/models`` accepts them)."""
    converter = _Converter(record)
    converter.walk(None)
    if converter.pending_out:
        raise TraceError(
            "attention without an output projection: " + ", ".join(converter.pending_out)
        )
    if converter.unsupported:
        listed = "; ".join(
            f"{op} ({len(where)}x, e.g. {where[0]})" for op, where in converter.unsupported.items()
        )
        raise TraceError(f"the traced graph uses ops the service cannot model: {listed}")
    layers, meta = converter.layers, converter.meta
    if not layers:
        raise TraceError("the trace produced no layers")
    # Drop layers nothing reads except the last (the output), e.g. a pooler nobody uses.
    fused = _fuse_mlps(layers, meta)
    covered = {p for m in meta.values() for p in m.get("params", ())}
    missing = {k: v for k, v in record["params"].items() if k not in covered}
    in_graph = sum(_prod(v) for k, v in record["params"].items() if k in covered)
    total = record["param_count"]
    assumptions = [
        f"{in_graph:,} parameters in the graph; model.parameters() holds {total:,}",
        "traced on the meta device in training mode (dropout and batch norm as in training)",
    ]
    if fused:
        assumptions.append(f"{len(fused)} feed-forward blocks became mlp layers")
    guesses = record.get("guesses") or {}
    if guesses:
        assumptions.append(
            "value-dependent branches took the plain path (meta tensors have no values): "
            + ", ".join(f"{k} x{v}" for k, v in sorted(guesses.items()))
        )
    if missing:
        count = sum(_prod(v) for v in missing.values())
        assumptions.append(
            f"{len(missing)} parameters ({count:,} values) are not used by forward and are "
            f"left out, e.g. {sorted(missing)[0]}"
        )
    previous: str | None = None
    for layer in layers:
        if layer.get("inputs") == [previous] and previous is not None:
            del layer["inputs"]
        elif layer["op"] == "tensor":
            layer.pop("inputs", None)
        previous = layer["name"]
    inputs = [
        {"name": spec["name"], "shape": spec["shape"], "dtype": spec["dtype"]}
        for spec in record["inputs"]
    ]
    uses_seq = any("seq" in spec["shape"] for spec in inputs)
    bindings = {"seq": sequence_length} if uses_seq and sequence_length else {}
    if uses_seq and not sequence_length:
        assumptions.append("no default sequence length (--seq): give one with each estimate")
    return {
        "inputs": inputs,
        "layers": layers,
        "default_bindings": bindings,
        "assumptions": assumptions,
    }
