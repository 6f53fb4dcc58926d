"""The workload's parallel degrees and DeepSpeed ZeRO's buffer knobs (the API contract)."""

from __future__ import annotations

from pydantic import Field

from app.domain.workload import (
    DEEPSPEED_MAX_LIVE_PARAMETERS,
    DEEPSPEED_MAX_REUSE_DISTANCE,
    DEEPSPEED_PREFETCH_BUCKET_SIZE,
    DEEPSPEED_REDUCE_BUCKET_SIZE,
)
from app.schemas.base import Schema


class DeepSpeedZeroSpec(Schema):
    """DeepSpeed ZeRO's GPU buffer knobs, in elements as DeepSpeed's config takes them."""

    reduce_bucket_size: int = Field(
        default=DEEPSPEED_REDUCE_BUCKET_SIZE,
        ge=0,
        le=1 << 40,
        description="`zero_optimization.reduce_bucket_size` [elements] (DeepSpeed's default "
        "5e8): the contiguous gradient bucket, allocated on the GPU in the parameters' dtype "
        "whatever the model's size (line `zero_reduce_bucket`).",
        examples=[DEEPSPEED_REDUCE_BUCKET_SIZE],
    )
    stage3_prefetch_bucket_size: int = Field(
        default=DEEPSPEED_PREFETCH_BUCKET_SIZE,
        ge=0,
        le=1 << 40,
        description="`stage3_prefetch_bucket_size` [elements] (default 5e7): ZeRO-3 parameters "
        "fetched ahead of use (line `zero_gathered_params`).",
        examples=[DEEPSPEED_PREFETCH_BUCKET_SIZE],
    )
    stage3_max_live_parameters: int = Field(
        default=DEEPSPEED_MAX_LIVE_PARAMETERS,
        ge=0,
        le=1 << 40,
        description="`stage3_max_live_parameters` [elements] (default 1e9): ZeRO-3 prefetches "
        "only while fewer than this many gathered parameters are resident; the running "
        "submodule is gathered whole regardless (line `zero_gathered_params`).",
        examples=[DEEPSPEED_MAX_LIVE_PARAMETERS],
    )
    stage3_max_reuse_distance: int = Field(
        default=DEEPSPEED_MAX_REUSE_DISTANCE,
        ge=0,
        le=1 << 40,
        description="`stage3_max_reuse_distance` [elements] (default 1e9): ZeRO-3 keeps a "
        "submodule's gathered parameters when they are used again within this many parameter "
        "elements of the forward + backward trace, so the last layers of the forward stay "
        "gathered into the backward: those whose parameters after them, counted twice "
        "(forward, then backward), are under it; a model under 5e8 parameters stays gathered "
        "whole. 0 releases every submodule after use (line `zero_gathered_params`).",
        examples=[DEEPSPEED_MAX_REUSE_DISTANCE],
    )


class ParallelismSpec(Schema):
    """Parallel degrees; the estimate is per device."""

    data: int = Field(default=1, ge=1, le=65_536, description="Data-parallel degree.", examples=[8])
    tensor: int = Field(
        default=1,
        ge=1,
        le=1024,
        description="Tensor-parallel degree (Megatron-style, as vLLM runs it). It must divide "
        "every attention layer's heads, and split or evenly replicate its KV heads (a 422 "
        "naming this field otherwise, as vLLM refuses to start). Each GPU holds "
        "`max(1, kv_heads // tensor)` KV heads a layer and its share of the column-parallel "
        "activations.",
        examples=[1],
    )
    pipeline: int = Field(
        default=1,
        ge=1,
        le=1024,
        description="Pipeline-parallel degree: the repeated blocks are split over the stages "
        "as vLLM's `get_pp_indices` splits decoder layers, the embeddings on the first stage, "
        "the final norm and output head on the last; the estimate is the stage that holds "
        "the most (the weights line's notes list every stage).",
        examples=[1],
    )
    zero_stage: int = Field(
        default=0,
        ge=0,
        le=3,
        description="ZeRO stage (1: optimizer state, 2: + gradients, 3/FSDP: + parameters "
        "sharded over the data-parallel group).",
        examples=[0],
    )
    gradient_as_bucket_view: bool = Field(
        default=False,
        description="DistributedDataParallel (data > 1, ZeRO 0): gradients are views into its "
        "25 MiB communication buckets; false (PyTorch's default): the buckets are a second copy "
        "of every gradient.",
        examples=[False],
    )
    cpu_offload: bool = Field(
        default=False,
        description="ZeRO-3 (zero_stage 3, CUDA): the parameter, gradient and optimizer-state "
        "shards (and fp32 master weights) live in host memory and the optimizer steps there "
        "(FSDP `CPUOffload(offload_params=True)`, DeepSpeed `offload_param` + "
        "`offload_optimizer`); the GPU holds the gathered parameters (`fsdp_buffers`, or "
        "DeepSpeed's `zero_gathered_params` and `zero_reduce_bucket`). ZeRO-2: DeepSpeed "
        "`offload_optimizer` (gradients, optimizer state and master weights on the host, the "
        "16-bit weights on the GPU). Works with `data: 1` (ZeRO-Offload / ZeRO-Infinity on one "
        "GPU). The host's share is reported in `host_memory`, not in the GPU peak. A 422 "
        "below zero_stage 2.",
        examples=[False],
    )
    deepspeed: DeepSpeedZeroSpec | None = Field(
        default=None,
        description="DeepSpeed ZeRO's buffer sizes (zero_stage 1-3; a 422 otherwise). The ZeRO "
        "lines are DeepSpeed's when this is given, and by default with `data: 1` (FSDP shards "
        "nothing there) or ZeRO-2 with cpu_offload; FSDP's rules otherwise. Fields left out "
        "take DeepSpeed's defaults (deepspeed/runtime/zero/config.py).",
        examples=[None],
    )
