"""Small ONNX models built with ``onnx.helper``, for the importer and API tests."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 17


def _init(name: str, *shape: int, dtype: type = np.float32) -> onnx.TensorProto:
    rng = np.random.default_rng(len(name))
    return numpy_helper.from_array(rng.standard_normal(shape).astype(dtype), name)


def _ints(name: str, values: list[int]) -> onnx.TensorProto:
    return numpy_helper.from_array(np.array(values, dtype=np.int64), name)


def _model(
    nodes: list[onnx.NodeProto],
    inputs: list[onnx.ValueInfoProto],
    outputs: list[onnx.ValueInfoProto],
    initializers: list[onnx.TensorProto],
    *,
    name: str = "test",
    opset: int = OPSET,
) -> bytes:
    graph = helper.make_graph(nodes, name, inputs, outputs, initializers)
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", opset)], producer_name="capplan-tests"
    )
    model.ir_version = 8
    return bytes(model.SerializeToString())


def small_cnn() -> bytes:
    """Conv-BN-ReLU-MaxPool, a residual Add, GlobalAveragePool, Flatten, Gemm, Softmax.

    Parameters: conv1 3*16*9 + 16 = 448, bn 32, conv2 16*16*9 + 16 = 2320, fc 16*10 + 10 = 170:
    2,970 (the batch-norm running mean and variance, 32 elements, are buffers).
    """
    x = helper.make_tensor_value_info("image", TensorProto.FLOAT, ["N", 3, 32, 32])
    y = helper.make_tensor_value_info("probs", TensorProto.FLOAT, ["N", 10])
    inits = [
        _init("conv1.weight", 16, 3, 3, 3), _init("conv1.bias", 16),
        _init("bn.weight", 16), _init("bn.bias", 16),
        _init("bn.running_mean", 16), _init("bn.running_var", 16),
        _init("conv2.weight", 16, 16, 3, 3), _init("conv2.bias", 16),
        _init("fc.weight", 10, 16), _init("fc.bias", 10),
    ]  # fmt: skip
    nodes = [
        helper.make_node("Conv", ["image", "conv1.weight", "conv1.bias"], ["c1"],
                         name="/conv1/Conv", pads=[1, 1, 1, 1], kernel_shape=[3, 3]),
        helper.make_node("BatchNormalization",
                         ["c1", "bn.weight", "bn.bias", "bn.running_mean", "bn.running_var"],
                         ["b1"], name="/bn/BatchNormalization", epsilon=1e-5),
        helper.make_node("Relu", ["b1"], ["r1"], name="/relu/Relu"),
        helper.make_node("MaxPool", ["r1"], ["p1"], name="/pool/MaxPool", kernel_shape=[2, 2],
                         strides=[2, 2]),
        helper.make_node("Conv", ["p1", "conv2.weight", "conv2.bias"], ["c2"], name="/conv2/Conv",
                         pads=[1, 1, 1, 1], kernel_shape=[3, 3]),
        helper.make_node("Add", ["c2", "p1"], ["res"], name="/Add"),
        helper.make_node("GlobalAveragePool", ["res"], ["gap"], name="/gap/GlobalAveragePool"),
        helper.make_node("Flatten", ["gap"], ["flat"], name="/Flatten", axis=1),
        helper.make_node("Gemm", ["flat", "fc.weight", "fc.bias"], ["logits"], name="/fc/Gemm",
                         transB=1),
        helper.make_node("Softmax", ["logits"], ["probs"], name="/Softmax", axis=-1),
    ]  # fmt: skip
    return _model(nodes, [x], [y], inits, name="small-cnn")


def tiny_attention(hidden: int = 16, heads: int = 2, vocab: int = 50, tied: bool = True) -> bytes:
    """Embedding, LayerNormalization, single-head-split self-attention written as MatMuls,
    Reshape/Transpose/Softmax, an MLP with Gelu, and an LM head tied to the embedding
    (MatMul with the transposed table).

    Parameters: embedding 50*16 = 800, ln 32, q/k/v/o 4*(16*16 + 16) = 1088, mlp
    16*32 + 32 + 32*16 + 16 = 1072, final ln 32, head tied: 3,024.
    """
    ids = helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "sequence"])
    out = helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", "sequence", vocab])
    head = hidden // heads
    inits = [
        _init("wte", vocab, hidden), _init("ln.weight", hidden), _init("ln.bias", hidden),
        _init("q.weight", hidden, hidden), _init("q.bias", hidden),
        _init("k.weight", hidden, hidden), _init("k.bias", hidden),
        _init("v.weight", hidden, hidden), _init("v.bias", hidden),
        _init("o.weight", hidden, hidden), _init("o.bias", hidden),
        _init("up.weight", hidden, 2 * hidden), _init("up.bias", 2 * hidden),
        _init("down.weight", 2 * hidden, hidden), _init("down.bias", hidden),
        _init("lnf.weight", hidden), _init("lnf.bias", hidden),
        _init("scale", 1), _ints("heads_shape", [0, 0, heads, head]),
        _ints("merge_shape", [0, 0, hidden]),
    ]  # fmt: skip
    nodes = [
        helper.make_node("Gather", ["wte", "input_ids"], ["emb"], name="/wte/Gather"),
        helper.make_node("LayerNormalization", ["emb", "ln.weight", "ln.bias"], ["h"],
                         name="/ln/LayerNormalization", axis=-1, epsilon=1e-5),
    ]  # fmt: skip
    for proj in ("q", "k", "v"):
        nodes += [
            helper.make_node("MatMul", ["h", f"{proj}.weight"], [f"{proj}_mm"],
                             name=f"/{proj}/MatMul"),
            helper.make_node("Add", [f"{proj}_mm", f"{proj}.bias"], [f"{proj}_lin"],
                             name=f"/{proj}/Add"),
            helper.make_node("Reshape", [f"{proj}_lin", "heads_shape"], [f"{proj}_heads"],
                             name=f"/{proj}/Reshape"),
            helper.make_node("Transpose", [f"{proj}_heads"], [f"{proj}_t"],
                             name=f"/{proj}/Transpose",
                             perm=[0, 2, 3, 1] if proj == "k" else [0, 2, 1, 3]),
        ]  # fmt: skip
    nodes += [
        helper.make_node("MatMul", ["q_t", "k_t"], ["scores"], name="/attn/MatMul"),
        helper.make_node("Mul", ["scores", "scale"], ["scaled"], name="/attn/Mul"),
        helper.make_node("Softmax", ["scaled"], ["probs"], name="/attn/Softmax", axis=-1),
        helper.make_node("MatMul", ["probs", "v_t"], ["ctx"], name="/attn/MatMul_1"),
        helper.make_node("Transpose", ["ctx"], ["ctx_t"], name="/attn/Transpose",
                         perm=[0, 2, 1, 3]),
        helper.make_node("Reshape", ["ctx_t", "merge_shape"], ["merged"], name="/attn/Reshape"),
        helper.make_node("MatMul", ["merged", "o.weight"], ["o_mm"], name="/o/MatMul"),
        helper.make_node("Add", ["o_mm", "o.bias"], ["attn"], name="/o/Add"),
        helper.make_node("Add", ["h", "attn"], ["h2"], name="/residual/Add"),
        helper.make_node("MatMul", ["h2", "up.weight"], ["up_mm"], name="/up/MatMul"),
        helper.make_node("Add", ["up_mm", "up.bias"], ["up"], name="/up/Add"),
        helper.make_node("Gelu", ["up"], ["act"], name="/act/Gelu"),
        helper.make_node("MatMul", ["act", "down.weight"], ["down_mm"], name="/down/MatMul"),
        helper.make_node("Add", ["down_mm", "down.bias"], ["mlp"], name="/down/Add"),
        helper.make_node("Add", ["h2", "mlp"], ["h3"], name="/residual_1/Add"),
        helper.make_node("LayerNormalization", ["h3", "lnf.weight", "lnf.bias"], ["hf"],
                         name="/lnf/LayerNormalization", axis=-1, epsilon=1e-5),
    ]  # fmt: skip
    if tied:
        nodes += [
            helper.make_node("Transpose", ["wte"], ["wte_t"], name="/head/Transpose", perm=[1, 0]),
            helper.make_node("MatMul", ["hf", "wte_t"], ["logits"], name="/head/MatMul"),
        ]
    else:
        inits.append(_init("head.weight", hidden, vocab))
        nodes.append(
            helper.make_node("MatMul", ["hf", "head.weight"], ["logits"], name="/head/MatMul")
        )
    return _model(nodes, [ids], [out], inits, name="tiny-attention", opset=20)


def recurrent_classifier(
    op: str = "LSTM", *, bidirectional: bool = False, use_state: bool = True
) -> bytes:
    """Embedding -> [S, N, D] -> LSTM or GRU (layout 0, as torch.onnx.export emits) -> the
    last hidden state (Y_h) or the whole output (Y) -> Gemm, with a dynamic batch and sequence.

    Parameters: embedding 50 x 8 = 400; per direction W 4H x 8, R 4H x H, B 8H with H = 16
    (LSTM: 4 gates, GRU: 3): LSTM 512 + 1,024 + 128 = 1,664; GRU 384 + 768 + 96 = 1,248; the
    head 16 x dirs -> 2 (+2 bias).
    """
    gates = 4 if op == "LSTM" else 3
    hidden, dirs = 16, 2 if bidirectional else 1
    nodes = [
        helper.make_node("Gather", ["emb", "tokens"], ["e"]),
        helper.make_node("Transpose", ["e"], ["x"], perm=[1, 0, 2]),
        helper.make_node(
            op, ["x", "W", "R", "B"], ["y", "y_h"], hidden_size=hidden,
            direction="bidirectional" if bidirectional else "forward",
        ),
    ]  # fmt: skip
    if use_state:  # Y_h [dirs, N, H] -> [N, dirs x H]
        nodes += [
            helper.make_node("Transpose", ["y_h"], ["h_t"], perm=[1, 0, 2]),
            helper.make_node("Reshape", ["h_t", "flat"], ["h"]),
        ]
    else:  # Y [S, dirs, N, H] -> mean over time of [S, N, dirs x H]
        nodes += [
            helper.make_node("Transpose", ["y"], ["y_t"], perm=[0, 2, 1, 3]),
            helper.make_node("Reshape", ["y_t", "seq_flat"], ["y_r"]),
            helper.make_node("ReduceMean", ["y_r", "axis0"], ["h"], keepdims=0),
        ]
    nodes.append(helper.make_node("Gemm", ["h", "fc_w", "fc_b"], ["logits"], transB=1))
    inits = [
        _init("emb", 50, 8),
        _init("W", dirs, gates * hidden, 8),
        _init("R", dirs, gates * hidden, hidden),
        _init("B", dirs, 2 * gates * hidden),
        _init("fc_w", 2, dirs * hidden),
        _init("fc_b", 2),
        _ints("flat", [0, dirs * hidden]),
        _ints("seq_flat", [0, 0, dirs * hidden]),
        _ints("axis0", [0]),
    ]
    tokens = helper.make_tensor_value_info("tokens", TensorProto.INT64, ["batch", "seq"])
    logits = helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", 2])
    return _model(nodes, [tokens], [logits], inits, opset=18)


def gelu_by_hand(half: float = 0.5, share_inner: bool = False) -> bytes:
    """Linear -> 0.5 * x first, then * (1 + tanh(sqrt(2/pi) * (x + 0.044715 * x^3))) (the order
    of Hugging Face's gelu_new, with Pow) -> Linear. ``half`` other than 0.5 is not GELU;
    ``share_inner`` also returns the tanh's input (read outside the pattern: no fusion)."""
    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["h"]),
        helper.make_node("Mul", ["h", "c_half"], ["h_half"]),
        helper.make_node("Pow", ["h", "c_three"], ["h3"]),
        helper.make_node("Mul", ["c_kappa", "h3"], ["k"]),
        helper.make_node("Add", ["h", "k"], ["inner"]),
        helper.make_node("Mul", ["inner", "c_beta"], ["scaled"]),
        helper.make_node("Tanh", ["scaled"], ["t"]),
        helper.make_node("Add", ["c_one", "t"], ["t1"]),
        helper.make_node("Mul", ["h_half", "t1"], ["g"]),
        helper.make_node("MatMul", ["g", "w2"], ["y"]),
    ]
    scalars = {"c_half": half, "c_three": 3.0, "c_kappa": 0.044715,
               "c_beta": math.sqrt(2 / math.pi), "c_one": 1.0}  # fmt: skip
    inits = [_init("w1", 8, 32), _init("w2", 32, 4)] + [
        numpy_helper.from_array(np.array(v, dtype=np.float32), k) for k, v in scalars.items()
    ]
    outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4])]
    if share_inner:
        outputs.append(helper.make_tensor_value_info("scaled", TensorProto.FLOAT, ["batch", 32]))
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 8])
    return _model(nodes, [x], outputs, inits)


