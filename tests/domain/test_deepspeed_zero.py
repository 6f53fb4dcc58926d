"""DeepSpeed ZeRO on one GPU (ZeRO-Offload / ZeRO-Infinity) and DeepSpeed's buffers
(app.domain.memory.deepspeed): exact bytes derived by hand from DeepSpeed's defaults
(deepspeed/runtime/zero/config.py: reduce_bucket_size 5e8, stage3_prefetch_bucket_size 5e7,
stage3_max_live_parameters 1e9, stage3_max_reuse_distance 1e9 elements)."""

from __future__ import annotations

from fractions import Fraction

import pytest

from app.domain.graph.analysis import GraphAnalysis, InputDecl, analyze
from app.domain.memory.deepspeed import (
    gathered_params_elements,
    offload_gather_copy_elements,
    reduce_bucket_bytes,
    reuse_kept_elements,
)
from app.domain.memory.estimate import MemoryEstimate, MemoryRequest, estimate_memory
from app.domain.precision import Precision
from app.domain.workload import (
    DeepSpeedBuffers,
    Mode,
    Optimizer,
    Parallelism,
    Runtime,
    TrainingOptionError,
)
from tests.domain.test_formulas import evaluate

# four Linear(4096, 4096) without bias: 4 x 16,777,216 = 67,108,864 parameters
LAYER = 4096 * 4096
PARAMS = 4 * LAYER
CHAIN = [
    {"name": f"layers.{i}.fc", "op": "linear", "out_features": 4096, "bias": False}
    for i in range(4)
]


def _graph() -> GraphAnalysis:
    return analyze([InputDecl(name="x", shape=(8, 4096))], CHAIN, {}, training=True)


def _estimate(par: Parallelism) -> MemoryEstimate:
    request = MemoryRequest(
        mode=Mode.TRAINING,
        precision=Precision.MIXED_BF16,  # bf16 weights and gradients, fp32 master and AdamW
        optimizer=Optimizer.ADAMW,
        runtime=Runtime.CUDA,
        parallelism=par,
    )
    estimate = estimate_memory(_graph(), request)
    for line in (*estimate.lines, *(estimate.host_lines or ())):
        assert evaluate(line.formula) == (line.bytes, line.bytes), (line.key, line.formula)
    return estimate


def _gpu(estimate: MemoryEstimate) -> dict[str, int]:
    return {line.key: line.bytes for line in estimate.lines}


def _host(estimate: MemoryEstimate) -> dict[str, int]:
    return {line.key: line.bytes for line in estimate.host_lines or ()}


def test_deepspeed_rules() -> None:
    assert reduce_bucket_bytes(500_000_000, Fraction(2), 1) == 1_000_000_000
    assert gathered_params_elements(LAYER, 50_000_000, 1_000_000_000) == LAYER + 50_000_000
    # stage3_max_live_parameters bounds the prefetch, not the running submodule, gathered whole
    # (partitioned_param_coordinator.py fetch_sub_module): 16,777,216 > 1e7 leaves no prefetch
    assert gathered_params_elements(LAYER, 50_000_000, 10_000_000) == LAYER == 16_777_216
    # 2e7 live: 16,777,216 running + 3,222,784 prefetched
    assert gathered_params_elements(LAYER, 50_000_000, 20_000_000) == 20_000_000
    assert gathered_params_elements(LAYER, 0, 1_000_000_000) == LAYER


def test_reuse_distance_keeps_the_last_layers_of_the_forward() -> None:
    """partitioned_param_coordinator.py __params_to_release: layer i stays gathered when the
    walk from the next submodule (the S_i elements after it in the forward, then again in the
    backward) meets it again before 2 x S_i reaches stage3_max_reuse_distance."""
    # 10 layers of 1e8: S_i = 0, 1e8, 2e8, ... from the last; 2 x S_i < 1e9 for S_i <= 4e8:
    # the last 5 layers, 5e8 elements
    assert reuse_kept_elements([100_000_000] * 10, 1_000_000_000) == 500_000_000
    # a model whose parameters stay under 5e8 is kept whole (4 x 16,777,216)
    assert reuse_kept_elements([LAYER] * 4, 1_000_000_000) == PARAMS
    # a last layer at the distance or over it (an output head of 1.03e9) keeps only itself
    assert reuse_kept_elements([LAYER, LAYER, 1_030_000_000], 1_000_000_000) == 1_030_000_000
    # 2 x S_i must stay below the distance: S_i = 5e8 exactly is released
    assert reuse_kept_elements([500_000_000, 500_000_000], 1_000_000_000) == 500_000_000
    # 0: every submodule is released after use (the last one's backward follows at once, but the
    # walk stops before it)
    assert reuse_kept_elements([LAYER] * 4, 0) == 0
    assert reuse_kept_elements([], 1_000_000_000) == 0


def test_offload_gather_copies_the_host_partition() -> None:
    """partition_parameters.py all_gather_coalesced: under offload_param the all-gather copies
    the host partition to the GPU (``ds_tensor.to(device)``) next to the full buffer; the larger
    of the running layer's gather and a prefetch's counts, divided over the data ranks."""
    assert offload_gather_copy_elements(LAYER, 50_000_000, 1) == 50_000_000
    assert offload_gather_copy_elements(LAYER, 0, 1) == LAYER == 16_777_216
    # 4 data ranks: each holds and copies a quarter of the partitioned parameter
    assert offload_gather_copy_elements(LAYER, 0, 4) == 4_194_304
    assert offload_gather_copy_elements(LAYER + 1, 0, 4) == 4_194_305  # rounded up


