"""A stored decoder graph as the geometry a serving engine needs (app.domain.engines.vllm's
ServingModel): one home for reading attention, MLP / MoE, MLA and sliding windows from graph
layers, used by the engine memory answer and the engine fit."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from app.domain.engines.families import MlaGeometry
from app.domain.engines.vllm import ServingModel
from app.domain.graph.llm_variants import MLA_KEYS
from app.services.errors import InvalidInput

_GATED_ACTIVATIONS = frozenset({"swiglu", "geglu"})  # app.domain.graph.ops _GATED
_NORM_OPS = frozenset({"rmsnorm", "layernorm", "layer_norm"})


def _decoder_layers(
    repeats: Sequence[Mapping[str, Any]], refuse: Callable[[str], InvalidInput]
) -> list[tuple[Mapping[str, Any], Mapping[str, Any], int]]:
    """``(attention, mlp or moe, norms)`` of every decoder layer, first to last: the repeats'
    bodies in order, each body holding one or more layers (an attention then its MLP)."""
    out = []
    for block in repeats:
        inner = list(block.get("layers", ()))
        attention = [i for i, layer in enumerate(inner) if layer.get("op") == "attention"]
        if not attention:
            raise refuse(f"no attention layer in the repeated block '{block.get('name')}'")
        body = []
        for k, start in enumerate(attention):
            end = attention[k + 1] if k + 1 < len(attention) else len(inner)
            mlps = [layer for layer in inner[start:end] if layer.get("op") in {"mlp", "moe"}]
            if len(mlps) != 1:
                raise refuse(f"{len(mlps)} MLP/MoE layers after an attention layer (one expected)")
            norms = sum(1 for layer in inner if layer.get("op") in _NORM_OPS)
            body.append((inner[start], mlps[0], norms // len(attention)))
        out += body * int(block["times"])
    return out


def _one(values: Sequence[Any], what: str, refuse: Callable[[str], InvalidInput]) -> Any:
    if len(set(values)) != 1:
        raise refuse(f"decoder layers differ in {what} ({sorted(set(values), key=str)})")
    return values[0]


def serving_model(
    slug: str, layers: Sequence[Mapping[str, Any]], default_bindings: Mapping[str, int]
) -> ServingModel:
    """A stored decoder graph as the geometry a serving engine needs (names as in HF configs).

    The graph must be a decoder as the zoo and the HF importers build it (and as
    ``benchmarks/engines/vllm_calibration.py`` writes the geometry by hand): one ``embedding``
    (vocabulary x hidden), repeated blocks of decoder layers, each an ``attention`` (heads, KV
    heads, ``head_dim`` or hidden / heads, QKV bias; or multi-head latent attention with
    ``kv_lora_rank``; a ``sliding_window`` on some layers) followed by a gated ``mlp`` or a
    ``moe`` (routed experts, a shared expert; dense layers among MoE layers, as DeepSeek's first
    layers), and an LM head ``linear`` (tied when it has ``tied_to``). Every layer has the same
    attention; the MoE layers the same experts. The context is the model's default ``seq``
    binding (``None`` when it has none). Anything else is a 422 naming ``/model``.
    """

    def refuse(why: str) -> InvalidInput:
        return InvalidInput(
            f"model '{slug}' is not a decoder the engine model can serve: {why}", pointer="/model"
        )

    embeddings = [layer for layer in layers if layer.get("op") == "embedding"]
    repeats = [layer for layer in layers if layer.get("op") == "repeat"]
    if len(embeddings) != 1:
        raise refuse(f"{len(embeddings)} top-level embeddings (one token embedding expected)")
    if not repeats:
        raise refuse("no repeated block of decoder layers")
    vocab = int(embeddings[0]["num_embeddings"])
    hidden = int(embeddings[0]["embedding_dim"])
    decoder = _decoder_layers(repeats, refuse)
    attn = decoder[0][0]
    heads = int(attn["num_heads"])
    geometry = {
        (
            int(a["num_heads"]),
            int(a.get("num_kv_heads", a["num_heads"])),
            a.get("head_dim"),
            bool(a.get("qkv_bias", False)),
            *(a.get(key) for key in ("kv_lora_rank", "q_lora_rank", *MLA_KEYS)),
        )
        for a, _, _ in decoder
    }
    if len(geometry) != 1:
        raise refuse("decoder layers differ in their attention geometry")
    mla = None
    if attn.get("kv_lora_rank") is not None:
        mla = MlaGeometry(
            kv_lora_rank=int(attn["kv_lora_rank"]),
            qk_nope_head_dim=int(attn["qk_nope_head_dim"]),
            qk_rope_head_dim=int(attn["qk_rope_head_dim"]),
            v_head_dim=int(attn["v_head_dim"]),
            q_lora_rank=attn.get("q_lora_rank"),
        )
    windows = {int(a["sliding_window"]) for a, _, _ in decoder if a.get("sliding_window")}
    if len(windows) > 1:
        raise refuse(f"sliding windows of different sizes ({sorted(windows)})")
    for _, mlp, _ in decoder:
        activation = mlp.get("activation", "swiglu")  # the graph format's default
        if activation not in _GATED_ACTIVATIONS:
            raise refuse(f"MLP activation '{activation}' is not gated (SwiGLU/GeGLU)")
    moes = [mlp for _, mlp, _ in decoder if mlp["op"] == "moe"]
    dense = [i for i, (_, mlp, _) in enumerate(decoder) if mlp["op"] == "mlp"]
    experts, per_token, shared, gate = 1, 1, 0, False
    inner = int(decoder[0][1]["intermediate_size"])
    dense_inner = None
    if moes:
        moe = moes[0]
        key = ("num_experts", "experts_per_token", "intermediate_size", "shared_intermediate_size",
               "shared_expert_gate")  # fmt: skip
        _one([tuple(m.get(k) for k in key) for m in moes], "their experts", refuse)
        experts, per_token = int(moe["num_experts"]), int(moe.get("experts_per_token", 2))
        inner = int(moe["intermediate_size"])
        shared = int(moe.get("shared_intermediate_size") or 0)
        gate = bool(moe.get("shared_expert_gate", False))
        if dense:
            dense_inner = _one(
                [int(decoder[i][1]["intermediate_size"]) for i in dense], "dense MLP sizes", refuse
            )
    else:
        inner = _one([int(m["intermediate_size"]) for _, m, _ in decoder], "MLP sizes", refuse)
    heads_out = [layer for layer in layers if layer.get("op") == "linear"]
    if not heads_out or int(heads_out[-1].get("out_features", 0)) != vocab:
        raise refuse("no LM head projecting to the vocabulary")
    context = default_bindings.get("seq")
    return ServingModel(
        layers=len(decoder),
        hidden_size=hidden,
        attention_heads=heads,
        kv_heads=heads if mla else int(attn.get("num_kv_heads", heads)),
        head_dim=(
            mla.qk_nope_head_dim + mla.qk_rope_head_dim
            if mla
            else int(attn.get("head_dim", hidden // heads))
        ),
        intermediate_size=inner,
        vocab_size=vocab,
        tie_word_embeddings=heads_out[-1].get("tied_to") is not None,
        qkv_bias=bool(attn.get("qkv_bias", False)),
        norms_per_layer=_one([n for _, _, n in decoder], "norms a layer", refuse),
        experts=experts,
        experts_per_token=per_token,
        mla_latent_dim=mla.latent_dim if mla else None,
        sliding_window=next(iter(windows), None),
        max_position_embeddings=None if context is None else int(context),
        mla=mla,
        shared_expert_intermediate_size=shared,
        shared_expert_gate=gate,
        dense_layers=tuple(dense) if moes else (),
        dense_intermediate_size=dense_inner,
        # no rotary embedding: no cos/sin cache (app.domain.engines.vllm.rotary_cache_bytes)
        rotary_dim=None if attn.get("rotary", False) else 0,
    )
