"""Transformer layers: norms over the last dim, linear, embeddings, attention, the
feed-forward network and the sparse mixture of experts.
"""

from __future__ import annotations

import math
from dataclasses import replace

from app.domain.graph import llm_variants
from app.domain.graph.ops.core import (
    OpContext,
    OpResult,
    Saved,
    Storage,
    TensorKind,
    Transient,
    require_float,
    row_count,
)
from app.domain.precision import Precision, convention
from app.domain.workload import (
    FUSED_ATTENTION,
    Attention,
    Runtime,
    default_attention,
)


def _cuda_autocast(ctx: OpContext) -> bool:
    """Whether the layer runs under CUDA autocast (fp32 weights, 16-bit matmuls): the
    precision conventions with autocast's weight cache (amp_bf16, amp_fp16)."""
    return ctx.runtime is Runtime.CUDA and convention(ctx.precision).weight_cache_dtype is not None


def _layernorm_input(ctx: OpContext) -> Saved:
    """The input a layer norm keeps: in fp32 under CUDA autocast.

    ``layer_norm`` and ``native_layer_norm`` are on CUDA autocast's fp32 list (PyTorch
    aten/src/ATen/autocast_mode.h, ``AT_FORALL_FP32``): a 16-bit input is cast to fp32 and
    ``NativeLayerNormBackward0`` keeps that cast; an fp32 input (the residual stream of a
    transformer under autocast: fp32 embeddings plus 16-bit sublayer outputs promote to fp32)
    is kept as it is. Either way 4 B an element where the activations are 16-bit.
    """
    if _cuda_autocast(ctx):
        return Saved(label="input", source="in0_fp32", numel=ctx.x.numel, storage=Storage.FP32)
    return Saved(label="input", source="in0", numel=ctx.x.numel)


def layernorm(ctx: OpContext) -> OpResult:
    """Layer norm over the last dim; keeps input (fp32 under CUDA autocast:
    :func:`_layernorm_input`) and fp32 per-row mean and rstd."""
    require_float(ctx)
    dim = ctx.x.shape[-1]
    affine = ctx.attr("elementwise_affine", True)
    params: tuple[tuple[int, ...], ...] = ()
    if affine:
        params = ((dim,), (dim,)) if ctx.attr("bias", True) else ((dim,),)
    rows = row_count(ctx)
    return OpResult(
        shape=ctx.x.shape,
        param_shapes=params,
        flops=5 * ctx.x.numel,
        saved=(
            _layernorm_input(ctx),
            Saved(label="mean", source="new", numel=rows, storage=Storage.FP32),
            Saved(label="rstd", source="new", numel=rows, storage=Storage.FP32),
        ),
    )


def rmsnorm(ctx: OpContext) -> OpResult:
    """RMS norm as Hugging Face Llama computes it (in fp32, then cast back).

    Keeps the fp32 input (a copy when activations are 16-bit), the normalized tensor in the
    activation dtype (multiplied by the weight), and the fp32 per-row rsqrt.
    """
    require_float(ctx)
    rows = row_count(ctx)
    return OpResult(
        shape=ctx.x.shape,
        param_shapes=((ctx.x.shape[-1],),),
        flops=4 * ctx.x.numel,
        saved=(
            Saved(label="input_fp32", source="in0_fp32", numel=ctx.x.numel, storage=Storage.FP32),
            Saved(label="normalized", source="new", numel=ctx.x.numel),
            Saved(label="rstd", source="new", numel=rows, storage=Storage.FP32),
        ),
    )


