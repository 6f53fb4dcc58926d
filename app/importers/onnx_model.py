"""ONNX model bytes -> layer graph.

Only the bytes given are read: the model is parsed with ``ModelProto.ParseFromString`` and
shape-inferred in memory. The planner needs shapes, not weights: an initializer may refer to
external data (the path is never opened) or carry no data at all (a graph-only export), and
the data of float weights that did come is released right after parsing (``strip_weights``),
so the shape inference and its probes copy a graph of a few MB, whatever the model's size.
Nodes are mapped in their (topological) order onto graph ops:

* weights of Conv, Gemm, MatMul (constant right operand, with a following bias Add folded in),
  BatchNormalization, LayerNormalization, RMSNormalization and Gather-as-embedding stay with
  their op; a MatMul whose weight an earlier embedding owns is tied to it;
* other float initializers that feed activations (a position embedding, a class token) become
  ``tensor`` layers, counted as parameters;
* nodes that only compute on constants and shapes (Shape, Gather on a shape, Concat of ints,
  Constant, ...) are folded away: their values only size later reshapes, which take their
  output shape from ONNX shape inference;
* everything else is unsupported: listed, and rejected unless ``lenient`` (then a zero-param,
  shape-preserving ``opaque`` layer).

Parameters are counted twice, independently: from the initializers (float tensors of more
than one element, minus batch-norm running statistics) and from the graph's shape inference.
The two must be equal.
"""

from __future__ import annotations

import hashlib
import math
import re
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx
from onnx import AttributeProto, GraphProto, ModelProto, NodeProto, TensorProto

from app.domain.graph.analysis import InputDecl
from app.domain.graph.format import MAX_DIM
from app.domain.graph.ops import TensorKind
from app.importers.result import (
    MAX_STORED_INPUT_RANK,
    MAX_STORED_INPUTS,
    MAX_STORED_LAYERS,
    ImportedGraph,
    ImportRejected,
    OpMapping,
    UnsupportedOp,
    graph_parameter_count,
)

# Structural caps, checked right after the protobuf is parsed and before anything costly
# (shape inference, mapping, the graph's own shape inference): each is one pass or less.
MAX_NODES = 50_000  # subgraphs included
MAX_NODE_EDGES = 16 * MAX_NODES  # node inputs + outputs
MAX_TENSORS = 2 * MAX_NODES  # initializers, sparse initializers and attribute tensors
MAX_DECLARED_VALUES = 4 * MAX_NODES  # graph inputs, outputs and value_info
MAX_DECLARED_RANK = 32
MIN_OPSET, MIN_IR = 7, 3
DEFAULT_SEQUENCE_LENGTH = 128
_FLOAT_TYPES = frozenset(
    {TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.BFLOAT16, TensorProto.DOUBLE}
)
_INT_TYPES = frozenset({TensorProto.INT64, TensorProto.INT32})
_ITEM_BYTES: dict[int, int] = {
    TensorProto.FLOAT: 4, TensorProto.FLOAT16: 2, TensorProto.BFLOAT16: 2, TensorProto.DOUBLE: 8,
    TensorProto.INT64: 8, TensorProto.INT32: 4, TensorProto.INT16: 2, TensorProto.INT8: 1,
    TensorProto.UINT8: 1, TensorProto.BOOL: 1, TensorProto.UINT16: 2, TensorProto.UINT32: 4,
    TensorProto.UINT64: 8,
}  # fmt: skip
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


def _reject(detail: str, pointer: str = "/file", kind: str = "invalid-onnx") -> ImportRejected:
    return ImportRejected(detail, pointer=pointer, kind=kind)


# -- parsing and hostile-input checks ---------------------------------------------------------


SMALL_VALUES = 64  # int tensors up to this many elements are read for their values (shapes)


@dataclass(frozen=True, slots=True)
class Weightless:
    """Initializers whose data the import did not have or dropped, by reason."""

    external: int  # pointed at external data (the path is never opened)
    empty: int  # carried dims but no data (a graph-only export)
    dropped_bytes: int  # float weight data released right after parsing
    # initializer -> (the earlier initializer it copies, whether transposed): exporters write a
    # tied LM head as a transposed copy of the embedding table
    copies: dict[str, tuple[str, bool]] = field(default_factory=dict)


def strip_weights(model: ModelProto) -> Weightless:
    """Release the data of every float initializer (the planner needs dims, not values) and
    forget external-data references, so nothing later can read a path or copy weights.

    Int tensors of at most ``SMALL_VALUES`` elements keep their data (reshape targets, axes).
    """
    external = empty = dropped = 0
    copies = {**_provenance_copies(model.graph), **_copies(model.graph)}
    for tensor in model.graph.initializer:
        if _has_external_data(tensor):
            external += 1
            del tensor.external_data[:]
            tensor.data_location = TensorProto.DEFAULT
            continue
        numel = math.prod(tensor.dims)
        if numel and _stored_elements(tensor) == 0:
            empty += 1
        if tensor.data_type in _FLOAT_TYPES and numel > SMALL_VALUES:
            dropped += tensor.ByteSize()
            for name in ("raw_data", "float_data", "double_data", "int32_data"):
                tensor.ClearField(name)
    return Weightless(external=external, empty=empty, dropped_bytes=dropped, copies=copies)


def _copies(graph: GraphProto) -> dict[str, tuple[str, bool]]:
    """2-d float initializers whose data equals an earlier one's, or its transpose (by digest;
    read before the data is released). Tensors without data, and constant ones, are never
    copies; the mapper ties a linear layer through a copy only to an embedding table."""
    seen: dict[bytes, str] = {}
    found: dict[str, tuple[str, bool]] = {}
    for tensor in graph.initializer:
        if (
            tensor.data_type not in _FLOAT_TYPES
            or len(tensor.dims) != 2
            or math.prod(tensor.dims) <= SMALL_VALUES
            or _has_external_data(tensor)
            or _stored_elements(tensor) != math.prod(tensor.dims)
        ):
            continue
        array = onnx.numpy_helper.to_array(tensor)
        if array.min() == array.max():  # constant (zeros, ones): equal by value, not a copy
            continue
        digest = _digest(array)
        if digest in seen:
            found[tensor.name] = (seen[digest], False)
            continue
        transposed = _digest(array.T)
        if transposed in seen:
            found[tensor.name] = (seen[transposed], True)
            continue
        seen[digest] = tensor.name
    return found


_FX_PARAMETER = re.compile(r"%p_([A-Za-z0-9_]+)")


def _provenance_copies(graph: GraphProto) -> dict[str, tuple[str, bool]]:
    """2-d float initializers that a node's provenance metadata says are a parameter stored
    under another name, as is or transposed. The dynamo exporter (torch.onnx.export with
    dynamo=True) constant-folds ``linear``'s transposed weight into a new anonymous
    initializer and records the PyTorch node behind each ONNX node
    (``pkg.torch.onnx.fx_node``: ``aten.linear(%x, %p_lm_head_weight)``): so a graph-only
    file still tells that a tied LM head reads the embedding table."""
    dims = {t.name: tuple(t.dims) for t in graph.initializer
            if t.data_type in _FLOAT_TYPES and len(t.dims) == 2}  # fmt: skip
    by_fx_name = {"p_" + re.sub(r"[^A-Za-z0-9_]", "_", name): name for name in dims}
    found: dict[str, tuple[str, bool]] = {}
    for node in graph.node:
        if node.op_type not in ("MatMul", "Gemm") or len(node.input) < 2:
            continue
        weight = node.input[1]
        if weight not in dims or weight in found:
            continue
        fx_node = next((p.value for p in node.metadata_props
                        if p.key == "pkg.torch.onnx.fx_node"), "")  # fmt: skip
        sources = {by_fx_name.get(f"p_{m}") for m in _FX_PARAMETER.findall(fx_node)} - {None}
        if len(sources) != 1:
            continue
        source = str(sources.pop())
        if source == weight:
            continue
        if dims[source] == dims[weight][::-1]:
            found[weight] = (source, True)
        elif dims[source] == dims[weight]:
            found[weight] = (source, False)
    return found


def _digest(array: np.ndarray) -> bytes:
    contiguous = np.ascontiguousarray(array)
    digest = hashlib.blake2b(repr(contiguous.shape).encode(), digest_size=16)
    digest.update(contiguous.data)  # the array's buffer itself: no copy of a large tensor
    return digest.digest()


def parse_model(data: bytes) -> ModelProto:
    """Parse ONNX bytes; reject garbage, truncation, external data and absurd sizes."""
    if not data:
        raise _reject("the uploaded file is empty")
    model = ModelProto()
    try:
        model.ParseFromString(data)
    except Exception as exc:  # protobuf's DecodeError, or a RuntimeError from the C++ parser
        raise _reject(f"not a valid ONNX file (protobuf decoding failed: {exc})") from exc
    if not model.HasField("graph") or not model.graph.node:
        raise _reject("not a valid ONNX file: it holds no graph nodes")
    if not MIN_IR <= model.ir_version <= onnx.IR_VERSION:
        raise _reject(
            f"ONNX IR version {model.ir_version} is not supported "
            f"(supported: {MIN_IR}..{onnx.IR_VERSION})"
        )
    opset = _default_opset(model)
    if not MIN_OPSET <= opset <= onnx.defs.onnx_opset_version():
        raise _reject(
            f"opset {opset} of the default ONNX domain is not supported "
            f"(supported: {MIN_OPSET}..{onnx.defs.onnx_opset_version()})"
        )
    _check_structure(model.graph)
    for count, (where, tensor) in enumerate(_all_tensors(model.graph), start=1):
        if count > MAX_TENSORS:
            raise _reject(f"the graph holds more than {MAX_TENSORS} tensors; at most that many")
        _check_tensor(where, tensor)
    for where, dims in _declared_dims(model.graph):
        if len(dims) > MAX_DECLARED_RANK:
            raise _reject(f"{where} declares {len(dims)} dims; at most {MAX_DECLARED_RANK}")
        for dim in dims:
            if dim.HasField("dim_value") and not 0 <= dim.dim_value <= MAX_DIM:
                raise _reject(f"{where} declares dimension {dim.dim_value}; at most 2^40 allowed")
    return model


