"""The engine's requirement (app.domain.fit.engine_requirement): the least memory a GPU must show
to CUDA for vLLM to start with N sequences of max_model_len, whose verdict (app.domain.fit.fits)
is vLLM's own start verdict (app.domain.engines.vllm.engine_memory) on every side of it."""

from __future__ import annotations

import math

import pytest

from app.domain.engines.vllm import (
    H100_80GB_CUDA_VISIBLE_BYTES,
    ServingModel,
    VllmOptions,
    decoder_stage_weights_bytes,
    engine_memory,
)
from app.domain.fit import (
    EngineStageNeed,
    FitInputError,
    engine_kv_bytes_needed,
    engine_requirement,
    fits,
    smallest_claiming,
)
from app.domain.units import GIB

# meta-llama/Meta-Llama-3-8B's config.json, by hand.
LLAMA_3_8B = ServingModel(
    layers=32,
    hidden_size=4096,
    attention_heads=32,
    kv_heads=8,
    head_dim=128,
    intermediate_size=14336,
    vocab_size=128256,
    max_position_embeddings=8192,
)


def _requirement(options: VllmOptions, visible: int, sequences: int = 1) -> int:
    weights = decoder_stage_weights_bytes(
        LLAMA_3_8B, options.tensor_parallel_size, options.pipeline_parallel_size, 2
    )
    memory = engine_memory(LLAMA_3_8B, options, visible, weights)
    util = options.gpu_memory_utilization or 0.9
    return engine_requirement(
        [
            EngineStageNeed(
                weights_bytes=s.weights_bytes,
                peak_bytes=s.peak_bytes,
                non_torch_bytes=s.non_torch_bytes,
                graphs_bytes=0,
                kv_bytes_per_token=s.kv_bytes_per_token,
                rotary_cache_bytes=s.rotary_cache_bytes,
            )
            for s in memory.stages
        ],
        gpu_memory_utilization=util,
        sequences=sequences,
        max_model_len=options.max_model_len or 8192,
        block_size=options.block_size or 16,
        engine="vllm 0.19.0",
    ).required_bytes


@pytest.mark.parametrize(
    ("total", "util"),
    [(1, 0.9), (10**9, 0.9), (19_431_812_301, 0.9), (7 * GIB + 3, 0.33), (123_456_789, 1.0)],
)
def test_smallest_claiming_is_the_least_memory_whose_claim_holds_the_total(
    total: int, util: float
) -> None:
    size = smallest_claiming(total, util)
    assert math.floor(util * size) >= total
    assert math.floor(util * (size - 1)) < total


def test_smallest_claiming_refuses_a_utilization_outside_0_1() -> None:
    for util in (0.0, 1.5, -0.1):
        with pytest.raises(FitInputError):
            smallest_claiming(10, util)


def test_kv_needed_is_whole_blocks_of_n_sequences() -> None:
    # Hand-derived: 2 (K, V) x 32 layers x 8 KV heads x 128 x 2 B = 131,072 B a token;
    # one 8,192-token sequence = 512 blocks of 16 = 1 GiB; 3 x 1,000 tokens = 188 blocks.
    assert engine_kv_bytes_needed(131_072, sequences=1, max_model_len=8192, block_size=16) == GIB
    assert (
        engine_kv_bytes_needed(131_072, sequences=3, max_model_len=1000, block_size=16)
        == 188 * 16 * 131_072
    )


def test_llama_3_8b_on_an_h100_golden_lines() -> None:
    """The default vLLM options on an H100 80GB (79.19 GiB shown): the lines, by hand."""
    options = VllmOptions(max_num_batched_tokens=8192, max_num_seqs=1024)
    weights = decoder_stage_weights_bytes(LLAMA_3_8B, 1, 1, 2)
    memory = engine_memory(LLAMA_3_8B, options, H100_80GB_CUDA_VISIBLE_BYTES, weights)
    (stage,) = memory.stages
    req = engine_requirement(
        [EngineStageNeed(weights_bytes=stage.weights_bytes, peak_bytes=stage.peak_bytes,
                         non_torch_bytes=stage.non_torch_bytes, graphs_bytes=0,
                         kv_bytes_per_token=stage.kv_bytes_per_token,
                         rotary_cache_bytes=stage.rotary_cache_bytes)],
        gpu_memory_utilization=0.9, sequences=1, max_model_len=8192, block_size=16,
        engine="vllm 0.19.0",
    )  # fmt: skip
    lines = {line.key: line.bytes for line in req.lines}
    assert lines["engine_weights"] == 8_030_261_248 * 2
    # rotary cos/sin cache: 8,192 positions x 128 x 2 B (vLLM's RotaryEmbedding.cos_sin_cache)
    assert lines["engine_rotary_cache"] == 8192 * 128 * 2 == 2_097_152
    assert lines["engine_non_torch"] == round(0.25 * GIB)
    assert lines["engine_kv_cache"] == GIB
    spent = 8_030_261_248 * 2 + 2_097_152 + stage.peak_bytes + round(0.25 * GIB) + GIB
    assert req.required_bytes == smallest_claiming(spent, 0.9)
    assert sum(lines.values()) == req.required_bytes
    assert req.safety_margin_fraction == 0.0


@pytest.mark.parametrize(
    "options",
    [
        VllmOptions(max_num_batched_tokens=8192, max_num_seqs=1024),
        VllmOptions(max_num_batched_tokens=2048, max_num_seqs=256, gpu_memory_utilization=0.95),
        VllmOptions(
            max_num_batched_tokens=2048, max_num_seqs=256, max_model_len=4096, block_size=32
        ),
        VllmOptions(max_num_batched_tokens=8192, max_num_seqs=512, pipeline_parallel_size=2),
        VllmOptions(max_num_batched_tokens=8192, max_num_seqs=512, tensor_parallel_size=4),
        VllmOptions(
            max_num_batched_tokens=4096, max_num_seqs=128, kv_cache_dtype="fp8", max_model_len=777
        ),
    ],
)
@pytest.mark.parametrize("sequences", [1, 7])
def test_the_verdict_is_the_engines_on_both_sides_of_the_requirement(
    options: VllmOptions, sequences: int
) -> None:
    """Options fixed (the defaults do not move with the memory): at the requirement the engine
    starts with at least N sequences; one byte less and it does not (or holds fewer)."""
    required = _requirement(options, H100_80GB_CUDA_VISIBLE_BYTES, sequences)
    mml = options.max_model_len or 8192
    for visible in (required - 1, required, required + 1, required + 10**6):
        pp = options.pipeline_parallel_size
        weights = decoder_stage_weights_bytes(LLAMA_3_8B, options.tensor_parallel_size, pp, 2)
        memory = engine_memory(LLAMA_3_8B, options, visible, weights)
        qualifies = memory.starts and memory.kv_tokens >= sequences * mml
        assert fits(required, visible) is qualifies, visible - required
        assert qualifies is (visible >= required)


def test_an_engine_serves_inference_only() -> None:
    from app.domain.engines.choice import EngineChoice
    from app.domain.workload import Mode, WorkloadInputError, WorkloadSpec

    choice = EngineChoice(name="vllm", options=VllmOptions())
    assert WorkloadSpec(mode=Mode.INFERENCE, batch_size=1, engine=choice).engine is choice
    with pytest.raises(WorkloadInputError, match="engine is an inference option"):
        WorkloadSpec(mode=Mode.TRAINING, batch_size=1, engine=choice)
