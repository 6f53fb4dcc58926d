"""Torch function and tensor method calls -> layers: views, reshapes and transposes,
indexing, adds and element-wise ops, concatenation, matmuls, activations, softmax, dropout,
pooling, linear calls and means.
"""

from __future__ import annotations

from typing import Any

from app.client.torch_convert import (
    CONST,
    LIVE,
    PARAM,
    _arg,
    _ConverterBase,
    _int_or_pair,
    _tensor_refs,
    _unless,
    _Value,
)
from app.client.torch_trace import SYMBOLS

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


class _CallConversions(_ConverterBase):
    """The conversion of a recorded function call."""

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
