"""The walk: graph inputs bound, shapes inferred with probe sizes, exporter patterns fused,
then each node (in topological order) folded, or mapped by its op handler onto layers.
"""

from __future__ import annotations

import onnx
from onnx import ModelProto, NodeProto, TensorProto

from app.domain.graph.analysis import InputDecl
from app.domain.graph.ops import TensorKind
from app.importers.onnx_model.attention import FUSED_DOMAIN, _constant_weights, fuse_attention
from app.importers.onnx_model.compute_ops import _ComputeOps
from app.importers.onnx_model.gelu import fuse_gelu
from app.importers.onnx_model.mapper_base import (
    _ELEMENTWISE_BINARY,
    _ELEMENTWISE_UNARY,
    _NAME_CHARS,
    _REDUCE,
    _SHAPE_OPS,
    _VIEW_OF_FIRST_INPUT,
    _Const,
)
from app.importers.onnx_model.mlp import fuse_mlps
from app.importers.onnx_model.norms import fuse_norms
from app.importers.onnx_model.proto import _FLOAT_TYPES, _INT_TYPES, _reject, _small_ints
from app.importers.onnx_model.rewrite import _scalar_values
from app.importers.onnx_model.tensor_ops import _TensorOps


class _Mapper(_ComputeOps, _TensorOps):
    """Walks the nodes once, building layers."""

    # -- the walk

    def run(self) -> None:
        initializers = {t.name: t for t in self.graph.initializer}
        for name, tensor in initializers.items():
            self.consts[name] = _Const(
                dims=tuple(tensor.dims),
                is_float=tensor.data_type in _FLOAT_TYPES,
                origin=name if tensor.data_type in _FLOAT_TYPES else None,
                values=_small_ints(tensor),
            )
        self.initializers = dict(initializers)
        self._bind_inputs(set(initializers))
        self._infer_shapes()
        outputs = {info.name for info in self.graph.output}
        scalars = _scalar_values(self.graph)
        self.scalars = scalars
        nodes, fused = fuse_gelu(list(self.graph.node), scalars, outputs)
        for kind, count in sorted(fused.items()):
            self.fused[f"GELU ({kind} form) -> gelu"] = count
        vectors = {name: c.dims[0] for name, c in self.consts.items()
                   if c.is_float and c.dims is not None and len(c.dims) == 1}  # fmt: skip
        ranks = {name: len(shape) for name, shape in self.shapes.items() if shape is not None}
        nodes, fused = fuse_norms(nodes, scalars, vectors, outputs, ranks)
        for kind, count in sorted(fused.items()):
            self.fused[f"{kind} written out -> {kind.lower()}"] = count
        weights = {name: c.dims for name, c in self.consts.items()
                   if c.is_float and c.dims is not None}  # fmt: skip
        weights.update(_constant_weights(nodes))
        nodes, fused = fuse_attention(nodes, scalars, outputs, weights, self.shapes)
        for kind, count in sorted(fused.items()):
            self.fused[f"{kind} attention written out -> attention"] = count
        original = {id(node) for node in self.graph.node}
        self.synthesized = {id(n) for n in nodes if id(n) not in original}
        self.nodes = nodes
        for index, node in enumerate(nodes):
            self._node(node, index)
        widths: dict[str, int] = {}
        for value, layer in self.act.items():
            shown = self.shapes.get(value)
            if shown and isinstance(shown[-1], int):
                widths[layer] = shown[-1]
        self.layers, fused = fuse_mlps(self.layers, widths, self.composite_gelu)
        for kind, count in sorted(fused.items()):
            self.fused[f"feed-forward ({kind}) written out -> mlp"] = count

    def _infer_shapes(self) -> None:
        """Every value's shape, with ``batch`` and ``seq`` where they are symbolic.

        ONNX shape inference runs twice with the symbolic input dims set to two different
        probe sizes; a dim that follows the probes is that symbol, a dim that stays put is a
        number, anything else (a product such as batch x heads) is unknown.
        """
        runs = [_infer(_with_probe_dims(self.model, self.input_symbols, probe)) for probe in
                _PROBES]  # fmt: skip
        seen: dict[str, list[list[int | None]]] = {}
        for run in runs:
            for info in [*run.graph.value_info, *run.graph.output, *run.graph.input]:
                tensor_type = info.type.tensor_type
                if tensor_type.elem_type in _FLOAT_TYPES:
                    self.float_values.add(info.name)
                if not tensor_type.HasField("shape"):
                    continue
                dims = [int(d.dim_value) if d.HasField("dim_value") else None
                        for d in tensor_type.shape.dim]  # fmt: skip
                seen.setdefault(info.name, []).append(dims)
        for name, found in seen.items():
            if len(found) != len(runs) or len({len(dims) for dims in found}) != 1:
                continue
            merged: list[int | str | None] = []
            for values in zip(*found, strict=True):
                if None in values:
                    merged.append(None)
                elif len(set(values)) == 1:
                    merged.append(values[0])
                else:
                    merged.append(next((symbol for symbol, sizes in _PROBE_SIZES.items()
                                        if tuple(values) == sizes), None))  # fmt: skip
            self.shapes[name] = merged

    def _bind_inputs(self, initializer_names: set[str]) -> None:
        for info in self.graph.input:
            if info.name in initializer_names:
                continue
            tensor_type = info.type.tensor_type
            if not info.type.HasField("tensor_type"):
                raise _reject(f"input '{info.name}' is not a tensor", "/graph/input")
            if tensor_type.elem_type in _FLOAT_TYPES:
                kind = TensorKind.FLOAT
            elif tensor_type.elem_type in _INT_TYPES:
                kind = TensorKind.INDEX
            else:
                raise _reject(
                    f"input '{info.name}' has element type "
                    f"{TensorProto.DataType.Name(tensor_type.elem_type)}; only float and integer "
                    "inputs are imported",
                    "/graph/input",
                )
            shape: list[int | str] = []
            for axis, dim in enumerate(tensor_type.shape.dim):
                if dim.HasField("dim_value") and dim.dim_value > 0:
                    shape.append(int(dim.dim_value))
                    continue
                symbol = self.symbols.get(dim.dim_param) if dim.HasField("dim_param") else None
                if symbol is None:
                    if axis == 0:
                        symbol = "batch"
                    elif axis == 1 and kind is TensorKind.INDEX:
                        symbol = "seq"
                    else:
                        raise _reject(
                            f"input '{info.name}' dim {axis} is symbolic "
                            f"({dim.dim_param or 'unnamed'}); only the batch dim (0) and the "
                            "sequence dim (1) of token ids may be: export with fixed sizes",
                            "/graph/input",
                        )
                    if dim.dim_param:
                        self.symbols[dim.dim_param] = symbol
                shape.append(symbol)
                self.input_symbols[(info.name, axis)] = symbol
            if not shape:
                raise _reject(f"input '{info.name}' is a scalar; expected a tensor", "/graph/input")
            name = _NAME_CHARS.sub("_", info.name).strip("_")[:64] or "input"
            if not name[0].isalpha():
                name = f"x{name}"[:64]
            self.names.add(name)
            self.inputs.append(InputDecl(name=name, shape=tuple(shape), kind=kind))
            self.act[info.name] = name
            if isinstance(shape[0], int):
                self.notes.append(
                    f"input '{info.name}' has a fixed batch dimension {shape[0]}: estimates use "
                    "that batch size (export with a dynamic batch axis to vary it)"
                )
        if not self.inputs:
            raise _reject("the graph has no inputs besides its initializers", "/graph/input")

    def _node(self, node: NodeProto, index: int) -> None:
        op = node.op_type
        if id(node) in self.synthesized and node.domain == FUSED_DOMAIN:
            why = self._fused_attention(node, index)
            if why:
                self._unsupported(node, index, why)
            return
        if node.domain not in ("", "ai.onnx"):
            self._unsupported(node, index, f"custom domain '{node.domain}' is not supported")
            return
        acts = [i for i in node.input if i in self.act]
        if op in _SHAPE_OPS or (not acts and op not in ("Constant",)):
            self._fold(node)
            return
        if op == "Constant":
            self._constant(node)
            return
        handler = getattr(self, f"_op_{op}", None)
        why = handler(node, index) if handler is not None else "no mapping for this op"
        if why:
            self._unsupported(node, index, why)

    def _fold(self, node: NodeProto) -> None:
        """A node computed on constants and shapes only: no layer; its outputs are constants."""
        origin = None
        if node.op_type in _VIEW_OF_FIRST_INPUT:
            source = self.consts.get(node.input[0]) if node.input else None
            origin = source.origin if source is not None else None
        if node.op_type == "Identity" and origin is not None:
            # The TorchScript exporter stores equal parameters once and names each user's copy
            # with an Identity: each copy is a parameter of the source model.
            origin = node.output[0]
            self.initializers[origin] = self.initializers[node.input[0]]
            self.consts[origin] = _Const(dims=self.consts[node.input[0]].dims, is_float=True,
                                         origin=origin)  # fmt: skip
            self._map(node, ())
            return
        for output in node.output:
            shown = self.shapes.get(output)
            dims = (
                tuple(d for d in shown if isinstance(d, int))
                if shown is not None and all(isinstance(d, int) for d in shown)
                else None
            )
            is_float = origin is not None or (
                node.op_type not in _SHAPE_OPS and self._float_output(output)
            )
            self.consts[output] = _Const(dims=dims, is_float=is_float, origin=origin)
        self._map(node, ())

    def _float_output(self, value: str) -> bool:
        return value in self.float_values

    def _constant(self, node: NodeProto) -> None:
        tensor = self._attr(node, "value")
        if isinstance(tensor, TensorProto):
            is_float = tensor.data_type in _FLOAT_TYPES
            self.consts[node.output[0]] = _Const(
                dims=tuple(tensor.dims),
                is_float=is_float,
                origin=node.output[0] if is_float else None,
                values=_small_ints(tensor),
            )
            # Exporters store some weights as Constant nodes: they count like initializers.
            self.initializers[node.output[0]] = tensor
        else:
            ints = self._attr(node, "value_ints")
            single = self._attr(node, "value_int")
            values = tuple(ints) if ints is not None else (single,) if single is not None else None
            self.consts[node.output[0]] = _Const(
                dims=(len(ints),) if ints is not None else (), is_float=False, values=values
            )
        self._map(node, ())


