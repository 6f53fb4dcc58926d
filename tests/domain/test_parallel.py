"""Tensor and pipeline parallelism as the engines run them (app.domain.parallel and the memory
engine's share of one rank): golden figures derived by hand."""

from __future__ import annotations

from typing import Any

import pytest

from app.domain.graph.analysis import GraphAnalysis, analyze
from app.domain.memory.estimate import MemoryRequest, analyze_for, estimate_memory
from app.domain.memory.formulas import precision_plan, weights_bytes
from app.domain.memory.rank_share import check_tensor_parallel_heads, layer_stages, rank_share
from app.domain.parallel import (
    TensorParallelError,
    check_tensor_parallel,
    kv_heads_per_rank,
    pipeline_stage_layers,
)
from app.domain.performance.errors import RooflineInputError
from app.domain.performance.phases import PhasedRequest, decoder_request
from app.domain.performance.precision_schemes import PRECISION_SCHEMES
from app.domain.performance.tensor_parallel import shard
from app.domain.precision import Precision
from app.domain.workload import Logits, Mode, Parallelism
from app.domain.zoo import ZOO
from app.domain.zoo.transformers import llama
from tests.domain.test_formulas import evaluate


def test_kv_heads_per_rank_follows_vllm() -> None:
    """vLLM's get_num_kv_heads: max(1, kv_heads // tp), one replicated head past the KV heads."""
    assert [kv_heads_per_rank(8, tp) for tp in (1, 2, 4, 8, 16, 32)] == [8, 4, 2, 1, 1, 1]
    assert kv_heads_per_rank(1, 8) == 1  # multi-query: every rank holds the one head


def test_tensor_parallel_must_divide_the_heads() -> None:
    check_tensor_parallel(28, 4, 4)  # Qwen2.5-7B at 4: 7 heads and 1 KV head a rank
    check_tensor_parallel(32, 8, 16)  # Llama-3-8B at 16: 2 heads, the 8 KV heads replicated
    with pytest.raises(TensorParallelError, match=r"does not divide the model's 28 attention"):
        check_tensor_parallel(28, 4, 8)  # vLLM: 28 heads not divisible by 8
    with pytest.raises(TensorParallelError, match="KV heads") as caught:
        check_tensor_parallel(24, 8, 12)  # 12 ranks can neither split nor evenly replicate 8
    assert (caught.value.heads, caught.value.kv_heads, caught.value.tensor) == (24, 8, 12)


def test_pipeline_stage_layers_follow_get_pp_indices() -> None:
    """The remainder goes to the stages before the last, from the last but one backwards."""
    assert pipeline_stage_layers(32, 4) == (8, 8, 8, 8)
    assert pipeline_stage_layers(30, 4) == (7, 8, 8, 7)
    assert pipeline_stage_layers(6, 4) == (1, 2, 2, 1)
    assert pipeline_stage_layers(7, 4) == (2, 2, 2, 1)
    assert pipeline_stage_layers(2, 4) == (0, 1, 1, 0)
    assert sum(pipeline_stage_layers(80, 3)) == 80


def _llama(**bindings: int) -> tuple[Any, Any, dict[str, int]]:
    inputs, layers = ZOO["llama-3-8b"].inputs, ZOO["llama-3-8b"].layers
    return inputs, layers, {"batch": 1, **bindings}


def _lines(request: MemoryRequest, seq: int) -> dict[str, int]:
    inputs, layers, bindings = _llama(seq=seq)
    analysis = analyze_for(inputs, layers, bindings, request)
    return {line.key: line.bytes for line in estimate_memory(analysis, request).lines}


def _serving(tensor: int = 1, pipeline: int = 1) -> MemoryRequest:
    return MemoryRequest(
        mode=Mode.INFERENCE,
        precision=Precision.BF16,
        parallelism=Parallelism(tensor=tensor, pipeline=pipeline),
        logits=Logits.LAST,
    )


def test_kv_cache_per_gpu_at_tensor_16_with_8_kv_heads() -> None:
    """Llama-3-8B (32 layers, 8 KV heads of 128) at 8192 tokens, bf16: each of 16 GPUs holds
    max(1, 8 // 16) = 1 KV head per layer: 2 x 32 x 1 x 128 x 8192 x 2 B = 134,217,728 B (the
    old rule divided the whole cache, 2 x 32 x 8 x 128 x 8192 x 2 B, by 16: 67,108,864 B)."""
    assert _lines(_serving(tensor=16), 8192)["kv_cache"] == 2 * 32 * 1 * 128 * 8192 * 2
    assert 2 * 32 * 1 * 128 * 8192 * 2 == 134_217_728
    # at 4 GPUs the heads split evenly: 2 a GPU
    assert _lines(_serving(tensor=4), 8192)["kv_cache"] == 2 * 32 * 2 * 128 * 8192 * 2