def lm_with_head_copy(transposed: bool = True, same_values: bool = True) -> bytes:
    """Embedding 50 x 16 -> Relu -> an LM head whose weight is a separate initializer holding
    the embedding table transposed (MatMul, what the TorchScript exporter writes for a tied
    head) or as is (Gemm transB=1); ``same_values=False``: an untied head of the same shape."""
    table = np.random.default_rng(7).standard_normal((50, 16)).astype(np.float32)
    head = table if same_values else np.random.default_rng(8).standard_normal((50, 16))
    head = head.astype(np.float32)
    if transposed:
        weight = numpy_helper.from_array(np.ascontiguousarray(head.T), "head_weight")
        last = helper.make_node("MatMul", ["h", "head_weight"], ["logits"])
    else:
        weight = numpy_helper.from_array(head, "head_weight")
        last = helper.make_node("Gemm", ["h2", "head_weight"], ["logits2"], transB=1)
    nodes = [
        helper.make_node("Gather", ["wte", "tokens"], ["e"]),
        helper.make_node("Relu", ["e"], ["h"]),
    ]
    if transposed:
        nodes.append(last)
        out = helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", "seq", 50])
    else:
        nodes += [helper.make_node("Reshape", ["h", "flat"], ["h2"]), last]
        out = helper.make_tensor_value_info("logits2", TensorProto.FLOAT, [None, 50])
    inits = [numpy_helper.from_array(table, "wte"), weight, _ints("flat", [-1, 16])]
    tokens = helper.make_tensor_value_info("tokens", TensorProto.INT64, ["batch", "seq"])
    return _model(nodes, [tokens], [out], inits)


