"""The converter's state and the steps every conversion uses: what each traced tensor is
(a layer's output, derived from weights, or a constant), the layers emitted so far, a
projection (a linear layer), and reading a recorded event's arguments.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from app.client.torch_trace import TraceError

# Values a tensor can hold during conversion.
LIVE, PARAM, CONST = "live", "param", "const"


@dataclass(slots=True)
class _Value:
    """What a traced tensor is: a layer's output (live), derived from weights only, or a
    constant (masks, positions). ``ref`` is the layer or input name of a live value."""

    kind: str
    ref: str = ""
    param: str = ""  # PARAM: the parameter it derives from
    embedding_rows: int = 0  # PARAM: a lookup in an embedding table of this many rows
    positional: bool = False  # indexed by positions (arange / position buffers)


_PROJECTIONS = frozenset({"Linear", "Conv1D"})


def _tensor_refs(value: Any) -> list[int]:
    """Tensor numbers in an encoded argument, in order."""
    if isinstance(value, dict):
        if "t" in value and len(value) == 1:
            return [value["t"]]
        return [n for v in value.values() for n in _tensor_refs(v)]
    if isinstance(value, list):
        return [n for v in value for n in _tensor_refs(v)]
    return []


def _arg(event: dict[str, Any], index: int, name: str, default: Any = None) -> Any:
    """Argument ``index`` (positional) or ``name`` (keyword) of a call."""
    args = event.get("args", [])
    if index < len(args):
        return args[index]
    return event.get("kwargs", {}).get(name, default)


def _int_or_pair(value: Any) -> Any:
    if isinstance(value, list) and len(value) == 2 and value[0] == value[1]:
        return value[0]
    if isinstance(value, list) and len(value) == 1:
        return value[0]
    return value


def _triple(value: Any) -> list[Any]:
    return list(value) if isinstance(value, list) else [value] * 3


def _int_or_triple(value: Any) -> Any:
    """An int where all three spatial dims agree (``[3, 3, 3]`` -> 3), else the list."""
    if isinstance(value, list) and len(value) in (1, 3) and len(set(value)) == 1:
        return value[0]
    return value


class _ConverterBase:
    """A merged trace record being converted: its tensors' values and the layers so far."""

    def __init__(self, record: dict[str, Any]) -> None:
        self.record = record
        self.tensors: list[dict[str, Any]] = record["tensors"]
        self.events: list[dict[str, Any]] = record["events"]
        self.children: dict[int | None, list[int]] = {}
        for event in self.events:
            self.children.setdefault(event["parent"], []).append(event["id"])
        self.values: dict[int, _Value] = {}
        self.layers: list[dict[str, Any]] = []
        self.meta: dict[str, dict[str, Any]] = {}  # layer name -> conversion notes
        self.names: set[str] = set()
        self.owner: dict[str, str] = {}  # parameter -> the layer that holds it
        self.pending_out: dict[str, dict[str, Any]] = {}  # attention awaiting its o-projection
        self.unsupported: dict[str, list[str]] = {}
        self.assumptions: list[str] = []
        self._candidates: dict[int, bool] = {}

    # -- values
    def value(self, number: int) -> _Value:
        known = self.values.get(number)
        if known is not None:
            return known
        tensor = self.tensors[number]
        if "input" in tensor:
            found = _Value(LIVE, ref=tensor["input"])
        elif "param" in tensor:
            found = _Value(PARAM, param=tensor["param"])
        elif "buffer" in tensor:
            found = _Value(CONST, positional="position" in tensor["buffer"])
        else:
            found = _Value(CONST)
        self.values[number] = found
        return found

    def shape(self, number: int) -> list[Any]:
        shape: list[Any] = self.tensors[number]["shape"]
        return shape

    def inputs_of(self, event: dict[str, Any]) -> list[int]:
        return _tensor_refs(event.get("args", [])) + _tensor_refs(event.get("kwargs", {}))

    def outputs_of(self, event: dict[str, Any]) -> list[int]:
        return _tensor_refs(event.get("out"))

    def set_outputs(
        self, event: dict[str, Any], value: _Value, *, first_only: bool = False
    ) -> None:
        outputs = self.outputs_of(event)
        for index, number in enumerate(outputs):
            if first_only and index:
                self.values[number] = _Value(CONST, ref=f"unsupported:{event_name(event)}")
            else:
                self.values[number] = value

    # -- layers
    def unique(self, base: str) -> str:
        base = (base or "layer")[:120]
        name, index = base, 1
        while name in self.names:
            name = f"{base}_{index}"
            index += 1
        self.names.add(name)
        return name

    def emit(
        self,
        event: dict[str, Any],
        op: str,
        sources: list[str],
        *,
        base: str | None = None,
        params: tuple[str, ...] = (),
        act: str | None = None,
        **attrs: Any,
    ) -> str:
        for ref in sources:
            self.claim(ref)
        name = self.unique(base or self.call_name(event))
        layer = {"name": name, "op": op, "inputs": list(sources)}
        layer.update({k: v for k, v in attrs.items() if v is not None})
        self.layers.append(layer)
        self.meta[name] = {"params": params, "act": act, "event": event["id"]}
        for param in params:
            self.owner.setdefault(param, name)
        return name

    def claim(self, ref: str) -> None:
        """A layer reads ``ref``: an attention still waiting for its o-projection cannot."""
        if ref in self.pending_out:
            raise TraceError(
                f"attention '{ref}' has no output projection (a linear layer reading it)"
            )

    def call_name(self, event: dict[str, Any]) -> str:
        parent = event["parent"]
        prefix = ""
        while parent is not None:
            path = self.events[parent].get("path", "")
            if path and path != "?":
                prefix = path + "."
                break
            parent = self.events[parent]["parent"]
        return prefix + str(event.get("fn") or event.get("type", "layer")).strip("_")

    def unsupported_op(self, event: dict[str, Any], what: str) -> None:
        where = event.get("path") or self.call_name(event)
        self.unsupported.setdefault(what, []).append(where)
        self.set_outputs(event, _Value(CONST, ref=f"unsupported:{what}"))

    def live_inputs(self, event: dict[str, Any]) -> list[tuple[int, _Value]]:
        found = []
        for number in self.inputs_of(event):
            value = self.value(number)
            if value.kind == LIVE:
                if value.ref.startswith("unsupported:"):
                    raise TraceError(
                        f"'{event_name(event)}' reads the output of an unsupported op "
                        f"({value.ref.removeprefix('unsupported:')})"
                    )
                found.append((number, value))
            elif value.ref.startswith("unsupported:"):
                what = value.ref.removeprefix("unsupported:")
                self.unsupported.setdefault(what, []).append(event_name(event))
        return found

    def not_live(self, event: dict[str, Any]) -> None:
        """An op on weights and constants only: its result is a weight or a constant."""
        values = [self.value(n) for n in self.inputs_of(event)]
        params = [v for v in values if v.kind == PARAM]
        # Positions follow the data argument (gather(token_types, index=positions) is not).
        positional = bool(values and values[0].positional) or event.get("fn") == "arange"
        if params:
            base = params[0]
            self.set_outputs(
                event,
                _Value(
                    PARAM,
                    param=base.param,
                    embedding_rows=base.embedding_rows,
                    positional=base.positional or positional,
                ),
            )
        else:
            self.set_outputs(event, _Value(CONST, positional=positional))

    def projection(self, event: dict[str, Any], src: list[str]) -> None:
        """A Linear / Conv1D (or F.linear): an attention's o-projection, or a linear layer."""
        attrs = event["attrs"]
        weight = event["params"].get("weight", "")
        if event["kind"] == "call":
            weight = self.value(self.inputs_of(event)[1]).param
        out_features = attrs.get("out_features") or attrs.get("nf")
        has_bias = bool(attrs.get("bias", True))
        attention = self.pending_out.pop(src[0], None)
        if attention is not None:
            attention["out_bias"] = has_bias
            for param in event["params"].values():
                self.owner.setdefault(param, attention["name"])
            self.meta[attention["name"]]["params"] += tuple(event["params"].values())
            self.set_outputs(event, _Value(LIVE, ref=attention["name"]))
            return
        tied = self.owner.get(weight)
        in_features = self.shape(self.inputs_of(event)[0])[-1]
        name = self.emit(
            event,
            "linear",
            src,
            base=event.get("path") or None,
            params=tuple(p for p in event["params"].values() if p != weight or tied is None),
            out_features=out_features,
            bias=False if not has_bias else None,
            tied_to=tied,
        )
        self.meta[name]["in_features"] = in_features
        self.set_outputs(event, _Value(LIVE, ref=name))


def _is_projection(event: dict[str, Any]) -> bool:
    return event.get("type") in _PROJECTIONS or event.get("fn") == "linear"


def _out_features(event: dict[str, Any]) -> int:
    attrs = event.get("attrs", {})
    value = attrs.get("out_features") or attrs.get("nf")
    return int(value) if value else 0


def _unless(value: Any, default: Any) -> Any:
    return None if value is None or value == default else value


def event_name(event: dict[str, Any]) -> str:
    return str(event.get("path") or event.get("fn") or event.get("type"))
