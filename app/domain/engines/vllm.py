"""vLLM's start-up memory, per GPU: what it claims, what it spends, what is left for KV blocks.

The steps follow vLLM 0.19 (V1 engine) as its start-up logs print them:

1. requested memory = ``gpu_memory_utilization`` x the memory CUDA shows (``total_memory`` of
   ``torch.cuda.mem_get_info``; an H100 80GB shows 79.19 GiB, not the 80 GiB it is sold as):
   ``vllm/v1/worker/gpu_worker.py`` (``Worker.determine_available_memory``, ``requested_memory``).
2. weights: torch memory allocated after the model load (sharded by tensor rank; by pipeline stage,
   the embedding on the first, the final norm and head on the last): ``Worker.load_model``
   ("Model loading took ... GiB"), which also counts the rotary cos/sin cache built with the
   model (:func:`rotary_cache_bytes`, a line of its own here).
3. the profile run: one forward of ``max_num_batched_tokens`` dummy tokens, then on the last
   pipeline stage a dummy sampler run over ``max_num_seqs`` requests whose logits the sampler
   holds in fp32 (``vllm/v1/worker/gpu_model_runner.py``: ``GPUModelRunner.profile_run``,
   ``_dummy_run``, ``_dummy_sampler_run``). Its "torch peak memory increase" is
   ``max(forward, sampler)``; a later stage also keeps the intermediate tensors (hidden states and
   residual) it receives from the previous one.
4. memory outside the allocator that grew during the profile ("non-torch forward increase
   memory"): cuBLAS/attention workspaces on one GPU, NCCL and custom all-reduce buffers under
   tensor parallelism (``vllm/utils/mem_utils.py``: ``memory_profiling``).
5. KV pool = requested - weights - rotary cos/sin cache - peak - non-torch
   (``Worker.determine_available_memory``; the rotary cache is a buffer allocated with the
   weights, :func:`rotary_cache_bytes`). The
   CUDA-graph pool is captured AFTER the KV cache is allocated in 0.19 ("CUDA graph pool ...
   allocated after KV sizing") and is not subtracted: it lives in the ``1 - utilization`` margin.
6. KV tokens = whole blocks of ``block_size`` tokens that the pool holds, the same on every
   worker (the smallest stage's pool decides: ``vllm/v1/core/kv_cache_utils.py``:
   ``get_kv_cache_configs`` takes the minimum over workers); maximum concurrency at
   ``max_model_len`` = tokens / ``max_model_len`` ("Maximum concurrency for N tokens per
   request: X x").
7. start verdict: ``check_enough_kv_cache_memory`` (``vllm/v1/core/kv_cache_utils.py``) refuses
   a pool of zero or less, and a pool that cannot hold one ``max_model_len`` sequence, with the
   messages quoted in :data:`NO_MEMORY_MESSAGE` and :func:`start_verdict`.

Everything engine-specific is a constant of :class:`EngineProfile` naming its source; the
functions are engine-neutral, so SGLang/TGI/TensorRT-LLM are second profiles, not forks. Pure
stdlib; bytes are integers [B].
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from app.domain.engines.families import MlaGeometry, decoder_layers_params
from app.domain.parallel import (
    TensorParallelError,
    check_tensor_parallel,
    kv_heads_per_rank,
    pipeline_stage_layers,
)
from app.domain.units import GIB

# Bytes per element of the dtype names vLLM accepts for ``--dtype`` and ``--kv-cache-dtype``.
DTYPE_BYTES: dict[str, int] = {
    "float32": 4,
    "float": 4,
    "bfloat16": 2,
    "float16": 2,
    "half": 2,
    "fp8": 1,
    "fp8_e4m3": 1,
    "fp8_e5m2": 1,
}

# What an H100 80GB (SXM5, HBM3) shows to torch: "total_memory=79.19GiB" in the vLLM 0.19 logs of
# cluster F (reference/cuda_published_calibration.yaml). The hardware catalog stores the
# marketing 80 GiB (hardware_catalog/README.md: "N GB" is N GiB); the driver and CUDA context
# keep the difference. Printed with two decimals, so exact to +-0.005 GiB.
H100_80GB_CUDA_VISIBLE_BYTES = round(79.19 * GIB)

NO_MEMORY_MESSAGE = (
    "No available memory for the cache blocks. Try increasing `gpu_memory_utilization` when "
    "initializing the engine."
)


# The profile forward's peak over the graph's (see EngineProfile.graph_forward_factor).
GRAPH_FORWARD_FACTOR = 1.2


@dataclass(frozen=True)
class EngineProfile:
    """Per-engine constants of the start-up memory model, each with its source in ``sources``.

    ``sampler_bytes_per_logit``: bytes the dummy sampler run holds per (request x vocabulary
    entry) at its peak. ``forward_activation_factor``: the profile forward's peak over
    ``tokens x dtype x (experts_per_token x 3 x intermediate / tp + 2 x hidden)`` (the gated MLP's
    gate/up output and activation plus the residual stream). ``non_torch_*``: memory outside the
    allocator that grows during the profile, per GPU. ``cuda_graph_pool_bytes``: the pool CUDA
    graphs take (0 with ``enforce_eager``); ``graphs_before_kv``: whether the engine subtracts it
    before sizing the KV pool. ``pp_received_tensors``: tensors of ``tokens x hidden`` a
    non-first pipeline stage keeps from the previous stage during the profile.
    ``graph_forward_factor``: the profile forward's peak over the graph's
    (:func:`app.domain.engines.profile_forward.graph_forward_peak`), applied by
    :func:`graph_forward_peak_bytes`.
    """

    name: str
    version: str
    default_gpu_memory_utilization: float
    default_block_size: int
    large_gpu_bytes: int
    default_max_num_batched_tokens: tuple[int, int]  # (GPU >= large_gpu_bytes, smaller GPU)
    default_max_num_seqs: tuple[int, int]
    sampler_bytes_per_logit: float
    forward_activation_factor: float
    non_torch_single_gpu_bytes: int
    non_torch_tensor_parallel_bytes: int
    non_torch_pipeline_bytes: int
    cuda_graph_pool_bytes: int
    graphs_before_kv: bool
    pp_received_tensors: int
    vocab_padding: int
    graph_forward_factor: float = 1.0
    sources: dict[str, str] = field(default_factory=dict)


VLLM_0_19 = EngineProfile(
    name="vllm",
    version="0.19.0",
    default_gpu_memory_utilization=0.9,
    default_block_size=16,
    large_gpu_bytes=70 * GIB,
    default_max_num_batched_tokens=(8192, 2048),
    default_max_num_seqs=(1024, 256),
    sampler_bytes_per_logit=15.43,
    forward_activation_factor=1.344,
    non_torch_single_gpu_bytes=round(0.25 * GIB),
    non_torch_tensor_parallel_bytes=round(2.10 * GIB),
    non_torch_pipeline_bytes=round(0.07 * GIB),
    cuda_graph_pool_bytes=round(0.91 * GIB),
    graphs_before_kv=False,
    pp_received_tensors=2,
    vocab_padding=64,
    graph_forward_factor=GRAPH_FORWARD_FACTOR,
    sources={
        "default_gpu_memory_utilization": (
            "vllm/config/cache.py CacheConfig.gpu_memory_utilization = 0.9"
        ),
        "default_block_size": "vllm/config/cache.py: block_size defaults to 16 on CUDA",
        "default_max_num_batched_tokens": (
            "vllm/engine/arg_utils.py EngineArgs._set_default_args: `vllm serve` on a GPU with "
            ">= 70 GiB takes 8192 batched tokens and 1024 sequences, else 2048 and 256 (cluster F "
            "runs: max_num_seqs=1024, max_num_batched_tokens=8192 on an H100)"
        ),
        "default_max_num_seqs": "as default_max_num_batched_tokens",
        "sampler_bytes_per_logit": (
            "fit on cluster F (benchmarks/engines/vllm_calibration.py; 14.9-15.9 B on the "
            "runs whose peak the graph's forward does not explain, the same at TP 1/2/4): "
            "GPUModelRunner._dummy_sampler_run "
            "(vllm/v1/worker/gpu_model_runner.py) computes the logits of max_num_seqs rows and "
            "runs the sampler, which skips top-k/top-p and logprobs during profiling (its NOTE); "
            "the "
            "logits (2 B) and the sampler's fp32 copies (logits, probabilities, sampling noise: "
            "3 x 4 B) make 14 B, the rest is temporaries"
        ),
        "forward_activation_factor": (
            "fit on cluster F pipeline stages without the sampler and the fp32 run "
            "(benchmarks/engines/vllm_calibration.py); the fallback when no graph is at hand"
        ),
        "non_torch_single_gpu_bytes": "fit on cluster F TP 1 runs (0.24-0.46 GiB logged)",
        "non_torch_tensor_parallel_bytes": (
            "fit on cluster F TP >= 2 runs (2.07-2.13 GiB logged: NCCL and custom all-reduce "
            "buffers)"
        ),
        "non_torch_pipeline_bytes": "cluster F PP 2 run, stage 0 (0.07 GiB logged)",
        "cuda_graph_pool_bytes": "cluster F Llama-3.1-8B TP 1 run ('CUDA graph pool' 0.91 GiB)",
        "graphs_before_kv": (
            "cluster F: KV pool = 0.95 x 79.19 - weights - peak - non-torch to 0.01 GiB on every "
            "run, the graph pool is not subtracted in 0.19"
        ),
        "pp_received_tensors": (
            "vllm/v1/worker/gpu_model_runner.py: intermediate_tensors (hidden_states, residual) "
            "of max_num_batched_tokens x hidden on a non-first stage; cluster F PP 2 last stage "
            "peak 2.01 GiB vs 1.89 without PP"
        ),
        "vocab_padding": (
            "vllm/model_executor/layers/vocab_parallel_embedding.py DEFAULT_VOCAB_PADDING_SIZE"
        ),
        "start_verdict": "vllm/v1/core/kv_cache_utils.py check_enough_kv_cache_memory",
        "graph_forward_factor": (
            "fit on cluster F pipeline stages without the sampler and the fp32 run (Llama-3.1-8B: "
            "1.05-1.10 GiB logged over a graph peak of 0.875 GiB in bf16, 2.21 over 1.72 in "
            "fp32), over the memory engine's forward peak of the graph at "
            "max_num_batched_tokens tokens (app.domain.engines.profile_forward; "
            "benchmarks/engines/vllm_calibration.py: LOMO profile peak median 3.10 %, worst "
            "22.0 %, vs 3.07 % / 29.0 % for the formula)"
        ),
    },
)


class EngineInputError(ValueError):
    """An engine option the engine itself would refuse; ``field`` names it with vLLM's name."""

    def __init__(self, message: str, *, field: str) -> None:
        super().__init__(message)
        self.field = field