def norm_by_hand(kind: str = "rms", axis: int = -1) -> bytes:
    """A residual Add, then RMSNorm (Llama: Pow, ReduceMean, Add eps, Sqrt, Reciprocal, Mul x,
    Mul weight) or LayerNorm (ReduceMean, Sub, Pow, ReduceMean, Add eps, Sqrt, Div, Mul weight,
    Add bias) written out over ``axis``, then a linear layer. Width 16, batch symbolic."""
    reduce: dict[str, Any] = {"axes": [axis], "keepdims": 1}
    nodes = [helper.make_node("Add", ["a", "b"], ["x"])]
    if kind == "rms":
        nodes += [
            helper.make_node("Pow", ["x", "two"], ["sq"]),
            helper.make_node("ReduceMean", ["sq"], ["var"], **reduce),
            helper.make_node("Add", ["var", "eps"], ["var_eps"]),
            helper.make_node("Sqrt", ["var_eps"], ["std"]),
            helper.make_node("Reciprocal", ["std"], ["inv"]),
            helper.make_node("Mul", ["x", "inv"], ["normed"]),
            helper.make_node("Mul", ["ln_w", "normed"], ["n"]),
        ]
    else:
        nodes += [
            helper.make_node("ReduceMean", ["x"], ["mean"], **reduce),
            helper.make_node("Sub", ["x", "mean"], ["c"]),
            helper.make_node("Pow", ["c", "two"], ["sq"]),
            helper.make_node("ReduceMean", ["sq"], ["var"], **reduce),
            helper.make_node("Add", ["var", "eps"], ["var_eps"]),
            helper.make_node("Sqrt", ["var_eps"], ["std"]),
            helper.make_node("Div", ["c", "std"], ["normed"]),
            helper.make_node("Mul", ["normed", "ln_w"], ["scaled"]),
            helper.make_node("Add", ["scaled", "ln_b"], ["n"]),
        ]
    nodes.append(helper.make_node("MatMul", ["n", "w"], ["y"]))
    scalars = {"two": 2.0, "eps": 1e-6}
    inits = [_init("ln_w", 16), _init("ln_b", 16), _init("w", 16, 4)] + [
        numpy_helper.from_array(np.array(v, dtype=np.float32), k) for k, v in scalars.items()
    ]
    if kind == "rms":
        inits = [t for t in inits if t.name != "ln_b"]
    a = helper.make_tensor_value_info("a", TensorProto.FLOAT, ["batch", 8, 16])
    b = helper.make_tensor_value_info("b", TensorProto.FLOAT, ["batch", 8, 16])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 8, 4])
    return _model(nodes, [a, b], [y], inits, opset=17)


