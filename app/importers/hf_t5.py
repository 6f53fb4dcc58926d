"""Hugging Face ``config.json`` -> the full T5 encoder-decoder (``T5ForConditionalGeneration``).

transformers' ``models/t5/modeling_t5.py`` (5.23): one ``shared`` embedding of
``vocab_size x d_model`` feeds both stacks; each stack is ``num_layers`` (the decoder
``num_decoder_layers``) pre-norm blocks of bias-free projections with RMS-style
``T5LayerNorm`` weights, the learned relative position bias (``relative_attention_num_buckets
x num_heads``) in the first block of each stack only; a decoder block adds cross-attention
(``EncDecAttention``: q from the decoder, k and v from the encoder output, no position bias)
between its causal self-attention and its feed-forward; ``lm_head`` is ``d_model x
vocab_size`` without bias, the ``shared`` weight itself when ``tie_word_embeddings`` (T5Config's
default true; Flan-T5 and T5 v1.1 set false). The feed-forward is ``DenseReluDense`` (``wi``,
``wo``) for ``feed_forward_proj: relu`` and ``DenseGatedActDense`` (``wi_0``, ``wi_1``, ``wo``)
for ``gated-gelu`` / ``gated-silu``.

The graph reads two int64 inputs: ``input_ids`` of ``[batch, seq]`` (the encoder's tokens) and
``decoder_input_ids`` of ``[batch, decoder_seq]`` (in training the right-shifted labels). The
one ``shared`` embedding embeds both, as the module does (called twice): the decoder's lookup
is an ``embedding`` tied to it (no parameter of its own), so the parameter count is
transformers'. ``decoder_seq`` follows ``seq`` unless a request binds it
(``decoder_sequence_length``; :data:`app.domain.graph.analysis.DERIVED_DIMS`): a seq2seq
fine-tune's decoder runs on its labels (PEFT's seq2seq examples pad them to
``target_max_length``, a few tokens), not on the input's length. The decoder's self-attention
and cross-attention queries run over ``decoder_seq`` positions, cross-attention's keys and
values over the encoder's ``seq``. Cross-attention is written out as ops (linear k / v on the
encoder output, q @ k^T, softmax, dropout, @ v, the output linear), so training memory keeps
what autograd keeps for each. Standard library and :mod:`app.domain` only.
"""

from __future__ import annotations

from app.domain.graph.analysis import InputDecl
from app.domain.graph.format import BLOCK_INPUT
from app.domain.graph.ops import TensorKind
from app.domain.zoo import transformers as builders
from app.importers.hf_common import Built, _Config
from app.importers.result import ImportRejected

Layer = builders.Layer

ENCODER_TOKENS = InputDecl(name="input_ids", shape=("batch", "seq"), kind=TensorKind.INDEX)
DECODER_TOKENS = InputDecl(
    name="decoder_input_ids", shape=("batch", "decoder_seq"), kind=TensorKind.INDEX
)
ENCODER_OUTPUT = "final_drop"  # the encoder stack's last layer, which every cross-attention reads


def _drop(name: str, p: float, inputs: list[str] | None = None) -> Layer:
    layer: Layer = {"name": name, "op": "dropout", "p": p}
    if inputs is not None:
        layer["inputs"] = inputs
    return layer


def _add(name: str, residual: str, branch: str) -> Layer:
    return {"name": name, "op": "add", "inputs": [residual, branch]}


def _self_attention(heads: int, head_dim: int, dropout: float, *, causal: bool) -> Layer:
    layer: Layer = {
        "name": "attn",
        "op": "attention",
        "num_heads": heads,
        "head_dim": head_dim,
        "qkv_bias": False,
        "out_bias": False,
    }
    if causal:
        layer["causal"] = True
    if dropout:
        layer["dropout"] = dropout
    return layer


def _cross_attention(hidden: int, heads: int, head_dim: int, dropout: float) -> list[Layer]:
    """``T5LayerCrossAttention.EncDecAttention`` as ops: no scaling (T5 folds it into the
    initialisation), no position bias, softmax over the encoder positions."""
    inner = heads * head_dim
    a = "EncDecAttention"

    def heads_of(name: str, source: str, positions: str) -> list[Layer]:
        return [
            {"name": f"{a}.{name}_split", "op": "reshape", "inputs": [source],
             "shape": ["batch", positions, heads, head_dim]},
            {"name": f"{a}.{name}_heads", "op": "transpose", "dim0": 1, "dim1": 2},
        ]  # fmt: skip

    return [
        {"name": f"{a}.q", "op": "linear", "out_features": inner, "bias": False},
        *heads_of("q", f"{a}.q", "decoder_seq"),
        {"name": f"{a}.k", "op": "linear", "out_features": inner, "bias": False,
         "inputs": [ENCODER_OUTPUT]},
        *heads_of("k", f"{a}.k", "seq"),
        {"name": f"{a}.k_t", "op": "transpose", "dim0": 2, "dim1": 3},
        {"name": f"{a}.v", "op": "linear", "out_features": inner, "bias": False,
         "inputs": [ENCODER_OUTPUT]},
        *heads_of("v", f"{a}.v", "seq"),
        {"name": f"{a}.scores", "op": "matmul", "inputs": [f"{a}.q_heads", f"{a}.k_t"]},
        {"name": f"{a}.probs", "op": "softmax", "dim": -1},
        *([_drop(f"{a}.probs_drop", dropout)] if dropout else []),
        {"name": f"{a}.context", "op": "matmul",
         "inputs": [f"{a}.probs_drop" if dropout else f"{a}.probs", f"{a}.v_heads"]},
        {"name": f"{a}.merge", "op": "transpose", "dim0": 1, "dim1": 2},
        {"name": f"{a}.merged", "op": "reshape", "shape": ["batch", "decoder_seq", inner]},
        {"name": f"{a}.o", "op": "linear", "out_features": hidden, "bias": False},
    ]  # fmt: skip