@dataclass(frozen=True)
class ServingModel:
    """The geometry of a decoder the engine serves (names as in its HF config).

    ``mla_latent_dim``: ``kv_lora_rank + qk_rope_head_dim`` of multi-head latent attention (one
    latent vector a token and layer, not split by TP); ``None`` for MHA/GQA/MQA.
    ``sliding_window``: kept for the record; vLLM 0.19 counted Gemma-2's interleaved
    sliding-window layers as full layers in its KV token figure (cluster F gemma-2-9b run).
    ``experts``/``experts_per_token``: a Mixtral-style MoE MLP (1/1 for a dense model).
    ``mla``: the MLA projections' sizes (:mod:`app.domain.engines.families`);
    ``rotary_dim``: the rotary embedding's width (``None``: ``head_dim``, or
    ``qk_rope_head_dim`` under MLA; 0: no rotary embedding); ``rotary_positions``: the rows of
    its cos/sin cache (``None``: ``max_position_embeddings``; YaRN scaling: original x factor);
    see :func:`rotary_cache_bytes`.
    ``shared_expert_intermediate_size``: the shared expert(s) of a MoE layer as one MLP (0:
    none), with Qwen2-MoE's one-output ``shared_expert_gate``; ``dense_layers``: indices of the
    layers of a MoE model with a dense MLP of ``dense_intermediate_size`` (DeepSeek's first
    ``first_k_dense_replace``).
    """

    layers: int
    hidden_size: int
    attention_heads: int
    kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    dtype: str = "bfloat16"
    tie_word_embeddings: bool = False
    qkv_bias: bool = False
    norms_per_layer: int = 2
    experts: int = 1
    experts_per_token: int = 1
    mla_latent_dim: int | None = None
    sliding_window: int | None = None
    max_position_embeddings: int | None = None
    mla: MlaGeometry | None = None
    shared_expert_intermediate_size: int = 0
    shared_expert_gate: bool = False
    dense_layers: tuple[int, ...] = ()
    dense_intermediate_size: int | None = None
    rotary_dim: int | None = None
    rotary_positions: int | None = None