def linear(ctx: OpContext) -> OpResult:
    """Fully connected layer over the last dim; keeps its input."""
    require_float(ctx)
    if not ctx.x.shape:
        raise ctx.fail("expects at least a 1-d input", "inputs")
    features = ctx.x.shape[-1]
    declared = ctx.attrs.get("in_features")
    if declared is not None and declared != features:
        raise ctx.fail(f"in_features {declared} does not match input {features}", "in_features")
    out = ctx.attrs["out_features"]
    rows = row_count(ctx)
    weight = out * features
    tied = ctx.attrs.get("tied_to")
    if tied is not None:
        shared = ctx.tied_params.get(tied)
        if shared is None:
            raise ctx.fail(f"'{tied}' is not an earlier layer with a weight", "tied_to")
        if shared != weight:
            raise ctx.fail(
                f"cannot tie to '{tied}': its weight has {shared} elements, this layer needs "
                f"{weight} ({out} x {features})",
                "tied_to",
            )
    params: list[tuple[int, ...]] = [] if tied is not None else [(out, features)]
    if ctx.attr("bias", True):
        params.append((out,))
    return OpResult(
        shape=(*ctx.x.shape[:-1], out),
        param_shapes=tuple(params),
        flops=2 * rows * features * out,
        saved=(Saved(label="input", source="in0", numel=ctx.x.numel),),
    )


def embedding(ctx: OpContext) -> OpResult:
    """Lookup table; keeps the int64 indices (its input)."""
    if ctx.x.kind is not TensorKind.INDEX:
        raise ctx.fail("expects int64 token ids as input", "inputs")
    vocab, dim = ctx.attrs["num_embeddings"], ctx.attrs["embedding_dim"]
    tied = ctx.attrs.get("tied_to")
    if tied is not None:  # the same module called again (T5's shared embedding, the decoder's)
        shared = ctx.tied_params.get(tied)
        if shared is None:
            raise ctx.fail(f"'{tied}' is not an earlier layer with a weight", "tied_to")
        if shared != vocab * dim:
            raise ctx.fail(
                f"cannot tie to '{tied}': its weight has {shared} elements, this layer needs "
                f"{vocab * dim} ({vocab} x {dim})",
                "tied_to",
            )
    return OpResult(
        shape=(*ctx.x.shape, dim),
        param_shapes=() if tied is not None else ((vocab, dim),),
        saved=(Saved(label="indices", source="in0", numel=ctx.x.numel, storage=Storage.INT64),),
    )


def embedding_add(ctx: OpContext) -> OpResult:
    """Add a learned embedding indexed by position (positions, token types); keeps nothing big."""
    require_float(ctx)
    if len(ctx.x.shape) != 3:
        raise ctx.fail("expects [N, S, D]", "inputs")
    _, seq, dim = ctx.x.shape
    rows = ctx.attrs["num_embeddings"]
    if ctx.attr("positional", True) and rows < seq:
        raise ctx.fail(f"{rows} positions cannot cover sequence length {seq}", "num_embeddings")
    return OpResult(shape=ctx.x.shape, param_shapes=((rows, dim),), flops=ctx.x.numel)


def cls_token(ctx: OpContext) -> OpResult:
    """Prepend one learned token to a sequence (ViT's class token)."""
    require_float(ctx)
    if len(ctx.x.shape) != 3:
        raise ctx.fail("expects [N, S, D]", "inputs")
    n, seq, dim = ctx.x.shape
    return OpResult(shape=(n, seq + 1, dim), param_shapes=((1, 1, dim),))


# Eager attention on CUDA (issue 32): the softmax runs in fp32 and the probabilities are cast
# back to the compute dtype before the P x V matmul, which keeps that copy for its backward
# (2 B/score beside softmax's fp32 output, 4 B). Sources: Hugging Face's eager_attention_forward
# (transformers/models/llama/modeling_llama.py: ``nn.functional.softmax(attn_weights, dim=-1,
# dtype=torch.float32).to(query.dtype)``, the rule of Llama, Mistral, Qwen2, Gemma and the models
# copied from them); GPT-NeoX's eager ``_attn`` (transformers mid-2024, modeling_gpt_neox.py)
# whose fp32 rotary cos/sin cache promotes q and k to fp32, so its scores and softmax run in fp32
# and ``attn_weights.to(value.dtype)`` is the copy; autocast (torch/amp, CUDA ops that autocast
# to float32: softmax), whose next matmul casts the fp32 probabilities to the autocast dtype.
# With attention dropout the dropped probabilities (compute dtype) are what the matmul keeps
# and the cast copy is freed (dropout's backward needs only its 1 B bool mask). At fp32 compute
# the cast is a no-op. HF's eager path also materialises the causal mask, [N, 1, S, S] in the
# compute dtype (modeling_attn_mask_utils._prepare_4d_causal_attention_mask), where SDPA's
# is_causal needs none: a transient of the forward. The CPU rule is the one measured on PyTorch
# 2.13 CPU (benchmarks/fidelity) and is left as it is.
_FP32_COMPUTE = frozenset({Precision.FP32, Precision.TF32})


