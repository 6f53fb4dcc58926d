"""The precision table of the roofline model: what each API precision stores, computes and
assumes (pure)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from fractions import Fraction

from app.domain.hardware import HardwareSpec
from app.domain.precision import (
    CONVENTIONS,
    DType,
    Precision,
    PrecisionConvention,
    Quantization,
    bytes_per_element,
)


@dataclass(frozen=True, slots=True, kw_only=True)
class PrecisionScheme:
    """The roofline's view of a precision convention (one row of
    :data:`app.domain.precision.CONVENTIONS`): bytes per weight, per activation and per KV-cache
    element, and which peaks the math can run at (the first the device has wins).

    Every weight a kernel reads is priced at ``weight_bytes`` (the quantized matmul/conv
    storage for quantized conventions; scales and 16-bit embeddings or heads are not added).
    The training-only conventions run inference as their forward does: ``amp_*`` reads the
    fp32 weights (autocast's cast copy is not priced) with 16-bit activations and math;
    ``mixed_*`` is its 16-bit weights and activations (the fp32 master copy is not read).
    """

    precision: Precision
    compute_dtypes: tuple[DType, ...]
    weight_bytes: Fraction
    activation_bytes: int  # activations, model inputs/outputs (floats)
    kv_cache_bytes: int
    quantization: Quantization
    weight_dtype: DType
    activation_dtype: DType
    kv_cache_dtype: DType
    convention: str
    inference_note: str = ""  # training conventions: what their forward reads at inference

    @property
    def assumption(self) -> str:
        """The convention in the roofline's numbers (what a prediction at it assumes)."""
        weight_bits = int(self.weight_bytes * 8)
        activation_bits = self.activation_bytes * 8
        kind = {
            Quantization.NONE: "not quantized",
            Quantization.WEIGHT_ONLY: f"weight-only W{weight_bits}A{activation_bits} (weights "
            f"dequantized to {self.activation_dtype.value} before the math)",
            Quantization.W8A8: f"W{weight_bits}A{activation_bits} (weights and activations "
            "8-bit, 8-bit math)",
            Quantization.W4A4: "W4A4 (weights and GEMM inputs 4-bit, 4-bit math; "
            f"activations between kernels {self.activation_dtype.value})",
        }[self.quantization]
        peaks = " else ".join(d.value for d in self.compute_dtypes)
        return (
            f"{self.precision.value}: {kind}; every weight read at "
            f"{float(self.weight_bytes):g} B ({self.weight_dtype.value}), activations at "
            f"{self.activation_bytes} B ({self.activation_dtype.value}), KV cache at "
            f"{self.kv_cache_bytes} B ({self.kv_cache_dtype.value}); math at the device's "
            f"{peaks} peak{self.inference_note}"
        )


def _inference_note(row: PrecisionConvention) -> str:
    """How a training-only convention runs inference (empty for the others)."""
    if row.weight_cache_dtype is not None:
        return (
            f" (autocast at inference: the stored {row.weight_dtype.value} weights are read, "
            f"the {row.weight_cache_dtype.value} copy autocast casts them to is not priced)"
        )
    if row.master_weight_dtype is not None:
        return (
            f" (at inference only the {row.weight_dtype.value} weights are read; the "
            f"{row.master_weight_dtype.value} master copy is training state)"
        )
    return ""


PRECISION_SCHEMES: Mapping[Precision, PrecisionScheme] = {
    precision: PrecisionScheme(
        precision=precision,
        compute_dtypes=row.compute_dtypes,
        weight_bytes=bytes_per_element(row.weight_dtype),
        activation_bytes=int(bytes_per_element(row.activation_dtype)),
        kv_cache_bytes=int(bytes_per_element(row.kv_cache_dtype)),
        quantization=row.quantization,
        weight_dtype=row.weight_dtype,
        activation_dtype=row.activation_dtype,
        kv_cache_dtype=row.kv_cache_dtype,
        convention=row.description,
        inference_note=_inference_note(row),
    )
    for precision, row in CONVENTIONS.items()
}


def compute_dtype_for(device: HardwareSpec, scheme: PrecisionScheme) -> DType | None:
    """The dtype whose peak runs the precision's math on ``device``, or None."""
    return next((d for d in scheme.compute_dtypes if device.peak_flops_per_s.get(d)), None)
