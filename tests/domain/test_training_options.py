"""Golden numbers for the training options practitioners set (app.domain.workload
.TrainingOptions and the bitsandbytes optimizers): exact bytes derived by hand in each test."""

from __future__ import annotations

from typing import Any

import pytest

from app.domain.graph.analysis import GraphAnalysis, InputDecl, analyze
from app.domain.graph.ops import TensorKind
from app.domain.memory.estimate import MemoryEstimate, MemoryRequest, estimate_memory
from app.domain.memory.formulas import bnb_adamw_state
from app.domain.precision import Precision
from app.domain.workload import (
    LossKind,
    Mode,
    Optimizer,
    Parallelism,
    Runtime,
    TrainingOptionError,
    TrainingOptions,
    WorkloadSpec,
    resolve,
)
from tests.domain.test_formulas import evaluate

# fc: Linear(1024, 1000) with bias: a 1,024,000-element weight and a 1,000-element bias
FC = [{"name": "fc", "op": "linear", "out_features": 1000}]
WEIGHT, BIAS = 1_024_000, 1_000


def _fc() -> GraphAnalysis:
    return analyze([InputDecl(name="x", shape=(1, 1024))], FC, {}, training=True)


def _train(**kwargs: Any) -> MemoryRequest:
    return MemoryRequest(mode=Mode.TRAINING, runtime=Runtime.CPU, **kwargs)


def _lines(estimate: MemoryEstimate) -> dict[str, int]:
    return {line.key: line.bytes for line in estimate.lines}


def _formulas_hold(estimate: MemoryEstimate) -> None:
    for line in (*estimate.lines, *(estimate.host_lines or ())):
        assert evaluate(line.formula) == (line.bytes, line.bytes), (line.key, line.formula)


# --- 1. bitsandbytes AdamW8bit / PagedAdamW8bit / PagedAdamW32bit -------------------------


@pytest.mark.parametrize(
    ("optimizer", "device", "paged"),
    [
        # weight: 2 x 1,024,000 x 1 B + 2 x ceil(1,024,000 / 256) = 4,000 absmax x 4 B;
        # bias (1,000 < min_8bit_size 4,096): 2 x 1,000 x 4 B; + 2 x 256 x 4 B quantization maps
        (Optimizer.ADAMW_8BIT, 2_048_000 + 32_000 + 8_000 + 2_048, 0),
        # paged: state1/state2 of the weight (>= 100,000 elements) in unified memory
        (Optimizer.PAGED_ADAMW_8BIT, 32_000 + 8_000 + 2_048, 2_048_000),
        # 32-bit: fp32 state1/state2, no absmax, no maps; the weight's paged
        (Optimizer.PAGED_ADAMW_32BIT, 8_000, 2 * WEIGHT * 4),
    ],
)
def test_bitsandbytes_state_golden(optimizer: Optimizer, device: int, paged: int) -> None:
    state = bnb_adamw_state([(1000, 1024), (1000,)], optimizer)
    assert (state.device_bytes, state.paged_bytes) == (device, paged)
    estimate = estimate_memory(_fc(), _train(optimizer=optimizer))
    assert _lines(estimate).get("optimizer_state", 0) == device
    host = {line.key: line.bytes for line in estimate.host_lines or ()}
    assert host.get("paged_optimizer_state", 0) == paged
    assert "paged_optimizer_state" not in _lines(estimate)  # not GPU memory
    _formulas_hold(estimate)


def test_bitsandbytes_block_is_256_and_small_tensors_stay_32_bit() -> None:
    # 4,096 elements is 8-bit (not < min_8bit_size): 4,096 + 2 x 16 absmax x 4 + maps
    assert bnb_adamw_state([(4096,)], Optimizer.ADAMW_8BIT).device_bytes == (
        2 * 4096 + 2 * 16 * 4 + 2048
    )
    # 4,095 elements stays fp32 and there are no maps
    assert bnb_adamw_state([(4095,)], Optimizer.ADAMW_8BIT).device_bytes == 2 * 4095 * 4
    # 257 blocks for 65,537 elements
    assert bnb_adamw_state([(65_537,)], Optimizer.ADAMW_8BIT).device_bytes == (
        2 * 65_537 + 2 * 257 * 4 + 2048
    )