# GPT-NeoX as Hugging Face transformers wrote it in mid-2024 (4.40-4.47, modeling_gpt_neox.py,
# the version of the published pythia-410m SDPA rows: transformers PR #31031, PyTorch 2.2.1):
# * fused_qkv: q, k and v are views of one ``query_key_value`` output (``qkv[..., 2 * head_size:]
#   .permute(0, 2, 1, 3)`` is the value); SDPA (and eager's P x V matmul) keeps that value view, so
#   the whole fused output, q + k + v wide, stays alive to the backward instead of v alone.
#   transformers 5.x still slices v out of the fused output (``qkv.chunk(3, dim=-1)``).
# * rotary_fp32: the rotary cos/sin caches are fp32 buffers (``GPTNeoXRotaryEmbedding``:
#   ``emb.cos()`` of an fp32 ``inv_freq``), so the rotated q and k come out fp32 at a 16-bit
#   compute dtype: eager's ``baddbmm`` keeps them fp32; the SDPA path casts them back
#   (``query.to(value.dtype)``) and SDPA keeps those 16-bit copies, as any new q and k. In
#   training with use_cache (pythia's config.json: true) every layer returns ``present = (key,
#   value)`` with the model's output, which the caller holds through the backward (the
#   ``outputs`` line's assumption): the fp32 key is one more storage there (eager's baddbmm
#   keeps that same fp32 key; the value is the fused view above). Counted as the layer's saved
#   tensor, so freed at its backward: after that layer's backward it is under-counted.
# * buffer_positions / rotary_dims: every attention layer registers a bool causal-mask buffer
#   ``bias`` [1, 1, P, P] (``_init_bias(config.max_position_embeddings)``) and the fp32 cos/sin
#   caches [P, rotary_ndims] with ``inv_freq`` [rotary_ndims / 2]: device memory beside the
#   weights (24 x 4 MiB + 24 x 256 KiB for pythia-410m, P 2,048).
# Measured (benchmarks/fidelity venv, transformers 4.43.4, PyTorch 2.13 CPU, pythia-410m's
# shapes, 2 layers, fp16, SDPA, 256 tokens, saved_tensors_hooks): per layer the block input,
# the layer-norm outputs, the 16-bit q and k copies, the fused qkv storage (3 x hidden), SDPA's
# output, its contiguous copy, the MLP's 4h-wide input and output: 18 hidden vectors a token.


def _qkv_saved(
    ctx: OpContext, q_numel: int, kv_numel: int, *, fused_qkv: int, fused_kernel: bool
) -> list[Saved]:
    """q, k and v as the attention keeps them for backward (see the GPT-NeoX note above):
    ``fused_qkv`` is the element count of the fused projection output."""
    promoted = ctx.attr("rotary_fp32", False) and ctx.precision not in _FP32_COMPUTE
    qk_storage = Storage.FP32 if promoted and not fused_kernel else Storage.ACT
    saved = [
        Saved(label="q", source="new", numel=q_numel, storage=qk_storage),
        Saved(label="k", source="new", numel=kv_numel, storage=qk_storage),
    ]
    if ctx.attr("fused_qkv", False):
        saved.append(Saved(label="qkv_fused", source="new", numel=fused_qkv))
    else:
        saved.append(Saved(label="v", source="new", numel=kv_numel))
    if promoted and fused_kernel and ctx.training and ctx.attr("causal", False):
        # the fp32 key returned as the layer's KV cache (use_cache) with the model's output
        saved.append(Saved(label="key_cache_fp32", source="new", numel=kv_numel,
                           storage=Storage.FP32))  # fmt: skip
    return saved


