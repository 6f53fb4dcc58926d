"""A pre-quantized checkpoint's weights as it stores them (GPTQ/AWQ W4A16, compressed-tensors,
FP8, MXFP4), and which precisions it can run at.

A stored model that keeps its checkpoint's ``quantization_config`` (read into a
:class:`~app.domain.quantization.CheckpointLayout`) is not priced at the request's precision:
its quantized linears weigh what the checkpoint stores (packed values, scales, zero points,
``g_idx``: :func:`app.domain.quantization.stored_matrix_bytes`), everything else (embeddings,
the output head, norms, biases, MoE routers) is in the unquantized dtype.

Which matrices are quantized: the 2-D weights of the graph's ``linear``, ``attention``, ``mlp``
and ``moe`` layers, except the output head (the last layer with parameters) and a MoE layer's
router (its first weight), as vLLM 0.19.0 quantizes ``LinearBase`` layers and ``FusedMoE``
experts only and keeps ``VocabParallelEmbedding``/``ParallelLMHead`` and the router unquantized
(:mod:`app.domain.engines.quantization`); an experts-only format (MXFP4) quantizes the MoE
experts alone. Pure stdlib; bytes are integers [B].
"""

from __future__ import annotations

import math
from collections.abc import Collection

from app.domain.graph.analysis import GraphAnalysis, LayerAnalysis
from app.domain.peft.qlora import linear4bit_tensors
from app.domain.precision import Precision, bytes_per_element, convention
from app.domain.quantization import CheckpointLayout, stored_matrix_bytes
from app.domain.workload import Mode, WorkloadInputError

# vLLM 0.19.0: LinearBase layers and FusedMoE experts ask the quantization config for a method
# (vllm/model_executor/layers/quantization/*.py get_quant_method); the graph's ops holding them.
CHECKPOINT_QUANTIZED_OPS = frozenset({"linear", "attention", "mlp", "moe"})
# Names of the output head in quantization configs' ignore lists (HF / vLLM module names).
HEAD_NAMES = ("lm_head",)


class CheckpointError(WorkloadInputError):
    """A request a pre-quantized checkpoint contradicts; ``field`` names the request's option
    (``precision``, ``mode``)."""

    def __init__(self, message: str, *, field: str) -> None:
        super().__init__(message)
        self.field = field


def _quantized_precision(layout: CheckpointLayout) -> Precision | None:
    """The quantized precision of the table that names the checkpoint's own format."""
    if layout.layout == "packed":
        return Precision.INT4 if layout.weight_bits == 4 else Precision.INT8_WEIGHT_ONLY
    if layout.layout == "int8":
        return Precision.INT8
    if layout.layout == "fp8":
        return Precision.FP8
    return None  # mxfp4: no row of the precision table is MXFP4 (fp4 is NVFP4 W4A4)


def allowed_precisions(layout: CheckpointLayout) -> tuple[Precision, ...]:
    """The precisions a checkpoint of ``layout`` runs at: the 16-bit dtypes it is loaded in
    (bf16, fp16: its activations and unquantized weights) and the precision table's row of its
    own format (int4 for 4-bit GPTQ/AWQ/WNA16, int8_weight_only for 8-bit ones, int8 for W8A8
    int8, fp8 for FP8)."""
    own = _quantized_precision(layout)
    return (Precision.BF16, Precision.FP16) + ((own,) if own is not None else ())


def checkpoint_precision(
    layout: CheckpointLayout, torch_dtype: str | None
) -> tuple[Precision, str]:
    """The precision of an estimate that gives none, and why: the checkpoint's ``torch_dtype``
    (bfloat16 -> bf16, float16 -> fp16); float32 or unstated: fp16 for packed-integer formats
    (transformers 4.5x ``GptqHfQuantizer`` / ``AwqQuantizer.update_torch_dtype`` load them in
    float16), else bf16 (vLLM 0.19's ``--dtype auto`` casts float32 to bfloat16)."""
    if torch_dtype == "bfloat16":
        return Precision.BF16, "the checkpoint's torch_dtype bfloat16 (its activations and "
        "unquantized weights)"
    if torch_dtype == "float16":
        return Precision.FP16, "the checkpoint's torch_dtype float16 (its activations and "
        "unquantized weights)"
    stated = f"torch_dtype {torch_dtype}" if torch_dtype else "no torch_dtype"
    if layout.layout == "packed":
        return Precision.FP16, (
            f"the checkpoint states {stated}: transformers loads a {layout.method} checkpoint "
            "in float16 (its quantizer's update_torch_dtype)"
        )
    return Precision.BF16, (
        f"the checkpoint states {stated}: bfloat16, as vLLM's --dtype auto casts float32"
    )


