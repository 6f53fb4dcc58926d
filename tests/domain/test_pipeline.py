"""Golden numbers of pipeline parallelism: the stage split, the bytes between stages, the
cycle, the idle share and the GPipe bubble (hand-computable)."""

from dataclasses import replace

import pytest

from app.domain.graph.analysis import analyze
from app.domain.hardware import DeviceKind, HardwareSpec
from app.domain.performance.errors import RooflineInputError
from app.domain.performance.phases import PhasedRequest, decoder_request
from app.domain.performance.pipeline import (
    PIPELINE_TRANSFER_LATENCY_S,
    block_key,
    blocks_per_stage,
    micro_batching,
    pipeline_phase,
    predict_pipeline,
    split_stages,
)
from app.domain.performance.precision_schemes import PRECISION_SCHEMES
from app.domain.performance.prediction import Bound
from app.domain.performance.roofline import predict
from app.domain.performance.tensor_parallel import shard
from app.domain.precision import DType, Precision
from app.domain.zoo import llama
from tests.domain.test_roofline import HAND_CAL

FP16 = PRECISION_SCHEMES[Precision.FP16]
HIDDEN = 64
PROMPT = 8
# 5 blocks: stages of 3 + 2 (the remainder before the last stage)
TINY = llama(layers=5, hidden=HIDDEN, heads=4, kv_heads=2, intermediate=128, vocab=100)

GPU = HardwareSpec(
    slug="hand-gpu",
    name="Hand GPU",
    kind=DeviceKind.GPU,
    peak_flops_per_s={DType.FP16: 1e12},
    memory_bandwidth_bytes_per_s=1e11,
    memory_bytes=2**30,
    host_link_bytes_per_s=1e10,
    host_link_source="test",
    gpu_link_bytes_per_s=4e10,
    tdp_watts=100.0,
    price_usd_per_hour=3.6,
)
CAL = HAND_CAL  # round numbers, as test_roofline's hand-checked figures


def _request(batch: int) -> PhasedRequest:
    bindings = {"batch": batch}
    prefill = analyze(TINY.inputs, TINY.layers, {**bindings, "seq": PROMPT}, training=False)
    step = analyze(TINY.inputs, TINY.layers, {**bindings, "seq": 1}, training=False)
    return decoder_request(
        prefill, step, FP16, batch=batch, prompt_tokens=PROMPT, generated_tokens=4
    )


@pytest.mark.parametrize(
    ("blocks", "stages", "expected"),
    [
        (32, 4, (8, 8, 8, 8)),
        (80, 3, (27, 27, 26)),  # the remainder to the stages before the last (vLLM)
        (5, 2, (3, 2)),
        (10, 4, (2, 3, 3, 2)),  # first and last keep the floor
        (2, 2, (1, 1)),
    ],
)
def test_blocks_are_split_evenly_remainder_before_the_last_stage(
    blocks: int, stages: int, expected: tuple[int, ...]
) -> None:
    assert blocks_per_stage(blocks, stages) == expected


def test_a_split_needs_two_stages_and_a_block_per_stage() -> None:
    with pytest.raises(RooflineInputError, match=">= 2 stages"):
        blocks_per_stage(32, 1)
    with pytest.raises(RooflineInputError, match="needs at least 4 repeated blocks"):
        blocks_per_stage(3, 4)


def test_block_key_is_the_name_up_to_the_block_index() -> None:
    assert block_key("layers.12.mlp") == "layers.12"
    assert block_key("h.0.attn.c_proj") == "h.0"
    assert block_key("lm_head") is None


