"""Golden numbers: the buffer a oneDNN convolution holds in its forward on the CPU runtime.

The rule (app.domain.memory.liveness._onednn_buffer, probed on PyTorch 2.13 CPU): a
convolution holds one buffer the size of the larger of its input and its output; a transposed
convolution two of its output. Nothing on CUDA.
"""

from __future__ import annotations

from typing import Any

import pytest

from app.domain.graph.analysis import InputDecl, analyze
from app.domain.memory.estimate import MemoryRequest, estimate_memory
from app.domain.workload import Mode, Runtime

IMAGE = InputDecl(name="x", shape=("batch", 8, 16, 16))
VOLUME = InputDecl(name="v", shape=("batch", 16, 4, 4, 4))


def _transient(decl: InputDecl, layer: dict[str, Any], runtime: Runtime) -> tuple[int, str]:
    analysis = analyze([decl], [layer], {"batch": 2}, training=False, runtime=runtime)
    estimate = estimate_memory(analysis, MemoryRequest(mode=Mode.INFERENCE, runtime=runtime))
    line = {line.key: line for line in estimate.lines}["transient"]
    return line.bytes, line.formula


@pytest.mark.parametrize(
    ("layer", "expected", "words"),
    [
        # stride 2 depthwise: input 2 x 8 x 16 x 16 x 4 = 16,384 B, output 2 x 8 x 8 x 8 x 4 =
        # 4,096 B: the input-sized buffer
        (
            {"name": "dw", "op": "depthwise_conv2d", "kernel_size": 3, "stride": 2,
             "padding": 1, "bias": False},
            16_384,
            "the larger of its input and output",
        ),
        # 1x1 expansion 8 -> 32 channels: output 2 x 32 x 16 x 16 x 4 = 65,536 B > input
        (
            {"name": "pw", "op": "conv2d", "out_channels": 32, "kernel_size": 1,
             "bias": False},
            65_536,
            "the larger of its input and output",
        ),
        # 1x1 projection 8 -> 2 channels: input 16,384 B > output 4,096 B
        (
            {"name": "proj", "op": "pointwise_conv2d", "out_channels": 2, "bias": False},
            16_384,
            "the larger of its input and output",
        ),
    ],
)  # fmt: skip
def test_a_cpu_convolution_holds_a_buffer_of_the_larger_of_input_and_output(
    layer: dict[str, Any], expected: int, words: str
) -> None:
    size, formula = _transient(IMAGE, layer, Runtime.CPU)
    assert size == expected
    assert f"'{layer['name']}' oneDNN buffer, {words}" in formula
    # no oneDNN buffer on CUDA (cuDNN's work space instead: tests/domain/test_cudnn_workspace.py)
    assert "oneDNN" not in _transient(IMAGE, layer, Runtime.CUDA)[1]


def test_a_strided_conv3d_holds_an_input_sized_buffer_on_cpu() -> None:
    # input 2 x 16 x 4^3 x 4 = 8,192 B; stride 2, 16 -> 32 channels: output 2 x 32 x 2^3 x 4 =
    # 2,048 B
    layer = {"name": "down", "op": "conv3d", "out_channels": 32, "kernel_size": 3, "stride": 2,
             "padding": 1, "bias": False}  # fmt: skip
    assert _transient(VOLUME, layer, Runtime.CPU)[0] == 8_192


def test_a_transposed_conv3d_holds_two_output_sized_buffers_on_cpu() -> None:
    # 16 -> 8 channels, 2x2x2 stride 2: output 2 x 8 x 8^3 x 4 = 32,768 B; two buffers of it
    layer = {"name": "up", "op": "conv_transpose3d", "out_channels": 8, "kernel_size": 2,
             "stride": 2, "bias": False}  # fmt: skip
    size, formula = _transient(VOLUME, layer, Runtime.CPU)
    assert size == 2 * 32_768
    assert "'up' oneDNN buffer, 2 x its output" in formula
