"""QLoRA and DoRA in the memory estimate: the 4-bit base's stored bytes (golden, per
bitsandbytes' quantize_4bit layout), which modules stay unquantized, the dequantization
transient, DoRA's saved tensors, and the precisions that contradict a 4-bit base."""

from __future__ import annotations

import json
from functools import cache

import pytest

from app.config import PROJECT_ROOT
from app.domain.graph.analysis import GraphAnalysis, analyze
from app.domain.memory.estimate import MemoryRequest, analyze_for, estimate_memory
from app.domain.peft import LoraConfig, LoraError, LoraKind
from app.domain.peft.qlora import (
    QloraConfig,
    QuantType,
    check_qlora,
    check_qlora_device,
    dequant_transient_bytes,
    linear4bit_bytes,
    linear4bit_tensors,
    quantized_base,
)
from app.domain.precision import ComputeCapability, DType, Precision
from app.domain.workload import Checkpointing, Mode, Parallelism, Runtime, WorkloadSpec, resolve
from app.domain.zoo import ZOO
from app.importers.hf_config import import_hf_config

LLAMA_PARAMS = 6_738_415_616
NF4_DQ_BF16 = QloraConfig(quant_type=QuantType.NF4, double_quant=True, compute_dtype=DType.BF16)
QV = ("q_proj", "v_proj")


def _request(lora: LoraConfig, **kwargs: object) -> MemoryRequest:
    fields: dict[str, object] = {
        "mode": Mode.TRAINING,
        "precision": Precision.AMP_BF16,
        "runtime": Runtime.CUDA,
        "checkpointing": Checkpointing.FULL,
        "lora": lora,
        **kwargs,
    }
    return MemoryRequest(**fields)  # type: ignore[arg-type]


@cache
def _llama(seq: int = 1024) -> GraphAnalysis:
    model = ZOO["llama-2-7b"]
    request = _request(LoraConfig(target_modules=QV))
    return analyze_for(model.inputs, model.layers, {"batch": 1, "seq": seq}, request)


def _llama_lines(lora: LoraConfig) -> dict[str, int]:
    """The lines of a Llama-2-7B LoRA estimate without checkpointing (every block's adapters
    keep their tensors from the forward)."""
    request = _request(lora, checkpointing=Checkpointing.NONE)
    return {line.key: line.bytes for line in estimate_memory(_llama(), request).lines}


def test_linear4bit_bytes_follow_quantize_4bit() -> None:
    # 4096 x 4096: 8,388,608 packed bytes, 262,144 blocks of 64
    assert linear4bit_tensors(4096, 4096, double_quant=False) == [8_388_608, 262_144 * 4, 64]
    assert linear4bit_bytes(4096, 4096, double_quant=False) == 9_437_248
    # double quantization: a uint8 per block, fp32 per 256 blocks (1,024), offset, code book
    assert linear4bit_tensors(4096, 4096, double_quant=True) == [
        8_388_608,
        262_144,
        1_024 * 4,
        4,
        1_024,
        64,
    ]
    assert linear4bit_bytes(4096, 4096, double_quant=True) == 8_655_940
    # odd element count: the packed weight rounds up, blocks round up
    assert linear4bit_tensors(3, 5, double_quant=False) == [8, 4, 64]


def test_llama_2_7b_qlora_base_quantizes_every_block_linear_but_not_the_head() -> None:
    base = quantized_base(_llama().layers, NF4_DQ_BF16, params=LLAMA_PARAMS, torch_dtype_bytes=2)
    assert len(base.modules) == 32 * 7
    assert all(m.name != "lm_head" for m in base.modules)
    per_block = 4 * 4096 * 4096 + 3 * 4096 * 11008
    assert base.quantized_params == 32 * per_block == 6_476_005_376
    # embed_tokens, lm_head and the norms stay unquantized, in fp32 after
    # prepare_model_for_kbit_training
    assert base.other_params == LLAMA_PARAMS - 6_476_005_376 == 262_410_240
    assert base.other_bytes_per_param == 4
    stored = 32 * (
        4 * linear4bit_bytes(4096, 4096, double_quant=True)
        + 3 * linear4bit_bytes(4096, 11008, double_quant=True)
    )
    assert base.quantized_bytes == stored == 3_341_015_936
    assert base.weights_bytes == 3_341_015_936 + 262_410_240 * 4 == 4_390_656_896
    unprepared = QloraConfig(prepare_kbit_training=False)
    kept = quantized_base(_llama().layers, unprepared, params=LLAMA_PARAMS, torch_dtype_bytes=2)
    assert kept.other_bytes_per_param == 2