def _returned_cache(ctx: OpContext, kv_numel: int, fused_qkv: int) -> tuple[Saved, ...]:
    """What the layer's ``present = (key, value)`` keeps when that is not one K and one V in
    the activations' dtype (GPT-NeoX mid-2024, the note above): the rotated key is fp32 at a
    16-bit compute dtype (``rotary_fp32``), and the value, a view of the fused q/k/v output,
    keeps that whole storage (``fused_qkv``). Read by ``keep_outputs`` for the previous step's
    outputs (app.domain.memory.returned_cache)."""
    promoted = ctx.attr("rotary_fp32", False) and ctx.precision not in _FP32_COMPUTE
    fused = ctx.attr("fused_qkv", False)
    if not (promoted or fused):
        return ()
    key_storage = Storage.FP32 if promoted else Storage.ACT
    return (
        Saved(label="present_key", source="new", numel=kv_numel, storage=key_storage),
        Saved(label="present_value", source="new", numel=fused_qkv if fused else kv_numel),
    )


def _qkv_input_casts(ctx: OpContext, *, mla: bool) -> list[Saved]:
    """The extra 16-bit copies of the input that separate q, k and v projections keep under
    CUDA autocast.

    Under autocast the attention's input is fp32: a norm's output (``layer_norm`` is on CUDA
    autocast's fp32 list, aten/src/ATen/autocast_mode.h ``AT_FORALL_FP32``; Hugging Face's
    RMSNorm returns the fp32 residual's dtype) or the fp32 residual stream itself. Each
    ``linear`` (``lower_precision_fp``) casts it to 16 bits on its own (autocast's cast cache
    holds only leaf tensors that require grad: weights, not activations, ``cached_cast`` in
    aten/src/ATen/autocast_mode.cpp) and its ``addmm`` keeps that cast for the weight's
    gradient: three 16-bit copies where q, k and v are three Linear calls (BERT, ViT, Llama),
    one where they are one projection (GPT-2's ``c_attn``: ``fused_qkv_projection``; GPT-NeoX:
    ``fused_qkv``). The first copy is the layer's ``input`` (the 16-bit activation the
    service sizes it as); these are the other two, labelled ``input`` too: a frozen base drops
    them with it (app.domain.memory.frozen). Measured: PyTorch 2.13 CPU autocast bf16,
    transformers BertModel, ``saved_tensors_hooks``: query, key and value each keep their own
    bf16 ``[tokens, hidden]`` cast of the fp32 LayerNorm output (``linear`` and ``layer_norm``
    have the same policy on CPU for an fp32 input). Not modelled for latent attention (MLA).
    """
    one_projection = ctx.attr("fused_qkv", False) or ctx.attr("fused_qkv_projection", False)
    if mla or one_projection or not _cuda_autocast(ctx):
        return []
    return [Saved(label="input", source="new", numel=ctx.x.numel) for _ in range(2)]


