"""Convolutional networks as layer graphs, after their torchvision reference implementations.

Every builder returns ``(inputs, layers)``: one float image input ``[batch, 3, image, image]``
and a JSON-serializable layer list; :mod:`app.domain.zoo` wraps them into zoo entries.
"""

from __future__ import annotations

from typing import Any

from app.domain.graph.analysis import InputDecl
from app.domain.graph.format import BLOCK_INPUT

Layer = dict[str, Any]
Graph = tuple[tuple[InputDecl, ...], list[Layer]]

IMAGE = InputDecl(name="pixels", shape=("batch", 3, "image", "image"))


def _with_inputs(layer: Layer, inputs: list[str] | None) -> Layer:
    return layer if inputs is None else {**layer, "inputs": inputs}


def conv(
    name: str,
    out: int,
    k: int,
    stride: int = 1,
    padding: int = 0,
    *,
    bias: bool = True,
    inputs: list[str] | None = None,
) -> Layer:
    """One ``conv2d`` layer; attributes at their PyTorch default are left out."""
    layer: Layer = {"name": name, "op": "conv2d", "out_channels": out, "kernel_size": k}
    if stride != 1:
        layer["stride"] = stride
    if padding:
        layer["padding"] = padding
    if not bias:
        layer["bias"] = False
    return _with_inputs(layer, inputs)


def relu(name: str, *, six: bool = False) -> Layer:
    """In-place ReLU (or ReLU6)."""
    return {"name": name, "op": "relu6" if six else "relu", "inplace": True}


def bn(name: str, *, eps: float | None = None) -> Layer:
    """BatchNorm2d (eps 1e-5 unless given)."""
    layer: Layer = {"name": name, "op": "batchnorm2d"}
    if eps is not None:
        layer["eps"] = eps
    return layer


def conv_relu(name: str, out: int, k: int, stride: int = 1, padding: int = 0) -> list[Layer]:
    """Conv with bias, then in-place ReLU (AlexNet, VGG)."""
    return [conv(name, out, k, stride, padding), relu(f"{name}_relu")]


def conv_bn_relu(
    name: str,
    out: int,
    k: int,
    stride: int = 1,
    padding: int = 0,
    *,
    eps: float | None = None,
    six: bool = False,
    inputs: list[str] | None = None,
) -> list[Layer]:
    """Conv without bias, BatchNorm, in-place ReLU: layers ``name``, ``name_bn``, ``name_relu``.

    ResNet's conv/bn/relu, GoogLeNet's BasicConv2d (``eps=0.001``), MobileNet's
    Conv2dNormActivation (``six=True``).
    """
    return [
        conv(name, out, k, stride, padding, bias=False, inputs=inputs),
        bn(f"{name}_bn", eps=eps),
        relu(f"{name}_relu", six=six),
    ]


def maxpool(
    name: str,
    k: int,
    stride: int,
    padding: int = 0,
    *,
    ceil: bool = False,
    inputs: list[str] | None = None,
) -> Layer:
    """Max pooling."""
    layer: Layer = {"name": name, "op": "maxpool2d", "kernel_size": k, "stride": stride}
    if padding:
        layer["padding"] = padding
    if ceil:
        layer["ceil_mode"] = True
    return _with_inputs(layer, inputs)


def dropout(name: str, p: float) -> Layer:
    """Dropout with probability ``p``."""
    return {"name": name, "op": "dropout", "p": p}


def linear(name: str, out: int) -> Layer:
    """Fully connected layer with bias."""
    return {"name": name, "op": "linear", "out_features": out}


def pool_flatten(size: int) -> list[Layer]:
    """Adaptive average pool to ``size`` x ``size``, then flatten from dim 1."""
    return [
        {"name": "avgpool", "op": "adaptive_avgpool2d", "output_size": size},
        {"name": "flatten", "op": "flatten", "start_dim": 1},
    ]


