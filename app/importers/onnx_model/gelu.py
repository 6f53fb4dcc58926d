"""GELU written out by exporters (the erf form of torch.onnx.export, the tanh form of
GPT-2's ``gelu_new``) -> one ``Gelu`` node, recognised by evaluating the subgraph.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence

import onnx
from onnx import NodeProto

from app.importers.onnx_model.rewrite import _Rewrite

_GELU_OPS = frozenset({"Div", "Mul", "Add", "Sub", "Pow", "Erf", "Tanh"})


_GELU_PROBE = (-3.0, -1.7, -0.6, -0.1, 0.0, 0.2, 0.9, 1.6, 3.2)


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


def _composite(nodes: Sequence[NodeProto]) -> bool:
    """Whether the dynamo exporter's provenance says PyTorch computed these nodes op by op
    (Hugging Face's ``gelu_new``: pow, mul, add, tanh; autograd keeps the intermediates), not
    as one ``aten.gelu`` kernel. False without provenance (the TorchScript exporter)."""
    traced = [p.value for node in nodes for p in node.metadata_props
              if p.key == "pkg.torch.onnx.fx_node"]  # fmt: skip
    return bool(traced) and not any("aten.gelu" in value for value in traced)
