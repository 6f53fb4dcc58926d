"""ONE workload spec: a model, what it does, and every option and default that shapes its cost.

:class:`WorkloadSpec` is what the estimate, the MIG fit, the admission webhook and the
recommendations are asked about. Options a caller leaves out are filled from ONE default table
(:data:`DEFAULTS`, :func:`resolve`), and every default used is returned with the answer, so the
API, the CLI, stored workloads and pod annotations give the same figure for the same workload.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING

from app.domain.errors import DomainError
from app.domain.precision import (
    CONVENTIONS,
    ComputeCapability,
    DType,
    Precision,
    unsupported_dtype,
)

if TYPE_CHECKING:  # app.domain.peft raises this module's WorkloadInputError
    from app.domain.engines.choice import EngineChoice  # engines -> parallel -> this module
    from app.domain.peft import LoraConfig


class WorkloadInputError(DomainError):
    """Workload options that cannot be combined."""


class LoraError(WorkloadInputError):
    """A LoRA configuration that does not apply to the model; ``field`` names the option
    within ``lora`` (``r``, ``qlora/bnb_4bit_compute_dtype``), or, starting with ``/``, a
    workload option it contradicts (``/precision``)."""

    def __init__(self, message: str, field: str) -> None:
        super().__init__(message)
        self.field = field

    @property
    def pointer(self) -> str:
        """The JSON pointer of the option, relative to the workload."""
        return self.field if self.field.startswith("/") else f"/lora/{self.field}"


INFERENCE_NEEDS_MERGED = (
    "lora at inference needs merged: true (after merge_and_unload: the base alone) or false "
    "(the adapters beside the base); without it lora is a training option"
)


def check_lora_mode(config: LoraConfig | None, *, training: bool) -> None:
    """``merged`` is given exactly at inference.

    Raises
    ------
    LoraError
        Inference without ``merged`` (field ``/lora``), training with it (``merged``).
    """
    if config is None:
        return
    if not training and config.merged is None:
        raise LoraError(INFERENCE_NEEDS_MERGED, "/lora")
    if training and config.merged is not None:
        raise LoraError("merged is an inference option (training keeps the adapters)", "merged")


class TrainingOptionError(WorkloadInputError):
    """A training option that contradicts another; ``field`` is its JSON pointer under the
    workload (``optimizer_in_backward``, ``parallelism/cpu_offload``)."""

    def __init__(self, message: str, *, field: str) -> None:
        super().__init__(message)
        self.field = field


COMPILE_WITH_ENGINE = (
    "compile describes a PyTorch model run under torch.compile; a serving engine compiles by "
    "its own configuration (vLLM compilation_config), which the engine's figures already hold"
)


class Mode(StrEnum):
    """What the model is doing."""

    TRAINING = "training"
    INFERENCE = "inference"


class Optimizer(StrEnum):
    """Optimizer whose state is kept per trainable parameter."""

    SGD = "sgd"
    SGD_MOMENTUM = "sgd_momentum"
    ADAM = "adam"
    ADAMW = "adamw"
    ADAGRAD = "adagrad"
    RMSPROP = "rmsprop"
    LION = "lion"
    ADAM_8BIT = "adam_8bit"
    ADAFACTOR = "adafactor"
    # bitsandbytes 0.45+ (bitsandbytes/optim/adamw.py): AdamW8bit, PagedAdamW8bit, PagedAdamW32bit
    ADAMW_8BIT = "adamw_8bit"
    PAGED_ADAMW_8BIT = "paged_adamw_8bit"
    PAGED_ADAMW_32BIT = "paged_adamw_32bit"


# The optimizers whose step is one bitsandbytes update kernel per parameter (in place).
BNB_OPTIMIZERS = frozenset(
    {Optimizer.ADAMW_8BIT, Optimizer.PAGED_ADAMW_8BIT, Optimizer.PAGED_ADAMW_32BIT}
)


class OptimizerImpl(StrEnum):
    """PyTorch optimizer implementation; they keep different temporaries in the step."""

    AUTO = "auto"  # foreach on CUDA, for-loop on CPU (PyTorch's default)
    FOR_LOOP = "for_loop"
    FOREACH = "foreach"
    FUSED = "fused"


class Checkpointing(StrEnum):
    """Activation checkpointing (recomputation) policy."""

    NONE = "none"
    SELECTIVE = "selective"  # drop attention's S x S tensors, recompute them (Korthikanti)
    FULL = "full"  # keep only each repeated block's input, recompute the block in backward


class Runtime(StrEnum):
    """Where the model runs; kernels and allocators differ."""

    CUDA = "pytorch_cuda"
    CPU = "pytorch_cpu"


# DeepSpeed's defaults, deepspeed/runtime/zero/config.py DeepSpeedZeroConfig (DeepSpeed 0.16+):
# reduce_bucket_size pp_int(5e8), stage3_prefetch_bucket_size pp_int(5e7),
# stage3_max_live_parameters pp_int(1e9) [elements].
DEEPSPEED_REDUCE_BUCKET_SIZE = 500_000_000
DEEPSPEED_PREFETCH_BUCKET_SIZE = 50_000_000
DEEPSPEED_MAX_LIVE_PARAMETERS = 1_000_000_000
# stage3_max_reuse_distance pp_int(1e9) [elements] (the same config.py)
DEEPSPEED_MAX_REUSE_DISTANCE = 1_000_000_000


@dataclass(frozen=True, slots=True, kw_only=True)
class DeepSpeedBuffers:
    """DeepSpeed ZeRO's GPU working set knobs [elements], DeepSpeed's defaults when not given.

    ``reduce_bucket_size``: the contiguous gradient (IPG) bucket, ``torch.empty(
    reduce_bucket_size)`` in the model's dtype on the GPU (stage_1_and_2.py ``backward``,
    stage3.py ``_setup_for_real_optimizer``, contiguous_gradients=True by default).
    ``stage3_prefetch_bucket_size``: parameter elements fetched ahead of use (ZeRO-3).
    ``stage3_max_live_parameters``: at most this many gathered parameter elements resident.
    ``stage3_max_reuse_distance``: a submodule's gathered parameters are not released when
    they are used again within this many parameter elements of the trace (ZeRO-3).
    """

    reduce_bucket_size: int = DEEPSPEED_REDUCE_BUCKET_SIZE
    stage3_prefetch_bucket_size: int = DEEPSPEED_PREFETCH_BUCKET_SIZE
    stage3_max_live_parameters: int = DEEPSPEED_MAX_LIVE_PARAMETERS
    stage3_max_reuse_distance: int = DEEPSPEED_MAX_REUSE_DISTANCE

    def __post_init__(self) -> None:
        for name in ("reduce_bucket_size", "stage3_prefetch_bucket_size",
                     "stage3_max_live_parameters", "stage3_max_reuse_distance"):  # fmt: skip
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise TrainingOptionError(
                    f"parallelism.deepspeed.{name} must be an integer >= 0, got {value!r}",
                    field=f"parallelism/deepspeed/{name}",
                )


@dataclass(frozen=True, slots=True, kw_only=True)
class Parallelism:
    """Parallel degrees; the estimate is per device."""

    data: int = 1
    tensor: int = 1
    pipeline: int = 1
    zero_stage: int = 0  # 0 none, 1 optimizer state, 2 + gradients, 3 + parameters (FSDP)
    # DistributedDataParallel(gradient_as_bucket_view=...): gradients are views into the
    # communication buckets instead of a second copy (PyTorch's default: False).
    gradient_as_bucket_view: bool = False
    # FSDP CPUOffload(offload_params=True) / DeepSpeed ZeRO-3 offload_param + offload_optimizer:
    # parameters, gradients and optimizer state live on the host; the GPU gathers one unit.
    # ZeRO-2: DeepSpeed offload_optimizer (gradients, optimizer state, master weights on the
    # host; the 16-bit weights stay on the GPU).
    cpu_offload: bool = False
    # DeepSpeed's ZeRO buffers (None: DeepSpeed's defaults where DeepSpeed is implied: ZeRO on
    # one data rank, or ZeRO-2 with cpu_offload; FSDP's rules otherwise)
    deepspeed: DeepSpeedBuffers | None = None

    @property
    def uses_deepspeed(self) -> bool:
        """Whether the ZeRO lines are DeepSpeed's: asked for, or implied (ZeRO on one data
        rank: FSDP shards nothing there; ZeRO-2 offload is DeepSpeed's offload_optimizer)."""
        if not self.zero_stage:
            return False
        implied = self.data == 1 or (self.zero_stage == 2 and self.cpu_offload)
        return self.deepspeed is not None or implied

    @property
    def deepspeed_buffers(self) -> DeepSpeedBuffers:
        """The DeepSpeed knobs in force (DeepSpeed's defaults for those not given)."""
        return self.deepspeed or DeepSpeedBuffers()

    def __post_init__(self) -> None:
        # The estimate divides by these degrees.
        for name in ("data", "tensor", "pipeline"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise WorkloadInputError(
                    f"parallelism.{name} must be an integer >= 1, got {value!r}"
                )
        if self.zero_stage not in (0, 1, 2, 3):
            raise WorkloadInputError(f"parallelism.zero_stage must be 0-3, got {self.zero_stage!r}")
        if self.cpu_offload and self.zero_stage < 2:
            raise TrainingOptionError(
                "parallelism.cpu_offload offloads ZeRO's partitions: it needs zero_stage 3 "
                "(FSDP / DeepSpeed offload_param + offload_optimizer) or 2 (DeepSpeed "
                "offload_optimizer); ZeRO-1 keeps every gradient on the GPU",
                field="parallelism/cpu_offload",
            )
        if self.deepspeed is not None and not self.zero_stage:
            raise TrainingOptionError(
                "parallelism.deepspeed sizes DeepSpeed ZeRO's buffers: it needs zero_stage 1-3",
                field="parallelism/deepspeed",
            )


class Attention(StrEnum):
    """How attention is computed (the graph says where attention is, not how).

    ``eager``: the unfused Python implementation (Hugging Face ``attn_implementation="eager"``):
    the S x S scores and fp32 softmax probabilities are materialised and kept for backward.
    ``sdpa_math``: PyTorch SDPA's math backend; keeps the same tensors as eager.
    ``flash``: FlashAttention (CUDA fp16/bf16; PyTorch's fused CPU kernel): keeps the output
    and the fp32 log-sum-exp, never an S x S matrix.
    ``mem_efficient``: the memory-efficient (xFormers/cutlass) kernel: same saved tensors as
    flash, available for fp32 on CUDA too.
    """

    EAGER = "eager"
    SDPA_MATH = "sdpa_math"
    FLASH = "flash"
    MEM_EFFICIENT = "mem_efficient"


FUSED_ATTENTION = frozenset({Attention.FLASH, Attention.MEM_EFFICIENT})


class Logits(StrEnum):
    """Which positions of a decoder's output head are computed at inference."""

    LAST = "last"  # serving stacks (vLLM, TGI, TensorRT-LLM, HF generate): the last position
    ALL = "all"  # a full forward (scoring, perplexity): every position


_HALF = frozenset({Precision.BF16, Precision.FP16, Precision.AMP_BF16, Precision.AMP_FP16,
                   Precision.MIXED_BF16, Precision.MIXED_FP16, Precision.INT4,
                   Precision.INT8_WEIGHT_ONLY})  # fmt: skip


@dataclass(frozen=True, slots=True, kw_only=True)
class GpuTraits:
    """What the defaults need to know about the GPU a workload runs on: its name (for the
    reasons) and compute capability (None: not in its hardware profile)."""

    name: str
    compute_capability: ComputeCapability | None

    def describe(self) -> str:
        """``nvidia-t4 (compute capability 7.5, sm75)``."""
        cap = self.compute_capability
        if cap is None:
            return f"{self.name} (compute capability unknown)"
        return f"{self.name} (compute capability {cap}, {cap.sm})"


# PyTorch SDPA's CUDA backend rules, aten/src/ATen/native/transformers/cuda/sdp_utils.cpp
# (PyTorch 2.13, select_sdp_backend: flash, then mem_efficient, then math):
# check_flash_attention_hardware_support / check_sm_version<sm80, sm121>: flash on sm80-sm121;
# check_dtypes_flash_attention / check_dtypes_low_precision: fp16 or bf16 (fp16 only below
# sm80); check_head_dim_size_flash: q, k, v the same head_dim, <= 256;
# check_requires_grad_and_head_dim_gt192_constraints_on_sm86_89_or_120: in training on sm86-89
# and sm120-121, head_dim in (192, 224], or in (224, 256] with dropout, is not flash;
# check_mem_efficient_hardware_support: mem_efficient on sm50-sm121, fp16/fp32 below sm80 and
# fp16/fp32/bf16 from sm80 (can_use_mem_efficient_attention); check_head_dim_size_mem_efficient:
# head_dim divisible by minimum_gemm_alignment (8 for 16-bit inputs on sm70+ tensor cores, 4 for
# fp32 on sm80+, 1 for fp32 below sm80).
SDPA_SOURCE = "PyTorch aten/src/ATen/native/transformers/cuda/sdp_utils.cpp"
FLASH_SM = (ComputeCapability(8, 0), ComputeCapability(12, 1))
MEM_EFFICIENT_SM = (ComputeCapability(5, 0), ComputeCapability(12, 1))
FLASH_MAX_HEAD_DIM = 256


def _mem_efficient_alignment(dtype: DType, cap: ComputeCapability) -> int:
    """minimum_gemm_alignment in sdp_utils.cpp: tensor cores (sm80+, or sm70+ for 16-bit)
    need 128-bit rows, sm80+ at least 4 elements."""
    half = dtype in (DType.FP16, DType.BF16)
    tensor_cores = cap.major >= 8 or (cap.major >= 7 and half)
    alignment = 4 if cap.major >= 8 else 1
    if tensor_cores:
        alignment = max(alignment, 128 // (16 if half else 32))
    return alignment


def _cuda_attention(
    precision: Precision,
    gpu: GpuTraits,
    cap: ComputeCapability,
    *,
    training: bool,
    dropout: bool,
    head_dim: int | None,
) -> tuple[Attention, str]:
    """SDPA's CUDA choice on a GPU of known compute capability (see the rules above)."""
    dtype = CONVENTIONS[precision].activation_dtype
    where = gpu.describe()
    why_not: list[str] = []
    if not FLASH_SM[0] <= cap <= FLASH_SM[1]:
        why_not.append(f"flash needs sm80-sm121, {gpu.name} is {cap.sm}")
    elif dtype not in (DType.FP16, DType.BF16):
        why_not.append(f"flash needs fp16/bf16 inputs, these are {dtype.value}")
    elif head_dim is not None and head_dim > FLASH_MAX_HEAD_DIM:
        why_not.append(f"flash needs head_dim <= {FLASH_MAX_HEAD_DIM}, it is {head_dim}")
    elif (
        training
        and head_dim is not None
        and (ComputeCapability(8, 6) <= cap <= ComputeCapability(8, 9) or cap.major == 12)
        and (192 < head_dim <= 224 or (224 < head_dim and dropout))
    ):
        why_not.append(f"flash does not train head_dim {head_dim} on {cap.sm}")
    else:
        return Attention.FLASH, f"CUDA {dtype.value} on {where}: SDPA picks flash"
    lowest_mem = ComputeCapability(8, 0)
    mem_dtypes: tuple[DType, ...] = (DType.FP16, DType.FP32, DType.TF32)
    if cap >= lowest_mem:
        mem_dtypes += (DType.BF16,)
    if not MEM_EFFICIENT_SM[0] <= cap <= MEM_EFFICIENT_SM[1]:
        why_not.append(f"mem_efficient needs sm50-sm121, {gpu.name} is {cap.sm}")
    elif dtype not in mem_dtypes:
        below = " below sm80" if cap < lowest_mem else ""
        why_not.append(f"mem_efficient takes fp16/fp32{below}, not {dtype.value}")
    elif head_dim is not None and head_dim % _mem_efficient_alignment(dtype, cap):
        alignment = _mem_efficient_alignment(dtype, cap)
        why_not.append(f"mem_efficient needs head_dim divisible by {alignment}")
    else:
        return Attention.MEM_EFFICIENT, (
            f"CUDA {dtype.value} on {where}: {'; '.join(why_not)}: SDPA picks mem_efficient"
        )
    return Attention.SDPA_MATH, (
        f"CUDA {dtype.value} on {where}: {'; '.join(why_not)}: SDPA falls back to math"
    )


def default_attention(
    runtime: Runtime,
    precision: Precision,
    *,
    training: bool,
    dropout: bool,
    gpu: GpuTraits | None = None,
    head_dim: int | None = None,
) -> tuple[Attention, str]:
    """The attention kernel PyTorch's SDPA dispatcher picks, and why.

    CUDA on a GPU of known compute capability: PyTorch's own backend rules (``select_sdp_backend``
    in aten/src/ATen/native/transformers/cuda/sdp_utils.cpp: ``check_flash_attention_hardware_
    support`` / ``check_sm_version<sm80, sm121>``, ``check_dtypes_low_precision``,
    ``check_head_dim_size_flash``, ``check_mem_efficient_hardware_support``, the mem_efficient
    dtypes below and from sm80): flash for fp16/bf16 inputs on sm80-sm121 with head_dim <= 256
    (not in training with head_dim 193-224 on sm86-89/sm120-121), else mem_efficient on
    sm50-sm121 (fp16/fp32 inputs, bf16 too from sm80; head_dim aligned), else the math kernel.
    So a T4 (sm75) runs fp16 attention as mem_efficient and bf16 as math. W8A8 and NVFP4
    precisions run their engine's own fused kernel (TensorRT-LLM / Transformer Engine), priced
    as flash. cuDNN attention, which newer releases try first on sm90/sm100, keeps the same
    tensors as flash (output and fp32 softmax statistics), so it is priced as flash.
    CUDA without a compute capability (no GPU named, or a profile without the figure): flash for
    fp16/bf16 inputs (autocast and weight-only formats compute in 16 bits), else mem_efficient.
    CPU: the fused flash kernel, except in training with attention dropout, which it does not
    support, so SDPA falls back to the math kernel (measured, PyTorch 2.13 CPU).
    """
    if runtime is Runtime.CUDA:
        w8a8 = precision in (Precision.INT8, Precision.FP8, Precision.FP4)
        if w8a8:
            return Attention.FLASH, (
                f"CUDA {precision.value}: the engine's own fused attention kernel, priced as flash"
                if gpu is not None and gpu.compute_capability is not None
                else "CUDA with 16-bit (or 8-bit) attention inputs: SDPA picks flash"
            )
        if gpu is not None and gpu.compute_capability is not None:
            return _cuda_attention(
                precision,
                gpu,
                gpu.compute_capability,
                training=training,
                dropout=dropout,
                head_dim=head_dim,
            )
        if precision in _HALF:
            return Attention.FLASH, "CUDA with 16-bit (or 8-bit) attention inputs: SDPA picks flash"
        return Attention.MEM_EFFICIENT, "CUDA fp32: flash needs fp16/bf16, SDPA picks mem_efficient"
    if training and dropout:
        return Attention.SDPA_MATH, "CPU training with attention dropout: SDPA runs the math kernel"
    return Attention.FLASH, "CPU: SDPA runs the fused flash kernel"


def choose_precision(
    mode: Mode, runtime: Runtime, gpu: GpuTraits | None = None
) -> tuple[Precision, str]:
    """The default precision and why: fp32 on CPU; on CUDA bf16 serving and autocast-bf16
    training, except on a GPU whose compute capability has no bf16 (below 8.0: Volta, Turing,
    Maxwell), which gets fp16 serving and autocast-fp16 (GradScaler) training instead."""
    base = f"{mode.value} on {runtime.value}"
    if runtime is Runtime.CPU:
        return Precision.FP32, base
    bf16 = Precision.BF16 if mode is Mode.INFERENCE else Precision.AMP_BF16
    if gpu is None or gpu.compute_capability is None:
        return bf16, base
    cap = gpu.compute_capability
    if unsupported_dtype(bf16, cap) is None:
        return bf16, f"{base}: {gpu.describe()} computes in bf16"
    fp16 = Precision.FP16 if mode is Mode.INFERENCE else Precision.AMP_FP16
    return fp16, (
        f"{base}: {gpu.describe()} has no bf16 (it needs compute capability 8.0+), so {fp16.value}"
    )


def default_precision(mode: Mode, runtime: Runtime, gpu: GpuTraits | None = None) -> Precision:
    """The precision of :func:`choose_precision`."""
    return choose_precision(mode, runtime, gpu)[0]


@dataclass(frozen=True, slots=True)
class DefaultRule:
    """One row of the default table: the option, its default, and where it comes from."""

    option: str
    default: str
    rule: str


DEFAULTS: tuple[DefaultRule, ...] = (
    DefaultRule("mode", "inference", "CLI and pod annotations; the API asks for it"),
    DefaultRule("batch_size", "1", "CLI and pod annotations; the API asks for it"),
    DefaultRule("runtime", "pytorch_cuda", "pytorch_cpu on a CPU hardware profile"),
    DefaultRule("precision", "bf16 (inference) / amp_bf16 (training) on CUDA, fp16 / amp_fp16 "
                "on a GPU below compute capability 8.0 (no bf16: V100, T4), fp32 on CPU",
                "what serving and training stacks run on GPUs"),
    DefaultRule("sequence_length", "the model's `seq` default binding",
                "echoed in defaults_used: never silent"),
    DefaultRule("decoder_sequence_length", "sequence_length: the decoder as long as the input",
                "encoder-decoder models (decoder_seq follows seq); echoed in defaults_used"),
    DefaultRule("image_size", "the model's `image` default binding",
                "echoed in defaults_used: never silent"),
    DefaultRule("micro_batch_size", "batch_size", "no gradient accumulation"),
    DefaultRule("optimizer", "adamw", "training only"),
    DefaultRule("optimizer_impl", "auto: foreach on CUDA, for-loop on CPU, fused for mixed_*",
                "PyTorch default"),
    DefaultRule("checkpointing", "none; full with lora.qlora under "
                "prepare_model_for_kbit_training and use_gradient_checkpointing (the defaults)",
                "peft prepare_model_for_kbit_training: use_gradient_checkpointing=True"),
    DefaultRule("attention", "flash on CUDA fp16/bf16 (sm80+, head_dim <= 256), mem_efficient "
                "on CUDA fp32 or below sm80 (fp16/fp32), sdpa_math otherwise (bf16 below sm80); "
                "flash on CPU (sdpa_math with dropout in training)",
                "PyTorch SDPA dispatcher (sdp_utils.cpp)"),
    DefaultRule("logits", "last (decoder inference); every position in training",
                "serving stacks compute the last position only"),
    DefaultRule("kv_cache", "true for decoders (causal attention) at inference; encoders have "
                "none", ""),
    DefaultRule("safety_margin_fraction", "0.05", "of estimate + context + workspace"),
    DefaultRule("optimizer_in_backward", "false", "training: optimizer.step() after backward"),
    DefaultRule("loss_chunks", "none: Hugging Face's whole-sequence fp32 loss",
                "training; torchtune's CEWithChunkedOutputLoss when set"),
    DefaultRule("loss", "cross_entropy: Hugging Face's loss (ForCausalLMLoss: logits.float(), "
                "then F.cross_entropy)", "training; logits_sum: the loop sums the logits"),
    DefaultRule("tokens_per_batch", "none: batch x sequence_length, padded",
                "training; packed documents when set"),
    DefaultRule("keep_gradients", "false: zero_grad(set_to_none=True)", "PyTorch 2.x default"),
    DefaultRule("keep_outputs", "false: the loop keeps the loss, not the model's outputs",
                "training; Trainer.compute_loss, torchtune's del logits"),
    DefaultRule("activation_offload", "false", "training on CUDA"),
    DefaultRule("parallelism.cpu_offload", "false", "ZeRO-3 / FSDP on CUDA"),
    DefaultRule("compile", "false: eager mode", "torch.compile (Inductor, mode default) when "
                "true: pointwise chains recomputed in backward (torch/_functorch/partitioners.py)"),
    DefaultRule("cuda_context_bytes", "the CUDA context table's figure for the GPU's compute "
                "capability, CUDA 12 with lazy module loading (400 MiB for a GPU with no own "
                "figure); a hardware profile's figure first",
                "published figures, app/domain/cuda_context.py; echoed in defaults_used"),
)  # fmt: skip

DEFAULT_SAFETY_MARGIN_FRACTION = 0.05


def defaults_table_markdown() -> str:
    """:data:`DEFAULTS` as the Markdown table docs/defaults.md shows."""
    rows = ["| option | default | why / where |", "|---|---|---|"]
    rows += [f"| `{d.option}` | {d.default} | {d.rule} |" for d in DEFAULTS]
    return "\n".join(rows) + "\n"


@dataclass(frozen=True, slots=True, kw_only=True)
class DefaultUsed:
    """An option the caller left out, the value it got, and why."""

    option: str
    value: str
    reason: str


class LossKind(StrEnum):
    """What the training loop computes from the model's output."""

    CROSS_ENTROPY = "cross_entropy"  # Hugging Face's loss: ForCausalLMLoss for token logits
    LOGITS_SUM = "logits_sum"  # ``outputs.logits.sum().backward()``: no cross-entropy


@dataclass(frozen=True, slots=True, kw_only=True)
class TrainingOptions:
    """The training options practitioners set (docs/memory-model.md, "Training options").

    ``optimizer_in_backward``: each parameter is stepped in its post-accumulate-grad hook and its
    gradient freed (torchtune ``optimizer_in_bwd``, PyTorch
    ``Tensor.register_post_accumulate_grad_hook``). ``loss_chunks``: torchtune's
    ``CEWithChunkedOutputLoss`` (the output head and the fp32 cross-entropy per chunk of
    tokens); None: Hugging Face's whole-sequence loss. ``tokens_per_batch``: packed documents,
    one row of that many tokens per micro-batch (flash varlen, no padding). ``keep_gradients``:
    ``zero_grad(set_to_none=False)``, gradients live between steps. ``activation_offload``:
    tensors saved for backward kept in pinned host memory (torchtune ``OffloadActivations``).
    ``loss``: ``cross_entropy`` (Hugging Face's, app.domain.memory.loss) or ``logits_sum``
    (``outputs.logits.sum().backward()``: no log-probabilities, no upcast).
    ``keep_outputs``: the loop holds the model's outputs (``outputs = model(**batch)``): the
    logits (and the key/value cache a decoder returns) live through the backward and until the
    next step's forward returns, when ``outputs`` is rebound.
    ``compile``: the model runs under ``torch.compile`` (Inductor, mode "default"): what each
    layer keeps for backward follows Inductor's partitioner (app.domain.memory.compiled);
    accepted at inference too, where it changes no line (nothing is kept for backward).
    """

    optimizer_in_backward: bool = False
    loss_chunks: int | None = None
    tokens_per_batch: int | None = None
    keep_gradients: bool = False
    activation_offload: bool = False
    compile: bool = False  # not in used(): an inference option as well
    loss: LossKind = LossKind.CROSS_ENTROPY
    keep_outputs: bool = False

    def used(self) -> list[str]:
        """The training-only options set away from their defaults."""
        return [
            name
            for name, value in (
                ("optimizer_in_backward", self.optimizer_in_backward),
                ("loss_chunks", self.loss_chunks is not None),
                ("tokens_per_batch", self.tokens_per_batch is not None),
                ("keep_gradients", self.keep_gradients),
                ("activation_offload", self.activation_offload),
                ("loss", self.loss is not LossKind.CROSS_ENTROPY),
                ("keep_outputs", self.keep_outputs),
            )
            if value
        ]

    def check(
        self, parallelism: Parallelism, runtime: Runtime | None, sequence_length: int | None
    ) -> None:
        """Raise :class:`TrainingOptionError` naming the option that contradicts another."""
        for name in ("loss_chunks", "tokens_per_batch"):
            value = getattr(self, name)
            if value is not None and (
                isinstance(value, bool) or not isinstance(value, int) or value < 1
            ):
                raise TrainingOptionError(
                    f"{name} must be an integer >= 1, got {value!r}", field=name
                )
        if self.loss is LossKind.LOGITS_SUM and self.loss_chunks is not None:
            raise TrainingOptionError(
                "loss logits_sum computes no cross-entropy: loss_chunks has nothing to chunk",
                field="loss",
            )
        tokens = self.tokens_per_batch
        if tokens is not None and sequence_length is not None and sequence_length > tokens:
            raise TrainingOptionError(
                f"sequence_length {sequence_length} (the longest packed document) exceeds "
                f"tokens_per_batch {tokens}",
                field="tokens_per_batch",
            )
        if self.optimizer_in_backward and parallelism.zero_stage in (1, 2):
            raise TrainingOptionError(
                "optimizer_in_backward steps each parameter alone: "
                f"ZeRO-{parallelism.zero_stage}'s sharded optimizer steps all of them after the "
                "backward",
                field="optimizer_in_backward",
            )
        if self.optimizer_in_backward and self.keep_gradients:
            raise TrainingOptionError(
                "keep_gradients keeps every gradient between steps; optimizer_in_backward frees "
                "each one in its hook",
                field="keep_gradients",
            )
        if runtime is Runtime.CPU and parallelism.cpu_offload:
            raise TrainingOptionError(
                "parallelism.cpu_offload moves state from the GPU to the host: the runtime is "
                "pytorch_cpu",
                field="parallelism/cpu_offload",
            )
        if parallelism.cpu_offload and self.optimizer_in_backward:
            raise TrainingOptionError(
                "parallelism.cpu_offload steps the optimizer on the host after the backward",
                field="optimizer_in_backward",
            )
        if runtime is Runtime.CPU and self.activation_offload:
            raise TrainingOptionError(
                "activation_offload moves saved tensors from the GPU to the host: the runtime "
                "is pytorch_cpu",
                field="activation_offload",
            )


@dataclass(frozen=True, slots=True, kw_only=True)
class WorkloadSpec:
    """A workload as asked: None means "use the default" (see :func:`resolve`)."""

    mode: Mode
    batch_size: int
    micro_batch_size: int | None = None
    sequence_length: int | None = None
    # an encoder-decoder's decoder length (the ``decoder_seq`` dim; None: sequence_length)
    decoder_sequence_length: int | None = None
    image_size: int | None = None
    bindings: Mapping[str, int] = field(default_factory=dict)
    precision: Precision | None = None
    optimizer: Optimizer | None = None
    optimizer_impl: OptimizerImpl | None = None
    checkpointing: Checkpointing | None = None
    parallelism: Parallelism = field(default_factory=Parallelism)
    fp32_grad_buffer: bool = False
    kv_cache: bool | None = None
    attention: Attention | None = None
    logits: Logits | None = None
    runtime: Runtime | None = None
    lora: LoraConfig | None = None  # training: LoRA adapters on a frozen base (PEFT)
    # inference: served by an engine whose start-up memory is the requirement (app.domain.fit)
    engine: EngineChoice | None = None
    training_options: TrainingOptions = field(default_factory=lambda: TrainingOptions())

    def __post_init__(self) -> None:
        if self.lora is not None:  # merged exactly at inference (app.domain.peft)
            check_lora_mode(self.lora, training=self.mode is Mode.TRAINING)
        if self.engine is not None and self.mode is not Mode.INFERENCE:
            raise WorkloadInputError("engine is an inference option: the mode must be inference")
        batch, micro = self.batch_size, self.micro_batch_size
        if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
            raise WorkloadInputError(f"batch_size must be an integer >= 1, got {batch!r}")
        if micro is not None and (micro < 1 or batch % micro):
            raise WorkloadInputError(f"micro_batch_size {micro} must divide batch_size {batch}")
        options = self.training_options
        if options.used() and self.mode is not Mode.TRAINING:
            raise TrainingOptionError(
                f"{options.used()[0]} is a training option: the mode must be training",
                field=options.used()[0],
            )
        if options.compile and self.engine is not None:
            raise TrainingOptionError(COMPILE_WITH_ENGINE, field="compile")
        if options.optimizer_in_backward and micro is not None and micro < batch:
            raise TrainingOptionError(
                "optimizer_in_backward steps each parameter as its gradient is computed: it "
                f"cannot accumulate gradients over {batch // micro} micro-batches (torchtune "
                "refuses gradient accumulation with optimizer_in_bwd)",
                field="optimizer_in_backward",
            )
        options.check(self.parallelism, self.runtime, self.sequence_length)


@dataclass(frozen=True, slots=True, kw_only=True)
class ResolvedWorkload:
    """A workload with every option decided, and the defaults that decided them."""

    mode: Mode
    batch_size: int
    micro_batch_size: int
    bindings: Mapping[str, int]  # every symbolic dim, batch included (at the micro-batch)
    precision: Precision
    optimizer: Optimizer
    optimizer_impl: OptimizerImpl
    checkpointing: Checkpointing
    parallelism: Parallelism
    fp32_grad_buffer: bool
    kv_cache: bool | None  # None: the model decides (decoders yes, encoders never)
    attention: Attention | None  # None: per layer, by default_attention
    logits: Logits
    runtime: Runtime
    defaults_used: tuple[DefaultUsed, ...]
    gpu: GpuTraits | None = None  # the GPU the defaults were chosen for (None: none named)
    lora: LoraConfig | None = None  # training: LoRA adapters on a frozen base (PEFT)
    engine: EngineChoice | None = None  # inference: the serving engine (WorkloadSpec.engine)
    training_options: TrainingOptions = field(default_factory=lambda: TrainingOptions())

    @property
    def training(self) -> bool:
        """Whether the workload trains."""
        return self.mode is Mode.TRAINING


def resolve(
    spec: WorkloadSpec,
    *,
    model_bindings: Mapping[str, int],
    hardware_runtime: Runtime | None = None,
    batch_size: int | None = None,
    gpu: GpuTraits | None = None,
) -> ResolvedWorkload:
    """Fill every option ``spec`` leaves out from the default table, recording each.

    ``model_bindings`` are the model's default symbolic dims; ``hardware_runtime`` the runtime of
    the hardware it runs on (None: no hardware given); ``batch_size`` overrides the spec's (the
    fit's largest-batch search); ``gpu`` the GPU it runs on (its compute capability decides the
    precision and attention defaults on CUDA).
    """
    used: list[DefaultUsed] = []

    def default(option: str, value: str, reason: str) -> None:
        used.append(DefaultUsed(option=option, value=value, reason=reason))

    if spec.runtime is not None:
        runtime = spec.runtime
    elif hardware_runtime is not None:
        runtime = hardware_runtime
        default("runtime", runtime.value, "from the hardware profile's kind")
    else:
        runtime = Runtime.CUDA
        default("runtime", runtime.value, "no hardware given: CUDA")
    precision = spec.precision
    if precision is None:
        precision, why = choose_precision(
            spec.mode, runtime, gpu if runtime is Runtime.CUDA else None
        )
        default("precision", precision.value, why)
    batch = batch_size if batch_size is not None else spec.batch_size
    micro = min(spec.micro_batch_size or batch, batch)
    if spec.micro_batch_size is None and spec.mode is Mode.TRAINING:
        default("micro_batch_size", str(micro), "batch_size: no gradient accumulation")
    options = spec.training_options
    options.check(spec.parallelism, runtime, spec.sequence_length)
    if options.optimizer_in_backward and micro < batch:
        raise TrainingOptionError(
            "optimizer_in_backward cannot accumulate gradients over micro-batches",
            field="optimizer_in_backward",
        )
    bound = {**model_bindings, **spec.bindings, "batch": micro}
    tokens = options.tokens_per_batch
    for option, symbol, given in (
        ("sequence_length", "seq", spec.sequence_length),
        ("image_size", "image", spec.image_size),
    ):
        if symbol == "seq" and tokens is not None:
            if "seq" not in bound:
                raise TrainingOptionError(
                    "tokens_per_batch packs a token sequence: the model has no `seq` dim",
                    field="tokens_per_batch",
                )
            # packed: the micro-batch's documents concatenated into one row (no padding)
            bound["batch"], bound["seq"] = 1, tokens
        elif given is not None:
            bound[symbol] = given
        elif symbol in bound and symbol not in spec.bindings:
            default(option, str(bound[symbol]), f"the model's default `{symbol}`")
    if spec.decoder_sequence_length is not None:  # else decoder_seq follows seq (DERIVED_DIMS)
        bound["decoder_seq"] = spec.decoder_sequence_length
    training = spec.mode is Mode.TRAINING
    optimizer = spec.optimizer or Optimizer.ADAMW
    impl = spec.optimizer_impl or OptimizerImpl.AUTO
    if training:
        if spec.optimizer is None:
            default("optimizer", optimizer.value, "AdamW")
        if spec.optimizer_impl is None:
            default("optimizer_impl", impl.value, "PyTorch's default implementation")
    checkpointing = spec.checkpointing or Checkpointing.NONE
    qlora = spec.lora.qlora if spec.lora is not None else None
    gc = qlora is not None and qlora.prepare_kbit_training and qlora.use_gradient_checkpointing
    if training and gc and checkpointing is not Checkpointing.FULL:
        # prepare_model_for_kbit_training calls gradient_checkpointing_enable() whatever the
        # trainer's flag: the model is checkpointed (stored workloads store "none" explicitly)
        checkpointing = Checkpointing.FULL
        default(
            "checkpointing",
            checkpointing.value,
            "QLoRA: peft's prepare_model_for_kbit_training(use_gradient_checkpointing=True) "
            "enables gradient checkpointing (peft/utils/other.py); set "
            "use_gradient_checkpointing false in qlora to turn it off",
        )
    logits = spec.logits or (Logits.ALL if training else Logits.LAST)
    if spec.logits is None and not training:
        default("logits", logits.value, "serving stacks compute the last position only")
    return ResolvedWorkload(
        mode=spec.mode,
        batch_size=batch,
        micro_batch_size=micro,
        bindings=dict(sorted(bound.items())),
        precision=precision,
        optimizer=optimizer,
        optimizer_impl=impl,
        checkpointing=checkpointing,
        parallelism=spec.parallelism,
        fp32_grad_buffer=spec.fp32_grad_buffer,
        kv_cache=spec.kv_cache,
        attention=spec.attention,
        logits=logits,
        runtime=runtime,
        defaults_used=tuple(used),
        gpu=gpu if runtime is Runtime.CUDA else None,
        lora=spec.lora,
        engine=spec.engine,
        training_options=spec.training_options,
    )
