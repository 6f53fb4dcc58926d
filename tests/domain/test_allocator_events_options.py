"""Golden numbers for the allocator replay's events under the options that change what the GPU
holds: full checkpointing, activation offloading and ZeRO-3 CPU offload. Bytes derived by hand
in each test; the replay's peaks are read where the estimate runs it."""

from __future__ import annotations

from typing import Any

import pytest

import app.domain.memory.allocator_events as allocator_events
import app.domain.memory.cuda_allocator as cuda_allocator
import app.domain.memory.cuda_runtime as engine
from app.domain.graph.analysis import GraphAnalysis, InputDecl, analyze
from app.domain.graph.ops import TensorKind
from app.domain.memory.cuda_allocator import AllocatorPeaks
from app.domain.memory.estimate import MemoryEstimate, MemoryRequest, analyze_for, estimate_memory
from app.domain.memory.liveness import checkpoint_unit
from app.domain.peft.lora import LoraConfig
from app.domain.precision import Precision
from app.domain.workload import (
    Checkpointing,
    Mode,
    Optimizer,
    Parallelism,
    Runtime,
    TrainingOptions,
)
from app.domain.zoo import ZOO

MIB = 1 << 20
WORKSPACES = 2 * 32 * MIB  # training: two cuBLAS handles, 32 MiB each (the default)


def _replayed(
    monkeypatch: pytest.MonkeyPatch, analysis: GraphAnalysis, request: MemoryRequest
) -> tuple[MemoryEstimate, tuple[AllocatorPeaks, AllocatorPeaks]]:
    """The estimate and the replay's (first, steady) peaks."""
    captured: list[tuple[AllocatorPeaks, AllocatorPeaks]] = []
    original = cuda_allocator.replay_steady

    def capture(*args: Any, **kwargs: Any) -> tuple[AllocatorPeaks, AllocatorPeaks]:
        captured.append(original(*args, **kwargs))
        return captured[-1]

    monkeypatch.setattr(engine, "replay_steady", capture)
    estimate = estimate_memory(analysis, request)
    assert len(captured) == 1
    return estimate, captured[0]


# --- full checkpointing ----------------------------------------------------------------------

# Four blocks of Linear(256, 256, bias=False) then Dropout(0.1), a Linear(256, 256) head, on a
# [4096, 256] fp32 input: every value 4096 x 256 x 4 = 4 MiB, a dropout mask 4096 x 256 x 1 B
# = 1 MiB, a weight 256 x 256 x 4 = 256 KiB.
BLOCKS = [
    layer
    for i in range(4)
    for layer in (
        {"name": f"layers.{i}.fc", "op": "linear", "out_features": 256, "bias": False},
        {"name": f"layers.{i}.drop", "op": "dropout", "p": 0.1},
    )
] + [{"name": "head", "op": "linear", "out_features": 256, "bias": False}]
VALUE, MASK, WEIGHT = 4 * MIB, MIB, 256 * 1024


def _blocks() -> GraphAnalysis:
    return analyze([InputDecl(name="x", shape=(4096, 256))], BLOCKS, {}, training=True)


