"""Model builders for the fidelity benchmark (random init only; nothing is downloaded).

The CNNs are hand-written replicas of torchvision's (same module structure, in-place ReLUs and
dropout placement) because torchvision cannot be installed beside the pinned CPU torch. The
transformers come from Hugging Face configs. Every full-size parameter count is asserted
against the published number; models too big to allocate are counted on the meta device.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from transformers import (
    BertConfig,
    BertModel,
    GPT2Config,
    GPT2LMHeadModel,
    LlamaConfig,
    LlamaForCausalLM,
    PretrainedConfig,
    PreTrainedModel,
    ViTConfig,
    ViTForImageClassification,
)
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

# --------------------------------------------------------------------------- torchvision CNNs


class AlexNet(nn.Module):
    """torchvision ``alexnet`` (61,100,840 parameters)."""

    def __init__(self, num_classes: int = 1000, dropout: float = 0.5) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 64, kernel_size=11, stride=4, padding=2),
            nn.ReLU(inplace=True),
            nn.MaxPool2d(kernel_size=3, stride=2),
            nn.Conv2d(64, 192, kernel_size=5, padding=2),
            nn.ReLU(inplace=True),
            nn.MaxPool2d(kernel_size=3, stride=2),
            nn.Conv2d(192, 384, kernel_size=3, padding=1),
            nn.ReLU(inplace=True),
            nn.Conv2d(384, 256, kernel_size=3, padding=1),
            nn.ReLU(inplace=True),
            nn.Conv2d(256, 256, kernel_size=3, padding=1),
            nn.ReLU(inplace=True),
            nn.MaxPool2d(kernel_size=3, stride=2),
        )
        self.avgpool = nn.AdaptiveAvgPool2d((6, 6))
        self.classifier = nn.Sequential(
            nn.Dropout(p=dropout),
            nn.Linear(256 * 6 * 6, 4096),
            nn.ReLU(inplace=True),
            nn.Dropout(p=dropout),
            nn.Linear(4096, 4096),
            nn.ReLU(inplace=True),
            nn.Linear(4096, num_classes),
        )

    def forward(self, x: Tensor) -> Tensor:
        x = self.features(x)
        x = self.avgpool(x)
        x = torch.flatten(x, 1)
        return self.classifier(x)


VGG16_CFG: list[int | str] = [64, 64, "M", 128, 128, "M", 256, 256, 256, "M"]
VGG16_CFG += [512, 512, 512, "M", 512, 512, 512, "M"]


class VGG(nn.Module):
    """torchvision ``vgg16`` without batch norm (138,357,544 parameters)."""

    def __init__(self, num_classes: int = 1000, dropout: float = 0.5) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        in_channels = 3
        for v in VGG16_CFG:
            if v == "M":
                layers.append(nn.MaxPool2d(kernel_size=2, stride=2))
            else:
                assert isinstance(v, int)
                layers += [
                    nn.Conv2d(in_channels, v, kernel_size=3, padding=1),
                    nn.ReLU(inplace=True),
                ]
                in_channels = v
        self.features = nn.Sequential(*layers)
        self.avgpool = nn.AdaptiveAvgPool2d((7, 7))
        self.classifier = nn.Sequential(
            nn.Linear(512 * 7 * 7, 4096),
            nn.ReLU(True),
            nn.Dropout(p=dropout),
            nn.Linear(4096, 4096),
            nn.ReLU(True),
            nn.Dropout(p=dropout),
            nn.Linear(4096, num_classes),
        )

    def forward(self, x: Tensor) -> Tensor:
        x = self.features(x)
        x = self.avgpool(x)
        x = torch.flatten(x, 1)
        return self.classifier(x)


class BasicConv2d(nn.Module):
    """torchvision GoogLeNet's conv (no bias) + BN(eps=0.001) + in-place ReLU."""

    def __init__(self, in_channels: int, out_channels: int, **kwargs: int) -> None:
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, bias=False, **kwargs)
        self.bn = nn.BatchNorm2d(out_channels, eps=0.001)

    def forward(self, x: Tensor) -> Tensor:
        x = self.conv(x)
        x = self.bn(x)
        return F.relu(x, inplace=True)


