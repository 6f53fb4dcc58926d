"""Leaf modules -> layers from their type and attributes (the tracer does not record the
calls inside them): linear and convolutions, norms, embeddings, activations, pooling,
recurrent layers and ``nn.MultiheadAttention``.
"""

from __future__ import annotations

from typing import Any

from app.client.torch_convert import (
    _PROJECTIONS,
    LIVE,
    PARAM,
    _arg,
    _ConverterBase,
    _int_or_pair,
    _int_or_triple,
    _triple,
    _unless,
    _Value,
)
from app.client.torch_trace import REFUSED_MODULE_TYPES, TraceError

_MODULE_ACTIVATIONS = {
    "ReLU": ("relu", "relu"), "ReLU6": ("relu6", "relu"), "SiLU": ("silu", "silu"),
    "SiLUActivation": ("silu", "silu"), "Tanh": ("tanh", ""), "Sigmoid": ("sigmoid", ""),
    "GELUActivation": ("gelu", "gelu"), "NewGELUActivation": ("gelu", "gelu_new"),
    "GELUTanh": ("gelu", "gelu_tanh"), "PytorchGELUTanh": ("gelu", "gelu_tanh"),
    "FastGELUActivation": ("gelu", "gelu_tanh"),
}  # fmt: skip


class _ModuleConversions(_ConverterBase):
    """The conversion of a leaf module call (see :data:`LEAF_MODULE_TYPES`)."""

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
