"""Feed-forward blocks (linear, activation, linear; SwiGLU's gated form) behind a norm ->
one ``mlp`` layer, fused on the mapped layers.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

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
