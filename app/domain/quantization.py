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

from dataclasses import dataclass

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


@dataclass(frozen=True, slots=True, kw_only=True)
class CheckpointLayout:
    """How a pre-quantized checkpoint stores each quantized linear of ``K`` inputs x ``N``
    outputs (its ``quantization_config`` read by
    :func:`app.domain.engines.quant_schemes.checkpoint_layout`).

    ``layout``: ``packed`` (GPTQ/AWQ/WNA16 integers in int32 words), ``fp8``, ``int8``,
    ``mxfp4`` or ``bnb4`` (bitsandbytes ``Linear4bit``, priced by
    :func:`app.domain.peft.qlora.linear4bit_tensors`; ``double_quant`` its nested absmax);
    ``scales``: ``tensor``, ``channel``, ``group`` or ``block`` (``block``: ``(block_n,
    block_k)`` values per scale); ``scale_bytes`` None: the checkpoint's params dtype
    (GPTQ/AWQ scales); ``zero_points``/``g_idx``: the packed zero points and the K int32
    act-order indices it stores; ``ignore``: the modules the config keeps unquantized;
    ``static_input_scale``: one fp32 input scale per linear;
    ``experts_only``: only MoE experts are quantized (MXFP4). ``description`` names the format.
    """

    method: str
    layout: str
    weight_bits: int
    scales: str
    group_size: int = -1
    block: tuple[int, int] | None = None
    scale_bytes: int | None = None
    zero_points: bool = False
    g_idx: bool = False
    static_input_scale: bool = False
    experts_only: bool = False
    double_quant: bool = False
    ignore: tuple[str, ...] = ()
    description: str = ""


@dataclass(frozen=True, slots=True)
class StoredMatrix:
    """The tensors a checkpoint stores for one quantized linear [B]."""

    packed_bytes: int
    scale_bytes: int
    zero_point_bytes: int = 0
    g_idx_bytes: int = 0

    @property
    def tensors(self) -> tuple[int, ...]:
        """Each stored tensor's bytes (empty ones left out) [B]."""
        sizes = (self.packed_bytes, self.scale_bytes, self.zero_point_bytes, self.g_idx_bytes)
        return tuple(size for size in sizes if size)

    @property
    def total_bytes(self) -> int:
        return self.packed_bytes + self.scale_bytes + self.zero_point_bytes + self.g_idx_bytes


def stored_matrix_bytes(
    layout: CheckpointLayout, in_features: int, out_features: int, dtype_bytes: int
) -> StoredMatrix:
    """What a checkpoint of ``layout`` stores for one ``K x N`` linear [B]; ``dtype_bytes``:
    the params dtype (of scales whose ``layout.scale_bytes`` is None).

    - packed: :func:`packed_weight_bytes` + :func:`group_scale_bytes` (+ :func:`group_zero_bytes`
      with zero points, + ``K x 4`` B of int32 ``g_idx``);
    - fp8 / int8: ``K x N`` one-byte values + one scale per tensor, per output channel
      (:func:`channel_scale_bytes`) or per ``block_n x block_k`` block (+ one static input scale);
    - mxfp4: ``N x ceil(K / 2)`` bytes of E2M1 pairs + :func:`block_scale_bytes` per row.
    """
    k, n = in_features, out_features
    scale = dtype_bytes if layout.scale_bytes is None else layout.scale_bytes
    if layout.layout == "packed":
        return StoredMatrix(
            packed_weight_bytes(k, n, layout.weight_bits),
            group_scale_bytes(k, n, layout.group_size, scale),
            group_zero_bytes(k, n, layout.group_size, layout.weight_bits)
            if layout.zero_points
            else 0,
            k * INT32_BITS // 8 if layout.g_idx else 0,
        )
    if layout.layout == "mxfp4":
        assert layout.block is not None
        return StoredMatrix(n * -(-k // 2), n * block_scale_bytes(k, layout.block[1], scale))
    if layout.scales == "block":
        assert layout.block is not None
        scales = -(-n // layout.block[0]) * -(-k // layout.block[1]) * scale
    elif layout.scales == "channel":
        scales = channel_scale_bytes(n, scale)
    else:
        scales = scale
    if layout.static_input_scale:
        scales += scale
    return StoredMatrix(k * n, scales)


__all__ = [
    "INT32_BITS",
    "CheckpointLayout",
    "StoredMatrix",
    "block_scale_bytes",
    "channel_scale_bytes",
    "group_scale_bytes",
    "group_zero_bytes",
    "packed_weight_bytes",
    "stored_matrix_bytes",
]