@dataclass(frozen=True)
class VllmOptions:
    """vLLM's options, with its names; ``None`` takes the engine's default (see
    :func:`resolve_options`). ``dtype='auto'`` is the model's dtype; ``kv_cache_dtype='auto'`` is
    the model dtype, ``fp8``/``fp8_e4m3``/``fp8_e5m2`` one byte."""

    max_model_len: int | None = None
    gpu_memory_utilization: float | None = None
    max_num_batched_tokens: int | None = None
    max_num_seqs: int | None = None
    block_size: int | None = None
    dtype: str = "auto"
    kv_cache_dtype: str = "auto"
    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1
    enforce_eager: bool = False


@dataclass(frozen=True)
class ResolvedOptions:
    max_model_len: int
    gpu_memory_utilization: float
    max_num_batched_tokens: int
    max_num_seqs: int
    block_size: int
    dtype_bytes: int
    kv_cache_dtype_bytes: int
    tensor_parallel_size: int
    pipeline_parallel_size: int
    enforce_eager: bool


def _dtype_bytes(name: str, field_name: str) -> int:
    try:
        return DTYPE_BYTES[name]
    except KeyError:
        raise EngineInputError(
            f"{field_name} '{name}' is not one of {sorted(DTYPE_BYTES)} or 'auto'", field=field_name
        ) from None


