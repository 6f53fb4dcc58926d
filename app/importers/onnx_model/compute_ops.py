"""Op handlers of the ops that compute: activations, element-wise and binary ops, linear
layers (a following bias Add folded in), convolutions, pooling, norms, recurrent layers,
reductions and the fused attention. Each returns None when mapped, or why not.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import onnx
from onnx import NodeProto

from app.importers.onnx_model.mapper_base import _ELEMENTWISE_BINARY, _REDUCE, _Const, _MapperBase
from app.importers.onnx_model.norms import _folded_batch_norm


class _ComputeOps(_MapperBase):
    """Handlers (``_op_<OpType>``) of the ops that compute on an activation."""

    def _op_Dropout(self, node: NodeProto, index: int) -> str | None:
        ratio = self._attr(node, "ratio", 0.5)
        if len(node.input) > 1 and node.input[1]:  # a ratio input (opset 12+)
            ratio = round(self.scalars.get(node.input[1], 0.5), 6)  # float32 0.1 reads 0.1
            if not 0.0 <= ratio < 1.0:
                ratio = 0.5
        self._emit(node, index, {"op": "dropout", "p": float(ratio), "inputs": [self._x(node)]},
                   ["dropout"])  # fmt: skip
        return None

    def _op_Relu(self, node: NodeProto, index: int) -> str | None:
        return self._activation(node, index, "relu")

    def _op_Sigmoid(self, node: NodeProto, index: int) -> str | None:
        return self._activation(node, index, "sigmoid")

    def _op_Tanh(self, node: NodeProto, index: int) -> str | None:
        return self._activation(node, index, "tanh")

    def _op_Gelu(self, node: NodeProto, index: int) -> str | None:
        if self._attr(node, "approximate", b"none") in (b"tanh", "tanh"):
            self._activation(node, index, "gelu", approximate="tanh")
            if id(node) in self.synthesized and self._attr(node, "composite", 0):
                self.composite_gelu.add(self.layers[-1]["name"])
            return None
        return self._activation(node, index, "gelu")

    def _fused_attention(self, node: NodeProto, index: int) -> str | None:
        """The ``Attention`` node of :func:`fuse_attention` -> one ``attention`` layer."""
        attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
        if node.input[0] not in self.act:
            return "the attention's input is not an activation"
        layer: dict[str, Any] = {
            "op": "attention",
            "num_heads": int(attrs["num_heads"]),
            "num_kv_heads": int(attrs["num_kv_heads"]),
            "head_dim": int(attrs["head_dim"]),
            "causal": bool(attrs["causal"]),
            "qkv_bias": bool(attrs["qkv_bias"]),
            "out_bias": bool(attrs["out_bias"]),
            "inputs": [self.act[node.input[0]]],
        }
        if attrs["rotary"]:
            layer["rotary"] = True
        if attrs["dropout"] > 0:  # a float32 attribute: 0.1 reads back 0.10000000149
            layer["dropout"] = round(float(attrs["dropout"]), 6)
        self._emit(node, index, layer, ["attention"])
        return None

    def _op_Softmax(self, node: NodeProto, index: int) -> str | None:
        rank = self._rank(node.input[0])
        axis = int(self._attr(node, "axis", -1 if self.opset >= 13 else 1))
        if self.opset < 13 and rank is not None and axis not in (-1, rank - 1):
            return "opset < 13 Softmax over several flattened axes is not supported"
        return self._activation(node, index, "softmax", dim=axis)

    def _op_Clip(self, node: NodeProto, index: int) -> str | None:
        return self._elementwise(node, index, "clip", [node.input[0]])

    def _elementwise(
        self, node: NodeProto, index: int, function: str, values: Sequence[str]
    ) -> str | None:
        like = next((self.shapes.get(v) for v in values if v in self.act), None)
        operands = [name for v in values if v and (name := self._operand(v, like)) is not None]
        if not operands:
            return "no floating-point operand"
        self._emit(
            node, index, {"op": "elementwise", "function": function, "inputs": operands},
            ["elementwise"],
        )  # fmt: skip
        return None

    def _binary(self, node: NodeProto, index: int) -> str | None:
        function = _ELEMENTWISE_BINARY[node.op_type]
        values = list(node.input[1:] if node.op_type == "Where" else node.input)
        if node.op_type == "Add" and len(values) == 2:
            folded = self._fold_bias(node, values)
            if folded:
                return None
            a, b = values
            shape_a, shape_b = self.shapes.get(a), self.shapes.get(b)
            if (
                a in self.act
                and b in self.act
                and shape_a is not None
                and shape_a == shape_b
                and None not in shape_a
            ):
                self._emit(node, index, {"op": "add", "inputs": [self.act[a], self.act[b]]},
                           ["add"])  # fmt: skip
                return None
        return self._elementwise(node, index, function, values)

    def _fold_bias(self, node: NodeProto, values: Sequence[str]) -> bool:
        """``MatMul`` then ``Add`` of a 1-d weight: the linear layer's bias."""
        for act_value, const_value in (values, values[::-1]):
            linear = self.pending_bias.get(act_value)
            const = self.consts.get(const_value)
            if (
                linear is not None
                and const is not None
                and const.origin is not None
                and const.dims == (linear["out_features"],)
                and self.consumers[act_value] == 1
            ):
                linear["bias"] = True
                self.folded_biases.add(const_value)
                self.bias_reads[const.origin] += 1
                self.act[node.output[0]] = linear["name"]
                del self.pending_bias[act_value]
                self._map(node, ("linear.bias",))
                return True
        return False

    def _linear(
        self, node: NodeProto, index: int, weight: _Const, out_features: int, bias: bool
    ) -> dict[str, Any]:
        layer: dict[str, Any] = {"op": "linear", "out_features": out_features, "bias": bias}
        owner = self.weight_owner.get(weight.origin or "")
        copy = self.copies.get(weight.origin or "")
        if owner is None and copy is not None and copy[0] in self.embedding_tables:
            owner = self.weight_owner.get(copy[0])
            if owner is not None:
                self.tied_copies.add(weight.origin or "")
                self.notes.append(
                    f"'{weight.origin}' is a {'transposed ' if copy[1] else ''}copy of "
                    f"'{copy[0]}': the layer is tied to '{owner}' (one parameter tensor)"
                )
        if owner is not None:
            layer["tied_to"] = owner
        layer["inputs"] = [self._x(node)]
        name = self._emit(node, index, layer, ["linear"])
        if weight.origin is not None and owner is None:
            self.weight_owner[weight.origin] = name
        return self.layers[-1]

    def _op_MatMul(self, node: NodeProto, index: int) -> str | None:
        a, b = node.input[0], node.input[1]
        weight = self.consts.get(b)
        if a in self.act and weight is not None:
            if weight.dims is None or len(weight.dims) != 2 or not weight.is_float:
                return "a constant right operand must be a 2-d float weight"
            layer = self._linear(node, index, weight, weight.dims[1], bias=False)
            self.pending_bias[node.output[0]] = layer
            return None
        left, right = self._operand(a), self._operand(b)
        if left is None or right is None:
            return "operands must be float tensors of rank >= 1"
        self._emit(node, index, {"op": "matmul", "inputs": [left, right]}, ["matmul"])
        return None

    def _op_Gemm(self, node: NodeProto, index: int) -> str | None:
        weight = self.consts.get(node.input[1])
        if node.input[0] not in self.act or weight is None or weight.dims is None:
            return "only activation x constant weight is supported"
        if self._attr(node, "transA", 0):
            return "transA=1 is not supported"
        if len(weight.dims) != 2:
            return "the weight must be 2-d"
        trans_b = bool(self._attr(node, "transB", 0))
        out_features = weight.dims[0] if trans_b else weight.dims[1]
        bias = len(node.input) > 2 and node.input[2] in self.consts
        if bias:
            self.supported_inputs.add(node.input[2])
        self._linear(node, index, weight, out_features, bias)
        return None

    def _conv3d(self, node: NodeProto, index: int, op: str) -> str | None:
        """``Conv`` / ``ConvTranspose`` with three spatial dims -> ``conv3d`` /
        ``conv_transpose3d`` (symmetric pads only)."""
        weight = self.consts.get(node.input[1])
        assert weight is not None
        assert weight.dims is not None
        pads = list(self._attr(node, "pads", [0] * 6))
        auto = self._attr(node, "auto_pad", b"NOTSET")
        if (auto.decode() if isinstance(auto, bytes) else str(auto)) not in ("NOTSET", "VALID"):
            return "auto_pad SAME on a 3-d convolution is not supported"
        if len(pads) != 6 or pads[:3] != pads[3:]:
            return f"asymmetric pads {pads} are not supported"
        groups = int(self._attr(node, "group", 1))
        transposed = op == "conv_transpose3d"
        if transposed and (self._attr(node, "output_shape", None) is not None):
            return "ConvTranspose with an explicit output_shape is not supported"
        layer: dict[str, Any] = {
            "op": op,
            "out_channels": weight.dims[1] * groups if transposed else weight.dims[0],
            "kernel_size": list(weight.dims[2:]),
            "stride": list(self._attr(node, "strides", [1, 1, 1])),
            "padding": pads[:3],
            "dilation": list(self._attr(node, "dilations", [1, 1, 1])),
            "groups": groups,
            "bias": len(node.input) > 2 and bool(node.input[2]),
            "inputs": [self._x(node)],
        }
        if transposed:
            layer["output_padding"] = list(self._attr(node, "output_padding", [0, 0, 0]))
        self._emit(node, index, layer, [op])
        return None

    def _op_ConvTranspose(self, node: NodeProto, index: int) -> str | None:
        weight = self.consts.get(node.input[1])
        if weight is None or weight.dims is None or len(weight.dims) != 5:
            return "only 3-d transposed convolutions with a constant weight are supported"
        return self._conv3d(node, index, "conv_transpose3d")

    def _op_InstanceNormalization(self, node: NodeProto, index: int) -> str | None:
        if self._rank(node.input[0]) not in (5, None):
            return "only 5-d (N, C, D, H, W) instance norm is supported"
        if not all(name in self.consts for name in node.input[1:3]):
            return "scale and bias must be constants"
        eps = float(self._attr(node, "epsilon", 1e-5))
        return self._activation(node, index, "instancenorm3d", eps=eps, affine=True)

    def _op_Conv(self, node: NodeProto, index: int) -> str | None:
        weight = self.consts.get(node.input[1])
        if weight is not None and weight.dims is not None and len(weight.dims) == 5:
            if _folded_batch_norm(node) is not None:
                return "a batch norm folded into a 3-d convolution is not supported"
            return self._conv3d(node, index, "conv3d")
        if weight is None or weight.dims is None or len(weight.dims) != 4:
            return "only 2-d and 3-d convolutions with a constant weight are supported"
        padding = self._padding(node, weight.dims[2:])
        if isinstance(padding, str) and padding not in ("same", "valid"):
            return padding
        layer: dict[str, Any] = {
            "op": "conv2d",
            "out_channels": weight.dims[0],
            "kernel_size": list(weight.dims[2:]),
            "stride": list(self._attr(node, "strides", [1, 1])),
            "padding": padding,
            "dilation": list(self._attr(node, "dilations", [1, 1])),
            "groups": int(self._attr(node, "group", 1)),
            "bias": len(node.input) > 2 and bool(node.input[2]),
            "inputs": [self._x(node)],
        }
        folded = _folded_batch_norm(node)
        if folded is None:
            self._emit(node, index, layer, ["conv2d"])
            return None
        # The dynamo exporter's optimizer folded a batch norm into this convolution (in train
        # mode too); its provenance still names the batch norm: restore it after the conv.
        affine, eps = folded
        bias = node.input[2] if layer["bias"] else ""
        if bias and bias == f"{node.input[1]}_bias":  # the fold's own bias: the conv had none
            layer["bias"] = False
            self.not_parameters.add(bias)
        conv = self._add({"name": self._name(node, index), **layer})
        norm: dict[str, Any] = {"op": "batchnorm2d", "eps": eps, "inputs": [conv]}
        if not affine:
            norm["affine"] = False
        self.act[node.output[0]] = self._add({"name": self._name(node, index, "_bn"), **norm})
        self.restored_params += 2 * weight.dims[0] if affine else 0
        self.restored_batch_norms += 1
        self._map(node, ["conv2d", "batchnorm2d"])
        return None

    def _padding(self, node: NodeProto, kernel: Sequence[int]) -> list[int] | str:
        auto = self._attr(node, "auto_pad", b"NOTSET")
        auto = auto.decode() if isinstance(auto, bytes) else str(auto)
        if auto == "VALID":
            return [0, 0]
        if auto in ("SAME_UPPER", "SAME_LOWER"):
            strides = list(self._attr(node, "strides", [1, 1]))
            if strides == [1, 1] and all(k % 2 for k in kernel):
                return [(k - 1) // 2 for k in kernel]
            return f"auto_pad {auto} with stride or even kernel is not supported"
        pads = list(self._attr(node, "pads", [0, 0, 0, 0]))
        if len(pads) != 4 or pads[:2] != pads[2:]:
            return f"asymmetric pads {pads} are not supported"
        return pads[:2]

    def _pool(self, node: NodeProto, index: int, op: str) -> str | None:
        if self._rank(node.input[0]) not in (4, None):
            return "only 2-d pooling is supported"
        kernel = list(self._attr(node, "kernel_shape", []))
        if len(kernel) != 2:
            return "only 2-d pooling is supported"
        if any(d != 1 for d in self._attr(node, "dilations", [1, 1])):
            return "dilated pooling is not supported"
        padding = self._padding(node, kernel)
        if isinstance(padding, str):
            return padding
        layer = {
            "op": op,
            "kernel_size": kernel,
            "stride": list(self._attr(node, "strides", [1, 1])),
            "padding": padding,
            "ceil_mode": bool(self._attr(node, "ceil_mode", 0)),
            "inputs": [self._x(node)],
        }
        self._emit(node, index, layer, [op])
        return None

    def _op_MaxPool(self, node: NodeProto, index: int) -> str | None:
        if len(node.output) > 1 and node.output[1]:
            return "MaxPool with an Indices output is not supported"
        return self._pool(node, index, "maxpool2d")

    def _op_AveragePool(self, node: NodeProto, index: int) -> str | None:
        return self._pool(node, index, "avgpool2d")

    def _op_GlobalAveragePool(self, node: NodeProto, index: int) -> str | None:
        if self._rank(node.input[0]) not in (4, None):
            return "only 4-d inputs are supported"
        return self._activation(node, index, "adaptive_avgpool2d", output_size=1)

    def _op_GlobalMaxPool(self, node: NodeProto, index: int) -> str | None:
        if self._rank(node.input[0]) not in (4, None):
            return "only 4-d inputs are supported"
        return self._activation(node, index, "adaptive_maxpool2d", output_size=1)

    def _op_BatchNormalization(self, node: NodeProto, index: int) -> str | None:
        if self._rank(node.input[0]) not in (4, None):
            return "only 4-d (N, C, H, W) batch norm is supported"
        if any(o for o in node.output[1:]):
            return "training-mode BatchNormalization outputs are not supported"
        eps = float(self._attr(node, "epsilon", 1e-5))
        return self._activation(node, index, "batchnorm2d", eps=eps)

    def _norm(self, node: NodeProto, index: int, op: str, **attrs: Any) -> str | None:
        rank = self._rank(node.input[0])
        axis = int(self._attr(node, "axis", -1))
        if axis != -1 and (rank is None or axis != rank - 1):
            return f"normalization over axis {axis} (not the last) is not supported"
        return self._activation(node, index, op, eps=float(self._attr(node, "epsilon", 1e-5)),
                                **attrs)  # fmt: skip

    def _op_LayerNormalization(self, node: NodeProto, index: int) -> str | None:
        bias = len(node.input) > 2 and bool(node.input[2])
        return self._norm(node, index, "layernorm", **({} if bias else {"bias": False}))

    def _op_RMSNormalization(self, node: NodeProto, index: int) -> str | None:
        return self._norm(node, index, "rmsnorm")

    def _op_LSTM(self, node: NodeProto, index: int) -> str | None:
        return self._recurrent(node, index, "lstm", gates=4)

    def _op_GRU(self, node: NodeProto, index: int) -> str | None:
        return self._recurrent(node, index, "gru", gates=3)

    def _op_RNN(self, node: NodeProto, index: int) -> str | None:
        activations = [a.decode() if isinstance(a, bytes) else str(a)
                       for a in self._attr(node, "activations", [b"Tanh"])]  # fmt: skip
        if len(set(activations)) != 1 or activations[0] not in ("Tanh", "Relu"):
            return f"activations {activations}: only Tanh or Relu, the same in both directions"
        if self._attr(node, "clip") is not None:
            return "cell clipping is not supported"
        return self._recurrent(node, index, "rnn", gates=1, nonlinearity=activations[0].lower())

    def _recurrent(
        self, node: NodeProto, index: int, op: str, gates: int, nonlinearity: str = "tanh"
    ) -> str | None:
        """ONNX LSTM / GRU / RNN (one layer, one or two directions) -> the graph's recurrent op.

        ONNX's X is [S, N, D] (layout 0, what torch.onnx.export emits) or [N, S, D] (layout 1);
        Y is [S, dirs, N, H] (or [N, S, dirs, H]) and Y_h / Y_c are [dirs, N, H] (or
        [N, dirs, H]). The layer runs batch-first; views give Y and Y_h / Y_c their ONNX shapes,
        the last step's state standing for Y_h and Y_c (what memory needs: their size).
        """
        weights = [self.consts.get(node.input[i]) if len(node.input) > i else None
                   for i in (1, 2, 3)]  # fmt: skip
        w, r, b = weights
        if w is None or r is None or w.dims is None or r.dims is None or len(w.dims) != 3:
            return "W and R must be constant [directions, gates x hidden, size] weights"
        if len(node.input) > 7 and node.input[7]:
            return "peephole weights (P) are not supported"
        if len(node.input) > 4 and node.input[4] and node.input[4] in self.act:
            return "per-sequence lengths (sequence_lens) are not supported"
        hidden = int(self._attr(node, "hidden_size", 0) or w.dims[1] // gates)
        directions = w.dims[0]
        layout = int(self._attr(node, "layout", 0))
        shape = self.shapes.get(node.input[0])
        if shape is None or len(shape) != 3:
            return "the input must be a known [S, N, D] or [N, S, D] tensor"
        if w.dims[1] != gates * hidden or directions not in (1, 2):
            return f"W is {list(w.dims)}, expected [1 or 2, {gates} x {hidden}, size]"
        seq_dim, batch_dim = (0, 1) if layout == 0 else (1, 0)
        current = self._x(node)
        if layout == 0:
            current = self._add({"name": self._name(node, index, "_batch_first"), "op": "transpose",
                                 "dim0": 0, "dim1": 1, "inputs": [current]})  # fmt: skip
        layer: dict[str, Any] = {"op": op, "hidden_size": hidden, "bidirectional": directions == 2,
                                 "bias": b is not None, "inputs": [current]}  # fmt: skip
        if op == "rnn" and nonlinearity != "tanh":
            layer["nonlinearity"] = nonlinearity
        current = self._add({"name": self._name(node, index), **layer})
        n, seq = shape[batch_dim], shape[seq_dim]
        split = [
            -1 if n is None else n,
            -1 if seq is None or n is None else seq,
            directions,
            hidden,
        ]
        if split.count(-1) > 1:
            return "shape inference left the batch and sequence sizes unknown"
        current = self._add({"name": self._name(node, index, "_directions"), "op": "reshape",
                             "shape": split, "inputs": [current]})  # fmt: skip
        ops = ["transpose", op, "reshape"] if layout == 0 else [op, "reshape"]
        if layout == 0:  # [N, S, d, H] -> [S, d, N, H]
            for n_swap, (a, c) in enumerate(((0, 1), (1, 2))):
                current = self._add({"name": self._name(node, index, f"_y{n_swap}"),
                                     "op": "transpose", "dim0": a, "dim1": c,
                                     "inputs": [current]})  # fmt: skip
                ops.append("transpose")
            state_dim = 0  # Y_h from Y [S, d, N, H]: the last step
        else:
            state_dim = 1  # from Y [N, S, d, H]
        if node.output and node.output[0]:
            self.act[node.output[0]] = current
        state = None
        for output in node.output[1:]:
            if output:
                if state is None:
                    state = self._add({"name": self._name(node, index, "_state"), "op": "select",
                                       "dim": state_dim, "index": -1,
                                       "inputs": [current]})  # fmt: skip
                    ops.append("select")
                self.act[output] = state
        self._map(node, ops)
        return None

    def _reduce(self, node: NodeProto, index: int) -> str | None:
        rank = self._rank(node.input[0])
        axes = self._ints(node, "axes", 1)
        if not axes:
            if rank is None:
                return "reducing every axis of an unknown rank"
            axes = list(range(rank))
        if rank is not None:
            axes = [a % rank for a in axes]
        keep = bool(self._attr(node, "keepdims", 1))
        current = self._x(node)
        for n, axis in enumerate(sorted(axes, reverse=True)):
            layer = {
                "op": "reduce",
                "dim": axis,
                "keepdim": keep,
                "function": _REDUCE[node.op_type],
                "inputs": [current],
            }
            current = self._add({"name": self._name(node, index, f"_{n}" if n else ""), **layer})
        self.act[node.output[0]] = current
        self._map(node, ["reduce"] * len(axes))
        return None