def alexnet(*, classes: int = 1000, dropout_p: float = 0.5) -> Graph:
    """``torchvision.models.alexnet``."""
    layers = [
        *conv_relu("conv1", 64, 11, 4, 2),
        maxpool("pool1", 3, 2),
        *conv_relu("conv2", 192, 5, padding=2),
        maxpool("pool2", 3, 2),
        *conv_relu("conv3", 384, 3, padding=1),
        *conv_relu("conv4", 256, 3, padding=1),
        *conv_relu("conv5", 256, 3, padding=1),
        maxpool("pool5", 3, 2),
        *pool_flatten(6),
        dropout("drop6", dropout_p),
        linear("fc6", 4096),
        relu("fc6_relu"),
        dropout("drop7", dropout_p),
        linear("fc7", 4096),
        relu("fc7_relu"),
        linear("fc8", classes),
    ]
    return (IMAGE,), layers


VGG16_STAGES = ((64, 2), (128, 2), (256, 3), (512, 3), (512, 3))


def vgg(
    stages: tuple[tuple[int, int], ...] = VGG16_STAGES,
    *,
    classes: int = 1000,
    dropout_p: float = 0.5,
) -> Graph:
    """``torchvision.models.vgg16`` (no batch norm); ``stages``: (channels, convs) per stage.

    Layers are named as in the paper: ``conv1_1``, ``conv1_2``, ``pool1``, ... ``fc8``.
    """
    layers: list[Layer] = []
    for stage, (channels, convs) in enumerate(stages, start=1):
        for index in range(1, convs + 1):
            layers += conv_relu(f"conv{stage}_{index}", channels, 3, padding=1)
        layers.append(maxpool(f"pool{stage}", 2, 2))
    layers += [
        *pool_flatten(7),
        linear("fc6", 4096),
        relu("fc6_relu"),
        dropout("drop6", dropout_p),
        linear("fc7", 4096),
        relu("fc7_relu"),
        dropout("drop7", dropout_p),
        linear("fc8", classes),
    ]
    return (IMAGE,), layers


# (name, 1x1, 3x3 reduce, 3x3, "5x5" reduce, "5x5", pool proj), per torchvision GoogLeNet
GOOGLENET_INCEPTIONS = {
    "inception3a": (64, 96, 128, 16, 32, 32),
    "inception3b": (128, 128, 192, 32, 96, 64),
    "inception4a": (192, 96, 208, 16, 48, 64),
    "inception4b": (160, 112, 224, 24, 64, 64),
    "inception4c": (128, 128, 256, 24, 64, 64),
    "inception4d": (112, 144, 288, 32, 64, 64),
    "inception4e": (256, 160, 320, 32, 128, 128),
    "inception5a": (256, 160, 320, 32, 128, 128),
    "inception5b": (384, 192, 384, 48, 128, 128),
}


