"""Rewriting a node list: who produces and reads each value, the cone of a value, and the
nodes a fusion replaces; the float scalars that the patterns are evaluated with.
"""

from __future__ import annotations

import math

import onnx
from onnx import GraphProto, NodeProto

from app.importers.onnx_model.proto import (
    _FLOAT_TYPES,
    _INT_TYPES,
    _has_external_data,
    _stored_elements,
)

_FUSE_MAX_NODES = 12


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


def _live(nodes: list[NodeProto], graph_outputs: set[str]) -> set[int]:
    """Ids of the nodes whose outputs something reads (a graph output or a live node)."""
    read = set(graph_outputs)
    found: set[int] = set()
    for node in reversed(nodes):
        if any(o in read for o in node.output):
            found.add(id(node))
            read.update(i for i in node.input if i)
    return found
