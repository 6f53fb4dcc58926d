"""Self-attention written out by exporters (projections, scores, softmax, context, output
projection) -> one ``Attention`` node of :data:`FUSED_DOMAIN`.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

import onnx
from onnx import NodeProto

from app.importers.onnx_model.proto import _FLOAT_TYPES
from app.importers.onnx_model.rewrite import _live, _Rewrite

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
