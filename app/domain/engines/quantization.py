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
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from app.domain.engines.vllm import EngineInputError, ServingModel
from app.domain.parallel import kv_heads_per_rank, pipeline_stage_layers
from app.domain.quantization import (
    block_scale_bytes,
    channel_scale_bytes,
    group_scale_bytes,
    group_zero_bytes,
    packed_weight_bytes,
)

# vLLM's `--quantization` values this model expresses (vllm/model_executor/layers/quantization/
# __init__.py QUANTIZATION_METHODS holds these among others).
QUANTIZATION_METHODS: tuple[str, ...] = (
    "fp8",
    "gptq",
    "gptq_marlin",
    "awq",
    "awq_marlin",
    "compressed-tensors",
    "mxfp4",
)
# utils/marlin_utils.py MARLIN_SUPPORTED_GROUP_SIZES
MARLIN_GROUP_SIZES: tuple[int, ...] = (-1, 32, 64, 128)
# utils/marlin_utils.py GPTQ_MARLIN_MIN_THREAD_N / _K (verify_marlin_supports_shape)
MARLIN_MIN_THREAD_N = 64
MARLIN_MIN_THREAD_K = 128
# gptq_marlin.py GPTQMarlinConfig.TYPE_MAP: (bits, sym) -> uint4b8 / uint8b128 only
GPTQ_MARLIN_BITS: tuple[int, ...] = (4, 8)
# gptq.py GPTQConfig: "only 2/3/4/8-bit weight quantization is supported for GPTQ"
GPTQ_BITS: tuple[int, ...] = (2, 3, 4, 8)
# awq.py AWQConfig ("only 4-bit weight quantization is supported for AWQ"); awq_marlin.py TYPE_MAP
AWQ_BITS: tuple[int, ...] = (4,)
# mxfp4.py Mxfp4MoEMethod.create_weights: mxfp4_block = 32, uint8 values and scales
MXFP4_BLOCK = 32
# fused_moe/oracle/mxfp4.py: the Triton backend (SM90-SM10x) rounds the expert intermediate size
# up to 64 (Marlin and FlashInfer-CUTLASS to 128, TRT-LLM to 256)
MXFP4_INTERMEDIATE_MULTIPLE = 64
# utils/machete_utils.py: Machete (Hopper, SM 9.0 only) takes uint4b8/uint8b128 (symmetric) or
# uint4/uint8 with zero points, group sizes -1/64/128 for 16-bit activations, K a multiple of 64
# and N of 128 (MACHETE_PREPACKED_BLOCK_SHAPE), no act order on an input-partitioned layer
MACHETE_BITS: tuple[int, ...] = (4, 8)
MACHETE_GROUP_SIZES: tuple[int, ...] = (-1, 64, 128)
MACHETE_BLOCK_K = 64
MACHETE_BLOCK_N = 128
FP32_BYTES = 4
INT32_BYTES = 4

SOURCES: dict[str, str] = {
    "fp8": "vllm/model_executor/layers/quantization/fp8.py (0.19.0): Fp8OnlineLinearMethod / "
    "Fp8LinearMethod; LinearBase layers only",
    "gptq": "vllm/model_executor/layers/quantization/gptq.py (0.19.0) GPTQLinearMethod",
    "gptq_marlin": "vllm/model_executor/layers/quantization/gptq_marlin.py + "
    "vllm/model_executor/kernels/linear/mixed_precision/marlin.py (0.19.0)",
    "awq": "vllm/model_executor/layers/quantization/awq.py (0.19.0) AWQLinearMethod",
    "awq_marlin": "vllm/model_executor/layers/quantization/awq_marlin.py (0.19.0)",
    "compressed-tensors": "vllm/model_executor/layers/quantization/compressed_tensors/schemes/ "
    "(0.19.0): W8A8 int8 / FP8, WNA16",
    "mxfp4": "vllm/model_executor/layers/quantization/mxfp4.py (0.19.0) Mxfp4MoEMethod",
    "override": "vllm/config/model.py (0.19.0) ModelConfig._verify_quantization: a gptq/awq "
    "config runs as gptq_marlin/awq_marlin when Marlin supports it and --quantization is unset "
    "or names the marlin method; any other mismatch is refused",
}