def test_stages_of_a_tiny_llama_and_the_bytes_between_them() -> None:
    """5 blocks on 2 stages: embedding + blocks 0-2 (13 kernels), blocks 3-4 + norm + head
    (10 kernels); the boundary sends the hidden state: batch x tokens x 64 x 2 B."""
    whole = _request(2)
    plan = split_stages(whole, 2)
    first, last = plan.spans
    assert (first.first_kernel, first.last_kernel, first.blocks, first.kernels) == (
        "embed_tokens",
        "layers.2.mlp",
        3,
        13,
    )
    assert (last.first_kernel, last.last_kernel, last.blocks, last.kernels) == (
        "layers.3.input_layernorm",
        "lm_head",
        2,
        10,
    )
    assert plan.send_bytes == ((2 * PROMPT * HIDDEN * 2,), (2 * 1 * HIDDEN * 2,))
    assert plan.send_bytes == ((2048,), (256,))
    for index, phase in enumerate(whole.phases):
        parts = [stage.phases[index] for stage in plan.stages]
        assert sum(p.flops for p in parts) == phase.flops  # no kernel lost or doubled
        assert sum(p.bytes_moved for p in parts) == phase.bytes_moved
        assert [p.h2d_bytes for p in parts] == [phase.h2d_bytes, 0]  # in at the first stage
        assert [p.d2h_bytes for p in parts] == [0, phase.d2h_bytes]  # out from the last
        assert [p.allreduces for p in parts] == [0, 0]
    # t x p: each stage all-reduces its own layers (two per attention layer), as shard() does
    hybrid = split_stages(shard(whole, 2), 2)
    assert [s.phases[1].allreduces for s in hybrid.stages] == [6, 4]
    assert (
        sum(s.phases[1].allreduces for s in hybrid.stages) == shard(whole, 2).phases[1].allreduces
    )


def test_cycle_idle_share_and_gpipe_bubble_by_hand() -> None:
    """T = (3, 2) ms, 1 MB over 10 GB/s: X = 10 us + 100 us; m = 2: tau = 3.11 ms,
    R = 5.11 ms, I = max(6.22, 5.11) ms; idle 1 - 2 x 5 / (2 x 6.22); bubble 1/3."""
    two = pipeline_phase("decode", [3e-3, 2e-3], [1_000_000], micro_batches=2,
                         link_bytes_per_s=1e10)  # fmt: skip
    assert two.send_s[0] == pytest.approx(110e-6)
    assert two.slot_s == pytest.approx(3.11e-3)
    assert two.round_trip_s == pytest.approx(5.11e-3)
    assert two.cycle_s == pytest.approx(6.22e-3)
    assert two.idle_fraction == pytest.approx(1 - 10 / 12.44)
    assert two.gpipe_bubble_fraction == pytest.approx(1 / 3)
    # one micro-batch: the round trip sets the pace, one GPU of two works at a time
    one = pipeline_phase("decode", [3e-3, 2e-3], [1_000_000], micro_batches=1,
                         link_bytes_per_s=1e10)  # fmt: skip
    assert one.cycle_s == pytest.approx(5.11e-3)
    assert one.idle_fraction == pytest.approx(1 - 5 / 10.22)
    assert one.gpipe_bubble_fraction == pytest.approx(1 / 2)
    # 4 balanced stages, 8 micro-batches: (p - 1) / (m + p - 1) = 3 / 11
    eight = pipeline_phase("forward", [1e-3] * 4, [0, 0, 0], micro_batches=8,
                           link_bytes_per_s=1e10)  # fmt: skip
    assert eight.cycle_s == pytest.approx(8 * (1e-3 + PIPELINE_TRANSFER_LATENCY_S))
    assert eight.gpipe_bubble_fraction == pytest.approx(3 / 11)
    with pytest.raises(RooflineInputError, match="3 boundaries"):
        pipeline_phase("forward", [1e-3] * 4, [0], micro_batches=1, link_bytes_per_s=1e10)


@pytest.mark.parametrize(
    ("batch", "stages", "expected"),
    [(4, 2, (2, 2)), (1, 4, (1, 1)), (5, 4, (4, 2)), (3, 8, (3, 1))],
)
def test_micro_batches(batch: int, stages: int, expected: tuple[int, int]) -> None:
    assert micro_batching(batch, stages) == expected


