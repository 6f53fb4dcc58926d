"""vLLM's quantization schemes as configured: which method vLLM runs for a `--quantization` and
a checkpoint's `quantization_config`, read and checked as vLLM 0.19.0 does (the bytes each
scheme stores are :mod:`app.domain.engines.quantization`'s). Pure stdlib."""

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from app.domain.engines.vllm import EngineInputError
from app.domain.quantization import CheckpointLayout

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


def checkpoint_layout(quantization_config: Mapping[str, Any]) -> CheckpointLayout:
    """What a pre-quantized checkpoint stores for its quantized linears, read from its
    ``quantization_config`` with vLLM's own checks (:func:`resolve_scheme`): the tensors vLLM's
    ``create_weights`` loads from it, before any kernel repacks them (vLLM 0.19.0):

    - GPTQ (``gptq.py`` / ``gptq_marlin.py`` ``create_weights``): ``qweight``, ``scales`` (params
      dtype), packed ``qzeros`` and a K-long int32 ``g_idx``, all four always stored;
    - AWQ (``awq.py``): ``qweight``, ``scales``, packed ``qzeros`` when ``zero_point``;
    - compressed-tensors WNA16 (``compressed_tensors_wNa16.py``): packed weight, scales, zero
      points when asymmetric, ``weight_g_idx`` with ``actorder: group``;
    - FP8 / int8 (``fp8.py``, ``compressed_tensors_w8a8_*.py``): one-byte weights with fp32
      scales per tensor, channel or block, and a static fp32 input scale;
    - MXFP4 (``mxfp4.py``): experts only, E2M1 pairs with one E8M0 byte per 32 values;
    - bitsandbytes 4-bit (transformers ``BitsAndBytesConfig(load_in_4bit=True)``, saved
      pre-quantized): every Linear but the head and ``llm_int8_skip_modules`` as
      ``bnb.nn.Linear4bit`` stores it (not a ``--quantization`` this engine model runs).

    Raises
    ------
    EngineInputError
        What :func:`resolve_scheme` refuses (``field`` ``quantization_config/<key>``).
    """
    if str(quantization_config.get("quant_method", "")).lower() == "bitsandbytes":
        return _bitsandbytes(quantization_config)
    scheme = resolve_scheme(None, quantization_config)
    assert scheme is not None  # a config always gives a scheme
    method = str(quantization_config.get("quant_method", scheme.method)).lower()
    packed = scheme.layout == "packed"
    zeros = packed and (method == "gptq" or scheme.zero_points)
    g_idx = packed and (method == "gptq" or scheme.desc_act)
    if packed:
        group = "per channel" if scheme.group_size == -1 else f"per group of {scheme.group_size}"
        what = (
            f"int{scheme.weight_bits} packed in int32 words, params-dtype scales {group}"
            + (", packed zero points" if zeros else "")
            + (", a K-long int32 g_idx" if g_idx else "")
        )
    elif scheme.layout == "mxfp4":
        what = "MoE experts only: E2M1 4-bit pairs, one E8M0 byte per 32 values"
    else:
        per = (
            f"{scheme.block[0]}x{scheme.block[1]} block"
            if scheme.scales == "block" and scheme.block
            else scheme.scales
        )
        what = f"{'fp8 e4m3' if scheme.layout == 'fp8' else 'int8'} weights, fp32 scale per {per}"
        what += ", a static fp32 input scale" if scheme.static_input_scale else ""
    return CheckpointLayout(
        method=method,
        layout=scheme.layout,
        weight_bits=scheme.weight_bits,
        scales=scheme.scales,
        group_size=scheme.group_size,
        block=scheme.block,
        scale_bytes=None if packed else (1 if scheme.layout == "mxfp4" else FP32_BYTES),
        zero_points=zeros,
        g_idx=g_idx,
        static_input_scale=scheme.static_input_scale,
        experts_only=scheme.experts_only,
        ignore=scheme.ignore,
        description=f"{method} checkpoint: {what}",
    )


def _bitsandbytes(config: Mapping[str, Any]) -> CheckpointLayout:
    """A saved bitsandbytes 4-bit checkpoint (transformers' ``BitsAndBytesConfig`` keys)."""
    if config.get("load_in_8bit") is True:
        raise EngineInputError(
            "8-bit bitsandbytes (LLM.int8) checkpoints are not expressed; 4-bit ones are",
            field="quantization_config/load_in_8bit",
        )
    if not _bool(config, "load_in_4bit", default=False):
        raise EngineInputError(
            "a bitsandbytes quantization_config stores 4-bit weights with load_in_4bit: true",
            field="quantization_config/load_in_4bit",
        )
    double = _bool(config, "bnb_4bit_use_double_quant", default=False)
    kind = config.get("bnb_4bit_quant_type", "fp4")
    if kind not in ("fp4", "nf4"):
        raise EngineInputError(
            f"bnb_4bit_quant_type must be 'fp4' or 'nf4', got {kind!r}",
            field="quantization_config/bnb_4bit_quant_type",
        )
    skip = config.get("llm_int8_skip_modules")
    return CheckpointLayout(
        method="bitsandbytes",
        layout="bnb4",
        weight_bits=4,
        scales="block",
        double_quant=double,
        ignore=_names(config, ["llm_int8_skip_modules"]) if skip else (),
        description=(
            f"bitsandbytes checkpoint: {kind} 4-bit pairs (bnb.nn.Linear4bit), an absmax per "
            f"64 values{', double-quantized' if double else ' in fp32'}"
        ),
    )
