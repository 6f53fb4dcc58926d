"""Quantized weights as vLLM 0.19 stores them (app.domain.quantization byte rules and
app.domain.engines.quantization schemes): golden bytes derived by hand."""

from __future__ import annotations

from dataclasses import replace
from fractions import Fraction
from typing import Any

import pytest

from app.domain.engines.quantization import (
    Linear,
    QuantScheme,
    decoder_linears,
    linear_stored_bytes,
    mixed_precision_kernel,
    quantized_stage_weights,
    resolve_scheme,
)
from app.domain.engines.vllm import EngineInputError, ServingModel, decoder_stage_weights_bytes
from app.domain.precision import Precision, scale_bytes
from app.domain.quantization import (
    block_scale_bytes,
    channel_scale_bytes,
    group_scale_bytes,
    group_zero_bytes,
    packed_weight_bytes,
)

# meta-llama/Llama-3.1-8B-Instruct's config.json, written by hand.
LLAMA31_8B = ServingModel(
    layers=32,
    hidden_size=4096,
    attention_heads=32,
    kv_heads=8,
    head_dim=128,
    intermediate_size=14336,
    vocab_size=128256,
    max_position_embeddings=131072,
)
# openai/gpt-oss-20b's geometry (MoE of 32 experts, 4 a token; attention and head in bf16).
GPT_OSS_20B = ServingModel(
    layers=24,
    hidden_size=2880,
    attention_heads=64,
    kv_heads=8,
    head_dim=64,
    intermediate_size=2880,
    vocab_size=201088,
    experts=32,
    experts_per_token=4,
    max_position_embeddings=131072,
)
GPTQ_W4A16: dict[str, Any] = {
    "quant_method": "gptq",
    "bits": 4,
    "group_size": 128,
    "desc_act": True,
    "sym": True,
}
# Embedding + LM head (128256 x 4096 x 2 B each) and 65 RMSNorms of 4096 x 2 B: what no scheme
# quantizes on Llama-3.1-8B at TP 1.
LLAMA_UNQUANTIZED = 2 * 128256 * 4096 * 2 + 65 * 4096 * 2  # 2,101,878,784
# Per decoder layer, q/k/v/o 4096x(4096+1024+1024+4096) + gate/up/down 3 x 4096 x 14336.
LLAMA_LINEAR_PARAMS = 4096 * 10240 + 3 * 4096 * 14336  # 218,103,808


def test_shared_byte_rules_by_hand() -> None:
    assert packed_weight_bytes(4096, 4096, 4) == 8_388_608  # 2 values a byte
    assert packed_weight_bytes(128, 64, 3) == 3072  # 3-bit GPTQ: 32/3 values an int32
    assert packed_weight_bytes(8, 1, 4) == 4  # one whole int32 word
    assert group_scale_bytes(4096, 1024, 128, 2) == 32 * 1024 * 2
    assert group_scale_bytes(4096, 1024, -1, 2) == 1024 * 2  # channelwise: one group
    assert group_scale_bytes(4100, 8, 128, 2) == 33 * 8 * 2  # a partial group rounds up
    assert group_zero_bytes(4096, 1024, 128, 4) == 32 * 1024 // 2
    assert channel_scale_bytes(6144, 4) == 24_576
    assert block_scale_bytes(2880, 32, 1) == 90  # MXFP4: one E8M0 byte per 32 values


