"""Golden tests: a pre-quantized checkpoint's weights as it stores them (hand-derived bytes)."""

import json
from typing import Any

import pytest

from app.config import PROJECT_ROOT
from app.domain.engines.quant_schemes import checkpoint_layout
from app.domain.engines.vllm import EngineInputError
from app.domain.memory.checkpoint import CheckpointError, check_checkpoint
from app.domain.memory.estimate import MemoryRequest, analyze_for, estimate_memory
from app.domain.precision import Precision
from app.domain.workload import Mode
from app.importers.hf_config import import_hf_config

# A small Llama: hidden 256, MLP 512, 4 heads of 64 (2 KV heads), 2 layers, vocabulary 1000,
# untied head.
SMALL_LLAMA: dict[str, Any] = {
    "model_type": "llama",
    "architectures": ["LlamaForCausalLM"],
    "hidden_size": 256,
    "intermediate_size": 512,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 1000,
    "max_position_embeddings": 512,
    "rms_norm_eps": 1e-5,
    "tie_word_embeddings": False,
}
GPTQ = {"quant_method": "gptq", "bits": 4, "group_size": 128, "desc_act": False, "sym": True}
FP8 = {"quant_method": "fp8", "activation_scheme": "dynamic", "weight_block_size": [128, 128]}
# Per layer (N outputs, K inputs): q 256x256, k 128x256, v 128x256, o 256x256, gate and up
# 512x256, down 256x512: 589,824 linear weights a layer.
LINEARS = [(256, 256), (128, 256), (128, 256), (256, 256), (512, 256), (512, 256), (256, 512)]
LINEAR_PARAMS = 2 * sum(n * k for n, k in LINEARS)
# Embedding and head 1000 x 256 each, 2 norms a layer and the final one (256 each).
OTHER_PARAMS = 2 * 1000 * 256 + 5 * 256


def _weights_line(config: dict[str, Any], precision: Precision) -> tuple[int, list[str]]:
    imported = import_hf_config(SMALL_LLAMA, sequence_length=128)
    request = MemoryRequest(
        mode=Mode.INFERENCE, precision=precision, checkpoint=checkpoint_layout(config)
    )
    analysis = analyze_for(imported.inputs, imported.layers, {"batch": 1, "seq": 128}, request)
    result = estimate_memory(analysis, request)
    (line,) = [line for line in result.lines if line.key == "weights"]
    return line.bytes, list(result.assumptions)


