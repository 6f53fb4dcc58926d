"""A workload's serving engine as a request names it: ``engine: {name: "vllm", ...}`` with the
engine's own option names. One model per engine, told apart by ``name``; another engine is a
second model here and a second profile in app.domain.engines, not a fork."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from app.schemas.base import Schema
from app.schemas.engines import EngineStage, ProfileForward, VllmOptionFields


class VllmEngineOptions(VllmOptionFields):
    """vLLM 0.19 serving the workload's model: its options, with vLLM's names and defaults (an
    omitted option takes vLLM's default, resolved for the GPU or MIG slice the workload is
    placed on; the fields shared with POST /v1/engines/vllm/memory are written once, in
    app.schemas.engines.VllmOptionFields). The requirement on a device is then the engine's
    start-up memory: the least memory the device must show to CUDA for vLLM to start with a KV
    pool of at least `min_concurrency` sequences of `max_model_len` tokens (POST
    /v1/engines/vllm/memory gives the same figures for one GPU)."""

    name: Literal["vllm"] = Field(description="The engine: `vllm` (0.19).", examples=["vllm"])
    # Declared here, not in VllmOptionFields: a workload's default is its own parallelism.
    tensor_parallel_size: int | None = Field(
        default=None,
        ge=1,
        le=1024,
        description="vLLM `--tensor-parallel-size`. Default: the workload's "
        "`parallelism.tensor`; both given must agree. It must divide the attention heads "
        "(422 naming this field otherwise, as vLLM refuses).",
        examples=[None],
    )
    pipeline_parallel_size: int | None = Field(
        default=None,
        ge=1,
        le=1024,
        description="vLLM `--pipeline-parallel-size`. Default: the workload's "
        "`parallelism.pipeline`; both given must agree.",
        examples=[None],
    )
    min_concurrency: int | None = Field(
        default=None,
        ge=1,
        le=1_048_576,
        description="Not a vLLM option: the workload fits a device only where the engine holds "
        "at least this many sequences of `max_model_len` tokens at once (its 'maximum "
        "concurrency'). Default 1: it fits where vLLM starts.",
        examples=[None],
    )


# The engines a workload may name (one today; a second engine is a second member, told apart
# by `name`).
EngineOptions = VllmEngineOptions


class EngineFitRead(Schema):
    """The serving engine on the device, per GPU: its start-up figures next to the requirement
    they give, every number the fit uses (the same figures as POST /v1/engines/vllm/memory,
    byte for byte: one computation, app.services.engines.engine_start)."""

    engine: str = Field(description="Engine and version modelled.", examples=["vllm 0.19.0"])
    device: str = Field(description="`slug` or `slug/profile`.", examples=["nvidia-h100-sxm"])
    cuda_visible_bytes: int = Field(
        description="Memory the device shows to CUDA, which the engine claims a share of [B].",
        examples=[85_030_021_939],
    )
    cuda_visible_source: str = Field(
        description="Where cuda_visible_bytes comes from.",
        examples=["H100 80GB shows 79.19 GiB to torch"],
    )
    requested_bytes: int = Field(
        description="gpu_memory_utilization x cuda_visible_bytes [B].", examples=[76_527_019_745]
    )
    weights_bytes: int = Field(description="Weights on the GPU that holds most [B].", examples=[1])
    rotary_cache_bytes: int = Field(
        description="The rotary cos/sin cache on each GPU [B] "
        "(vllm/model_executor/layers/rotary_embedding/base.py).",
        examples=[2_097_152],
    )
    profile_peak_bytes: int = Field(
        description="Largest profile-run peak of any GPU [B].", examples=[2_023_000_000]
    )
    non_torch_bytes: int = Field(
        description="Memory outside the allocator per GPU [B].", examples=[268_435_456]
    )
    cuda_graph_pool_bytes: int = Field(
        description="CUDA-graph pool [B] (0 with enforce_eager); vLLM 0.19 captures it after "
        "sizing the KV pool, in the 1 - gpu_memory_utilization it leaves, so the fit does not "
        "subtract it.",
        examples=[977_105_633],
    )
    kv_pool_bytes: int = Field(description="Smallest KV pool of any GPU [B].", examples=[1])
    kv_bytes_per_token: int = Field(
        description="KV bytes a token on the GPU with the smallest pool [B].", examples=[131_072]
    )
    kv_tokens: int = Field(
        description="KV tokens the engine holds (0 when it does not start).", examples=[443_792]
    )
    max_model_len: int = Field(description="max_model_len used [tokens].", examples=[8192])
    max_concurrency: float = Field(
        description="kv_tokens / max_model_len: sequences of max_model_len held at once.",
        examples=[54.17],
    )
    min_concurrency: int = Field(
        description="Sequences of max_model_len the fit asks for (1: it starts).", examples=[1]
    )
    starts: bool = Field(description="Whether the engine starts.", examples=[True])
    fits: bool = Field(
        description="Starts with at least min_concurrency: the fit verdict (required_bytes <= "
        "cuda_visible_bytes).",
        examples=[True],
    )
    reason: str | None = Field(
        default=None,
        description="Why it does not fit: the engine's own message when it does not start, else "
        "the concurrency it falls short by.",
        examples=[None],
    )
    quantization: str | None = Field(
        default=None,
        description="The quantization vLLM runs (after its gptq/awq -> Marlin override; None: "
        "unquantized).",
        examples=[None],
    )
    options: dict[str, int | float | bool] = Field(
        description="The engine options used, its defaults for this device filled in.",
        examples=[{"max_model_len": 8192, "gpu_memory_utilization": 0.9}],
    )
    stages: list[EngineStage] = Field(
        description="Per pipeline stage, first to last, per GPU: weights, profile-run peak, "
        "memory outside the allocator, KV pool, KV bytes a token and KV tokens (the fit's "
        "lines are the stage that needs most)."
    )
    profile_forward: ProfileForward = Field(
        description="Where the profile run's forward peak comes from (the model's graph; the "
        "per-architecture formula only as a named fallback) and the dummy sampler run's peak."
    )
