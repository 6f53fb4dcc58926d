"""Norms as exporters leave them: LayerNorm and RMSNorm written out op by op -> one node
(recognised by evaluating the subgraph), and batch norms folded into convolutions
(by the dynamo exporter's provenance, or by the mark an eval-mode export leaves).
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence
from typing import Any

import numpy as np
import onnx
from onnx import ModelProto, NodeProto

from app.importers.onnx_model.proto import _all_nodes
from app.importers.onnx_model.rewrite import _Rewrite

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