def test_bitsandbytes_step_has_no_temporaries() -> None:
    estimate = estimate_memory(_fc(), _train(optimizer=Optimizer.ADAMW_8BIT))
    step = _lines(estimate) if estimate.peak_phase == "optimizer_step" else None
    baseline = estimate_memory(_fc(), _train(optimizer=Optimizer.ADAMW))
    assert baseline.peak_phase == "optimizer_step"
    # for-loop AdamW on CPU: two temporaries of the largest parameter; bitsandbytes: none
    assert _lines(baseline)["transient"] == 2 * WEIGHT * 4
    assert step is None or step["transient"] == 0


# --- 2. optimizer step fused into backward --------------------------------------------------

# two Linear layers without bias: 1024 -> 4096 -> 1024; the largest parameter 4,194,304
CHAIN = [
    {"name": "fc1", "op": "linear", "out_features": 4096, "bias": False},
    {"name": "fc2", "op": "linear", "out_features": 1024, "bias": False},
]
LARGEST = 4096 * 1024


def _chain() -> GraphAnalysis:
    return analyze([InputDecl(name="x", shape=(1, 1024))], CHAIN, {}, training=True)


def test_optimizer_in_backward_holds_one_gradient() -> None:
    options = TrainingOptions(optimizer_in_backward=True)
    estimate = estimate_memory(_chain(), _train(training_options=options))
    baseline = estimate_memory(_chain(), _train())
    lines = _lines(estimate)
    assert "optimizer_step" not in estimate.phase_peaks
    assert estimate.peak_phase == "backward"
    # the largest parameter's fp32 gradient, never both
    assert lines["gradients"] == LARGEST * 4
    # for-loop AdamW (CPU) over that one tensor: 2 temporaries x 4,194,304 x 4 B, beside the
    # layer's own backward transients
    assert lines["transient"] >= 2 * LARGEST * 4
    assert lines["optimizer_state"] == 2 * 2 * LARGEST * 4
    assert _lines(baseline)["gradients"] == 2 * LARGEST * 4
    assert estimate.peak_bytes < baseline.peak_bytes
    _formulas_hold(estimate)
    assert any("optimizer_in_backward" in a for a in estimate.assumptions)


def test_optimizer_in_backward_fused_step_adds_no_temporaries() -> None:
    from app.domain.workload import OptimizerImpl

    options = TrainingOptions(optimizer_in_backward=True)
    fused = estimate_memory(
        _chain(), _train(training_options=options, optimizer_impl=OptimizerImpl.FUSED)
    )
    loop = estimate_memory(_chain(), _train(training_options=options))
    assert _lines(loop)["transient"] - _lines(fused)["transient"] == 2 * LARGEST * 4


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"accumulation_steps": 2}, "optimizer_in_backward"),
        ({"parallelism": Parallelism(data=2, zero_stage=2)}, "optimizer_in_backward"),
    ],
)
def test_optimizer_in_backward_contradictions(kwargs: dict[str, Any], field: str) -> None:
    with pytest.raises(TrainingOptionError) as raised:
        _train(training_options=TrainingOptions(optimizer_in_backward=True), **kwargs)
    assert raised.value.field == field


def test_keep_gradients_contradicts_optimizer_in_backward() -> None:
    with pytest.raises(TrainingOptionError) as raised:
        TrainingOptions(optimizer_in_backward=True, keep_gradients=True).check(
            Parallelism(), Runtime.CUDA, None
        )
    assert raised.value.field == "keep_gradients"


# --- 4. chunked cross-entropy ---------------------------------------------------------------

LM = [
    {"name": "embed", "op": "embedding", "num_embeddings": 1000, "embedding_dim": 64},
    {"name": "lm_head", "op": "linear", "out_features": 1000, "bias": False},
]


def _lm(seq: int = 8) -> GraphAnalysis:
    ids = InputDecl(name="ids", shape=(1, seq), kind=TensorKind.INDEX)
    return analyze([ids], LM, {}, training=True)