def resolve_options(
    options: VllmOptions,
    model: ServingModel,
    cuda_visible_bytes: int,
    profile: EngineProfile = VLLM_0_19,
) -> ResolvedOptions:
    """Fill the engine's defaults and refuse what the engine refuses.

    Raises
    ------
    EngineInputError
        ``gpu_memory_utilization`` outside (0, 1]; ``max_model_len`` above the model's context;
        a degree or length below 1; an unknown dtype name; a tensor-parallel degree the heads
        cannot be split over (``tensor_parallel_size``, vLLM's wording via
        :func:`app.domain.parallel.check_tensor_parallel`).
    """
    util = (
        profile.default_gpu_memory_utilization
        if options.gpu_memory_utilization is None
        else options.gpu_memory_utilization
    )
    if not 0.0 < util <= 1.0:
        raise EngineInputError(
            f"gpu_memory_utilization must be in (0, 1], got {util}", field="gpu_memory_utilization"
        )
    for name in ("tensor_parallel_size", "pipeline_parallel_size"):
        if getattr(options, name) < 1:
            raise EngineInputError(f"{name} must be >= 1", field=name)
    tp = options.tensor_parallel_size
    if model.mla_latent_dim is None:
        try:
            check_tensor_parallel(model.attention_heads, model.kv_heads, tp)
        except TensorParallelError as exc:
            raise EngineInputError(str(exc), field="tensor_parallel_size") from None
    elif model.attention_heads % tp:
        raise EngineInputError(
            f"Total number of attention heads ({model.attention_heads}) must be divisible by "
            f"tensor parallel size ({tp}).",
            field="tensor_parallel_size",
        )
    context = model.max_position_embeddings
    max_len = options.max_model_len if options.max_model_len is not None else context
    if max_len is None or max_len < 1:
        raise EngineInputError(
            "max_model_len must be >= 1 (the model states no context length)", field="max_model_len"
        )
    if context is not None and max_len > context:
        raise EngineInputError(
            f"max_model_len {max_len} is above the model's context ({context}, "
            "max_position_embeddings)",
            field="max_model_len",
        )
    large = cuda_visible_bytes >= profile.large_gpu_bytes
    mnbt = (
        options.max_num_batched_tokens or profile.default_max_num_batched_tokens[0 if large else 1]
    )
    seqs = options.max_num_seqs or profile.default_max_num_seqs[0 if large else 1]
    block = options.block_size or profile.default_block_size
    for name, value in (
        ("max_num_batched_tokens", mnbt),
        ("max_num_seqs", seqs),
        ("block_size", block),
    ):
        if value < 1:
            raise EngineInputError(f"{name} must be >= 1", field=name)
    dtype_bytes = _dtype_bytes(model.dtype if options.dtype == "auto" else options.dtype, "dtype")
    kv_bytes = (
        dtype_bytes
        if options.kv_cache_dtype == "auto"
        else _dtype_bytes(options.kv_cache_dtype, "kv_cache_dtype")
    )
    return ResolvedOptions(
        max_model_len=max_len,
        gpu_memory_utilization=util,
        max_num_batched_tokens=mnbt,
        max_num_seqs=seqs,
        block_size=block,
        dtype_bytes=dtype_bytes,
        kv_cache_dtype_bytes=kv_bytes,
        tensor_parallel_size=tp,
        pipeline_parallel_size=options.pipeline_parallel_size,
        enforce_eager=options.enforce_eager,
    )