def test_replicated_kv_heads_add_their_projections_to_the_weights() -> None:
    """At 16 GPUs each holds 1 K and 1 V head (128 rows of 4096) per layer instead of 8 / 16 of
    a head (64 rows): 32 x 2 x 64 x 4096 x 2 B = 33,554,432 B beyond 1/16 of 8,030,261,248
    params x 2 B (1,003,782,656 B)."""
    weights = _lines(_serving(tensor=16), 128)["weights"]
    assert weights == 8_030_261_248 * 2 // 16 + 32 * 2 * 64 * 4096 * 2 == 1_037_337_088


def test_tensor_parallel_splits_the_mlp_intermediate() -> None:
    """Llama-3.1-8B, 8192 tokens, bf16: the SwiGLU MLP holds gate, up and their product,
    3 x 8192 x 14,336 x 2 B = 704,643,072 B on one GPU; at tensor 4 each GPU holds 1/4 of the
    columns (176,160,768 B) plus the all-reduced output beside the row-parallel partial sum
    (8192 x 4096 x 2 B = 67,108,864 B)."""
    assert _lines(_serving(), 8192)["transient"] == 3 * 8192 * 14_336 * 2 == 704_643_072
    split = _lines(_serving(tensor=4), 8192)["transient"]
    assert split == 3 * 8192 * 14_336 * 2 // 4 + 8192 * 4096 * 2 == 243_269_632


def _tiny(*, tied: bool) -> GraphAnalysis:
    """6 blocks, hidden 8, 2 heads of 4 (1 KV head), MLP 16, vocab 100."""
    inputs, layers = llama(
        layers=6, hidden=8, heads=2, kv_heads=1, intermediate=16, vocab=100, tied=tied
    )
    request = MemoryRequest(mode=Mode.INFERENCE, logits=Logits.ALL)
    return analyze_for(inputs, layers, {"batch": 1, "seq": 10}, request)


# A block: attention q 8x8 + k 4x8 + v 4x8 + o 8x8 = 192, MLP 3 x 8 x 16 = 384, two RMSNorms
# 2 x 8: 592 params. Embedding 100 x 8 = 800, final norm 8, head 8 x 100 = 800.
BLOCK, EMBEDDING, NORM, HEAD = 592, 800, 8, 800


@pytest.mark.parametrize("tied", [False, True])
def test_weights_per_stage_at_pipeline_4(tied: bool) -> None:
    """6 blocks over 4 stages: (1, 2, 2, 1) (get_pp_indices); stage 0 adds the embedding, stage
    3 the final norm and the head (a tied head: a copy of the embedding, as vLLM builds
    embed_tokens on the last rank). fp32: 4 B a param."""
    analysis = _tiny(tied=tied)
    plan = precision_plan(Precision.FP32)
    full, _ = weights_bytes(analysis, plan, Precision.FP32)
    assert full == 4 * (6 * BLOCK + EMBEDDING + NORM + (0 if tied else HEAD))
    share = rank_share(analysis, plan, Precision.FP32, full, 1, 4, 4)
    expected = [
        4 * (BLOCK + EMBEDDING),  # 5568
        4 * 2 * BLOCK,  # 4736
        4 * 2 * BLOCK,
        4 * (BLOCK + NORM + HEAD),  # 5600 (the tied head's weight is the embedding's copy)
    ]
    assert [stage.weights for stage in share.stages] == expected
    assert [stage.blocks for stage in share.stages] == [1, 2, 2, 1]
    # KV cache: 2 x blocks x 1 KV head x 4 x 10 tokens
    assert [stage.kv_numel for stage in share.stages] == [80, 160, 160, 80]
    # the worst stage (weights + KV at 4 B): stage 3, 5600 + 320 B
    assert share.worst == 3
    assert share.weights == 5600
    stages = layer_stages(analysis, 4)
    assert stages is not None
    names = [layer.name for layer in analysis.layers]
    assert stages[names.index("embed_tokens")] == 0
    assert stages[names.index("lm_head")] == 3


