"""Workload contract: a named, saved question (model + how it runs)."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, ClassVar, Self

from pydantic import Field, model_validator

from app.domain.precision import Precision
from app.domain.workload import Checkpointing, LossKind, Mode, Optimizer, OptimizerImpl
from app.schemas.base import Page, Schema, Slug, located_error
from app.schemas.engine_options import EngineOptions
from app.schemas.estimates import BatchSize, Length, LoraSpec
from app.schemas.hardware import DeviceName
from app.schemas.parallelism import ParallelismSpec


class WorkloadOptions(Schema):
    """Less common knobs of a workload; every field has the estimate's default."""

    micro_batch_size: BatchSize | None = Field(
        default=None,
        description="Batch per forward pass (gradient accumulation).",
        examples=[None],
    )
    optimizer_impl: OptimizerImpl = Field(
        default=OptimizerImpl.AUTO, description="Optimizer implementation.", examples=["auto"]
    )
    checkpointing: Checkpointing = Field(
        default=Checkpointing.NONE, description="Activation checkpointing.", examples=["none"]
    )
    parallelism: ParallelismSpec = Field(
        default_factory=ParallelismSpec, description="Parallel degrees (per-device estimate)."
    )
    kv_cache: bool = Field(default=True, description="Inference: KV cache.", examples=[True])
    fp32_grad_buffer: bool = Field(
        default=False, description="mixed_* only: fp32 gradient buffer.", examples=[False]
    )
    bindings: dict[str, Annotated[int, Field(ge=1, le=2**40)]] = Field(
        default_factory=dict, description="Values for other symbolic dims.", examples=[{}]
    )
    lora: LoraSpec | None = Field(
        default=None,
        description="LoRA adapters on a frozen base (training; inference with merged), as for "
        "`POST /v1/estimates/memory` (its memory, admission decisions and `/memory` follow).",
        examples=[None],
    )
    optimizer_in_backward: bool = Field(
        default=False,
        description="Training: the optimizer step fused into backward, as for "
        "`POST /v1/estimates/memory` (not with gradient accumulation, ZeRO-1/2, "
        "keep_gradients or parallelism.cpu_offload: a 422 naming the field).",
        examples=[False],
    )
    decoder_sequence_length: Length | None = Field(
        default=None,
        description="An encoder-decoder model (an imported T5): binds its `decoder_seq` (the "
        "decoder's tokens, e.g. the labels' length of a seq2seq fine-tune), as for `POST "
        "/v1/estimates/memory`; unset, the decoder is as long as `sequence_length`. A model "
        "without a decoder input is a 422.",
        examples=[None],
    )
    loss_chunks: Annotated[int, Field(ge=1, le=65_536)] | None = Field(
        default=None,
        description="Training, token-level loss: chunked cross-entropy with this many chunks, "
        "as for `POST /v1/estimates/memory`.",
        examples=[None],
    )
    loss: LossKind = Field(
        default=LossKind.CROSS_ENTROPY,
        description="Training: Hugging Face's cross-entropy or `logits_sum`, as for "
        "`POST /v1/estimates/memory`.",
        examples=["cross_entropy"],
    )
    tokens_per_batch: Annotated[int, Field(ge=1, le=16_777_216)] | None = Field(
        default=None,
        description="Training with packed sequences: the tokens of one micro-batch, as for "
        "`POST /v1/estimates/memory` (sequence_length, if given, is the longest document).",
        examples=[None],
    )
    keep_gradients: bool = Field(
        default=False,
        description="Training: `zero_grad(set_to_none=False)`, as for `POST /v1/estimates/memory`.",
        examples=[False],
    )
    keep_outputs: bool = Field(
        default=False,
        description="Training: the loop holds the model's outputs until the next step's "
        "forward returns, as for `POST /v1/estimates/memory`.",
        examples=[False],
    )
    activation_offload: bool = Field(
        default=False,
        description="Training on CUDA: saved tensors offloaded to pinned host memory, as for "
        "`POST /v1/estimates/memory` (a 422 on a CPU runtime).",
        examples=[False],
    )
    compile: bool = Field(
        default=False,
        description="The model runs under `torch.compile` (Inductor, mode default), as for "
        "`POST /v1/estimates/memory`: training keeps what Inductor's partitioner keeps for "
        "backward; at inference no line changes (a 422 with an engine).",
        examples=[False],
    )
    engine: EngineOptions | None = Field(
        default=None,
        description="Inference only: the serving engine, as for `POST /v1/estimates/memory` "
        "(its requirement and verdict follow the engine: the MIG fit, recommendations and "
        "the stored admission decisions, with KV tokens and concurrency per resource).",
        examples=[None],
    )


class WorkloadBase(Schema):
    """Fields a client supplies for a workload."""

    name: str = Field(
        min_length=1, max_length=200, description="Display name.", examples=["Chat serving"]
    )
    description: str | None = Field(
        default=None, max_length=4000, description="Free-form description.", examples=[None]
    )
    model: Slug = Field(description="Stored model slug.", examples=["llama-3-8b"])
    mode: Mode = Field(description="training or inference.", examples=["inference"])
    batch_size: BatchSize = Field(description="Batch size.", examples=[8])
    sequence_length: Length | None = Field(
        default=None, description="Binds `seq`.", examples=[4096]
    )
    image_size: Length | None = Field(default=None, description="Binds `image`.", examples=[None])
    precision: Precision = Field(description="Precision convention.", examples=["bf16"])
    optimizer: Optimizer | None = Field(
        default=None, description="Optimizer (training; default adamw).", examples=[None]
    )
    hardware: DeviceName | None = Field(
        default=None,
        description="Hardware it targets, `slug` or `slug/profile` (one MIG slice of a "
        "MIG-capable GPU), returned as written: sets the runtime, overheads and defaults of its "
        "estimate and the fit of `GET /v1/workloads/{slug}/memory` (a slice: its profile's "
        "usable memory). An unknown slug is a 422; a profile the GPU lacks (or a GPU without "
        "MIG) a 404 naming the valid ones.",
        examples=["nvidia-a100-80gb-sxm"],
    )
    options: WorkloadOptions = Field(
        default_factory=WorkloadOptions, description="Less common knobs."
    )

    @model_validator(mode="after")
    def _micro_batch_divides(self) -> Self:
        micro = self.options.micro_batch_size
        if micro is not None and self.batch_size % micro:
            raise located_error(
                type(self).__name__,
                ("options", "micro_batch_size"),
                f"micro_batch_size {micro} must divide batch_size {self.batch_size}",
            )
        return self


class WorkloadCreate(WorkloadBase):
    """A new workload."""

    slug: Slug = Field(examples=["chat-serving"])


class WorkloadReplace(WorkloadBase):
    """A full replacement of a workload (PUT); the slug is taken from the path."""


class WorkloadRead(WorkloadCreate):
    """A stored workload."""

    # Read from rows that were checked when written (the Create/Replace bodies): not re-walked.
    check_storable_text: ClassVar[bool] = False

    version: int = Field(description="Optimistic-concurrency version (the ETag).", examples=[1])
    created_at: datetime = Field(
        description="Creation time (UTC).", examples=["2026-11-22T06:00:00Z"]
    )
    updated_at: datetime = Field(
        description="Last change (UTC).", examples=["2026-11-22T06:00:00Z"]
    )


WorkloadList = Page[WorkloadRead]