@dataclass(frozen=True)
class QuantScheme:
    """How vLLM stores the quantized linears of one model.

    ``method``: the quantization vLLM runs (after its gptq/awq -> Marlin override). ``layout``:
    ``fp8`` (1-byte floats), ``int8`` (W8A8 int8), ``packed`` (GPTQ/AWQ/WNA16 integers packed in
    int32) or ``mxfp4``. ``scales``: ``tensor``, ``channel``, ``group`` or ``block``.
    ``group_size`` -1 is one group per output column. ``ignore``: the config's module names kept
    unquantized (``ignore`` / ``ignored_layers`` / ``modules_to_not_convert``).
    """

    method: str
    layout: str
    weight_bits: int
    scales: str
    group_size: int = -1
    block: tuple[int, int] | None = None
    desc_act: bool = False
    zero_points: bool = False
    static_input_scale: bool = False
    marlin: bool = False
    experts_only: bool = False
    checkpoint: bool = True
    ignore: tuple[str, ...] = ()
    substring_ignore: bool = False

    def describe(self) -> str:
        """One line naming the scheme in vLLM's terms."""
        where = "MoE experts only" if self.experts_only else "decoder-layer linears"
        origin = "pre-quantized checkpoint" if self.checkpoint else "runtime quantization"
        if self.layout == "packed":
            group = "per channel" if self.group_size == -1 else f"group_size {self.group_size}"
            detail = (
                f"int{self.weight_bits} packed in int32, params-dtype scales {group}"
                f"{', packed zero points' if self.zero_points else ', symmetric'}"
                f"{', act-order g_idx' if self.desc_act else ''}"
            )
        elif self.layout == "mxfp4":
            detail = f"E2M1 4-bit values, one E8M0 byte per {MXFP4_BLOCK} values"
        else:
            scale = (
                f"fp32 scale per {self.block[0]}x{self.block[1]} block"
                if self.scales == "block" and self.block
                else f"fp32 scale per {self.scales}"
            )
            detail = f"{'fp8 e4m3' if self.layout == 'fp8' else 'int8'} weights, {scale}"
            if self.static_input_scale:
                detail += ", static fp32 input scale"
        return f"{self.method} ({origin}): {where}; {detail}"


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
# The scheme from --quantization and quantization_config (vLLM's own checks, its messages).


def _key(config: Mapping[str, Any], names: Sequence[str], *, required: bool = True) -> Any:
    for name in names:
        if name in config:
            return config[name]
    if required:
        raise EngineInputError(
            f"quantization_config has no '{names[0]}' (vLLM's QuantizationConfig.get_from_keys "
            f"requires one of {list(names)})",
            field=f"quantization_config/{names[0]}",
        )
    return None


def _int(config: Mapping[str, Any], names: Sequence[str]) -> int:
    value = _key(config, names)
    if isinstance(value, bool) or not isinstance(value, int):
        raise EngineInputError(
            f"quantization_config '{names[0]}' must be an integer, got {value!r}",
            field=f"quantization_config/{names[0]}",
        )
    return value


def _bool(config: Mapping[str, Any], name: str, *, default: bool | None = None) -> bool:
    value = _key(config, [name], required=default is None)
    if value is None:
        assert default is not None
        return default
    if not isinstance(value, bool):
        raise EngineInputError(
            f"quantization_config '{name}' must be true or false, got {value!r}",
            field=f"quantization_config/{name}",
        )
    return value


def _names(config: Mapping[str, Any], keys: Sequence[str]) -> tuple[str, ...]:
    for key in keys:
        value = config.get(key)
        if value:
            if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
                raise EngineInputError(
                    f"quantization_config '{key}' must be a list of module names",
                    field=f"quantization_config/{key}",
                )
            return tuple(value)
    return ()


