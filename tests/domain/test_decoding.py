"""Decoder serving: paged KV blocks, beams, concurrency and the serving shape (golden numbers
worked by hand on a 2-layer GPT-2 of hidden 64)."""

import pytest

from app.domain.graph.analysis import GraphAnalysis, analyze
from app.domain.performance.decoding import (
    Batching,
    DecoderServing,
    DecodingInputError,
    kv_elements_per_token,
    max_concurrent_requests,
    paged_kv_tokens,
    serving_shape,
)
from app.domain.performance.errors import RooflineInputError
from app.domain.performance.kernels import count_kernels
from app.domain.performance.phases import decoder_shape
from app.domain.performance.precision_schemes import PRECISION_SCHEMES
from app.domain.precision import Precision
from app.domain.zoo import gpt2, llama

MODEL = gpt2(layers=2, hidden=64, heads=4, vocab=100, positions=256)
FP16 = PRECISION_SCHEMES[Precision.FP16]


def _at(batch: int, seq: int) -> GraphAnalysis:
    return analyze(MODEL.inputs, MODEL.layers, {"batch": batch, "seq": seq}, training=False)


@pytest.mark.parametrize(
    ("prompt", "generated", "beams", "block", "slots"),
    [
        (100, 20, 1, 16, 128),  # ceil(120 / 16) = 8 blocks
        (100, 20, 4, 16, 16 * (6 + 4 * 2)),  # 6 shared; 4 + 20 = 24 per beam -> 2 blocks each
        (128, 1, 4, 64, 64 * (2 + 4 * 1)),  # a full prompt shares every block
        (1065, 75, 4, 64, 64 * (16 + 4 * 2)),  # MLPerf GPT-J as mapped: 1,536 slots
        (1, 1, 1, 64, 64),
    ],
)
def test_paged_kv_tokens(prompt: int, generated: int, beams: int, block: int, slots: int) -> None:
    assert paged_kv_tokens(prompt, generated, beam_width=beams, block_tokens=block) == slots


def test_kv_elements_per_token_and_concurrency() -> None:
    # 2 layers x (K, V) x 64 = 256 elements per token; at fp16 512 B
    per_token = kv_elements_per_token(_at(1, 1)) * FP16.kv_cache_bytes
    assert per_token == 512
    serving = DecoderServing(prompt_tokens_max=200, prompt_tokens_mean=100,
                             generated_tokens_max=40, generated_tokens_mean=20,
                             batching=Batching.CONTINUOUS, beam_width=2,
                             kv_block_tokens=16)  # fmt: skip
    # 6 full prompt blocks shared, 4 + 20 = 24 tokens per beam -> 2 blocks x 2 beams: 10 blocks
    assert serving.kv_tokens_per_request() == 160
    per_request = serving.kv_tokens_per_request() * per_token  # 81,920 B
    assert max_concurrent_requests(1_000_000, per_request) == 12
    assert max_concurrent_requests(1_000_000, per_request, limit=8) == 8
    assert max_concurrent_requests(-5, per_request) == 0
    assert (serving.mean_context_tokens, serving.decode_steps) == (110, 19)
    static = DecoderServing(prompt_tokens_max=200, prompt_tokens_mean=100,
                            generated_tokens_max=40, generated_tokens_mean=20,
                            beam_width=2)  # fmt: skip
    assert static.kv_tokens_per_request() == 2 * 240  # every beam a padded row
    assert (static.mean_context_tokens, static.decode_steps) == (220, 39)


def test_static_one_beam_is_the_decoder_shape() -> None:
    serving = DecoderServing(prompt_tokens_max=32, prompt_tokens_mean=32,
                             generated_tokens_max=8, generated_tokens_mean=8)  # fmt: skip
    got = serving_shape(_at(3, 32), _at(3, 1), requests=3, serving=serving)
    want = decoder_shape(_at(3, 32), _at(3, 1), batch=3, prompt_tokens=32, generated_tokens=8)
    assert got == want


