"""Transformers as layer graphs, after their Hugging Face reference implementations.

Every builder returns ``(inputs, layers)``; :mod:`app.domain.zoo` wraps them into zoo entries.
Text models read int64 token ids ``[batch, seq]``; ViT reads ``[batch, 3, image, image]``.
Residual connections add the block input (``@input``) to the sublayer output, out of place,
as Hugging Face does (``hidden_states = residual + hidden_states``).
"""

from __future__ import annotations

from typing import Any

from app.domain.graph.analysis import InputDecl
from app.domain.graph.format import BLOCK_INPUT
from app.domain.graph.ops import TensorKind

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


def _attention(
    heads: int, *, dropout: float, causal: bool = False, fused_projection: bool = False
) -> Layer:
    layer: Layer = {"name": "attn", "op": "attention", "num_heads": heads}
    if causal:
        layer["causal"] = True
    if fused_projection:
        layer["fused_qkv_projection"] = True
    if dropout:
        layer["dropout"] = dropout
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
    tied: bool = True,
    activation: str = "gelu_new",
    eps: float | None = None,
) -> Graph:
    """``transformers.GPT2LMHeadModel``: pre-LN blocks, GELU (tanh) MLP, head tied to ``wte``."""
    block = [
        _layernorm("ln_1", eps),
        _attention(heads, dropout=dropout, causal=True, fused_projection=True),  # c_attn
        _dropout("attn_drop", dropout),  # resid_dropout
        _add("attn_add", BLOCK_INPUT, "attn_drop"),
        _layernorm("ln_2", eps),
        {
            "name": "mlp",
            "op": "mlp",
            "intermediate_size": intermediate or 4 * hidden,
            "activation": activation,  # HF GPT-2 default: gelu_new (NewGELUActivation)
        },
        _dropout("mlp_drop", dropout),
        _add("mlp_add", "attn_add", "mlp_drop"),
    ]
    graph = [
        {"name": "wte", "op": "embedding", "num_embeddings": vocab, "embedding_dim": hidden},
        {"name": "wpe", "op": "embedding_add", "num_embeddings": positions},
        _dropout("drop", dropout),
        {"name": "h", "op": "repeat", "times": layers, "layers": block},
        _layernorm("ln_f", eps),
        _lm_head(vocab, tied_to="wte" if tied else None),
    ]
    return (TOKENS,), graph


def _lm_head(vocab: int, *, tied_to: str | None) -> Layer:
    layer: Layer = {"name": "lm_head", "op": "linear", "out_features": vocab, "bias": False}
    if tied_to is not None:
        layer["tied_to"] = tied_to
    return layer


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
    eps: float = 1e-12,
    activation: str = "gelu",
) -> Graph:
    """``transformers.BertModel``: post-LN blocks, GELU MLP, optional tanh pooler on token 0.

    RoBERTa (``RobertaModel``) is the same graph with its own sizes.
    """
    block = [
        _attention(heads, dropout=dropout),
        _dropout("attn_drop", dropout),
        _add("attn_add", BLOCK_INPUT, "attn_drop"),
        _layernorm("attn_ln", eps),
        _mlp(intermediate or 4 * hidden, activation),
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
        graph += _pooler(hidden)
    return (TOKENS,), graph


def _pooler(hidden: int) -> list[Layer]:
    """BERT/ViT pooler: the first token through a dense layer and tanh."""
    return [
        {"name": "cls", "op": "select", "dim": 1, "index": 0},
        {"name": "pooler", "op": "linear", "out_features": hidden},
        {"name": "pooler_tanh", "op": "tanh"},
    ]


def _mlp(intermediate: int, activation: str = "gelu", *, bias: bool = True) -> Layer:
    layer: Layer = {"name": "mlp", "op": "mlp", "intermediate_size": intermediate}
    if activation != "gelu":
        layer["activation"] = activation
    if not bias:
        layer["bias"] = False
    return layer


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
    head: str = "classifier",
    qkv_bias: bool = True,
    channels: int = 3,
    eps: float = 1e-12,
    activation: str = "gelu",
) -> Graph:
    """``transformers.ViTForImageClassification``: patch conv, class token, pre-LN blocks.

    ``image`` fixes the number of learned positions, ``(image // patch) ** 2 + 1``; the graph
    then only fits inputs of that size (no position interpolation). Dropout layers inside the
    blocks are left out when ``dropout`` is 0 (ViTConfig's default), where they are identities.
    ``head`` is ``classifier`` (``ViTForImageClassification``: a linear layer on the class
    token), ``pooler`` (``ViTModel``: dense + tanh on the class token) or ``none``.
    """
    attention = _attention(heads, dropout=dropout)
    if not qkv_bias:
        attention["qkv_bias"] = False
    block: list[Layer] = [_layernorm("ln_before", eps), attention]
    if dropout:
        block.append(_dropout("attn_drop", dropout))
    block += [
        _add("attn_add", BLOCK_INPUT, block[-1]["name"]),
        _layernorm("ln_after", eps),
        _mlp(intermediate or 4 * hidden, activation),
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
    ]
    if head == "classifier":
        graph += [
            {"name": "cls", "op": "select", "dim": 1, "index": 0},
            {"name": "classifier", "op": "linear", "out_features": classes},
        ]
    elif head == "pooler":
        graph += _pooler(hidden)
    pixels = (
        PIXELS
        if channels == 3
        else InputDecl(name="pixel_values", shape=("batch", channels, "image", "image"))
    )
    return (pixels,), graph