def test_qlora_estimate_lines() -> None:
    lora = LoraConfig(r=16, target_modules=QV, qlora=NF4_DQ_BF16)
    result = estimate_memory(_llama(), _request(lora))
    lines = {line.key: line for line in result.lines}
    assert lines["weights"].bytes == 4_390_656_896
    assert "Linear4bit" in lines["weights"].formula
    assert result.trainable_params == 32 * 2 * 16 * 8192
    # one layer's weight dequantized to bf16 at a time: the widest, gate_proj (11008 x 4096),
    # while a layer runs; the peak is the loss's backward, where none does (issue 32's
    # frozen-base rules: it was counted there until then)
    assert result.peak_phase == "backward"
    assert "adapter_transient" not in lines
    base = quantized_base(_llama().layers, NF4_DQ_BF16, params=LLAMA_PARAMS, torch_dtype_bytes=4)
    assert dequant_transient_bytes(base, DType.BF16) == 11008 * 4096 * 2 == 90_177_536
    plain = estimate_memory(_llama(), _request(LoraConfig(r=16, target_modules=QV)))
    plain_lines = {line.key: line.bytes for line in plain.lines}
    assert plain_lines["weights"] == LLAMA_PARAMS * 4  # amp_bf16: an fp32 base
    assert "adapter_transient" not in plain_lines
    for key in ("adapter_weights", "gradients", "optimizer_state"):
        assert lines[key].bytes == plain_lines[key]
    assert result.peak_bytes < plain.peak_bytes


def test_fp32_compute_dtype_dequantizes_to_4_bytes() -> None:
    lora = LoraConfig(r=8, target_modules=QV, qlora=QloraConfig())  # transformers' defaults
    result = estimate_memory(_llama(), _request(lora, precision=Precision.FP32))
    lines = {line.key: line.bytes for line in result.lines}
    assert lines["adapter_transient"] == 11008 * 4096 * 4
    stored = 32 * (
        4 * linear4bit_bytes(4096, 4096, double_quant=False)
        + 3 * linear4bit_bytes(4096, 11008, double_quant=False)
    )
    assert lines["weights"] == stored + 262_410_240 * 4


def test_dora_lines_on_llama() -> None:
    dora = LoraConfig(r=16, target_modules=QV, use_dora=True)
    plain = LoraConfig(r=16, target_modules=QV)
    # no checkpointing: the adapters' tensors are kept from the forward (under full
    # checkpointing a unit's exist only while its backward recomputes it, after the loss's
    # backward where the peak is: app.domain.memory.adapters.adapters_outside_units)
    with_dora = _llama_lines(dora)
    without = _llama_lines(plain)
    magnitude = 32 * 2 * 4096
    assert with_dora["adapter_weights"] - without["adapter_weights"] == magnitude * 4
    # every block's adapted layers keep base_result (bf16) and lora_result (bf16 under
    # autocast), 1024 rows x 4096 each, for q_proj and v_proj, and the fp32 vectors
    # weight_norm, mag_norm_scale and mag_norm_scale - 1 (4096 each)
    assert with_dora["adapter_activations"] - without["adapter_activations"] == 32 * 2 * (
        1024 * 4096 * (2 + 2) + 3 * 4096 * 4
    )
    assert 32 * 2 * (1024 * 4096 * 4 + 3 * 4096 * 4) == 1_076_887_552
    # the weight norm of q_proj: x_eye 4096^2 + lora_weight and weight + scaled update
    # (2 x 4096^2), fp32; an fp32 base: no cast copy. It exists while q_proj runs, not at the
    # training peak (the loss's backward): read at an unmerged inference forward's
    assert "adapter_transient" not in with_dora
    unmerged = LoraConfig(r=16, target_modules=QV, use_dora=True, merged=False)
    infer = MemoryRequest(
        mode=Mode.INFERENCE, precision=Precision.FP32, runtime=Runtime.CUDA, lora=unmerged
    )
    model = ZOO["llama-2-7b"]
    analysis = analyze_for(model.inputs, model.layers, {"batch": 1, "seq": 1024}, infer)
    served = {line.key: line.bytes for line in estimate_memory(analysis, infer).lines}
    assert served["adapter_transient"] == 3 * 4096 * 4096 * 4


def test_dora_with_dropout_keeps_the_cast_weight() -> None:
    dora = LoraConfig(r=16, target_modules=QV, use_dora=True, dropout=0.1)
    no_dropout = LoraConfig(r=16, target_modules=QV, use_dora=True)
    # no checkpointing: every block's adapters keep theirs from the forward (_llama_lines)
    kept = _llama_lines(dora)
    base = _llama_lines(no_dropout)
    # lora_dropout: the dropout mask and the dropped input (LoRA's) and, for DoRA, the base
    # weight autocast casts for F.linear (4096 x 4096 x 2 B) per adapted layer, 32 blocks
    lora_dropout = 2 * 1024 * 4096 * 1
    assert kept["adapter_activations"] - base["adapter_activations"] == 32 * (
        lora_dropout + 2 * 4096 * 4096 * 2
    )


