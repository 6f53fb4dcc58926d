"""Numeric formats: data types, and ONE table of precision conventions.

A *precision* names a convention for how a model is stored and computed: the dtype of its
weights (and whether matmul/conv weights are quantized, weight-only or with activations too),
of its activations and KV cache, the dtype of the math (which peak of a device it runs at), and
for training, the dtypes of gradients, master weights and optimizer state. The memory engine
and the roofline both read this table; nothing else defines bytes per element.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass
from enum import StrEnum
from fractions import Fraction

from app.domain.quantization import block_scale_bytes, channel_scale_bytes


class DType(StrEnum):
    """A numeric storage type for weights, activations or peak throughput figures."""

    FP64 = "fp64"
    FP32 = "fp32"
    TF32 = "tf32"
    BF16 = "bf16"
    FP16 = "fp16"
    FP8 = "fp8"
    INT8 = "int8"
    INT4 = "int4"
    FP4 = "fp4"  # E2M1 (Blackwell NVFP4)


# tf32 is a compute format: tensors are stored as fp32 (4 bytes).
_BYTES_PER_ELEMENT: dict[DType, Fraction] = {
    DType.FP64: Fraction(8),
    DType.FP32: Fraction(4),
    DType.TF32: Fraction(4),
    DType.BF16: Fraction(2),
    DType.FP16: Fraction(2),
    DType.FP8: Fraction(1),
    DType.INT8: Fraction(1),
    DType.INT4: Fraction(1, 2),
    DType.FP4: Fraction(1, 2),
}

INTEGER_DTYPES: frozenset[DType] = frozenset({DType.INT8, DType.INT4})


def bytes_per_element(dtype: DType) -> Fraction:
    """Storage bytes of one element of ``dtype`` (int4 packs two elements per byte) [B]."""
    return _BYTES_PER_ELEMENT[dtype]


def tensor_bytes(num_elements: int, dtype: DType) -> int:
    """Bytes to store ``num_elements`` of ``dtype``, rounded up to whole bytes [B]."""
    if num_elements < 0:
        raise ValueError("num_elements must be >= 0")
    size = num_elements * _BYTES_PER_ELEMENT[dtype]
    return -(-size.numerator // size.denominator)


class Precision(StrEnum):
    """A precision convention (see :data:`CONVENTIONS`)."""

    FP32 = "fp32"
    TF32 = "tf32"
    BF16 = "bf16"  # pure bf16: everything in 2 bytes
    FP16 = "fp16"
    AMP_BF16 = "amp_bf16"  # PyTorch autocast: fp32 weights/grads, bf16 compute
    AMP_FP16 = "amp_fp16"
    MIXED_BF16 = "mixed_bf16"  # ZeRO / Megatron: bf16 weights/grads + fp32 master and moments
    MIXED_FP16 = "mixed_fp16"
    FP8 = "fp8"  # W8A8 fp8 (TensorRT / Transformer Engine)
    INT8 = "int8"  # W8A8 int8 (MLPerf: TensorRT, OpenVINO, IPEX)
    INT8_WEIGHT_ONLY = "int8_weight_only"  # W8A16 (bitsandbytes LLM.int8, torchao)
    INT4 = "int4"  # W4A16 weight-only (GPTQ / AWQ)
    FP4 = "fp4"  # NVFP4 W4A4 (Blackwell: TensorRT-LLM, TensorRT Model Optimizer)


class Quantization(StrEnum):
    """What a quantized convention converts."""

    NONE = "none"
    WEIGHT_ONLY = "weight_only"  # matmul/conv weights; activations and math stay 16-bit
    W8A8 = "w8a8"  # weights and activations 8-bit, 8-bit math
    W4A4 = "w4a4"  # weights and GEMM inputs 4-bit, 4-bit math


class ScaleLayout(StrEnum):
    """The quantization scales stored beside quantized weights."""

    NONE = "none"
    PER_TENSOR_FP32 = "per_tensor_fp32"  # one fp32 scale per weight tensor
    PER_CHANNEL_FP16 = "per_channel_fp16"  # one fp16 scale per output channel
    GROUP_FP16_SCALE_ZERO = "group_fp16_scale_zero"  # fp16 scale + zero per group of weights
    BLOCK16_FP8 = "block16_fp8"  # NVFP4: an fp8 (E4M3) scale per 16 elements + fp32 per tensor


QUANTIZATION_GROUP = 128  # elements per group of GROUP_FP16_SCALE_ZERO (GPTQ/AWQ default)
NVFP4_BLOCK = 16  # elements per fp8 scale of BLOCK16_FP8


@dataclass(frozen=True, slots=True, kw_only=True)
class PrecisionConvention:
    """One row of the precision table.

    ``weight_dtype`` is the storage of quantizable (matmul/conv) weights; under quantization
    the other weights (embeddings, norms, biases, the output head) are ``other_weight_dtype``.
    ``compute_dtypes`` lists the peaks the math can run at, the first one a device has wins.
    Training fields are None for inference-only conventions.
    """

    precision: Precision
    weight_dtype: DType
    other_weight_dtype: DType
    activation_dtype: DType
    kv_cache_dtype: DType
    compute_dtypes: tuple[DType, ...]
    quantization: Quantization
    scales: ScaleLayout
    grad_dtype: DType | None
    master_weight_dtype: DType | None  # a separate fp32 copy (ZeRO / Megatron)
    optimizer_state_dtype: DType | None
    weight_cache_dtype: DType | None  # autocast's cached low-precision copy of the weights
    description: str

    @property
    def trainable(self) -> bool:
        """Whether the convention has gradients (training is possible)."""
        return self.grad_dtype is not None

    @property
    def quantized(self) -> bool:
        """Whether matmul/conv weights are stored quantized."""
        return self.quantization is not Quantization.NONE


def _row(
    precision: Precision,
    *,
    weight: DType,
    activation: DType,
    compute: tuple[DType, ...],
    description: str,
    other_weight: DType | None = None,
    kv_cache: DType | None = None,
    quantization: Quantization = Quantization.NONE,
    scales: ScaleLayout = ScaleLayout.NONE,
    grad: DType | None = None,
    master: DType | None = None,
    state: DType | None = None,
    cache: DType | None = None,
) -> PrecisionConvention:
    return PrecisionConvention(
        precision=precision,
        weight_dtype=weight,
        other_weight_dtype=other_weight or weight,
        activation_dtype=activation,
        kv_cache_dtype=kv_cache or activation,
        compute_dtypes=compute,
        quantization=quantization,
        scales=scales,
        grad_dtype=grad,
        master_weight_dtype=master,
        optimizer_state_dtype=state,
        weight_cache_dtype=cache,
        description=description,
    )


_P, _D, _Q = Precision, DType, Quantization
CONVENTIONS: Mapping[Precision, PrecisionConvention] = {
    row.precision: row
    for row in (
        _row(_P.FP32, weight=_D.FP32, activation=_D.FP32, compute=(_D.FP32,), grad=_D.FP32,
             state=_D.FP32, description="fp32 weights, gradients, optimizer state, activations "
             "and math (no tensor cores / AMX)"),
        _row(_P.TF32, weight=_D.FP32, activation=_D.FP32, compute=(_D.TF32,), grad=_D.FP32,
             state=_D.FP32, description="tf32 tensor-core math on fp32 storage: same bytes as "
             "fp32"),
        _row(_P.BF16, weight=_D.BF16, activation=_D.BF16, compute=(_D.BF16,), grad=_D.BF16,
             state=_D.BF16, description="pure bf16: weights, gradients, optimizer state, "
             "activations, KV cache and math all bf16 (PyTorch keeps optimizer state in the "
             "parameter dtype)"),
        _row(_P.FP16, weight=_D.FP16, activation=_D.FP16, compute=(_D.FP16,), grad=_D.FP16,
             state=_D.FP16, description="pure fp16: everything 2 bytes, fp16 math"),
        _row(_P.AMP_BF16, weight=_D.FP32, activation=_D.BF16, compute=(_D.BF16,), grad=_D.FP32,
             state=_D.FP32, cache=_D.BF16, description="PyTorch autocast (bf16): fp32 weights, "
             "gradients and optimizer state, a cached bf16 copy of the weights during "
             "forward/backward, activations mostly bf16, bf16 math"),
        _row(_P.AMP_FP16, weight=_D.FP32, activation=_D.FP16, compute=(_D.FP16,), grad=_D.FP32,
             state=_D.FP32, cache=_D.FP16, description="PyTorch autocast (fp16) with "
             "GradScaler: fp32 weights and gradients, a cached fp16 weight copy, activations "
             "mostly fp16, fp16 math"),
        _row(_P.MIXED_BF16, weight=_D.BF16, activation=_D.BF16, compute=(_D.BF16,),
             grad=_D.BF16, master=_D.FP32, state=_D.FP32, description="ZeRO/Megatron mixed "
             "precision: bf16 weights and gradients, fp32 master weights and fp32 optimizer "
             "moments (2 + 2 + 4 + 8 = 16 B/param with Adam)"),
        _row(_P.MIXED_FP16, weight=_D.FP16, activation=_D.FP16, compute=(_D.FP16,),
             grad=_D.FP16, master=_D.FP32, state=_D.FP32, description="ZeRO/Megatron mixed "
             "precision: fp16 weights and gradients, fp32 master weights and moments "
             "(16 B/param with Adam)"),
        _row(_P.FP8, weight=_D.FP8, other_weight=_D.BF16, activation=_D.FP8,
             compute=(_D.FP8,), quantization=_Q.W8A8, scales=ScaleLayout.PER_TENSOR_FP32,
             description="fp8 W8A8 inference (TensorRT / Transformer Engine): matmul/conv "
             "weights, activations and KV cache 1 byte with per-tensor fp32 scales, other "
             "weights bf16, fp8 tensor-core math"),
        _row(_P.INT8, weight=_D.INT8, other_weight=_D.FP16, activation=_D.INT8,
             compute=(_D.INT8,), quantization=_Q.W8A8, scales=ScaleLayout.PER_CHANNEL_FP16,
             description="int8 W8A8 inference as in MLPerf (TensorRT, OpenVINO, IPEX): "
             "matmul/conv weights (one fp16 scale per output channel), activations and KV cache "
             "1 byte, other weights fp16, int8 math (tensor cores; VNNI or AMX on CPUs)"),
        _row(_P.INT8_WEIGHT_ONLY, weight=_D.INT8, other_weight=_D.FP16, activation=_D.FP16,
             compute=(_D.FP16, _D.BF16), quantization=_Q.WEIGHT_ONLY,
             scales=ScaleLayout.PER_CHANNEL_FP16, description="int8 weight-only inference "
             "(W8A16: bitsandbytes, torchao): matmul/conv weights 1 byte with one fp16 scale "
             "per output channel, other weights, activations and KV cache fp16, math at the "
             "fp16 (else bf16) peak after dequantization"),
        _row(_P.INT4, weight=_D.INT4, other_weight=_D.FP16, activation=_D.FP16,
             compute=(_D.FP16, _D.BF16), quantization=_Q.WEIGHT_ONLY,
             scales=ScaleLayout.GROUP_FP16_SCALE_ZERO, description="int4 weight-only "
             f"inference (W4A16: GPTQ/AWQ): matmul/conv weights 4 bits with an fp16 scale and "
             f"zero point per group of {QUANTIZATION_GROUP}, other weights, activations and KV "
             "cache fp16, math at the fp16 (else bf16) peak after dequantization"),
        _row(_P.FP4, weight=_D.FP4, other_weight=_D.BF16, activation=_D.BF16, kv_cache=_D.FP8,
             compute=(_D.FP4,), quantization=_Q.W4A4, scales=ScaleLayout.BLOCK16_FP8,
             description=f"NVFP4 W4A4 inference (Blackwell; TensorRT-LLM, TensorRT Model "
             f"Optimizer): matmul/conv weights 4-bit E2M1 with an fp8 (E4M3) scale per "
             f"{NVFP4_BLOCK} elements and an fp32 scale per tensor, GEMM inputs quantized to "
             f"4 bits inside the kernel before them, so activations between kernels stay bf16 "
             f"(the residual stream, GEMM outputs), KV cache fp8, other weights bf16, fp4 "
             f"tensor-core math"),
    )
}  # fmt: skip


def convention(precision: Precision) -> PrecisionConvention:
    """The row of the precision table for ``precision``."""
    return CONVENTIONS[precision]


def scale_bytes(precision: Precision, shape: tuple[int, ...]) -> Fraction:
    """Bytes of the quantization scales stored beside one quantized weight of ``shape``
    (the byte rules of :mod:`app.domain.quantization`, which the serving engines' quantized
    weights share)."""
    layout = CONVENTIONS[precision].scales
    if layout is ScaleLayout.PER_TENSOR_FP32:
        return Fraction(4)
    if layout is ScaleLayout.PER_CHANNEL_FP16:
        return Fraction(channel_scale_bytes(shape[0], 2))
    numel = 1
    for dim in shape:
        numel *= dim
    if layout is ScaleLayout.GROUP_FP16_SCALE_ZERO:
        # an fp16 scale and an fp16 zero point per group of QUANTIZATION_GROUP elements
        return Fraction(2 * block_scale_bytes(numel, QUANTIZATION_GROUP, 2))
    if layout is ScaleLayout.BLOCK16_FP8:
        return Fraction(block_scale_bytes(numel, NVFP4_BLOCK, 1) + 4)
    return Fraction(0)


@dataclass(frozen=True, slots=True, order=True)
class ComputeCapability:
    """A CUDA GPU's compute capability, ``major.minor`` (``sm<major><minor>``): 7.0 V100, 7.5
    T4, 8.0 A100/A30, 8.6 A10, 8.7 Jetson Orin, 8.9 L4/L40S, 9.0 H100/H200, 10.0 B200, 12.0
    RTX PRO 6000 Blackwell (NVIDIA, "CUDA GPUs - Compute Capability",
    https://developer.nvidia.com/cuda-gpus)."""

    major: int
    minor: int

    def __post_init__(self) -> None:
        for name, value, high in (("major", self.major, 99), ("minor", self.minor, 9)):
            if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= high:
                raise ValueError(f"compute capability {name} must be an integer 0-{high}")
        if self.major < 1:
            raise ValueError("compute capability major must be >= 1")

    @classmethod
    def parse(cls, text: str) -> ComputeCapability:
        """``"8.0"`` -> 8.0 (ValueError when it is not ``<major>.<minor>``)."""
        major, dot, minor = text.partition(".")
        if not dot or not major.isdigit() or not minor.isdigit() or len(minor) != 1:
            raise ValueError(f"compute capability must look like '8.0', got {text!r}")
        return cls(int(major), int(minor))

    @property
    def sm(self) -> str:
        """The architecture name CUDA and PyTorch use, ``sm80``."""
        return f"sm{self.major}{self.minor}"

    def __str__(self) -> str:
        return f"{self.major}.{self.minor}"


# The lowest compute capability whose hardware computes in a dtype (tensor cores; bf16 and tf32
# arrived with Ampere, fp8 with Ada/Hopper, fp4 with Blackwell): NVIDIA CUDA C++ Programming
# Guide, "Compute Capabilities" / "Warp Matrix Functions" (wmma element types per architecture).
# Dtypes not listed run on every CUDA GPU the catalog knows (fp32, fp16, and int8 through DP4A
# where there are no int8 tensor cores; the peak table says how fast).
MIN_COMPUTE_CAPABILITY: Mapping[DType, ComputeCapability] = {
    DType.BF16: ComputeCapability(8, 0),
    DType.TF32: ComputeCapability(8, 0),
    DType.FP8: ComputeCapability(8, 9),
    DType.FP4: ComputeCapability(10, 0),
}


def unsupported_dtype(precision: Precision, capability: ComputeCapability) -> DType | None:
    """The dtype of ``precision`` a GPU of ``capability`` cannot compute in, or None when it
    runs the precision: its activation dtype (what the math reads) and one of its compute
    dtypes must be at or above their :data:`MIN_COMPUTE_CAPABILITY`."""
    row = CONVENTIONS[precision]

    def runs(dtype: DType) -> bool:
        lowest = MIN_COMPUTE_CAPABILITY.get(dtype)
        return lowest is None or capability >= lowest

    if not runs(row.activation_dtype):
        return row.activation_dtype
    if not any(runs(dtype) for dtype in row.compute_dtypes):
        return row.compute_dtypes[0]
    return None


def cannot_run(
    precision: Precision,
    *,
    compute_capability: ComputeCapability | None,
    peak_dtypes: Collection[str],
) -> str | None:
    """Why a device cannot run ``precision``, or None when it can: its compute capability has
    no hardware for one of the precision's dtypes (:func:`unsupported_dtype`), or its peak
    table lists none of the precision's compute dtypes (the roofline's rule). ``peak_dtypes``
    are the dtype names of the device's dense peak table."""
    if compute_capability is not None:
        missing = unsupported_dtype(precision, compute_capability)
        if missing is not None:
            lowest = MIN_COMPUTE_CAPABILITY[missing]
            return (
                f"compute capability {compute_capability} has no {missing.value} "
                f"(it needs {lowest}+)"
            )
    wanted = CONVENTIONS[precision].compute_dtypes
    if not any(dtype.value in peak_dtypes for dtype in wanted):
        return f"no {' or '.join(d.value for d in wanted)} peak in its profile"
    return None
