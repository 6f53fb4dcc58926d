"""The walk over a merged trace record: a leaf module becomes its layers, a module that holds
one attention core (SDPA, or a softmax between matmuls) behind projections becomes one
``attention`` layer, any other module is walked into, and function calls become layers.
"""

from __future__ import annotations

from typing import Any

from app.client.torch_calls import _CallConversions
from app.client.torch_convert import LIVE, _arg, _is_projection, _out_features, _tensor_refs, _Value
from app.client.torch_modules import _ModuleConversions
from app.client.torch_trace import LEAF_MODULE_TYPES


class _Converter(_ModuleConversions, _CallConversions):
    """Walks a merged trace record and emits layers (see :func:`convert_trace`)."""

    # -- the walk
    def walk(self, parent: int | None) -> None:
        for child in self.children.get(parent, []):
            self.visit(self.events[child])

    def visit(self, event: dict[str, Any]) -> None:
        if event["kind"] == "module":
            type_name = event["type"]
            if type_name in LEAF_MODULE_TYPES or type_name.endswith("RMSNorm"):
                self.module(event)
            elif self.is_attention(event["id"]):
                self.attention(event)
            else:
                self.walk(event["id"])
        else:
            self.call(event)

    # -- attention
    def subtree(self, event_id: int) -> list[dict[str, Any]]:
        found: list[dict[str, Any]] = []
        for child in self.children.get(event_id, []):
            found.append(self.events[child])
            found += self.subtree(child)
        return sorted(found, key=lambda e: int(e["id"]))

    def cores(self, events: list[dict[str, Any]]) -> list[dict[str, Any]]:
        sdpa = [e for e in events if e.get("fn") == "scaled_dot_product_attention"]
        has_matmul = any(e.get("fn") in ("matmul", "bmm", "__matmul__", "einsum") for e in events)
        softmax = [
            e for e in events if e.get("fn") == "softmax" or e.get("type") == "Softmax"
        ] if has_matmul else []  # fmt: skip
        return sdpa + softmax

    def is_candidate(self, event_id: int) -> bool:
        known = self._candidates.get(event_id)
        if known is None:
            events = self.subtree(event_id)
            cores = self.cores(events)
            known = len(cores) == 1 and any(
                _is_projection(e) and e["id"] < cores[0]["id"] for e in events
            )
            self._candidates[event_id] = known
        return known

    def is_attention(self, event_id: int) -> bool:
        if not self.is_candidate(event_id):
            return False
        return not any(
            self.events[c]["kind"] == "module" and self.is_candidate(c)
            for c in self.children.get(event_id, [])
        )

    def origin(self, number: int, projections: dict[int, dict[str, Any]]) -> dict[str, Any] | None:
        """The projection a tensor inside an attention module was computed from."""
        seen = 0
        while seen < 200:
            seen += 1
            tensor = self.tensors[number]
            producer = tensor.get("src")
            if producer is None:
                return None
            if producer in projections:
                return projections[producer]
            event = self.events[producer]
            refs = [n for n in self.inputs_of(event) if self.tensors[n].get("dtype") == "float"]
            refs = [n for n in refs if "param" not in self.tensors[n]]
            if not refs:
                return None
            number = refs[0]
        return None

    def attention(self, module: dict[str, Any]) -> None:
        events = self.subtree(module["id"])
        core = self.cores(events)[0]
        live = self.live_inputs(module)
        if not live:
            self.not_live(module)
            return
        source = live[0][1]
        projections = {e["id"]: e for e in events if _is_projection(e)}
        before = [e for e in projections.values() if e["id"] < core["id"]]
        after = [e for e in projections.values() if e["id"] > core["id"]]
        if core.get("fn") == "scaled_dot_product_attention":
            query_n, key_n = _tensor_refs(core["args"])[:2]
            dropout = core["kwargs"].get("dropout_p", _arg(core, 4, "dropout_p", 0.0)) or 0.0
            causal = bool(core["kwargs"].get("is_causal", False))
        else:
            scores = self.tensors[_tensor_refs(core["args"])[0]]["src"]
            matmul = self.events[scores] if scores is not None else {}
            while matmul and matmul.get("fn") not in ("matmul", "bmm", "__matmul__"):
                refs = self.inputs_of(matmul)
                matmul = self.events[self.tensors[refs[0]]["src"]] if refs else {}
            if not matmul:
                self.unsupported_op(module, f"{module['type']} (attention scores not a matmul)")
                return
            query_n, key_n = _tensor_refs(matmul["args"])[:2]
            dropout = 0.0
            causal = False
            for e in events:
                if e["id"] > core["id"] and (after and e["id"] < after[0]["id"] or not after):
                    if e.get("type") == "Dropout":
                        dropout = max(dropout, e["attrs"].get("p", 0.0))
                    elif e.get("fn") == "dropout":
                        dropout = max(dropout, _arg(e, 1, "p", 0.5))
        causal = causal or module["attrs"].get("is_causal") is True
        head_dim = self.shape(query_n)[-1]
        q_proj, k_proj = self.origin(query_n, projections), self.origin(key_n, projections)
        if q_proj is None or not isinstance(head_dim, int):
            self.unsupported_op(module, f"{module['type']} (no query projection found)")
            return
        width = _out_features(q_proj)
        if k_proj is None or k_proj is q_proj:
            heads = self.shape(query_n)[1]
            kv_heads = self.shape(key_n)[1]
            q_dim = heads * head_dim if isinstance(heads, int) else width
            kv_dim = (width - q_dim) // 2 if k_proj is q_proj else kv_heads * head_dim
        else:
            q_dim, kv_dim = width, _out_features(k_proj)
        hidden = self.shape(live[0][0])[-1]
        heads, kv_heads = q_dim // head_dim, kv_dim // head_dim
        rotary = "position_embeddings" in module["kwargs"] or (
            any(e.get("fn") in ("neg", "__neg__") for e in events if e["id"] < core["id"])
            and any(e.get("fn") == "cat" for e in events if e["id"] < core["id"])
        )
        params = tuple(p for e in before for p in e["params"].values())
        name = self.emit(
            module,
            "attention",
            [source.ref],
            base=module["path"],
            params=params,
            num_heads=heads,
            num_kv_heads=kv_heads if kv_heads != heads else None,
            head_dim=head_dim if heads * head_dim != hidden else None,
            causal=True if causal else None,
            qkv_bias=bool(q_proj["attrs"].get("bias", True)),
            out_bias=True,
            rotary=True if rotary else None,
            dropout=dropout or None,
        )
        layer = self.layers[-1]
        if after:
            out_proj = after[0]
            layer["out_bias"] = bool(out_proj["attrs"].get("bias", True))
            self.meta[name]["params"] += tuple(out_proj["params"].values())
            self.set_outputs(out_proj, _Value(LIVE, ref=name))
            for event in events:  # what follows the o-projection (a residual dropout, ...)
                parent = event["parent"]
                if event["id"] > out_proj["id"] and (
                    parent == module["id"] or parent < out_proj["id"]
                ):
                    self.visit(event)
        else:
            self.pending_out[name] = layer
            self.set_outputs(module, _Value(LIVE, ref=name), first_only=True)
