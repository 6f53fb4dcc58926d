"""3-d convolution, transposed 3-d convolution and 3-d instance norm (issue 15, point 5), and
the MLPerf 3D U-Net built from them. Figures are worked by hand from PyTorch's formulas
(``torch.nn.Conv3d`` / ``ConvTranspose3d`` / ``InstanceNorm3d`` docs)."""

from typing import Any

import pytest

from app.domain.errors import GraphError
from app.domain.graph.analysis import GraphAnalysis, InputDecl, analyze
from app.domain.graph.ops import Storage
from app.domain.memory.estimate import MemoryRequest, estimate_memory
from app.domain.performance.kernels import layer_gemms
from app.domain.performance.tiling import Gemm
from app.domain.workload import Mode, Runtime
from app.domain.zoo import ZOO

VOLUME = InputDecl(name="x", shape=("batch", 4, 8, 16, 16))


def one(layer: dict[str, Any], batch: int = 2, training: bool = True) -> GraphAnalysis:
    return analyze((VOLUME,), [layer], {"batch": batch}, training=training)


def test_conv3d_shape_params_flops_and_saved_input() -> None:
    layer = {
        "name": "c",
        "op": "conv3d",
        "out_channels": 6,
        "kernel_size": [3, 3, 1],
        "stride": [1, 2, 2],
        "padding": [1, 1, 0],
        "bias": True,
    }
    result = one(layer).layers[0].result
    # D: (8 + 2 - 3) // 1 + 1 = 8; H: (16 + 2 - 3) // 2 + 1 = 8; W: (16 - 1) // 2 + 1 = 8
    assert result.shape == (2, 6, 8, 8, 8)
    assert result.param_shapes == ((6, 4, 3, 3, 1), (6,))
    assert result.params == 6 * 4 * 9 + 6
    assert result.flops == 2 * (2 * 6 * 8 * 8 * 8) * (4 * 9)
    assert [(s.label, s.source, s.numel) for s in result.saved] == [
        ("input", "in0", 2 * 4 * 8 * 256)
    ]


def test_conv3d_same_padding_groups_and_dilation() -> None:
    layer = {
        "name": "c",
        "op": "conv3d",
        "out_channels": 8,
        "kernel_size": 3,
        "padding": "same",
        "dilation": 2,
        "groups": 2,
        "bias": False,
    }
    result = one(layer, batch=1).layers[0].result
    assert result.shape == (1, 8, 8, 16, 16)
    assert result.param_shapes == ((8, 2, 3, 3, 3),)
    assert result.flops == 2 * (8 * 8 * 16 * 16) * (2 * 27)


def test_conv_transpose3d_doubles_each_spatial_dim() -> None:
    layer = {
        "name": "up",
        "op": "conv_transpose3d",
        "out_channels": 2,
        "kernel_size": 2,
        "stride": 2,
    }
    result = one(layer).layers[0].result
    # (in - 1) * 2 + (2 - 1) + 1 = 2 * in
    assert result.shape == (2, 2, 16, 32, 32)
    assert result.param_shapes == ((4, 2, 2, 2, 2), (2,))
    # every input voxel: 4 channels x (2 outputs x 8 taps)
    assert result.flops == 2 * (2 * 4 * 8 * 16 * 16) * 2 * 8
    assert result.saved[0].label == "input"


def test_conv_transpose3d_output_padding() -> None:
    layer = {
        "name": "up",
        "op": "conv_transpose3d",
        "out_channels": 4,
        "kernel_size": 3,
        "stride": 2,
        "padding": 1,
        "output_padding": 1,
    }
    # (8 - 1) * 2 - 2 + 2 + 1 + 1 = 16
    assert one(layer).layers[0].result.shape == (2, 4, 16, 32, 32)
    bad = {**layer, "output_padding": 2}
    with pytest.raises(GraphError) as info:
        one(bad)
    assert info.value.field == "output_padding"


def test_instancenorm3d_keeps_per_sample_channel_statistics() -> None:
    layer = {"name": "n", "op": "instancenorm3d", "affine": True}
    train = one(layer).layers[0].result
    assert train.param_shapes == ((4,), (4,))
    assert train.buffers_bytes == 0  # track_running_stats=False: no running statistics
    saved = {s.label: (s.numel, s.storage) for s in train.saved}
    assert saved == {
        "input": (2 * 4 * 8 * 16 * 16, Storage.ACT),
        "save_mean": (2 * 4, Storage.FP32),
        "save_invstd": (2 * 4, Storage.FP32),
    }
    infer = one(layer, training=False).layers[0].result
    assert [s.label for s in infer.saved] == ["input"]
    assert one({"name": "n", "op": "instancenorm3d"}).layers[0].result.params == 0


@pytest.mark.parametrize(
    ("layer", "field"),
    [
        ({"name": "c", "op": "conv3d", "out_channels": 8, "kernel_size": 17}, "kernel_size"),
        ({"name": "c", "op": "conv3d", "out_channels": 8, "kernel_size": 3, "groups": 3}, "groups"),
        (
            {"name": "c", "op": "conv3d", "out_channels": 8, "kernel_size": 3, "in_channels": 3},
            "in_channels",
        ),
        (
            {"name": "c", "op": "conv3d", "out_channels": 8, "kernel_size": 3, "stride": 2,
             "padding": "same"},
            "padding",
        ),
    ],
)  # fmt: skip
def test_conv3d_rejects_what_pytorch_rejects(layer: dict[str, Any], field: str) -> None:
    with pytest.raises(GraphError) as info:
        one(layer)
    assert (info.value.layer, info.value.field) == ("c", field)


