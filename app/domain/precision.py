"""Numeric data types and their storage size."""

from __future__ import annotations

from enum import StrEnum
from fractions import Fraction


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
