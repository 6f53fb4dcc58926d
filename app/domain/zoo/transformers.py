"""Transformers as layer graphs, after their Hugging Face reference implementations.

Every builder returns ``(inputs, layers)``; :mod:`app.domain.zoo` wraps them into zoo entries.
Text models read int64 token ids ``[batch, seq]``; ViT reads ``[batch, 3, image, image]``.
Residual connections add the block input (``@input``) to the sublayer output, out of place,
as Hugging Face does (``hidden_states = residual + hidden_states``).
"""

from __future__ import annotations

from typing import Any

from app.domain.analysis import InputDecl
from app.domain.graph import BLOCK_INPUT
from app.domain.ops import TensorKind

Layer = dict[str, Any]
Graph = tuple[tuple[InputDecl, ...], list[Layer]]

TOKENS = InputDecl(name="input_ids", shape=("batch", "seq"), kind=TensorKind.INDEX)
PIXELS = InputDecl(name="pixel_values", shape=("batch", 3, "image", "image"))


def _add(name: str, residual: str, branch: str) -> Layer:
    return {"name": name, "op": "add", "inputs": [residual, branch]}


def _dropout(name: str, p: float) -> Layer:
    return {"name": name, "op": "dropout", "p": p}


def _layernorm(name: str, eps: float | None = None) -> Layer:
    layer: Layer = {"name": name, "op": "layernorm"}
    if eps is not None:
        layer["eps"] = eps
    return layer


def _attention(heads: int, *, dropout: float, fused: bool, causal: bool = False) -> Layer:
    layer: Layer = {"name": "attn", "op": "attention", "num_heads": heads}
    if causal:
        layer["causal"] = True
    if dropout:
        layer["dropout"] = dropout
    if fused:
        layer["fused"] = True
    return layer


def gpt2(
    *,
    layers: int = 12,
    hidden: int = 768,
    heads: int = 12,
    vocab: int = 50257,
    positions: int = 1024,
    intermediate: int | None = None,
    dropout: float = 0.1,
    fused: bool = False,
) -> Graph:
    """``transformers.GPT2LMHeadModel``: pre-LN blocks, GELU (tanh) MLP, head tied to ``wte``."""
    block = [
        _layernorm("ln_1"),
        _attention(heads, dropout=dropout, fused=fused, causal=True),
        _dropout("attn_drop", dropout),  # resid_dropout
        _add("attn_add", BLOCK_INPUT, "attn_drop"),
        _layernorm("ln_2"),
        {
            "name": "mlp",
            "op": "mlp",
            "intermediate_size": intermediate or 4 * hidden,
            "activation": "gelu_new",  # HF GPT-2 default (NewGELUActivation)
        },
        _dropout("mlp_drop", dropout),
        _add("mlp_add", "attn_add", "mlp_drop"),
    ]
    graph = [
        {"name": "wte", "op": "embedding", "num_embeddings": vocab, "embedding_dim": hidden},
        {"name": "wpe", "op": "embedding_add", "num_embeddings": positions},
        _dropout("drop", dropout),
        {"name": "h", "op": "repeat", "times": layers, "layers": block},
        _layernorm("ln_f"),
        {"name": "lm_head", "op": "linear", "out_features": vocab, "bias": False, "tied_to": "wte"},
    ]
    return (TOKENS,), graph


def bert(
    *,
    layers: int = 12,
    hidden: int = 768,
    heads: int = 12,
    vocab: int = 30522,
    positions: int = 512,
    type_vocab: int = 2,
    intermediate: int | None = None,
    dropout: float = 0.1,
    pooler: bool = True,
    fused: bool = False,
) -> Graph:
    """``transformers.BertModel``: post-LN blocks, GELU MLP, optional tanh pooler on token 0."""
    eps = 1e-12
    block = [
        _attention(heads, dropout=dropout, fused=fused),
        _dropout("attn_drop", dropout),
        _add("attn_add", BLOCK_INPUT, "attn_drop"),
        _layernorm("attn_ln", eps),
        {"name": "mlp", "op": "mlp", "intermediate_size": intermediate or 4 * hidden},
        _dropout("mlp_drop", dropout),
        _add("mlp_add", "attn_ln", "mlp_drop"),
        _layernorm("mlp_ln", eps),
    ]
    graph = [
        {
            "name": "word_embeddings",
            "op": "embedding",
            "num_embeddings": vocab,
            "embedding_dim": hidden,
        },
        {"name": "position_embeddings", "op": "embedding_add", "num_embeddings": positions},
        {
            "name": "token_type_embeddings",
            "op": "embedding_add",
            "num_embeddings": type_vocab,
            "positional": False,
        },
        _layernorm("embeddings_ln", eps),
        _dropout("embeddings_drop", dropout),
        {"name": "encoder", "op": "repeat", "times": layers, "layers": block},
    ]
    if pooler:
        graph += [
            {"name": "cls", "op": "select", "dim": 1, "index": 0},
            {"name": "pooler", "op": "linear", "out_features": hidden},
            {"name": "pooler_tanh", "op": "tanh"},
        ]
    return (TOKENS,), graph


