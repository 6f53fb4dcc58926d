"""What a memory estimate is asked: the request besides the graph, and the error for a
combination of options that cannot be estimated."""

from __future__ import annotations

from dataclasses import dataclass, field

from app.domain.hardware import FrameworkOverhead
from app.domain.peft import LoraConfig, check_lora_mode
from app.domain.precision import Precision
from app.domain.quantization import CheckpointLayout
from app.domain.workload import (
    Attention,
    Checkpointing,
    Logits,
    Mode,
    Optimizer,
    OptimizerImpl,
    Parallelism,
    Runtime,
    TrainingOptionError,
    TrainingOptions,
    WorkloadInputError,
)


class MemoryInputError(WorkloadInputError):
    """A combination of options that cannot be estimated."""


@dataclass(frozen=True, slots=True, kw_only=True)
class MemoryRequest:
    """Everything besides the graph that a footprint depends on."""

    mode: Mode
    precision: Precision = Precision.FP32
    optimizer: Optimizer = Optimizer.ADAMW
    optimizer_impl: OptimizerImpl = OptimizerImpl.AUTO
    checkpointing: Checkpointing = Checkpointing.NONE
    runtime: Runtime = Runtime.CUDA
    parallelism: Parallelism = field(default_factory=Parallelism)
    accumulation_steps: int = 1
    kv_cache: bool | None = None  # None: decoders (causal attention) yes; encoders never
    fp32_grad_buffer: bool = False
    overhead: FrameworkOverhead = field(default_factory=FrameworkOverhead)
    attention: Attention | None = None  # None: PyTorch SDPA's choice per attention layer
    logits: Logits = Logits.ALL  # LAST: decoder inference computes the last position's logits
    lora: LoraConfig | None = None  # training: a frozen base with LoRA adapters (PEFT)
    training_options: TrainingOptions = field(default_factory=TrainingOptions)
    # a pre-quantized checkpoint: its weights as stored (app.domain.memory.checkpoint)
    checkpoint: CheckpointLayout | None = None

    def __post_init__(self) -> None:
        steps = self.accumulation_steps
        if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
            raise MemoryInputError(f"accumulation_steps must be an integer >= 1, got {steps!r}")
        if self.lora is not None:  # merged exactly at inference
            check_lora_mode(self.lora, training=self.mode is Mode.TRAINING)
        options = self.training_options
        if options.used() and self.mode is not Mode.TRAINING:
            name = options.used()[0]
            raise TrainingOptionError(
                f"{name} is a training option: the mode must be training", field=name
            )
        options.check(self.parallelism, self.runtime, None)
        if options.optimizer_in_backward and steps > 1:
            raise TrainingOptionError(
                "optimizer_in_backward steps each parameter as its gradient is computed: it "
                f"cannot accumulate gradients over {steps} micro-batches",
                field="optimizer_in_backward",
            )