def with_unsupported() -> bytes:
    """Relu, then a TopK and a NonZero (unsupported), then a Gemm of 4*4 + 4 = 20 params."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4])
    nodes = [
        helper.make_node("Relu", ["x"], ["r"], name="relu"),
        helper.make_node("Hardmax", ["r"], ["h"], name="hardmax"),
        helper.make_node("LpNormalization", ["h"], ["n"], name="lpnorm"),
        helper.make_node("Gemm", ["n", "w", "b"], ["y"], name="fc", transB=1),
    ]
    return _model(nodes, [x], [y], [_init("w", 4, 4), _init("b", 4)], name="odd")


def with_external_data() -> bytes:
    """A model whose weight claims to live in a file next to it."""
    model = onnx.load_from_string(small_cnn())
    tensor = model.graph.initializer[0]
    tensor.ClearField("raw_data")
    tensor.ClearField("float_data")
    tensor.data_location = TensorProto.EXTERNAL
    entry = tensor.external_data.add()
    entry.key, entry.value = "location", "../../../etc/passwd"
    return bytes(model.SerializeToString())


def without_weights(data: bytes, *, external: bool = False) -> bytes:
    """The same model with no float weight data: every float initializer keeps its dims and
    either carries no data (a graph-only export) or points at an external file that does not
    exist (``torch.onnx.export(..., external_data=True)`` without the data file)."""
    model = onnx.load_from_string(data)
    for tensor in model.graph.initializer:
        if tensor.data_type != TensorProto.FLOAT:
            continue
        for name in ("raw_data", "float_data"):
            tensor.ClearField(name)
        if external:
            tensor.data_location = TensorProto.EXTERNAL
            for key, value in (("location", "weights.bin"), ("offset", "0")):
                entry = tensor.external_data.add()
                entry.key, entry.value = key, value
    return bytes(model.SerializeToString())


def with_huge_dims() -> bytes:
    """An initializer that declares 2^45 elements but stores none."""
    model = onnx.load_from_string(small_cnn())
    tensor = model.graph.initializer[-1]
    del tensor.dims[:]
    tensor.dims.extend([2**15, 2**15, 2**15])
    return bytes(model.SerializeToString())


def with_lying_dims() -> bytes:
    """An initializer whose dims do not match the data it holds."""
    model = onnx.load_from_string(small_cnn())
    tensor = model.graph.initializer[-1]
    del tensor.dims[:]
    tensor.dims.extend([1000, 1000])
    return bytes(model.SerializeToString())


def small_cnn_at_opset(opset: int) -> bytes:
    """``small_cnn`` claiming another opset of the default domain."""
    model = onnx.load_from_string(small_cnn())
    model.opset_import[0].version = opset
    return bytes(model.SerializeToString())


def chain(nodes: int, op: str = "Relu") -> bytes:
    """``nodes`` unary ``op`` nodes one after the other on a [N, 16] input (no initializers).

    An ``Add`` chain adds each value to itself: two activations, so one ``add`` layer each.
    """
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 16])
    y = helper.make_tensor_value_info(f"v{nodes}", TensorProto.FLOAT, ["N", 16])
    arity = 2 if op == "Add" else 1
    body = [
        helper.make_node(op, [f"v{i}" if i else "x"] * arity, [f"v{i + 1}"], name=f"n{i}")
        for i in range(nodes)
    ]
    return _model(body, [x], [y], [], name="chain")


def with_inputs(count: int, rank: int = 2) -> bytes:
    """``count`` float inputs of ``rank`` dims summed into one output."""
    shape: list[str | int | None] = ["N", *[2] * (rank - 1)]
    inputs = [
        helper.make_tensor_value_info(f"x{i}", TensorProto.FLOAT, shape) for i in range(count)
    ]
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, shape)
    return _model([helper.make_node("Sum", [i.name for i in inputs], ["y"])], inputs, [y], [])


def relu_mlp_stack(width: int = 8, depth: int = 3, norm: bool = False) -> bytes:
    """``depth`` x (MatMul width x width, Relu), optionally behind a LayerNormalization: a plain
    stack is no transformer feed-forward; behind a norm, the first two MatMuls are one."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4, width])
    inits = [_init(f"w{i}", width, width) for i in range(depth)]
    nodes, current = [], "x"
    if norm:
        inits += [_init("ln.weight", width), _init("ln.bias", width)]
        nodes.append(helper.make_node("LayerNormalization", ["x", "ln.weight", "ln.bias"], ["n"],
                                      name="ln", axis=-1))  # fmt: skip
        current = "n"
    for i in range(depth):
        nodes.append(helper.make_node("MatMul", [current, f"w{i}"], [f"h{i}"], name=f"mm{i}"))
        nodes.append(helper.make_node("Relu", [f"h{i}"], [f"r{i}"], name=f"relu{i}"))
        current = f"r{i}"
    y = helper.make_tensor_value_info(current, TensorProto.FLOAT, ["batch", 4, width])
    return _model(nodes, [x], [y], inits, name="relu-stack")


