"""QLoRA: LoRA adapters on a base whose Linear layers bitsandbytes stores in 4 bits.

What a 4-bit base stores, as the libraries build it (bitsandbytes 0.4x, transformers 5.x,
peft 0.21; the option names are those of transformers' ``BitsAndBytesConfig``, which vLLM's
``bitsandbytes`` quantization reads from a checkpoint's ``quantization_config`` too):

* which modules: ``transformers/integrations/bitsandbytes.py`` ``replace_with_bnb_linear``
  swaps every ``nn.Linear`` (and GPT-2's ``Conv1D``) for ``bnb.nn.Linear4bit`` except the
  modules ``HfQuantizer.get_modules_to_not_convert`` names (``transformers/quantizers/
  base.py``): ``get_keys_to_not_convert`` (tied weights, the last parameter's module, the
  output embedding ``lm_head``) unless ``llm_int8_skip_modules`` is given, which replaces
  them, and the class's ``_keep_in_fp32_modules`` (T5's ``wo``, kept in fp32); embeddings,
  norms and every non-Linear parameter stay in the model's ``torch_dtype``, and so does each
  Linear4bit's bias;
* what a quantized weight stores: ``bitsandbytes/nn/modules.py`` ``Params4bit._quantize``
  calls ``bitsandbytes/functional.py`` ``quantize_4bit(w, blocksize=64,
  compress_statistics=bnb_4bit_use_double_quant, quant_type=bnb_4bit_quant_type)``: the
  packed uint8 weight of ``(numel + 1) // 2`` bytes (two 4-bit codes a byte), one absmax per
  block of 64 elements (fp32), and the 16-entry fp32 code book of NF4 / FP4 (64 B); with
  double quantization the absmax are stored as uint8 codes of ``quantize_blockwise(absmax -
  offset, blocksize=256)``: one byte per 64-element block, one fp32 absmax per 256 of those
  blocks, the fp32 ``offset`` (their mean, 4 B) and the dynamic 8-bit code book (256 fp32,
  1,024 B) in the nested ``QuantState``;
* computing: ``bnb.matmul_4bit`` (``bitsandbytes/autograd/_functions.py`` ``MatMul4Bit``)
  dequantizes the weight to ``bnb_4bit_compute_dtype`` for the forward GEMM and again for
  the backward's input gradient, then frees it: one layer's weight, out x in at the compute
  dtype's bytes, exists at a time (:func:`dequant_transient_bytes`);
* ``peft/utils/other.py`` ``prepare_model_for_kbit_training``: every fp16 / bf16 parameter
  that is not a ``Params4bit`` is cast to fp32 and gradient checkpointing is enabled
  (``use_gradient_checkpointing=True`` by default).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

from app.domain.graph.analysis import LayerAnalysis
from app.domain.peft.lora import (
    LoraError,
    LoraModule,
    linear_modules,
    module_naming,
    output_head,
)
from app.domain.precision import CONVENTIONS, ComputeCapability, DType, Precision

__all__ = [
    "BNB_BLOCKSIZE",
    "BNB_NESTED_BLOCKSIZE",
    "QloraConfig",
    "QuantType",
    "QuantizedBase",
    "check_qlora",
    "check_qlora_device",
    "dequant_transient_bytes",
    "linear4bit_bytes",
    "linear4bit_tensors",
    "quantized_base",
]

# bitsandbytes/nn/modules.py Params4bit(blocksize=64) and functional.quantize_4bit's default
BNB_BLOCKSIZE = 64
# bitsandbytes/functional.py quantize_4bit: compress_statistics quantizes the absmax with
# quantize_blockwise(absmax - offset, blocksize=256)
BNB_NESTED_BLOCKSIZE = 256
_CODE4_BYTES = 16 * 4  # get_4bit_type("nf4" | "fp4"): 16 fp32 values
_CODE8_BYTES = 256 * 4  # create_dynamic_map(): 256 fp32 values
_OFFSET_BYTES = 4  # absmax.mean(), fp32
_COMPUTE_DTYPES = (DType.FP32, DType.BF16, DType.FP16)


class QuantType(StrEnum):
    """``bnb_4bit_quant_type``: the 4-bit data type (same bytes; NF4 is QLoRA's)."""

    NF4 = "nf4"
    FP4 = "fp4"


@dataclass(frozen=True, slots=True, kw_only=True)
class QloraConfig:
    """transformers' ``BitsAndBytesConfig(load_in_4bit=True, ...)`` with its defaults
    (``bnb_4bit_quant_type="fp4"``, no double quantization, compute dtype fp32: the
    QLoRA paper's recipe sets nf4, double quantization and bf16) and whether the model went
    through PEFT's ``prepare_model_for_kbit_training`` (its fp32 casts)."""

    quant_type: QuantType = QuantType.FP4
    double_quant: bool = False
    compute_dtype: DType = DType.FP32
    skip_modules: tuple[str, ...] = ()  # llm_int8_skip_modules (replace the default: the head)
    prepare_kbit_training: bool = True
    use_gradient_checkpointing: bool = True  # prepare_model_for_kbit_training's argument

    def __post_init__(self) -> None:
        if self.compute_dtype not in _COMPUTE_DTYPES:
            raise LoraError(
                f"bnb_4bit_compute_dtype must be fp32, bf16 or fp16, got "
                f"{self.compute_dtype.value}",
                "qlora/bnb_4bit_compute_dtype",
            )


def linear4bit_tensors(in_features: int, out_features: int, *, double_quant: bool) -> list[int]:
    """The tensors a ``bnb.nn.Linear4bit(in, out)`` weight stores (its bias aside) [B each]:
    the packed weight ``ceil(n / 2)``, the absmax (fp32 per 64-element block; with double
    quantization a uint8 code per block, then the nested fp32 absmax per 256 blocks, the fp32
    offset and the 8-bit code book), and the 4-bit code book (bitsandbytes/functional.py
    quantize_4bit, quantize_blockwise)."""
    numel = in_features * out_features
    blocks = -(-numel // BNB_BLOCKSIZE)
    packed = (numel + 1) // 2
    if not double_quant:
        return [packed, blocks * 4, _CODE4_BYTES]
    nested = -(-blocks // BNB_NESTED_BLOCKSIZE)
    return [packed, blocks, nested * 4, _OFFSET_BYTES, _CODE8_BYTES, _CODE4_BYTES]


def linear4bit_bytes(in_features: int, out_features: int, *, double_quant: bool) -> int:
    """Bytes a ``bnb.nn.Linear4bit(in, out)`` weight stores, its bias aside
    (:func:`linear4bit_tensors` summed) [B]."""
    return sum(linear4bit_tensors(in_features, out_features, double_quant=double_quant))


@dataclass(frozen=True, slots=True)
class QuantizedBase:
    """The frozen base of a QLoRA model: its 4-bit Linear modules and what stays unquantized."""

    modules: tuple[LoraModule, ...]  # the Linear4bit modules
    quantized_bytes: int  # their stored weights (packed, absmax, code books), biases aside
    quantized_params: int  # their weights' elements
    other_params: int  # every other parameter (embeddings, norms, biases, the output head)
    other_bytes_per_param: int  # fp32 after prepare_model_for_kbit_training, else torch_dtype
    largest: LoraModule  # the widest Linear4bit: its dequantized weight is the transient
    fp32_params: int = 0  # weights of _keep_in_fp32_modules (T5's wo), unquantized in fp32

    @property
    def weights_bytes(self) -> int:
        """The base's stored bytes: quantized Linear weights and the rest [B]."""
        rest = self.other_params * self.other_bytes_per_param
        return self.quantized_bytes + rest + self.fp32_params * 4


def quantized_base(
    layers: Sequence[LayerAnalysis],
    config: QloraConfig,
    *,
    params: int,
    torch_dtype_bytes: int,
) -> QuantizedBase:
    """Which Linear modules of the graph ``layers`` (``params`` parameters in all) are 4-bit
    and what the base stores, the unquantized parameters at ``torch_dtype_bytes`` (fp32
    after ``prepare_model_for_kbit_training``)."""
    # routed experts and routers are parameters, not Linear: bitsandbytes leaves them as stored
    modules = [m for m in linear_modules(layers) if not m.embedding and not m.experts]
    # llm_int8_skip_modules replaces transformers' default skips (the output head)
    head = None if config.skip_modules else output_head(layers, linear_modules(layers))
    skipped = set(config.skip_modules)
    keep = module_naming(layers).keep_in_fp32
    fp32 = [m for m in modules if any(m.name.endswith("." + k) for k in keep)]
    chosen = tuple(
        m
        for m in modules
        if m.name != head
        and m not in fp32
        and not any(
            m.name == s or m.name.endswith("." + s) or m.name.startswith(s + ".") for s in skipped
        )
        and _has_own_weight(layers[m.layer], m)
    )
    for entry in config.skip_modules:
        if not any(
            m.name == entry or m.name.endswith("." + entry) or m.name.startswith(entry + ".")
            for m in modules
        ):
            raise LoraError(
                f"llm_int8_skip_modules entry '{entry}' matches no Linear module",
                "qlora/llm_int8_skip_modules",
            )
    if not chosen:
        raise LoraError("the model has no Linear layer bitsandbytes would quantize", "qlora")
    numel = sum(m.in_features * m.out_features for m in chosen)
    stored = sum(
        linear4bit_bytes(m.in_features, m.out_features, double_quant=config.double_quant)
        for m in chosen
    )
    fp32_numel = sum(m.in_features * m.out_features for m in fp32)
    other = params - numel - fp32_numel
    per_param = 4 if config.prepare_kbit_training else torch_dtype_bytes
    largest = max(chosen, key=lambda m: m.in_features * m.out_features)
    return QuantizedBase(chosen, stored, numel, other, per_param, largest, fp32_numel)


def _has_own_weight(layer: LayerAnalysis, module: LoraModule) -> bool:
    """A standalone Linear layer whose weight is tied to an embedding has no parameter of its
    own in the graph (only an untied one is quantized)."""
    if layer.op != "linear":
        return True
    return any(len(shape) == 2 for shape in layer.result.param_shapes)


def dequant_transient_bytes(base: QuantizedBase, compute_dtype: DType) -> int:
    """The largest Linear4bit's weight dequantized to the compute dtype [B]: ``MatMul4Bit``
    dequantizes one layer's weight per GEMM (forward, and backward for the input gradient)
    and frees it after, so one such tensor is live at the peak."""
    largest = base.largest
    return largest.in_features * largest.out_features * _dtype_bytes(compute_dtype)


def _dtype_bytes(dtype: DType) -> int:
    return 4 if dtype is DType.FP32 else 2


_SIXTEEN_BIT = {DType.BF16, DType.FP16}


def check_qlora(config: QloraConfig, precision: Precision) -> None:
    """The training precision does not contradict a 4-bit base.

    Raises
    ------
    LoraError
        ``precision`` is itself a quantized (inference) convention: the base is 4-bit by
        QLoRA, the precision names the adapters' training dtype (field ``/precision``); or the
        precision computes in one 16-bit type and ``bnb_4bit_compute_dtype`` is the other
        (every 4-bit GEMM would cast its input bf16 <-> fp16; field
        ``qlora/bnb_4bit_compute_dtype``).
    """
    row = CONVENTIONS[precision]
    if row.quantized or not row.trainable:
        raise LoraError(
            f"precision '{precision.value}' quantizes the weights itself; with qlora the base "
            "is stored in 4 bits by bitsandbytes and precision is the training precision of "
            "the adapters and the unquantized layers (fp32, bf16, fp16, amp_bf16, amp_fp16)",
            "/precision",
        )
    compute = row.compute_dtypes[0]
    if compute in _SIXTEEN_BIT and config.compute_dtype in _SIXTEEN_BIT:
        if compute is not config.compute_dtype:
            raise LoraError(
                f"bnb_4bit_compute_dtype {config.compute_dtype.value} contradicts precision "
                f"'{precision.value}', which computes in {compute.value}: give "
                f"bnb_4bit_compute_dtype {compute.value}",
                "qlora/bnb_4bit_compute_dtype",
            )


def check_qlora_device(config: QloraConfig, capability: ComputeCapability | None) -> None:
    """The GPU computes in ``bnb_4bit_compute_dtype``: bf16 needs compute capability 8.0+
    (:data:`app.domain.precision.MIN_COMPUTE_CAPABILITY`); None (no GPU named) passes."""
    if capability is None or config.compute_dtype is not DType.BF16:
        return
    if capability < ComputeCapability(8, 0):
        raise LoraError(
            f"bnb_4bit_compute_dtype bf16 needs compute capability 8.0+; this GPU is "
            f"{capability}: use fp16",
            "qlora/bnb_4bit_compute_dtype",
        )