@pytest.mark.parametrize(
    ("precision", "config", "field"),
    [
        (Precision.INT4, QloraConfig(), "/precision"),
        (Precision.INT8_WEIGHT_ONLY, QloraConfig(), "/precision"),
        (Precision.AMP_BF16, QloraConfig(compute_dtype=DType.FP16), "qlora/bnb_4bit_compute_dtype"),
        (Precision.FP16, QloraConfig(compute_dtype=DType.BF16), "qlora/bnb_4bit_compute_dtype"),
    ],
)
def test_precisions_that_contradict_a_4bit_base(
    precision: Precision, config: QloraConfig, field: str
) -> None:
    with pytest.raises(LoraError) as caught:
        check_qlora(config, precision)
    assert caught.value.field == field


def test_compatible_precisions_pass() -> None:
    check_qlora(QloraConfig(compute_dtype=DType.BF16), Precision.AMP_BF16)
    check_qlora(QloraConfig(compute_dtype=DType.BF16), Precision.FP32)
    check_qlora(QloraConfig(), Precision.BF16)  # fp32 compute under a bf16 model: slow, legal


def test_bf16_compute_needs_ampere() -> None:
    with pytest.raises(LoraError) as caught:
        check_qlora_device(QloraConfig(compute_dtype=DType.BF16), ComputeCapability(7, 5))
    assert caught.value.pointer == "/lora/qlora/bnb_4bit_compute_dtype"
    check_qlora_device(QloraConfig(compute_dtype=DType.BF16), ComputeCapability(8, 0))
    check_qlora_device(QloraConfig(compute_dtype=DType.FP16), ComputeCapability(7, 0))
    check_qlora_device(QloraConfig(compute_dtype=DType.BF16), None)


def test_qlora_on_a_sharded_model_is_refused() -> None:
    lora = LoraConfig(target_modules=QV, qlora=NF4_DQ_BF16)
    request = _request(lora, parallelism=Parallelism(tensor=2))
    model = ZOO["llama-2-7b"]
    analysis = analyze_for(model.inputs, model.layers, {"batch": 1, "seq": 64}, request)
    with pytest.raises(LoraError) as caught:
        estimate_memory(analysis, request)
    assert caught.value.pointer == "/parallelism"


def test_skip_modules_keep_layers_unquantized() -> None:
    config = QloraConfig(skip_modules=("down_proj",))
    base = quantized_base(_llama().layers, config, params=LLAMA_PARAMS, torch_dtype_bytes=2)
    # llm_int8_skip_modules replaces transformers' default skips: lm_head is quantized then
    # (HfQuantizer.get_modules_to_not_convert)
    assert len(base.modules) == 32 * 6 + 1
    assert "lm_head" in {m.name for m in base.modules}
    assert base.other_params == 262_410_240 - 32000 * 4096 + 32 * 4096 * 11008
    with pytest.raises(LoraError) as caught:
        quantized_base(
            _llama().layers,
            QloraConfig(skip_modules=("score",)),
            params=LLAMA_PARAMS,
            torch_dtype_bytes=2,
        )
    assert caught.value.field == "qlora/llm_int8_skip_modules"


def _inference(lora: LoraConfig | None, precision: Precision = Precision.BF16) -> dict[str, int]:
    request = MemoryRequest(
        mode=Mode.INFERENCE, precision=precision, runtime=Runtime.CUDA, lora=lora
    )
    model = ZOO["llama-2-7b"]
    analysis = analyze_for(model.inputs, model.layers, {"batch": 1, "seq": 512}, request)
    result = estimate_memory(analysis, request)
    assert result.trainable_params == 0
    return {line.key: line.bytes for line in result.lines}


def test_merged_adapters_serve_as_the_base() -> None:
    base = _inference(None)
    merged = _inference(LoraConfig(r=16, target_modules=QV, merged=True))
    assert merged == base
    assert merged["weights"] == LLAMA_PARAMS * 2  # bf16, the base's dtype


def test_unmerged_adapters_add_their_weights_and_forward_temporaries() -> None:
    base = _inference(None)
    beside = _inference(LoraConfig(r=16, target_modules=QV, merged=False))
    assert beside["weights"] == base["weights"]
    assert beside["adapter_weights"] == 32 * 2 * 16 * 8192 * 4  # fp32 adapters
    # q_proj over 512 rows: x cast to fp32, lora_A's and lora_B's outputs, the scaled update
    # and the fp32 sum
    assert beside["adapter_transient"] == 512 * (4096 + 16 + 3 * 4096) * 4