def small_unet3d() -> bytes:
    """Conv (3-d, stride 2, no bias), InstanceNormalization, Relu, ConvTranspose (3-d, k2 s2,
    bias), Concat with the input, a 1x1x1 Conv with bias: the MLPerf 3D U-Net's building blocks.

    Parameters: down 8*1*27 = 216, norm 8 + 8 = 16, up 8*4*8 + 4 = 260, head 3*5 + 3 = 18: 510.
    """
    x = helper.make_tensor_value_info("volume", TensorProto.FLOAT, ["N", 1, 16, 16, 16])
    y = helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", 3, 16, 16, 16])
    inits = [
        _init("down.weight", 8, 1, 3, 3, 3), _init("norm.weight", 8), _init("norm.bias", 8),
        _init("up.weight", 8, 4, 2, 2, 2), _init("up.bias", 4),
        _init("head.weight", 3, 5, 1, 1, 1), _init("head.bias", 3),
    ]  # fmt: skip
    nodes = [
        helper.make_node("Conv", ["volume", "down.weight"], ["d"], name="/down/Conv",
                         pads=[1, 1, 1, 1, 1, 1], kernel_shape=[3, 3, 3], strides=[2, 2, 2]),
        helper.make_node("InstanceNormalization", ["d", "norm.weight", "norm.bias"], ["n"],
                         name="/norm/InstanceNormalization", epsilon=1e-5),
        helper.make_node("Relu", ["n"], ["r"], name="/relu/Relu"),
        helper.make_node("ConvTranspose", ["r", "up.weight", "up.bias"], ["u"],
                         name="/up/ConvTranspose", kernel_shape=[2, 2, 2], strides=[2, 2, 2]),
        helper.make_node("Concat", ["u", "volume"], ["cat"], name="/Concat", axis=1),
        helper.make_node("Conv", ["cat", "head.weight", "head.bias"], ["logits"],
                         name="/head/Conv", kernel_shape=[1, 1, 1]),
    ]  # fmt: skip
    return _model(nodes, [x], [y], inits, name="small-unet3d")


def with_cycle(extra: int = 0) -> bytes:
    """A MatMul whose activation feeds back into the Add before it (a back edge): ``in`` (Add)
    -> ``mm`` (MatMul) -> ``act`` (Relu) -> back to ``in``; ``extra`` Relus lengthen the loop."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 8])
    y = helper.make_tensor_value_info("h", TensorProto.FLOAT, ["N", 8])
    loop = [f"r{i}" for i in range(extra)]
    nodes = [
        helper.make_node("Add", ["x", loop[-1] if loop else "back"], ["s"], name="in"),
        helper.make_node("MatMul", ["s", "w"], ["h"], name="mm"),
        helper.make_node("Relu", ["h"], ["back"], name="act"),
    ]
    previous = "back"
    for name in loop:
        nodes.append(helper.make_node("Relu", [previous], [name], name=f"n{name}"))
        previous = name
    return _model(nodes, [x], [y], [_init("w", 8, 8)], name="cyclic")