class Inception(nn.Module):
    """torchvision's Inception block (branch 3 uses a 3x3 conv, as torchvision does)."""

    def __init__(
        self,
        in_channels: int,
        ch1x1: int,
        ch3x3red: int,
        ch3x3: int,
        ch5x5red: int,
        ch5x5: int,
        pool_proj: int,
    ) -> None:
        super().__init__()
        self.branch1 = BasicConv2d(in_channels, ch1x1, kernel_size=1)
        self.branch2 = nn.Sequential(
            BasicConv2d(in_channels, ch3x3red, kernel_size=1),
            BasicConv2d(ch3x3red, ch3x3, kernel_size=3, padding=1),
        )
        self.branch3 = nn.Sequential(
            BasicConv2d(in_channels, ch5x5red, kernel_size=1),
            BasicConv2d(ch5x5red, ch5x5, kernel_size=3, padding=1),
        )
        self.branch4 = nn.Sequential(
            nn.MaxPool2d(kernel_size=3, stride=1, padding=1, ceil_mode=True),
            BasicConv2d(in_channels, pool_proj, kernel_size=1),
        )

    def forward(self, x: Tensor) -> Tensor:
        outputs = [self.branch1(x), self.branch2(x), self.branch3(x), self.branch4(x)]
        return torch.cat(outputs, 1)


class GoogLeNet(nn.Module):
    """torchvision ``googlenet(aux_logits=False, transform_input=False)`` (6,624,904 params)."""

    def __init__(self, num_classes: int = 1000, dropout: float = 0.2) -> None:
        super().__init__()
        self.conv1 = BasicConv2d(3, 64, kernel_size=7, stride=2, padding=3)
        self.maxpool1 = nn.MaxPool2d(3, stride=2, ceil_mode=True)
        self.conv2 = BasicConv2d(64, 64, kernel_size=1)
        self.conv3 = BasicConv2d(64, 192, kernel_size=3, padding=1)
        self.maxpool2 = nn.MaxPool2d(3, stride=2, ceil_mode=True)
        self.inception3a = Inception(192, 64, 96, 128, 16, 32, 32)
        self.inception3b = Inception(256, 128, 128, 192, 32, 96, 64)
        self.maxpool3 = nn.MaxPool2d(3, stride=2, ceil_mode=True)
        self.inception4a = Inception(480, 192, 96, 208, 16, 48, 64)
        self.inception4b = Inception(512, 160, 112, 224, 24, 64, 64)
        self.inception4c = Inception(512, 128, 128, 256, 24, 64, 64)
        self.inception4d = Inception(512, 112, 144, 288, 32, 64, 64)
        self.inception4e = Inception(528, 256, 160, 320, 32, 128, 128)
        self.maxpool4 = nn.MaxPool2d(2, stride=2, ceil_mode=True)
        self.inception5a = Inception(832, 256, 160, 320, 32, 128, 128)
        self.inception5b = Inception(832, 384, 192, 384, 48, 128, 128)
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.dropout = nn.Dropout(p=dropout)
        self.fc = nn.Linear(1024, num_classes)

    def forward(self, x: Tensor) -> Tensor:
        x = self.maxpool1(self.conv1(x))
        x = self.maxpool2(self.conv3(self.conv2(x)))
        x = self.maxpool3(self.inception3b(self.inception3a(x)))
        x = self.inception4a(x)
        x = self.inception4d(self.inception4c(self.inception4b(x)))
        x = self.maxpool4(self.inception4e(x))
        x = self.inception5b(self.inception5a(x))
        x = torch.flatten(self.avgpool(x), 1)
        return self.fc(self.dropout(x))