def test_zero3_without_offload_copies_nothing() -> None:
    """Without offload_param the partition already lives on the GPU (``.to`` returns it): the
    gathered line is the resident layers and the prefetch only, (67,108,864 + 5e7) x 2 B."""
    gpu = _gpu(_estimate(Parallelism(zero_stage=3)))
    assert gpu["zero_gathered_params"] == (PARAMS + 50_000_000) * 2 == 234_217_728


def test_zero3_offload_on_one_gpu_golden() -> None:
    estimate = _estimate(Parallelism(zero_stage=3, cpu_offload=True))
    gpu, host = _gpu(estimate), _host(estimate)
    # the GPU: no weights, no master, no optimizer state, no gradients held
    assert gpu["weights"] == 0
    assert gpu["gradients"] == 0
    assert "master_weights" not in gpu
    assert "optimizer_state" not in gpu
    # gathered: the 67,108,864 parameters (under 5e8: every layer is reused within
    # stage3_max_reuse_distance, kept gathered into the backward) + min(5e7, 1e9 - 67,108,864)
    # prefetched + the prefetch's GPU copy of its host partitions (offload_param: 5e7 > the
    # 16,777,216 of the largest layer), x 2 B = 334,217,728 B
    assert gpu["zero_gathered_params"] == (PARAMS + 2 * 50_000_000) * 2 == 334_217_728
    # the IPG bucket: 5e8 elements x 2 B, whatever the model's size
    assert gpu["zero_reduce_bucket"] == 1_000_000_000
    # the host: bf16 weights and gradients, fp32 AdamW moments and master weights
    assert host == {
        "offloaded_weights": PARAMS * 2,
        "offloaded_gradients": PARAMS * 2,
        "offloaded_optimizer_state": PARAMS * 8,
        "offloaded_master_weights": PARAMS * 4,
    }
    assert "optimizer_step" not in estimate.phase_peaks
    assert any("DeepSpeed ZeRO-3 on 1 data rank(s)" in a for a in estimate.assumptions)


def test_the_request_overrides_deepspeeds_defaults() -> None:
    knobs = DeepSpeedBuffers(
        reduce_bucket_size=100_000_000,
        stage3_prefetch_bucket_size=0,
        stage3_max_live_parameters=10_000_000,
        stage3_max_reuse_distance=0,
    )
    estimate = _estimate(Parallelism(zero_stage=3, cpu_offload=True, deepspeed=knobs))
    gpu = _gpu(estimate)
    assert gpu["zero_reduce_bucket"] == 200_000_000  # 1e8 x 2 B
    # nothing kept for reuse (0), the running layer whole, no prefetch (0), and the GPU copy of
    # its host partition (offload_param): 2 x 16,777,216 x 2 B
    assert gpu["zero_gathered_params"] == 2 * LAYER * 2 == 67_108_864
    assert any("stage3_max_reuse_distance 0 " in a for a in estimate.assumptions)
    # the reuse distance alone: 2 x S_i < 1e8 keeps the last 3 layers (S_i 0, 16.8M, 33.6M;
    # the first layer's 2 x 50,331,648 is over), no prefetch, + one layer's partition copied
    # from the host: (3 + 1) x 16,777,216 x 2 B
    reuse = DeepSpeedBuffers(stage3_prefetch_bucket_size=0, stage3_max_reuse_distance=100_000_000)
    gpu = _gpu(_estimate(Parallelism(zero_stage=3, cpu_offload=True, deepspeed=reuse)))
    assert gpu["zero_gathered_params"] == 4 * LAYER * 2 == 134_217_728


def test_zero2_offload_on_one_gpu_keeps_the_weights() -> None:
    gpu = _gpu(_estimate(Parallelism(zero_stage=2, cpu_offload=True)))
    assert gpu["weights"] == PARAMS * 2 == 134_217_728
    assert gpu["zero_reduce_bucket"] == 1_000_000_000
    assert "zero_gathered_params" not in gpu
    assert "master_weights" not in gpu
    host = _host(_estimate(Parallelism(zero_stage=2, cpu_offload=True)))
    assert set(host) == {
        "offloaded_gradients",
        "offloaded_optimizer_state",
        "offloaded_master_weights",
    }


def test_fsdp_rules_stay_on_several_data_ranks() -> None:
    gpu = _gpu(_estimate(Parallelism(data=2, zero_stage=3)))
    assert "fsdp_buffers" in gpu
    assert "zero_reduce_bucket" not in gpu
    asked = _gpu(_estimate(Parallelism(data=2, zero_stage=3, deepspeed=DeepSpeedBuffers())))
    assert "fsdp_buffers" not in asked
    assert asked["zero_reduce_bucket"] == 1_000_000_000


@pytest.mark.parametrize(
    ("build", "field"),
    [
        (lambda: Parallelism(zero_stage=1, cpu_offload=True), "parallelism/cpu_offload"),
        (lambda: Parallelism(deepspeed=DeepSpeedBuffers()), "parallelism/deepspeed"),
        (
            lambda: DeepSpeedBuffers(reduce_bucket_size=-1),
            "parallelism/deepspeed/reduce_bucket_size",
        ),
        (
            lambda: DeepSpeedBuffers(stage3_max_reuse_distance=-1),
            "parallelism/deepspeed/stage3_max_reuse_distance",
        ),
    ],
)
def test_what_is_still_impossible_names_the_field(build: object, field: str) -> None:
    with pytest.raises(TrainingOptionError) as raised:
        build()  # type: ignore[operator]
    assert raised.value.field == field
