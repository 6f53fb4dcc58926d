"""vLLM's quantization schemes: which weights are quantized, and what the GPU holds for them.

vLLM's ``--quantization`` (``fp8``, ``gptq``, ``gptq_marlin``, ``awq``, ``awq_marlin``,
``compressed-tensors``, ``mxfp4``) and a checkpoint's ``quantization_config`` (its HF
``config.json`` object) decide how each linear layer of the decoder is stored after loading.
Everything here follows vLLM 0.19.0's layer code (``vllm/model_executor/layers/quantization/``,
each rule citing its file); the bytes come from the shared rules of
:mod:`app.domain.quantization`.

What is quantized (vLLM 0.19.0): only ``LinearBase`` layers (``qkv_proj``, ``o_proj``,
``gate_up_proj``, ``down_proj``) and ``FusedMoE`` experts ask the quantization config for a
method; the embedding and the LM head are ``VocabParallelEmbedding`` / ``ParallelLMHead`` and stay
in the model dtype (unless a GPTQ config sets ``lm_head: true``, not expressed here), as do norms,
biases and the MoE router (``ReplicatedLinear(..., quant_config=None)`` in
``vllm/model_executor/models/mixtral.py``). MXFP4 quantizes only the MoE experts
(``mxfp4.py`` ``Mxfp4Config.get_quant_method``: linear layers fall back to unquantized).

Schemes and what stays on the GPU after ``process_weights_after_loading``, per linear of
``K`` inputs x ``N`` outputs on one rank:

- ``fp8`` without a checkpoint config (runtime quantization of a 16-bit checkpoint,
  ``fp8.py`` ``Fp8OnlineLinearMethod``): the weight in float8_e4m3fn (1 B) and one fp32 scale per
  (fused) module from ``ops.scaled_fp8_quant(weight, scale=None)``; activations are quantized
  per token at run time (no stored input scale).
- ``fp8`` from an fp8 checkpoint (``Fp8LinearMethod``): 1 B weights; per-tensor scales of the
  fused shards requantized to one (``process_fp8_weight_tensor_strategy``:
  ``requantize_with_max_scale``), or one fp32 scale per ``weight_block_size`` block; a static
  input scale (``activation_scheme: static``) is one fp32 after ``.max()``.
- ``fp8`` on a GPU without fp8 math (compute capability below 8.9, e.g. an A100): vLLM's
  first FP8 kernel, ``MarlinFP8ScaledMMLinearKernel``
  (``vllm/model_executor/kernels/linear/scaled_mm/marlin.py``), runs weight-only: the fp8
  weight repacked (same bytes), its scales cast to the params dtype and repeated to one per
  output column (``utils/marlin_utils_fp8.py`` ``prepare_fp8_layer_for_marlin``).
- ``gptq`` (``gptq.py``, exllama kernel): ``qweight`` packed ``bits`` per value, ``scales``
  (params dtype) and packed ``qzeros`` per group of ``group_size``, ``g_idx`` (K int32) kept when
  ``desc_act``; a row-parallel layer with ``desc_act`` keeps the full K's scales and zeros.
- ``gptq_marlin`` (``gptq_marlin.py`` + ``vllm/model_executor/kernels/linear/mixed_precision/
  marlin.py`` ``MarlinLinearKernel.process_weights_after_loading``): ``qweight`` repacked (same
  bytes), scales permuted (same bytes; the full K's on row-parallel layers when ``desc_act``,
  ``marlin_repeat_scales_on_all_ranks``), ``qzeros`` replaced by an empty tensor (symmetric
  only: ``GPTQMarlinConfig.TYPE_MAP``; MoE experts, ``GPTQMarlinMoEMethod``, keep theirs),
  ``g_idx`` sorted plus ``g_idx_sort_indices`` (2 x K int32) when ``desc_act``, else empty. A
  per-layer workspace of one int32 per SM (528 B on an H100's 132 SMs) is left out.
- the same three methods on a Hopper GPU (compute capability 9.0): vLLM's
  ``choose_mp_linear_kernel`` (``vllm/model_executor/kernels/linear/__init__.py``) tries
  ``MacheteLinearKernel`` before ``MarlinLinearKernel``
  (``kernels/linear/mixed_precision/machete.py``). Machete repacks ``qweight`` (same bytes) and
  keeps the scales, but never replaces a GPTQ checkpoint's ``qzeros`` and ``g_idx`` parameters
  (both stay as loaded) and holds the act-order permutation (K int32); zero points it uses are
  pre-multiplied by the scales and held in the params dtype.
- ``awq`` / ``awq_marlin`` (``awq.py``, ``awq_marlin.py``): packed 4-bit ``qweight``, ``scales``
  and packed ``qzeros`` (``zero_point``) per group; no ``g_idx``.
- ``compressed-tensors`` (``compressed_tensors/schemes/``): W8A8 int8
  (``compressed_tensors_w8a8_int8.py``: int8 weight, fp32 scale per channel, or per tensor -
  converted to per channel on a fused module by the CUTLASS kernel,
  ``kernels/linear/scaled_mm/cutlass.py`` ``convert_to_channelwise``), W8A8 / W8A16 FP8
  (``compressed_tensors_w8a8_fp8.py``: fp8 weight, fp32 scale per tensor - one after
  requantization -, per channel or per block), and WNA16 (``compressed_tensors_wNa16.py``: the
  Marlin layout as ``gptq_marlin``, zero points when asymmetric, ``g_idx`` when
  ``actorder: group``).
- ``mxfp4`` (``mxfp4.py`` ``Mxfp4MoEMethod.create_weights``): expert weights as uint8 pairs of
  4-bit E2M1 values and one uint8 E8M0 scale per 32 values, the expert intermediate size padded
  to the backend's multiple (64 for the Triton backend vLLM picks on an H100,
  ``fused_moe/oracle/mxfp4.py`` ``mxfp4_round_up_hidden_size_and_intermediate_size``).

Pure stdlib; bytes are integers [B].
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Sequence
from dataclasses import dataclass

from app.domain.engines.quant_schemes import (
    FP32_BYTES,
    INT32_BYTES,
    MACHETE_BITS,
    MACHETE_BLOCK_K,
    MACHETE_BLOCK_N,
    MACHETE_GROUP_SIZES,
    MARLIN_GROUP_SIZES,
    MARLIN_MIN_THREAD_K,
    MARLIN_MIN_THREAD_N,
    MXFP4_BLOCK,
    MXFP4_INTERMEDIATE_MULTIPLE,
    QUANTIZATION_METHODS,
    SOURCES,
    QuantScheme,
    resolve_scheme,
)
from app.domain.engines.vllm import EngineInputError, ServingModel
from app.domain.parallel import kv_heads_per_rank, pipeline_stage_layers
from app.domain.quantization import (
    block_scale_bytes,
    channel_scale_bytes,
    group_scale_bytes,
    group_zero_bytes,
    packed_weight_bytes,
)


@dataclass(frozen=True)
class Linear:
    """One linear module of a decoder layer on one tensor-parallel rank, with vLLM's name.

    ``in_features``/``out_features``: the rank's K and N; ``in_full``: K before the split
    (row-parallel layers); ``shards``: the fused logical weights (qkv 3, gate_up 2); ``count``:
    experts holding one of these each. ``hf_names``: the checkpoint's module names it fuses."""

    name: str
    in_features: int
    out_features: int
    in_full: int
    row_parallel: bool
    shards: int = 1
    count: int = 1
    hf_names: tuple[str, ...] = ()
    expert: bool = False