def llama(
    *,
    layers: int,
    hidden: int,
    heads: int,
    kv_heads: int,
    intermediate: int,
    vocab: int,
    tied: bool = False,
    eps: float = 1e-5,
    head_dim: int | None = None,
    qkv_bias: bool = False,
    out_bias: bool = False,
    activation: str = "swiglu",
    mlp_bias: bool = False,
    experts: int | None = None,
    experts_per_token: int = 2,
) -> Graph:
    """``transformers.LlamaForCausalLM``: RMSNorm pre-norm, rotary causal GQA, SwiGLU MLP.

    The same graph, with options, is Mistral (sliding-window attention has no parameters),
    Qwen2 (``qkv_bias``), Gemma (``head_dim``, GeGLU, tied head) and, with ``experts``,
    Mixtral: a sparse mixture of ``experts`` SwiGLU MLPs, ``experts_per_token`` per token.
    """
    attention: Layer = {
        "name": "self_attn",
        "op": "attention",
        "num_heads": heads,
        "num_kv_heads": kv_heads,
        "causal": True,
        "rotary": True,
        "qkv_bias": qkv_bias,
        "out_bias": out_bias,
    }
    if head_dim is not None:
        attention["head_dim"] = head_dim
    feed_forward: Layer = {
        "name": "mlp",
        "op": "mlp",
        "intermediate_size": intermediate,
        "activation": activation,
        "bias": mlp_bias,
    }
    if experts is not None:
        feed_forward = {
            "name": "block_sparse_moe",
            "op": "moe",
            "num_experts": experts,
            "experts_per_token": experts_per_token,
            "intermediate_size": intermediate,
            "activation": activation,
            "bias": mlp_bias,
        }
    block = [
        {"name": "input_layernorm", "op": "rmsnorm", "eps": eps},
        attention,
        _add("attn_add", BLOCK_INPUT, "self_attn"),
        {"name": "post_attention_layernorm", "op": "rmsnorm", "eps": eps},
        feed_forward,
        _add("mlp_add", "attn_add", feed_forward["name"]),
    ]
    graph = [
        {
            "name": "embed_tokens",
            "op": "embedding",
            "num_embeddings": vocab,
            "embedding_dim": hidden,
        },
        {"name": "layers", "op": "repeat", "times": layers, "layers": block},
        {"name": "norm", "op": "rmsnorm", "eps": eps},
        _lm_head(vocab, tied_to="embed_tokens" if tied else None),
    ]
    return (TOKENS,), graph


