"""Hugging Face ``config.json`` -> layer graph, for the common decoder and encoder families.

Nothing is downloaded: the config alone fixes every parameter shape. Each family is built by
the zoo's transformer builders (:mod:`app.domain.zoo.transformers`) and is compared with one
``transformers`` class, named in :data:`REFERENCE_CLASSES` and in every import's
``reference``; ``benchmarks/hf_params/`` checks the counts against ``transformers`` itself.

Standard library and :mod:`app.domain` only, so the benchmark can import it without the
service's dependencies.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from app.domain.graph.format import BLOCK_INPUT
from app.domain.zoo import transformers as builders
from app.importers.hf_common import Built, _Config, _heads, _kv_heads
from app.importers.hf_families import FAMILY_BUILDERS, FAMILY_CLASSES
from app.importers.hf_t5 import t5_conditional_generation, t5_feed_forward
from app.importers.result import (
    ImportedGraph,
    ImportRejected,
    graph_parameter_count,
    top_level_mapping,
)

# model_type -> (reference class, family of the stored model)
REFERENCE_CLASSES: Mapping[str, tuple[str, str]] = {
    "llama": ("LlamaForCausalLM", "transformer-decoder"),
    "mistral": ("MistralForCausalLM", "transformer-decoder"),
    "mixtral": ("MixtralForCausalLM", "transformer-decoder"),
    "qwen2": ("Qwen2ForCausalLM", "transformer-decoder"),
    "qwen3": ("Qwen3ForCausalLM", "transformer-decoder"),
    "gemma": ("GemmaForCausalLM", "transformer-decoder"),
    "granite": ("GraniteForCausalLM", "transformer-decoder"),
    "phi3": ("Phi3ForCausalLM", "transformer-decoder"),
    "phi": ("PhiForCausalLM", "transformer-decoder"),
    "gpt2": ("GPT2LMHeadModel", "transformer-decoder"),
    "gpt_bigcode": ("GPTBigCodeForCausalLM", "transformer-decoder"),
    "gpt_neox": ("GPTNeoXForCausalLM", "transformer-decoder"),
    "opt": ("OPTForCausalLM", "transformer-decoder"),
    "bloom": ("BloomForCausalLM", "transformer-decoder"),
    "bert": ("BertModel", "transformer-encoder"),
    "roberta": ("RobertaModel", "transformer-encoder"),
    # T5ForConditionalGeneration unless architectures names T5EncoderModel (see _t5)
    "t5": ("T5EncoderModel", "transformer-encoder"),
    "vit": ("ViTModel", "vision-transformer"),
    # sliding-window, MLA and MoE families: app.importers.hf_families
    **FAMILY_CLASSES,
}
SUPPORTED_MODEL_TYPES = tuple(sorted(REFERENCE_CLASSES))
DEFAULT_SEQUENCE_CAP = 4096
_LEARNED_POSITIONS = frozenset({"gpt2", "gpt_bigcode", "opt", "bert", "roberta"})


def _decoder(config: _Config, model_type: str) -> Built:
    hidden = config.size("hidden_size")
    heads = config.size("num_attention_heads")
    # Qwen3Config's head_dim defaults to 128 whatever the hidden size (transformers 5.23).
    head_dim_given = config.raw.get("head_dim") is not None or model_type == "qwen3"
    if model_type == "qwen3":
        head_dim = config.size("head_dim", 128)
    elif head_dim_given:
        head_dim = config.size("head_dim")
    else:
        head_dim = hidden // _heads(config, hidden, "num_attention_heads")
    notes = []
    if model_type == "gemma":
        act = config.activation(
            "hidden_activation" if "hidden_activation" in config.raw else "hidden_act",
            "gelu_pytorch_tanh",
            gated=True,
        )
        notes.append("Gemma scales embeddings by sqrt(hidden_size) and adds 1 to RMSNorm weights "
                     "(no extra parameters)")  # fmt: skip
    else:
        act = config.activation("hidden_act", "silu", gated=True)
    attention_bias = config.flag("attention_bias", False)
    qkv_bias = attention_bias or model_type == "qwen2"
    mlp_bias = config.flag("mlp_bias", False)
    if model_type == "phi3":
        # Phi3Attention / Phi3MLP build qkv_proj, o_proj, gate_up_proj and down_proj without
        # bias whatever the config says; the fused projections hold exactly the weights of
        # separate q/k/v and gate/up projections.
        qkv_bias = attention_bias = mlp_bias = False
        notes.append("fused qkv_proj and gate_up_proj: the same weights as separate q/k/v "
                     "and gate/up projections")  # fmt: skip
        if config.number("partial_rotary_factor", 1.0) != 1.0:
            notes.append("partial rotary embedding: no parameters")
    if model_type == "granite":
        notes.append("embedding, attention, residual and logits multipliers scale activations "
                     "and add no parameters")  # fmt: skip
    if model_type == "qwen3":
        notes.append("q_norm and k_norm: one RMSNorm weight of head_dim per layer each, "
                     "stored as tensors; their normalized q/k copies are not modelled")  # fmt: skip
    experts = None
    top_k = 2
    if model_type == "mixtral":
        experts = config.size("num_local_experts", 8)
        top_k = config.size("num_experts_per_tok", 2)
        if top_k > experts:
            raise ImportRejected(
                f"num_experts_per_tok {top_k} exceeds num_local_experts {experts}",
                pointer="/config/num_experts_per_tok",
            )
        notes.append(f"mixture of {experts} experts, {top_k} per token: estimates count every "
                     "expert's weights and the routed tokens' activations")  # fmt: skip
    tied = config.flag("tie_word_embeddings", model_type == "gemma")
    if config.raw.get("sliding_window") and config.flag("use_sliding_window", True):
        notes.append("sliding-window attention has no parameters; activations are modelled "
                     "as full causal attention (an upper bound)")  # fmt: skip
    if head_dim_given:
        notes.append(f"explicit head_dim {head_dim}")
    graph = builders.llama(
        layers=config.size("num_hidden_layers"),
        hidden=hidden,
        heads=heads,
        kv_heads=_kv_heads(config, heads),
        intermediate=config.size("intermediate_size"),
        vocab=config.size("vocab_size"),
        tied=tied,
        eps=config.number("rms_norm_eps", 1e-6),
        head_dim=head_dim if head_dim_given else None,
        qkv_bias=qkv_bias,
        out_bias=attention_bias,
        activation=act,
        mlp_bias=mlp_bias,
        experts=experts,
        experts_per_token=top_k,
    )
    if model_type == "qwen3":
        _insert_before_attention(
            graph,
            [
                {"name": "q_norm", "op": "tensor", "shape": [head_dim]},
                {"name": "k_norm", "op": "tensor", "shape": [head_dim]},
            ],
        )
    if model_type == "phi3":
        _phi3_residual_dropouts(graph, config.dropout("resid_pdrop"))
        _mark_fused_qkv_projection(graph)
    reference = f"{REFERENCE_CLASSES[model_type][0]} (LM head {'tied' if tied else 'untied'})"
    return graph, reference, notes, config.size("max_position_embeddings", 4096)


def _phi3_residual_dropouts(graph: builders.Graph, p: float) -> None:
    """``Phi3DecoderLayer.resid_attn_dropout`` / ``resid_mlp_dropout`` (``nn.Dropout(resid_pdrop)``,
    models/phi3/modeling_phi3.py) between the attention / MLP output and its residual add: at
    ``p = 0`` (Phi-3's configs) an identity that keeps nothing. They also mark the graph as
    Phi-3's, whose fused ``qkv_proj`` / ``gate_up_proj`` PEFT targets by those names
    (:func:`app.domain.peft.module_naming`)."""
    for layer in graph[1]:
        block = layer.get("layers")
        if layer.get("op") != "repeat" or not block:
            continue
        for branch, add in (("self_attn", "attn_add"), ("mlp", "mlp_add")):
            dropout = f"resid_{'attn' if branch == 'self_attn' else 'mlp'}_dropout"
            at = next(i for i, inner in enumerate(block) if inner["name"] == add)
            block[at] = {
                **block[at],
                "inputs": [dropout if n == branch else n for n in block[at]["inputs"]],
            }
            block.insert(at, {"name": dropout, "op": "dropout", "p": p, "inputs": [branch]})


def _mark_fused_qkv_projection(graph: builders.Graph) -> None:
    """Phi-3's ``qkv_proj`` and ``gate_up_proj`` are one projection each: under CUDA autocast
    each keeps one 16-bit cast of its input, not one a projection (the attention's
    ``fused_qkv_projection``, the MLP's ``fused_gate_up_projection``)."""
    for layer in graph[1]:
        for inner in layer.get("layers") or []:
            if inner.get("op") == "attention":
                inner["fused_qkv_projection"] = True
            if inner.get("op") == "mlp":
                inner["fused_gate_up_projection"] = True


def _insert_before_attention(graph: builders.Graph, tensors: list[builders.Layer]) -> None:
    """Put stored per-layer tensors (no activations) into each block, ahead of its attention,
    which keeps reading the layer before them."""
    for layer in graph[1]:
        block = layer.get("layers")
        if layer.get("op") != "repeat" or not block:
            continue
        index = next(i for i, inner in enumerate(block) if inner["op"] == "attention")
        block[index] = {**block[index], "inputs": [block[index - 1]["name"]]}
        block[index:index] = tensors


def _gpt2(config: _Config, model_type: str) -> Built:
    hidden = config.size("n_embd", alias="hidden_size")
    tied = config.flag("tie_word_embeddings", True)
    graph = builders.gpt2(
        layers=config.size("n_layer", alias="num_hidden_layers"),
        hidden=hidden,
        heads=config.size("n_head", alias="num_attention_heads"),
        vocab=config.size("vocab_size"),
        positions=config.size("n_positions", 1024),
        intermediate=config.size("n_inner", 4 * hidden),
        dropout=config.dropout("resid_pdrop"),
        tied=tied,
        activation=config.activation("activation_function", "gelu_new", gated=False),
        eps=config.number("layer_norm_epsilon", 1e-5),
    )
    notes = ["learned absolute positions: n_positions bounds the sequence length"]
    reference = f"GPT2LMHeadModel (LM head {'tied' if tied else 'untied'})"
    return graph, reference, notes, config.size("n_positions", 1024)


def _gpt_neox(config: _Config, model_type: str) -> Built:
    tied = config.flag("tie_word_embeddings", False)
    parallel = config.flag("use_parallel_residual", True)
    graph = builders.gpt_neox(
        layers=config.size("num_hidden_layers"),
        hidden=config.size("hidden_size"),
        heads=config.size("num_attention_heads"),
        intermediate=config.size("intermediate_size"),
        vocab=config.size("vocab_size"),
        parallel_residual=parallel,
        tied=tied,
        bias=config.flag("attention_bias", True),
        activation=config.activation("hidden_act", "gelu", gated=False),
        eps=config.number("layer_norm_eps", 1e-5),
        positions=config.size("max_position_embeddings", 2048),
        rotary_pct=config.number("rotary_pct", 0.25),
    )
    # GPTNeoXLayer.attention (models/gpt_neox/modeling_gpt_neox.py): PEFT targets it as
    # layers.<i>.attention.query_key_value / .dense
    _rename(graph, "attn", "attention")
    notes = [
        f"{'parallel' if parallel else 'sequential'} residual; rotary embeddings "
        f"(rotary_pct {config.number('rotary_pct', 0.25)}) have no parameters"
    ]
    reference = f"GPTNeoXForCausalLM (embed_out {'tied' if tied else 'untied'})"
    return graph, reference, notes, config.size("max_position_embeddings", 2048)


def _rename(graph: builders.Graph, old: str, new: str) -> None:
    """Rename the repeated block's layer ``old`` (and the inputs that name it) to ``new``, the
    module name of the family's modeling file."""
    for layer in graph[1]:
        for inner in layer.get("layers", []):
            if inner["name"] == old:
                inner["name"] = new
            if "inputs" in inner:
                inner["inputs"] = [new if name == old else name for name in inner["inputs"]]


def _gpt_bigcode(config: _Config, model_type: str) -> Built:
    """``GPTBigCodeForCausalLM`` (SantaCoder, StarCoder): GPT-2 with multi-query attention.

    The fused ``c_attn`` projects to ``hidden + 2 * kv_heads * head_dim``: the weights of
    separate q, k and v projections with one KV head (``multi_query``) or all of them.
    """
    hidden = config.size("n_embd", alias="hidden_size")
    heads = _heads(config, hidden, "n_head", alias="num_attention_heads")
    multi_query = config.flag("multi_query", True)
    kv_heads = 1 if multi_query else heads
    if config.raw.get("num_key_value_heads") is not None:
        given = config.size("num_key_value_heads")
        if given != kv_heads:
            raise ImportRejected(
                f"config field 'num_key_value_heads' ({given}) contradicts multi_query "
                f"{str(multi_query).lower()}: GPTBigCode has {kv_heads} KV head"
                f"{'s' if kv_heads > 1 else ''}",
                pointer="/config/num_key_value_heads",
            )
    tied = config.flag("tie_word_embeddings", True)
    positions = config.size("n_positions", 1024, alias="max_position_embeddings")
    graph = builders.gpt2(
        layers=config.size("n_layer", alias="num_hidden_layers"),
        hidden=hidden,
        heads=heads,
        vocab=config.size("vocab_size"),
        positions=positions,
        intermediate=config.size("n_inner", 4 * hidden),
        dropout=config.dropout("resid_pdrop"),
        tied=tied,
        activation=config.activation("activation_function", "gelu_pytorch_tanh", gated=False),
        eps=config.number("layer_norm_epsilon", 1e-5),
    )
    for layer in graph[1]:
        for inner in layer.get("layers", []):
            if inner["op"] == "attention":
                inner["num_kv_heads"] = kv_heads
    kind = "multi-query attention (1 KV head)" if multi_query else "multi-head attention"
    notes = [f"{kind}; the fused c_attn holds the weights of separate q/k/v projections",
             "learned absolute positions: n_positions bounds the sequence length"]  # fmt: skip
    reference = f"GPTBigCodeForCausalLM (LM head {'tied' if tied else 'untied'})"
    return graph, reference, notes, positions


def _layernorm(name: str, eps: float, *, affine: bool = True) -> builders.Layer:
    layer: builders.Layer = {"name": name, "op": "layernorm", "eps": eps}
    if not affine:
        layer["elementwise_affine"] = False
    return layer


def _dropout(name: str, p: float, inputs: list[str] | None = None) -> list[builders.Layer]:
    """A dropout layer, or nothing when ``p`` is 0 (an identity)."""
    if not p:
        return []
    layer: builders.Layer = {"name": name, "op": "dropout", "p": p}
    if inputs:
        layer["inputs"] = inputs
    return [layer]


def _opt(config: _Config, model_type: str) -> Built:
    """``OPTForCausalLM``: learned positions (offset 2), ReLU MLP, pre- or post-LN blocks, and
    ``project_in`` / ``project_out`` when ``word_embed_proj_dim`` differs from the hidden size."""
    hidden = config.size("hidden_size")
    heads = _heads(config, hidden, "num_attention_heads")
    embed_dim = config.size("word_embed_proj_dim", hidden)
    positions = config.size("max_position_embeddings", 2048)
    bias = config.flag("enable_bias", True)
    affine = config.flag("layer_norm_elementwise_affine", True)
    pre_norm = config.flag("do_layer_norm_before", True)
    dropout = config.dropout("dropout")
    eps = 1e-5  # nn.LayerNorm's default: OPT passes no eps
    attention: builders.Layer = {"name": "self_attn", "op": "attention", "num_heads": heads,
                                 "causal": True, "qkv_bias": bias, "out_bias": bias}  # fmt: skip
    if config.dropout("attention_dropout"):
        attention["dropout"] = config.dropout("attention_dropout")
    mlp: builders.Layer = {
        "name": "mlp",
        "op": "mlp",
        "intermediate_size": config.size("ffn_dim"),
        "activation": config.activation("activation_function", "relu", gated=False),
        "bias": bias,
    }
    attn_out = "attn_drop" if dropout else "self_attn"
    mlp_out = "mlp_drop" if dropout else "mlp"
    if pre_norm:
        block = [
            _layernorm("self_attn_layer_norm", eps, affine=affine),
            attention,
            *_dropout("attn_drop", dropout),
            {"name": "attn_add", "op": "add", "inputs": [BLOCK_INPUT, attn_out]},
            _layernorm("final_layer_norm", eps, affine=affine),
            mlp,
            *_dropout("mlp_drop", dropout),
            {"name": "mlp_add", "op": "add", "inputs": ["attn_add", mlp_out]},
        ]
    else:
        block = [
            attention,
            *_dropout("attn_drop", dropout),
            {"name": "attn_add", "op": "add", "inputs": [BLOCK_INPUT, attn_out]},
            _layernorm("self_attn_layer_norm", eps, affine=affine),
            mlp,
            *_dropout("mlp_drop", dropout),
            {"name": "mlp_add", "op": "add", "inputs": ["self_attn_layer_norm", mlp_out]},
            _layernorm("final_layer_norm", eps, affine=affine),
        ]
    tied = config.flag("tie_word_embeddings", True)
    projected = embed_dim != hidden
    layers: list[builders.Layer] = [
        {
            "name": "embed_tokens",
            "op": "embedding",
            "num_embeddings": config.size("vocab_size"),
            "embedding_dim": embed_dim,
        },
    ]
    if projected:
        layers.append({"name": "project_in", "op": "linear", "out_features": hidden,
                       "bias": False})  # fmt: skip
    layers += [
        # OPTLearnedPositionalEmbedding keeps max_position_embeddings + 2 rows (offset 2)
        {"name": "embed_positions", "op": "embedding_add", "num_embeddings": positions + 2},
        *_dropout("embed_drop", dropout),
        {
            "name": "layers",
            "op": "repeat",
            "times": config.size("num_hidden_layers"),
            "layers": block,
        },
    ]
    if pre_norm and not config.flag("_remove_final_layer_norm", False):
        layers.append(_layernorm("final_layer_norm", eps, affine=affine))
    if projected:
        layers.append({"name": "project_out", "op": "linear", "out_features": embed_dim,
                       "bias": False})  # fmt: skip
    head: builders.Layer = {"name": "lm_head", "op": "linear",
                            "out_features": config.size("vocab_size"), "bias": False}  # fmt: skip
    if tied:
        head["tied_to"] = "embed_tokens"
    layers.append(head)
    notes = [
        f"{'pre' if pre_norm else 'post'}-LN blocks; learned positions with OPT's offset of 2 "
        "rows: max_position_embeddings bounds the sequence length"
    ]
    if projected:
        notes.append(f"project_in / project_out between word_embed_proj_dim {embed_dim} and "
                     f"hidden_size {hidden}")  # fmt: skip
    reference = f"OPTForCausalLM (LM head {'tied' if tied else 'untied'})"
    return ((builders.TOKENS,), layers), reference, notes, positions


def _phi(config: _Config, model_type: str) -> Built:
    """``PhiForCausalLM`` (Phi-1/1.5/2): attention and MLP in parallel on one LayerNorm, partial
    rotary embedding, dense biases everywhere and a biased LM head."""
    hidden = config.size("hidden_size")
    heads = config.size("num_attention_heads")
    eps = config.number("layer_norm_eps", 1e-5)
    dropout = config.dropout("resid_pdrop")
    head_dim = None
    if config.raw.get("head_dim") is not None:
        head_dim = config.size("head_dim")
    else:
        _heads(config, hidden, "num_attention_heads")
    attention: builders.Layer = {
        "name": "self_attn",
        "op": "attention",
        "num_heads": heads,
        "num_kv_heads": _kv_heads(config, heads),
        "causal": True,
        "rotary": True,
    }
    if head_dim is not None:
        attention["head_dim"] = head_dim
    if config.dropout("attention_dropout"):
        attention["dropout"] = config.dropout("attention_dropout")
    block: list[builders.Layer] = [_layernorm("input_layernorm", eps)]
    notes = [f"parallel attention and MLP on one LayerNorm; partial rotary embedding "
             f"(partial_rotary_factor {config.number('partial_rotary_factor', 0.5)}) has no "
             "parameters"]  # fmt: skip
    if config.flag("qk_layernorm", False):
        _heads(config, hidden, "num_attention_heads")
        per_head = hidden // heads  # PhiAttention sizes them hidden_size // num_attention_heads
        block += [
            {"name": "q_layernorm", "op": "tensor", "shape": [2, per_head]},
            {"name": "k_layernorm", "op": "tensor", "shape": [2, per_head]},
        ]
        attention["inputs"] = ["input_layernorm"]
        notes.append("q_layernorm / k_layernorm (weight and bias of hidden_size / heads each) "
                     "are stored tensors; the normalized q/k copies are not modelled")  # fmt: skip
    attn_out = "attn_drop" if dropout else "self_attn"
    mlp_out = "mlp_drop" if dropout else "mlp"
    block += [
        attention,
        *_dropout("attn_drop", dropout),
        {
            "name": "mlp",
            "op": "mlp",
            "intermediate_size": config.size("intermediate_size"),
            "activation": config.activation("hidden_act", "gelu_new", gated=False),
            "inputs": ["input_layernorm"],
        },
        *_dropout("mlp_drop", dropout),
        {"name": "residual_add", "op": "add", "inputs": [BLOCK_INPUT, attn_out, mlp_out]},
    ]
    tied = config.flag("tie_word_embeddings", False)
    vocab = config.size("vocab_size")
    head: builders.Layer = {"name": "lm_head", "op": "linear", "out_features": vocab}
    if tied:
        head["tied_to"] = "embed_tokens"
    layers: list[builders.Layer] = [
        {
            "name": "embed_tokens",
            "op": "embedding",
            "num_embeddings": vocab,
            "embedding_dim": hidden,
        },
        *_dropout("embed_drop", config.dropout("embd_pdrop")),
        {
            "name": "layers",
            "op": "repeat",
            "times": config.size("num_hidden_layers"),
            "layers": block,
        },
        _layernorm("final_layernorm", eps),
        head,
    ]
    reference = f"PhiForCausalLM (LM head {'tied' if tied else 'untied'}, with bias)"
    return (
        ((builders.TOKENS,), layers),
        reference,
        notes,
        config.size("max_position_embeddings", 2048),
    )


def _bloom(config: _Config, model_type: str) -> Built:
    """``BloomForCausalLM``: ALiBi attention (no position parameters), a LayerNorm on the word
    embeddings, fused biased query_key_value, GELU (tanh) MLP of 4 x hidden, tied head."""
    # BloomConfig reads the legacy ``n_embed`` in place of hidden_size when it is given.
    hidden = config.size("n_embed") if "n_embed" in config.raw else config.size("hidden_size")
    heads = _heads(config, hidden, "n_head", alias="num_attention_heads")
    eps = config.number("layer_norm_epsilon", 1e-5)
    dropout = config.dropout("hidden_dropout")
    attention: builders.Layer = {"name": "self_attention", "op": "attention", "num_heads": heads,
                                 "causal": True, "fused_qkv_projection": True}  # fmt: skip
    if config.dropout("attention_dropout"):
        attention["dropout"] = config.dropout("attention_dropout")
    # apply_residual_connection_post_layernorm: the residual is the normalized input
    post = config.flag("apply_residual_connection_post_layernorm", False)
    attn_out = "attn_drop" if dropout else "self_attention"
    mlp_out = "mlp_drop" if dropout else "mlp"
    block: list[builders.Layer] = [
        _layernorm("input_layernorm", eps),
        attention,
        *_dropout("attn_drop", dropout),
        {
            "name": "attn_add",
            "op": "add",
            "inputs": ["input_layernorm" if post else BLOCK_INPUT, attn_out],
        },
        _layernorm("post_attention_layernorm", eps),
        {"name": "mlp", "op": "mlp", "intermediate_size": 4 * hidden, "activation": "gelu_tanh"},
        *_dropout("mlp_drop", dropout),
        {
            "name": "mlp_add",
            "op": "add",
            "inputs": ["post_attention_layernorm" if post else "attn_add", mlp_out],
        },
    ]
    tied = config.flag("tie_word_embeddings", True)
    vocab = config.size("vocab_size")
    head: builders.Layer = {"name": "lm_head", "op": "linear", "out_features": vocab,
                            "bias": False}  # fmt: skip
    if tied:
        head["tied_to"] = "word_embeddings"
    layers: list[builders.Layer] = [
        {
            "name": "word_embeddings",
            "op": "embedding",
            "num_embeddings": vocab,
            "embedding_dim": hidden,
        },
        _layernorm("word_embeddings_layernorm", eps),
        {
            "name": "h",
            "op": "repeat",
            "times": config.size("n_layer", alias="num_hidden_layers"),
            "layers": block,
        },
        _layernorm("ln_f", eps),
        head,
    ]
    notes = ["ALiBi attention: no position parameters and no position limit; the per-head "
             "linear bias added to the scores is not modelled",
             "BLOOM's GELU is the tanh approximation"]  # fmt: skip
    reference = f"BloomForCausalLM (LM head {'tied' if tied else 'untied'})"
    return ((builders.TOKENS,), layers), reference, notes, None


def _bert(config: _Config, model_type: str) -> Built:
    kind = config.text("position_embedding_type", "absolute")
    if kind != "absolute":
        raise ImportRejected(
            f"position_embedding_type {kind!r} is not supported; only 'absolute'",
            pointer="/config/position_embedding_type",
        )
    hidden = config.size("hidden_size")
    graph = builders.bert(
        layers=config.size("num_hidden_layers"),
        hidden=hidden,
        heads=config.size("num_attention_heads"),
        vocab=config.size("vocab_size"),
        positions=config.size("max_position_embeddings", 512),
        type_vocab=config.size("type_vocab_size", 2),
        intermediate=config.size("intermediate_size", 4 * hidden),
        dropout=config.dropout("hidden_dropout_prob"),
        eps=config.number("layer_norm_eps", 1e-12),
        activation=config.activation("hidden_act", "gelu", gated=False),
    )
    name = REFERENCE_CLASSES[model_type][0]
    notes = ["the encoder with its pooler; task heads (masked LM, classification) are not "
             "imported"]  # fmt: skip
    if model_type == "roberta":
        notes.append("RoBERTa offsets positions by padding_idx + 1: max_position_embeddings - 2 "
                     "tokens fit")  # fmt: skip
        positions = config.size("max_position_embeddings", 514) - 2
    else:
        positions = config.size("max_position_embeddings", 512)
    return graph, f"{name} (with pooler)", notes, max(positions, 1)


def _t5(config: _Config, model_type: str) -> Built:
    """``T5ForConditionalGeneration`` (:mod:`app.importers.hf_t5`), or the encoder stack alone
    (``T5EncoderModel``) when ``architectures`` names that class."""
    if "T5EncoderModel" not in config.architectures():
        return t5_conditional_generation(config)
    projection = t5_feed_forward(config)
    hidden = config.size("d_model")
    heads = config.size("num_heads")
    graph = builders.t5_encoder(
        layers=config.size("num_layers"),
        hidden=hidden,
        heads=heads,
        head_dim=config.size("d_kv", hidden // heads if hidden % heads == 0 else None),
        intermediate=config.size("d_ff"),
        vocab=config.size("vocab_size"),
        gated=projection != "relu",
        buckets=config.size("relative_attention_num_buckets", 32),
        dropout=config.dropout("dropout_rate"),
        eps=config.number("layer_norm_epsilon", 1e-6),
    )
    if projection == "gated-silu":
        _swap_activation(graph, "geglu", "swiglu")
    notes = ["the encoder stack alone (architectures names T5EncoderModel)",
             "relative position bias: a learned table in the first block"]  # fmt: skip
    return graph, "T5EncoderModel", notes, 512


def _swap_activation(graph: builders.Graph, old: str, new: str) -> None:
    for layer in graph[1]:
        for inner in layer.get("layers", []):
            if inner.get("activation") == old:
                inner["activation"] = new


def _vit(config: _Config, model_type: str) -> Built:
    architectures = config.architectures()
    classify = "ViTForImageClassification" in architectures
    hidden = config.size("hidden_size")
    classes = 0
    if classify:
        labels = config.raw.get("id2label")
        if isinstance(labels, Mapping) and labels:
            classes = len(labels)
        else:
            classes = config.size("num_labels", 2)
    graph = builders.vit(
        layers=config.size("num_hidden_layers"),
        hidden=hidden,
        heads=config.size("num_attention_heads"),
        intermediate=config.size("intermediate_size", 4 * hidden),
        patch=config.size("patch_size", 16),
        image=config.size("image_size", 224),
        classes=max(classes, 1),
        dropout=config.dropout("hidden_dropout_prob"),
        head="classifier" if classify else "pooler",
        qkv_bias=config.flag("qkv_bias", True),
        channels=config.size("num_channels", 3),
        eps=config.number("layer_norm_eps", 1e-12),
        activation=config.activation("hidden_act", "gelu", gated=False),
    )
    if classify:
        reference = f"ViTForImageClassification ({classes} labels, no pooler)"
    else:
        reference = "ViTModel (with pooler)"
    notes = ["learned positions fix the image size: inputs must be image_size square"]
    return graph, reference, notes, None


_BUILDERS: Mapping[str, Callable[[_Config, str], Built]] = {
    "llama": _decoder,
    "mistral": _decoder,
    "mixtral": _decoder,
    "qwen2": _decoder,
    "qwen3": _decoder,
    "gemma": _decoder,
    "granite": _decoder,
    "phi3": _decoder,
    "phi": _phi,
    "gpt2": _gpt2,
    "gpt_bigcode": _gpt_bigcode,
    "gpt_neox": _gpt_neox,
    "opt": _opt,
    "bloom": _bloom,
    "bert": _bert,
    "roberta": _bert,
    "t5": _t5,
    "vit": _vit,
    **FAMILY_BUILDERS,
}


def import_hf_config(
    raw: Mapping[str, Any], *, sequence_length: int | None = None
) -> ImportedGraph:
    """Build the layer graph a ``config.json`` describes.

    Raises
    ------
    ImportRejected
        Unknown ``model_type`` (listing the supported ones), or a field that is missing or
        out of range (naming it).
    """
    if not isinstance(raw, Mapping):
        raise ImportRejected("config must be a JSON object", pointer="/config")
    model_type = raw.get("model_type")
    if model_type not in _BUILDERS or not isinstance(model_type, str):
        raise ImportRejected(
            f"model_type {model_type!r} is not supported; supported: "
            + ", ".join(SUPPORTED_MODEL_TYPES),
            pointer="/config/model_type",
            kind="unsupported-model-type",
        )
    config = _Config(raw)
    (inputs, layers), reference, notes, positions = _BUILDERS[model_type](config, model_type)
    bindings: dict[str, int] = {}
    if model_type == "vit":
        bindings["image"] = config.size("image_size", 224)
    else:
        limit = positions or DEFAULT_SEQUENCE_CAP
        seq = sequence_length or min(limit, DEFAULT_SEQUENCE_CAP)
        if model_type in _LEARNED_POSITIONS and seq > limit:
            raise ImportRejected(
                f"sequence_length {seq} exceeds the model's {limit} learned positions",
                pointer="/sequence_length",
            )
        bindings["seq"] = seq
        if sequence_length is None:
            notes.append(f"default sequence length {seq}: the smaller of the model's {limit} "
                         f"positions and {DEFAULT_SEQUENCE_CAP}")  # fmt: skip
    params = graph_parameter_count(inputs, layers, bindings)
    name_or_path = raw.get("_name_or_path")
    label = name_or_path if isinstance(name_or_path, str) and name_or_path else model_type
    class_name, family = REFERENCE_CLASSES[model_type]
    if reference.startswith("T5ForConditionalGeneration"):
        class_name, family = "T5ForConditionalGeneration", "transformer-encoder-decoder"
    return ImportedGraph(
        name=f"{label} ({class_name})"[:200],
        family=family,
        description=(
            f"Imported from a Hugging Face config.json (model_type {model_type}); "
            f"parameters match transformers {reference}."
        ),
        inputs=inputs,
        layers=layers,
        default_bindings=bindings,
        parameter_count=params,
        source_parameter_count=None,
        reference=f"transformers {reference}",
        op_mapping=top_level_mapping(layers),
        assumptions=tuple(notes),
    )
