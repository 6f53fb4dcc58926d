"""Golden tests: cuDNN's convolution and RNN work spaces on CUDA (issue 32, point 3).

The work space is what ``run_conv_plan`` (aten/src/ATen/native/cudnn/Conv_v8.cpp) and
``_cudnn_rnn`` (aten/src/ATen/native/cudnn/RNN.cpp) take from the caching allocator per call;
the sizes were measured on an H100 (torch 2.11, cuDNN 9.19, benchmarks/fidelity/cuda).
"""

from __future__ import annotations

from typing import Any

import pytest

from app.domain.graph.analysis import InputDecl, analyze
from app.domain.graph.ops import OP_IMPLEMENTATIONS, OpContext, Storage, Transient, Value
from app.domain.graph.ops.convolution import cudnn_conv_workspace_numel
from app.domain.graph.ops.core import CUDNN_WORKSPACE
from app.domain.graph.ops.recurrent import CUDNN_RNN_FIXED_WORKSPACE_FLOATS
from app.domain.memory.estimate import MemoryRequest, analyze_for, estimate_memory
from app.domain.workload import Mode, Runtime
from app.domain.zoo import ZOO, lstm_classifier

# VGG-16's conv1_2 at batch 8, 224 px: [8, 64, 224, 224] in and out, a 64x64x3x3 weight
VGG_ACT = 8 * 64 * 224 * 224  # 25,690,112 elements
VGG_WEIGHT = 64 * 64 * 3 * 3  # 36,864


def _ctx(op_attrs: dict[str, Any], shape: tuple[int, ...], runtime: Runtime) -> OpContext:
    return OpContext(
        name="c", attrs=op_attrs, inputs=(Value(shape),), training=False, runtime=runtime
    )


def test_conv2d_on_cuda_takes_input_output_and_weight() -> None:
    attrs = {"out_channels": 64, "kernel_size": 3, "padding": 1}
    result = OP_IMPLEMENTATIONS["conv2d"](_ctx(attrs, (8, 64, 224, 224), Runtime.CUDA))
    assert result.transients == (Transient(label=CUDNN_WORKSPACE, numel=2 * VGG_ACT + VGG_WEIGHT),)
    assert 2 * VGG_ACT + VGG_WEIGHT == 51_417_088
    # oneDNN on the CPU: no cuDNN work space (its output buffer is a liveness rule)
    cpu = OP_IMPLEMENTATIONS["conv2d"](_ctx(attrs, (8, 64, 224, 224), Runtime.CPU))
    assert cpu.transients == ()


def test_a_1x1_weight_needs_no_copy_and_depthwise_runs_without_cudnn() -> None:
    assert cudnn_conv_workspace_numel(10, 20, 30, kernel_numel=1) == 30
    assert cudnn_conv_workspace_numel(10, 20, 30, kernel_numel=9) == 60
    pointwise = OP_IMPLEMENTATIONS["pointwise_conv2d"](
        _ctx({"out_channels": 256}, (32, 64, 56, 56), Runtime.CUDA)
    )
    # ResNet-50 layer1's 1x1 convs at batch 32: input + output (0.25 B + B, B = 256x56x56)
    assert pointwise.transients[0].numel == 32 * 64 * 56 * 56 + 32 * 256 * 56 * 56
    depthwise = OP_IMPLEMENTATIONS["depthwise_conv2d"](
        _ctx({"kernel_size": 3, "padding": 1}, (8, 96, 112, 112), Runtime.CUDA)
    )
    assert depthwise.transients == ()  # PyTorch's conv_depthwise2d kernel (fp32 / bf16)


def test_conv3d_is_left_out() -> None:
    analysis = analyze(
        (InputDecl(name="x", shape=("batch", 4, 8, 16, 16)),),
        [{"name": "c", "op": "conv3d", "out_channels": 6, "kernel_size": 3, "padding": 1}],
        {"batch": 2},
        training=False,
    )
    assert analysis.layers[0].result.transients == ()  # not measured in 3-d


def _lines(model: str, mode: Mode, batch: int) -> dict[str, Any]:
    zoo = ZOO[model]
    request = MemoryRequest(mode=mode, runtime=Runtime.CUDA)
    bindings = {**zoo.default_bindings, "batch": batch}
    analysis = analyze_for(zoo.inputs, zoo.layers, bindings, request)
    estimate = estimate_memory(analysis, request)
    return {line.key: line for line in estimate.lines}


def test_vgg16_inference_peaks_in_conv1_2_with_its_work_space() -> None:
    lines = _lines("vgg-16", Mode.INFERENCE, 8)
    transient = lines["transient"]
    # 2 x 102,760,448 B (input, output) + 147,456 B (weight), fp32
    assert transient.bytes == 4 * (2 * VGG_ACT + VGG_WEIGHT) == 205_668_352
    assert "'conv1_2' cudnn_workspace" in transient.formula
    # Measured on the H100: the forward rose by 411,189,760 B over the resting state = input
    # + output + this work space (411,189,248 B) + 512 B of the allocator's rounding.
    assert 2 * 4 * VGG_ACT + transient.bytes + 512 == 411_189_760