def _mismatch(config_method: str, quantization: str) -> str:
    # vllm/config/model.py ModelConfig._verify_quantization (0.19.0), verbatim
    return (
        "Quantization method specified in the model config "
        f"({config_method}) does not match the quantization "
        f"method specified in the `quantization` argument "
        f"({quantization})."
    )


def _group_size(config: Mapping[str, Any], names: Sequence[str]) -> int:
    size = _int(config, names)
    if size != -1 and size < 1:
        raise EngineInputError(
            f"quantization_config '{names[0]}' must be -1 or >= 1, got {size}",
            field=f"quantization_config/{names[0]}",
        )
    return size


def _gptq(quantization: str | None, config: Mapping[str, Any]) -> QuantScheme:
    bits = _int(config, ["bits"])
    group = _group_size(config, ["group_size"])
    desc_act = _bool(config, "desc_act")
    sym = _bool(config, "sym", default=True)
    if config.get("lm_head"):
        raise EngineInputError(
            "a GPTQ-quantized LM head (lm_head: true) is not expressed",
            field="quantization_config/lm_head",
        )
    if config.get("dynamic"):
        raise EngineInputError(
            "GPTQModel per-module `dynamic` overrides are not expressed",
            field="quantization_config/dynamic",
        )
    if desc_act and group == -1:
        desc_act = False  # GPTQMarlinConfig.__init__: act order means nothing with one group
    marlin_ok = bits in GPTQ_MARLIN_BITS and sym and group in MARLIN_GROUP_SIZES
    if quantization in (None, "gptq_marlin") and marlin_ok:
        method = "gptq_marlin"
    else:
        method = "gptq"
    if quantization is not None and quantization != method:
        why = ""
        field = "quantization"
        if quantization == "gptq_marlin":
            if bits not in GPTQ_MARLIN_BITS:
                why, field = f"gptq_marlin takes bits {list(GPTQ_MARLIN_BITS)}, not {bits}", "bits"
            elif not sym:
                why, field = "gptq_marlin takes symmetric (sym: true) checkpoints only", "sym"
            else:
                why = f"gptq_marlin takes group_size {list(MARLIN_GROUP_SIZES)}, not {group}"
                field = "group_size"
            field = f"quantization_config/{field}"
        raise EngineInputError(
            (f"{why}: " if why else "") + _mismatch("gptq", quantization), field=field
        )
    if bits not in GPTQ_BITS:
        raise EngineInputError(
            f"Currently, only 2/3/4/8-bit weight quantization is supported for GPTQ, but got "
            f"{bits} bits.",
            field="quantization_config/bits",
        )
    return QuantScheme(
        method=method,
        layout="packed",
        weight_bits=bits,
        scales="group",
        group_size=group,
        desc_act=desc_act,
        zero_points=method == "gptq",
        marlin=method == "gptq_marlin",
        ignore=_names(config, ["modules_to_not_convert"]),
        substring_ignore=True,
    )


def _awq(quantization: str | None, config: Mapping[str, Any]) -> QuantScheme:
    bits = _int(config, ["w_bit", "bits"])
    group = _group_size(config, ["q_group_size", "group_size"])
    zero_point = _bool(config, "zero_point")
    if bits not in AWQ_BITS:
        raise EngineInputError(
            f"Currently, only 4-bit weight quantization is supported for AWQ, but got {bits} bits.",
            field="quantization_config/bits",
        )
    marlin_ok = group in MARLIN_GROUP_SIZES
    method = "awq_marlin" if quantization in (None, "awq_marlin") and marlin_ok else "awq"
    if quantization is not None and quantization != method:
        field = "quantization"
        why = ""
        if quantization == "awq_marlin":
            why = f"awq_marlin takes group_size {list(MARLIN_GROUP_SIZES)}, not {group}: "
            field = "quantization_config/group_size"
        raise EngineInputError(why + _mismatch("awq", quantization), field=field)
    return QuantScheme(
        method=method,
        layout="packed",
        weight_bits=bits,
        scales="group",
        group_size=group,
        zero_points=zero_point,
        marlin=method == "awq_marlin",
        ignore=_names(config, ["modules_to_not_convert"]),
        substring_ignore=True,
    )