def test_predicted_pipeline_adds_up() -> None:
    """Each stage timed by predict(); a phase's latency is its cycle plus the copies; the
    latency adds the request overhead once; the sends cross NVLink at the link efficiency."""
    m, mu = micro_batching(4, 2)
    plan = split_stages(_request(mu), 2)
    p = predict_pipeline(plan, GPU, CAL, batch=4, micro_batches=m)
    assert p.pipeline is not None
    assert p.pipeline_parallel == 2
    assert p.pipeline.link_bytes_per_s == 4e10 * 0.5
    assert "GPU link" in p.pipeline.link_source
    stages = [predict(stage, GPU, CAL) for stage in plan.stages]
    for index, (timing, piped) in enumerate(zip(p.phases, p.pipeline.phases, strict=True)):
        assert piped.stage_s == pytest.approx([s.phases[index].kernel_s for s in stages])
        assert piped.send_s[0] == pytest.approx(10e-6 + plan.send_bytes[index][0] / 2e10)
        assert timing.kernel_s == pytest.approx(piped.cycle_s)
        assert timing.pipeline_transfer_s == pytest.approx(sum(piped.send_s))
        assert timing.pipeline_wait_s == pytest.approx(piped.cycle_s - piped.round_trip_s)
    assert p.latency_s == pytest.approx(
        CAL.request_overhead_s + sum(t.latency_s * t.repeats for t in p.phases)
    )
    assert p.interval_s == pytest.approx(sum(t.kernel_s * t.repeats for t in p.phases))
    assert p.throughput_per_s == pytest.approx(4 / p.interval_s)
    assert p.flops == 2 * _request(2).flops
    split = p.time_split_s
    assert sum(split.values()) == pytest.approx(p.latency_s)
    assert split[Bound.TRANSFER] >= sum(t.pipeline_transfer_s * t.repeats for t in p.phases)
    assert p.per_token_s == pytest.approx(p.pipeline.phases[1].cycle_s + p.phases[1].d2h_s)
    pcie = predict_pipeline(
        plan, replace(GPU, gpu_link_bytes_per_s=None), CAL, batch=4, micro_batches=m
    )
    assert pcie.pipeline is not None
    assert pcie.pipeline.link_source.startswith("the host link")
    assert pcie.pipeline.link_bytes_per_s == 1e10 * 0.5
    with pytest.raises(RooflineInputError, match="micro_batches"):
        predict_pipeline(plan, GPU, CAL, batch=1, micro_batches=2)


def test_a_pipeline_says_its_16_bit_scale_as_its_stages_do() -> None:
    """fp16 math at a 16-bit scale: the pipeline's prediction carries its stages' note."""
    m, mu = micro_batching(4, 2)
    plan = split_stages(_request(mu), 2)
    cal = replace(CAL, half_precision_scale=1.5)
    p = predict_pipeline(plan, GPU, cal, batch=4, micro_batches=m)
    stage = predict(plan.stages[0], GPU, cal)
    assert p.assumptions == stage.assumptions
    assert any("fp16 math at 1.5 x the calibrated compute efficiency" in a for a in p.assumptions)


def test_a_large_model_splits_its_weights_and_pays_little_to_send() -> None:
    """Llama-shaped 7B-class decode on 4 stages: each stage's weights are about a quarter of
    the whole, and the per-step sends are microseconds against milliseconds of stage time."""
    built = llama(layers=32, hidden=4096, heads=32, kv_heads=8, intermediate=14336, vocab=32000)
    prefill = analyze(built.inputs, built.layers, {"batch": 4, "seq": 128}, training=False)
    step = analyze(built.inputs, built.layers, {"batch": 4, "seq": 1}, training=False)
    whole = decoder_request(prefill, step, FP16, batch=4, prompt_tokens=128, generated_tokens=32)
    plan = split_stages(whole, 4)
    assert [s.blocks for s in plan.spans] == [8, 8, 8, 8]
    decode = [sum(k.weight_bytes for k in stage.phases[1].kernels) for stage in plan.stages]
    total = sum(k.weight_bytes for k in whole.phases[1].kernels)
    assert sum(decode) == total
    assert max(decode) / total < 0.3  # the last stage adds the LM head
    assert plan.send_bytes[1] == (4 * 4096 * 2,) * 3