def vit(
    *,
    layers: int = 12,
    hidden: int = 768,
    heads: int = 12,
    intermediate: int | None = None,
    patch: int = 16,
    image: int = 224,
    classes: int = 1000,
    dropout: float = 0.0,
    fused: bool = False,
) -> Graph:
    """``transformers.ViTForImageClassification``: patch conv, class token, pre-LN blocks.

    ``image`` fixes the number of learned positions, ``(image // patch) ** 2 + 1``; the graph
    then only fits inputs of that size (no position interpolation). Dropout layers inside the
    blocks are left out when ``dropout`` is 0 (ViTConfig's default), where they are identities.
    """
    eps = 1e-12
    block: list[Layer] = [
        _layernorm("ln_before", eps),
        _attention(heads, dropout=dropout, fused=fused),
    ]
    if dropout:
        block.append(_dropout("attn_drop", dropout))
    block += [
        _add("attn_add", BLOCK_INPUT, block[-1]["name"]),
        _layernorm("ln_after", eps),
        {"name": "mlp", "op": "mlp", "intermediate_size": intermediate or 4 * hidden},
    ]
    if dropout:
        block.append(_dropout("mlp_drop", dropout))
    block.append(_add("mlp_add", "attn_add", block[-1]["name"]))
    graph: list[Layer] = [
        {
            "name": "patch_embed",
            "op": "conv2d",
            "out_channels": hidden,
            "kernel_size": patch,
            "stride": patch,
        },
        {"name": "patch_flatten", "op": "flatten", "start_dim": 2},
        {"name": "patch_tokens", "op": "transpose", "dim0": 1, "dim1": 2},
        {"name": "cls_token", "op": "cls_token"},
        {
            "name": "position_embeddings",
            "op": "embedding_add",
            "num_embeddings": (image // patch) ** 2 + 1,
        },
        _dropout("embeddings_drop", dropout),
        {"name": "encoder", "op": "repeat", "times": layers, "layers": block},
        _layernorm("layernorm", eps),
        {"name": "cls", "op": "select", "dim": 1, "index": 0},
        {"name": "classifier", "op": "linear", "out_features": classes},
    ]
    return (PIXELS,), graph


def llama(
    *,
    layers: int,
    hidden: int,
    heads: int,
    kv_heads: int,
    intermediate: int,
    vocab: int,
    tied: bool = False,
    fused: bool = False,
    eps: float = 1e-5,
) -> Graph:
    """``transformers.LlamaForCausalLM``: RMSNorm pre-norm, rotary causal GQA, SwiGLU MLP."""
    attention: Layer = {
        "name": "self_attn",
        "op": "attention",
        "num_heads": heads,
        "num_kv_heads": kv_heads,
        "causal": True,
        "rotary": True,
        "qkv_bias": False,
        "out_bias": False,
    }
    if fused:
        attention["fused"] = True
    block = [
        {"name": "input_layernorm", "op": "rmsnorm", "eps": eps},
        attention,
        _add("attn_add", BLOCK_INPUT, "self_attn"),
        {"name": "post_attention_layernorm", "op": "rmsnorm", "eps": eps},
        {
            "name": "mlp",
            "op": "mlp",
            "intermediate_size": intermediate,
            "activation": "swiglu",
            "bias": False,
        },
        _add("mlp_add", "attn_add", "mlp"),
    ]
    lm_head: Layer = {"name": "lm_head", "op": "linear", "out_features": vocab, "bias": False}
    if tied:
        lm_head["tied_to"] = "embed_tokens"
    graph = [
        {
            "name": "embed_tokens",
            "op": "embedding",
            "num_embeddings": vocab,
            "embedding_dim": hidden,
        },
        {"name": "layers", "op": "repeat", "times": layers, "layers": block},
        {"name": "norm", "op": "rmsnorm", "eps": eps},
        lm_head,
    ]
    return (TOKENS,), graph