def test_3d_ops_reject_2d_inputs() -> None:
    image = InputDecl(name="x", shape=("batch", 4, 16, 16))
    for op in ("conv3d", "conv_transpose3d", "instancenorm3d"):
        layer = {"name": "l", "op": op, "out_channels": 4, "kernel_size": 1}
        if op == "instancenorm3d":
            layer = {"name": "l", "op": op}
        with pytest.raises(GraphError, match="expects a 5-d input"):
            analyze((image,), [layer], {"batch": 1}, training=False)


def test_implicit_gemms_of_3d_convolutions() -> None:
    conv = {"name": "c", "op": "conv3d", "out_channels": 6, "kernel_size": 3, "padding": 1}
    layer = one(conv, training=False).layers[0]
    assert layer_gemms(layer) == (
        Gemm(m=2 * 8 * 16 * 16, n=6, k=4 * 27, count=1, flops=layer.flops),
    )
    up = {"name": "u", "op": "conv_transpose3d", "out_channels": 2, "kernel_size": 2, "stride": 2}
    layer = one(up, training=False).layers[0]
    # data-gradient form: M output voxels x N = C_out over K = C_in * 8 taps / 8 (stride 2)
    assert layer_gemms(layer) == (Gemm(m=2 * 16 * 32 * 32, n=2, k=4, count=1, flops=layer.flops),)


UNET = ZOO["3d-unet-kits19"]


def unet(batch: int = 1, training: bool = False, runtime: Runtime = Runtime.CUDA) -> GraphAnalysis:
    return analyze(
        UNET.inputs,
        UNET.layers,
        {"batch": batch, **UNET.default_bindings},
        training=training,
        runtime=runtime,
    )


def test_unet3d_parameter_count_matches_pytorch() -> None:
    """31,190,243: ``Unet3D(1, 3)`` of mlcommons/inference 3d-unet-kits19
    (``pytorch_checkpoint_SUT.py``) rebuilt from its code in PyTorch 2.13 CPU and counted with
    ``sum(p.numel() for p in model.parameters())``; by hand: 3x3x3 bias-free convolutions and
    2 affine parameters per instance-norm channel, 2x2x2 transposed convolutions with bias, a
    1x1x1 output convolution with bias."""
    assert unet().params == UNET.reference_params == 31_190_243


def test_unet3d_shapes_follow_the_reference() -> None:
    analysis = unet()
    shapes = {layer.name: layer.output_shape for layer in analysis.layers}
    assert shapes["input_block.conv2_relu"] == (1, 32, 128, 128, 128)
    assert shapes["downsample.3.conv2_relu"] == (1, 320, 8, 8, 8)
    assert shapes["bottleneck.conv2_relu"] == (1, 320, 4, 4, 4)
    assert shapes["upsample.0.cat"] == (1, 640, 8, 8, 8)
    assert shapes["upsample.4.cat"] == (1, 64, 128, 128, 128)
    assert analysis.output_shape == (1, 3, 128, 128, 128)
    # one full-resolution 3x3x3 conv of 32 -> 32 channels: 2 x 128^3 x 32 x 32 x 27
    assert analysis.layers[3].flops == 2 * 128**3 * 32 * 32 * 27


def test_unet3d_inference_activations_on_cpu_against_pytorch() -> None:
    """The engine's inference peak at batch 1 (fp32, CPU) vs PyTorch 2.13 CPU measured once.

    Measured (the profiler's allocator timeline, ``benchmarks/fidelity/memtrack.py``; the
    reference ``Unet3D`` from code, ``eval()``, ``torch.no_grad()``, input 1x1x128^3 allocated
    beforehand): 1,766,678,528 B beyond the input at the forward's peak. The engine says
    1,342,177,280 B beyond the input (activations and transient; the input is its own line,
    counted once since issue 32): 0.76x, during 'upsample.4.conv1', 512 MiB of its input (the
    concat), 256 MiB of its output and a 512 MiB oneDNN buffer the size of its input (the larger
    of input and output). Before issue 32 the engine said 1,073,741,824 B (0.61x): the oneDNN
    buffer was output-sized, which missed most of a strided 3-d convolution's (probed: 5.1x its
    output in forward, the output and an input-sized buffer) and half of a transposed one's
    (3.0x: the output and two output-sized buffers). Known cause it does not model: the
    reference forward keeps every skip in a Python list until it returns (the graph frees a
    tensor after its last consumer). This pins the engine's figure; the ratio is the recorded
    gap."""
    analysis = unet(runtime=Runtime.CPU)
    estimate = estimate_memory(analysis, MemoryRequest(mode=Mode.INFERENCE, runtime=Runtime.CPU))
    lines = {line.key: line.bytes for line in estimate.lines}
    assert lines["weights"] == 31_190_243 * 4
    assert lines["inputs"] == 128**3 * 4
    beyond_input = lines["activations"] + lines["transient"]
    assert lines["activations"] == 512 * 2**20 + 256 * 2**20  # the concat and the output
    assert lines["transient"] == 512 * 2**20  # oneDNN: a buffer the size of the 64-channel input
    assert beyond_input == 1_342_177_280
    measured = 1_766_678_528
    assert beyond_input / measured == pytest.approx(0.76, abs=0.01)