def test_gptq_w4a16_is_priced_as_stored() -> None:
    assert LINEAR_PARAMS == 1_179_648
    packed = LINEAR_PARAMS // 2  # 4 bits a weight, in int32 words
    # fp16 scales per group of 128 inputs: K 256 -> 2 groups, K 512 (down) -> 4
    scales = 2 * sum(k // 128 * n * 2 for n, k in LINEARS)
    zeros = 2 * sum(k // 128 * n // 2 for n, k in LINEARS)  # 4-bit qzeros, packed
    g_idx = 2 * sum(k * 4 for _, k in LINEARS)  # one int32 per input, always stored
    assert (scales, zeros, g_idx) == (18_432, 4_608, 16_384)
    expected = packed + scales + zeros + g_idx + OTHER_PARAMS * 2
    assert expected == 1_655_808
    weights, assumptions = _weights_line(GPTQ, Precision.FP16)
    assert weights == expected
    assert any("0.5334 B per element" in a for a in assumptions)
    assert any("source: the model's quantization_config" in a for a in assumptions)


def test_fp8_block_checkpoint_is_priced_as_stored() -> None:
    # one byte a weight, an fp32 scale per 128 x 128 block: ceil(N/128) x ceil(K/128)
    scales = 2 * sum(-(-n // 128) * -(-k // 128) * 4 for n, k in LINEARS)
    assert scales == 2 * (4 + 2 + 2 + 4 + 8 + 8 + 8) * 4 == 288
    expected = LINEAR_PARAMS + scales + OTHER_PARAMS * 2
    assert expected == 2_206_496
    assert _weights_line(FP8, Precision.BF16)[0] == expected
    # the precision table's fp8 row (W8A8) names the same format: the same weights
    assert _weights_line(FP8, Precision.FP8)[0] == expected


@pytest.mark.parametrize(
    ("config", "precision", "mode", "field"),
    [
        (FP8, Precision.INT4, Mode.INFERENCE, "precision"),  # int4 weights of an fp8 checkpoint
        (GPTQ, Precision.FP32, Mode.TRAINING, "precision"),  # fp32 training of a GPTQ one
        (GPTQ, Precision.FP8, Mode.INFERENCE, "precision"),
        (GPTQ, Precision.BF16, Mode.TRAINING, "mode"),  # no gradients through packed weights
    ],
)
def test_a_contradicting_request_names_its_field(
    config: dict[str, Any], precision: Precision, mode: Mode, field: str
) -> None:
    with pytest.raises(CheckpointError) as raised:
        check_checkpoint(checkpoint_layout(config), precision, mode)
    assert raised.value.field == field


def test_llama_3_8b_gptq_agrees_with_the_engines_tensors() -> None:
    """Meta-Llama-3-8B as a GPTQ W4A16 checkpoint (groups of 128, act order): the tensors the
    engine test (tests/api/test_engines.py) derives for vLLM's Machete kernel, except that a
    checkpoint holds one g_idx (K int32) a linear, not the sorted copy and permutation."""
    config = json.loads((PROJECT_ROOT / "tests/fixtures/hf_configs/llama-3-8b.json").read_text())
    imported = import_hf_config(config, sequence_length=16)
    layout = checkpoint_layout({**GPTQ, "desc_act": True})
    request = MemoryRequest(mode=Mode.INFERENCE, precision=Precision.FP16, checkpoint=layout)
    analysis = analyze_for(imported.inputs, imported.layers, {"batch": 1, "seq": 16}, request)
    unquantized = 2 * 128256 * 4096 * 2 + 65 * 4096 * 2  # embedding, head, 65 norms
    packed = 32 * (4096 * 10240 + 3 * 4096 * 14336) // 2
    scales = 32 * (32 * 6144 + 32 * 4096 + 32 * 28672 + 112 * 4096) * 2
    g_idx = 32 * (6 * 4096 + 14336) * 4
    expected = unquantized + packed + scales + scales // 4 + g_idx
    assert expected == 5_732_835_328  # 5.34 GiB
    weights = estimate_memory(analysis, request).lines[0]
    assert (weights.key, weights.bytes) == ("weights", expected)


BNB_NF4 = {
    "quant_method": "bitsandbytes",
    "load_in_4bit": True,
    "bnb_4bit_quant_type": "nf4",
    "bnb_4bit_use_double_quant": True,
    "bnb_4bit_compute_dtype": "bfloat16",
}


def test_a_saved_bitsandbytes_4bit_checkpoint_is_priced_as_linear4bit() -> None:
    # bnb.nn.Linear4bit per K x N weight: ceil(KN / 2) packed, a uint8 absmax per 64 values,
    # an fp32 absmax per 256 of those blocks, a 4 B offset, the 1,024 B 8-bit and 64 B 4-bit
    # code books
    def linear4bit(n: int, k: int) -> int:
        blocks = n * k // 64
        return n * k // 2 + blocks + -(-blocks // 256) * 4 + 4 + 1024 + 64

    expected = 2 * sum(linear4bit(n, k) for n, k in LINEARS) + OTHER_PARAMS * 2
    # packed 589,824 + absmax codes 18,432 + nested absmax 2 x (16+8+8+16+32+32+32) + 14 x
    # 1,092 + the rest at 2 B
    assert expected == 589_824 + 18_432 + 288 + 15_288 + OTHER_PARAMS * 2 == 1_650_392
    assert _weights_line(BNB_NF4, Precision.BF16)[0] == expected
    with pytest.raises(EngineInputError) as raised:
        checkpoint_layout({**BNB_NF4, "load_in_4bit": False, "load_in_8bit": True})
    assert raised.value.field == "quantization_config/load_in_8bit"