def _attention_buffers(ctx: OpContext) -> int:
    """Bytes of the layer's registered buffers (GPT-NeoX mid-2024, see the note above): the
    bool P x P causal mask, and fp32 cos and sin caches P x rotary_dims with ``inv_freq``."""
    if ctx.attrs.get("buffer_positions") is None:
        return 0
    positions, rotary = int(ctx.attrs["buffer_positions"]), int(ctx.attr("rotary_dims", 0))
    return positions * positions + 4 * (2 * positions * rotary + rotary // 2)


def attention(ctx: OpContext) -> OpResult:
    """Multi-head self-attention with q/k/v/o projections (MHA, GQA, MQA).

    How attention is computed is the request's ``attention`` option (``ctx.attention``; None:
    what PyTorch's SDPA dispatcher picks, :func:`app.domain.workload.default_attention`).
    eager / sdpa_math: keep the block input, q, k and v (k and v expanded to every query head
    for GQA), the fp32 softmax probabilities, a dropout mask and dropped probabilities when
    attention dropout is on (on CUDA at a 16-bit compute dtype without dropout: the
    probabilities' cast copy the P x V matmul keeps, see :data:`_FP32_COMPUTE`), and the context
    fed to the output projection; the S x S scores and probabilities (and on CUDA a causal
    model's materialised [N, 1, S, S] mask) are transients in forward. flash / mem_efficient:
    keep q, k, v, the output and the fp32 log-sum-exp, never an S x S matrix. On CPU,
    PyTorch's fused kernel has no dropout: flash or mem_efficient asked for in training with
    attention dropout runs SDPA's math kernel
    (sdpa_math, measured on PyTorch 2.13 CPU; the reason says so). Only causal (decoder)
    attention fills a KV cache at inference; an encoder attends over its whole input once and
    caches nothing. Under CUDA autocast separate q, k and v projections keep three 16-bit casts
    of the fp32 input (:func:`_qkv_input_casts`).
    """
    require_float(ctx)
    if len(ctx.x.shape) != 3:
        raise ctx.fail("expects [N, S, D]", "inputs")
    n, seq, hidden = ctx.x.shape
    declared = ctx.attrs.get("hidden_size")
    if declared is not None and declared != hidden:
        raise ctx.fail(f"hidden_size {declared} does not match input {hidden}", "hidden_size")
    heads = ctx.attrs["num_heads"]
    kv_heads = ctx.attr("num_kv_heads", heads)
    if heads % kv_heads:
        raise ctx.fail(f"num_kv_heads {kv_heads} must divide num_heads {heads}", "num_kv_heads")
    head_dim = ctx.attrs.get("head_dim")
    try:
        mla = llm_variants.mla_of(ctx.attrs, heads)
    except KeyError as missing:
        key = str(missing.args[0])
        raise ctx.fail("is required with kv_lora_rank (latent attention)", key) from None
    if head_dim is None and mla is None:
        if hidden % heads:
            raise ctx.fail(f"num_heads {heads} must divide hidden size {hidden}", "num_heads")
        head_dim = hidden // heads
    qkv_bias, out_bias = ctx.attr("qkv_bias", True), ctx.attr("out_bias", True)
    tokens = n * seq
    causal = ctx.attr("causal", False)
    window = ctx.attrs.get("sliding_window") if causal else None
    score_pairs = n * heads * seq * seq
    attended = llm_variants.attended_pairs(n, heads, seq, causal=causal, window=window)
    if mla is not None:
        # MLA: q/k heads of qk_head_dim, v heads of v_head_dim; one latent cached a token
        head_dim, q_dim, kv_dim = mla.qk_head_dim, heads * mla.qk_head_dim, mla.latent_dim
        kv_heads = 1  # the latent is shared by every head (replicated under tensor parallelism)
        params = llm_variants.mla_param_shapes(mla, hidden, bias=qkv_bias, out_bias=out_bias)
        flops = 2 * tokens * sum(math.prod(s) for s in params if len(s) == 2)
        flops += 2 * attended * (mla.qk_head_dim + mla.v_head_dim) + 5 * attended
        cached = llm_variants.cached_tokens(seq, window) * n * mla.latent_dim
    else:
        assert head_dim is not None  # set above when the layer is not MLA
        q_dim, kv_dim = heads * head_dim, kv_heads * head_dim
        params = [(q_dim, hidden), (kv_dim, hidden), (kv_dim, hidden), (hidden, q_dim)]
        if qkv_bias:
            params += [(q_dim,), (kv_dim,), (kv_dim,)]
        if out_bias:
            params.append((hidden,))
        flops = 2 * tokens * hidden * (q_dim + 2 * kv_dim) + 2 * tokens * q_dim * hidden
        flops += 2 * 2 * attended * head_dim + 5 * attended
        cached = 2 * n * llm_variants.cached_tokens(seq, window) * kv_dim
    if ctx.attr("sinks", False):
        params.append((heads,))  # gpt-oss: one learned sink logit a head
    q_numel = tokens * q_dim
    expanded_kv = tokens * q_dim  # k/v repeated to every query head before the matmuls
    dropout_p = ctx.attr("dropout", 0.0) if ctx.training else 0.0
    transients = [Transient(label="qkv", numel=q_numel + 2 * expanded_kv)]
    if ctx.attention is None:
        impl, reason = default_attention(
            ctx.runtime,
            ctx.precision,
            training=ctx.training,
            dropout=dropout_p > 0,
            gpu=ctx.gpu,
            head_dim=head_dim,
        )
    else:
        impl, reason = ctx.attention, "requested"
    # PyTorch's fused CPU kernel has no dropout: with dropout in training SDPA runs the math
    # path, which keeps the same tensors as the unfused implementation (measured, 2.13 CPU).
    if impl in FUSED_ATTENTION and ctx.runtime is Runtime.CPU and dropout_p > 0:
        impl, reason = (
            Attention.SDPA_MATH,
            f"{impl.value} asked for, but PyTorch's fused CPU kernel has no dropout: SDPA runs "
            "the math kernel in training with attention dropout",
        )
    fused_kernel = impl in FUSED_ATTENTION
    saved = [
        Saved(label="input", source="in0", numel=ctx.x.numel),
        *_qkv_input_casts(ctx, mla=mla is not None),
        *_qkv_saved(
            ctx,
            q_numel,
            expanded_kv,
            fused_qkv=tokens * (q_dim + 2 * kv_dim),
            fused_kernel=fused_kernel,
        ),  # fmt: skip
        Saved(label="context", source="new", numel=q_numel),
    ]
    if fused_kernel:
        # The fp32 log-sum-exp is [N, heads, S] for flash; the CUDA memory-efficient kernel pads
        # S to a multiple of 32 (kAlignLSE in aten/src/ATen/native/transformers/cuda/
        # attention.cu, _efficient_attention_forward).
        lse_seq = seq
        if impl is Attention.MEM_EFFICIENT and ctx.runtime is Runtime.CUDA:
            lse_seq = -(-seq // 32) * 32
        saved += [
            Saved(label="attn_out", source="new", numel=q_numel),
            Saved(label="logsumexp", source="new", numel=n * heads * lse_seq, storage=Storage.FP32),
        ]
    else:
        saved.append(Saved(label="probs", source="new", numel=score_pairs, storage=Storage.FP32))
        # Scores and softmax probabilities coexist while the softmax runs.
        transients += [
            Transient(label="scores", numel=score_pairs, storage=Storage.FP32),
            Transient(label="probs", numel=score_pairs, storage=Storage.FP32),
        ]
        if dropout_p > 0:
            saved += [
                Saved(label="probs_mask", source="new", numel=score_pairs, storage=Storage.MASK),
                Saved(label="probs_dropped", source="new", numel=score_pairs),
            ]
        elif ctx.runtime is Runtime.CUDA and ctx.precision not in _FP32_COMPUTE:
            saved.append(Saved(label="probs_cast", source="new", numel=score_pairs))
        if causal:
            transients.append(
                Transient(label="causal_mask", numel=n * seq * seq, storage=Storage.CAUSAL_MASK)
            )
    return OpResult(
        shape=ctx.x.shape,
        param_shapes=tuple(params),
        flops=flops,
        saved=tuple(saved),
        transients=tuple(transients),
        buffers_bytes=_attention_buffers(ctx),
        kv_cache_numel=cached if causal else 0,
        returned_cache=_returned_cache(ctx, cached // 2, tokens * (q_dim + 2 * kv_dim))
        if causal and mla is None
        else (),
        attention=impl,
        attention_reason=reason,
        num_heads=heads,
        num_kv_heads=kv_heads,
    )


_GATED = {"swiglu": "silu", "geglu": "gelu"}
# Hugging Face NewGELUActivation (GPT-2's gelu_new) is a composite of pow/mul/add/tanh: autograd
# keeps three intermediate-sized tensors besides its input (measured, PyTorch 2.13 CPU).
_COMPOSITE_EXTRA = {"gelu_new": 3}


def _ffn_params(hidden: int, inner: int, *, gated: bool, bias: bool) -> list[tuple[int, ...]]:
    """Weights (and biases) of one feed-forward network: up (and gate) and down projections."""
    projections = 3 if gated else 2
    params: list[tuple[int, ...]] = [(inner, hidden)] * (projections - 1)
    params.append((hidden, inner))
    if bias:
        params += [(inner,)] * (projections - 1) + [(hidden,)]
    return params


def _ffn_saved(activation: str, wide: int, *, autocast: bool = False) -> list[Saved]:
    """What a feed-forward network keeps besides its input, for ``wide`` intermediate values.

    ``autocast``: under CUDA autocast, ``gelu_new`` (``0.5 * x * (1 + tanh(sqrt(2 / pi) * (x +
    0.044715 * pow(x, 3))))``) runs partly in fp32, because ``pow`` is on autocast's fp32 list
    (aten/src/ATen/autocast_mode.cpp, ``KERNEL_CUDA(pow, Tensor_Scalar, fp32)``) and every op
    after it promotes: ``PowBackward0`` keeps the fp32 cast of the input (not the 16-bit up
    projection's output), ``TanhBackward0`` its fp32 result, the last ``mul`` the fp32 ``1 +
    tanh`` and the 16-bit ``0.5 * x``; the fp32 output is cast back by the down projection,
    which keeps the 16-bit cast. 16 B an intermediate value against 10 B at a 16-bit dtype (GPT-2
    small AMP on an H100: the gap was 20,053 B a token and layer, these 6 B x 3,072 are 18,432)."""
    if activation == "gelu_new" and autocast:
        fp32 = Storage.FP32
        return [
            Saved(label="activation_part_pow_input", source="new", numel=wide, storage=fp32),
            Saved(label="activated", source="new", numel=wide),
            Saved(label="activation_part_tanh", source="new", numel=wide, storage=fp32),
            Saved(label="activation_part_one_plus_tanh", source="new", numel=wide, storage=fp32),
            Saved(label="activation_part_half_input", source="new", numel=wide),
        ]
    if activation in _GATED:
        return [
            Saved(label="gate", source="new", numel=wide),
            Saved(label="activated_gate", source="new", numel=wide),
            Saved(label="up", source="new", numel=wide),
            Saved(label="product", source="new", numel=wide),
        ]
    return [
        Saved(label="pre_activation", source="new", numel=wide),
        Saved(label="activated", source="new", numel=wide),
    ] + [
        Saved(label=f"activation_part{i}", source="new", numel=wide)
        for i in range(_COMPOSITE_EXTRA.get(activation, 0))
    ]


def _gate_up_input_cast(ctx: OpContext, *, gated: bool) -> list[Saved]:
    """The second 16-bit copy of the input a gated MLP keeps under CUDA autocast: ``gate_proj``
    and ``up_proj`` are two Linear calls on the same fp32 input (Llama, Mistral, Qwen:
    ``down_proj(act_fn(gate_proj(x)) * up_proj(x))``), each casting it to 16 bits itself and
    keeping its cast for its weight's gradient, as separate q / k / v projections do
    (:func:`_qkv_input_casts`, the sources there). One fused projection (Phi-3's
    ``gate_up_proj``: ``fused_gate_up_projection``) keeps one. Labelled ``input``: a frozen
    base drops it with the first (app.domain.memory.frozen)."""
    if not gated or ctx.attr("fused_gate_up_projection", False) or not _cuda_autocast(ctx):
        return []
    return [Saved(label="input", source="new", numel=ctx.x.numel)]


def mlp(ctx: OpContext) -> OpResult:
    """Transformer feed-forward: up projection, activation (or gated), down projection.

    Plain (GELU/ReLU/SiLU): keeps the input, the pre-activation and the activation output.
    Gated (SwiGLU/GeGLU, no bias in Llama): keeps the input, gate, activated gate, up, and the
    product fed to the down projection.
    """
    require_float(ctx)
    hidden = ctx.x.shape[-1]
    inner = ctx.attrs["intermediate_size"]
    activation = ctx.attr("activation", "gelu")
    rows = row_count(ctx)
    wide = rows * inner
    gated = activation in _GATED
    projections = 3 if gated else 2
    params = _ffn_params(hidden, inner, gated=gated, bias=ctx.attr("bias", True))
    autocast = _cuda_autocast(ctx)
    saved = [
        Saved(label="input", source="in0", numel=ctx.x.numel),
        *_gate_up_input_cast(ctx, gated=gated),
        *_ffn_saved(activation, wide, autocast=autocast),
    ]
    return OpResult(
        shape=ctx.x.shape,
        param_shapes=tuple(params),
        flops=2 * rows * hidden * inner * projections + 4 * wide,
        saved=tuple(saved),
        transients=(Transient(label="intermediate", numel=(3 if gated else 2) * wide),),
    )


def moe(ctx: OpContext) -> OpResult:
    """Sparse mixture-of-experts feed-forward (Mixtral): a router and ``num_experts`` MLPs.

    Every token goes to its ``experts_per_token`` best experts (a bias-free router linear,
    softmax, top-k) and their outputs are summed with the routing weights. Parameters: the
    router (experts x hidden) plus every expert's projections; FLOPs and saved tensors count
    only the experts a token visits (k per token): the router logits (fp32), the routing
    weights, each routed copy of the input, and each expert's intermediates as in ``mlp``.
    """
    require_float(ctx)
    hidden = ctx.x.shape[-1]
    experts = ctx.attrs["num_experts"]
    top_k = ctx.attrs["experts_per_token"]
    if top_k > experts:
        raise ctx.fail(
            f"experts_per_token {top_k} exceeds num_experts {experts}", "experts_per_token"
        )
    inner = ctx.attrs["intermediate_size"]
    activation = ctx.attr("activation", "swiglu")
    gated = activation in _GATED
    projections = 3 if gated else 2
    rows = row_count(ctx)
    routed = rows * top_k  # (token, expert) pairs
    wide = routed * inner
    params: list[tuple[int, ...]] = [(experts, hidden)]
    for _ in range(experts):
        params += _ffn_params(hidden, inner, gated=gated, bias=ctx.attr("bias", False))
    params += llm_variants.moe_extra_param_shapes(hidden, experts, ctx.attrs, gated=gated)
    saved = [
        Saved(label="input", source="in0", numel=ctx.x.numel),
        Saved(label="router_logits", source="new", numel=rows * experts, storage=Storage.FP32),
        Saved(label="routing_weights", source="new", numel=routed, storage=Storage.FP32),
        Saved(label="routed_input", source="new", numel=routed * hidden),
        *_ffn_saved(activation, wide),
    ]
    flops = 2 * rows * hidden * experts + 5 * rows * experts
    flops += 2 * routed * hidden * inner * projections + 4 * wide + 2 * routed * hidden
    shared = ctx.attrs.get("shared_intermediate_size")
    if shared is not None:  # every token also runs the shared expert
        flops += 2 * rows * hidden * shared * projections + 4 * rows * shared
        saved += [
            replace(s, label=f"shared_{s.label}") for s in _ffn_saved(activation, rows * shared)
        ]
    return OpResult(
        shape=ctx.x.shape,
        param_shapes=tuple(params),
        flops=flops,
        saved=tuple(saved),
        transients=(
            Transient(label="intermediate", numel=(3 if gated else 2) * wide),
            Transient(label="expert_outputs", numel=routed * hidden),
        ),
    )