_PROBES: tuple[dict[str, int], ...] = ({"batch": 7, "seq": 13}, {"batch": 11, "seq": 17})
_PROBE_SIZES = {symbol: tuple(probe[symbol] for probe in _PROBES) for symbol in _PROBES[0]}


def _with_probe_dims(
    model: ModelProto, symbols: dict[tuple[str, int], str], probe: dict[str, int]
) -> ModelProto:
    """A copy of ``model`` whose symbolic input dims are set to the probe's sizes."""
    probed = ModelProto()
    probed.CopyFrom(model)
    del probed.graph.value_info[:]
    for info in probed.graph.input:
        for axis, dim in enumerate(info.type.tensor_type.shape.dim):
            symbol = symbols.get((info.name, axis))
            if symbol is not None:
                dim.Clear()
                dim.dim_value = probe[symbol]
    return probed


def _infer(model: ModelProto) -> ModelProto:
    try:
        return onnx.shape_inference.infer_shapes(
            model, check_type=False, strict_mode=False, data_prop=True
        )
    except Exception as exc:  # onnx raises several unrelated types (InferenceError, ...)
        raise _reject(f"ONNX shape inference failed: {exc}".split("\n")[0][:500]) from exc


for _op, _function in _ELEMENTWISE_UNARY.items():
    if _op != "Clip":  # Clip's bounds are inputs 1 and 2, not operands
        setattr(
            _Mapper,
            f"_op_{_op}",
            lambda self, node, index, _f=_function: self._elementwise(
                node, index, _f, [node.input[0]]
            ),
        )
for _op in _ELEMENTWISE_BINARY:
    setattr(_Mapper, f"_op_{_op}", _Mapper._binary)
for _op in _REDUCE:
    setattr(_Mapper, f"_op_{_op}", _Mapper._reduce)
