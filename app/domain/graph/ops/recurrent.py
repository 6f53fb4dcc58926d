"""Recurrent layers (LSTM, GRU, Elman RNN) on oneDNN / cuDNN and PyTorch's native CPU cell."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import replace

from app.domain.graph.ops.core import (
    CUDNN_WORKSPACE,
    OpContext,
    OpResult,
    Saved,
    Storage,
    Transient,
    require_float,
)
from app.domain.workload import (
    Runtime,
)

_RNN_WORKSPACE_PER_GATE = 15.585 / 4  # workspace floats per output element per gate

# cuDNN's RNN on CUDA (aten/src/ATen/native/cudnn/RNN.cpp ``_cudnn_rnn``): a batch-first input
# is transposed and copied (``input.transpose(0, 1)`` then ``x = input.contiguous()``, freed
# after the call); the work space of ``cudnnGetRNNTempSpaceSizes`` is an ``at::empty`` from
# the caching allocator for the call; in training (``fn_train``: the module in train mode) the
# reserve space too, which autograd keeps for the backward. cuDNN documents no formula ("RNN
# temporary buffer sizes are not monotonic"), so the sizes are fitted on the LSTM classifier
# (128 -> 256, sequence 128, fp32) measured on an H100 (torch 2.11, cuDNN 9.19,
# benchmarks/fidelity/cuda): the work space has a part independent of the batch, the same in
# inference and training, and a part per output element. Inference (batch 8 and 32, both
# fitted: 16,777,216 and 34,316,288 B work space): 10,930,859 B + 5.5755 floats per output
# element. Training: the fixed work space (again in the backward, whose ``_cudnn_rnn_backward_*``
# allocate it too) and a reserve of 11.93 floats per output element kept for the backward,
# fitted on the batch-32 training rows (max_memory_allocated to 0.0 %); held out, the batch-8
# training rows come out -0.1 %. Scaled by gates / 4 for GRU and Elman RNNs and per layer: not
# measured.
CUDNN_RNN_FIXED_WORKSPACE_FLOATS = 2_732_715  # 10,930,860 B per layer
_CUDNN_RNN_WORKSPACE_PER_GATE = 5.5755 / 4  # inference work space floats / output elem / gate
_CUDNN_RNN_RESERVE_PER_GATE = 11.93 / 4  # training reserve floats per output element per gate


# PyTorch's CPU GRU and vanilla RNN run its native cell step by step (only LSTM goes to oneDNN):
# tensors of the output's size ([N, S, H] per layer) that each keeps besides its input and
# output. Training: the per-step tensors autograd saves (RNN: each step's state; GRU: the gates
# (3), clones of the two in-place products' operands (2), the candidate and the state).
# Inference: the steps' states; GRU keeps one more output-sized set of step tensors under
# torch.no_grad() and none under torch.inference_mode(), which a request cannot tell apart: half
# of one is assumed (each measured case within 6 %). Both also hold the input gates for every
# step ([N, S, gates x H]) while they run, and training keeps a seq-first copy of the input for
# the input projection's backward (measured on PyTorch 2.13 CPU: benchmarks/fidelity, the GRU
# and RNN classifiers at batch 32 x 128 tokens, checked at batch 64 x 256: within 0.1 %). The
# final hidden state h_n ([layers x directions, N, H], stacked into its own tensor by _rnn_impl)
# is live with them: with the token ids counted once (issue 32), the measured peaks exceed the
# estimate without it by exactly its bytes at both shapes (RNN inference and training, GRU
# training: 32,768 B at batch 32, 65,536 B at batch 64; hidden 256, fp32). Counting the ids
# twice (32 x 128 x 8 = 32,768 B at batch 32) had hidden it where the constants were fitted.
_NATIVE_CELL_SAVED = {1: 1, 3: 7}
_NATIVE_CELL_INFERENCE = {1: 1.0, 3: 1.5}


def _native_cell(ctx: OpContext, gates: int, result: OpResult) -> OpResult:
    """``result`` (the oneDNN form) with the tensors of PyTorch's native CPU cell instead."""
    out_numel = math.prod(result.shape)
    layers = ctx.attr("num_layers", 1)
    seq = ctx.x.shape[1]
    input_gates = Transient(label="input_gates", numel=gates * out_numel * layers)
    # h_n: one state per layer and direction, [layers x directions, N, H] (out_numel / seq)
    final_state = Transient(label="final_state", numel=layers * out_numel // seq)
    if not ctx.training:
        held = math.ceil(_NATIVE_CELL_INFERENCE[gates] * out_numel * layers)
        steps = Transient(label="step_states", numel=held)
        return replace(result, saved=(), transients=(input_gates, steps, final_state))
    # Backward reads the seq-first input copy and the step tensors, not the input or the
    # stacked output (stack's backward needs nothing).
    saved = (
        Saved(label="input_seq_first", source="new", numel=ctx.x.numel),
        Saved(label="step_tensors", source="new",
              numel=_NATIVE_CELL_SAVED[gates] * out_numel * layers),
    )  # fmt: skip
    return replace(result, saved=saved, transients=(input_gates, final_state))


def _cudnn(ctx: OpContext, gates: int, result: OpResult) -> OpResult:
    """``result`` (the oneDNN form) with cuDNN's tensors on CUDA instead: the seq-first input
    copy and the work space for the call, and in training the reserve space kept for the
    backward besides the input and output (``_cudnn_rnn``'s autograd node saves them)."""
    out_numel = math.prod(result.shape)
    layers = ctx.attr("num_layers", 1)
    fixed = Transient(
        label=CUDNN_WORKSPACE,
        numel=CUDNN_RNN_FIXED_WORKSPACE_FLOATS * layers,
        storage=Storage.FP32,
    )
    input_copy = Transient(label="input_seq_first", numel=ctx.x.numel)
    if not ctx.training:
        per_element = math.ceil(out_numel * layers * _CUDNN_RNN_WORKSPACE_PER_GATE * gates)
        workspace = replace(fixed, numel=fixed.numel + per_element)
        return replace(result, saved=(), transients=(input_copy, workspace))
    reserve = math.ceil(out_numel * layers * _CUDNN_RNN_RESERVE_PER_GATE * gates)
    saved = (
        Saved(label="input", source="in0", numel=ctx.x.numel),
        Saved(label="output", source="out", numel=out_numel),
        Saved(label="reserve", source="new", numel=reserve, storage=Storage.FP32),
    )
    return replace(result, saved=saved, transients=(input_copy, fixed))


def _recurrent(gates: int) -> Callable[[OpContext], OpResult]:
    def run(ctx: OpContext) -> OpResult:
        require_float(ctx)
        if len(ctx.x.shape) != 3:
            raise ctx.fail("expects batch-first [N, S, D]", "inputs")
        n, seq, features = ctx.x.shape
        size = ctx.attrs["hidden_size"]
        layers = ctx.attr("num_layers", 1)
        directions = 2 if ctx.attr("bidirectional", False) else 1
        bias = ctx.attr("bias", True)
        params: list[tuple[int, ...]] = []
        flops = 0
        for layer in range(layers):
            width = features if layer == 0 else size * directions
            for _ in range(directions):
                params += [(gates * size, width), (gates * size, size)]
                if bias:
                    params += [(gates * size,), (gates * size,)]
                flops += 2 * n * seq * gates * size * (width + size) + 8 * n * seq * size
        out_numel = n * seq * size * directions
        # oneDNN's RNN layer keeps its input, output and a byte workspace of ~15.6 floats per
        # output element per layer (gates and states of every step; measured for LSTM on
        # PyTorch 2.13 CPU), and briefly ~4.5 outputs more. GRU and RNN on CPU run PyTorch's
        # native cell instead (_native_cell); on CUDA, cuDNN's tensors (_cudnn).
        workspace = math.ceil(out_numel * layers * _RNN_WORKSPACE_PER_GATE * gates)
        result = OpResult(
            shape=(n, seq, size * directions),
            param_shapes=tuple(params),
            flops=flops,
            saved=(
                Saved(label="input", source="in0", numel=ctx.x.numel),
                Saved(label="output", source="out", numel=out_numel),
                Saved(label="workspace", source="new", numel=workspace, storage=Storage.FP32),
            ),
            transients=(
                Transient(label="layer_buffers", numel=math.ceil(4.5 * out_numel * layers)),
            ),
        )
        if ctx.runtime is Runtime.CUDA:
            return _cudnn(ctx, gates, result)
        if gates in _NATIVE_CELL_SAVED:
            return _native_cell(ctx, gates, result)
        return result

    return run


lstm = _recurrent(4)
gru = _recurrent(3)
rnn = _recurrent(1)  # Elman RNN, tanh or relu