class Bottleneck(nn.Module):
    """torchvision ResNet v1.5 bottleneck (stride on the 3x3 conv)."""

    expansion = 4

    def __init__(
        self, inplanes: int, planes: int, stride: int = 1, downsample: nn.Module | None = None
    ) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(inplanes, planes, kernel_size=1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, kernel_size=3, stride=stride, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.conv3 = nn.Conv2d(planes, planes * self.expansion, kernel_size=1, bias=False)
        self.bn3 = nn.BatchNorm2d(planes * self.expansion)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = downsample

    def forward(self, x: Tensor) -> Tensor:
        identity = x
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        if self.downsample is not None:
            identity = self.downsample(x)
        out += identity
        return self.relu(out)


class ResNet50(nn.Module):
    """torchvision ``resnet50`` (25,557,032 parameters)."""

    def __init__(self, num_classes: int = 1000) -> None:
        super().__init__()
        self.inplanes = 64
        self.conv1 = nn.Conv2d(3, 64, kernel_size=7, stride=2, padding=3, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(kernel_size=3, stride=2, padding=1)
        self.layer1 = self._make_layer(64, 3)
        self.layer2 = self._make_layer(128, 4, stride=2)
        self.layer3 = self._make_layer(256, 6, stride=2)
        self.layer4 = self._make_layer(512, 3, stride=2)
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(512 * Bottleneck.expansion, num_classes)

    def _make_layer(self, planes: int, blocks: int, stride: int = 1) -> nn.Sequential:
        downsample = None
        if stride != 1 or self.inplanes != planes * Bottleneck.expansion:
            downsample = nn.Sequential(
                nn.Conv2d(
                    self.inplanes, planes * Bottleneck.expansion, 1, stride=stride, bias=False
                ),
                nn.BatchNorm2d(planes * Bottleneck.expansion),
            )
        layers = [Bottleneck(self.inplanes, planes, stride, downsample)]
        self.inplanes = planes * Bottleneck.expansion
        layers += [Bottleneck(self.inplanes, planes) for _ in range(1, blocks)]
        return nn.Sequential(*layers)

    def forward(self, x: Tensor) -> Tensor:
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        x = torch.flatten(self.avgpool(x), 1)
        return self.fc(x)


class Conv2dNormActivation(nn.Sequential):
    """torchvision's conv (no bias) + BatchNorm + ReLU6(inplace=True) block."""

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel_size: int = 3,
        stride: int = 1,
        groups: int = 1,
    ) -> None:
        padding = (kernel_size - 1) // 2
        super().__init__(
            nn.Conv2d(
                in_channels, out_channels, kernel_size, stride, padding, groups=groups, bias=False
            ),
            nn.BatchNorm2d(out_channels),
            nn.ReLU6(inplace=True),
        )


class InvertedResidual(nn.Module):
    """torchvision MobileNetV2 inverted residual block."""

    def __init__(self, inp: int, oup: int, stride: int, expand_ratio: int) -> None:
        super().__init__()
        hidden_dim = round(inp * expand_ratio)
        self.use_res_connect = stride == 1 and inp == oup
        layers: list[nn.Module] = []
        if expand_ratio != 1:
            layers.append(Conv2dNormActivation(inp, hidden_dim, kernel_size=1))
        layers += [
            Conv2dNormActivation(hidden_dim, hidden_dim, stride=stride, groups=hidden_dim),
            nn.Conv2d(hidden_dim, oup, 1, 1, 0, bias=False),
            nn.BatchNorm2d(oup),
        ]
        self.conv = nn.Sequential(*layers)

    def forward(self, x: Tensor) -> Tensor:
        if self.use_res_connect:
            return x + self.conv(x)
        return self.conv(x)


class MobileNetV2(nn.Module):
    """torchvision ``mobilenet_v2`` at width 1.0 (3,504,872 parameters)."""

    SETTINGS = [(1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2)]
    SETTINGS += [(6, 96, 3, 1), (6, 160, 3, 2), (6, 320, 1, 1)]

    def __init__(self, num_classes: int = 1000, dropout: float = 0.2) -> None:
        super().__init__()
        input_channel, last_channel = 32, 1280
        features: list[nn.Module] = [Conv2dNormActivation(3, input_channel, stride=2)]
        for t, c, n, s in self.SETTINGS:
            for i in range(n):
                features.append(InvertedResidual(input_channel, c, s if i == 0 else 1, t))
                input_channel = c
        features.append(Conv2dNormActivation(input_channel, last_channel, kernel_size=1))
        self.features = nn.Sequential(*features)
        self.classifier = nn.Sequential(nn.Dropout(p=dropout), nn.Linear(last_channel, num_classes))

    def forward(self, x: Tensor) -> Tensor:
        x = self.features(x)
        x = F.adaptive_avg_pool2d(x, (1, 1))
        x = torch.flatten(x, 1)
        return self.classifier(x)


class LSTMClassifier(nn.Module):
    """Embedding(20000, 128) -> LSTM(128, 256) -> last time step -> Linear(256, 2)."""

    recurrent = nn.LSTM

    def __init__(self, vocab: int = 20000, embed: int = 128, hidden: int = 256) -> None:
        super().__init__()
        self.embedding = nn.Embedding(vocab, embed)
        self.lstm = self.recurrent(embed, hidden, num_layers=1, batch_first=True)
        self.fc = nn.Linear(hidden, 2)

    def forward(self, tokens: Tensor) -> Tensor:
        out, _ = self.lstm(self.embedding(tokens))
        return self.fc(out[:, -1, :])


class GRUClassifier(LSTMClassifier):
    """Embedding(20000, 128) -> GRU(128, 256) -> last time step -> Linear(256, 2)."""

    recurrent = nn.GRU


class RNNClassifier(LSTMClassifier):
    """Embedding(20000, 128) -> RNN(128, 256, tanh) -> last time step -> Linear(256, 2)."""

    recurrent = nn.RNN


# --------------------------------------------------------------------------- HF transformers


def vit_b16_config(attn: str) -> ViTConfig:
    """ViT-B/16 at 224px with a 1000-class head (HF defaults: dropout 0.0)."""
    return ViTConfig(
        hidden_size=768,
        num_hidden_layers=12,
        num_attention_heads=12,
        intermediate_size=3072,
        image_size=224,
        patch_size=16,
        num_labels=1000,
        attn_implementation=attn,
    )


def bert_base_config(attn: str) -> BertConfig:
    """BERT-base uncased (HF defaults: hidden/attention dropout 0.1)."""
    return BertConfig(attn_implementation=attn)


def gpt2_small_config(attn: str) -> GPT2Config:
    """GPT-2 small, tied LM head (HF defaults: embd/attn/resid dropout 0.1)."""
    return GPT2Config(attn_implementation=attn)


def llama2_7b_config(attn: str) -> LlamaConfig:
    """Llama-2-7B: 32 layers, hidden 4096, MLP 11008, 32k vocabulary, untied head."""
    return LlamaConfig(
        hidden_size=4096,
        num_hidden_layers=32,
        num_attention_heads=32,
        num_key_value_heads=32,
        intermediate_size=11008,
        vocab_size=32000,
        max_position_embeddings=4096,
        rms_norm_eps=1e-5,
        tie_word_embeddings=False,
        attn_implementation=attn,
    )


def llama3_8b_config(attn: str) -> LlamaConfig:
    """Llama-3-8B widths (GQA with 8 KV heads, 128k vocabulary, rope theta 500k)."""
    return LlamaConfig(
        hidden_size=4096,
        num_hidden_layers=32,
        num_attention_heads=32,
        num_key_value_heads=8,
        intermediate_size=14336,
        vocab_size=128256,
        max_position_embeddings=8192,
        rms_norm_eps=1e-5,
        rope_parameters={"rope_type": "default", "rope_theta": 500000.0},
        tie_word_embeddings=False,
        attn_implementation=attn,
    )


RANDOM_POOL_NUMEL = 1 << 24


def materialize_random(model: nn.Module, dtype: torch.dtype) -> None:
    """Allocate a meta-device model on the CPU in ``dtype`` and fill it with random values.

    Weights get N(0, 0.02) draws tiled from one 16M-element pool (drawing billions of fresh
    normals takes minutes on 2 cores, and allocator bytes do not depend on the values); norm
    weights get ones. Rotary embeddings are rebuilt, since their ``inv_freq`` buffers are
    computed at construction and ``to_empty`` leaves them uninitialised.
    """
    model.to(dtype)
    model.to_empty(device="cpu")
    pool = torch.empty(RANDOM_POOL_NUMEL, dtype=dtype).normal_(0.0, 0.02)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "norm" in name:
                param.fill_(1.0)
                continue
            flat = param.view(-1)
            for start in range(0, flat.numel(), RANDOM_POOL_NUMEL):
                chunk = flat[start : start + RANDOM_POOL_NUMEL]
                chunk.copy_(pool[: chunk.numel()])
    for module_name, module in list(model.named_modules()):
        if isinstance(module, LlamaRotaryEmbedding):
            parent_name, _, attr = module_name.rpartition(".")
            rebuilt = LlamaRotaryEmbedding(config=module.config).to(dtype)
            setattr(model.get_submodule(parent_name), attr, rebuilt)


CNN_BUILDERS: dict[str, Callable[[], nn.Module]] = {
    "alexnet": AlexNet,
    "vgg16": VGG,
    "googlenet": GoogLeNet,
    "resnet50": ResNet50,
    "mobilenet_v2": MobileNetV2,
    "lstm_classifier": LSTMClassifier,
    "gru_classifier": GRUClassifier,
    "rnn_classifier": RNNClassifier,
}

HF_BUILDERS: dict[str, tuple[type[PreTrainedModel], Callable[[str], PretrainedConfig]]] = {
    "vit_b16": (ViTForImageClassification, vit_b16_config),
    "bert_base": (BertModel, bert_base_config),
    "gpt2_small": (GPT2LMHeadModel, gpt2_small_config),
    "llama2_7b": (LlamaForCausalLM, llama2_7b_config),
    "llama3_8b": (LlamaForCausalLM, llama3_8b_config),
}

EXPECTED_PARAMS: dict[str, int] = {
    "alexnet": 61_100_840,
    "vgg16": 138_357_544,
    "googlenet": 6_624_904,
    "resnet50": 25_557_032,
    "mobilenet_v2": 3_504_872,
    # embedding 20000*128 + LSTM 4*256*(128+256) + 2*4*256 biases + Linear 256*2+2
    "lstm_classifier": 2_955_778,
    # the same with 3 and 1 gates: 20000*128 + g*256*(128+256) + 2*g*256 + 514
    "gru_classifier": 2_856_962,
    "rnn_classifier": 2_659_330,
    "vit_b16": 86_567_656,
    "bert_base": 109_482_240,
    "gpt2_small": 124_439_808,
    "llama2_7b": 6_738_415_616,
    "llama3_8b": 8_030_261_248,
}

# Built on the meta device and materialised with ``materialize_random`` (HF's own init of
# hundreds of millions of parameters costs far more time than the measurement itself).
MATERIALIZED = {"llama2_7b", "llama3_8b"}


def build_model(
    name: str,
    *,
    attn: str = "sdpa",
    layers: int | None = None,
    dtype: torch.dtype = torch.float32,
    device: str = "cpu",
) -> nn.Module:
    """Build model ``name`` with random init; ``layers`` reduces a transformer's depth."""
    torch.manual_seed(0)
    if name in CNN_BUILDERS:
        assert layers is None, f"{name} has no reducible depth"
        with torch.device(device):
            return CNN_BUILDERS[name]().to(dtype)
    model_cls, make_config = HF_BUILDERS[name]
    config = make_config(attn)
    if layers is not None:
        config.num_hidden_layers = layers
    if device == "meta" or name in MATERIALIZED:
        with torch.device("meta"):
            model = model_cls(config)
        if device != "meta":
            materialize_random(model, dtype)
        return model
    return model_cls(config).to(dtype)


def count_params(model: nn.Module) -> int:
    """Number of distinct parameters (tied weights counted once, as ``parameters()`` does)."""
    return sum(p.numel() for p in model.parameters())


def check_param_counts() -> dict[str, int]:
    """Build every model at full size on the meta device and assert its parameter count."""
    counts: dict[str, int] = {}
    for name, expected in EXPECTED_PARAMS.items():
        counts[name] = count_params(build_model(name, device="meta"))
        assert counts[name] == expected, f"{name}: {counts[name]:,} params, expected {expected:,}"
    return counts