def gpt_neox(
    *,
    layers: int,
    hidden: int,
    heads: int,
    intermediate: int,
    vocab: int,
    parallel_residual: bool = True,
    tied: bool = False,
    bias: bool = True,
    activation: str = "gelu",
    eps: float = 1e-5,
    positions: int | None = None,
    rotary_pct: float = 0.25,
) -> Graph:
    """``transformers.GPTNeoXForCausalLM`` (Pythia): pre-LN blocks with rotary attention.

    With ``parallel_residual`` (the default) attention and MLP both read the block input and
    are added to it together: ``x + attn(ln1(x)) + mlp(ln2(x))``. Given ``positions``
    (max_position_embeddings, as the importer passes it), the attention is the one transformers
    wrote in mid-2024: ``fused_qkv``, ``rotary_fp32`` over ``rotary_pct`` of each head, and the
    mask and rotary buffers of ``positions`` (app/domain/graph/ops/transformer.py); None: a
    plain rotary attention (benchmarks/calibration's GPT-J stand-in).
    """
    attention = _attention(heads, dropout=0.0, causal=True)
    attention["rotary"] = True
    if positions is not None:
        attention.update(
            {
                "fused_qkv": True,
                "rotary_fp32": True,
                "buffer_positions": positions,
                # GPTNeoXAttention.rotary_ndims = int(head_size * rotary_pct)
                "rotary_dims": max(1, int(hidden // heads * rotary_pct)),
            }
        )
    if not bias:
        attention["qkv_bias"] = attention["out_bias"] = False
    feed_forward = _mlp(intermediate, activation)
    if parallel_residual:
        block = [
            _layernorm("input_layernorm", eps),
            attention,
            {**_layernorm("post_attention_layernorm", eps), "inputs": [BLOCK_INPUT]},
            feed_forward,
            {"name": "residual_add", "op": "add", "inputs": [BLOCK_INPUT, "attn", "mlp"]},
        ]
    else:
        block = [
            _layernorm("input_layernorm", eps),
            attention,
            _add("attn_add", BLOCK_INPUT, "attn"),
            _layernorm("post_attention_layernorm", eps),
            feed_forward,
            _add("mlp_add", "attn_add", "mlp"),
        ]
    graph = [
        {"name": "embed_in", "op": "embedding", "num_embeddings": vocab, "embedding_dim": hidden},
        {"name": "layers", "op": "repeat", "times": layers, "layers": block},
        _layernorm("final_layer_norm", eps),
        _lm_head(vocab, tied_to="embed_in" if tied else None),
    ]
    return (TOKENS,), graph


def t5_encoder(
    *,
    layers: int,
    hidden: int,
    heads: int,
    head_dim: int,
    intermediate: int,
    vocab: int,
    gated: bool = False,
    buckets: int = 32,
    dropout: float = 0.1,
    eps: float = 1e-6,
) -> Graph:
    """``transformers.T5EncoderModel``: RMS-normed pre-norm blocks, bias-free projections.

    The learned relative position bias (``buckets`` x ``heads``) lives in the first block only;
    it is a stored tensor here, and the attention layers do not model its S x S expansion.
    The MLP is ReLU (``feed_forward_proj: relu``) or gated GELU (``gated-gelu``, T5 v1.1).
    """
    attention = _attention(heads, dropout=dropout)
    attention.update({"head_dim": head_dim, "qkv_bias": False, "out_bias": False})
    block = [
        {"name": "attn_norm", "op": "rmsnorm", "eps": eps},
        attention,
        _dropout("attn_drop", dropout),
        _add("attn_add", BLOCK_INPUT, "attn_drop"),
        {"name": "ff_norm", "op": "rmsnorm", "eps": eps},
        _mlp(intermediate, "geglu" if gated else "relu", bias=False),
        _dropout("mlp_drop", dropout),
        _add("mlp_add", "attn_add", "mlp_drop"),
    ]
    graph: list[Layer] = [
        {"name": "shared", "op": "embedding", "num_embeddings": vocab, "embedding_dim": hidden},
        {"name": "relative_attention_bias", "op": "tensor", "shape": [buckets, heads]},
        {**_dropout("embed_drop", dropout), "inputs": ["shared"]},
        {"name": "block", "op": "repeat", "times": layers, "layers": block},
        {"name": "final_layer_norm", "op": "rmsnorm", "eps": eps},
        _dropout("final_drop", dropout),
    ]
    return (TOKENS,), graph