def test_continuous_beams_prefill_once_and_decode_k_rows() -> None:
    serving = DecoderServing(prompt_tokens_max=64, prompt_tokens_mean=32,
                             generated_tokens_max=16, generated_tokens_mean=8,
                             batching=Batching.CONTINUOUS, beam_width=4)  # fmt: skip
    shape = serving_shape(_at(3, 32), _at(12, 1), requests=3, serving=serving)
    prefill, decode = shape.phases
    assert (shape.batch, shape.generated_tokens) == (3, 8)
    assert (prefill.h2d_index, prefill.d2h_index) == (3 * 32, 12)
    assert (decode.repeats, decode.d2h_index) == (7, 12)
    # each attention layer reads the 32-token prompt once per request (3 x 32 tokens) and each
    # beam's 4 generated tokens (12 x 4) of (K, V) x 64, and writes this step's 12 tokens
    kv = [count.kv_elements for count in decode.counts if count.kv_elements]
    assert kv == [(3 * 32 + 12 * 4) * 2 * 64 + 12 * 2 * 64] * 2
    assert serving.shared_read_prompt_tokens == 32
    # the attention FLOPs still run over every beam's whole 36-token context
    per_beam = decoder_shape(_at(3, 32), _at(12, 1), batch=3, prompt_tokens=32,
                             generated_tokens=8, beam_width=4)  # fmt: skip
    flops = [c.flops for c in decode.counts if c.kv_elements]
    assert flops == [c.flops for c in per_beam.phases[1].counts if c.kv_elements]
    # without the sharing every beam reads its own 36 tokens
    assert [c.kv_elements for c in per_beam.phases[1].counts if c.kv_elements] == [
        12 * 36 * 2 * 64 + 12 * 2 * 64
    ] * 2


def test_beams_with_their_own_prompt_copy_read_it_per_beam() -> None:
    serving = DecoderServing(prompt_tokens_max=64, prompt_tokens_mean=32,
                             generated_tokens_max=16, generated_tokens_mean=8,
                             batching=Batching.CONTINUOUS, beam_width=4, kv_block_tokens=16,
                             prompt_shared_by_beams=False)  # fmt: skip
    # each beam holds its own 32 + 8 = 40 tokens: 3 blocks of 16 per beam
    assert serving.kv_tokens_per_request() == 4 * 48
    assert serving.shared_read_prompt_tokens == 0
    assert "its own copy" in serving.describe()
    shape = serving_shape(_at(3, 32), _at(12, 1), requests=3, serving=serving)
    kv = [count.kv_elements for count in shape.phases[1].counts if count.kv_elements]
    assert kv == [12 * 36 * 2 * 64 + 12 * 2 * 64] * 2


def test_static_beams_share_nothing() -> None:
    serving = DecoderServing(prompt_tokens_max=64, prompt_tokens_mean=32,
                             generated_tokens_max=16, generated_tokens_mean=8,
                             beam_width=4)  # fmt: skip
    assert serving.shared_read_prompt_tokens == 0


def test_shared_tokens_beyond_the_context_are_refused() -> None:
    with pytest.raises(RooflineInputError, match="kv_shared_tokens"):
        count_kernels(_at(4, 1), kv_cache=True, kv_context_tokens=10, kv_shared_tokens=11,
                      beam_width=4)  # fmt: skip


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"beam_width": 0}, "beam_width"),
        ({"beam_width": 17}, "beam_width"),
        ({"prompt_tokens_mean": 201}, "exceeds the maximum prompt_tokens"),
        ({"generated_tokens_mean": 41}, "exceeds the maximum generated_tokens"),
        ({"kv_block_tokens": 0}, "kv_block_tokens"),
    ],
)
def test_bad_serving_is_refused(change: dict[str, int], message: str) -> None:
    base = {"prompt_tokens_max": 200, "prompt_tokens_mean": 100, "generated_tokens_max": 40,
            "generated_tokens_mean": 20}  # fmt: skip
    values = {**base, **change}
    with pytest.raises(DecodingInputError, match=message):
        DecoderServing(
            prompt_tokens_max=values["prompt_tokens_max"],
            prompt_tokens_mean=values["prompt_tokens_mean"],
            generated_tokens_max=values["generated_tokens_max"],
            generated_tokens_mean=values["generated_tokens_mean"],
            beam_width=values.get("beam_width", 1),
            kv_block_tokens=values.get("kv_block_tokens", 64),
        )


@pytest.mark.parametrize(
    ("tensor", "elements"),
    [
        # 2 layers x (K, V) x kv_heads per rank x head_dim 16 (hidden 64 / 4 heads)
        (1, 2 * 2 * 4 * 16),  # all 4 heads: 256
        (2, 2 * 2 * 2 * 16),  # split: 128
        (4, 2 * 2 * 1 * 16),  # one head each: 64
        (8, 2 * 2 * 1 * 16),  # one REPLICATED head each (vLLM), not 256 / 8 = 32
    ],
)
def test_a_tensor_parallel_rank_caches_its_kv_heads(tensor: int, elements: int) -> None:
    assert kv_elements_per_token(_at(1, 1), tensor) == elements


def test_a_rank_of_a_multi_query_model_keeps_the_one_kv_head() -> None:
    mqa = llama(layers=2, hidden=64, heads=4, kv_heads=1, intermediate=128, vocab=100)
    step = analyze(mqa.inputs, mqa.layers, {"batch": 1, "seq": 1}, training=False)
    assert kv_elements_per_token(step) == kv_elements_per_token(step, 4) == 2 * 2 * 1 * 16