@dataclass(frozen=True)
class StoredBytes:
    """What the GPU holds for quantized linears [B]: the quantized values, their scales, zero
    points and act-order indices."""

    packed_bytes: int = 0
    scale_bytes: int = 0
    zero_point_bytes: int = 0
    g_idx_bytes: int = 0

    @property
    def total_bytes(self) -> int:
        return self.packed_bytes + self.scale_bytes + self.zero_point_bytes + self.g_idx_bytes

    def __add__(self, other: StoredBytes) -> StoredBytes:
        return StoredBytes(
            self.packed_bytes + other.packed_bytes,
            self.scale_bytes + other.scale_bytes,
            self.zero_point_bytes + other.zero_point_bytes,
            self.g_idx_bytes + other.g_idx_bytes,
        )


@dataclass(frozen=True)
class QuantizedStage:
    """One pipeline stage's GPU under a quantization scheme [B]: ``weights_bytes`` in all,
    ``stored`` for its quantized linears, ``unquantized_bytes`` the rest (embedding, head, norms,
    biases, router, skipped modules), ``quantized_modules``/``skipped_modules`` counted per
    decoder layer x module."""

    weights_bytes: int
    stored: StoredBytes
    unquantized_bytes: int
    quantized_modules: int
    skipped_modules: int


