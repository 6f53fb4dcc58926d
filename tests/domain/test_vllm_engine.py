"""vLLM 0.19 start-up memory (app.domain.engines.vllm): golden bytes derived by hand."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from app.domain.engines.vllm import (
    H100_80GB_CUDA_VISIBLE_BYTES,
    NO_MEMORY_MESSAGE,
    VLLM_0_19,
    EngineInputError,
    EngineMemory,
    ServingModel,
    VllmOptions,
    decoder_stage_weights_bytes,
    engine_memory,
    kv_cache_bytes_per_token,
    resolve_options,
    rotary_cache_bytes,
    start_verdict,
)
from app.domain.units import GIB, MIB

# meta-llama/Meta-Llama-3-8B (tests/fixtures/hf_configs/llama-3-8b.json)
LLAMA3_8B = ServingModel(
    layers=32,
    hidden_size=4096,
    attention_heads=32,
    kv_heads=8,
    head_dim=128,
    intermediate_size=14336,
    vocab_size=128256,
    max_position_embeddings=8192,
)

# vLLM's rotary cos/sin cache for it: 8,192 positions x 128 (rotary_dim = head_dim) x 2 B (bf16)
# = 2 MiB on every GPU (vllm/model_executor/layers/rotary_embedding/base.py).
ROTARY = 8192 * 128 * 2

# Round constants so that every figure below is derived by hand.
ROUND = replace(
    VLLM_0_19,
    sampler_bytes_per_logit=16.0,
    non_torch_single_gpu_bytes=256 * MIB,
    non_torch_tensor_parallel_bytes=2 * GIB,
    non_torch_pipeline_bytes=64 * MIB,
)


@pytest.mark.parametrize(
    ("tp", "kv_bytes", "expected"),
    [
        (1, 2, 2 * 32 * 8 * 128 * 2),  # 131,072 B: bf16, 8 KV heads
        (2, 2, 2 * 32 * 4 * 128 * 2),  # 65,536 B: 4 KV heads a rank
        (1, 1, 2 * 32 * 8 * 128 * 1),  # 65,536 B: fp8 KV
        (2, 1, 2 * 32 * 4 * 128 * 1),  # 32,768 B
        (16, 2, 2 * 32 * 1 * 128 * 2),  # 16,384 B: one replicated KV head a rank, not 8/16
    ],
)
def test_kv_bytes_per_token_llama3_8b(tp: int, kv_bytes: int, expected: int) -> None:
    assert kv_cache_bytes_per_token(LLAMA3_8B, 32, tp, kv_bytes) == expected


def test_kv_bytes_per_token_mla_is_one_latent_a_layer_on_every_rank() -> None:
    # DeepSeek-V2-Lite: 27 layers x (kv_lora_rank 512 + qk_rope_head_dim 64) x 2 B = 31,104 B.
    mla = replace(LLAMA3_8B, layers=27, attention_heads=16, kv_heads=16, mla_latent_dim=576)
    assert kv_cache_bytes_per_token(mla, 27, 1, 2) == 31_104
    assert kv_cache_bytes_per_token(mla, 27, 2, 2) == 31_104


def test_fp8_kv_cache_dtype_is_independent_of_weights() -> None:
    opts = resolve_options(
        VllmOptions(max_model_len=8192, kv_cache_dtype="fp8"), LLAMA3_8B, 80 * GIB
    )
    assert (opts.dtype_bytes, opts.kv_cache_dtype_bytes) == (2, 1)


def _answer(weights: int, **options: Any) -> EngineMemory:
    opts = VllmOptions(
        max_model_len=8192,
        gpu_memory_utilization=0.5,
        max_num_seqs=256,
        **options,
    )
    return engine_memory(LLAMA3_8B, opts, 80 * GIB, [weights], profile=ROUND, forward_peak=GIB)


def test_rotary_cache_by_hand() -> None:
    assert rotary_cache_bytes(LLAMA3_8B, 2) == ROTARY == 2_097_152
    # Llama-3.1-8B: 131,072 positions x 128 x 2 B = 0.03125 GiB; in fp32 twice that
    llama31 = replace(LLAMA3_8B, max_position_embeddings=131_072)
    assert rotary_cache_bytes(llama31, 2) == 33_554_432 == GIB // 32
    assert rotary_cache_bytes(llama31, 4) == 2 * 33_554_432
    # DeepSeek-V2-Lite (MLA): qk_rope_head_dim 64 x 163,840 positions (4,096 x YaRN factor 40)
    from app.domain.engines.families import MlaGeometry

    mla = MlaGeometry(kv_lora_rank=512, qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128)
    deepseek = replace(LLAMA3_8B, mla=mla, mla_latent_dim=576, max_position_embeddings=163_840)
    assert rotary_cache_bytes(deepseek, 2) == 163_840 * 64 * 2 == 20_971_520
    # partial rotary (rotary_dim 96 of 128) and explicit rows; none without rotary embeddings
    assert rotary_cache_bytes(replace(LLAMA3_8B, rotary_dim=96, rotary_positions=1000), 2) == (
        1000 * 96 * 2
    )
    assert rotary_cache_bytes(replace(LLAMA3_8B, rotary_dim=0), 2) == 0


def test_pool_tokens_and_concurrency_by_hand() -> None:
    # requested 0.5 x 80 GiB = 40 GiB; sampler 16 x 256 x 128,256 = 525,336,576 B < forward 1 GiB,
    # so the peak is 1 GiB; non-torch 256 MiB; rotary cache 2 MiB;
    # pool 40 GiB - 16 GiB - 2 MiB - 1 GiB - 256 MiB = 24,425,529,344 B;
    # / 131,072 B = 186,352 tokens (11,647 blocks of 16: the 2 MiB is one block);
    # 186,352 / 8,192 = 22.748046875.
    ans = _answer(16 * GIB)
    stage = ans.stages[0]
    assert ans.requested_bytes == 40 * GIB
    assert stage.peak_bytes == GIB
    assert stage.non_torch_bytes == 256 * MIB
    assert stage.rotary_cache_bytes == ROTARY
    assert stage.kv_pool_bytes == 40 * GIB - 16 * GIB - ROTARY - GIB - 256 * MIB == 24_425_529_344
    assert ans.kv_tokens == 186_352
    assert ans.max_concurrency == pytest.approx(22.748046875)
    assert ans.starts
    assert ans.reason is None
    assert ans.cuda_graph_pool_bytes == VLLM_0_19.cuda_graph_pool_bytes
    assert _answer(16 * GIB, enforce_eager=True).cuda_graph_pool_bytes == 0


def test_kv_tokens_round_down_to_whole_blocks() -> None:
    # A pool of 175 tokens' bytes holds 10 whole blocks of 16 (160 tokens), 5 blocks of 32
    # (160 tokens), 175 blocks of 1 (175 tokens).
    per_token = 131_072
    pool = 175 * per_token
    weights = 40 * GIB - GIB - 256 * MIB - ROTARY - pool
    ans16 = _answer(weights)
    assert ans16.stages[0].kv_pool_bytes == pool
    assert ans16.stages[0].kv_tokens == 160
    assert _answer(weights, block_size=32).stages[0].kv_tokens == 160
    assert _answer(weights, block_size=1).stages[0].kv_tokens == 175


def test_start_verdict_quotes_vllm_when_one_sequence_does_not_fit() -> None:
    # pool 40 GiB - (38.5 GiB - 2 MiB) - 2 MiB rotary - 1 GiB - 0.25 GiB = 0.25 GiB; one
    # 8,192-token sequence needs 1 GiB; 0.25 GiB / 131,072 B = 2,048 tokens is vLLM's estimated
    # maximum model length.
    ans = _answer(38 * GIB + 512 * MIB - ROTARY)
    assert not ans.starts
    assert ans.kv_tokens == 0
    assert ans.max_concurrency == 0.0
    assert ans.reason == (
        "To serve at least one request with the models's max seq len (8192), (1.00 GiB KV cache "
        "is needed, which is larger than the available KV cache memory (0.25 GiB). Based on the "
        "available memory, the estimated maximum model length is 2048. Try increasing "
        "`gpu_memory_utilization` or decreasing `max_model_len` when initializing the engine."
    )
    assert _answer(40 * GIB - ROTARY).reason == NO_MEMORY_MESSAGE
    # Exactly one sequence fits: it starts.
    assert start_verdict(GIB, 131_072, 8192, 16) is None


def test_pipeline_stages_hold_embedding_first_head_last_and_the_smallest_pool_decides() -> None:
    # 218,112,000 parameters a layer (attention 41,943,040 + MLP 176,160,768 + 2 norms 8,192);
    # embedding and head 128,256 x 4,096 = 525,336,576 each; final norm 4,096.
    stage0, stage1 = decoder_stage_weights_bytes(LLAMA3_8B, 1, 2, 2)
    assert stage0 == (16 * 218_112_000 + 525_336_576) * 2 == 8_030_257_152
    assert stage1 == (16 * 218_112_000 + 525_336_576 + 4_096) * 2
    opts = VllmOptions(
        max_model_len=8192, gpu_memory_utilization=0.5, max_num_seqs=256, pipeline_parallel_size=2
    )
    ans = engine_memory(
        LLAMA3_8B, opts, 80 * GIB, [stage0, stage1], profile=ROUND, forward_peak=GIB
    )
    first, last = ans.stages
    # The last stage keeps hidden states and residual of 8,192 tokens from stage 0: 128 MiB.
    assert first.peak_bytes == GIB
    assert last.peak_bytes == GIB + 2 * 8192 * 4096 * 2
    assert first.kv_bytes_per_token == last.kv_bytes_per_token == 2 * 16 * 8 * 128 * 2
    assert ans.kv_tokens == min(first.kv_tokens, last.kv_tokens) == last.kv_tokens


def test_tensor_parallel_weights_split_with_vocab_parallel_head() -> None:
    # TP 2: attention 41,943,040 / 2, MLP / 2, norms replicated: 109,060,096 a layer;
    # embedding and head 128,256 / 2 x 4,096 = 262,668,288 each.
    (weights,) = decoder_stage_weights_bytes(LLAMA3_8B, 2, 1, 2)
    assert weights == (32 * (20_971_520 + 88_080_384 + 8_192) + 2 * 262_668_288 + 4_096) * 2


def test_defaults_follow_the_gpu_size() -> None:
    big = resolve_options(VllmOptions(max_model_len=4096), LLAMA3_8B, H100_80GB_CUDA_VISIBLE_BYTES)
    assert (big.max_num_batched_tokens, big.max_num_seqs, big.block_size) == (8192, 1024, 16)
    assert big.gpu_memory_utilization == 0.9
    small = resolve_options(VllmOptions(max_model_len=4096), LLAMA3_8B, 40 * GIB)
    assert (small.max_num_batched_tokens, small.max_num_seqs) == (2048, 256)
    assert resolve_options(VllmOptions(), LLAMA3_8B, 40 * GIB).max_model_len == 8192


@pytest.mark.parametrize(
    ("options", "field"),
    [
        (VllmOptions(gpu_memory_utilization=0.0), "gpu_memory_utilization"),
        (VllmOptions(gpu_memory_utilization=1.01), "gpu_memory_utilization"),
        (VllmOptions(tensor_parallel_size=3), "tensor_parallel_size"),
        (VllmOptions(max_model_len=8193), "max_model_len"),
        (VllmOptions(kv_cache_dtype="int3"), "kv_cache_dtype"),
        (VllmOptions(pipeline_parallel_size=0), "pipeline_parallel_size"),
    ],
)
def test_refused_options_name_their_field(options: VllmOptions, field: str) -> None:
    with pytest.raises(EngineInputError) as err:
        resolve_options(options, LLAMA3_8B, 80 * GIB)
    assert err.value.field == field