def t5_feed_forward(config: _Config) -> str:
    """The config's ``feed_forward_proj`` (T5's MLP: relu, or a gated gelu / silu), rejected
    with a 422 naming it when the importer has no such block."""
    projection = config.text("feed_forward_proj", "relu")
    if projection not in ("relu", "gated-gelu", "gated-silu"):
        raise ImportRejected(
            f"feed_forward_proj {projection!r} is not supported; use relu, gated-gelu or "
            "gated-silu",
            pointer="/config/feed_forward_proj",
        )
    return projection


def t5_conditional_generation(config: _Config) -> Built:
    """``T5ForConditionalGeneration`` from a ``t5`` config (see the module docstring)."""
    projection = t5_feed_forward(config)
    hidden = config.size("d_model")
    heads = config.size("num_heads")
    head_dim = config.size("d_kv", hidden // heads if hidden % heads == 0 else None)
    encoder_layers = config.size("num_layers")
    decoder_layers = config.size("num_decoder_layers", encoder_layers)
    vocab = config.size("vocab_size")
    buckets = config.size("relative_attention_num_buckets", 32)
    dropout = config.dropout("dropout_rate")
    eps = config.number("layer_norm_epsilon", 1e-6)
    tied = config.flag("tie_word_embeddings", True)  # T5Config's default
    activation = {"relu": "relu", "gated-gelu": "geglu", "gated-silu": "swiglu"}[projection]
    mlp: Layer = {
        "name": "mlp",
        "op": "mlp",
        "intermediate_size": config.size("d_ff"),
        "activation": activation,
        "bias": False,
    }
    feed_forward = [
        {"name": "ff_norm", "op": "rmsnorm", "eps": eps},
        mlp,
        _drop("mlp_drop", dropout),
    ]
    encoder_block = [
        {"name": "attn_norm", "op": "rmsnorm", "eps": eps},
        _self_attention(heads, head_dim, dropout, causal=False),
        _drop("attn_drop", dropout),
        _add("attn_add", BLOCK_INPUT, "attn_drop"),
        *feed_forward,
        _add("mlp_add", "attn_add", "mlp_drop"),
    ]
    decoder_block = [
        {"name": "attn_norm", "op": "rmsnorm", "eps": eps},
        _self_attention(heads, head_dim, dropout, causal=True),
        _drop("attn_drop", dropout),
        _add("attn_add", BLOCK_INPUT, "attn_drop"),
        {"name": "cross_norm", "op": "rmsnorm", "eps": eps},
        *_cross_attention(hidden, heads, head_dim, dropout),
        _drop("cross_drop", dropout),
        _add("cross_add", "attn_add", "cross_drop"),
        *feed_forward,
        _add("mlp_add", "cross_add", "mlp_drop"),
    ]
    head: Layer = {"name": "lm_head", "op": "linear", "out_features": vocab, "bias": False}
    if tied:
        head["tied_to"] = "shared"
    layers: list[Layer] = [
        {"name": "shared", "op": "embedding", "num_embeddings": vocab, "embedding_dim": hidden,
         "inputs": [ENCODER_TOKENS.name]},
        {"name": "relative_attention_bias", "op": "tensor", "shape": [buckets, heads]},
        _drop("embed_drop", dropout, ["shared"]),
        {"name": "block", "op": "repeat", "times": encoder_layers, "layers": encoder_block},
        {"name": "final_layer_norm", "op": "rmsnorm", "eps": eps},
        _drop(ENCODER_OUTPUT, dropout),
        {"name": "decoder_relative_attention_bias", "op": "tensor", "shape": [buckets, heads]},
        # the shared embedding called again, on the decoder's tokens
        {"name": "decoder_embeds", "op": "embedding", "num_embeddings": vocab,
         "embedding_dim": hidden, "tied_to": "shared", "inputs": [DECODER_TOKENS.name]},
        _drop("decoder_embed_drop", dropout),
        {"name": "decoder_block", "op": "repeat", "times": decoder_layers,
         "layers": decoder_block},
        {"name": "decoder_final_layer_norm", "op": "rmsnorm", "eps": eps},
        _drop("decoder_final_drop", dropout),
        head,
    ]  # fmt: skip
    notes = [
        f"encoder-decoder (T5ForConditionalGeneration): {encoder_layers} encoder and "
        f"{decoder_layers} decoder blocks; one shared embedding; LM head "
        f"{'tied to it' if tied else 'untied'}",
        "input_ids is [batch, seq] (the encoder's tokens), decoder_input_ids [batch, "
        "decoder_seq]; the decoder length is the input length unless decoder_sequence_length "
        "is given",
        "relative position bias: a learned table in the first block of each stack; "
        "cross-attention has none",
    ]
    if tied:
        notes.append("tied LM head: the decoder output is scaled by d_model^-0.5 (no parameters)")
    reference = f"T5ForConditionalGeneration (LM head {'tied' if tied else 'untied'})"
    return ((ENCODER_TOKENS, DECODER_TOKENS), layers), reference, notes, 512