def test_full_checkpointing_keeps_no_dropout_mask_in_forward(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """torch.utils.checkpoint stores nothing a checkpointed block's ops save (non-reentrant:
    a placeholder per saved tensor; reentrant: no_grad): the four dropout masks are not held
    from the forward to their backward, only the block being recomputed has its mask."""
    request = MemoryRequest(
        mode=Mode.TRAINING,
        precision=Precision.FP32,
        optimizer=Optimizer.SGD,
        checkpointing=Checkpointing.FULL,
        runtime=Runtime.CUDA,
    )
    _, (_, steady) = _replayed(monkeypatch, _blocks(), request)
    held = (
        5 * WEIGHT  # four blocks' and the head's weights
        + VALUE  # x (the caller's input)
        + 4096 * 8  # int64 labels
        + WORKSPACES
        + 3 * VALUE  # the inputs of blocks 1..3 (the outputs of blocks 0..2), kept
        + VALUE  # the head's input (block 3's output), kept by the head
    )
    # The steady step's peak: the loss's backward (app.domain.memory.loss), as log_softmax's
    # backward allocates the gradient of its input. The caller dropped the logits after the
    # loss (it keeps the loss alone); the log-probabilities (one logits-sized value, fp32
    # logits: no upcast) are still saved, nll_loss's gradient of them is still live.
    loss_backward = (
        held
        + VALUE  # the log-probabilities log_softmax saved (loss_bytes)
        + VALUE  # nll_loss's gradient of the log-probabilities
        + VALUE  # log_softmax's gradient of its input: the gradient of the logits
    )
    assert loss_backward == 102_006_784
    # The head's backward, as its weight's gradient is allocated: the log-probabilities died
    # with LogSoftmaxBackward.
    head_backward = (
        held
        + VALUE  # the gradient of the logits
        + VALUE  # the gradient of the head's input
        + WEIGHT  # the head's weight gradient
    )
    assert head_backward == 98_074_624
    # Block 3's recompute (torch.utils.checkpoint runs its forward again), as dropout allocates
    # its output and its mask while fc's recomputed output is still live. The head's backward
    # has freed the gradient of the logits and the head's input (kept only by the head).
    recompute = (
        head_backward
        - VALUE  # the gradient of the logits, freed after the head's backward
        - VALUE  # the head's input, freed after the head's backward
        + VALUE  # fc's recomputed output (dropout reads it)
        + VALUE  # dropout's recomputed output
        + MASK  # dropout's recomputed mask, kept to dropout's backward
    )
    assert recompute == 99_123_200 < loss_backward
    # Were every block's mask allocated in forward and kept to its backward, the loss's
    # backward would hold 4 x 1 MiB more.
    assert steady.requested_bytes == loss_backward


def _recipes(
    monkeypatch: pytest.MonkeyPatch, analysis: GraphAnalysis, request: MemoryRequest
) -> tuple[dict[str, int], dict[str, allocator_events._Recompute]]:
    """The breakdown's recompute per unit and the replay's recompute events, per unit."""
    captured: list[Any] = []
    original = allocator_events.step_allocator_events

    def capture(e: Any, *args: Any) -> Any:
        captured.append(e)
        return original(e, *args)

    monkeypatch.setattr(engine, "step_allocator_events", capture)
    estimate_memory(analysis, request)
    e = captured[0]
    units = [checkpoint_unit(layer.name) for layer in e.analysis.layers]
    recipes = allocator_events._recompute_events(
        e.analysis, e.storage_plan, units, e.recompute, e.adapter_saved
    )
    return e.recompute, recipes


def test_full_checkpointing_recomputes_a_block_tensor_by_tensor(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Block 3's recompute is its forward again: fc's output, dropout's output and mask;
    fc's output dies after dropout reads it, dropout's output (block 3's output, saved by no
    layer of the block) when the recompute stops; the mask after dropout's backward."""
    request = MemoryRequest(
        mode=Mode.TRAINING,
        precision=Precision.FP32,
        optimizer=Optimizer.SGD,
        checkpointing=Checkpointing.FULL,
        runtime=Runtime.CUDA,
    )
    recompute, recipes = _recipes(monkeypatch, _blocks(), request)
    assert recompute == {f"layers.{i}": MASK for i in range(4)}
    recipe = recipes["layers.3"]
    assert recipe.events == [
        ("alloc", 0, VALUE),  # fc's output
        ("alloc", 1, VALUE),  # dropout's output
        ("alloc", 2, MASK),  # dropout's mask
        ("free", 0, 0),  # fc's output: dropout was its last reader
        ("free", 1, 0),  # dropout's output: the recompute stops here
    ]
    assert recipe.released_after == {7: [2]}  # layers.3.drop: its mask after its backward


def test_recomputed_saved_tensors_add_up_to_the_recompute_line(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Llama-2-7B (bf16, b2 x 512): the tensors each block's recompute keeps to a layer's
    backward are the breakdown's recompute bytes, each freed by a layer of the block."""
    model = ZOO["llama-2-7b"]
    request = MemoryRequest(
        mode=Mode.TRAINING,
        precision=Precision.BF16,
        optimizer=Optimizer.SGD,
        checkpointing=Checkpointing.FULL,
        runtime=Runtime.CUDA,
    )
    bindings = {**model.default_bindings, "batch": 2, "seq": 512}
    analysis = analyze_for(model.inputs, model.layers, bindings, request)
    recompute, recipes = _recipes(monkeypatch, analysis, request)
    assert len(recipes) == len(recompute) == 32
    for unit, recipe in recipes.items():
        released = {slot for slots in recipe.released_after.values() for slot in slots}
        kept = sum(
            size for kind, slot, size in recipe.events if kind == "alloc" and slot in released
        )
        assert kept == recompute[unit]
        freed = {slot for kind, slot, _ in recipe.events if kind == "free"}
        allocated = {slot for kind, slot, _ in recipe.events if kind == "alloc"}
        assert allocated == released | freed
        assert not released & freed


# --- activation offloading and ZeRO-3 CPU offload ---------------------------------------------

# Four Linear(256, 256, bias=False), fc0..fc3, on a [4096, 256] fp32 input: each keeps its
# input; the model's input x and output (fc3's) are held by the caller, so fc0..fc2's outputs
# are the offloaded tensors.
CHAIN = [{"name": f"fc{i}", "op": "linear", "out_features": 256, "bias": False} for i in range(4)]
LABELS = 4096 * 8  # int64 labels


def _chain() -> GraphAnalysis:
    return analyze([InputDecl(name="x", shape=(4096, 256))], CHAIN, {}, training=True)


def _chain_request(**kwargs: Any) -> MemoryRequest:
    return MemoryRequest(
        mode=Mode.TRAINING, precision=Precision.FP32, runtime=Runtime.CUDA, **kwargs
    )


def test_activation_offload_frees_kept_tensors_and_copies_them_back(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The replay follows the breakdown's schedule (liveness.offload_peaks): out0 (kept by
    fc1, read last by fc1) leaves the GPU after fc2 (its copy in flight one layer); out1 and
    out2 are still in flight at the end of forward and leave as backward starts. Backward:
    out1 and out2 come back before fc3's backward (out1 prefetched for fc2), out0 before
    fc2's (prefetched for fc1); each copy is freed after its keeper's backward."""
    plain_estimate, (_, plain) = _replayed(
        monkeypatch, _chain(), _chain_request(optimizer=Optimizer.SGD)
    )
    estimate, (_, steady) = _replayed(
        monkeypatch,
        _chain(),
        _chain_request(
            optimizer=Optimizer.SGD, training_options=TrainingOptions(activation_offload=True)
        ),
    )
    persistent = 4 * WEIGHT + LABELS + WORKSPACES  # weights, labels, workspaces
    # Without offload, the loss's backward (app.domain.memory.loss): x, out0..out2 kept, the
    # log-probabilities, nll_loss's gradient of them and log_softmax's gradient of the logits
    # (the caller dropped the logits after the loss). Before the loss's tensors: fc3's
    # backward with the logits and the log-probabilities held, 8 x 4 MiB + 256 KiB.
    assert plain.requested_bytes == persistent + 7 * VALUE == 97_550_336
    # With it, fc2's backward: x, out1 and out0 back from the host, fc3's input gradient
    # (fc2's output gradient), fc2's input gradient, fc3's and fc2's weight gradients; the
    # log-probabilities died with LogSoftmaxBackward, and the caller dropped the logits after
    # the loss as without offload (the output is not packed; until the H200 peft measurements
    # of 2026-11-28 the schedule held it to the end: + 4 MiB, 93,880,320 B)
    assert steady.requested_bytes == persistent + 5 * VALUE + 2 * WEIGHT == 89_686_016
    # The breakdown's moment is the same one (x is the inputs line; until issue 32 the
    # activations repeated it).
    lines = {line.key: line.bytes for line in estimate.lines}
    assert lines["inputs"] == VALUE + LABELS
    assert lines["activations"] == 2 * VALUE  # out1, out0 back from the host
    assert lines["gradients"] == 2 * WEIGHT
    assert not any("does not model the offload" in a for a in estimate.assumptions)
    assert estimate.cuda is not None
    assert plain_estimate.cuda is not None
    # allocated falls by the breakdown's 2 x 4 MiB - 2 x 256 KiB (without offload the peak is
    # the loss's backward, no weight gradient yet; 4 MiB - 2 x 256 KiB while the offloaded step
    # held the logits; before the loss's tensors it was fc3's backward and the fall 4 MiB -
    # 256 KiB)
    fall = plain_estimate.cuda.allocated_bytes - estimate.cuda.allocated_bytes
    assert fall == 2 * VALUE - 2 * WEIGHT


def test_cpu_offload_replays_no_weights_gradients_or_state_on_the_gpu(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """ZeRO-3 CPU offload over 2 data ranks, AdamW: the breakdown's GPU holds FSDP's buffers
    (the one unit, 262,144 params, gathered twice at 4 B, and its 4 B gradients: 3 MiB), not
    the weights, gradients, optimizer state or the step's temporaries; so does the replay."""
    estimate, (first, steady) = _replayed(
        monkeypatch,
        _chain(),
        _chain_request(
            optimizer=Optimizer.ADAMW,
            parallelism=Parallelism(data=2, zero_stage=3, cpu_offload=True),
        ),
    )
    lines = {line.key: line.bytes for line in estimate.lines}
    assert lines["fsdp_buffers"] == 3 * 4 * WEIGHT
    # The loss's backward: x, out0..out2 kept, the log-probabilities and their two gradients
    # (the caller dropped the logits; app.domain.memory.loss), beside FSDP's buffers, the
    # labels and the workspaces. Before the loss's tensors: fc3's backward, 8 x 4 MiB.
    expected = 3 * 4 * WEIGHT + LABELS + WORKSPACES + 7 * VALUE
    assert steady.requested_bytes == first.requested_bytes == expected == 99_647_488
    # Before: the step without offload, 106,070,016 B steady (the unsharded weights, the
    # gradients, AdamW's state and its step temporaries on the GPU).
    assert not any("without offload" in a for a in estimate.assumptions)


# Two checkpointed blocks of Linear(4096, 256), Linear(256, 256), Linear(256, 4096) (no bias),
# a Linear(4096, 256) head, on a [4096, 4096] fp32 input: a block's input, its output and the
# head's input are 4096 x 4096 x 4 = 64 MiB (WIDE), the logits 4 MiB (VALUE).
UNITS = [
    {"name": f"layers.{i}.fc{j}", "op": "linear", "out_features": width, "bias": False}
    for i in range(2)
    for j, width in enumerate((256, 256, 4096))
] + [{"name": "head", "op": "linear", "out_features": 256, "bias": False}]
WIDE = 64 * MIB
UNIT_WEIGHTS = 2 * (4096 * 256 + 256 * 256 + 256 * 4096) * 4 + 4096 * 256 * 4


def test_offloaded_checkpoint_input_is_back_for_the_units_recompute(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Full checkpointing with activation_offload: block 1's input (kept by its first layer)
    is read again by the backward of its last layer, which recomputes the block, so it is
    back from the host from the head's backward (prefetched one layer ahead), not only from
    its second layer's (the rule before: offload_peaks and the replay agreed on a step with
    the input missing while the block was recomputed)."""
    analysis = analyze([InputDecl(name="x", shape=(4096, 4096))], UNITS, {}, training=True)
    request = MemoryRequest(
        mode=Mode.TRAINING,
        precision=Precision.FP32,
        optimizer=Optimizer.SGD,
        checkpointing=Checkpointing.FULL,
        runtime=Runtime.CUDA,
        training_options=TrainingOptions(activation_offload=True),
    )
    estimate, (_, steady) = _replayed(monkeypatch, analysis, request)
    lines = {line.key: line.bytes for line in estimate.lines}
    assert UNIT_WEIGHTS == lines["weights"] == 21_495_808
    # The head's backward: x (the inputs line), block 1's input and the head's input back from
    # the host (activations: 2 x 64 MiB; 3 x 64 MiB until issue 32 counted x once; the
    # breakdown before the recompute rule: 142,606,336 B at layers.1.fc0)
    assert lines["inputs"] == WIDE + LABELS
    assert lines["activations"] == 2 * WIDE
    # the replay there: those three, the head's input gradient (64 MiB), the logits' gradient
    # (4 MiB), the head's weight gradient; the log-probabilities died with LogSoftmaxBackward
    # (app.domain.memory.loss; before it, + 4 MiB: 373,850,112 B; before the prefetch rule,
    # 323,780,608 B) and the caller dropped the logits after the loss (until the H200 peft
    # measurements of 2026-11-28 offloading's schedule held them: + 4 MiB, 369,655,808 B)
    expected = UNIT_WEIGHTS + LABELS + WORKSPACES + 4 * WIDE + VALUE + 4096 * 256 * 4
    assert steady.requested_bytes == expected == 365_461_504


# --- LoRA -------------------------------------------------------------------------------------


def test_lora_adapters_and_their_saved_tensors_are_replayed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """LoRA r=8 on fc1 of the chain (fp32, no dropout): the adapters' weights (lora_A 8 x 256
    and lora_B 256 x 8 fp32: 16 KiB, the adapter_weights line) are allocated with the weights,
    and what lora_B keeps, lora_A's output (4096 x 8 x 4 B = 128 KiB, the
    adapter_activations line), from fc1's forward to its backward."""
    request = _chain_request(optimizer=Optimizer.SGD, lora=LoraConfig(r=8, target_modules=("fc1",)))
    estimate, (_, steady) = _replayed(monkeypatch, _chain(), request)
    lines = {line.key: line.bytes for line in estimate.lines}
    adapters, saved = 2 * 8 * 256 * 4, 4096 * 8 * 4
    assert (lines["adapter_weights"], lines["adapter_activations"]) == (adapters, saved)
    # the loss's backward (app.domain.memory.loss): x, out0 (lora_A's input), the
    # log-probabilities and their two gradients (the caller dropped the logits), and the
    # adapters' tensors. The frozen fc2 and fc3 keep no input (app.domain.memory.frozen: mm
    # keeps mat1 only for the weight's gradient; checked with peft 0.21.2 on the CPU: the
    # graph keeps out0 and lora_A's 4096 x 8 output, nothing else); with out1 and out2 kept
    # until issue 32's frozen-base rules: 7 values, 97,697,792 B (before the loss's tensors:
    # fc3's backward, 8 values + saved, 101,892,096 B; before the adapters: 101,744,640 B)
    expected = 4 * WEIGHT + adapters + LABELS + WORKSPACES + 5 * VALUE + saved
    assert steady.requested_bytes == expected == 89_309_184


def test_zero3_replays_each_ranks_shard_of_the_weights(monkeypatch: pytest.MonkeyPatch) -> None:
    """ZeRO-3 over 2 data ranks (no offload), AdamW fp32: the replay's weights are the rank's
    half, as the weights line (it replayed every rank's whole weights)."""
    estimate, (_, steady) = _replayed(
        monkeypatch,
        _chain(),
        _chain_request(optimizer=Optimizer.ADAMW, parallelism=Parallelism(data=2, zero_stage=3)),
    )
    lines = {line.key: line.bytes for line in estimate.lines}
    assert lines["weights"] == 4 * WEIGHT // 2
    state = 2 * 4 * 4 * 256 * 256 // 2  # AdamW's two fp32 moments, the rank's half
    assert lines["optimizer_state"] == state
    # the loss's backward: the weights' and AdamW's halves, FSDP's 3 MiB, 7 values (x,
    # out0..out2, the log-probabilities and their two gradients: app.domain.memory.loss),
    # labels and workspaces
    expected = 4 * WEIGHT // 2 + state + 3 * 4 * WEIGHT + 7 * VALUE
    assert steady.requested_bytes == expected + LABELS + WORKSPACES == 101_220_352
    # before the loss's tensors: fc3's backward, 8 values + fc3's half weight gradient,
    # 105,545,728 B; before that: 106,070,016 B (the whole 4 x 256 KiB of weights)


def test_fsdp_buffers_are_freed_before_the_optimizer_step(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """FSDP reshards after backward: the gather buffers (3 MiB) are freed before the optimizer
    step (the breakdown's optimizer_step moment has no fsdp_buffers line), so the step ends
    with the weights', gradients' and AdamW state's halves, x, the labels and the workspaces."""
    import app.domain.memory.allocator_events as allocator_events

    built: list[Any] = []
    original = allocator_events.step_allocator_events

    def capture(*args: Any, **kwargs: Any) -> Any:
        built.append(original(*args, **kwargs))
        return built[-1]

    monkeypatch.setattr(engine, "step_allocator_events", capture)
    request = _chain_request(
        optimizer=Optimizer.ADAMW, parallelism=Parallelism(data=2, zero_stage=3)
    )
    estimate_memory(_chain(), request)
    live: dict[object, int] = {}
    kept = 0
    for kind, key, size in built[0][0]:
        if kind == "alloc":
            live[key] = size
        elif kind == "free":
            del live[key]
        elif kind == "keep":
            kept += sum(key)
    state = 2 * 4 * 4 * 256 * 256 // 2  # AdamW's two fp32 moments, the rank's half
    # weights' half, gradients' half (the last step's, kept), state, x, labels, workspaces
    expected = 4 * WEIGHT // 2 + 4 * WEIGHT // 2 + state + VALUE + LABELS + WORKSPACES
    assert kept + sum(live.values()) == expected == 73_433_088  # before: + 3 MiB held


def test_zero2_cpu_offload_keeps_the_weights_and_no_gradient(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """ZeRO-2 with CPU offload (DeepSpeed offload_optimizer) over 2 ranks, AdamW fp32: the
    weights stay on the GPU, each gradient passes through DeepSpeed's reduce bucket
    (5e8 elements x 4 B, its default) to the host; no gradient, state or step temporary is
    replayed on the GPU."""
    estimate, (_, steady) = _replayed(
        monkeypatch,
        _chain(),
        _chain_request(
            optimizer=Optimizer.ADAMW,
            parallelism=Parallelism(data=2, zero_stage=2, cpu_offload=True),
        ),
    )
    lines = {line.key: line.bytes for line in estimate.lines}
    bucket = 500_000_000 * 4
    assert (lines["weights"], lines["zero_reduce_bucket"], lines["gradients"]) == (
        4 * WEIGHT,
        bucket,
        0,
    )
    # the loss's backward: the weights, the bucket, 7 values (x, out0..out2, the
    # log-probabilities and their two gradients: app.domain.memory.loss), labels, workspaces
    expected = 4 * WEIGHT + bucket + 7 * VALUE + LABELS + WORKSPACES
    assert steady.requested_bytes == expected == 2_097_550_336
    # before the loss's tensors: fc3's backward with 8 values, 2,101,744,640 B; before that
    # 2,102,924,288 B


def test_offload_packs_the_lora_adapters_saved_tensors(monkeypatch: pytest.MonkeyPatch) -> None:
    """activation_offload with LoRA r=8 on fc1 of the chain: save_on_cpu and torchtune's
    OffloadActivations pack every saved tensor that is no nn.Parameter, so lora_A's output
    (4096 x 8 x 4 B = 128 KiB, kept by lora_B) goes to the host with out0 (the H200 run
    of 2026-11-28: Llama-3-8B-2L LoRA offloaded, allocated 5,936 / 5,968 MiB, the estimate
    7,059 while it kept the adapters' 610 MiB and the logits on the GPU). The frozen base
    (app.domain.memory.frozen): fc0 keeps nothing (before the first trainable tensor), fc1's
    input out0 is kept by lora_A (the same storage: fp32, no dropout), fc2 and fc3 keep no
    input (only their weights' gradients would read it). Both are back for fc1's backward."""
    request = _chain_request(
        optimizer=Optimizer.SGD,
        lora=LoraConfig(r=8, target_modules=("fc1",)),
        training_options=TrainingOptions(activation_offload=True),
    )
    estimate, (first, steady) = _replayed(monkeypatch, _chain(), request)
    lines = {line.key: line.bytes for line in estimate.lines}
    host = {line.key: line.bytes for line in estimate.host_lines or ()}
    adapters, saved = 2 * 8 * 256 * 4, 4096 * 8 * 4
    assert VALUE + saved == 4_325_376
    assert host == {"offloaded_activations": 4_325_376}
    assert "adapter_activations" not in lines  # none left on the GPU (no checkpointing)
    # fc1's backward: out0 + lora_A's output back from the host, fc1's output and input
    # gradients; the frozen weights have no gradient, the adapters' 16 KiB exist (LoRA: the
    # gradients line, from fc1's backward on)
    assert (estimate.peak_phase, lines["activations"]) == ("backward", VALUE + saved)
    assert (lines["transient"], lines["gradients"]) == (2 * VALUE, adapters)
    # the replay: the same tensors (x held by the caller)
    persistent = 4 * WEIGHT + adapters + LABELS + WORKSPACES
    expected = persistent + VALUE + VALUE + saved + 2 * VALUE + adapters
    assert steady.requested_bytes == first.requested_bytes == expected == 85_131_264
    # without offload the adapters' tensor was a line of its own at every moment
    plain, _ = _replayed(
        monkeypatch, _chain(), _chain_request(optimizer=Optimizer.SGD, lora=request.lora)
    )
    assert {line.key: line.bytes for line in plain.lines}["adapter_activations"] == saved


def test_chunked_loss_replays_the_forward_end_and_frees_the_log_probs_in_backward(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """loss_chunks=8 on a bf16 embedding + head LM (1,024 tokens, vocab 1,000), CUDA: the
    replay's peak is the breakdown's, the forward's end: weights 256,000, ids and labels
    16,384, the embedding's output 131,072 and the logits 2,048,000 (the activations line),
    every chunk's fp32 log-probabilities 4,096,000, one chunk's logits.float() copy 128 x
    1,000 x 4 = 512,000, the two cuBLAS workspaces. In backward every chunk's loss runs
    first (two fp32 chunk gradients), then the log-probabilities are freed and the head's
    backward reads the logits' whole gradient (2,048,000 bf16), the logits dropped."""
    ids = InputDecl(name="ids", shape=(1, 1024), kind=TensorKind.INDEX)
    lm = [
        {"name": "embed", "op": "embedding", "num_embeddings": 1000, "embedding_dim": 64},
        {"name": "lm_head", "op": "linear", "out_features": 1000, "bias": False},
    ]
    analysis = analyze([ids], lm, {}, training=True)
    request = MemoryRequest(
        mode=Mode.TRAINING,
        precision=Precision.BF16,
        runtime=Runtime.CUDA,
        optimizer=Optimizer.SGD,
        training_options=TrainingOptions(loss_chunks=8),
    )
    estimate, (first, steady) = _replayed(monkeypatch, analysis, request)
    lines = {line.key: line.bytes for line in estimate.lines}
    assert estimate.peak_phase == "forward"
    assert (lines["activations"], lines["loss"], lines["transient"]) == (
        131_072 + 2_048_000,
        4_096_000,
        512_000,
    )
    expected = 256_000 + 16_384 + 131_072 + 2_048_000 + 4_096_000 + 512_000 + WORKSPACES
    assert steady.requested_bytes == first.requested_bytes == expected == 74_168_320
    # the loss's backward: the logits dropped, two fp32 chunk gradients (2 x 512,000)
    backward = estimate.phase_peaks["backward"] - (
        lines["allocator_rounding"] + lines["fragmentation_reserve"] + lines["cuda_context"]
    )
    assert backward == expected - 2_048_000 - 512_000 + 2 * 512_000