def test_a_merged_4bit_base_stays_4bit_and_keeps_its_torch_dtype_rest() -> None:
    lora = LoraConfig(r=16, target_modules=QV, merged=True, qlora=NF4_DQ_BF16)
    lines = _inference(lora)
    # at inference nothing runs prepare_model_for_kbit_training: the rest stays bf16
    assert lines["weights"] == 3_341_015_936 + 262_410_240 * 2
    assert "adapter_transient" not in lines


def test_merged_is_given_exactly_at_inference() -> None:
    with pytest.raises(LoraError) as caught:
        MemoryRequest(
            mode=Mode.INFERENCE, precision=Precision.BF16, lora=LoraConfig(target_modules=QV)
        )
    assert caught.value.pointer == "/lora"
    with pytest.raises(LoraError) as caught:
        _request(LoraConfig(target_modules=QV, merged=True))
    assert caught.value.pointer == "/lora/merged"


def test_t5_keeps_wo_unquantized_in_fp32() -> None:
    # T5PreTrainedModel._keep_in_fp32_modules = ["wo"]: transformers leaves it a Linear in fp32
    # (30 Linear4bit in t5-small's encoder: 6 blocks x q, k, v, o, wi; qlora_results.md)
    config = json.loads(
        (PROJECT_ROOT / "tests/fixtures/hf_configs/t5-small-encoder.json").read_text()
    )
    graph = import_hf_config(config)
    layers = analyze(
        graph.inputs, graph.layers, {**graph.default_bindings, "batch": 1, "seq": 8}, training=True
    ).layers
    params = sum(layer.result.params for layer in layers)
    base = quantized_base(layers, QloraConfig(), params=params, torch_dtype_bytes=2)
    assert len(base.modules) == 30
    assert base.quantized_params == 12_582_912
    assert base.fp32_params == 6 * 512 * 2048
    assert base.weights_bytes == (base.quantized_bytes + base.other_params * 4 + 6 * 512 * 2048 * 4)


def test_prepare_model_for_kbit_training_checkpoints_the_model() -> None:
    qlora = LoraConfig(target_modules=QV, qlora=QloraConfig())
    for given in (None, Checkpointing.NONE, Checkpointing.SELECTIVE):
        spec = WorkloadSpec(mode=Mode.TRAINING, batch_size=1, checkpointing=given, lora=qlora)
        resolved = resolve(spec, model_bindings={"seq": 8})
        assert resolved.checkpointing is Checkpointing.FULL
        assert (
            "prepare_model_for_kbit_training"
            in {d.option: d.reason for d in resolved.defaults_used}["checkpointing"]
        )
    off = LoraConfig(target_modules=QV, qlora=QloraConfig(use_gradient_checkpointing=False))
    spec = WorkloadSpec(mode=Mode.TRAINING, batch_size=1, lora=off)
    assert resolve(spec, model_bindings={"seq": 8}).checkpointing is Checkpointing.NONE
    plain = WorkloadSpec(mode=Mode.TRAINING, batch_size=1, lora=LoraConfig(target_modules=QV))
    assert resolve(plain, model_bindings={"seq": 8}).checkpointing is Checkpointing.NONE


def test_deepseek_expert_adapters_keep_the_parametrized_weight() -> None:
    """A ParamWrapper replaces the experts' weight by W + B @ A (E x out x in at the weight's
    bytes) which the experts' matmul keeps for backward; under amp_bf16 also its bf16 cast.
    Without checkpointing every MoE layer keeps its own (26 in V2-Lite)."""
    config = json.loads(
        (PROJECT_ROOT / "tests/fixtures/hf_configs/deepseek-v2-lite-chat.json").read_text()
    )
    graph = import_hf_config(config)
    experts = LoraConfig(r=8, target_modules=("gate_proj", "up_proj", "down_proj"))
    attention = LoraConfig(r=8, target_kind=LoraKind.ATTENTION)
    lines = {}
    for name, lora in (("experts", experts), ("attention", attention)):
        request = _request(lora, checkpointing=Checkpointing.NONE)
        analysis = analyze_for(graph.inputs, graph.layers, {"batch": 1, "seq": 64}, request)
        lines[name] = {line.key: line for line in estimate_memory(analysis, request).lines}
    kept = lines["experts"]["adapter_activations"]
    # 64 experts x (2048 x 2816 + 1408 x 2048) elements x (4 B fp32 W' + 2 B bf16 cast)
    per_layer = 64 * (2048 * 2816 + 1408 * 2048) * (4 + 2)
    assert kept.bytes == 26 * per_layer == 26 * 3_321_888_768
    assert "parametrized weight" in kept.formula
    assert "parametrized weight" not in lines["attention"]["adapter_activations"].formula