def _fp8_checkpoint(config: Mapping[str, Any]) -> QuantScheme:
    scheme = _key(config, ["activation_scheme"])
    if scheme not in ("static", "dynamic"):
        raise EngineInputError(
            f"activation_scheme must be 'static' or 'dynamic', got {scheme!r} (fp8.py Fp8Config)",
            field="quantization_config/activation_scheme",
        )
    block = config.get("weight_block_size")
    if block is not None and (
        not isinstance(block, list)
        or len(block) != 2
        or not all(isinstance(b, int) and not isinstance(b, bool) and b >= 1 for b in block)
    ):
        raise EngineInputError(
            "weight_block_size must be two positive integers [block_n, block_k]",
            field="quantization_config/weight_block_size",
        )
    return QuantScheme(
        method="fp8",
        layout="fp8",
        weight_bits=8,
        scales="block" if block else "tensor",
        block=(block[0], block[1]) if block else None,
        static_input_scale=scheme == "static" and not block,
        ignore=_names(config, ["ignored_layers", "modules_to_not_convert"]),
    )


def _compressed_tensors(config: Mapping[str, Any]) -> QuantScheme:
    groups = config.get("config_groups")
    if not isinstance(groups, Mapping) or not groups:
        raise EngineInputError(
            "compressed-tensors quantization_config needs config_groups",
            field="quantization_config/config_groups",
        )
    if len(groups) != 1:
        raise EngineInputError(
            "compressed-tensors with more than one config group is not expressed",
            field="quantization_config/config_groups",
        )
    (name, group), *_ = groups.items()
    pointer = f"quantization_config/config_groups/{name}"
    if not isinstance(group, Mapping):
        raise EngineInputError("a config group must be an object", field=pointer)
    targets = group.get("targets")
    if not isinstance(targets, list) or "Linear" not in targets:
        raise EngineInputError(
            "only config groups targeting Linear are expressed", field=f"{pointer}/targets"
        )
    weights = group.get("weights")
    if not isinstance(weights, Mapping):
        raise EngineInputError("a config group needs weights", field=f"{pointer}/weights")
    bits = weights.get("num_bits")
    kind = weights.get("type", "int")
    strategy = weights.get("strategy", "tensor")
    acts = group.get("input_activations")
    ignore = _names(config, ["ignore"])
    wpointer = f"{pointer}/weights"
    if strategy not in ("tensor", "channel", "group", "block"):
        raise EngineInputError(
            f"weights strategy {strategy!r} is not expressed", field=f"{wpointer}/strategy"
        )
    if kind == "float" and bits == 8:
        block = weights.get("block_structure")
        if strategy == "block" and not (
            isinstance(block, list)
            and len(block) == 2
            and all(isinstance(b, int) and not isinstance(b, bool) and b >= 1 for b in block)
        ):
            raise EngineInputError(
                "a block strategy needs block_structure [n, k] of positive integers",
                field=f"{wpointer}/block_structure",
            )
        if strategy == "group":
            raise EngineInputError(
                "FP8 weights per group are not expressed", field=f"{wpointer}/strategy"
            )
        static = isinstance(acts, Mapping) and acts.get("dynamic") is False
        return QuantScheme(
            method="compressed-tensors",
            layout="fp8",
            weight_bits=8,
            scales=strategy,
            block=(block[0], block[1]) if strategy == "block" and isinstance(block, list) else None,
            static_input_scale=static,
            ignore=ignore,
        )
    if kind == "int" and bits == 8 and isinstance(acts, Mapping):
        if acts.get("num_bits") != 8 or acts.get("type", "int") != "int":
            raise EngineInputError(
                "int8 weights take int8 input activations (W8A8)",
                field=f"{pointer}/input_activations",
            )
        if strategy not in ("tensor", "channel"):
            raise EngineInputError(
                "W8A8 int8 weights are per tensor or per channel (compressed_tensors_w8a8_int8.py)",
                field=f"{wpointer}/strategy",
            )
        return QuantScheme(
            method="compressed-tensors",
            layout="int8",
            weight_bits=8,
            scales=strategy,
            static_input_scale=acts.get("dynamic") is False,
            ignore=ignore,
        )
    if kind == "int" and bits in (4, 8) and acts is None:
        if strategy not in ("group", "channel"):
            raise EngineInputError(
                "WNA16 weights are per group or per channel (compressed_tensors_wNa16.py)",
                field=f"{wpointer}/strategy",
            )
        group_size = -1
        if strategy == "group":
            size = weights.get("group_size")
            if not isinstance(size, int) or isinstance(size, bool) or size < 1:
                raise EngineInputError(
                    "a group strategy needs group_size >= 1", field=f"{wpointer}/group_size"
                )
            group_size = size
        return QuantScheme(
            method="compressed-tensors",
            layout="packed",
            weight_bits=bits,
            scales="group",
            group_size=group_size,
            desc_act=weights.get("actorder") == "group",
            zero_points=weights.get("symmetric", True) is False,
            marlin=True,
            ignore=ignore,
        )
    raise EngineInputError(
        f"compressed-tensors weights of type {kind!r} with {bits} bits"
        f"{' and input activations' if acts else ''} are not expressed (W8A8 int8, FP8, "
        "WNA16 int4/int8 are)",
        field=f"{wpointer}/num_bits",
    )