def inception(name: str, b1: int, b2r: int, b2: int, b3r: int, b3: int, b4: int) -> Layer:
    """torchvision's Inception block: four branches on ``@input``, concatenated on channels.

    The "5x5" branch uses a 3x3 conv, as torchvision does (a known deviation from the paper).
    """

    def basic(branch: str, out: int, k: int, *, first: bool = False) -> list[Layer]:
        inputs = [BLOCK_INPUT] if first else None
        return conv_bn_relu(branch, out, k, padding=k // 2, eps=0.001, inputs=inputs)

    layers = [
        *basic("b1", b1, 1, first=True),
        *basic("b2_reduce", b2r, 1, first=True),
        *basic("b2", b2, 3),
        *basic("b3_reduce", b3r, 1, first=True),
        *basic("b3", b3, 3),
        maxpool("b4_pool", 3, 1, 1, ceil=True, inputs=[BLOCK_INPUT]),
        *basic("b4", b4, 1),
        {"name": "concat", "op": "concat", "inputs": ["b1_relu", "b2_relu", "b3_relu", "b4_relu"]},
    ]
    return {"name": name, "op": "block", "layers": layers}


def googlenet(*, classes: int = 1000, dropout_p: float = 0.2) -> Graph:
    """``torchvision.models.googlenet`` without the auxiliary classifiers."""
    blocks = {name: inception(name, *sizes) for name, sizes in GOOGLENET_INCEPTIONS.items()}
    layers = [
        *conv_bn_relu("conv1", 64, 7, 2, 3, eps=0.001),
        maxpool("maxpool1", 3, 2, ceil=True),
        *conv_bn_relu("conv2", 64, 1, eps=0.001),
        *conv_bn_relu("conv3", 192, 3, padding=1, eps=0.001),
        maxpool("maxpool2", 3, 2, ceil=True),
        blocks["inception3a"],
        blocks["inception3b"],
        maxpool("maxpool3", 3, 2, ceil=True),
        *(blocks[f"inception4{x}"] for x in "abcde"),
        maxpool("maxpool4", 2, 2, ceil=True),
        blocks["inception5a"],
        blocks["inception5b"],
        *pool_flatten(1),
        dropout("dropout", dropout_p),
        linear("fc", classes),
    ]
    return (IMAGE,), layers


def bottleneck(
    width: int, stride: int, *, downsample: bool, stride_on_3x3: bool = True
) -> list[Layer]:
    """torchvision's ResNet v1.5 Bottleneck: the stride sits on the 3x3 conv (v1, the original
    paper's, puts it on the first 1x1 conv: ~5 % fewer FLOPs, same parameters)."""
    stride_1x1, stride_3x3 = (1, stride) if stride_on_3x3 else (stride, 1)
    layers = [
        *conv_bn_relu("conv1", width, 1, stride_1x1),
        *conv_bn_relu("conv2", width, 3, stride_3x3, 1),
        conv("conv3", 4 * width, 1, bias=False),
        bn("conv3_bn"),
    ]
    shortcut = BLOCK_INPUT
    if downsample:
        layers += [
            conv("downsample", 4 * width, 1, stride, bias=False, inputs=[BLOCK_INPUT]),
            bn("downsample_bn"),
        ]
        shortcut = "downsample_bn"
    return [
        *layers,
        {"name": "add", "op": "add", "inputs": ["conv3_bn", shortcut], "inplace": True},
        relu("relu"),
    ]


def stage(name: str, blocks: int, first: list[Layer], rest: list[Layer]) -> Layer:
    """A block: a first (shape-changing) unit ``0``, then ``blocks - 1`` repeats of ``rest``."""
    body: list[Layer] = [{"name": "0", "op": "block", "layers": first}]
    if blocks > 1:
        body.append({"name": "blocks", "op": "repeat", "times": blocks - 1, "layers": rest})
    return {"name": name, "op": "block", "layers": body}


RESNET50_BLOCKS = (3, 4, 6, 3)


def resnet(
    blocks: tuple[int, ...] = RESNET50_BLOCKS, *, classes: int = 1000, stride_on_3x3: bool = True
) -> Graph:
    """``torchvision.models.resnet50`` (bottleneck ResNets; (3, 4, 23, 3) gives ResNet-101);
    ``stride_on_3x3=False`` builds the original v1 (He et al. 2016)."""
    # The stem is "stem", not torchvision's "conv1": inner names may not shadow outer ones.
    layers = [*conv_bn_relu("stem", 64, 7, 2, 3), maxpool("maxpool", 3, 2, 1)]
    for index, count in enumerate(blocks):
        width = 64 * 2**index
        first = bottleneck(
            width, 1 if index == 0 else 2, downsample=True, stride_on_3x3=stride_on_3x3
        )
        rest = bottleneck(width, 1, downsample=False)
        layers.append(stage(f"layer{index + 1}", count, first, rest))
    return (IMAGE,), [*layers, *pool_flatten(1), linear("fc", classes)]


# (expansion t, channels c, repeats n, first stride s), torchvision MobileNetV2
MOBILENET_V2_SETTINGS = (
    (1, 16, 1, 1),
    (6, 24, 2, 2),
    (6, 32, 3, 2),
    (6, 64, 4, 2),
    (6, 96, 3, 1),
    (6, 160, 3, 2),
    (6, 320, 1, 1),
)


def inverted_residual(inp: int, out: int, stride: int, expand: int) -> list[Layer]:
    """torchvision's InvertedResidual: 1x1 expand, 3x3 depthwise, linear 1x1 projection."""
    hidden = inp * expand
    layers = conv_bn_relu("expand", hidden, 1, six=True) if expand != 1 else []
    layers += [
        {
            "name": "dw",
            "op": "depthwise_conv2d",
            "kernel_size": 3,
            "stride": stride,
            "padding": 1,
            "bias": False,
        },
        bn("dw_bn"),
        relu("dw_relu", six=True),
        conv("project", out, 1, bias=False),
        bn("project_bn"),
    ]
    if stride == 1 and inp == out:
        layers.append({"name": "add", "op": "add", "inputs": [BLOCK_INPUT, "project_bn"]})
    return layers


def mobilenet_v2(*, classes: int = 1000, dropout_p: float = 0.2) -> Graph:
    """``torchvision.models.mobilenet_v2`` at width 1.0."""
    layers = conv_bn_relu("stem", 32, 3, 2, 1, six=True)
    channels = 32
    for index, (expand, out, count, stride) in enumerate(MOBILENET_V2_SETTINGS, start=1):
        first = inverted_residual(channels, out, stride, expand)
        rest = inverted_residual(out, out, 1, expand)
        layers.append(stage(f"stage{index}", count, first, rest))
        channels = out
    layers += [
        *conv_bn_relu("last", 1280, 1, six=True),
        *pool_flatten(1),
        dropout("dropout", dropout_p),
        linear("fc", classes),
    ]
    return (IMAGE,), layers


VOLUME = InputDecl(name="volume", shape=("batch", 1, "image", "image", "image"))
UNET3D_FILTERS = (32, 64, 128, 256, 320)


def conv3d_in_relu(
    name: str, out: int, stride: int = 1, *, inputs: list[str] | None = None
) -> list[Layer]:
    """3x3x3 Conv3d without bias (padding 1), affine InstanceNorm3d, ReLU: the MLPerf 3D U-Net's
    ``conv_block_factory``; layers ``name``, ``name_norm``, ``name_relu``."""
    conv: Layer = {
        "name": name,
        "op": "conv3d",
        "out_channels": out,
        "kernel_size": 3,
        "padding": 1,
        "bias": False,
    }
    if stride != 1:
        conv["stride"] = stride
    return [
        _with_inputs(conv, inputs),
        {"name": f"{name}_norm", "op": "instancenorm3d", "affine": True},
        {"name": f"{name}_relu", "op": "relu"},
    ]


def unet3d(*, classes: int = 3, filters: tuple[int, ...] = UNET3D_FILTERS) -> Graph:
    """MLPerf's 3D U-Net for KiTS19 (mlcommons/training ``image_segmentation/pytorch/model``,
    as mlcommons/inference ``vision/medical_imaging/3d-unet-kits19`` runs it).

    An input block of two conv blocks, four strided (stride-2) down blocks and a stride-2
    bottleneck, five up blocks (a 2x2x2 stride-2 transposed convolution with bias, concatenated
    with the skip of the same resolution, then two conv blocks), and a 1x1x1 output conv with
    bias. Every conv block is a bias-free 3x3x3 Conv3d, an affine InstanceNorm3d and a ReLU
    (not in place: ``nn.ReLU()``).
    """
    layers: list[Layer] = [
        *conv3d_in_relu("input_block.conv1", filters[0]),
        *conv3d_in_relu("input_block.conv2", filters[0]),
    ]
    skips = ["input_block.conv2_relu"]
    downs = [*zip(filters[:-1], filters[1:], strict=True), (filters[-1], filters[-1])]
    for index, (_, out) in enumerate(downs):
        name = f"downsample.{index}" if index < len(filters) - 1 else "bottleneck"
        layers += conv3d_in_relu(f"{name}.conv1", out, stride=2)
        layers += conv3d_in_relu(f"{name}.conv2", out)
        skips.append(f"{name}.conv2_relu")
    skips.pop()  # the bottleneck's output feeds the first up block, not a skip
    ups = [
        (filters[-1], filters[-1]),
        *zip(reversed(filters[1:]), reversed(filters[:-1]), strict=True),
    ]
    for index, (_, out) in enumerate(ups):
        name = f"upsample.{index}"
        layers.append(
            {
                "name": f"{name}.upsample_conv",
                "op": "conv_transpose3d",
                "out_channels": out,
                "kernel_size": 2,
                "stride": 2,
            }
        )
        layers.append(
            {
                "name": f"{name}.cat",
                "op": "concat",
                "inputs": [f"{name}.upsample_conv", skips.pop()],
            }
        )
        layers += conv3d_in_relu(f"{name}.conv1", out)
        layers += conv3d_in_relu(f"{name}.conv2", out)
    layers.append(
        {"name": "output.conv", "op": "conv3d", "out_channels": classes, "kernel_size": 1}
    )
    return (VOLUME,), layers