@dataclass(frozen=True)
class QuantizedWeights:
    """Each stage's weights under ``scheme``; ``kernels``: the GEMM kernels vLLM picks for the
    quantized linears (:func:`mixed_precision_kernel`)."""

    scheme: QuantScheme
    stages: tuple[QuantizedStage, ...]
    kernels: tuple[str, ...] = ()

    @property
    def stage_weights_bytes(self) -> tuple[int, ...]:
        return tuple(s.weights_bytes for s in self.stages)


# --------------------------------------------------------------------------------------------
# The decoder's linears and what each holds.


def decoder_linears(model: ServingModel, tp: int) -> tuple[Linear, ...]:
    """The linear modules of one Llama-style decoder layer on one rank, with vLLM's names:
    ``qkv_proj`` (column-parallel; KV heads replicated past TP), ``o_proj`` (row-parallel),
    and ``gate_up_proj``/``down_proj`` or, for a MoE layer, ``experts.w13``/``experts.w2`` per
    expert (the router stays unquantized). The same shapes
    :func:`app.domain.engines.vllm.decoder_stage_weights_bytes` counts."""
    h = model.hidden_size
    q_dim = model.attention_heads * model.head_dim
    kv_dim = kv_heads_per_rank(model.kv_heads, tp) * model.head_dim
    inter = model.intermediate_size
    out = [
        Linear(
            "qkv_proj",
            h,
            q_dim // tp + 2 * kv_dim,
            h,
            False,
            shards=3,
            hf_names=("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
        ),
        Linear("o_proj", q_dim // tp, h, q_dim, True, hf_names=("self_attn.o_proj",)),
    ]
    if model.experts > 1:
        out += [
            Linear(
                "experts.w13",
                h,
                2 * inter // tp,
                h,
                False,
                shards=2,
                count=model.experts,
                hf_names=("experts",),
                expert=True,
            ),
            Linear(
                "experts.w2",
                inter // tp,
                h,
                inter,
                True,
                count=model.experts,
                hf_names=("experts",),
                expert=True,
            ),
        ]
    else:
        out += [
            Linear(
                "gate_up_proj",
                h,
                2 * inter // tp,
                h,
                False,
                shards=2,
                hf_names=("mlp.gate_proj", "mlp.up_proj"),
            ),
            Linear("down_proj", inter // tp, h, inter, True, hf_names=("mlp.down_proj",)),
        ]
    return tuple(out)


def _matches(entry: str, name: str, substring: bool) -> bool:
    if entry.startswith("re:"):
        return re.match(entry[3:], name) is not None
    if "*" in entry:
        return fnmatch.fnmatchcase(name, entry)
    if substring:
        return entry in name
    return name == entry or name.endswith("." + entry)


def skipped(scheme: QuantScheme, linear: Linear, layer: int) -> bool:
    """Whether vLLM keeps ``linear`` of decoder layer ``layer`` unquantized under ``scheme``
    (``utils/quant_utils.py`` ``is_layer_skipped``: a fused module is skipped when all its
    checkpoint shards are listed; AWQ/GPTQ ``modules_to_not_convert`` match as substrings).

    Raises
    ------
    EngineInputError
        Some but not all shards of a fused module listed (vLLM: "Detected some but not all
        shards of ... are quantized").
    """
    if scheme.experts_only and not linear.expert:
        return True
    if not scheme.ignore:
        return False
    prefix = f"model.layers.{layer}."
    if linear.expert:
        names = [prefix + "mlp.experts", prefix + "block_sparse_moe.experts"]
    else:
        names = [prefix + n for n in linear.hf_names]
    listed = [
        any(_matches(entry, name, scheme.substring_ignore) for entry in scheme.ignore)
        for name in names
    ]
    if linear.expert:
        return any(listed)
    if all(listed):
        return True
    if any(listed):
        raise EngineInputError(
            f"Detected some but not all shards of model.layers.{layer}.{linear.name} are "
            "quantized. All shards of fused layers to have the same precision.",
            field="quantization_config",
        )
    return False


def mixed_precision_kernel(
    scheme: QuantScheme, linear: Linear, *, hopper: bool, fp8_marlin: bool = False
) -> str:
    """The kernel vLLM 0.19 picks for a packed-integer linear: ``machete`` on a Hopper GPU when
    Machete can implement the layer (:data:`MACHETE_BITS`, :data:`MACHETE_GROUP_SIZES`, K a
    multiple of 64, N of 128, no act order on a row-parallel shard), else ``marlin``; MoE experts
    run the fused Marlin MoE kernel. ``exllama`` for ``gptq``, ``gemm`` for ``awq``."""
    if scheme.layout == "fp8" and fp8_marlin:
        return "fp8_marlin"
    if scheme.layout != "packed":
        return scheme.layout
    if not scheme.marlin:
        return "exllama" if scheme.method == "gptq" else "gemm"
    if linear.expert:
        return "marlin_moe"
    k, n = linear.in_features, linear.out_features
    if (
        hopper
        and scheme.weight_bits in MACHETE_BITS
        and scheme.group_size in MACHETE_GROUP_SIZES
        and not (scheme.desc_act and k != linear.in_full)
        and k % MACHETE_BLOCK_K == 0
        and n % MACHETE_BLOCK_N == 0
    ):
        return "machete"
    return "marlin"


def linear_stored_bytes(
    scheme: QuantScheme,
    linear: Linear,
    dtype_bytes: int,
    *,
    intermediate_multiple: int = 1,
    hopper: bool = False,
    fp8_marlin: bool = False,
) -> StoredBytes:
    """What one rank holds for ``linear`` quantized by ``scheme`` [B] (see the module docstring
    for each scheme's tensors). ``dtype_bytes``: the params dtype of group scales; ``hopper``:
    the GPU is compute capability 9.0 (Machete kernels, :func:`mixed_precision_kernel`);
    ``fp8_marlin``: the GPU has no fp8 math (compute capability below 8.9), so fp8 weights run
    weight-only on FP8 Marlin with their scales per output channel in the params dtype."""
    k, n, c = linear.in_features, linear.out_features, linear.count
    if scheme.layout == "fp8" and fp8_marlin:
        # utils/marlin_utils_fp8.py prepare_fp8_layer_for_marlin: scales cast to the params
        # dtype and repeated to one per output column (per block row for block scales)
        rows = -(-k // scheme.block[1]) if scheme.scales == "block" and scheme.block else 1
        extra = c * FP32_BYTES if scheme.static_input_scale else 0
        return StoredBytes(packed_bytes=c * k * n, scale_bytes=c * rows * n * dtype_bytes + extra)
    if scheme.layout == "packed" and mixed_precision_kernel(scheme, linear, hopper=hopper) == (
        "machete"
    ):
        return _machete_stored_bytes(scheme, linear, dtype_bytes)
    if scheme.layout in ("fp8", "int8"):
        values = c * k * n
        if scheme.scales == "block":
            assert scheme.block is not None
            bn, bk = scheme.block
            scales = c * (-(-n // bn)) * (-(-k // bk)) * FP32_BYTES
        elif scheme.scales == "channel" or (
            scheme.layout == "int8" and linear.shards > 1 and not linear.expert
        ):
            scales = c * channel_scale_bytes(n, FP32_BYTES)
        else:
            scales = c * FP32_BYTES
        if scheme.static_input_scale:
            scales += c * FP32_BYTES
        return StoredBytes(packed_bytes=values, scale_bytes=scales)
    if scheme.layout == "packed":
        scale_k = linear.in_full if linear.row_parallel and scheme.desc_act else k
        group = scheme.group_size
        values = c * packed_weight_bytes(k, n, scheme.weight_bits)
        scales = c * group_scale_bytes(scale_k, n, group, dtype_bytes)
        # GPTQMarlinMoEMethod keeps the experts' packed qzeros (gptq_marlin.py: never replaced);
        # the dense Marlin kernel drops them for symmetric checkpoints.
        keeps_zeros = scheme.zero_points or (scheme.method == "gptq_marlin" and linear.expert)
        zeros = c * group_zero_bytes(scale_k, n, group, scheme.weight_bits) if keeps_zeros else 0
        g_idx = 0
        if scheme.desc_act:
            # marlin: sorted g_idx + g_idx_sort_indices; exllama (gptq): the argsorted g_idx
            g_idx = c * (2 if scheme.marlin else 1) * k * INT32_BYTES
        return StoredBytes(values, scales, zeros, g_idx)
    # mxfp4: experts' K (w2) or N (w13) padded to the backend's intermediate multiple
    if linear.row_parallel:
        k = -(-k // intermediate_multiple) * intermediate_multiple
    else:
        n = -(-n // (2 * intermediate_multiple)) * (2 * intermediate_multiple)
    values = c * n * (k // 2 + k % 2)
    scales = c * n * block_scale_bytes(k, MXFP4_BLOCK, 1)
    return StoredBytes(packed_bytes=values, scale_bytes=scales)


def _machete_stored_bytes(scheme: QuantScheme, linear: Linear, dtype_bytes: int) -> StoredBytes:
    k, n, group = linear.in_features, linear.out_features, scheme.group_size
    gptq = scheme.method == "gptq_marlin"
    # gptq_marlin.py create_weights: scales and qzeros of the full K when desc_act
    # (marlin_repeat_scales_on_all_ranks); Machete keeps both as created.
    scale_k = linear.in_full if gptq and scheme.desc_act else k
    values = packed_weight_bytes(k, n, scheme.weight_bits)
    scales = group_scale_bytes(scale_k, n, group, dtype_bytes)
    if gptq:
        zeros = group_zero_bytes(scale_k, n, group, scheme.weight_bits)  # loaded, unused
        g_idx = k * INT32_BYTES * (2 if scheme.desc_act else 1)  # g_idx param (+ permutation)
    else:
        # awq_marlin / compressed-tensors: zero points pre-scaled into the params dtype
        zeros = group_scale_bytes(k, n, group, dtype_bytes) if scheme.zero_points else 0
        g_idx = 2 * k * INT32_BYTES if scheme.desc_act else 0  # weight_g_idx + permutation
    c = linear.count
    return StoredBytes(c * values, c * scales, c * zeros, c * g_idx)


def quantized_stage_weights(
    model: ServingModel,
    scheme: QuantScheme,
    tp: int,
    pp: int,
    dtype_bytes: int,
    dense_stage_weights_bytes: Sequence[int],
    *,
    hopper: bool = False,
    fp8_marlin: bool = False,
) -> QuantizedWeights:
    """Weights each pipeline stage's GPUs hold under ``scheme`` [B]: the unquantized figure
    (:func:`app.domain.engines.vllm.decoder_stage_weights_bytes` at ``dtype_bytes``) with each
    decoder layer's quantized linears replaced by what :func:`linear_stored_bytes` says vLLM
    keeps; embedding, head, norms, biases and the router stay as they were.

    Raises
    ------
    EngineInputError
        An MLA model (its projections are not expressed here) or, under a Marlin kernel, a rank's
        K or N that vLLM refuses (``verify_marlin_supports_shape``; field
        ``tensor_parallel_size``).
    """
    if model.mla_latent_dim is not None:
        raise EngineInputError(
            "quantized weights of multi-head latent attention models are not expressed",
            field="quantization",
        )
    linears = decoder_linears(model, tp)
    if scheme.marlin:
        for lin in linears:
            _check_marlin_shape(lin, scheme.group_size)
    multiple = MXFP4_INTERMEDIATE_MULTIPLE if scheme.layout == "mxfp4" else 1
    per_layer_dense = sum(lin.count * lin.in_features * lin.out_features for lin in linears)
    stages = []
    kernels: set[str] = set()
    first = 0
    for n_layers, dense in zip(
        pipeline_stage_layers(model.layers, pp), dense_stage_weights_bytes, strict=True
    ):
        stored = StoredBytes()
        quantized = skips = 0
        for layer in range(first, first + n_layers):
            for lin in linears:
                if skipped(scheme, lin, layer):
                    skips += 1
                    continue
                quantized += 1
                stored += linear_stored_bytes(
                    scheme,
                    lin,
                    dtype_bytes,
                    intermediate_multiple=multiple,
                    hopper=hopper,
                    fp8_marlin=fp8_marlin,
                )
                kernels.add(
                    mixed_precision_kernel(scheme, lin, hopper=hopper, fp8_marlin=fp8_marlin)
                )
        first += n_layers
        unquantized = dense - n_layers * per_layer_dense * dtype_bytes
        unquantized += sum(
            lin.count * lin.in_features * lin.out_features * dtype_bytes
            for layer in range(first - n_layers, first)
            for lin in linears
            if skipped(scheme, lin, layer)
        )
        stages.append(
            QuantizedStage(
                weights_bytes=unquantized + stored.total_bytes,
                stored=stored,
                unquantized_bytes=unquantized,
                quantized_modules=quantized,
                skipped_modules=skips,
            )
        )
    return QuantizedWeights(scheme, tuple(stages), tuple(sorted(kernels)))


def _check_marlin_shape(lin: Linear, group_size: int) -> None:
    # utils/marlin_utils.py verify_marlin_supports_shape (0.19.0), its messages
    n, k = lin.out_features, lin.in_features
    if n % MARLIN_MIN_THREAD_N:
        raise EngineInputError(
            f"Weight output_size_per_partition = {n} is not divisible by  min_thread_n = "
            f"{MARLIN_MIN_THREAD_N}. Consider reducing tensor_parallel_size or running with "
            "--quantization gptq.",
            field="tensor_parallel_size",
        )
    if k % MARLIN_MIN_THREAD_K:
        raise EngineInputError(
            f"Weight input_size_per_partition = {k} is not divisible by min_thread_k = "
            f"{MARLIN_MIN_THREAD_K}. Consider reducing tensor_parallel_size or running with "
            "--quantization gptq.",
            field="tensor_parallel_size",
        )
    if group_size != -1 and group_size < lin.in_full and k % group_size:
        raise EngineInputError(
            f"Weight input_size_per_partition = {k} is not divisible by group_size = "
            f"{group_size}. Consider reducing tensor_parallel_size or running with "
            "--quantization gptq.",
            field="tensor_parallel_size",
        )


__all__ = [
    "MARLIN_GROUP_SIZES",
    "MXFP4_BLOCK",
    "QUANTIZATION_METHODS",
    "SOURCES",
    "Linear",
    "QuantScheme",
    "QuantizedStage",
    "QuantizedWeights",
    "StoredBytes",
    "decoder_linears",
    "linear_stored_bytes",
    "mixed_precision_kernel",
    "quantized_stage_weights",
    "resolve_scheme",
    "skipped",
]