def test_a_conv_backward_takes_the_same_work_space_on_cuda_only() -> None:
    layer = {"name": "c", "op": "conv2d", "out_channels": 8, "kernel_size": 3, "padding": 1}
    image = (InputDecl(name="x", shape=("batch", 4, 16, 16)),)
    request = MemoryRequest(mode=Mode.TRAINING, runtime=Runtime.CUDA)
    analysis = analyze_for(image, [layer], {"batch": 2}, request)
    # input 2x4x16x16 + output 2x8x16x16 + weight 8x4x3x3 = 6,432 elements, 25,728 B fp32
    assert analysis.layers[0].result.transients[0].numel == 2048 + 4096 + 288
    estimate = estimate_memory(analysis, request)
    assert estimate.peak_phase == "backward"
    lines = {line.key: line for line in estimate.lines}
    assert lines["transient"].bytes == 16_384 + 25_728 + 8_192  # dy + work space + dx
    assert "25,728 [B: 'c' cuDNN backward work space]" in lines["transient"].formula
    cpu = MemoryRequest(mode=Mode.TRAINING, runtime=Runtime.CPU)
    cpu_estimate = estimate_memory(analyze_for(image, [layer], {"batch": 2}, cpu), cpu)
    assert all("cuDNN" not in line.formula for line in cpu_estimate.lines)


@pytest.mark.parametrize(("batch", "measured_bytes"), [(8, 16_777_216), (32, 34_316_288)])
def test_lstm_inference_work_space_matches_the_measured(batch: int, measured_bytes: int) -> None:
    """The fitted rule reproduces both inference rows it was fitted on (within 100 B: the
    slope is rounded to 5 digits)."""
    model = lstm_classifier()
    request = MemoryRequest(mode=Mode.INFERENCE, runtime=Runtime.CUDA)
    analysis = analyze_for(model.inputs, model.layers, {**model.default_bindings,
                           "batch": batch, "seq": 128}, request)  # fmt: skip
    lstm = next(layer for layer in analysis.layers if layer.op == "lstm")
    out_numel = batch * 128 * 256
    copy, workspace = lstm.result.transients
    assert (copy.label, copy.numel, copy.storage) == ("input_seq_first", batch * 128 * 128,
                                                      Storage.ACT)  # fmt: skip
    assert workspace.storage is Storage.FP32
    per_element = -(-out_numel * 55755 // 10000)  # ceil(5.5755 x output elements)
    assert workspace.numel == CUDNN_RNN_FIXED_WORKSPACE_FLOATS + per_element
    assert abs(4 * workspace.numel - measured_bytes) <= 100
    assert lstm.result.saved == ()


def test_lstm_training_keeps_the_reserve_and_takes_the_fixed_work_space() -> None:
    model = lstm_classifier()
    request = MemoryRequest(mode=Mode.TRAINING, runtime=Runtime.CUDA)
    analysis = analyze_for(model.inputs, model.layers, {**model.default_bindings,
                           "batch": 32, "seq": 128}, request)  # fmt: skip
    lstm = next(layer for layer in analysis.layers if layer.op == "lstm")
    out_numel = 32 * 128 * 256
    assert [(s.label, s.source, s.numel) for s in lstm.result.saved] == [
        ("input", "in0", 32 * 128 * 128),
        ("output", "out", out_numel),
        ("reserve", "new", -(-out_numel * 1193 // 100)),  # 11.93 floats per output element
    ]
    assert [t.label for t in lstm.result.transients] == ["input_seq_first", CUDNN_WORKSPACE]
    assert lstm.result.transients[1].numel == CUDNN_RNN_FIXED_WORKSPACE_FLOATS


def test_lstm_on_cpu_keeps_the_onednn_rule() -> None:
    model = lstm_classifier()
    request = MemoryRequest(mode=Mode.TRAINING, runtime=Runtime.CPU)
    analysis = analyze_for(model.inputs, model.layers, {**model.default_bindings,
                           "batch": 8, "seq": 128}, request)  # fmt: skip
    lstm = next(layer for layer in analysis.layers if layer.op == "lstm")
    assert [s.label for s in lstm.result.saved] == ["input", "output", "workspace"]
    assert [t.label for t in lstm.result.transients] == ["layer_buffers"]


def test_inference_allocates_the_cublas_workspace_at_the_first_gemm() -> None:
    """VGG-16 fp32 at batch 8 on the H100 reserved 950 MiB in its warm-up forward and 1,148 MiB
    (1,203,765,248 B) in the steady ones: the cuBLAS workspaces, allocated at fc6's GEMM in the
    warm-up, split the block conv1_2's work space had cached, so the steady conv1_2 needs a new
    segment (198 MiB). The replay of a warm-up then a steady forward gives 1,210,056,704 B
    (+0.5 %); with the workspace allocated before the step it gave 1,035,993,088 B (-13.9 %)."""
    lines = _lines("vgg-16", Mode.INFERENCE, 8)
    formula = lines["fragmentation_reserve"].formula
    assert formula.startswith("1,210,056,704 [B: peak reserved, max_memory_reserved]")
    assert abs(1_210_056_704 / 1_203_765_248 - 1) < 0.006