def kv_cache_bytes_per_token(
    model: ServingModel, layers: int, tp: int, kv_cache_dtype_bytes: int
) -> int:
    """KV-cache bytes one token takes on one GPU holding ``layers`` decoder layers [B].

    MHA/GQA/MQA: ``2 (K and V) x layers x max(1, kv_heads // tp) x head_dim x bytes`` (KV heads
    replicated when TP exceeds them: :func:`app.domain.parallel.kv_heads_per_rank`). MLA: one
    latent of ``kv_lora_rank + qk_rope_head_dim`` a layer, replicated on every rank
    (``vllm/v1/kv_cache_interface.py`` ``MLAAttentionSpec``).
    """
    if model.mla_latent_dim is not None:
        return layers * model.mla_latent_dim * kv_cache_dtype_bytes
    return (
        2 * layers * kv_heads_per_rank(model.kv_heads, tp) * model.head_dim * kv_cache_dtype_bytes
    )


def sampler_peak_bytes(
    vocab_size: int, max_num_seqs: int, profile: EngineProfile = VLLM_0_19
) -> int:
    """What the dummy sampler run of the profile holds at its peak [B]:
    ``sampler_bytes_per_logit x max_num_seqs x vocab`` (logits are gathered whole on each rank)."""
    return math.ceil(profile.sampler_bytes_per_logit * max_num_seqs * vocab_size)


def forward_peak_bytes(
    model: ServingModel, tokens: int, tp: int, dtype_bytes: int, profile: EngineProfile = VLLM_0_19
) -> int:
    """The profile forward's activation peak of ``tokens`` dummy tokens on one rank [B]:
    ``factor x tokens x bytes x (experts_per_token x 3 x intermediate / tp + 2 x hidden)``.
    A caller holding the model's graph passes :func:`graph_forward_peak_bytes` of its peak to
    :func:`engine_memory` instead (the service does)."""
    per_token = model.experts_per_token * 3 * model.intermediate_size / tp + 2 * model.hidden_size
    return math.ceil(profile.forward_activation_factor * tokens * dtype_bytes * per_token)


def graph_forward_peak_bytes(graph_peak_bytes: int, profile: EngineProfile = VLLM_0_19) -> int:
    """The profile forward's peak on one rank from the graph's [B]:
    ``ceil(graph_forward_factor x graph_peak_bytes)``, the graph's peak from
    :func:`app.domain.engines.profile_forward.graph_forward_peak` at ``max_num_batched_tokens``
    tokens, the rank's tensor-parallel share and the engine's dtype."""
    return math.ceil(profile.graph_forward_factor * graph_peak_bytes)


def rotary_cache_bytes(model: ServingModel, dtype_bytes: int) -> int:
    """vLLM's rotary cos/sin cache on one GPU [B]:
    ``rotary_positions x rotary_dim x dtype_bytes`` (0 without a rotary embedding or a
    context).

    Notes
    -----
    ``vllm/model_executor/layers/rotary_embedding/base.py`` (0.19): ``RotaryEmbedding``
    computes cos and sin (``rotary_dim / 2`` columns each) for ``max_position_embeddings``
    positions, concatenates them, casts the cache to the model dtype and registers it as the
    non-persistent buffer ``cos_sin_cache`` while the model is built on the GPU, so vLLM's
    "Model loading took" counts it although no checkpoint holds it. ``get_rope``
    (``rotary_embedding/__init__.py``) keeps one instance per distinct (head size, rotary_dim,
    max_position, rope parameters, dtype) in ``_ROPE_DICT``: every decoder layer of a process
    shares one cache, so each GPU of each pipeline stage holds exactly one, unsplit by tensor
    parallelism. YaRN (``yarn_scaling_rope.py``, ``deepseek_scaling_rope.py``) builds
    ``original_max_position_embeddings x factor`` rows.
    """
    width = model.rotary_dim
    if width is None:
        width = model.mla.qk_rope_head_dim if model.mla is not None else model.head_dim
    rows = model.rotary_positions
    if rows is None:
        rows = model.max_position_embeddings or 0
    return rows * width * dtype_bytes