def _check_structure(graph: GraphProto) -> None:
    """Counts that bound every later pass, and what the stored model could never hold."""
    tensors = len(graph.initializer) + len(graph.sparse_initializer)
    if tensors > MAX_TENSORS:
        raise _reject(f"the graph has {tensors} initializers; at most {MAX_TENSORS} are imported")
    values = len(graph.input) + len(graph.output) + len(graph.value_info)
    if values > MAX_DECLARED_VALUES:
        raise _reject(
            f"the graph declares {values} values (inputs, outputs, value_info); "
            f"at most {MAX_DECLARED_VALUES}"
        )
    nodes = edges = 0
    for node in _all_nodes(graph):
        nodes += 1
        edges += len(node.input) + len(node.output)
        if nodes > MAX_NODES:
            raise _reject(f"the graph has more than {MAX_NODES} nodes; at most that many")
        if edges > MAX_NODE_EDGES:
            raise _reject(f"the graph's nodes have more than {MAX_NODE_EDGES} inputs and outputs")
    initializers = {t.name for t in graph.initializer}
    inputs = [info for info in graph.input if info.name not in initializers]
    if len(inputs) > MAX_STORED_INPUTS:
        raise _reject(
            f"the graph has {len(inputs)} inputs; a stored model has at most {MAX_STORED_INPUTS}",
            "/graph/input",
        )
    for info in inputs:
        rank = len(info.type.tensor_type.shape.dim)
        if rank > MAX_STORED_INPUT_RANK:
            raise _reject(
                f"input '{info.name}' has {rank} dims; a stored input has at most "
                f"{MAX_STORED_INPUT_RANK}",
                "/graph/input",
            )
    _check_acyclic(graph)
    least = _least_layers(graph, {info.name for info in inputs})
    if least > MAX_STORED_LAYERS:
        raise _reject(
            f"the graph has {least} nodes that compute on its inputs and each maps to at least "
            f"one layer (or is unsupported); a stored model has at most {MAX_STORED_LAYERS} layers"
        )


MAX_CYCLE_SHOWN = 8  # nodes of a cycle named in the 422


def _node_label(node: NodeProto, index: int) -> str:
    return f"'{node.name}' ({node.op_type})" if node.name else f"#{index} ({node.op_type})"


def _check_acyclic(graph: GraphProto) -> None:
    """Reject a graph whose nodes feed each other in a loop, naming one such cycle.

    ONNX graphs are acyclic (a loop is a ``Loop`` node with a body graph); a back edge would
    otherwise be dropped silently by the walk in node order. Kahn's algorithm: the nodes left
    when no node without pending inputs remains are on a cycle or behind one; following
    predecessors among them from any of them must close a cycle.
    """
    nodes = graph.node
    producer: dict[str, int] = {}
    for index, node in enumerate(nodes):
        for output in node.output:
            if output:
                producer[output] = index
    predecessors: list[dict[int, str]] = []
    successors: list[list[int]] = [[] for _ in nodes]
    for index, node in enumerate(nodes):
        feeding: dict[int, str] = {}
        for value in node.input:
            source = producer.get(value)
            if source is not None and source not in feeding:
                feeding[source] = value
                successors[source].append(index)
        predecessors.append(feeding)
    pending = [len(feeding) for feeding in predecessors]
    ready = [index for index, count in enumerate(pending) if count == 0]
    done = 0
    while ready:
        index = ready.pop()
        done += 1
        for successor in successors[index]:
            pending[successor] -= 1
            if pending[successor] == 0:
                ready.append(successor)
    if done == len(nodes):
        return
    # Walk back from a node left over, through predecessors left over, until one repeats.
    current = next(index for index, count in enumerate(pending) if count > 0)
    seen: dict[int, int] = {}
    path: list[int] = []
    while current not in seen:
        seen[current] = len(path)
        path.append(current)
        current = next(p for p in predecessors[current] if pending[p] > 0)
    cycle = path[seen[current] :][::-1]  # in the direction of the data
    first = cycle.index(min(cycle))  # from its node listed first
    cycle = cycle[first:] + cycle[:first]
    steps = []
    for position, index in enumerate(cycle[:MAX_CYCLE_SHOWN]):
        following = cycle[(position + 1) % len(cycle)]
        steps.append(f"{_node_label(nodes[index], index)} -> '{predecessors[following][index]}'")
    shown = " -> ".join(steps)
    if len(cycle) > MAX_CYCLE_SHOWN:
        shown += f" -> ... ({len(cycle)} nodes in all)"
    raise _reject(
        f"the graph has a cycle: {shown} -> back to {_node_label(nodes[cycle[0]], cycle[0])}; "
        "an ONNX graph must be acyclic (a loop belongs in a Loop node's body), so nothing was "
        "stored",
        "/graph/node",
        kind="cyclic-onnx-graph",
    )


# Ops that can map to no layer although they compute on an activation: Identity, Cast to a
# float type and a Transpose whose perm is the identity (or not given: the rank decides) alias
# their input, an Add of a MatMul's output and a constant may be that MatMul's bias, and
# Reduce*/Split make as many layers as their constant axes or outputs say.
_ALIASING = frozenset({"Identity", "Cast", "Transpose", "Split", *_REDUCE})


def _may_map_to_nothing(node: NodeProto, live: set[str], matmul_outputs: set[str]) -> bool:
    op = node.op_type
    if op == "Add":
        a, b = (list(node.input) + ["", ""])[:2]
        return (a in matmul_outputs and b not in live) or (b in matmul_outputs and a not in live)
    if op not in _ALIASING:
        return False
    attributes = {attribute.name: attribute for attribute in node.attribute}
    if op == "Cast":
        return "to" in attributes and attributes["to"].i in _FLOAT_TYPES
    if op == "Transpose" and "perm" in attributes:
        perm = list(attributes["perm"].ints)
        return perm == sorted(perm)
    return True