def check_checkpoint(
    layout: CheckpointLayout, precision: Precision, mode: Mode, *, qlora: bool = False
) -> None:
    """Refuse what a pre-quantized checkpoint contradicts.

    Raises
    ------
    CheckpointError
        ``precision`` stores the weights otherwise (e.g. int4 of an fp8 checkpoint, fp32 or an
        autocast / master-weight training precision of a GPTQ one: field ``precision``), or
        ``mode`` is training: quantized weights have no gradients, and the service models
        fine-tuning a quantized base only as QLoRA (``lora.qlora``: bitsandbytes 4-bit from the
        16-bit checkpoint), not adapters on a GPTQ/AWQ/FP8 checkpoint (field ``mode``). QLoRA
        training (``qlora``) of a saved bitsandbytes 4-bit checkpoint is allowed: the QLoRA
        rules price its base.
    """
    if mode is Mode.TRAINING and qlora and layout.layout == "bnb4":
        return  # QLoRA on a saved bitsandbytes 4-bit base: the QLoRA rules price it
    allowed = allowed_precisions(layout)
    if precision not in allowed:
        raise CheckpointError(
            f"precision '{precision.value}' contradicts the model's {layout.method} checkpoint "
            f"({layout.description}): its weights are stored quantized; use one of "
            f"{', '.join(p.value for p in allowed)}",
            field="precision",
        )
    if mode is Mode.TRAINING:
        raise CheckpointError(
            f"the model is a pre-quantized {layout.method} checkpoint: its quantized weights "
            "have no gradients, so it cannot be trained; fine-tuning a quantized base is "
            "modelled as QLoRA only (lora.qlora: a bitsandbytes 4-bit base, from a saved "
            "bitsandbytes checkpoint or quantized from the 16-bit one)",
            field="mode",
        )


def _head_index(analysis: GraphAnalysis) -> int:
    return max((i for i, layer in enumerate(analysis.layers) if layer.result.params), default=-1)


def _quantized_indices(layer: LayerAnalysis, layout: CheckpointLayout, head: bool) -> list[int]:
    """Which of the layer's weights (by index in ``param_shapes``) the checkpoint quantizes."""
    if head or layer.op not in CHECKPOINT_QUANTIZED_OPS:
        return []
    if layout.experts_only and layer.op != "moe":
        return []
    # the router stays (vLLM's ReplicatedLinear(quant_config=None)); bitsandbytes converts
    # every nn.Linear but the head, the router too (transformers replace_with_bnb_linear)
    router = layer.op == "moe" and layout.layout != "bnb4"
    return [
        index
        for index, shape in enumerate(layer.result.param_shapes)
        if len(shape) == 2 and not (router and index == 0)
    ]


def _matrix_tensors(layout: CheckpointLayout, k: int, n: int, dtype_bytes: int) -> list[int]:
    """The tensors one quantized ``K x N`` linear stores, its values first [B each]."""
    if layout.layout == "bnb4":
        return linear4bit_tensors(k, n, double_quant=layout.double_quant)
    stored = stored_matrix_bytes(layout, k, n, dtype_bytes)
    rest = (stored.scale_bytes, stored.zero_point_bytes, stored.g_idx_bytes)
    return [stored.packed_bytes, *(size for size in rest if size)]


def _quantized_shapes(
    layer: LayerAnalysis, layout: CheckpointLayout, head: bool
) -> tuple[list[tuple[int, int]], int]:
    """The layer's quantized ``(N, K)`` weights and its other parameter elements."""
    shapes = layer.result.param_shapes
    picked = set(_quantized_indices(layer, layout, head))
    quantized = [(shapes[i][0], shapes[i][1]) for i in sorted(picked)]
    other = sum(math.prod(s) for i, s in enumerate(shapes) if i not in picked)
    return quantized, other