def non_torch_bytes(tp: int, pp: int, profile: EngineProfile = VLLM_0_19) -> int:
    """Memory outside the allocator that grows during the profile, per GPU [B]."""
    if tp >= 2:
        return profile.non_torch_tensor_parallel_bytes
    if pp >= 2:
        return profile.non_torch_pipeline_bytes
    return profile.non_torch_single_gpu_bytes


def decoder_stage_weights_bytes(
    model: ServingModel, tp: int, pp: int, weight_bytes: int, profile: EngineProfile = VLLM_0_19
) -> tuple[int, ...]:
    """Weights each pipeline stage's GPUs hold, first to last [B], for an unquantized decoder.

    Attention Q/O and the MLP (all experts) split over ``tp``; K/V projections hold
    ``max(1, kv_heads // tp)`` heads; norms replicated; embedding and head vocab-parallel over
    ``tp`` after padding the vocabulary to ``vocab_padding``; the embedding on the first stage,
    the final norm and the head (unless tied) on the last; layers split by
    :func:`app.domain.parallel.pipeline_stage_layers`; MLA, shared experts and dense layers of a
    MoE model by :func:`app.domain.engines.families.decoder_layers_params`. Quantized
    checkpoints and runtime quantization are not expressed here (the memory engine's weights are
    the canonical figure once wired).
    """
    h = model.hidden_size
    q_dim = model.attention_heads * model.head_dim
    kv_dim = kv_heads_per_rank(model.kv_heads, tp) * model.head_dim
    attn = h * q_dim // tp * 2 + 2 * h * kv_dim
    if model.qkv_bias:
        attn += q_dim // tp + 2 * kv_dim
    mlp = model.experts * 3 * h * model.intermediate_size // tp
    router = h * model.experts if model.experts > 1 else 0
    layer = attn + mlp + router + model.norms_per_layer * h
    padded_vocab = -(-model.vocab_size // profile.vocab_padding) * profile.vocab_padding
    embed = padded_vocab // tp * h
    per_layer = decoder_layers_params(model, tp, layer)  # MLA, shared experts, dense layers
    stages = pipeline_stage_layers(model.layers, pp)
    out = []
    for i, n in enumerate(stages):
        params = sum(per_layer[sum(stages[:i]) : sum(stages[:i]) + n])
        if i == 0:
            params += embed
        if i == len(stages) - 1:
            params += h + (0 if model.tie_word_embeddings and pp == 1 else embed)
        out.append(params * weight_bytes)
    return tuple(out)


@dataclass(frozen=True)
class StageMemory:
    """One pipeline stage's GPU (every TP rank of a stage holds the same) [B]. The KV pool is
    what is left of the request after weights, the rotary cache, the peak and non-torch."""

    layers: int
    weights_bytes: int
    peak_bytes: int
    non_torch_bytes: int
    kv_pool_bytes: int
    kv_bytes_per_token: int
    kv_tokens: int  # whole blocks this stage's pool holds
    rotary_cache_bytes: int = 0


@dataclass(frozen=True)
class EngineMemory:
    """The engine's start-up answer, per GPU. ``kv_tokens``: the engine's (smallest stage);
    ``reason``: the engine's own message when it does not start."""

    engine: str
    version: str
    requested_bytes: int
    cuda_graph_pool_bytes: int
    stages: tuple[StageMemory, ...]
    kv_tokens: int
    max_concurrency: float
    starts: bool
    reason: str | None


def start_verdict(
    pool_bytes: int, bytes_per_token: int, max_model_len: int, block_size: int
) -> str | None:
    """vLLM's ``check_enough_kv_cache_memory``: ``None`` when the pool holds one
    ``max_model_len`` sequence, else its error message (vllm/v1/core/kv_cache_utils.py, 0.19)."""
    if pool_bytes <= 0:
        return NO_MEMORY_MESSAGE
    blocks = -(-max_model_len // block_size)
    needed = blocks * block_size * bytes_per_token
    if needed <= pool_bytes:
        return None
    estimated = (pool_bytes // (block_size * bytes_per_token)) * block_size
    return (
        f"To serve at least one request with the models's max seq len ({max_model_len}), "
        f"({needed / GIB:.2f} GiB KV cache is needed, which is larger than the available KV "
        f"cache memory ({pool_bytes / GIB:.2f} GiB). Based on the available memory, the "
        f"estimated maximum model length is {estimated}. Try increasing "
        "`gpu_memory_utilization` or decreasing `max_model_len` when initializing the engine."
    )


def engine_memory(
    model: ServingModel,
    options: VllmOptions,
    cuda_visible_bytes: int,
    stage_weights_bytes: Sequence[int],
    *,
    profile: EngineProfile = VLLM_0_19,
    forward_peak: int | None = None,
) -> EngineMemory:
    """The engine's memory at start-up on each GPU (see the module docstring for the steps).

    Parameters
    ----------
    model, options : the served model and the engine's options.
    cuda_visible_bytes : int
        Memory the GPU shows to CUDA [B] (:data:`H100_80GB_CUDA_VISIBLE_BYTES`).
    stage_weights_bytes : sequence of int
        Weights on one GPU of each pipeline stage, first to last [B] (the memory engine's, or
        :func:`decoder_stage_weights_bytes`).
    forward_peak : int, optional
        The profile forward's activation peak on one rank [B] from a graph analysis at
        ``max_num_batched_tokens`` tokens (:func:`graph_forward_peak_bytes`);
        :func:`forward_peak_bytes` otherwise.
    """
    opts = resolve_options(options, model, cuda_visible_bytes, profile)
    tp, pp = opts.tensor_parallel_size, opts.pipeline_parallel_size
    layers = pipeline_stage_layers(model.layers, pp)
    if len(stage_weights_bytes) != pp:
        raise ValueError(f"{len(stage_weights_bytes)} stage weights for {pp} pipeline stages")
    requested = math.floor(opts.gpu_memory_utilization * cuda_visible_bytes)
    fwd = (
        forward_peak
        if forward_peak is not None
        else forward_peak_bytes(model, opts.max_num_batched_tokens, tp, opts.dtype_bytes, profile)
    )
    sampler = sampler_peak_bytes(model.vocab_size, opts.max_num_seqs, profile)
    received = profile.pp_received_tensors * opts.max_num_batched_tokens * model.hidden_size
    received *= opts.dtype_bytes
    graphs = 0 if opts.enforce_eager else profile.cuda_graph_pool_bytes
    other = non_torch_bytes(tp, pp, profile)
    rotary = rotary_cache_bytes(model, opts.dtype_bytes)
    stages = []
    for i, (n, weights) in enumerate(zip(layers, stage_weights_bytes, strict=True)):
        peak = max(fwd, sampler) if i == pp - 1 else fwd
        if i > 0:
            peak += received
        pool = requested - weights - rotary - peak - other
        pool -= graphs if profile.graphs_before_kv else 0
        per_token = kv_cache_bytes_per_token(model, n, tp, opts.kv_cache_dtype_bytes)
        tokens = 0
        if pool > 0 and per_token > 0:
            tokens = (pool // (per_token * opts.block_size)) * opts.block_size
        stages.append(StageMemory(n, weights, peak, other, pool, per_token, tokens, rotary))
    reason = None
    for stage in stages:
        if stage.kv_bytes_per_token == 0:
            continue
        reason = start_verdict(
            stage.kv_pool_bytes, stage.kv_bytes_per_token, opts.max_model_len, opts.block_size
        )
        if reason is not None:
            break
    kv_tokens = min((s.kv_tokens for s in stages if s.kv_bytes_per_token), default=0)
    return EngineMemory(
        engine=profile.name,
        version=profile.version,
        requested_bytes=requested,
        cuda_graph_pool_bytes=graphs,
        stages=tuple(stages),
        kv_tokens=kv_tokens if reason is None else 0,
        max_concurrency=(kv_tokens / opts.max_model_len) if reason is None else 0.0,
        starts=reason is None,
        reason=reason,
    )


__all__ = [
    "DTYPE_BYTES",
    "GRAPH_FORWARD_FACTOR",
    "H100_80GB_CUDA_VISIBLE_BYTES",
    "NO_MEMORY_MESSAGE",
    "VLLM_0_19",
    "EngineInputError",
    "EngineMemory",
    "EngineProfile",
    "ResolvedOptions",
    "ServingModel",
    "StageMemory",
    "VllmOptions",
    "decoder_stage_weights_bytes",
    "engine_memory",
    "forward_peak_bytes",
    "graph_forward_peak_bytes",
    "kv_cache_bytes_per_token",
    "non_torch_bytes",
    "resolve_options",
    "rotary_cache_bytes",
    "sampler_peak_bytes",
    "start_verdict",
]