def _least_layers(graph: GraphProto, inputs: set[str]) -> int:
    """A lower bound of the layers ``_Mapper`` makes, in one pass without shape inference.

    It follows the mapper's walk: a node of the default domain that reads an activation (a
    graph input or an earlier such node's first output) and is not a shape op goes to its
    handler, which emits at least one layer unless ``_may_map_to_nothing`` (or it is
    unsupported: then the import fails, or is one opaque layer when lenient); a custom-domain
    node reading an activation is unsupported. Either way its first output is an activation.
    """
    live = set(inputs)
    matmul_outputs: set[str] = set()
    least = absorbable = softmaxes = cores = norms = 0
    for node in graph.node:
        custom = node.domain not in ("", "ai.onnx")
        softmaxes += node.op_type == "Softmax" and not custom
        norms += node.op_type in _NORM_OPS_OUT and not custom
        cores += node.op_type == "MatMul" and not custom and all(i in live for i in node.input)
        if not custom and (node.op_type in _SHAPE_OPS or node.op_type == "Constant"):
            continue
        if not any(value in live for value in node.input):
            continue
        if custom or not _may_map_to_nothing(node, live, matmul_outputs):
            least += 1
            absorbable += not custom and node.op_type in _ABSORBABLE
        if node.output:
            live.add(node.output[0])
            if node.op_type == "MatMul" and not custom:
                matmul_outputs.add(node.output[0])
    # An attention fusion turns up to _ATTENTION_MAX_NODES nodes into one layer, and the masks
    # and tables only attentions read are dropped with them.
    attentions = min(softmaxes, cores // 2)
    least -= min(absorbable, _ATTENTION_MAX_NODES * (attentions + 1) if attentions else 0)
    # A feed-forward behind each norm becomes one mlp layer (of up to _MLP_MAX_LAYERS).
    return max(0, least - (_MLP_MAX_LAYERS - 1) * norms)


def _default_opset(model: ModelProto) -> int:
    for entry in model.opset_import:
        if entry.domain in ("", "ai.onnx"):
            return int(entry.version)
    raise _reject("the model imports no opset of the default ONNX domain")


def _all_nodes(graph: GraphProto) -> Iterator[NodeProto]:
    for node in graph.node:
        yield node
        for attribute in node.attribute:
            for sub in _subgraphs(attribute):
                yield from _all_nodes(sub)


def _subgraphs(attribute: AttributeProto) -> list[GraphProto]:
    graphs = list(attribute.graphs)
    if attribute.HasField("g"):
        graphs.append(attribute.g)
    return graphs


def _all_tensors(graph: GraphProto) -> Iterator[tuple[str, TensorProto]]:
    for tensor in graph.initializer:
        yield f"initializer '{tensor.name}'", tensor
    for sparse in graph.sparse_initializer:
        yield f"sparse initializer '{sparse.values.name}'", sparse.values
        yield f"sparse initializer '{sparse.values.name}' indices", sparse.indices
    for node in graph.node:
        for attribute in node.attribute:
            where = f"node '{node.name or node.op_type}' attribute '{attribute.name}'"
            if attribute.HasField("t"):
                yield where, attribute.t
            for tensor in attribute.tensors:
                yield where, tensor
            if attribute.HasField("sparse_tensor"):
                yield where, attribute.sparse_tensor.values
            for sub in _subgraphs(attribute):
                yield from _all_tensors(sub)


def _declared_dims(graph: GraphProto) -> Iterator[tuple[str, Any]]:
    for info in [*graph.input, *graph.output, *graph.value_info]:
        if info.type.HasField("tensor_type") and info.type.tensor_type.HasField("shape"):
            yield f"value '{info.name}'", info.type.tensor_type.shape.dim


def _has_external_data(tensor: TensorProto) -> bool:
    return tensor.data_location == TensorProto.EXTERNAL or len(tensor.external_data) > 0


def _check_tensor(where: str, tensor: TensorProto) -> None:
    if len(tensor.dims) > 8 or any(not 0 <= d <= MAX_DIM for d in tensor.dims):
        raise _reject(f"{where} declares dims {list(tensor.dims)}: at most 8 dims of 0..2^40")
    numel = math.prod(tensor.dims)
    if numel > MAX_DIM:
        raise _reject(f"{where} declares {numel} elements; at most 2^40")
    # A weight may come without its data (external data, never read; or stripped): its dims
    # are all the planner needs. Data that is there must match the dims.
    stored = None if _has_external_data(tensor) else _stored_elements(tensor)
    if stored is not None and stored not in (numel, 0):
        raise _reject(
            f"{where} declares dims {list(tensor.dims)} ({numel} elements) but holds {stored}"
        )


def _stored_elements(tensor: TensorProto) -> int | None:
    """Elements actually present in the tensor's data, or None when that cannot be told."""
    if tensor.HasField("raw_data"):
        item = _ITEM_BYTES.get(tensor.data_type)
        return len(tensor.raw_data) // item if item else None
    for values in (
        tensor.float_data,
        tensor.int32_data,
        tensor.int64_data,
        tensor.double_data,
        tensor.uint64_data,
    ):
        if len(values):
            return len(values)
    return 0 if tensor.data_type != TensorProto.STRING else None


# -- mapping ----------------------------------------------------------------------------------


@dataclass(slots=True)
class _Const:
    """A value known without running the model: an initializer, a Constant, or a fold."""

    dims: tuple[int, ...] | None
    is_float: bool
    origin: str | None = None  # the initializer it is (a view/expansion of), if any
    values: tuple[int, ...] | None = None  # small integer tensors (axes, split sizes, indices)


class _Mapper:
    """Walks the nodes once, building layers."""

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

    # -- op handlers: return None when mapped, or why not

    def _op_Identity(self, node: NodeProto, index: int) -> str | None:
        self.act[node.output[0]] = self._x(node)
        self._map(node, ())
        return None

    def _op_Cast(self, node: NodeProto, index: int) -> str | None:
        if self._attr(node, "to") not in _FLOAT_TYPES:
            return "casts an activation to a non-float type"
        return self._op_Identity(node, index)

    def _op_Dropout(self, node: NodeProto, index: int) -> str | None:
        ratio = self._attr(node, "ratio", 0.5)
        if len(node.input) > 1 and node.input[1]:  # a ratio input (opset 12+)
            ratio = round(self.scalars.get(node.input[1], 0.5), 6)  # float32 0.1 reads 0.1
            if not 0.0 <= ratio < 1.0:
                ratio = 0.5
        self._emit(node, index, {"op": "dropout", "p": float(ratio), "inputs": [self._x(node)]},
                   ["dropout"])  # fmt: skip
        return None

    def _activation(self, node: NodeProto, index: int, op: str, **attrs: Any) -> str | None:
        self._emit(node, index, {"op": op, **attrs, "inputs": [self._x(node)]}, [op])
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


# -- exporter patterns ------------------------------------------------------------------------

_GELU_OPS = frozenset({"Div", "Mul", "Add", "Sub", "Pow", "Erf", "Tanh"})
_FUSE_MAX_NODES = 12
_GELU_PROBE = (-3.0, -1.7, -0.6, -0.1, 0.0, 0.2, 0.9, 1.6, 3.2)


def _scalar_values(graph: GraphProto) -> dict[str, float]:
    """Float scalars (one-element initializers and Constant nodes with their data inline)."""
    found: dict[str, float] = {}
    tensors = [(t.name, t) for t in graph.initializer]
    for node in graph.node:
        if node.op_type == "Constant":
            for attribute in node.attribute:
                if attribute.name == "value" and attribute.HasField("t"):
                    tensors.append((node.output[0], attribute.t))
                elif attribute.name == "value_float":
                    found[node.output[0]] = float(attribute.f)
    for name, tensor in tensors:
        if math.prod(tensor.dims) != 1 or _has_external_data(tensor):
            continue
        if tensor.data_type not in (*_FLOAT_TYPES, *_INT_TYPES):
            continue
        if _stored_elements(tensor) != 1:
            continue
        found[name] = float(onnx.numpy_helper.to_array(tensor).reshape(-1)[0])
    return found


def _gelu_kind(values: list[float], x: Sequence[float]) -> str | None:
    """'erf' or 'tanh' when ``values`` are GELU of ``x`` in that form, else None."""
    erf = [0.5 * v * (1 + math.erf(v / math.sqrt(2))) for v in x]
    tanh = [0.5 * v * (1 + math.tanh(math.sqrt(2 / math.pi) * (v + 0.044715 * v**3))) for v in x]
    for kind, expected in (("erf", erf), ("tanh", tanh)):
        if all(
            abs(a - b) <= 1e-5 * max(1.0, abs(b)) for a, b in zip(values, expected, strict=True)
        ):
            return kind
    return None


def _binary(op: str, a: float, b: float) -> float:
    if op == "Add":
        return a + b
    if op == "Sub":
        return a - b
    if op == "Mul":
        return a * b
    if op == "Div":
        return a / b
    return float(a**b)  # Pow


def _evaluate(nodes: Sequence[NodeProto], x: str, scalars: dict[str, float]) -> list[float] | None:
    """The nodes (in order) evaluated element-wise on the probe values of ``x``."""
    env: dict[str, list[float]] = {x: list(_GELU_PROBE)}
    width = len(_GELU_PROBE)

    def value(name: str) -> list[float]:
        return env[name] if name in env else [scalars[name]] * width

    try:
        for node in nodes:
            args = [value(name) for name in node.input]
            op = node.op_type
            if op == "Erf":
                out = [math.erf(a) for a in args[0]]
            elif op == "Tanh":
                out = [math.tanh(a) for a in args[0]]
            else:
                out = [_binary(op, a, b) for a, b in zip(args[0], args[1], strict=True)]
            env[node.output[0]] = out
    except (ArithmeticError, KeyError, ValueError, TypeError):
        return None
    return env[nodes[-1].output[0]]


class _Rewrite:
    """A node list being rewritten: who produces and reads each value, the nodes a fusion
    removed, and the node that replaces each fused subgraph (at its last node's place)."""

    def __init__(self, nodes: list[NodeProto], scalars: dict[str, float], outputs: set[str]):
        self.nodes, self.scalars, self.graph_outputs = nodes, scalars, outputs
        self.producer = {out: i for i, node in enumerate(nodes) for out in node.output}
        self.users: dict[str, list[int]] = {}
        for i, node in enumerate(nodes):
            for name in node.input:
                self.users.setdefault(name, []).append(i)
        self.removed: set[int] = set()
        self.replaced: dict[int, NodeProto] = {}

    def cone(
        self,
        value: str,
        ops: frozenset[str],
        *,
        stop: str | None = None,
        vectors: dict[str, int] | None = None,
    ) -> tuple[set[int], set[str], set[str]] | None:
        """The nodes (of ``ops``) computing ``value``, the tensors they start from, and the 1-d
        constant vectors they read; None beyond ``_FUSE_MAX_NODES`` nodes. Scalars are
        constants; ``stop`` is a tensor not to look behind."""
        members: set[int] = set()
        leaves: set[str] = set()
        params: set[str] = set()
        stack = [value]
        while stack:
            name = stack.pop()
            if not name or name in self.scalars:
                continue
            if name == stop:
                leaves.add(name)
                continue
            if vectors is not None and name in vectors:
                params.add(name)
                continue
            index = self.producer.get(name)
            if index is None or self.nodes[index].op_type not in ops or index in self.removed:
                leaves.add(name)
                continue
            if index not in members:
                members.add(index)
                if len(members) > _FUSE_MAX_NODES:
                    return None
                stack.extend(self.nodes[index].input)
        return members, leaves, params

    def private(self, members: set[int], last: int) -> bool:
        """Whether only ``members`` read the values the members other than ``last`` produce."""
        return all(
            all(u in members for u in self.users.get(out, ())) and out not in self.graph_outputs
            for i in members
            if i != last
            for out in self.nodes[i].output
        )

    def next_in_chain(self, index: int, ops: frozenset[str]) -> int | None:
        """The single reader of ``index``'s output, when it is one of ``ops``."""
        following = self.users.get(self.nodes[index].output[0], [])
        if len(following) != 1 or self.nodes[following[0]].op_type not in ops:
            return None
        return following[0]

    def replace(self, members: set[int], last: int, node: NodeProto) -> None:
        self.removed |= members
        self.replaced[last] = node

    def result(self) -> list[NodeProto]:
        return [
            self.replaced.get(i, node)
            for i, node in enumerate(self.nodes)
            if i not in self.removed or i in self.replaced
        ]


def _single_source_cone(
    rewrite: _Rewrite, output: str
) -> tuple[set[int], set[str], set[str]] | None:
    """The GELU-op cone computing ``output`` from one tensor: the whole cone when it starts from
    one tensor, else the cone stopped at a tensor that two of its nodes read (GELU reads its
    input twice; behind it may sit the bias Add of the linear layer that produced it)."""
    found = rewrite.cone(output, _GELU_OPS)
    if found is None or len(found[1]) == 1:
        return found
    members = found[0]
    reads = Counter(name for i in members for name in rewrite.nodes[i].input)
    for value in sorted((v for v, n in reads.items() if n >= 2 and v not in rewrite.scalars),
                        key=lambda v: -rewrite.producer.get(v, -1)):  # fmt: skip
        stopped = rewrite.cone(output, _GELU_OPS, stop=value)
        if stopped is not None and len(stopped[1]) == 1:
            return stopped
    return found


def fuse_gelu(
    nodes: list[NodeProto], scalars: dict[str, float], graph_outputs: set[str]
) -> tuple[list[NodeProto], Counter[str]]:
    """Replace every element-wise subgraph that computes GELU of one tensor (the erf form
    ``x * 0.5 * (1 + erf(x / sqrt 2))`` of torch.onnx.export, the tanh form of GPT-2's
    ``gelu_new``, in whatever order the exporter wrote the products) with one ``Gelu`` node.

    Anchored on each Erf / Tanh: the candidate is the chain of single consumers after it, with
    every node that feeds it from one tensor ``x`` and scalar constants; it is GELU when it
    evaluates to GELU on probe values (within 1e-5), and its intermediate values are read by
    nothing else. Returns the new node list and the count per form.
    """
    rewrite = _Rewrite(nodes, scalars, graph_outputs)
    fused: Counter[str] = Counter()
    for anchor, node in enumerate(nodes):
        if node.op_type not in ("Erf", "Tanh") or anchor in rewrite.removed:
            continue
        current: int | None = anchor
        for _ in range(6):
            if current is None:
                break
            output = nodes[current].output[0]
            found = _single_source_cone(rewrite, output)
            if found is not None and len(found[1]) == 1:
                members, (x,) = found[0], tuple(found[1])
                values = _evaluate([nodes[i] for i in sorted(members)], x, scalars)
                kind = _gelu_kind(values, _GELU_PROBE) if values is not None else None
                if kind is not None and rewrite.private(members, current):
                    rewrite.replace(members, current, onnx.helper.make_node(
                        "Gelu", [x], [output], name=f"{nodes[current].name or 'gelu'}_fused",
                        approximate="tanh" if kind == "tanh" else "none",
                        composite=int(_composite([nodes[i] for i in members])),
                    ))  # fmt: skip
                    fused[kind] += 1
                    break
            current = rewrite.next_in_chain(current, _GELU_OPS)
    return rewrite.result(), fused


_BATCH_NORM_CALL = re.compile(
    r"aten\.(?:_native_batch_norm_legit(?:_functional|_no_training)?|native_batch_norm|"
    r"batch_norm)\.default\]?\(args = \((?P<args>[^)]*)\)"
)


def _folded_batch_norm(node: NodeProto) -> tuple[bool, float] | None:
    """(affine, eps) of the batch norm the dynamo exporter's provenance says a Conv node is (its
    optimizer folds BatchNormalization into the convolution before it, in train mode too), or
    None when the node is a plain convolution."""
    fx_node = next((p.value for p in node.metadata_props if p.key == "pkg.torch.onnx.fx_node"), "")
    match = _BATCH_NORM_CALL.search(fx_node)
    if match is None:
        return None
    args = [a.strip() for a in match.group("args").split(",")]
    if len(args) < 5:
        return None
    try:
        eps = float(args[-1])
    except ValueError:
        eps = 1e-5
    if not 0 < eps < 1:
        eps = 1e-5
    return args[1] != "None", eps


def _composite(nodes: Sequence[NodeProto]) -> bool:
    """Whether the dynamo exporter's provenance says PyTorch computed these nodes op by op
    (Hugging Face's ``gelu_new``: pow, mul, add, tanh; autograd keeps the intermediates), not
    as one ``aten.gelu`` kernel. False without provenance (the TorchScript exporter)."""
    traced = [p.value for node in nodes for p in node.metadata_props
              if p.key == "pkg.torch.onnx.fx_node"]  # fmt: skip
    return bool(traced) and not any("aten.gelu" in value for value in traced)


def _possibly_folded_batch_norm(model: ModelProto) -> int:
    """Convolutions with a bias in a PyTorch export without BatchNormalization: the mark an
    eval-mode export leaves when it folds batch norm into convolutions (0 when not PyTorch's,
    when batch norm is present, or when no convolution has a bias)."""
    if model.producer_name != "pytorch":
        return 0
    nodes = list(_all_nodes(model.graph))
    if any(node.op_type == "BatchNormalization" for node in nodes):
        return 0
    return sum(
        1 for node in nodes if node.op_type == "Conv" and len(node.input) > 2 and node.input[2]
    )


_NORM_OPS = frozenset({"Pow", "ReduceMean", "Add", "Sub", "Mul", "Div", "Sqrt", "Reciprocal",
                       "Cast"})  # fmt: skip


def _norm_reference(kind: str, x: Any, eps: float, weight: Any, bias: Any) -> Any:
    if kind == "RMSNorm":
        out = x / np.sqrt((x * x).mean(axis=-1, keepdims=True) + eps)
    else:
        centered = x - x.mean(axis=-1, keepdims=True)
        out = centered / np.sqrt((centered * centered).mean(axis=-1, keepdims=True) + eps)
    if weight is not None:
        out = out * weight
    if bias is not None:
        out = out + bias
    return out


def _evaluate_vectors(
    nodes: Sequence[NodeProto], env: dict[str, Any], scalars: dict[str, float]
) -> Any | None:
    """The nodes evaluated with numpy on ``env`` (the probe tensor and vectors)."""
    try:
        for node in nodes:
            args = [env[name] if name in env else np.float64(scalars[name]) for name in node.input
                    if name]  # fmt: skip
            op = node.op_type
            if op == "ReduceMean":  # over the last axis (checked by the caller)
                keep = bool(next((a.i for a in node.attribute if a.name == "keepdims"), 1))
                out = args[0].mean(axis=-1, keepdims=keep)
            elif op == "Sqrt":
                out = np.sqrt(args[0])
            elif op == "Reciprocal":
                out = 1.0 / args[0]
            elif op == "Cast":
                out = args[0]
            elif op == "Pow":
                out = args[0] ** args[1]
            else:
                out = {"Add": np.add, "Sub": np.subtract, "Mul": np.multiply,
                       "Div": np.divide}[op](args[0], args[1])  # fmt: skip
            env[node.output[0]] = out
    except (ArithmeticError, KeyError, ValueError, TypeError, FloatingPointError):
        return None
    return env[nodes[-1].output[0]]


def _node_axes(node: NodeProto, scalars: dict[str, float]) -> list[int] | None:
    for attribute in node.attribute:
        if attribute.name == "axes":
            return [int(a) for a in attribute.ints]
    if len(node.input) > 1 and node.input[1] in scalars:  # opset 18: axes as an input
        return [int(scalars[node.input[1]])]
    return None


def fuse_norms(
    nodes: list[NodeProto],
    scalars: dict[str, float],
    vectors: dict[str, int],
    graph_outputs: set[str],
    ranks: dict[str, int],
) -> tuple[list[NodeProto], Counter[str]]:
    """Replace RMSNorm and LayerNorm written out as element-wise ops and ReduceMean over the
    last axis (how exporters write Llama's RMSNorm and LayerNorm before opset 17) with one
    RMSNormalization / LayerNormalization node, keeping the scale and bias vectors as its
    inputs. Anchored on each Sqrt: the chain of single consumers after it, with every node
    that feeds it from the normalized tensor, scalars and 1-d vectors, is a norm when it
    evaluates to one (random probe values, the vectors too) and nothing else reads its
    intermediates; the longest such chain wins (a bias may follow the scale)."""
    rewrite = _Rewrite(nodes, scalars, graph_outputs)
    fused: Counter[str] = Counter()
    rng = np.random.default_rng(0)
    for anchor, node in enumerate(nodes):
        if node.op_type != "Sqrt" or anchor in rewrite.removed:
            continue
        source = _normalized(rewrite, anchor)
        if source is None:
            continue
        best: tuple[int, set[int], str, str, tuple[str, list[str], float]] | None = None
        current: int | None = anchor
        for _ in range(6):
            if current is None:
                break
            output = nodes[current].output[0]
            found = rewrite.cone(output, _NORM_OPS, stop=source, vectors=vectors)
            if found is not None and len(found[1]) == 1 and len(found[2]) <= 2:
                members, (x,), params = found
                kind = _norm_of(members, x, params, rewrite, vectors, ranks, rng)
                if kind is not None and rewrite.private(members, current):
                    best = (current, members, x, output, kind)
            current = rewrite.next_in_chain(current, _NORM_OPS)
        if best is not None:
            last, members, x, output, (name, inputs, eps) = best
            rewrite.replace(members, last, onnx.helper.make_node(
                name, [x, *inputs], [output], axis=-1, epsilon=eps,
                name=f"{nodes[last].name or name}_fused",
            ))  # fmt: skip
            fused["RMSNorm" if name == "RMSNormalization" else "LayerNorm"] += 1
    return rewrite.result(), fused


def _normalized(rewrite: _Rewrite, anchor: int) -> str | None:
    """The tensor a norm ending in Sqrt normalizes: back through its first input to the
    ReduceMean, then the input of the squaring (behind LayerNorm's centring Sub)."""
    nodes, producer = rewrite.nodes, rewrite.producer
    index: int | None = anchor
    for _ in range(4):
        if index is None:
            return None
        node = nodes[index]
        if node.op_type == "ReduceMean":
            squared = producer.get(node.input[0])
            if squared is None or nodes[squared].op_type not in ("Pow", "Mul"):
                return None
            value = str(nodes[squared].input[0])
            centred = producer.get(value)
            if centred is not None and nodes[centred].op_type == "Sub":
                return str(nodes[centred].input[0])
            return value
        operands = [name for name in node.input if name and name not in rewrite.scalars]
        index = producer.get(operands[0]) if operands else None
    return None


def _norm_of(
    members: set[int],
    x: str,
    params: set[str],
    rewrite: _Rewrite,
    vectors: dict[str, int],
    ranks: dict[str, int],
    rng: Any,
) -> tuple[str, list[str], float] | None:
    """The norm ``members`` compute from ``x`` and the vectors ``params``, if any."""
    widths = {vectors[p] for p in params}
    width = widths.pop() if len(widths) == 1 else 8 if not params else 0
    if not width:
        return None
    ordered = [rewrite.nodes[i] for i in sorted(members)]
    last_axis = all(
        _node_axes(n, rewrite.scalars) in ([-1], [ranks.get(n.input[0], 0) - 1])
        for n in ordered
        if n.op_type == "ReduceMean"
    )
    if not last_axis:
        return None
    probe = rng.standard_normal((3, width))
    env: dict[str, Any] = {x: probe}
    env.update({p: rng.normal(1.0, 0.3, width) for p in params})
    values = _evaluate_vectors(ordered, env, rewrite.scalars)
    return _norm_kind(values, probe, params, env, ordered, rewrite.scalars)


def _norm_kind(
    values: Any,
    probe: Any,
    params: set[str],
    env: dict[str, Any],
    ordered: Sequence[NodeProto],
    scalars: dict[str, float],
) -> tuple[str, list[str], float] | None:
    """Which norm ``values`` are (RMSNorm or LayerNorm, with which vectors as scale and bias,
    and the epsilon added under the square root), or None."""
    if values is None or getattr(values, "shape", None) != probe.shape:
        return None
    eps = next(
        (scalars[name] for node in ordered if node.op_type == "Add" for name in node.input
         if name in scalars and 0 < scalars[name] < 1e-2),
        1e-5,
    )  # fmt: skip
    names = sorted(params)
    choices: list[tuple[str | None, str | None]] = [(None, None)]
    choices += [(w, None) for w in names] + [(w, b) for w in names for b in names if b != w]
    for kind, op in (("RMSNorm", "RMSNormalization"), ("LayerNorm", "LayerNormalization")):
        for weight, bias in choices:
            if {weight, bias} - {None} != set(params):
                continue
            expected = _norm_reference(kind, probe, eps, env.get(weight or ""), env.get(bias or ""))
            if np.allclose(values, expected, rtol=1e-6, atol=1e-9) and weight is not None:
                return op, [weight] + ([bias] if bias else []), float(eps)
    return None


# -- attention written out by exporters ---------------------------------------------------------

FUSED_DOMAIN = "capplan.fused"  # nodes the fusions create; never accepted from a file
_ATTENTION_MAX_NODES = 400  # nodes between an attention's input and its output projection
# Ops an attention subgraph may hold besides its projections and its two activation matmuls:
# head reshapes, scaling, masking, softmax fixes, rotary embedding, GQA repeats, shape reads.
_ATTENTION_GLUE = frozenset(
    {"Add", "Sub", "Mul", "Div", "Neg", "Sqrt", "Reshape", "Transpose", "Unsqueeze", "Squeeze",
     "Expand", "Tile", "Concat", "Slice", "Split", "Gather", "Shape", "Cast", "Identity",
     "Where", "IsNaN", "Dropout", "Softmax", "MatMul", "Gemm", "Flatten", "Equal", "Not",
     "ConstantOfShape", "Constant", "Range", "Max", "Min"}
)  # fmt: skip
_CAUSAL_COMPARE = frozenset({"Less", "LessOrEqual", "Greater", "GreaterOrEqual"})
# What an attention fusion may absorb or leave dead: its members and the masks and position
# tables it alone reads.
_ABSORBABLE = _ATTENTION_GLUE | _CAUSAL_COMPARE | frozenset(
    {"And", "Or", "Xor", "CumSum", "Trilu", "GatherND", "GatherElements", "Sin", "Cos", "IsInf",
     "ReduceMax", "ReduceMin", "ScatterND", "Pow"}
)  # fmt: skip
_HEAD_GLUE = frozenset({"Transpose", "Reshape", "Cast", "Identity", "Flatten", "Squeeze",
                        "Unsqueeze"})  # fmt: skip


@dataclass(frozen=True, slots=True)
class _Projection:
    """A MatMul / Gemm of an activation with a constant weight, and its bias if any."""

    node: int
    weight: str
    in_features: int
    out_features: int
    output: str  # after the bias
    bias: str | None


class _AttentionFinder:
    """Finds self-attention subgraphs in a node list (see :func:`fuse_attention`)."""

    def __init__(
        self,
        rewrite: _Rewrite,
        weights: dict[str, tuple[int, ...]],
        shapes: dict[str, list[int | str | None]],
    ) -> None:
        self.rewrite, self.weights, self.shapes = rewrite, weights, shapes
        self.nodes = rewrite.nodes

    def _readers(self, value: str) -> list[int]:
        return [i for i in self.rewrite.users.get(value, ()) if i not in self.rewrite.removed]

    def _dims(self, value: str) -> tuple[int, ...] | None:
        """Dims of the constant float tensor ``value`` is (through Identity / Cast copies and
        the Transpose of a 2-d weight that an unoptimized export keeps before its MatMul)."""
        transposed = False
        for _ in range(3):
            if value in self.weights:
                dims = self.weights[value]
                if transposed:
                    return dims[::-1] if len(dims) == 2 else None
                return dims
            index = self.rewrite.producer.get(value)
            if index is None:
                return None
            node = self.nodes[index]
            if node.op_type == "Transpose" and not transposed:
                perm = [list(a.ints) for a in node.attribute if a.name == "perm"]
                if perm and perm[0] != [1, 0]:
                    return None
                transposed = True
            elif node.op_type not in ("Identity", "Cast"):
                return None
            value = node.input[0]
        return None

    def _vector(self, value: str, size: int) -> bool:
        return self._dims(value) == (size,)

    def projection(self, index: int) -> _Projection | None:
        """``index`` as activation x weight (+ a bias of the output width)."""
        node = self.nodes[index]
        if len(node.input) < 2:
            return None
        weight, dims = node.input[1], self._dims(node.input[1])
        if dims is None or len(dims) != 2:
            return None
        if node.op_type == "MatMul":
            in_features, out_features = dims
            bias: str | None = None
        elif node.op_type == "Gemm":
            attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
            if attrs.get("transA", 0) or attrs.get("alpha", 1.0) != 1.0:
                return None
            rows, cols = dims
            in_features, out_features = (cols, rows) if attrs.get("transB", 0) else (rows, cols)
            bias = node.input[2] if len(node.input) > 2 and node.input[2] else None
            if bias is not None and not self._vector(bias, out_features):
                return None
        else:
            return None
        output = node.output[0]
        readers = self._readers(output)
        if bias is None and len(readers) == 1 and self.nodes[readers[0]].op_type == "Add":
            add = self.nodes[readers[0]]
            other = add.input[1] if add.input[0] == output else add.input[0]
            if self._vector(other, out_features):
                bias, output = other, add.output[0]
        return _Projection(index, weight, in_features, out_features, output, bias)

    def _back_to_projection(self, value: str, limit: int = 200) -> _Projection | None:
        """The nearest projection behind ``value`` (breadth first through any op)."""
        seen: set[str] = set()
        frontier = [value]
        while frontier and len(seen) < limit:
            following: list[str] = []
            for name in frontier:
                index = self.rewrite.producer.get(name)
                if name in seen or index is None or index in self.rewrite.removed:
                    continue
                seen.add(name)
                found = self.projection(index)
                if found is not None:
                    return found
                following.extend(i for i in self.nodes[index].input if i)
            frontier = following
        return None

    def _forward(self, value: str, through: frozenset[str], wanted: str, depth: int) -> int | None:
        """The first ``wanted`` node reading ``value`` (possibly through ``through`` ops)."""
        frontier = [value]
        for _ in range(depth):
            following: list[str] = []
            for name in frontier:
                for reader in self._readers(name):
                    op = self.nodes[reader].op_type
                    if op == wanted:
                        return reader
                    if op in through:
                        following.extend(self.nodes[reader].output)
            frontier = following
        return None

    def _scores_matmul(self, softmax: int) -> int | None:
        """The activation x activation MatMul whose (scaled, masked) result the softmax takes."""
        frontier, found = [self.nodes[softmax].input[0]], []
        for _ in range(6):
            following: list[str] = []
            for name in frontier:
                index = self.rewrite.producer.get(name)
                if index is None:
                    continue
                node = self.nodes[index]
                if node.op_type == "MatMul" and self.projection(index) is None:
                    found.append(index)
                elif node.op_type in ("Add", "Sub", "Mul", "Div", "Where", "Cast"):
                    following.extend(i for i in node.input if i)
            frontier = following
        return found[0] if len(set(found)) == 1 else None

    def region(self, x: str, out: str) -> set[int] | None:
        """Nodes on a path from ``x`` to ``out``: ancestors of ``out`` that depend on ``x``."""
        ancestors: set[int] = set()
        stack = [out]
        while stack:
            name = stack.pop()
            if name == x:
                continue
            index = self.rewrite.producer.get(name)
            if index is None or index in ancestors:
                continue
            if index in self.rewrite.removed:
                return None
            ancestors.add(index)
            if len(ancestors) > _ATTENTION_MAX_NODES:
                return None
            stack.extend(i for i in self.nodes[index].input if i)
        depends: set[str] = {x}
        members: set[int] = set()
        for index in sorted(ancestors):
            node = self.nodes[index]
            if any(i in depends for i in node.input):
                members.add(index)
                depends.update(node.output)
        return members

    def find(self, softmax: int) -> tuple[set[int], int, NodeProto, str] | None:
        """The attention around ``softmax``: members, last member, replacement, description."""
        nodes = self.nodes
        scores = self._scores_matmul(softmax)
        context = self._forward(
            nodes[softmax].output[0], frozenset({"IsNaN", "Where", "Cast", "Dropout",
                                                 "Identity"}), "MatMul", 4)  # fmt: skip
        if scores is None or context is None:
            return None
        # The output projection: after the context's head merge (transpose, reshape).
        value, out_proj = nodes[context].output[0], None
        for _ in range(6):  # shape reads of the context size the merge; privacy checks them
            readers = [r for r in self._readers(value) if nodes[r].op_type != "Shape"]
            if len(readers) != 1:
                return None
            out_proj = self.projection(readers[0])
            if out_proj is not None:
                break
            if nodes[readers[0]].op_type not in _HEAD_GLUE:
                return None
            value = nodes[readers[0]].output[0]
        if out_proj is None:
            return None
        q_proj = self._back_to_projection(nodes[scores].input[0])
        k_proj = self._back_to_projection(nodes[scores].input[1])
        v_proj = self._back_to_projection(nodes[context].input[1])
        if q_proj is None or k_proj is None or v_proj is None:
            return None
        x = nodes[q_proj.node].input[0]
        if any(nodes[p.node].input[0] != x for p in (k_proj, v_proj)):
            return None  # cross-attention or something else: left as it is
        x, out = self._unflattened(x), self._refolded(out_proj.output)
        members = self.region(x, out)
        if members is None or not {scores, context, softmax, out_proj.node} <= members:
            return None
        return self._described(
            members, x, out, (q_proj, k_proj, v_proj, out_proj), (scores, softmax, context)
        )

    def _unflattened(self, x: str) -> str:
        """``x``, or the [N, S, D] tensor it flattens to [N*S, D] for a Gemm (HF Conv1D)."""
        index = self.rewrite.producer.get(x)
        if index is None or self.nodes[index].op_type not in ("Reshape", "Flatten"):
            return x
        source = self.nodes[index].input[0]
        shown, flat = self.shapes.get(source), self.shapes.get(x)
        if shown and flat and len(shown) == 3 and len(flat) == 2 and shown[-1] == flat[-1]:
            return str(source)
        return x

    def _refolded(self, out: str) -> str:
        """``out``, or the reshape that brings a flattened [N*S, D] result back to [N, S, D]."""
        readers = self._readers(out)
        if len(readers) != 1 or self.nodes[readers[0]].op_type != "Reshape":
            return out
        after = self.nodes[readers[0]].output[0]
        shown, flat = self.shapes.get(after), self.shapes.get(out)
        if shown and flat and len(shown) == 3 and len(flat) == 2 and shown[-1] == flat[-1]:
            return str(after)
        return out

    def _described(
        self,
        members: set[int],
        x: str,
        out: str,
        projections: tuple[_Projection, _Projection, _Projection, _Projection],
        core: tuple[int, int, int],
    ) -> tuple[set[int], int, NodeProto, str] | None:
        """Checks the subgraph and builds its replacement (None when it is not attention)."""
        nodes = self.nodes
        scores, softmax, context = core
        q_proj, k_proj, v_proj, out_proj = projections
        proj_nodes = {p.node for p in projections}
        weights = {p.weight for p in projections}
        activation_matmuls = {i for i in members if nodes[i].op_type in ("MatMul", "Gemm")
                              and i not in proj_nodes}  # fmt: skip
        softmaxes = [i for i in members if nodes[i].op_type == "Softmax"]
        if activation_matmuls != {scores, context} or len(softmaxes) != 1:
            return None
        if any(nodes[i].op_type not in _ATTENTION_GLUE for i in members):
            return None
        biases = {p.bias for p in projections if p.bias}
        for i in members:  # no other parameter inside (a q/k norm, a gate): not this op
            for name in nodes[i].input:
                dims = self._dims(name)
                if dims and math.prod(dims) > 1 and name not in weights | biases:
                    return None
        if not self._private(members, out):
            return None
        head_dim = _last_int(self.shapes.get(nodes[scores].input[0]))
        hidden = _last_int(self.shapes.get(x))
        fused_qkv = q_proj.node == k_proj.node == v_proj.node
        if head_dim is None or hidden is None or q_proj.in_features != hidden:
            return None
        if fused_qkv:
            if q_proj.out_features % 3 or len({q_proj.node, k_proj.node, v_proj.node}) != 1:
                return None
            q_dim = kv_dim = q_proj.out_features // 3
        elif len({q_proj.node, k_proj.node, v_proj.node}) != 3:
            return None
        else:
            q_dim, kv_dim = q_proj.out_features, k_proj.out_features
            if v_proj.out_features != kv_dim:
                return None
        if q_dim % head_dim or kv_dim % head_dim or out_proj.in_features != q_dim:
            return None
        if out_proj.out_features != hidden or (q_dim // head_dim) % (kv_dim // head_dim):
            return None
        qkv_projs = [q_proj] if fused_qkv else [q_proj, k_proj, v_proj]
        qkv_bias = {p.bias is not None for p in qkv_projs}
        if len(qkv_bias) != 1:
            return None
        sdpa = _sdpa_arguments(nodes[softmax])
        dropout = next((self._dropout(i) for i in members if nodes[i].op_type == "Dropout"),
                       sdpa.get("dropout_p", 0.0))  # fmt: skip
        causal = self._causal(members, scores) or bool(sdpa.get("is_causal", 0.0))
        rotary = self._rotary(members, x)
        inputs = [x, *(p.weight for p in qkv_projs), out_proj.weight]
        inputs += [p.bias or "" for p in qkv_projs] + [out_proj.bias or ""]
        last = max(members)
        heads, kv_heads = q_dim // head_dim, kv_dim // head_dim
        node = onnx.helper.make_node(
            "Attention", inputs, [out], domain=FUSED_DOMAIN,
            name=f"{nodes[softmax].name or 'softmax'}_attention",
            num_heads=heads, num_kv_heads=kv_heads, head_dim=head_dim, causal=int(causal),
            rotary=int(rotary), dropout=float(dropout), qkv_bias=int(qkv_bias.pop()),
            out_bias=int(out_proj.bias is not None), fused_qkv=int(fused_qkv),
        )  # fmt: skip
        kind = ("causal " if causal else "") + ("GQA" if kv_heads < heads else "multi-head")
        if rotary:
            kind += " with rotary embedding"
        return members, last, node, kind

    def _private(self, members: set[int], out: str) -> bool:
        """Only members read what the members compute, except ``out``."""
        return all(
            all(u in members for u in self.rewrite.users.get(value, ()))
            and value not in self.rewrite.graph_outputs
            for i in members
            for value in self.nodes[i].output
            if value != out
        )

    def _dropout(self, index: int) -> float:
        node = self.nodes[index]
        for attribute in node.attribute:
            if attribute.name == "ratio":
                return round(float(attribute.f), 6)
        if len(node.input) > 1 and node.input[1] in self.rewrite.scalars:
            return round(float(self.rewrite.scalars[node.input[1]]), 6)
        return 0.5 if len(node.input) < 2 or not node.input[1] else 0.0

    def _ancestors(self, values: list[str], limit: int = 200) -> set[int]:
        found: set[int] = set()
        stack = list(values)
        while stack and len(found) < limit:
            index = self.rewrite.producer.get(stack.pop())
            if index is None or index in found:
                continue
            found.add(index)
            stack.extend(i for i in self.nodes[index].input if i)
        return found

    def _side_inputs(self, members: set[int], x: str) -> list[str]:
        produced = {o for i in members for o in self.nodes[i].output}
        return [
            name
            for i in members
            for name in self.nodes[i].input
            if name and name != x and name not in produced and name not in self.weights
        ]

    def _causal(self, members: set[int], scores: int) -> bool:
        """Whether the mask compares positions with positions (a causal mask built from
        ``Range``), comes from ``Trilu``, or slices a lower-triangular buffer."""
        chain = {i for i in members if i > scores and self.nodes[i].op_type != "Softmax"}
        sides = [n for i in chain for n in self.nodes[i].input
                 if n and self.rewrite.producer.get(n) not in members]  # fmt: skip
        ancestors = self._ancestors(sides)
        ranges = {o for i in ancestors if self.nodes[i].op_type == "Range"
                  for o in self.nodes[i].output}  # fmt: skip
        for i in sorted(ancestors):
            node = self.nodes[i]
            if node.op_type == "Trilu":
                return True
            if node.op_type in _CAUSAL_COMPARE and len(node.input) == 2:
                if all(self._ancestors([v]) & self._range_nodes(ranges) or v in ranges
                       for v in node.input):  # fmt: skip
                    return True
        return False

    def _range_nodes(self, ranges: set[str]) -> set[int]:
        return {self.rewrite.producer[r] for r in ranges if r in self.rewrite.producer}

    def _rotary(self, members: set[int], x: str) -> bool:
        """Whether the queries and keys are rotated by a sin/cos table (RoPE)."""
        ancestors = self._ancestors(self._side_inputs(members, x))
        return any(self.nodes[i].op_type in ("Sin", "Cos") for i in ancestors)


_SDPA_CALL = re.compile(
    r"aten\.scaled_dot_product_attention\.default\]?\(args = \((?P<args>[^)]*)\)"
    r"(?:, kwargs = \{(?P<kwargs>[^}]*)\})?"
)


def _sdpa_arguments(node: NodeProto) -> dict[str, float]:
    """``dropout_p`` and ``is_causal`` of the PyTorch SDPA call behind ``node``, from the dynamo
    exporter's provenance (``pkg.torch.onnx.fx_node``): its ONNX translation leaves attention
    dropout out, although PyTorch's training step runs it."""
    fx_node = next((p.value for p in node.metadata_props if p.key == "pkg.torch.onnx.fx_node"), "")
    match = _SDPA_CALL.search(fx_node)
    if match is None:
        return {}
    found: dict[str, float] = {}
    args = [a.strip() for a in match.group("args").split(",") if a.strip()]
    named = {
        key.strip(): value.strip()
        for key, _, value in (
            part.partition(":") for part in (match.group("kwargs") or "").split(",")
        )
        if key.strip()
    }
    for position, key in ((4, "dropout_p"), (5, "is_causal")):
        text = named.get(key, args[position] if len(args) > position else None)
        if text is None:
            continue
        try:
            value = 1.0 if text == "True" else 0.0 if text == "False" else float(text)
        except ValueError:
            continue
        if 0.0 <= value < 1.0 or key == "is_causal":
            found[key] = round(value, 6)
    return found


def _last_int(shape: list[int | str | None] | None) -> int | None:
    if not shape or not isinstance(shape[-1], int):
        return None
    return shape[-1]


_MLP_ACTIVATION_OF = {"relu": "relu", "silu": "silu"}
# Layers one feed-forward fusion replaces at most: 3 projections, activation (sigmoid and two
# muls for SwiGLU) and a reshape around each projection.
_MLP_MAX_LAYERS = 12
# Norm nodes, or the ReduceMean every written-out norm holds (a feed-forward is fused only
# behind a norm).
_NORM_OPS_OUT = frozenset({"LayerNormalization", "RMSNormalization", "ReduceMean"})


class _LayerChain:
    """Layers by name, and how many layers read each (to fuse private chains)."""

    def __init__(self, layers: list[dict[str, Any]]) -> None:
        self.layers = layers
        self.by_name = {str(layer["name"]): layer for layer in layers}
        self.readers: Counter[str] = Counter(i for layer in layers for i in layer["inputs"])
        self.tied = {str(layer["tied_to"]) for layer in layers if "tied_to" in layer}

    def private(self, name: str, op: str | tuple[str, ...]) -> dict[str, Any] | None:
        """The layer ``name`` when it is an ``op``, read once, and nothing is tied to it."""
        layer = self.by_name.get(name)
        ops = (op,) if isinstance(op, str) else op
        if layer is None or layer["op"] not in ops or self.readers[name] != 1:
            return None
        return None if name in self.tied else layer

    def behind_reshapes(self, name: str, members: list[str]) -> str:
        """``name``, or the value a chain of private reshapes started from."""
        while (layer := self.private(name, "reshape")) is not None:
            members.append(name)
            name = str(layer["inputs"][0])
        return name


def _mlp_activation(layer: dict[str, Any], composite: set[str]) -> str | None:
    if layer["op"] == "gelu":
        if layer.get("approximate", "none") == "none":
            return "gelu"
        return "gelu_new" if layer["name"] in composite else "gelu_tanh"
    return _MLP_ACTIVATION_OF.get(str(layer["op"]))


def _gated(chain: _LayerChain, name: str, members: list[str]) -> tuple[str, str] | None:
    """``name`` as SwiGLU's product silu(gate(x)) * up(x): (x, the gate's name)."""
    product = chain.private(name, "elementwise")
    if product is None or product.get("function") != "mul" or len(product["inputs"]) != 2:
        return None
    for silu_name, up_name in (product["inputs"], product["inputs"][::-1]):
        silu = chain.private(silu_name, ("elementwise", "silu"))
        up = chain.private(up_name, "linear")
        if silu is None or up is None:
            continue
        gate_name: str | None = None
        sigmoids: list[str] = []  # silu written as x * sigmoid(x): its sigmoid layer
        if silu["op"] == "silu":
            gate_name = str(silu["inputs"][0])
        elif silu.get("function") == "mul" and len(silu["inputs"]) == 2:
            a, b = (str(v) for v in silu["inputs"])
            for linear, sigmoid in ((a, b), (b, a)):
                found = chain.by_name.get(sigmoid)
                if found is not None and found["op"] == "sigmoid" and found["inputs"] == [linear]:
                    if chain.readers[sigmoid] == 1 and chain.readers[linear] == 2:
                        gate_name, sigmoids = linear, [sigmoid]
                        break
        gate = chain.by_name.get(gate_name or "")
        if gate is None or gate["op"] != "linear" or gate_name in chain.tied:
            continue
        if gate["inputs"] != up["inputs"] or gate["out_features"] != up["out_features"]:
            continue
        if gate.get("bias") != up.get("bias"):
            continue
        members += [*sigmoids, name, silu_name, up_name, str(gate_name)]
        return str(up["inputs"][0]), str(gate_name)
    return None


def fuse_mlps(
    layers: list[dict[str, Any]], widths: dict[str, int], composite: set[str]
) -> tuple[list[dict[str, Any]], Counter[str]]:
    """Replace each feed-forward network written out as layers (linear, activation, linear;
    or SwiGLU's silu(gate(x)) * up(x) before the down projection) with one ``mlp`` layer, as
    the zoo builds transformers: a norm's output -> linear -> gelu / relu / silu -> linear whose
    output is as wide as its input (``widths``: the last dim of each layer's output), every
    intermediate read by the next step only, the same bias setting on every projection, and
    nothing tied to them (a stack of linear and relu layers outside a transformer stays).
    Reshapes around the projections (HF Conv1D flattens to 2-d for a Gemm) are absorbed. A
    tanh GELU in ``composite`` (computed op by op, per the exporter's provenance) is
    ``gelu_new``, whose intermediates autograd keeps."""
    chain = _LayerChain(layers)
    fused: Counter[str] = Counter()
    removed: set[str] = set()
    replaced: dict[str, dict[str, Any]] = {}
    for down in layers:
        if down["op"] != "linear" or "tied_to" in down or down["name"] in removed:
            continue
        members: list[str] = []
        inner = chain.behind_reshapes(str(down["inputs"][0]), members)
        activation_layer = chain.private(inner, ("gelu", "relu", "silu"))
        gated = None if activation_layer is not None else _gated(chain, inner, members)
        if activation_layer is not None:
            activation = _mlp_activation(activation_layer, composite)
            members.append(inner)
            up_name = chain.behind_reshapes(str(activation_layer["inputs"][0]), members)
            up = chain.private(up_name, "linear")
            if up is None or activation is None:
                continue
            members.append(up_name)
            x = str(up["inputs"][0])
        elif gated is not None:
            activation = "swiglu"
            x, gate_name = gated
            up = chain.by_name[gate_name]
        else:
            continue
        x = chain.behind_reshapes(x, members)
        source = chain.by_name.get(x)
        if source is None or source["op"] not in ("layernorm", "rmsnorm"):
            continue  # a transformer's feed-forward reads a norm; a plain MLP stack stays
        out_name = str(down["name"])
        after = [r for r in layers if out_name in r["inputs"]]
        if len(after) == 1 and after[0]["op"] == "reshape" and chain.readers[out_name] == 1:
            members.append(out_name)
            out_name = str(after[0]["name"])
        hidden = widths.get(x)
        if hidden is None or widths.get(out_name) != hidden or down["out_features"] != hidden:
            continue
        if down.get("bias", True) != up.get("bias", True):
            continue
        if (removed | set(replaced)) & {*members, out_name}:
            continue
        removed.update(m for m in members if m != out_name)
        replaced[out_name] = {
            "name": out_name, "op": "mlp", "intermediate_size": up["out_features"],
            "activation": activation, "bias": bool(up.get("bias", True)), "inputs": [x],
        }  # fmt: skip
        fused[f"{activation}"] += 1
    result = [replaced.get(str(layer["name"]), layer) for layer in layers
              if layer["name"] not in removed or layer["name"] in replaced]  # fmt: skip
    return result, fused


def _constant_weights(nodes: Sequence[NodeProto]) -> dict[str, tuple[int, ...]]:
    """Dims of the float tensors that Constant nodes hold (exporters store weights so too)."""
    found: dict[str, tuple[int, ...]] = {}
    for node in nodes:
        if node.op_type != "Constant":
            continue
        for attribute in node.attribute:
            if attribute.name == "value" and attribute.t.data_type in _FLOAT_TYPES:
                found[node.output[0]] = tuple(attribute.t.dims)
    return found


def fuse_attention(
    nodes: list[NodeProto],
    scalars: dict[str, float],
    graph_outputs: set[str],
    weights: dict[str, tuple[int, ...]],
    shapes: dict[str, list[int | str | None]],
) -> tuple[list[NodeProto], Counter[str]]:
    """Replace each self-attention that an exporter wrote out (q/k/v projections, head
    reshapes, scores = q k^T scaled and masked, softmax, context = probabilities x v, head
    merge, output projection) with one ``Attention`` node of :data:`FUSED_DOMAIN`.

    Anchored on each Softmax: the scores MatMul behind it, the context MatMul after it (through
    the NaN fix of SDPA's decomposition and dropout), the output projection after the head
    merge, and the nearest projections behind the queries, keys and values, which must read one
    tensor ``x``. The subgraph is every node on a path from ``x`` to the output projection's
    result: it may hold only reshapes, scaling, masking, rotary embedding and GQA repeats
    besides those (no other parameter), and nothing outside may read its intermediates. Heads
    come from the queries' last dim (the head size) and the projections' widths; ``causal``
    when the mask compares positions with positions (``Range``), comes from ``Trilu``;
    ``rotary`` when a sin/cos table rotates queries and keys. Masks and tables that only the
    attention read are dropped with it (nodes the file itself left unread stay).
    """
    rewrite = _Rewrite(nodes, scalars, graph_outputs)
    finder = _AttentionFinder(rewrite, weights, shapes)
    fused: Counter[str] = Counter()
    for anchor, node in enumerate(nodes):
        if node.op_type != "Softmax" or anchor in rewrite.removed:
            continue
        found = finder.find(anchor)
        if found is None:
            continue
        members, last, replacement, kind = found
        rewrite.replace(members, last, replacement)
        fused[kind] += 1
    if not fused:
        return nodes, fused
    result = rewrite.result()
    orphaned = _live(nodes, graph_outputs) - _live(result, graph_outputs)
    return [node for node in result if id(node) not in orphaned], fused


def _live(nodes: list[NodeProto], graph_outputs: set[str]) -> set[int]:
    """Ids of the nodes whose outputs something reads (a graph output or a live node)."""
    read = set(graph_outputs)
    found: set[int] = set()
    for node in reversed(nodes):
        if any(o in read for o in node.output):
            found.add(id(node))
            read.update(i for i in node.input if i)
    return found


def _small_ints(tensor: TensorProto) -> tuple[int, ...] | None:
    if tensor.data_type not in _INT_TYPES or math.prod(tensor.dims) > SMALL_VALUES:
        return None
    if _has_external_data(tensor) or _stored_elements(tensor) != math.prod(tensor.dims):
        return None  # no data: the value is unknown (never read from a path)
    return tuple(int(v) for v in onnx.numpy_helper.to_array(tensor).reshape(-1).tolist())


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


def _initializer_parameters(mapper: _Mapper) -> tuple[int, list[str], int]:
    """Parameters by the initializers alone: float tensors of more than one element that some
    supported node reads, less batch-norm running statistics. Also returns the names of those
    that feed no recognized weight slot (counted as parameters by assumption) and the
    elements read only by unsupported nodes (left out)."""
    buffers: set[str] = set()
    weight_slots: set[str] = set(mapper.folded_biases)
    vector_reads: Counter[str] = Counter(mapper.bias_reads)
    slots = {"Conv": (1, 2), "Gemm": (1, 2), "MatMul": (1,), "LayerNormalization": (1, 2),
             "RMSNormalization": (1,), "BatchNormalization": (1, 2), "Gather": (0,),
             "LSTM": (1, 2, 3), "GRU": (1, 2, 3), "RNN": (1, 2, 3)}  # fmt: skip
    for node in mapper.nodes:
        if node.op_type == "BatchNormalization":
            buffers.update(node.input[3:5])
        if id(node) in mapper.synthesized and node.domain == FUSED_DOMAIN:
            positions: Sequence[int] = range(1, len(node.input))
        else:
            positions = slots.get(node.op_type, ())
        for position in positions:
            if len(node.input) > position and node.input[position]:
                const = mapper.consts.get(node.input[position])
                origin = const.origin if const and const.origin else node.input[position]
                weight_slots.add(origin)
                if const is not None and const.dims is not None and len(const.dims) == 1:
                    vector_reads[origin] += 1
    total, assumed, unsupported_only = 0, [], 0
    shared = 0
    for name, tensor in mapper.initializers.items():
        numel = math.prod(tensor.dims)
        if tensor.data_type not in _FLOAT_TYPES or numel <= 1 or name in buffers:
            continue
        if name in mapper.tied_copies or name in mapper.not_parameters:
            continue  # the same parameters as the tensor it copies; a fold's own bias
        if name not in mapper.supported_inputs:
            if name in mapper.unsupported_inputs:
                unsupported_only += numel
            continue
        # Exporters store equal tensors once (the dynamo exporter's optimizer merges the ones
        # and zeros of freshly initialised norms and biases): a vector that several layers
        # read as their bias or scale is a parameter of each.
        reads = max(1, vector_reads[name]) if len(tensor.dims) == 1 else 1
        total += numel * reads
        shared += reads > 1
        if name not in weight_slots:
            assumed.append(name)
    mapper.shared_vectors = shared
    return total + mapper.restored_params, assumed, unsupported_only


def load_onnx(read: Callable[[], bytes]) -> tuple[ModelProto, Weightless]:
    """Parse the bytes ``read()`` returns and release their weights.

    Only this call holds the bytes, so they are freed as soon as they are parsed; protobuf frees
    a cleared field's memory only with its whole message, so the stripped model is replaced by
    a copy of itself (a few MB). An import's peak is thus the file about twice, while parsing
    (``benchmarks/import_memory.py``), not for the whole import.
    """
    model = parse_model(read())
    weightless = strip_weights(model)
    compact = ModelProto()
    compact.ParseFromString(model.SerializeToString())
    return compact, weightless


def import_onnx(
    data: bytes, *, lenient: bool = False, sequence_length: int | None = None
) -> ImportedGraph:
    """Map an ONNX model onto the layer graph (see :func:`import_onnx_read`)."""
    return import_onnx_read(lambda: data, lenient=lenient, sequence_length=sequence_length)


def import_onnx_read(
    read: Callable[[], bytes], *, lenient: bool = False, sequence_length: int | None = None
) -> ImportedGraph:
    """Map the ONNX model ``read()`` returns onto the layer graph; the bytes are dropped once
    parsed when the caller holds no other reference (an upload read from its spooled file).

    Raises
    ------
    ImportRejected
        Garbage or truncated bytes, absurd sizes, a cyclic graph, failed shape inference,
        unsupported ops (unless ``lenient``), or a parameter count that does not add up.
    """
    model, weightless = load_onnx(read)
    seq = sequence_length or DEFAULT_SEQUENCE_LENGTH
    mapper = _Mapper(model, lenient=lenient)
    mapper.copies = weightless.copies
    try:
        mapper.run()
    except ImportRejected:
        raise
    except Exception as exc:  # a well-formed graph the mapper does not expect: a 422, never 500
        node = len(mapper.mapping) and sum(sum(c.values()) for c in mapper.mapping.values())
        raise _reject(
            f"the importer could not map this graph (stopped near node {node}: "
            f"{type(exc).__name__}); please report it with the file",
            kind="unmappable-onnx",
        ) from exc
    unsupported = tuple(
        UnsupportedOp(source_op=op, count=len(nodes), nodes=tuple(nodes[:5]))
        for op, nodes in sorted(mapper.unsupported.items())
    )
    if unsupported and not lenient:
        listing = ", ".join(f"{u.source_op} (x{u.count})" for u in unsupported)
        raise ImportRejected(
            f"the model uses ops that cannot be imported: {listing}; send lenient=true to "
            "import them as shape-preserving layers without parameters",
            pointer="/file",
            problems=mapper.unsupported_problems[:50],
            kind="unsupported-onnx-ops",
        )
    if not mapper.layers:
        raise _reject("no node of the graph computes on its inputs; nothing to import")
    bindings = {"seq": seq} if any("seq" in decl.shape for decl in mapper.inputs) else {}
    graph_params = graph_parameter_count(mapper.inputs, mapper.layers, bindings)
    source_params, assumed, left_out = _initializer_parameters(mapper)
    if graph_params != source_params:
        raise ImportRejected(
            f"parameter count mismatch: the initializers hold {source_params:,} parameters "
            f"but the imported graph has {graph_params:,}; the mapping lost or duplicated "
            "weights, so the model was not stored",
            pointer="/file",
            kind="parameter-mismatch",
        )
    notes = list(mapper.notes)
    if assumed:
        shown = ", ".join(assumed[:5]) + (" ..." if len(assumed) > 5 else "")
        notes.append(
            f"{len(assumed)} float initializer(s) outside a weight slot counted as parameters "
            f"(ONNX does not tell parameters from buffers): {shown}"
        )
    if left_out:
        notes.append(f"{left_out:,} initializer elements read only by unsupported ops are left out")
    if mapper.shared_vectors:
        notes.append(
            f"{mapper.shared_vectors} vector(s) (biases, norm scales) are read by several layers "
            "and counted once per layer: exporters store equal tensors once (freshly initialised "
            "biases and norm scales are all zeros or ones)"
        )
    if unsupported:
        notes.append("unsupported ops imported as shape-preserving layers with no parameters, "
                     "FLOPs or saved tensors: estimates are a lower bound there")  # fmt: skip
    if bindings:
        notes.append(f"default sequence length {seq}")
    notes.append("batch-norm running statistics are buffers, not parameters")
    for pattern, count in mapper.fused.items():
        notes.append(f"fused {count} exporter subgraph(s): {pattern}")
    if mapper.restored_batch_norms:
        notes.append(
            f"{mapper.restored_batch_norms} batch norm(s) restored after their convolutions: the "
            "dynamo exporter's optimizer folded them in (in train mode too) and its provenance "
            f"names them; their {mapper.restored_params:,} parameters are counted"
        )
    folded = 0 if mapper.restored_batch_norms else _possibly_folded_batch_norm(model)
    if folded:
        for layer in mapper.layers:
            if layer["op"] == "conv2d" and layer.get("bias"):
                layer["batchnorm_folded"] = True
        notes.append(
            f"{folded} convolution(s) carry a bias and the graph has no BatchNormalization: if "
            "the model has batch norm, an eval-mode torch.onnx.export folded it into the "
            "convolutions, and training estimates miss its saved tensors (the convolutions are "
            "marked batchnorm_folded and training estimates say so); for training, export "
            "with training=torch.onnx.TrainingMode.TRAINING (inference estimates are unaffected)"
        )
    if weightless.external or weightless.empty:
        notes.append(
            f"shapes without weights: {weightless.external} initializer(s) refer to external "
            f"data (never read) and {weightless.empty} carry no data; their dims give the "
            "parameters"
        )
    producer = model.producer_name or "unknown producer"
    graph_name = model.graph.name or "onnx model"
    mapping = tuple(
        OpMapping(source_op=op, count=count, mapped_to=ops)
        for op, counter in sorted(mapper.mapping.items())
        for ops, count in sorted(counter.items())
    )
    return ImportedGraph(
        name=graph_name[:200],
        family="onnx",
        description=(
            f"Imported from ONNX (producer {producer} {model.producer_version}, IR "
            f"{model.ir_version}, opset {_default_opset(model)}): {len(model.graph.node)} nodes, "
            f"{len(mapper.layers)} layers."
        )[:4000],
        inputs=tuple(mapper.inputs),
        layers=mapper.layers,
        default_bindings=bindings,
        parameter_count=graph_params,
        source_parameter_count=source_params,
        reference="ONNX initializers",
        op_mapping=mapping,
        unsupported=unsupported,
        assumptions=tuple(notes),
    )