def resolve_scheme(
    quantization: str | None, quantization_config: Mapping[str, Any] | None
) -> QuantScheme | None:
    """The scheme vLLM 0.19 runs for ``--quantization`` and the checkpoint's
    ``quantization_config`` (``None``: unquantized).

    Raises
    ------
    EngineInputError
        An unknown method; a ``--quantization`` that the config contradicts (vLLM's own message;
        ``field`` names the config key when it is one value that rules the method out, e.g.
        ``quantization_config/bits`` for 3-bit GPTQ asked to run as ``gptq_marlin``); a
        checkpoint method asked for without its config; a config key vLLM requires that is
        missing or of the wrong type.
    """
    if quantization is not None and quantization not in QUANTIZATION_METHODS:
        raise EngineInputError(
            f"quantization {quantization!r} is not one of {list(QUANTIZATION_METHODS)}",
            field="quantization",
        )
    if quantization_config is None:
        if quantization is None:
            return None
        if quantization == "fp8":
            return QuantScheme(
                method="fp8", layout="fp8", weight_bits=8, scales="tensor", checkpoint=False
            )
        raise EngineInputError(
            f"--quantization {quantization} loads a pre-quantized checkpoint: give its "
            "quantization_config (only fp8 quantizes a 16-bit checkpoint at load time)",
            field="quantization_config",
        )
    method = _key(quantization_config, ["quant_method"])
    if not isinstance(method, str):
        raise EngineInputError(
            "quant_method must be a string", field="quantization_config/quant_method"
        )
    method = method.lower()
    if method == "gptq":
        return _gptq(quantization, quantization_config)
    if method == "awq":
        return _awq(quantization, quantization_config)
    if method not in ("fp8", "compressed-tensors", "mxfp4"):
        raise EngineInputError(
            f"quant_method {method!r} is not expressed (gptq, awq, fp8, compressed-tensors, "
            "mxfp4 are)",
            field="quantization_config/quant_method",
        )
    if quantization is not None and quantization != method:
        raise EngineInputError(_mismatch(method, quantization), field="quantization")
    if method == "fp8":
        return _fp8_checkpoint(quantization_config)
    if method == "compressed-tensors":
        return _compressed_tensors(quantization_config)
    return QuantScheme(
        method="mxfp4",
        layout="mxfp4",
        weight_bits=4,
        scales="block",
        block=(1, MXFP4_BLOCK),
        experts_only=True,
        ignore=_names(quantization_config, ["modules_to_not_convert"]),
    )


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
