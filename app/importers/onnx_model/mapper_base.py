"""The mapper's state and the helpers every op handler uses: naming and adding layers,
constants that feed activations, bookkeeping of the op mapping and of unsupported ops,
attributes.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import onnx
from onnx import ModelProto, NodeProto, TensorProto

from app.domain.graph.analysis import InputDecl
from app.importers.onnx_model.proto import _default_opset, _reject
from app.importers.result import (
    MAX_STORED_LAYERS,
)

_SHAPE_OPS = frozenset({"Shape", "Size"})
# Folded ops whose output is a view, expansion, slice or lookup of their first input: a
# parameter stays that parameter through them (a transposed LM head, an expanded class token).
_VIEW_OF_FIRST_INPUT = frozenset(
    {"Transpose", "Expand", "Unsqueeze", "Squeeze", "Reshape", "Identity", "Cast", "Gather",
     "Slice", "Flatten"}
)  # fmt: skip
_ALIAS_OPS = frozenset({"Identity"})
_ACTIVATIONS = {"Relu": "relu", "Sigmoid": "sigmoid", "Tanh": "tanh"}
_ELEMENTWISE_UNARY = {
    "LeakyRelu": "leaky_relu", "Elu": "elu", "HardSigmoid": "hardsigmoid",
    "HardSwish": "hardswish", "Softplus": "softplus", "Mish": "mish", "Erf": "erf",
    "Exp": "exp", "Log": "log", "Sqrt": "sqrt", "Reciprocal": "reciprocal", "Neg": "neg",
    "Abs": "abs", "Sin": "sin", "Cos": "cos", "Floor": "floor", "Ceil": "ceil",
    "Round": "round", "Sign": "sign", "Clip": "clip",
}  # fmt: skip
_ELEMENTWISE_BINARY = {
    "Add": "add", "Sub": "sub", "Mul": "mul", "Div": "div", "Pow": "pow", "Max": "max",
    "Min": "min", "Where": "where",
}  # fmt: skip
_REDUCE = {
    "ReduceMean": "mean", "ReduceSum": "sum", "ReduceMax": "max", "ReduceMin": "min",
    "ReduceProd": "prod", "ReduceL1": "l1", "ReduceL2": "l2", "ReduceSumSquare": "sum_square",
    "ReduceLogSumExp": "log_sum_exp",
}  # fmt: skip
_NAME_CHARS = re.compile(r"[^A-Za-z0-9_/-]+")


@dataclass(slots=True)
class _Const:
    """A value known without running the model: an initializer, a Constant, or a fold."""

    dims: tuple[int, ...] | None
    is_float: bool
    origin: str | None = None  # the initializer it is (a view/expansion of), if any
    values: tuple[int, ...] | None = None  # small integer tensors (axes, split sizes, indices)


class _MapperBase:
    """What the walk knows so far, and the steps that turn a node into layers."""

    def __init__(self, model: ModelProto, *, lenient: bool) -> None:
        self.model = model
        self.graph = model.graph
        self.lenient = lenient
        self.opset = _default_opset(model)
        self.layers: list[dict[str, Any]] = []
        self.act: dict[str, str] = {}  # ONNX value -> layer or input name
        self.consts: dict[str, _Const] = {}
        self.names: set[str] = set()
        self.symbols: dict[str, str] = {}  # ONNX dim_param -> graph symbol
        self.shapes: dict[str, list[int | str | None]] = {}
        self.mapping: dict[str, Counter[tuple[str, ...]]] = {}
        self.unsupported: dict[str, list[str]] = {}
        self.unsupported_problems: list[tuple[str, str]] = []
        self.weight_owner: dict[str, str] = {}  # initializer -> embedding/linear layer using it
        self.tensor_layers: dict[str, str] = {}
        self.pending_bias: dict[str, dict[str, Any]] = {}  # MatMul output -> its linear layer
        self.consumers: Counter[str] = Counter(i for n in self.graph.node for i in n.input if i)
        self.unsupported_inputs: set[str] = set()
        self.supported_inputs: set[str] = set()
        self.notes: list[str] = []
        self.inputs: list[InputDecl] = []
        self.float_values: set[str] = set()
        self.folded_biases: set[str] = set()
        self.input_symbols: dict[
            tuple[str, int], str
        ] = {}  # (input, axis) -> batch / seq  # initializers added to a MatMul as its bias
        self.initializers: dict[str, TensorProto] = {}
        self.fused: dict[str, int] = {}  # exporter patterns recognised, and how many
        self.copies: dict[str, tuple[str, bool]] = {}  # from strip_weights
        self.tied_copies: set[str] = set()  # copies a layer was tied through
        self.embedding_tables: set[str] = set()  # initializers read as embedding tables
        self.nodes: list[NodeProto] = list(self.graph.node)  # after the pattern fusions
        self.synthesized: set[int] = set()  # ids of the nodes the fusions created
        self.bias_reads: Counter[str] = Counter()  # 1-d initializers added as a linear's bias
        self.shared_vectors = 0  # 1-d initializers that several layers read
        self.composite_gelu: set[str] = set()  # gelu layers PyTorch computes op by op
        self.scalars: dict[str, float] = {}  # float scalar constants (eps, ratios)
        self.not_parameters: set[str] = set()  # initializers a fold made (not the model's)
        self.restored_params = 0  # batch-norm parameters restored from provenance
        self.restored_batch_norms = 0

    # -- values

    def _name(self, node: NodeProto, index: int, suffix: str = "") -> str:
        base = _NAME_CHARS.sub("_", node.name or "").strip("/_") or f"{node.op_type}_{index}"
        base = (base[:100] + suffix) if suffix else base[:100]
        name, n = base, 1
        while name in self.names:
            n += 1
            name = f"{base}_{n}"
        self.names.add(name)
        return name

    def _add(self, layer: dict[str, Any]) -> str:
        if len(self.layers) >= MAX_STORED_LAYERS:  # stop now, not after shape inference
            raise _reject(
                f"the graph maps to more than {MAX_STORED_LAYERS} layers, the most a stored "
                "model holds"
            )
        self.layers.append(layer)
        return str(layer["name"])

    def _tensor_layer(self, value: str, like: list[int | str | None] | None = None) -> str | None:
        """A ``tensor`` layer for a constant feeding an activation op (None for scalars/ints)."""
        const = self.consts[value]
        stored = self.consts[const.origin].dims if const.origin is not None else const.dims
        if not const.is_float or stored is None or math.prod(stored) <= 1:
            return None
        if value in self.tensor_layers:
            return self.tensor_layers[value]
        shown = self.shapes.get(value)
        layer: dict[str, Any] = {"op": "tensor", "inputs": [], "shape": list(stored)}
        if (
            shown is not None
            and None in shown
            and len(shown) == len(stored)
            and stored[0] == 1
            and all(d is None or d == s for d, s in zip(shown[1:], stored[1:], strict=True))
        ):
            # An expansion whose target shape inference could not follow: the common case is
            # a [1, ...] parameter (a class token) expanded over the batch.
            shown = ["batch", *stored[1:]]
            self.notes.append(f"'{value}' taken as an expansion of [1, ...] over the batch")
        elif (
            shown is not None
            and None in shown
            and like is not None
            and None not in like
            and len(like) == len(shown)
            and all(d is None or d == e or d == 1 for d, e in zip(shown, like, strict=True))
        ):
            # A lookup (positions, token types) added to an activation: it has that shape
            # (or 1 where it broadcasts, such as positions shared by the batch).
            shown = [1 if d == 1 else e for d, e in zip(shown, like, strict=True)]
            self.notes.append(f"'{value}' taken to have the shape of the activation it joins")
        if shown is not None and shown != list(stored):
            if None in shown:
                return None
            layer["output_shape"] = shown
        if const.origin is None:
            layer["trainable"] = False
        name = re.sub(_NAME_CHARS, "_", value).strip("/_")[:100] or "tensor"
        while name in self.names:
            name += "_"
        self.names.add(name)
        layer["name"] = name
        self.tensor_layers[value] = self._add(layer)
        return name

    def _operand(self, value: str, like: list[int | str | None] | None = None) -> str | None:
        """The layer that provides ``value`` to an activation op, or None (dropped scalar)."""
        if value in self.act:
            return self.act[value]
        if value in self.consts:
            return self._tensor_layer(value, like)
        return None

    # -- bookkeeping

    def _map(self, node: NodeProto, ops: Sequence[str]) -> None:
        self.mapping.setdefault(node.op_type, Counter())[tuple(ops)] += 1
        self.supported_inputs.update(i for i in node.input if i)

    def _unsupported(self, node: NodeProto, index: int, why: str) -> None:
        label = node.op_type if node.domain in ("", "ai.onnx") else f"{node.domain}.{node.op_type}"
        self.unsupported.setdefault(label, []).append(node.name or f"#{index}")
        self.unsupported_problems.append((f"/graph/node/{index}", f"{label}: {why}"))
        self.unsupported_inputs.update(i for i in node.input if i)
        acts = [self.act[i] for i in node.input if i in self.act]
        if self.lenient and acts:
            name = self._add(
                {
                    "name": self._name(node, index),
                    "op": "opaque",
                    "source_op": _NAME_CHARS.sub("_", label)[:64],
                    "inputs": acts,
                }
            )
            for output in node.output:
                self.act[output] = name
        else:
            for output in node.output:  # keep walking: report every unsupported op at once
                if acts:
                    self.act[output] = acts[0]

    # -- attributes

    @staticmethod
    def _attr(node: NodeProto, name: str, default: Any = None) -> Any:
        for attribute in node.attribute:
            if attribute.name == name:
                return onnx.helper.get_attribute_value(attribute)
        return default

    def _ints(self, node: NodeProto, name: str, position: int) -> list[int] | None:
        """An int list given as attribute (old opsets) or as constant input ``position``."""
        value = self._attr(node, name)
        if value is not None:
            return [int(v) for v in value]
        if len(node.input) > position and node.input[position]:
            const = self.consts.get(node.input[position])
            if const is None or const.values is None:
                return None
            return list(const.values)
        return []

    def _emit(self, node: NodeProto, index: int, layer: dict[str, Any], ops: Sequence[str]) -> str:
        layer = {"name": self._name(node, index), **layer}
        name = self._add(layer)
        self.act[node.output[0]] = name
        self._map(node, ops)
        return name

    def _x(self, node: NodeProto) -> str:
        return self.act[node.input[0]]

    def _rank(self, value: str) -> int | None:
        shown = self.shapes.get(value)
        return len(shown) if shown is not None else None

    def _activation(self, node: NodeProto, index: int, op: str, **attrs: Any) -> str | None:
        self._emit(node, index, {"op": op, **attrs, "inputs": [self._x(node)]}, [op])
        return None