def test_the_precision_table_prices_scales_with_the_same_rules() -> None:
    # Unchanged figures: int4 = an fp16 scale + fp16 zero per 128, NVFP4 = a byte per 16 + fp32.
    assert scale_bytes(Precision.INT4, (4096, 4096)) == Fraction(4096 * 4096 // 128 * 4)
    assert scale_bytes(Precision.FP4, (4096, 4096)) == Fraction(4096 * 4096 // 16 + 4)
    assert scale_bytes(Precision.INT8, (1024, 4096)) == Fraction(1024 * 2)
    assert scale_bytes(Precision.FP8, (1024, 4096)) == Fraction(4)


def test_decoder_linears_are_the_shapes_the_dense_weights_count() -> None:
    for tp in (1, 2, 4, 16):
        linears = decoder_linears(LLAMA31_8B, tp)
        assert [lin.name for lin in linears] == ["qkv_proj", "o_proj", "gate_up_proj", "down_proj"]
        params = sum(lin.in_features * lin.out_features for lin in linears)
        dense = decoder_stage_weights_bytes(replace(LLAMA31_8B, layers=1), tp, 1, 1)[0]
        other = decoder_stage_weights_bytes(replace(LLAMA31_8B, layers=0), tp, 1, 1)[0]
        assert params == dense - other - 2 * 4096  # a layer less its two norms
    qkv, o, _, _ = decoder_linears(LLAMA31_8B, 16)
    # 32 heads / 16 = 2 query heads, one replicated KV head a rank.
    assert qkv.out_features == 2 * 128 + 2 * 128
    assert (o.in_features, o.in_full, o.row_parallel) == (256, 4096, True)


def test_runtime_fp8_llama31_8b() -> None:
    scheme = resolve_scheme("fp8", None)
    assert scheme is not None
    assert (scheme.method, scheme.checkpoint, scheme.layout) == ("fp8", False, "fp8")
    dense = decoder_stage_weights_bytes(LLAMA31_8B, 1, 1, 2)
    q = quantized_stage_weights(LLAMA31_8B, scheme, 1, 1, 2, dense)
    (stage,) = q.stages
    # fp8 values 1 B each; one fp32 scale per module: 4 modules x 32 layers x 4 B.
    assert stage.stored.packed_bytes == 32 * LLAMA_LINEAR_PARAMS == 6_979_321_856
    assert stage.stored.scale_bytes == 4 * 32 * 4 == 512
    assert stage.stored.zero_point_bytes == stage.stored.g_idx_bytes == 0
    assert stage.unquantized_bytes == LLAMA_UNQUANTIZED == 2_101_878_784
    assert stage.weights_bytes == 9_081_201_152
    assert (stage.quantized_modules, stage.skipped_modules) == (128, 0)


def test_fp8_without_fp8_math_runs_weight_only_on_marlin() -> None:
    scheme = resolve_scheme("fp8", None)
    assert scheme is not None
    dense = decoder_stage_weights_bytes(LLAMA31_8B, 1, 1, 2)
    q = quantized_stage_weights(LLAMA31_8B, scheme, 1, 1, 2, dense, fp8_marlin=True)
    (stage,) = q.stages
    assert q.kernels == ("fp8_marlin",)
    assert stage.stored.packed_bytes == 32 * LLAMA_LINEAR_PARAMS
    # The per-tensor scale repeated to each output column in bf16: qkv 6144, o 4096,
    # gate_up 28672, down 4096 columns x 2 B, 32 layers.
    assert stage.stored.scale_bytes == 32 * (6144 + 4096 + 28672 + 4096) * 2 == 2_752_512


def test_gptq_w4a16_runs_as_gptq_marlin_by_hand() -> None:
    scheme = resolve_scheme(None, GPTQ_W4A16)
    assert scheme is not None
    assert scheme.method == "gptq_marlin"
    assert resolve_scheme("gptq_marlin", GPTQ_W4A16) == scheme
    dense = decoder_stage_weights_bytes(LLAMA31_8B, 1, 1, 2)
    (stage,) = quantized_stage_weights(LLAMA31_8B, scheme, 1, 1, 2, dense).stages
    assert stage.stored.packed_bytes == 32 * LLAMA_LINEAR_PARAMS // 2 == 3_489_660_928
    # fp16 scales per 128 inputs: qkv 32 x 6144, o 32 x 4096, gate_up 32 x 28672,
    # down 112 x 4096 (x 2 B), 32 layers.
    per_layer_scales = (32 * 6144 + 32 * 4096 + 32 * 28672 + 112 * 4096) * 2
    assert stage.stored.scale_bytes == 32 * per_layer_scales == 109_051_904
    assert stage.stored.zero_point_bytes == 0  # symmetric: Marlin drops qzeros
    # desc_act: sorted g_idx + g_idx_sort_indices, int32 per input of each module.
    assert stage.stored.g_idx_bytes == 32 * (3 * 4096 + 14336) * 2 * 4 == 6_815_744
    assert stage.weights_bytes == LLAMA_UNQUANTIZED + 3_489_660_928 + 109_051_904 + 6_815_744


def test_on_hopper_machete_keeps_the_gptq_zeros_and_g_idx() -> None:
    scheme = resolve_scheme(None, GPTQ_W4A16)
    assert scheme is not None
    dense = decoder_stage_weights_bytes(LLAMA31_8B, 1, 1, 2)
    q = quantized_stage_weights(LLAMA31_8B, scheme, 1, 1, 2, dense, hopper=True)
    (stage,) = q.stages
    assert q.kernels == ("machete",)
    # Machete never replaces the loaded int4 qzeros: half a byte per group and output column.
    assert (
        stage.stored.zero_point_bytes == 32 * (32 * 6144 + 32 * 4096 + 32 * 28672 + 112 * 4096) // 2
    )
    # g_idx as loaded + the act-order permutation: 2 x int32 per input, as Marlin's pair.
    assert stage.stored.g_idx_bytes == 32 * (3 * 4096 + 14336) * 2 * 4
    assert stage.weights_bytes == 5_707_407_360 + 27_262_976
    # desc_act=False: the loaded g_idx stays (one int32 per input), no permutation.
    plain = replace(scheme, desc_act=False)
    qkv = Linear("qkv_proj", 4096, 6144, 4096, False, shards=3)
    assert linear_stored_bytes(plain, qkv, 2, hopper=True).g_idx_bytes == 4096 * 4
    assert linear_stored_bytes(plain, qkv, 2).g_idx_bytes == 0  # Marlin empties it


def test_machete_takes_what_it_can_implement() -> None:
    scheme = resolve_scheme(None, GPTQ_W4A16)
    assert scheme is not None
    o_tp2 = Linear("o_proj", 2048, 4096, 4096, True)
    qkv = Linear("qkv_proj", 4096, 6144, 4096, False, shards=3)
    assert mixed_precision_kernel(scheme, qkv, hopper=True) == "machete"
    assert mixed_precision_kernel(scheme, qkv, hopper=False) == "marlin"
    # Act order on an input-partitioned (row-parallel) shard: not Machete.
    assert mixed_precision_kernel(scheme, o_tp2, hopper=True) == "marlin"
    assert mixed_precision_kernel(replace(scheme, desc_act=False), o_tp2, hopper=True) == "machete"
    # Group size 32 is Marlin's, not Machete's; N 6112 is no multiple of 128.
    assert mixed_precision_kernel(replace(scheme, group_size=32), qkv, hopper=True) == "marlin"
    odd = Linear("qkv_proj", 4096, 6112, 4096, False, shards=3)
    assert mixed_precision_kernel(scheme, odd, hopper=True) == "marlin"
    # AWQ zero points on Machete are pre-scaled into the params dtype (2 B, not half a byte).
    awq = resolve_scheme(
        None, {"quant_method": "awq", "bits": 4, "group_size": 128, "zero_point": True}
    )
    assert awq is not None
    stored = linear_stored_bytes(awq, qkv, 2, hopper=True)
    assert (stored.zero_point_bytes, stored.g_idx_bytes) == (32 * 6144 * 2, 0)


def test_gptq_marlin_moe_experts_keep_their_zero_points() -> None:
    scheme = resolve_scheme(None, GPTQ_W4A16)
    assert scheme is not None
    # Mixtral-8x7B w2 at TP 2: 8 experts x K 7168 of 14336 (act order: full-K scales and zeros).
    w2 = Linear("experts.w2", 7168, 4096, 14336, True, count=8, expert=True)
    stored = linear_stored_bytes(scheme, w2, 2)
    assert stored.packed_bytes == 8 * 7168 * 4096 // 2
    assert stored.scale_bytes == 8 * 112 * 4096 * 2
    assert stored.zero_point_bytes == 8 * 112 * 4096 // 2
    assert stored.g_idx_bytes == 8 * 2 * 7168 * 4


def test_gptq_exllama_keeps_zeros_and_one_g_idx() -> None:
    scheme = resolve_scheme("gptq", GPTQ_W4A16)
    assert scheme is not None
    assert scheme.method == "gptq"
    dense = decoder_stage_weights_bytes(LLAMA31_8B, 1, 1, 2)
    (stage,) = quantized_stage_weights(LLAMA31_8B, scheme, 1, 1, 2, dense).stages
    # int4 zeros per group and column: half a byte each.
    assert (
        stage.stored.zero_point_bytes == 32 * (32 * 6144 + 32 * 4096 + 32 * 28672 + 112 * 4096) // 2
    )
    assert stage.stored.g_idx_bytes == 32 * (3 * 4096 + 14336) * 4


def test_act_order_repeats_row_parallel_scales_on_every_rank() -> None:
    scheme = resolve_scheme(None, GPTQ_W4A16)
    assert scheme is not None
    o_proj_tp2 = Linear("o_proj", 2048, 4096, 4096, True)
    stored = linear_stored_bytes(scheme, o_proj_tp2, 2)
    assert stored.packed_bytes == 2048 * 4096 // 2
    assert stored.scale_bytes == 32 * 4096 * 2  # the full K's 32 groups, not 16
    assert stored.g_idx_bytes == 2 * 2048 * 4
    no_act_order = linear_stored_bytes(replace(scheme, desc_act=False), o_proj_tp2, 2)
    assert no_act_order.scale_bytes == 16 * 4096 * 2
    assert no_act_order.g_idx_bytes == 0


def test_awq_runs_as_awq_marlin_with_zero_points() -> None:
    config = {"quant_method": "awq", "w_bit": 4, "q_group_size": 128, "zero_point": True}
    scheme = resolve_scheme(None, config)
    assert scheme is not None
    assert (scheme.method, scheme.zero_points, scheme.desc_act) == ("awq_marlin", True, False)
    assert resolve_scheme("awq", config).method == "awq"  # type: ignore[union-attr]
    qkv = Linear("qkv_proj", 4096, 6144, 4096, False, shards=3)
    stored = linear_stored_bytes(scheme, qkv, 2)
    assert (stored.packed_bytes, stored.scale_bytes) == (4096 * 6144 // 2, 32 * 6144 * 2)
    assert (stored.zero_point_bytes, stored.g_idx_bytes) == (32 * 6144 // 2, 0)
    # A group size Marlin does not take runs the AWQ GEMM kernel.
    assert resolve_scheme(None, {**config, "q_group_size": 256}).method == "awq"  # type: ignore[union-attr]


def test_compressed_tensors_w8a8_int8_and_fp8_block() -> None:
    def ct(weights: dict[str, Any], acts: dict[str, Any] | None) -> QuantScheme:
        scheme = resolve_scheme(
            "compressed-tensors",
            {
                "quant_method": "compressed-tensors",
                "config_groups": {
                    "group_0": {
                        "targets": ["Linear"],
                        "weights": weights,
                        "input_activations": acts,
                    }
                },
                "ignore": ["lm_head"],
            },
        )
        assert scheme is not None
        return scheme

    int8_act = {"num_bits": 8, "type": "int", "dynamic": True, "strategy": "token"}
    channel = ct({"num_bits": 8, "type": "int", "strategy": "channel"}, int8_act)
    qkv = Linear("qkv_proj", 4096, 6144, 4096, False, shards=3)
    o_proj = Linear("o_proj", 4096, 4096, 4096, True)
    assert linear_stored_bytes(channel, qkv, 2).scale_bytes == 6144 * 4
    tensor = ct({"num_bits": 8, "type": "int", "strategy": "tensor"}, int8_act)
    # per-tensor scales of a fused module become per-channel for CUTLASS; alone: one fp32.
    assert linear_stored_bytes(tensor, qkv, 2).scale_bytes == 6144 * 4
    assert linear_stored_bytes(tensor, o_proj, 2).scale_bytes == 4
    assert linear_stored_bytes(tensor, o_proj, 2).packed_bytes == 4096 * 4096
    fp8_block = ct(
        {"num_bits": 8, "type": "float", "strategy": "block", "block_structure": [128, 128]},
        {"num_bits": 8, "type": "float", "dynamic": True},
    )
    assert linear_stored_bytes(fp8_block, o_proj, 2).scale_bytes == 32 * 32 * 4
    static = ct(
        {"num_bits": 8, "type": "float", "strategy": "tensor"},
        {"num_bits": 8, "type": "float", "dynamic": False},
    )
    assert linear_stored_bytes(static, o_proj, 2).scale_bytes == 4 + 4  # weight + input


def test_ignored_modules_stay_in_the_model_dtype() -> None:
    config = {
        "quant_method": "fp8",
        "activation_scheme": "dynamic",
        "ignored_layers": ["lm_head", "model.layers.0.mlp.down_proj"],
    }
    scheme = resolve_scheme(None, config)
    assert scheme is not None
    dense = decoder_stage_weights_bytes(LLAMA31_8B, 1, 1, 2)
    (stage,) = quantized_stage_weights(LLAMA31_8B, scheme, 1, 1, 2, dense).stages
    assert (stage.quantized_modules, stage.skipped_modules) == (127, 1)
    assert stage.unquantized_bytes == LLAMA_UNQUANTIZED + 14336 * 4096 * 2
    assert stage.stored.packed_bytes == 32 * LLAMA_LINEAR_PARAMS - 14336 * 4096


def test_mxfp4_quantizes_the_experts_only() -> None:
    scheme = resolve_scheme(None, {"quant_method": "mxfp4"})
    assert scheme is not None
    assert scheme.experts_only
    dense = decoder_stage_weights_bytes(GPT_OSS_20B, 1, 1, 2)
    (stage,) = quantized_stage_weights(GPT_OSS_20B, scheme, 1, 1, 2, dense).stages
    # w13: 32 experts x 5760 x 2880 4-bit values, w2: 32 x 2880 x 2880; a byte per 32 values.
    assert stage.stored.packed_bytes == 24 * 32 * (5760 * 1440 + 2880 * 1440) == 9_555_148_800
    assert stage.stored.scale_bytes == 24 * 32 * (5760 * 90 + 2880 * 90) == 597_196_800
    assert (stage.quantized_modules, stage.skipped_modules) == (48, 48)  # attention stays bf16
    # At TP 2 each rank's 1440 intermediate rows pad to 1472 (a multiple of 64).
    w2 = Linear("experts.w2", 1440, 2880, 2880, True, count=32, expert=True)
    assert linear_stored_bytes(scheme, w2, 2, intermediate_multiple=64).packed_bytes == (
        32 * 2880 * 736
    )


@pytest.mark.parametrize(
    ("quantization", "config", "field"),
    [
        ("awq", GPTQ_W4A16, "quantization"),  # the config is GPTQ
        ("fp8", GPTQ_W4A16, "quantization"),
        ("gptq_marlin", {**GPTQ_W4A16, "bits": 3}, "quantization_config/bits"),
        ("gptq_marlin", {**GPTQ_W4A16, "sym": False}, "quantization_config/sym"),
        ("gptq_marlin", {**GPTQ_W4A16, "group_size": 256}, "quantization_config/group_size"),
        (None, {**GPTQ_W4A16, "bits": 5}, "quantization_config/bits"),
        (
            "awq",
            {"quant_method": "awq", "bits": 3, "group_size": 128, "zero_point": True},
            "quantization_config/bits",
        ),
        ("gptq", None, "quantization_config"),  # a checkpoint method without its config
        (
            None,
            {"quant_method": "gptq", "bits": 4, "group_size": 128},
            "quantization_config/desc_act",
        ),
        (None, {"quant_method": "bitsandbytes"}, "quantization_config/quant_method"),
        (
            None,
            {
                "quant_method": "compressed-tensors",
                "config_groups": {
                    "g": {
                        "targets": ["Linear"],
                        "weights": {
                            "num_bits": 8,
                            "type": "float",
                            "strategy": "block",
                            "block_structure": [0, 128],
                        },
                    }
                },
            },
            "quantization_config/config_groups/g/weights/block_structure",
        ),
        (
            None,
            {"quant_method": "compressed-tensors", "config_groups": {"g": {"targets": 5}}},
            "quantization_config/config_groups/g/targets",
        ),
        (None, {"bits": 4}, "quantization_config/quant_method"),
        (
            None,
            {"quant_method": "fp8", "activation_scheme": "dynamic", "ignored_layers": ["q_proj"]},
            "quantization_config",
        ),
    ],
)
def test_a_contradicted_or_incomplete_quantization_names_its_field(
    quantization: str | None, config: dict[str, Any] | None, field: str
) -> None:
    dense = decoder_stage_weights_bytes(LLAMA31_8B, 1, 1, 2)

    def weights() -> None:
        scheme = resolve_scheme(quantization, config)
        assert scheme is not None
        quantized_stage_weights(LLAMA31_8B, scheme, 1, 1, 2, dense)

    with pytest.raises(EngineInputError) as err:
        weights()
    assert err.value.field == field


def test_vllm_refuses_the_mismatch_in_its_own_words() -> None:
    with pytest.raises(EngineInputError) as err:
        resolve_scheme("awq", GPTQ_W4A16)
    assert str(err.value) == (
        "Quantization method specified in the model config (gptq) does not match the "
        "quantization method specified in the `quantization` argument (awq)."
    )


def test_marlin_refuses_a_rank_whose_inputs_are_not_a_multiple_of_128() -> None:
    llama2_7b = replace(LLAMA31_8B, kv_heads=32, intermediate_size=11008, vocab_size=32000)
    scheme = resolve_scheme(None, {**GPTQ_W4A16, "desc_act": False})
    assert scheme is not None
    dense = decoder_stage_weights_bytes(llama2_7b, 2, 1, 2)
    quantized_stage_weights(llama2_7b, scheme, 2, 1, 2, dense)  # 5504 = 43 x 128
    with pytest.raises(EngineInputError) as err:
        quantized_stage_weights(
            llama2_7b, scheme, 4, 1, 2, decoder_stage_weights_bytes(llama2_7b, 4, 1, 2)
        )
    assert err.value.field == "tensor_parallel_size"
    assert "input_size_per_partition = 2752" in str(err.value)


def test_mla_models_are_refused() -> None:
    mla = replace(LLAMA31_8B, mla_latent_dim=576)
    scheme = resolve_scheme("fp8", None)
    assert scheme is not None
    with pytest.raises(EngineInputError) as err:
        quantized_stage_weights(mla, scheme, 1, 1, 2, (0,))
    assert err.value.field == "quantization"


def test_pipeline_stages_keep_embedding_first_and_head_last() -> None:
    scheme = resolve_scheme("fp8", None)
    assert scheme is not None
    dense = decoder_stage_weights_bytes(LLAMA31_8B, 1, 2, 2)
    first, last = quantized_stage_weights(LLAMA31_8B, scheme, 1, 2, 2, dense).stages
    embed = 128256 * 4096 * 2
    assert first.unquantized_bytes == embed + 16 * 2 * 4096 * 2
    assert last.unquantized_bytes == embed + 16 * 2 * 4096 * 2 + 4096 * 2
    assert first.stored.packed_bytes == last.stored.packed_bytes == 16 * LLAMA_LINEAR_PARAMS
