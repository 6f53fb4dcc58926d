"""Op handlers of the ops that move, view or index a tensor: Identity and Cast, Flatten,
Reshape, Transpose, Concat, Gather (an embedding or a select), Slice and Split. Each
returns None when mapped, or why not.
"""

from __future__ import annotations

from onnx import NodeProto

from app.domain.graph.format import MAX_DIM
from app.importers.onnx_model.mapper_base import _MapperBase
from app.importers.onnx_model.proto import _FLOAT_TYPES


class _TensorOps(_MapperBase):
    """Handlers (``_op_<OpType>``) of the ops that view, lay out or index a tensor."""

    # -- op handlers: return None when mapped, or why not

    def _op_Identity(self, node: NodeProto, index: int) -> str | None:
        self.act[node.output[0]] = self._x(node)
        self._map(node, ())
        return None

    def _op_Cast(self, node: NodeProto, index: int) -> str | None:
        if self._attr(node, "to") not in _FLOAT_TYPES:
            return "casts an activation to a non-float type"
        return self._op_Identity(node, index)

    def _op_Flatten(self, node: NodeProto, index: int) -> str | None:
        axis = int(self._attr(node, "axis", 1))
        if axis == 1:
            return self._activation(node, index, "flatten", start_dim=1)
        return self._op_Reshape(node, index)

    def _op_Reshape(self, node: NodeProto, index: int) -> str | None:
        shown = self.shapes.get(node.output[0])
        if shown is None or not shown:
            return "shape inference could not resolve the output shape"
        target = [-1 if d is None else d for d in shown]
        if target.count(-1) > 1:
            return f"shape inference left {target.count(-1)} output dims unknown"
        self._emit(node, index, {"op": "reshape", "shape": target, "inputs": [self._x(node)]},
                   ["reshape"])  # fmt: skip
        return None

    _op_Squeeze = _op_Reshape

    _op_Unsqueeze = _op_Reshape

    def _op_Transpose(self, node: NodeProto, index: int) -> str | None:
        rank = self._rank(node.input[0])
        perm = self._attr(node, "perm")
        if perm is None:
            if rank is None:
                return "unknown rank"
            perm = list(range(rank))[::-1]
        current, order = self._x(node), list(range(len(perm)))
        swaps = []
        for position, wanted in enumerate(perm):
            at = order.index(wanted)
            if at != position:
                order[position], order[at] = order[at], order[position]
                swaps.append((position, at))
        if not swaps:
            return self._op_Identity(node, index)
        for n, (a, b) in enumerate(swaps):
            layer = {"op": "transpose", "dim0": a, "dim1": b, "inputs": [current]}
            suffix = f"_swap{n}" if len(swaps) > 1 else ""
            current = self._add({"name": self._name(node, index, suffix), **layer})
        self.act[node.output[0]] = current
        self._map(node, ["transpose"] * len(swaps))
        return None

    def _op_Concat(self, node: NodeProto, index: int) -> str | None:
        operands = [self._operand(v) for v in node.input]
        if any(o is None for o in operands):
            return "concatenates a scalar or non-float constant"
        axis = int(self._attr(node, "axis", 0))
        self._emit(node, index, {"op": "concat", "dim": axis, "inputs": operands}, ["concat"])
        return None

    def _op_Gather(self, node: NodeProto, index: int) -> str | None:
        data, indices = node.input[0], node.input[1]
        axis = int(self._attr(node, "axis", 0))
        table = self.consts.get(data)
        if table is not None and indices in self.act:
            if table.dims is None or len(table.dims) != 2 or axis != 0 or not table.is_float:
                return "only a 2-d float table indexed along axis 0 (an embedding) is supported"
            layer = {
                "op": "embedding",
                "num_embeddings": table.dims[0],
                "embedding_dim": table.dims[1],
                "inputs": [self.act[indices]],
            }
            name = self._emit(node, index, layer, ["embedding"])
            if table.origin is not None:
                self.weight_owner.setdefault(table.origin, name)
                self.embedding_tables.add(table.origin)
            return None
        picked = self.consts.get(indices)
        if data in self.act and picked is not None and picked.dims == () and picked.values:
            layer = {
                "op": "select",
                "dim": axis,
                "index": picked.values[0],
                "inputs": [self.act[data]],
            }
            self._emit(node, index, layer, ["select"])
            return None
        return "only embeddings and single-index selects are supported"

    def _op_Slice(self, node: NodeProto, index: int) -> str | None:
        if self.opset < 10:
            starts, ends = self._attr(node, "starts"), self._attr(node, "ends")
            axes, steps = self._attr(node, "axes"), None
        else:
            starts, ends = self._ints(node, "", 1), self._ints(node, "", 2)
            axes, steps = self._ints(node, "", 3), self._ints(node, "", 4)
        if not starts or not ends:
            return "starts and ends must be constants"
        axes = list(axes) if axes else list(range(len(starts)))
        steps = list(steps) if steps else [1] * len(starts)
        if any(s < 1 for s in steps):
            return "negative or zero steps are not supported"
        current = self._x(node)
        for n, (axis, start, end, step) in enumerate(zip(axes, starts, ends, steps, strict=False)):
            clamp = MAX_DIM
            layer = {
                "op": "slice",
                "dim": int(axis),
                "start": max(-clamp, min(clamp, int(start))),
                "end": max(-clamp, min(clamp, int(end))),
                "inputs": [current],
            }
            if step != 1:
                layer["step"] = int(step)
            current = self._add({"name": self._name(node, index, f"_{n}" if n else ""), **layer})
        self.act[node.output[0]] = current
        self._map(node, ["slice"] * len(axes))
        return None

    def _op_Split(self, node: NodeProto, index: int) -> str | None:
        shown = self.shapes.get(node.input[0])
        axis = int(self._attr(node, "axis", 0))
        sizes = self._ints(node, "split", 1)
        if not sizes:
            if shown is None or not isinstance(shown[axis], int):
                return "the split dimension must be known"
            total = int(shown[axis])  # type: ignore[arg-type]
            parts = len(node.output)
            sizes = [-(-total // parts)] * (parts - 1)
            sizes.append(total - sum(sizes))
        start = 0
        for n, (output, size) in enumerate(zip(node.output, sizes, strict=False)):
            layer = {
                "op": "slice",
                "dim": axis,
                "start": start,
                "end": start + size,
                "inputs": [self._x(node)],
            }
            self.act[output] = self._add({"name": self._name(node, index, f"_{n}"), **layer})
            start += size
        self._map(node, ["slice"] * len(node.output))
        return None