def checkpoint_weights_bytes(
    analysis: GraphAnalysis,
    layout: CheckpointLayout,
    dtype_bytes: int,
    only: Collection[int] | None = None,
) -> tuple[int, tuple[str, ...]]:
    """The checkpoint's weights as stored (the layers ``only``, a pipeline stage's; None:
    all) [B], with notes saying what is quantized, at how many bytes per element, from where.

    Parameters
    ----------
    analysis : GraphAnalysis
        The model's graph.
    layout : CheckpointLayout
        How the checkpoint stores its quantized linears.
    dtype_bytes : int
        Bytes of the unquantized dtype (the rest, and params-dtype scales) [B].

    Notes
    -----
    ``sum over quantized linears of stored_matrix_bytes(K, N) + other params x dtype_bytes``.
    """
    head = _head_index(analysis)
    memo: dict[int, tuple[int, int, int, int, int]] = {}
    stored = values = scales = numel = other = linears = 0
    for index, layer in enumerate(analysis.layers):
        if only is not None and index not in only:
            continue
        key = id(layer.result) * 2 + (index == head)
        if key not in memo:
            shapes, rest = _quantized_shapes(layer, layout, index == head)
            parts = [_matrix_tensors(layout, k, n, dtype_bytes) for n, k in shapes]
            memo[key] = (
                sum(sum(p) for p in parts),
                sum(p[0] for p in parts),
                sum(n * k for n, k in shapes),
                rest,
                len(shapes),
            )
        total, packed, count, rest, matrices = memo[key]
        stored += total
        values += packed
        scales += total - packed
        numel += count
        other += rest
        linears += matrices
    weights = stored + other * dtype_bytes
    if only is not None:
        return weights, ()
    per_element = f"{stored / numel:.4f}" if numel else "0"
    notes = [
        f"pre-quantized checkpoint ({layout.description}; source: the model's "
        "quantization_config, read as vLLM 0.19.0 reads it): weights priced as stored, not at "
        "the request's precision",
        f"{linears:,} linear weights quantized ({numel:,} of {analysis.params:,} parameters: "
        + ("MoE expert" if layout.experts_only else "attention, MLP and MoE expert")
        + f" projections): {values:,} B of values + {scales:,} B of scales (and zero points, "
        f"g_idx where the format stores them) = {per_element} B per element",
        f"not quantized, at {dtype_bytes} B per element: embeddings, the output head, norms, "
        "biases and MoE routers"
        + (
            " (and every non-expert linear: the format quantizes experts only)"
            if layout.experts_only
            else ""
        )
        + f", {other:,} parameters",
    ]
    unmatched = [e for e in layout.ignore if not any(h in e for h in HEAD_NAMES)]
    if unmatched:
        notes.append(
            "the config's modules kept unquantized are not matched to the graph's layers "
            f"(only the output head is kept 16-bit): {', '.join(unmatched[:4])}"
        )
    return weights, tuple(notes)


def checkpoint_weight_tensors(
    analysis: GraphAnalysis, layout: CheckpointLayout, dtype_bytes: int
) -> list[list[int]]:
    """Per layer, the checkpoint's tensors as the allocator sees them [B]: each quantized
    linear's stored tensors (:class:`~app.domain.quantization.StoredMatrix`), every other
    parameter at ``dtype_bytes``, the layer's buffers."""
    head = _head_index(analysis)
    tensors: list[list[int]] = []
    for index, layer in enumerate(analysis.layers):
        picked = set(_quantized_indices(layer, layout, index == head))
        sizes: list[int] = []
        for i, shape in enumerate(layer.result.param_shapes):
            if i in picked:
                sizes += _matrix_tensors(layout, shape[1], shape[0], dtype_bytes)
            else:
                sizes.append(math.prod(shape) * dtype_bytes)
        if layer.result.buffers_bytes:
            sizes.append(layer.result.buffers_bytes)
        tensors.append(sizes)
    return tensors


def unquantized_dtype_bytes(precision: Precision) -> int:
    """Bytes per element of the checkpoint's unquantized weights under ``precision`` (one of
    :func:`allowed_precisions`): its other-weights dtype (bf16 / fp16) [B]."""
    return int(bytes_per_element(convention(precision).other_weight_dtype))


__all__ = [
    "CHECKPOINT_QUANTIZED_OPS",
    "CheckpointError",
    "allowed_precisions",
    "check_checkpoint",
    "checkpoint_precision",
    "checkpoint_weight_tensors",
    "checkpoint_weights_bytes",
    "unquantized_dtype_bytes",
]
