"""Turn a recorded PyTorch trace into the service's layer graph (no torch needed here).

:mod:`app.client.torch_import` runs a module on meta tensors and records plain JSON: every
module call (type, path, simple attributes, its own parameters, argument and output tensors)
and every torch function call, with tensors numbered by version. The two probe runs are merged
into symbolic shapes (:func:`app.client.torch_trace.merge_probes`) and this module converts the
record into layers (:func:`convert_trace`), mirroring the built-in zoo graphs
(:mod:`app.domain.zoo`).

The conversion's parts, all torch-free: :mod:`app.client.torch_trace` (inputs, the record's
vocabulary, the merge of the probes), :mod:`app.client.torch_walk` (the walk over the record)
with the conversions of leaf modules (``torch_modules``) and of function calls
(``torch_calls``) over ``torch_convert`` (the converter's state); here, what follows the walk
(feed-forward blocks fused into ``mlp`` layers, the parameter check, the notes). Names with a
leading underscore are private to these modules.
"""

from __future__ import annotations

from typing import Any

from app.client.torch_trace import TraceError, _prod
from app.client.torch_walk import _Converter

_GATED = {"silu": "swiglu", "gelu": "geglu", "gelu_tanh": "geglu"}


def _readers(layers: list[dict[str, Any]]) -> dict[str, list[str]]:
    readers: dict[str, list[str]] = {}
    for layer in layers:
        for ref in layer.get("inputs", []):
            readers.setdefault(ref, []).append(layer["name"])
    return readers


def _fuse_mlps(layers: list[dict[str, Any]], meta: dict[str, dict[str, Any]]) -> list[str]:
    """linear -> activation -> linear (and gated: act(gate(x)) * up(x) -> down) into ``mlp``."""
    by_name = {layer["name"]: layer for layer in layers}
    readers = _readers(layers)
    fused: list[str] = []
    removed: set[str] = set()

    def only_reader(name: str) -> str | None:
        found = readers.get(name, [])
        return found[0] if len(found) == 1 else None

    def plain_linear(name: str | None) -> dict[str, Any] | None:
        layer = by_name.get(name or "")
        if layer is None or layer["op"] != "linear" or "tied_to" in layer or name in removed:
            return None
        return layer

    for up in list(layers):
        if up["name"] in removed or plain_linear(up["name"]) is None:
            continue
        act = by_name.get(only_reader(up["name"]) or "")
        if act is None or meta.get(act["name"], {}).get("act") is None:
            continue
        activation = meta[act["name"]]["act"]
        if act.get("inputs") != [up["name"]]:
            continue
        bias = up.get("bias", True)
        next_name = only_reader(act["name"])
        down = plain_linear(next_name)
        parts = [up, act]
        gated = None
        if down is None and next_name is not None:
            product = by_name[next_name]
            others = [r for r in product.get("inputs", []) if r != act["name"]]
            if (
                product["op"] == "elementwise"
                and product["function"] == "mul"
                and len(others) == 1
                and activation in _GATED
            ):
                gate_up = plain_linear(others[0])
                if (
                    gate_up is not None
                    and gate_up.get("inputs") == up.get("inputs")
                    and gate_up["out_features"] == up["out_features"]
                    and only_reader(gate_up["name"]) == product["name"]
                ):
                    down = plain_linear(only_reader(product["name"]))
                    parts += [gate_up, product]
                    gated = _GATED[activation]
        if (
            down is None
            or down.get("bias", True) != bias
            or down["out_features"] != meta[up["name"]].get("in_features")
        ):
            continue
        name = _common_prefix(up["name"], down["name"])
        if name in by_name and by_name[name] is not down:
            name = f"{name}.mlp"
        down.clear()
        down.update({
            "name": name, "op": "mlp", "inputs": up["inputs"],
            "intermediate_size": up["out_features"], "activation": gated or activation,
        })  # fmt: skip
        if not bias:
            down["bias"] = False
        meta[name] = {
            "params": tuple(
                p for part in [*parts, down] for p in meta.get(part["name"], {}).get("params", ())
            ),
            "act": None,
        }
        removed |= {part["name"] for part in parts}
        fused.append(name)
        old_down = [k for k, v in by_name.items() if v is down and k != name]
        for old in old_down:
            for layer in layers:
                layer["inputs"] = [name if r == old else r for r in layer.get("inputs", [])]
        by_name[name] = down
    layers[:] = [layer for layer in layers if layer["name"] not in removed]
    return fused


def _common_prefix(first: str, second: str) -> str:
    a, b = first.split("."), second.split(".")
    common: list[str] = []
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        common.append(x)
    return ".".join(common) if common else first + "_mlp"


def convert_trace(record: dict[str, Any], *, sequence_length: int | None = None) -> dict[str, Any]:
    """Convert a merged trace record into ``{"inputs", "layers", "default_bindings",
    "assumptions"}`` (the first three as ``POST /v1/models`` accepts them)."""
    converter = _Converter(record)
    converter.walk(None)
    if converter.pending_out:
        raise TraceError(
            "attention without an output projection: " + ", ".join(converter.pending_out)
        )
    if converter.unsupported:
        listed = "; ".join(
            f"{op} ({len(where)}x, e.g. {where[0]})" for op, where in converter.unsupported.items()
        )
        raise TraceError(f"the traced graph uses ops the service cannot model: {listed}")
    layers, meta = converter.layers, converter.meta
    if not layers:
        raise TraceError("the trace produced no layers")
    # Drop layers nothing reads except the last (the output), e.g. a pooler nobody uses.
    fused = _fuse_mlps(layers, meta)
    covered = {p for m in meta.values() for p in m.get("params", ())}
    missing = {k: v for k, v in record["params"].items() if k not in covered}
    in_graph = sum(_prod(v) for k, v in record["params"].items() if k in covered)
    total = record["param_count"]
    assumptions = [
        f"{in_graph:,} parameters in the graph; model.parameters() holds {total:,}",
        "traced on the meta device in training mode (dropout and batch norm as in training)",
    ]
    if fused:
        assumptions.append(f"{len(fused)} feed-forward blocks became mlp layers")
    guesses = record.get("guesses") or {}
    if guesses:
        assumptions.append(
            "value-dependent branches took the plain path (meta tensors have no values): "
            + ", ".join(f"{k} x{v}" for k, v in sorted(guesses.items()))
        )
    if missing:
        count = sum(_prod(v) for v in missing.values())
        assumptions.append(
            f"{len(missing)} parameters ({count:,} values) are not used by forward and are "
            f"left out, e.g. {sorted(missing)[0]}"
        )
    previous: str | None = None
    for layer in layers:
        if layer.get("inputs") == [previous] and previous is not None:
            del layer["inputs"]
        elif layer["op"] == "tensor":
            layer.pop("inputs", None)
        previous = layer["name"]
    inputs = [
        {"name": spec["name"], "shape": spec["shape"], "dtype": spec["dtype"]}
        for spec in record["inputs"]
    ]
    uses_seq = any("seq" in spec["shape"] for spec in inputs)
    bindings = {"seq": sequence_length} if uses_seq and sequence_length else {}
    if uses_seq and not sequence_length:
        assumptions.append("no default sequence length (--seq): give one with each estimate")
    return {
        "inputs": inputs,
        "layers": layers,
        "default_bindings": bindings,
        "assumptions": assumptions,
    }
