"""Hugging Face ``config.json`` import for the families people serve beyond the Llama shape.

* sliding-window / hybrid attention: Gemma-2 (``gemma2``), Gemma-3 text (``gemma3_text``) and
  gpt-oss (``gpt_oss``): per-layer ``layer_types``; a sliding layer's attention carries
  ``sliding_window`` (its KV cache holds at most that many tokens);
* multi-head latent attention (MLA) with DeepSeek MoE: DeepSeek-V2 / V2-Lite (``deepseek_v2``),
  DeepSeek-V3 (``deepseek_v3``) and Kimi-K2 (``kimi_k2``: its config.json names that model_type
  but DeepseekV3ForCausalLM and DeepseekV3Config through auto_map, so it is built as
  ``deepseek_v3``): the attention carries ``kv_lora_rank``,
  ``q_lora_rank``, ``qk_nope_head_dim``, ``qk_rope_head_dim`` and ``v_head_dim`` (the cache holds
  one latent of ``kv_lora_rank + qk_rope_head_dim`` a token and layer); the first
  ``first_k_dense_replace`` layers have a dense MLP, the others routed plus shared experts;
* mixtures of experts with a shared expert or dense layers: ``qwen2_moe`` (shared expert and its
  sigmoid gate), ``qwen3_moe``, ``llama4_text`` (interleaved MoE layers, shared expert).

Layers that differ (a window, a dense MLP) are laid out as ``repeat`` runs: a periodic pattern
(Gemma-2's sliding/full pairs, Gemma-3's 5:1) as one repeat of its period plus a repeat of the
leftover layers, otherwise runs of identical layers (DeepSeek's dense first layers, then MoE).
Each family names the ``transformers`` class whose parameter count it reproduces;
``benchmarks/hf_params/count.py`` checks them on the meta device. Standard library and
:mod:`app.domain` only.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from app.domain.graph.format import BLOCK_INPUT
from app.domain.zoo import transformers as builders
from app.importers.hf_common import Built, _Config, _kv_heads
from app.importers.result import ImportRejected

Layer = builders.Layer

# model_type -> (reference class, family of the stored model)
FAMILY_CLASSES: Mapping[str, tuple[str, str]] = {
    "gemma2": ("Gemma2ForCausalLM", "transformer-decoder"),
    "gemma3_text": ("Gemma3ForCausalLM", "transformer-decoder"),
    "gpt_oss": ("GptOssForCausalLM", "transformer-decoder"),
    "deepseek_v2": ("DeepseekV2ForCausalLM", "transformer-decoder"),
    "deepseek_v3": ("DeepseekV3ForCausalLM", "transformer-decoder"),
    # moonshotai/Kimi-K2-Instruct's config.json: model_type kimi_k2, architectures
    # DeepseekV3ForCausalLM, auto_map AutoConfig configuration_deepseek.DeepseekV3Config
    "kimi_k2": ("DeepseekV3ForCausalLM", "transformer-decoder"),
    "qwen2_moe": ("Qwen2MoeForCausalLM", "transformer-decoder"),
    "qwen3_moe": ("Qwen3MoeForCausalLM", "transformer-decoder"),
    "llama4_text": ("Llama4ForCausalLM", "transformer-decoder"),
}
_LAYER_TYPES = ("sliding_attention", "full_attention")
_MAX_PERIOD = 8  # the longest layer pattern laid out as one repeat (Gemma-3's is 6)


def _fail(key: str, message: str) -> ImportRejected:
    return ImportRejected(f"config field '{key}' {message}", pointer=f"/config/{key}")


def _optional_size(config: _Config, key: str) -> int | None:
    """A positive integer that may be null or absent (DeepSeek's ``q_lora_rank``)."""
    return None if config.raw.get(key) is None else config.size(key)


def _layer_types(config: _Config, layers: int, default: Callable[[int], str]) -> list[str]:
    """``layer_types`` as given (checked), else the family's rule for layer ``i``."""
    given = config.raw.get("layer_types")
    if given is None:
        return [default(i) for i in range(layers)]
    if not isinstance(given, list) or any(t not in _LAYER_TYPES for t in given):
        raise _fail("layer_types", f"must be a list of {' or '.join(_LAYER_TYPES)}")
    if len(given) != layers:
        raise _fail(
            "layer_types", f"has {len(given)} entries for num_hidden_layers {layers} layers"
        )
    return list(given)


def _windows(config: _Config, types: list[str], default_window: int) -> list[int | None]:
    """Each layer's attention window: ``sliding_window`` on sliding layers, None on full ones."""
    if "sliding_attention" not in types:
        return [None] * len(types)
    if "sliding_window" in config.raw and config.raw["sliding_window"] is None:
        raise _fail("sliding_window", "is required: layer_types has sliding_attention layers")
    window = config.size("sliding_window", default_window)
    return [window if t == "sliding_attention" else None for t in types]


def _layer_indices(config: _Config, key: str, layers: int) -> frozenset[int]:
    value = config.raw.get(key) or []
    if not isinstance(value, list) or not all(
        isinstance(i, int) and not isinstance(i, bool) and 0 <= i < layers for i in value
    ):
        raise _fail(key, f"must be a list of layer indices below num_hidden_layers {layers}")
    return frozenset(value)


def _stack(kinds: Sequence[Any]) -> list[tuple[int, int, list[Any]]]:
    """``(first layer, times, body kinds)`` runs laying out the per-layer ``kinds``.

    A pattern of period p <= 8 becomes one repeat of p layers and one of the leftover layers;
    anything else becomes runs of identical layers."""
    n = len(kinds)
    for p in range(1, min(n, _MAX_PERIOD) + 1):
        if all(kinds[i] == kinds[i - p] for i in range(p, n)):
            runs = [(0, n // p, list(kinds[:p]))]
            if n % p:
                runs.append((n - n % p, 1, list(kinds[: n % p])))
            return runs
    out: list[tuple[int, int, list[Any]]] = []
    for i, kind in enumerate(kinds):
        if out and out[-1][2][0] == kind:
            first, times, body = out[-1]
            out[-1] = (first, times + 1, body)
        else:
            out.append((i, 1, [kind]))
    return out


def _decoder_layer(
    prefix: str,
    residual: str,
    attention: Layer,
    ffn: Layer,
    *,
    eps: float,
    sandwich: bool,
    qk_norm: int | None,
) -> list[Layer]:
    """One pre-norm decoder layer whose residual stream enters as ``residual``.

    ``sandwich``: Gemma-2/3's extra RMSNorms on the attention and MLP outputs (four a layer);
    ``qk_norm``: per-head RMSNorm weights of that size on q and k, stored tensors (Qwen3, Gemma-3).
    """

    def norm(name: str) -> Layer:
        return {"name": prefix + name, "op": "rmsnorm", "eps": eps}

    out: list[Layer] = [norm("input_layernorm")]
    attn = {**attention, "name": prefix + "self_attn"}
    if qk_norm is not None:
        out += [
            {"name": prefix + "q_norm", "op": "tensor", "shape": [qk_norm]},
            {"name": prefix + "k_norm", "op": "tensor", "shape": [qk_norm]},
        ]
        attn["inputs"] = [prefix + "input_layernorm"]
    out.append(attn)
    branch = attn["name"]
    if sandwich:
        out.append(norm("post_attention_layernorm"))
        branch = prefix + "post_attention_layernorm"
    out.append({"name": prefix + "attn_add", "op": "add", "inputs": [residual, branch]})
    out.append(norm("pre_feedforward_layernorm" if sandwich else "post_attention_layernorm"))
    mlp = {**ffn, "name": prefix + ffn["name"]}
    out.append(mlp)
    branch = mlp["name"]
    if sandwich:
        out.append(norm("post_feedforward_layernorm"))
        branch = prefix + "post_feedforward_layernorm"
    out.append({"name": prefix + "mlp_add", "op": "add", "inputs": [prefix + "attn_add", branch]})
    return out


def _decoder(
    config: _Config,
    *,
    attentions: Sequence[Layer],
    ffns: Sequence[Layer],
    eps: float,
    tied: bool,
    sandwich: bool = False,
    qk_norm: int | None = None,
) -> builders.Graph:
    """Embedding, the decoder layers (layer ``i``: ``attentions[i]``, ``ffns[i]``) laid out by
    :func:`_stack`, the final RMSNorm and the LM head."""
    vocab = config.size("vocab_size")
    kinds = [
        (repr(sorted(a.items())), repr(sorted(f.items())))
        for a, f in zip(attentions, ffns, strict=True)
    ]
    by_kind = {k: (a, f) for k, a, f in zip(kinds, attentions, ffns, strict=True)}
    runs = _stack(kinds)
    layers: list[Layer] = [
        {
            "name": "embed_tokens",
            "op": "embedding",
            "num_embeddings": vocab,
            "embedding_dim": config.size("hidden_size"),
        }
    ]
    for first, times, body_kinds in runs:
        body: list[Layer] = []
        residual = BLOCK_INPUT
        for j, kind in enumerate(body_kinds):
            attention, ffn = by_kind[kind]
            prefix = f"l{j}_" if len(body_kinds) > 1 else ""
            body += _decoder_layer(
                prefix, residual, attention, ffn, eps=eps, sandwich=sandwich, qk_norm=qk_norm
            )
            residual = prefix + "mlp_add"
        name = "layers" if len(runs) == 1 else f"layers_{first}"
        layers.append({"name": name, "op": "repeat", "times": times, "layers": body})
    layers.append({"name": "norm", "op": "rmsnorm", "eps": eps})
    head: Layer = {"name": "lm_head", "op": "linear", "out_features": vocab, "bias": False}
    if tied:
        head["tied_to"] = "embed_tokens"
    layers.append(head)
    return (builders.TOKENS,), layers


def _attention(
    config: _Config, *, head_dim: int, bias: bool, window: int | None = None, sinks: bool = False
) -> Layer:
    heads = config.size("num_attention_heads")
    layer: Layer = {
        "name": "self_attn",
        "op": "attention",
        "num_heads": heads,
        "num_kv_heads": _kv_heads(config, heads),
        "head_dim": head_dim,
        "causal": True,
        "rotary": True,
        "qkv_bias": bias,
        "out_bias": bias,
    }
    if window is not None:
        layer["sliding_window"] = window
    if sinks:
        layer["sinks"] = True
    return layer


def _mlp(intermediate: int, activation: str = "swiglu") -> Layer:
    return {
        "name": "mlp",
        "op": "mlp",
        "intermediate_size": intermediate,
        "activation": activation,
        "bias": False,
    }


def _top_k(config: _Config, experts: int, key: str = "num_experts_per_tok") -> int:
    top_k = config.size(key)
    if top_k > experts:
        raise _fail(key, f"({top_k}) exceeds the number of routed experts ({experts})")
    return top_k


def _window_notes(windows: Sequence[int | None]) -> list[str]:
    sliding = [w for w in windows if w is not None]
    if not sliding:
        return []
    return [
        f"{len(sliding)} of {len(windows)} layers attend within a sliding window of "
        f"{sliding[0]} tokens: their KV cache holds at most {sliding[0]} tokens a sequence; "
        "the other layers attend to the whole context"
    ]


def _gemma2(config: _Config, model_type: str) -> Built:
    """``Gemma2ForCausalLM`` / ``Gemma3ForCausalLM`` (``gemma3_text``): Gemma with four RMSNorms a
    layer (before and after attention and MLP), GeGLU, a tied head, sliding-window layers
    alternating with global ones (Gemma-2: every other layer; Gemma-3: five in six), and Gemma-3's
    per-head q/k RMSNorms."""
    gemma3 = model_type == "gemma3_text"
    layers = config.size("num_hidden_layers")
    head_dim = config.size("head_dim", 256)
    if gemma3:
        period = config.size("sliding_window_pattern", 6)
        types = _layer_types(config, layers, lambda i: _LAYER_TYPES[(i + 1) % period == 0])
    else:
        types = _layer_types(config, layers, lambda i: _LAYER_TYPES[(i + 1) % 2 == 0])
    windows = _windows(config, types, 4096)
    bias = config.flag("attention_bias", False)
    act = config.activation(
        "hidden_activation" if "hidden_activation" in config.raw else "hidden_act",
        "gelu_pytorch_tanh",
        gated=True,
    )
    graph = _decoder(
        config,
        attentions=[_attention(config, head_dim=head_dim, bias=bias, window=w) for w in windows],
        ffns=[_mlp(config.size("intermediate_size"), act)] * layers,
        eps=config.number("rms_norm_eps", 1e-6),
        tied=config.flag("tie_word_embeddings", True),
        sandwich=True,
        qk_norm=head_dim if gemma3 else None,
    )
    notes = _window_notes(windows) + [
        "Gemma scales embeddings by sqrt(hidden_size) and adds 1 to RMSNorm weights; attention "
        "and final logit soft-capping and query_pre_attn_scalar add no parameters",
        f"explicit head_dim {head_dim}",
    ]
    if gemma3:
        notes.append(
            "q_norm and k_norm: one RMSNorm weight of head_dim per layer each, stored "
            "as tensors; rope_local_base_freq on sliding layers has no parameters"
        )
    return (
        graph,
        _reference(model_type, config),
        notes,
        config.size("max_position_embeddings", 8192 if not gemma3 else 32768),
    )


def _gpt_oss(config: _Config, model_type: str) -> Built:
    """``GptOssForCausalLM``: sliding (128) and full attention layers alternating, biased q/k/v/o
    projections and one learned attention-sink logit a head, and a mixture of experts with a
    biased router and biased expert projections (gate_up and down), SwiGLU clamped at
    ``swiglu_limit`` (no parameters)."""
    layers = config.size("num_hidden_layers")
    types = _layer_types(config, layers, lambda i: _LAYER_TYPES[(i + 1) % 2 == 0])
    windows = _windows(config, types, 128)
    experts = config.size("num_local_experts")
    top_k = _top_k(
        config,
        experts,
        "num_experts_per_tok" if "num_experts_per_tok" in config.raw else "experts_per_token",
    )
    moe: Layer = {
        "name": "mlp",
        "op": "moe",
        "num_experts": experts,
        "experts_per_token": top_k,
        "intermediate_size": config.size("intermediate_size"),
        "activation": "swiglu",
        "bias": True,
        "router_bias": True,
    }
    bias = config.flag("attention_bias", True)
    head_dim = config.size("head_dim", 64)
    graph = _decoder(
        config,
        attentions=[
            _attention(config, head_dim=head_dim, bias=bias, window=w, sinks=True) for w in windows
        ],
        ffns=[moe] * layers,
        eps=config.number("rms_norm_eps", 1e-5),
        tied=config.flag("tie_word_embeddings", False),
    )
    notes = _window_notes(windows) + [
        "attention sinks: one learned logit a head (sinks), counted as parameters",
        f"mixture of {experts} experts, {top_k} per token, with biased router and experts",
    ]
    if isinstance(config.raw.get("quantization_config"), Mapping):
        method = config.raw["quantization_config"].get("quant_method", "?")
        notes.append(
            f"parameters are counted as transformers builds the model from its config "
            f"(unquantized shapes); the checkpoint stores the experts as {method} "
            "(quantization_config), which changes their bytes, not their count"
        )
    return (
        graph,
        _reference(model_type, config),
        notes,
        config.size("max_position_embeddings", 131072),
    )


def _deepseek(config: _Config, model_type: str) -> Built:
    """``DeepseekV2ForCausalLM`` / ``DeepseekV3ForCausalLM`` (DeepSeek-V2, V2-Lite, V3, R1,
    Kimi-K2): multi-head latent attention and DeepSeek MoE.

    MLA: q through a low-rank ``q_a_proj`` / ``q_a_layernorm`` / ``q_b_proj`` (``q_lora_rank``)
    or one ``q_proj`` when it is null; keys and values through ``kv_a_proj_with_mqa`` (to
    ``kv_lora_rank + qk_rope_head_dim``), ``kv_a_layernorm`` and ``kv_b_proj`` (to heads x
    ``qk_nope_head_dim + v_head_dim``); ``o_proj`` from heads x ``v_head_dim``. MoE from layer
    ``first_k_dense_replace`` on (every ``moe_layer_freq``-th, V2): ``n_routed_experts`` SwiGLU
    experts of ``moe_intermediate_size``, ``num_experts_per_tok`` a token, a bias-free router, and
    ``n_shared_experts`` shared experts as one MLP of ``n_shared_experts x moe_intermediate_size``;
    the other layers a dense MLP of ``intermediate_size``.
    """
    layers = config.size("num_hidden_layers")
    heads = config.size("num_attention_heads")
    bias = config.flag("attention_bias", False)
    q_lora = _optional_size(config, "q_lora_rank")
    attention: Layer = {
        "name": "self_attn",
        "op": "attention",
        "num_heads": heads,
        "causal": True,
        "rotary": True,
        "qkv_bias": bias,
        "out_bias": bias,
        "kv_lora_rank": config.size("kv_lora_rank"),
        "qk_nope_head_dim": config.size("qk_nope_head_dim"),
        "qk_rope_head_dim": config.size("qk_rope_head_dim"),
        "v_head_dim": config.size("v_head_dim"),
    }
    if q_lora is not None:
        attention["q_lora_rank"] = q_lora
    dense = _mlp(config.size("intermediate_size"))
    routed = _optional_size(config, "n_routed_experts")
    first_dense = config.raw.get("first_k_dense_replace") or 0
    if isinstance(first_dense, bool) or not isinstance(first_dense, int) or first_dense < 0:
        raise _fail("first_k_dense_replace", f"must be a non-negative integer, got {first_dense!r}")
    freq = config.size("moe_layer_freq", 1) if model_type == "deepseek_v2" else 1
    ffns: list[Layer] = [dense] * layers
    notes = [
        f"multi-head latent attention: the KV cache holds one latent of kv_lora_rank + "
        f"qk_rope_head_dim = {attention['kv_lora_rank'] + attention['qk_rope_head_dim']} "
        "values a token and layer, shared by every head; q_a_layernorm and kv_a_layernorm "
        "are counted in the attention's parameters"
    ]
    if routed is not None:
        shared = config.raw.get("n_shared_experts") or 0
        if isinstance(shared, bool) or not isinstance(shared, int) or shared < 0:
            raise _fail("n_shared_experts", f"must be a non-negative integer, got {shared!r}")
        moe_inner = config.size("moe_intermediate_size")
        moe: Layer = {
            "name": "mlp",
            "op": "moe",
            "num_experts": routed,
            "experts_per_token": _top_k(config, routed),
            "intermediate_size": moe_inner,
            "activation": "swiglu",
            "bias": False,
        }
        if shared:
            moe["shared_intermediate_size"] = shared * moe_inner
        ffns = [moe if i >= first_dense and i % freq == 0 else dense for i in range(layers)]
        dense_count = sum(1 for f in ffns if f is dense)
        notes.append(
            f"DeepSeek MoE: {routed} routed experts ({moe['experts_per_token']} a token) "
            f"and {shared} shared expert(s) of {moe_inner} on {layers - dense_count} "
            f"layers; {dense_count} dense layer(s) of {dense['intermediate_size']}"
        )
    if model_type in ("deepseek_v3", "kimi_k2"):
        notes.append(
            "the router's e_score_correction_bias is a buffer, not a parameter; "
            "multi-token-prediction layers (num_nextn_predict_layers) are not built "
            "by transformers and not counted"
        )
    graph = _decoder(
        config,
        attentions=[attention] * layers,
        ffns=ffns,
        eps=config.number("rms_norm_eps", 1e-6),
        tied=config.flag("tie_word_embeddings", False),
    )
    return (
        graph,
        _reference(model_type, config),
        notes,
        config.size("max_position_embeddings", 4096),
    )


def _qwen_moe(config: _Config, model_type: str) -> Built:
    """``Qwen2MoeForCausalLM`` / ``Qwen3MoeForCausalLM``: Qwen attention (Qwen2-MoE: biased
    q/k/v; Qwen3-MoE: per-head q/k RMSNorms and ``head_dim``) and a sparse MoE block on layers
    ``(i + 1) % decoder_sparse_step == 0`` outside ``mlp_only_layers``: ``num_experts`` experts of
    ``moe_intermediate_size``, ``num_experts_per_tok`` a token; Qwen2-MoE adds a shared expert
    of ``shared_expert_intermediate_size`` with a one-output sigmoid gate."""
    qwen3 = model_type == "qwen3_moe"
    layers = config.size("num_hidden_layers")
    hidden = config.size("hidden_size")
    heads = config.size("num_attention_heads")
    if qwen3:
        head_dim = config.size("head_dim", hidden // heads if hidden % heads == 0 else None)
        attention = _attention(config, head_dim=head_dim, bias=config.flag("attention_bias", False))
    else:
        if hidden % heads:
            raise _fail("num_attention_heads", f"({heads}) must divide the hidden size {hidden}")
        attention = _attention(config, head_dim=hidden // heads, bias=True)
        attention["out_bias"] = False
    experts = config.size("num_experts")
    moe: Layer = {
        "name": "mlp",
        "op": "moe",
        "num_experts": experts,
        "experts_per_token": _top_k(config, experts),
        "intermediate_size": config.size("moe_intermediate_size"),
        "activation": config.activation("hidden_act", "silu", gated=True),
        "bias": False,
    }
    if not qwen3:
        moe["shared_intermediate_size"] = config.size("shared_expert_intermediate_size")
        moe["shared_expert_gate"] = True
    step = config.size("decoder_sparse_step", 1)
    dense_only = _layer_indices(config, "mlp_only_layers", layers)
    dense = _mlp(config.size("intermediate_size"), moe["activation"])
    ffns = [moe if i not in dense_only and (i + 1) % step == 0 else dense for i in range(layers)]
    graph = _decoder(
        config,
        attentions=[attention] * layers,
        ffns=ffns,
        eps=config.number("rms_norm_eps", 1e-6),
        tied=config.flag("tie_word_embeddings", False),
        qk_norm=attention["head_dim"] if qwen3 else None,
    )
    moe_layers = sum(1 for f in ffns if f is moe)
    notes = [
        f"mixture of {experts} experts, {moe['experts_per_token']} a token, on {moe_layers} "
        f"of {layers} layers"
    ]
    if not qwen3:
        notes.append(
            "shared expert on every MoE layer, scaled by a sigmoid gate (one linear "
            "output, no bias)"
        )
    else:
        notes.append(
            "q_norm and k_norm: one RMSNorm weight of head_dim per layer each, stored as tensors"
        )
    if config.raw.get("sliding_window") and config.flag("use_sliding_window", False):
        notes.append(
            "use_sliding_window is set but transformers' Qwen MoE attends to the whole "
            "context; no window is modelled"
        )
    return (
        graph,
        _reference(model_type, config),
        notes,
        config.size("max_position_embeddings", 32768),
    )


def _llama4(config: _Config, model_type: str) -> Built:
    """``Llama4ForCausalLM`` (the text model of Llama-4 Scout / Maverick): GQA attention with
    parameter-free L2 q/k norms, MoE layers every ``interleave_moe_layer_step``-th layer (or
    ``moe_layers``): ``num_local_experts`` experts of ``intermediate_size``,
    ``num_experts_per_tok`` a token, a bias-free router and one shared expert of
    ``intermediate_size``; the other layers a dense MLP of ``intermediate_size_mlp``."""
    layers = config.size("num_hidden_layers")
    step = config.size("interleave_moe_layer_step", 1)
    if config.raw.get("moe_layers") is not None:
        moe_layers = _layer_indices(config, "moe_layers", layers)
    else:
        moe_layers = frozenset(range(step - 1, layers, step))
    experts = config.size("num_local_experts")
    inner = config.size("intermediate_size")
    moe: Layer = {
        "name": "feed_forward",
        "op": "moe",
        "num_experts": experts,
        "experts_per_token": _top_k(config, experts),
        "intermediate_size": inner,
        "activation": "swiglu",
        "bias": False,
        "shared_intermediate_size": inner,
    }
    dense = {**_mlp(config.size("intermediate_size_mlp")), "name": "feed_forward"}
    bias = config.flag("attention_bias", False)
    attention = _attention(config, head_dim=config.size("head_dim", 128), bias=bias)
    graph = _decoder(
        config,
        attentions=[attention] * layers,
        ffns=[moe if i in moe_layers else dense for i in range(layers)],
        eps=config.number("rms_norm_eps", 1e-5),
        tied=config.flag("tie_word_embeddings", False),
    )
    notes = [
        f"mixture of {experts} experts ({moe['experts_per_token']} a token) plus a shared "
        f"expert on {len(moe_layers)} of {layers} layers; dense MLP of "
        f"{dense['intermediate_size']} on the others",
        "L2 q/k norms, temperature tuning and NoPE layers add no parameters; chunked local "
        "attention (attention_chunk_size) is modelled as full attention (an upper bound)",
    ]
    return (
        graph,
        _reference(model_type, config),
        notes,
        config.size("max_position_embeddings", 4096),
    )


def _reference(model_type: str, config: _Config) -> str:
    tied = config.flag("tie_word_embeddings", model_type.startswith("gemma"))
    return f"{FAMILY_CLASSES[model_type][0]} (LM head {'tied' if tied else 'untied'})"


FAMILY_BUILDERS: Mapping[str, Callable[[_Config, str], Built]] = {
    "gemma2": _gemma2,
    "gemma3_text": _gemma2,
    "gpt_oss": _gpt_oss,
    "deepseek_v2": _deepseek,
    "deepseek_v3": _deepseek,
    "kimi_k2": _deepseek,
    "qwen2_moe": _qwen_moe,
    "qwen3_moe": _qwen_moe,
    "llama4_text": _llama4,
}