def test_weights_per_stage_with_tensor_parallel_replicate_kv_projections() -> None:
    """Tensor 2 x pipeline 4 on the tiny model: its 1 KV head is replicated, so each rank holds
    the whole K and V projections (4 rows of 8 each per block) instead of half: + 2 x (4 - 2)
    x 8 = 32 params a block beyond half the stage's weights."""
    analysis = _tiny(tied=False)
    plan = precision_plan(Precision.FP32)
    full, _ = weights_bytes(analysis, plan, Precision.FP32)
    share = rank_share(analysis, plan, Precision.FP32, full, 2, 4, 4)
    assert share.stages[3].weights == 4 * (BLOCK + NORM + HEAD) // 2 + 4 * 32 * 1
    assert share.stages[1].weights == 4 * 2 * BLOCK // 2 + 4 * 32 * 2
    # and every rank caches the one KV head whole: 2 x blocks x 1 x 4 x 10
    assert [stage.kv_numel for stage in share.stages] == [80, 160, 160, 80]


def test_check_tensor_parallel_heads_reads_the_graph() -> None:
    """Every attention layer of the graph is checked; the error names its heads."""
    inputs, layers = llama(
        layers=2, hidden=56, heads=28, kv_heads=4, intermediate=64, vocab=100, head_dim=2
    )
    request = MemoryRequest(mode=Mode.INFERENCE, parallelism=Parallelism(tensor=8))
    analysis = analyze_for(inputs, layers, {"batch": 1, "seq": 4}, request)
    with pytest.raises(TensorParallelError, match="28 attention heads"):
        check_tensor_parallel_heads(analysis, 8)
    check_tensor_parallel_heads(analysis, 4)
    check_tensor_parallel_heads(analysis, 1)


def _decoder(slug: str) -> PhasedRequest:
    model = ZOO[slug]
    bindings = {**model.default_bindings, "batch": 1}
    prefill = analyze(model.inputs, model.layers, {**bindings, "seq": 128}, training=False)
    step = analyze(model.inputs, model.layers, {**bindings, "seq": 1}, training=False)
    return decoder_request(
        prefill,
        step,
        PRECISION_SCHEMES[Precision.BF16],
        batch=1,
        prompt_tokens=128,
        generated_tokens=16,
    )


def test_speed_side_reads_the_same_kv_rule() -> None:
    """The roofline's tensor-parallel share reads max(1, kv_heads // t) KV heads a layer: at 16
    GPUs Llama-3-8B's 8 KV heads are replicated, so each GPU moves 1/8 of the cache (not 1/16);
    at 4 GPUs 2 heads, 1/4."""
    whole = _decoder("llama-3-8b")
    for degree, share_of_cache in ((4, 4), (16, 8)):
        part = shard(whole, degree)
        for phase, split in zip(whole.phases, part.phases, strict=True):
            for k, h in zip(phase.kernels, split.kernels, strict=True):
                if k.kv_cache_bytes:
                    assert k.kv_heads == 8
                    assert h.kv_cache_bytes == -(-k.kv_cache_bytes // share_of_cache)
                    assert h.kv_cache_bytes > 0
    assert any("max(1, kv_heads // 16)" in a for a in shard(whole, 16).assumptions)


def test_speed_side_refuses_a_degree_that_does_not_divide_the_heads() -> None:
    """GPT-2 (12 heads): a tensor-parallel group of 8 is refused as vLLM refuses it; the
    recommendation lists the group as excluded with this reason."""
    whole = _decoder("gpt-2")
    shard(whole, 4)
    with pytest.raises(RooflineInputError, match="12 attention heads"):
        shard(whole, 8)


@pytest.mark.parametrize(
    ("tensor", "pipeline", "precision"),
    [
        (16, 1, Precision.BF16),
        (2, 4, Precision.BF16),
        (1, 3, Precision.INT4),
        (4, 2, Precision.FP8),
    ],
)
def test_parallel_lines_keep_their_formulas_evaluable(
    tensor: int, pipeline: int, precision: Precision
) -> None:
    """The weights and KV cache formulas of a rank's share evaluate to their bytes."""
    request = MemoryRequest(
        mode=Mode.INFERENCE,
        precision=precision,
        parallelism=Parallelism(tensor=tensor, pipeline=pipeline),
        logits=Logits.LAST,
    )
    inputs, layers, bindings = _llama(seq=512)
    estimate = estimate_memory(analyze_for(inputs, layers, bindings, request), request)
    lines = {line.key: line for line in estimate.lines}
    for key in ("weights", "kv_cache"):
        value, stated = evaluate(lines[key].formula)
        assert value == stated == lines[key].bytes, lines[key].formula
    if pipeline > 1:
        assert any("stage 0:" in note for note in lines["weights"].assumptions)
