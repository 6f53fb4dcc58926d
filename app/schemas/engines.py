"""Serving-engine memory contract: vLLM's start-up memory on one GPU (or a TP/PP group)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from app.schemas.base import MAX_BYTES, Schema, Slug

EngineDtype = Literal["auto", "float32", "float", "bfloat16", "float16", "half"]
KvCacheDtype = Literal["auto", "bfloat16", "float16", "fp8", "fp8_e4m3", "fp8_e5m2"]
# vLLM `--quantization` values the engine model expresses (app.domain.engines.quantization).
EngineQuantizationMethod = Literal[
    "fp8", "gptq", "gptq_marlin", "awq", "awq_marlin", "compressed-tensors", "mxfp4"
]
GPTQ_W4A16_CONFIG_EXAMPLE: dict[str, Any] = {
    "quant_method": "gptq",
    "bits": 4,
    "group_size": 128,
    "desc_act": True,
    "sym": True,
}


class VllmOptionFields(Schema):
    """vLLM 0.19's options with its names and defaults, written once for both requests that
    take them: POST /v1/engines/vllm/memory (:class:`VllmMemoryRequest`) and a workload's
    ``engine`` (app.schemas.engine_options.VllmEngineOptions). An omitted option takes vLLM's
    default, resolved for the GPU or MIG slice (the answer lists which). The tensor and
    pipeline degrees are declared by each request: their defaults differ (1 for the endpoint,
    the workload's ``parallelism`` for a workload)."""

    dtype: EngineDtype = Field(
        default="auto",
        description="vLLM `--dtype` of weights and activations; `auto` is the model's dtype "
        "(bfloat16 for stored graphs, which state none).",
        examples=["auto"],
    )
    kv_cache_dtype: KvCacheDtype = Field(
        default="auto",
        description="vLLM `--kv-cache-dtype`; `auto` is the model dtype, fp8 variants 1 byte.",
        examples=["auto"],
    )
    max_model_len: int | None = Field(
        default=None,
        ge=1,
        le=16_777_216,
        description="vLLM `--max-model-len`; default and upper bound: the model's context, "
        "taken from its default `seq` binding (422 naming this field above it).",
        examples=[8192],
    )
    max_num_batched_tokens: int | None = Field(
        default=None,
        ge=1,
        le=16_777_216,
        description="vLLM `--max-num-batched-tokens`: tokens of the profile forward. Default "
        "8192 on a GPU (or slice) showing >= 70 GiB, else 2048 (`vllm serve`).",
        examples=[None],
    )
    max_num_seqs: int | None = Field(
        default=None,
        ge=1,
        le=1_048_576,
        description="vLLM `--max-num-seqs`: rows of the profile's dummy sampler run. Default "
        "1024 on a GPU (or slice) showing >= 70 GiB, else 256.",
        examples=[None],
    )
    gpu_memory_utilization: float | None = Field(
        default=None,
        gt=0,
        le=1,
        description="vLLM `--gpu-memory-utilization`, in (0, 1] (422 naming this field "
        "otherwise). Default 0.9.",
        examples=[0.9],
    )
    block_size: int | None = Field(
        default=None,
        ge=1,
        le=4096,
        description="vLLM `--block-size` of the paged KV cache [tokens]. Default 16.",
        examples=[None],
    )
    enforce_eager: bool = Field(
        default=False,
        description="vLLM `--enforce-eager`: no CUDA graphs (no CUDA-graph pool).",
        examples=[False],
    )
    quantization: EngineQuantizationMethod | None = Field(
        default=None,
        description="vLLM `-q/--quantization`. `fp8` without a `quantization_config` quantizes "
        "a 16-bit checkpoint at load time (fp8 linears with one fp32 scale each; embedding, "
        "head and norms stay in `dtype`); the other methods load a pre-quantized checkpoint "
        "and need its `quantization_config`. Omitted: the config's `quant_method` decides (a "
        "GPTQ/AWQ config runs as gptq_marlin/awq_marlin where Marlin takes it, as vLLM does). "
        "A method the config contradicts is a 422 naming the field.",
        examples=["gptq_marlin"],
    )
    quantization_config: dict[str, Any] | None = Field(
        default=None,
        description="The checkpoint's `quantization_config` object from its HF config.json "
        "(stored models keep only their unquantized graph, so it comes with the options): "
        "`quant_method` (gptq, awq, fp8, compressed-tensors, mxfp4) and its keys - gptq: bits, "
        "group_size, desc_act, sym; awq: bits (w_bit), group_size (q_group_size), zero_point, "
        "modules_to_not_convert; fp8: activation_scheme, weight_block_size, ignored_layers; "
        "compressed-tensors: config_groups (one group targeting Linear), ignore; mxfp4: "
        "modules_to_not_convert. A missing or contradictory key is a 422 naming it "
        "(`quantization_config/<key>`).",
        examples=[GPTQ_W4A16_CONFIG_EXAMPLE],
    )


class VllmMemoryRequest(VllmOptionFields):
    """A stored decoder served by vLLM on a catalog GPU, with vLLM's option names and defaults
    (an omitted option takes vLLM's default; the answer lists which)."""

    model: Slug | None = Field(
        default=None,
        description="Stored decoder model slug (zoo or imported; a Llama-style graph: "
        "embedding, repeated attention + gated MLP or MoE blocks, LM head). Required unless "
        "`hf_config` gives the model instead (one of the two, 422 otherwise).",
        examples=["llama-3-8b"],
    )
    hf_config: dict[str, Any] | None = Field(
        default=None,
        description="The model as a Hugging Face config.json instead of `model`: imported as "
        "POST /v1/models/import/hf-config does (nothing stored) at its full "
        "max_position_embeddings context; its `quantization_config` is the request's when the "
        "request gives none, and its torch_dtype is what `dtype: auto` means (float32 or none: "
        "bfloat16, as vLLM's auto).",
        examples=[None],
    )
    hardware: Slug = Field(
        description="Catalog GPU slug; every GPU of the TP x PP group is one of these.",
        examples=["nvidia-h100-sxm"],
    )
    cuda_visible_bytes: int | None = Field(
        default=None,
        ge=1,
        le=MAX_BYTES,
        description="Memory the GPU shows to CUDA (`torch.cuda.mem_get_info` total) [B]. "
        "Default: 79.19 GiB for an H100 80GB (what vLLM 0.19 logged), else the catalog memory.",
        examples=[None],
    )
    # Declared here, not in VllmOptionFields: the endpoint's default is vLLM's own 1.
    tensor_parallel_size: int = Field(
        default=1,
        ge=1,
        le=1024,
        description="vLLM `--tensor-parallel-size`; must divide the attention heads and split or "
        "evenly replicate the KV heads (422 naming this field otherwise, as vLLM refuses).",
        examples=[1],
    )
    pipeline_parallel_size: int = Field(
        default=1,
        ge=1,
        le=1024,
        description="vLLM `--pipeline-parallel-size`; layers split as vLLM's get_pp_indices.",
        examples=[1],
    )


class ResolvedVllmOptions(Schema):
    """The options the engine runs with, defaults filled in."""

    dtype: str = Field(description="Weights/activation dtype.", examples=["bfloat16"])
    kv_cache_dtype: str = Field(description="KV cache dtype.", examples=["bfloat16"])
    dtype_bytes: int = Field(description="Bytes per weight/activation element.", examples=[2])
    kv_cache_dtype_bytes: int = Field(description="Bytes per KV cache element.", examples=[2])
    tensor_parallel_size: int = Field(description="Tensor-parallel degree.", examples=[1])
    pipeline_parallel_size: int = Field(description="Pipeline-parallel degree.", examples=[1])
    max_model_len: int = Field(description="Longest sequence [tokens].", examples=[8192])
    max_num_batched_tokens: int = Field(
        description="Tokens of the profile forward.", examples=[8192]
    )
    max_num_seqs: int = Field(
        description="Sequences of the profile's sampler run.", examples=[1024]
    )
    gpu_memory_utilization: float = Field(
        description="Fraction of the visible memory claimed.", examples=[0.9]
    )
    block_size: int = Field(description="KV block size [tokens].", examples=[16])
    enforce_eager: bool = Field(description="Whether CUDA graphs are off.", examples=[False])
    quantization: str | None = Field(
        default=None,
        description="The quantization vLLM runs (None: unquantized).",
        examples=[None],
    )


class EngineStage(Schema):
    """One GPU of a pipeline stage (every tensor-parallel rank of a stage holds the same)."""

    stage: int = Field(description="Pipeline stage index, first = 0.", examples=[0])
    layers: int = Field(description="Decoder layers on this stage.", examples=[32])
    weights_bytes: int = Field(
        description="Weights on one GPU of this stage [B].", examples=[16060522496]
    )
    rotary_cache_bytes: int = Field(
        default=0,
        description="The rotary cos/sin cache vLLM builds with the model on this GPU [B]: "
        "positions x rotary_dim x dtype bytes, one per GPU "
        "(vllm/model_executor/layers/rotary_embedding/base.py; not a weight, but in vLLM's "
        "'Model loading took').",
        examples=[2097152],
    )
    profile_peak_bytes: int = Field(
        description="Torch peak increase of vLLM's profile run on this GPU [B]: max(profile "
        "forward, dummy sampler run) on the last stage, plus received intermediate tensors on "
        "a later stage.",
        examples=[2023000000],
    )
    non_torch_bytes: int = Field(
        description="Memory outside the allocator that grows in the profile (context "
        "workspaces; NCCL/all-reduce buffers at TP >= 2) [B].",
        examples=[268435456],
    )
    kv_pool_bytes: int = Field(
        description="KV cache pool = requested - weights - rotary cache - peak - non-torch [B] "
        "(<= 0: no pool).",
        examples=[49000000000],
    )
    kv_bytes_per_token: int = Field(
        description="KV cache bytes one token takes on this GPU [B] (KV heads replicated past TP).",
        examples=[131072],
    )
    kv_tokens: int = Field(
        description="Whole KV blocks' tokens this stage's pool holds.", examples=[373840]
    )


class StoredQuantizedWeights(Schema):
    """What one GPU holds for its quantized linears [B]."""

    packed_weight_bytes: int = Field(
        description="The quantized values: fp8/int8 bytes, int4 packed in int32, MXFP4 nibbles.",
        examples=[3489660928],
    )
    scale_bytes: int = Field(
        description="Their scales (per tensor, channel, group or block; static input scales "
        "included).",
        examples=[109051904],
    )
    zero_point_bytes: int = Field(
        description="Packed zero points (asymmetric GPTQ/AWQ; 0 for symmetric Marlin).",
        examples=[0],
    )
    g_idx_bytes: int = Field(
        description="Act-order indices (desc_act: Marlin keeps g_idx and its sort order).",
        examples=[6815744],
    )


class EngineQuantization(Schema):
    """The quantization scheme the engine runs and what it stores, on the GPU of the stage that
    holds the most weights."""

    method: str = Field(
        description="The quantization vLLM runs (after its gptq/awq -> Marlin override).",
        examples=["gptq_marlin"],
    )
    scheme: str = Field(
        description="The scheme in words: what is quantized and how it is stored.",
        examples=[
            "gptq_marlin (pre-quantized checkpoint): decoder-layer linears; int4 packed in "
            "int32, params-dtype scales group_size 128, symmetric (no zeros), act-order g_idx"
        ],
    )
    checkpoint: bool = Field(
        description="Pre-quantized checkpoint (true) or quantized at load time (false).",
        examples=[True],
    )
    stage: int = Field(description="The pipeline stage described.", examples=[0])
    stored: StoredQuantizedWeights = Field(description="Its quantized linears' tensors [B].")
    kernels: list[str] = Field(
        description="GEMM kernels vLLM picks for the quantized linears: machete (Hopper, "
        "compute capability 9.0), marlin, marlin_moe, exllama, gemm, fp8_marlin (fp8 weights "
        "on a GPU below 8.9), or the fp8/int8/mxfp4 path; they decide which tensors stay "
        "(Machete keeps a GPTQ checkpoint's qzeros and g_idx, Marlin drops them).",
        examples=[["machete"]],
    )
    unquantized_bytes: int = Field(
        description="Weights kept in `dtype` on that GPU: embedding, head, norms, biases, "
        "router and skipped modules [B].",
        examples=[2101878784],
    )
    quantized_modules: int = Field(
        description="Linear modules quantized on that GPU (decoder layers x modules).",
        examples=[128],
    )
    skipped_modules: int = Field(
        description="Linear modules the config keeps unquantized on that GPU.", examples=[0]
    )
    sources: dict[str, str] = Field(
        description="vLLM source of each rule used.",
        examples=[{"gptq_marlin": "vllm/model_executor/layers/quantization/gptq_marlin.py"}],
    )


class EngineProfileInfo(Schema):
    """The engine profile the answer comes from."""

    name: str = Field(description="Engine name.", examples=["vllm"])
    version: str = Field(description="Engine version modelled.", examples=["0.19.0"])
    sources: dict[str, str] = Field(
        description="Each constant of the profile and its source.",
        examples=[
            {"default_block_size": "vllm/config/cache.py: block_size defaults to 16 on CUDA"}
        ],
    )


class ProfileForward(Schema):
    """Where the profile run's forward peak comes from, per GPU of a stage."""

    source: Literal["graph", "formula"] = Field(
        description="`graph`: the memory engine's inference forward of the model's graph "
        "(app.domain.engines.profile_forward) times the engine profile's graph_forward_factor; "
        "`formula`: the per-architecture fallback (app.domain.engines.vllm.forward_peak_bytes), "
        "used only when the graph cannot be laid out (`fallback_reason`).",
        examples=["graph"],
    )
    tokens: int = Field(
        description="Tokens of the profile forward: max_num_batched_tokens, as one batch of 1 x "
        "tokens (vLLM's _dummy_run flattens its dummy requests into one token batch).",
        examples=[8192],
    )
    tensor_parallel_size: int = Field(
        description="The rank's tensor-parallel degree (heads and MLP intermediate split).",
        examples=[1],
    )
    graph_peak_bytes: int | None = Field(
        default=None,
        description="The graph's forward peak on one rank [B]: allocated bytes over the weights "
        "(inputs, activations, transients, cuBLAS workspace, allocator rounding), flash "
        "attention, no KV cache, no logits over all tokens.",
        examples=[939655168],
    )
    attention: str | None = Field(
        default=None,
        description="The attention the graph's forward is replayed with: flash (16-bit) or "
        "mem_efficient (fp32, which flash does not take); neither materialises S x S scores.",
        examples=["flash"],
    )
    graph_peak_at: str | None = Field(
        default=None,
        description="The moment of the graph's peak.",
        examples=["during the forward of 'layers.0.mlp'"],
    )
    graph_peak_parts: dict[str, int] = Field(
        default_factory=dict,
        description="The graph peak's parts per line of the memory estimate [B].",
        examples=[{"activations": 201392128, "transient": 704643072, "workspace": 33554432}],
    )
    factor: float = Field(
        description="The engine profile's calibrated factor on that peak (graph_forward_factor "
        "or, for the formula, forward_activation_factor).",
        examples=[1.2],
    )
    forward_peak_bytes: int = Field(
        description="The profile forward's peak used per GPU [B] (before what a later pipeline "
        "stage receives).",
        examples=[1127586202],
    )
    sampler_peak_bytes: int = Field(
        description="The dummy sampler run's peak on the last stage [B]: "
        "sampler_bytes_per_logit x max_num_seqs x vocabulary; the last stage takes the larger.",
        examples=[2026514268],
    )
    formula: str = Field(
        description="The forward peak's arithmetic.",
        examples=[
            "ceil(1.2 [graph_forward_factor] x 939,655,168 [B: graph peak]) = 1,127,586,202 B"
        ],
    )
    fallback_reason: str | None = Field(
        default=None,
        description="Why the graph was not used (source `formula` only).",
        examples=[None],
    )


class VllmMemoryResponse(Schema):
    """vLLM's start-up memory per GPU: what it claims, spends and leaves to KV blocks."""

    model: str = Field(description="Model slug.", examples=["llama-3-8b"])
    hardware: str = Field(description="Hardware slug.", examples=["nvidia-h100-sxm"])
    gpus: int = Field(description="GPUs of the group: tensor x pipeline.", examples=[1])
    cuda_visible_bytes: int = Field(
        description="Memory one GPU shows to CUDA [B].", examples=[85030021939]
    )
    cuda_visible_source: str = Field(
        description="Where `cuda_visible_bytes` comes from.",
        examples=["request (cuda_visible_bytes)"],
    )
    requested_bytes: int = Field(
        description="gpu_memory_utilization x cuda_visible_bytes, per GPU [B].",
        examples=[76527019745],
    )
    weights_bytes: int = Field(
        description="Weights on the GPU that holds the most [B].", examples=[16060522496]
    )
    rotary_cache_bytes: int = Field(
        description="The rotary cos/sin cache on each GPU [B] (max_position_embeddings x "
        "rotary_dim x dtype bytes: vllm/model_executor/layers/rotary_embedding/base.py); "
        "vLLM's logged model loading is weights_bytes + this.",
        examples=[2097152],
    )
    profile_peak_bytes: int = Field(
        description="Largest profile-run peak of any GPU [B].", examples=[2023000000]
    )
    non_torch_bytes: int = Field(
        description="Memory outside the allocator per GPU [B].", examples=[268435456]
    )
    cuda_graph_pool_bytes: int = Field(
        description="CUDA-graph pool [B] (0 with enforce_eager); vLLM 0.19 captures it after "
        "sizing the KV pool, so it is not subtracted from the pool.",
        examples=[977105633],
    )
    kv_pool_bytes: int = Field(
        description="Smallest KV pool of any GPU [B].", examples=[49000000000]
    )
    kv_tokens: int = Field(
        description="KV tokens the engine holds (whole blocks; the smallest stage decides; 0 "
        "when it does not start).",
        examples=[373840],
    )
    max_concurrency: float = Field(
        description="kv_tokens / max_model_len: sequences of max_model_len held at once.",
        examples=[45.63],
    )
    starts: bool = Field(description="Whether vLLM starts with these options.", examples=[True])
    reason: str | None = Field(
        default=None,
        description="vLLM's own error message when it does not start.",
        examples=[None],
    )
    stages: list[EngineStage] = Field(description="Per pipeline stage, first to last.")
    options: ResolvedVllmOptions = Field(description="The options used, defaults filled in.")
    defaults_used: list[str] = Field(
        description="Options the request left out that took the engine's (or model's) default.",
        examples=[["gpu_memory_utilization", "block_size"]],
    )
    quantization: EngineQuantization | None = Field(
        default=None,
        description="The quantization scheme and what it stores (absent when unquantized).",
    )
    engine: EngineProfileInfo = Field(description="The engine profile.")
    profile_forward: ProfileForward | None = Field(
        default=None,
        description="Where the profile run's forward peak comes from (the model's graph, with "
        "its tokens and per-rank figure).",
    )
    assumptions: list[str] = Field(
        description="What the answer assumes, with sources.",
        examples=[
            ["the CUDA-graph pool is captured after KV sizing in vLLM 0.19 and is not subtracted"]
        ],
    )