def test_loss_chunks_divide_the_fp32_upcast() -> None:
    # 1,024 tokens x 1,000 vocab, bf16, SGD (no state). Held at the end of forward: weights
    # 128,000 x 2 = 256,000; ids + labels 2 x 1,024 x 8 = 16,384; the embedding's output
    # 1,024 x 64 x 2 = 131,072; the logits (every chunk of the head's output) 1,024,000 x 2 =
    # 2,048,000; the fp32 log-probabilities of every chunk 4,096,000. Together 6,547,456.
    held = 256_000 + 16_384 + 131_072 + 2_048_000 + 4_096_000
    for chunks, chunk in ((1, 4_096_000), (4, 1_024_000), (3, 1_368_000), (8, 512_000)):
        # one chunk's fp32 size: ceil(1,024 / chunks) x 1,000 x 4 B
        assert chunk == -(-1024 // chunks) * 1000 * 4
        options = TrainingOptions(loss_chunks=chunks)
        estimate = estimate_memory(
            _lm(1024),
            _train(optimizer=Optimizer.SGD, precision=Precision.BF16, training_options=options),
        )
        # the forward's end: what is held and one chunk's logits.float() copy
        assert estimate.phase_peaks["forward"] == held + chunk
        # the loss's backward (its first chunk): the logits dropped (torchtune's del logits),
        # two fp32 chunk gradients; the head's backward after every chunk's holds no
        # log-probabilities (autograd runs the later-created loss nodes first)
        assert estimate.phase_peaks["backward"] == held - 2_048_000 + 2 * chunk
        _formulas_hold(estimate)
    assert held == 6_547_456
    # one chunk is Hugging Face's whole-sequence loss, to the byte
    whole = estimate_memory(_lm(1024), _train(optimizer=Optimizer.SGD, precision=Precision.BF16))
    one = estimate_memory(
        _lm(1024),
        _train(
            optimizer=Optimizer.SGD,
            precision=Precision.BF16,
            training_options=TrainingOptions(loss_chunks=1),
        ),
    )
    assert whole.phase_peaks == one.phase_peaks
    assert whole.peak_bytes == one.peak_bytes == 12_691_456


def test_loss_chunks_of_fp32_logits_copy_nothing() -> None:
    """fp32 logits: ``Tensor.float()`` returns the tensor itself, no chunk is copied; the
    peak is the forward's end once the chunks' two gradients are smaller than the logits
    (measured on an H200: GPT-2 fp32 batch 4 x 512, 8 chunks, allocated 4,370 MiB at the
    forward's end; the rule before, 4,813, held the logits and every log-probability through
    the backward of the head)."""
    # weights 512,000 + ids and labels 16,384 + the embedding's output 262,144 + the fp32
    # logits 4,096,000 + the log-probabilities 4,096,000
    held = 512_000 + 16_384 + 262_144 + 4_096_000 + 4_096_000
    peaks = {}
    for k in (1, 2, 8):
        estimate = estimate_memory(
            _lm(1024),
            _train(optimizer=Optimizer.SGD, training_options=TrainingOptions(loss_chunks=k)),
        )
        assert estimate.phase_peaks["forward"] == held == 8_982_528
        peaks[k] = estimate.phase_peaks["backward"]
        _formulas_hold(estimate)
    # the loss's backward: held less the logits, two fp32 chunk gradients
    assert peaks == {
        1: held - 4_096_000 + 2 * 4_096_000,
        2: held - 4_096_000 + 2 * 2_048_000,
        8: held - 4_096_000 + 2 * 512_000,
    }


def test_loss_chunks_need_token_logits() -> None:
    with pytest.raises(TrainingOptionError) as raised:
        estimate_memory(_fc(), _train(training_options=TrainingOptions(loss_chunks=2)))
    assert raised.value.field == "loss_chunks"


# --- 5. packed sequences --------------------------------------------------------------------


def test_packed_tokens_bind_one_row() -> None:
    spec = WorkloadSpec(
        mode=Mode.TRAINING,
        batch_size=4,
        sequence_length=512,
        training_options=TrainingOptions(tokens_per_batch=3000),
    )
    resolved = resolve(spec, model_bindings={"seq": 2048})
    assert resolved.bindings["batch"] == 1
    assert resolved.bindings["seq"] == 3000
    assert not any(d.option == "sequence_length" for d in resolved.defaults_used)


def test_packed_tokens_contradictions() -> None:
    with pytest.raises(TrainingOptionError) as raised:
        WorkloadSpec(
            mode=Mode.TRAINING,
            batch_size=1,
            sequence_length=4096,
            training_options=TrainingOptions(tokens_per_batch=2048),
        )
    assert raised.value.field == "tokens_per_batch"
    no_seq = WorkloadSpec(
        mode=Mode.TRAINING, batch_size=1, training_options=TrainingOptions(tokens_per_batch=64)
    )
    with pytest.raises(TrainingOptionError):
        resolve(no_seq, model_bindings={"image": 224})


# --- 7. gradients kept between steps --------------------------------------------------------


def test_keep_gradients_hold_every_gradient_through_forward() -> None:
    kept = estimate_memory(_chain(), _train(training_options=TrainingOptions(keep_gradients=True)))
    freed = estimate_memory(_chain(), _train())
    assert kept.phase_peaks["forward"] - freed.phase_peaks["forward"] == 2 * LARGEST * 4
    _formulas_hold(kept)
    assert any("set_to_none=False" in a for a in kept.assumptions)


def test_training_options_need_training() -> None:
    with pytest.raises(TrainingOptionError) as raised:
        MemoryRequest(mode=Mode.INFERENCE, training_options=TrainingOptions(loss_chunks=2))
    assert raised.value.field == "loss_chunks"


def test_defaults_do_not_move_the_estimate() -> None:
    plain = estimate_memory(_lm(), _train())
    explicit = estimate_memory(_lm(), _train(training_options=TrainingOptions()))
    assert plain == explicit
    assert plain.host_lines is None


def test_adamw_8bit_on_cuda_replays() -> None:
    request = MemoryRequest(
        mode=Mode.TRAINING, precision=Precision.AMP_BF16, optimizer=Optimizer.PAGED_ADAMW_8BIT
    )
    estimate = estimate_memory(_fc(), request)
    assert estimate.cuda is not None
    assert sum(line.bytes for line in estimate.lines) == estimate.peak_bytes


# --- 3. activation offloading ---------------------------------------------------------------

# four Linear(1024, 1024) without bias on a [64, 1024] fp32 input: each keeps its input, every
# value A = 64 x 1,024 x 4 = 262,144 B
DEEP = [{"name": f"fc{i}", "op": "linear", "out_features": 1024, "bias": False} for i in range(4)]
A = 64 * 1024 * 4


def _deep() -> GraphAnalysis:
    return analyze([InputDecl(name="x", shape=(64, 1024))], DEEP, {}, training=True)


def test_activation_offload_golden() -> None:
    request: dict[str, Any] = {
        "mode": Mode.TRAINING,
        "precision": Precision.FP32,
        "optimizer": Optimizer.SGD,
    }
    offload = estimate_memory(
        _deep(),
        MemoryRequest(**request, training_options=TrainingOptions(activation_offload=True)),
    )
    plain = estimate_memory(_deep(), MemoryRequest(**request))
    # fc1..fc3's outputs are kept by fc2..fc4 (x and fc3's output stay: the caller holds them):
    # three pinned host copies
    host = {line.key: line.bytes for line in offload.host_lines or ()}
    assert host == {"offloaded_activations": 3 * A}

    # forward, during fc4: without offload x + four outputs = 5 A; with it fc1's output (read
    # last by fc2, kept by fc2) has left the GPU two layers later: 4 A
    # (net of the allocator lines: each estimate replays its own step, the offloaded one with
    # the offload, so their cached segments differ)
    def forward(estimate: MemoryEstimate) -> int:
        lines = _lines(estimate)
        return estimate.phase_peaks["forward"] - (
            lines["allocator_rounding"] + lines["fragmentation_reserve"]
        )

    assert forward(plain) - forward(offload) == A
    assert offload.peak_bytes <= plain.peak_bytes
    _formulas_hold(offload)
    assert any("activation_offload" in a for a in offload.assumptions)


def test_activation_offload_on_cpu_is_refused() -> None:
    with pytest.raises(TrainingOptionError) as raised:
        _train(training_options=TrainingOptions(activation_offload=True))
    assert raised.value.field == "activation_offload"


# --- 7. ZeRO-3 / FSDP with CPU offload ------------------------------------------------------


def test_zero3_cpu_offload_moves_the_shards_to_the_host() -> None:
    # CHAIN: 8,388,608 parameters, mixed_bf16 over 2 ZeRO-3 ranks: per rank 8,388,608 x 2 / 2 B
    # of weights, the same of bf16 gradients, 8,388,608 x 8 / 2 B of AdamW state and
    # 8,388,608 x 4 / 2 B of fp32 master weights, all on the host
    params = 2 * LARGEST
    kwargs: dict[str, Any] = {"mode": Mode.TRAINING, "precision": Precision.MIXED_BF16}
    offload = estimate_memory(
        _chain(),
        MemoryRequest(**kwargs, parallelism=Parallelism(data=2, zero_stage=3, cpu_offload=True)),
    )
    plain = estimate_memory(
        _chain(), MemoryRequest(**kwargs, parallelism=Parallelism(data=2, zero_stage=3))
    )
    host = {line.key: line.bytes for line in offload.host_lines or ()}
    assert host == {
        "offloaded_weights": params,
        "offloaded_gradients": params,
        "offloaded_optimizer_state": 4 * params,
        "offloaded_master_weights": 2 * params,
    }
    lines = _lines(offload)
    assert lines["weights"] == 0
    assert "optimizer_state" not in lines
    assert "master_weights" not in lines
    assert lines["fsdp_buffers"] == _lines(plain)["fsdp_buffers"]  # the gathered unit stays
    assert "optimizer_step" not in offload.phase_peaks
    assert offload.peak_bytes < plain.peak_bytes
    _formulas_hold(offload)


def test_cpu_offload_needs_zero2_or_3() -> None:
    # ZeRO-1 keeps every gradient on the GPU: DeepSpeed's offload is modelled from stage 2 on
    with pytest.raises(TrainingOptionError) as raised:
        Parallelism(data=2, zero_stage=1, cpu_offload=True)
    assert raised.value.field == "parallelism/cpu_offload"


def test_autocast_copies_are_freed_by_their_gemm_backward() -> None:
    """AMP bf16: autocast caches a 16-bit copy of each GEMM weight for the forward and the
    GEMM keeps it for its input's gradient (MmBackward's mat2), so it lives until that
    layer's backward; an embedding's weight is never cast (checked on the CPU, torch 2.13:
    under autocast the embedding's output is fp32 and only the Linear's bf16 weight is
    saved). Embedding(1000, 1024) + three Linear(1024, 1024) on 64 ids, SGD, logits summed."""
    layers = [{"name": "embed", "op": "embedding", "num_embeddings": 1000, "embedding_dim": 1024}]
    layers += [
        {"name": f"fc{i}", "op": "linear", "out_features": 1024, "bias": False} for i in range(3)
    ]
    ids = InputDecl(name="ids", shape=(64,), kind=TensorKind.INDEX)
    estimate = estimate_memory(
        analyze([ids], layers, {}, training=True),
        _train(
            optimizer=Optimizer.SGD,
            precision=Precision.AMP_BF16,
            training_options=TrainingOptions(loss=LossKind.LOGITS_SUM),
        ),
    )
    lines = _lines(estimate)
    # the line: 3 x 1,048,576 weights x 2 B (the embedding's 1,024,000 not cast; the rule
    # before charged all 4,169,728 params: 8,339,456 B); the peak, the embedding's backward
    # (every gradient allocated), holds none: the three copies went with fc2..fc0's backward
    assert estimate.peak_phase == "backward"
    assert lines["weight_cast_cache"] == 0
    assert "3,145,728 [params autocast casts" in _formula(estimate, "weight_cast_cache")
    assert "- 6,291,456 [B: copies of the layers whose backward ran" in _formula(
        estimate, "weight_cast_cache"
    )
    # weights 4,169,728 x 4 and their gradients, ids + labels, the output and its gradient,
    # the ids' gradient slot
    assert estimate.peak_bytes == 2 * 16_678_912 + 1_024 + 131_072 + 131_584 == 33_621_504
    _formulas_hold(estimate)


def _formula(estimate: MemoryEstimate, key: str) -> str:
    return next(line.formula for line in estimate.lines if line.key == key)
