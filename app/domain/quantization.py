"""How quantized weights are stored: the byte rules every quantized format shares.

One home for the storage of a quantized weight matrix of ``in_features`` (K, the reduction
dimension) x ``out_features`` (N) and the tensors beside it. The precision table
(:func:`app.domain.precision.scale_bytes`) and the serving-engine weights
(:mod:`app.domain.engines.quantization`, vLLM's ``--quantization`` schemes) both price with these
functions; neither defines bytes of packed values, scales or zero points itself.

Layouts (sources: vLLM 0.19.0 ``vllm/model_executor/layers/quantization/*.py``, quoted where each
rule is used):

- packed integers: ``32 // bits`` values of ``bits`` bits in an int32 (GPTQ packs along K, AWQ
  along N; the bytes are the same): ``K x N x bits / 8``.
- group scales: one scale per group of ``group_size`` consecutive K values and output column:
  ``ceil(K / group_size) x N x scale_bytes`` (``group_size = -1``: one group, a per-channel scale).
- packed zero points: as group scales, each zero packed in ``bits`` bits: ``groups x N x bits/8``.
- per-tensor and per-channel scales: ``scale_bytes`` once, or once per output column.
- microscaling blocks (OCP MX, e.g. MXFP4): one shared scale of ``scale_bytes`` per ``block``
  consecutive values.

Pure stdlib; bytes are integers [B].
"""

from __future__ import annotations

INT32_BITS = 32  # GPTQ/AWQ pack their integers into int32 words (pack_factor = 32 // bits)


def _groups(in_features: int, group_size: int) -> int:
    if group_size == -1:
        return 1
    if group_size < 1:
        raise ValueError(f"group_size must be >= 1 or -1, got {group_size}")
    return -(-in_features // group_size)


def packed_weight_bytes(in_features: int, out_features: int, bits: int) -> int:
    """Bytes of a ``K x N`` matrix of ``bits``-bit integers packed into int32 words [B].

    ``K x N x bits / 8``, rounded up to whole int32 words (vLLM's ``qweight`` of
    ``K // pack_factor x N`` int32 for GPTQ, ``K x N // pack_factor`` for AWQ, with
    ``pack_factor = 32 // bits``; 3-bit GPTQ packs ``Fraction(32, 3)`` values per word)."""
    if min(in_features, out_features) < 0 or not 1 <= bits <= INT32_BITS:
        raise ValueError("features must be >= 0 and bits in 1..32")
    words = -(-(in_features * out_features * bits) // INT32_BITS)
    return words * 4


def group_scale_bytes(
    in_features: int, out_features: int, group_size: int, scale_bytes: int
) -> int:
    """Scales of one per group of ``group_size`` K values and output column [B]:
    ``ceil(K / group_size) x N x scale_bytes`` (``group_size=-1``: one scale per column)."""
    return _groups(in_features, group_size) * out_features * scale_bytes


def group_zero_bytes(in_features: int, out_features: int, group_size: int, zero_bits: int) -> int:
    """Zero points of one per group and output column, each ``zero_bits`` wide, packed into int32
    words along N [B] (vLLM's ``qzeros`` of ``groups x N // pack_factor`` int32; a 16-bit
    floating zero point is ``zero_bits=16``)."""
    groups = _groups(in_features, group_size)
    return -(-(groups * out_features * zero_bits) // INT32_BITS) * 4


def channel_scale_bytes(out_features: int, scale_bytes: int) -> int:
    """One scale per output channel [B]."""
    return out_features * scale_bytes


def block_scale_bytes(num_elements: int, block: int, scale_bytes: int) -> int:
    """One shared scale of ``scale_bytes`` per ``block`` consecutive values [B]
    (MXFP4: 1-byte E8M0 per 32 values; NVFP4: 1-byte E4M3 per 16)."""
    if block < 1:
        raise ValueError("block must be >= 1")
    return -(-num_elements // block) * scale_bytes


__all__ = [
    "INT32_BITS",
    "block_scale_bytes",
    "channel_scale_bytes",
    "group_scale_bytes",
    "group_zero_bytes",
    "packed_weight_bytes",
]
