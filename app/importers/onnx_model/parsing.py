"""ONNX bytes -> a checked ``ModelProto``: garbage, truncation, absurd sizes and cycles are
rejected right after the protobuf is parsed, before anything costly (shape inference,
mapping, the graph's own shape inference); each check is one pass or less.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

import onnx
from onnx import GraphProto, ModelProto, NodeProto, TensorProto

from app.domain.graph.format import MAX_DIM
from app.importers.onnx_model.attention import _ABSORBABLE, _ATTENTION_MAX_NODES
from app.importers.onnx_model.mapper_base import _REDUCE, _SHAPE_OPS
from app.importers.onnx_model.mlp import _MLP_MAX_LAYERS, _NORM_OPS_OUT
from app.importers.onnx_model.proto import (
    _FLOAT_TYPES,
    _all_nodes,
    _default_opset,
    _has_external_data,
    _reject,
    _stored_elements,
    _subgraphs,
)
from app.importers.result import (
    MAX_STORED_INPUT_RANK,
    MAX_STORED_INPUTS,
    MAX_STORED_LAYERS,
)

# Structural caps, checked right after the protobuf is parsed and before anything costly
# (shape inference, mapping, the graph's own shape inference): each is one pass or less.
MAX_NODES = 50_000  # subgraphs included
MAX_NODE_EDGES = 16 * MAX_NODES  # node inputs + outputs
MAX_TENSORS = 2 * MAX_NODES  # initializers, sparse initializers and attribute tensors
MAX_DECLARED_VALUES = 4 * MAX_NODES  # graph inputs, outputs and value_info
MAX_DECLARED_RANK = 32
MIN_OPSET, MIN_IR = 7, 3


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
