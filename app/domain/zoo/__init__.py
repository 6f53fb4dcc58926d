"""Built-in model zoo: well-known architectures as layer graphs, with their reference counts.

Each :class:`ZooModel` holds a JSON-serializable layer graph (see :mod:`app.domain.graph`) that
:func:`app.domain.analysis.analyze` turns into shapes, parameters, FLOPs and saved tensors.
The graphs follow a named PyTorch reference implementation closely enough to reproduce its
parameter count exactly. The parametric builders (:func:`gpt2`, :func:`bert`, :func:`vit`,
:func:`llama`, :func:`lstm_classifier`) build the same architectures at other sizes.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from types import MappingProxyType
from typing import Any

from app.domain.graph.analysis import InputDecl
from app.domain.zoo import cnn, rnn, transformers

__all__ = ["ZOO", "ZooModel", "bert", "gpt2", "llama", "lstm_classifier", "vit"]


@dataclass(frozen=True, slots=True, kw_only=True)
class ZooModel:
    """A built-in model: its layer graph, default symbol bindings and reference count."""

    slug: str  # e.g. "resnet-50"
    name: str  # "ResNet-50"
    family: (
        str  # "cnn" | "transformer-encoder" | "transformer-decoder" | "vision-transformer" | "rnn"
    )
    description: str  # one or two sentences, naming the reference implementation
    inputs: tuple[InputDecl, ...]
    layers: tuple[Mapping[str, Any], ...]  # plain dicts and lists, JSON-serializable
    default_bindings: Mapping[str, int]  # e.g. {"image": 224} or {"seq": 2048}; never "batch"
    reference_params: int | None  # canonical PyTorch parameter count, None if none is canonical
    reference: str  # "torchvision.models.resnet50", "transformers LlamaForCausalLM (...)"


Graph = tuple[tuple[InputDecl, ...], list[dict[str, Any]]]


def _model(
    graph: Graph,
    *,
    slug: str,
    name: str,
    family: str,
    description: str,
    bindings: dict[str, int],
    reference: str,
    reference_params: int | None = None,
) -> ZooModel:
    inputs, layers = graph
    return ZooModel(
        slug=slug,
        name=name,
        family=family,
        description=description,
        inputs=tuple(inputs),
        layers=tuple(layers),
        default_bindings=bindings,
        reference_params=reference_params,
        reference=reference,
    )


def gpt2(
    *,
    layers: int = 12,
    hidden: int = 768,
    heads: int = 12,
    vocab: int = 50257,
    positions: int = 1024,
    intermediate: int | None = None,
    dropout: float = 0.1,
) -> ZooModel:
    """A GPT-2 style decoder (Hugging Face ``GPT2LMHeadModel``) of any size."""
    inner = intermediate or 4 * hidden
    graph = transformers.gpt2(
        layers=layers,
        hidden=hidden,
        heads=heads,
        vocab=vocab,
        positions=positions,
        intermediate=inner,
        dropout=dropout,
    )
    return _model(
        graph,
        slug=f"gpt-2-{layers}l-{hidden}d",
        name=f"GPT-2 ({layers} layers, hidden {hidden})",
        family="transformer-decoder",
        description=(
            f"GPT-2 style causal decoder with {layers} pre-LN blocks, {heads} heads and an LM "
            "head tied to the token embedding, as Hugging Face GPT2LMHeadModel builds it."
        ),
        bindings={"seq": positions},
        reference=(
            f"transformers GPT2LMHeadModel (n_layer={layers}, n_embd={hidden}, n_head={heads}, "
            f"n_inner={inner}, vocab_size={vocab}, n_positions={positions})"
        ),
    )


def bert(
    *,
    layers: int = 12,
    hidden: int = 768,
    heads: int = 12,
    vocab: int = 30522,
    positions: int = 512,
    type_vocab: int = 2,
    intermediate: int | None = None,
    dropout: float = 0.1,
    pooler: bool = True,
) -> ZooModel:
    """A BERT style encoder (Hugging Face ``BertModel``) of any size."""
    inner = intermediate or 4 * hidden
    graph = transformers.bert(
        layers=layers,
        hidden=hidden,
        heads=heads,
        vocab=vocab,
        positions=positions,
        type_vocab=type_vocab,
        intermediate=inner,
        dropout=dropout,
        pooler=pooler,
    )
    return _model(
        graph,
        slug=f"bert-{layers}l-{hidden}d",
        name=f"BERT ({layers} layers, hidden {hidden})",
        family="transformer-encoder",
        description=(
            f"BERT style bidirectional encoder with {layers} post-LN blocks and {heads} heads"
            f"{' and a tanh pooler' if pooler else ''}, as Hugging Face BertModel builds it."
        ),
        bindings={"seq": positions},
        reference=(
            f"transformers BertModel (num_hidden_layers={layers}, hidden_size={hidden}, "
            f"num_attention_heads={heads}, intermediate_size={inner}, vocab_size={vocab}, "
            f"max_position_embeddings={positions}, add_pooling_layer={pooler})"
        ),
    )


def vit(
    *,
    layers: int = 12,
    hidden: int = 768,
    heads: int = 12,
    intermediate: int | None = None,
    patch: int = 16,
    image: int = 224,
    classes: int = 1000,
    dropout: float = 0.0,
) -> ZooModel:
    """A Vision Transformer (Hugging Face ``ViTForImageClassification``) of any size."""
    inner = intermediate or 4 * hidden
    graph = transformers.vit(
        layers=layers,
        hidden=hidden,
        heads=heads,
        intermediate=inner,
        patch=patch,
        image=image,
        classes=classes,
        dropout=dropout,
    )
    return _model(
        graph,
        slug=f"vit-{layers}l-{hidden}d-p{patch}",
        name=f"ViT ({layers} layers, hidden {hidden}, patch {patch})",
        family="vision-transformer",
        description=(
            f"Vision Transformer with {patch}x{patch} patches, a class token and {layers} pre-LN "
            "blocks, as Hugging Face ViTForImageClassification builds it."
        ),
        bindings={"image": image},
        reference=(
            f"transformers ViTForImageClassification (num_hidden_layers={layers}, "
            f"hidden_size={hidden}, num_attention_heads={heads}, intermediate_size={inner}, "
            f"patch_size={patch}, image_size={image}, num_labels={classes})"
        ),
    )


def llama(
    *,
    layers: int,
    hidden: int,
    heads: int,
    kv_heads: int,
    intermediate: int,
    vocab: int,
    tied: bool = False,
    positions: int = 4096,
) -> ZooModel:
    """A Llama style decoder (Hugging Face ``LlamaForCausalLM``) of any size.

    ``positions`` (rotary, so no parameters) only sets the default sequence length.
    """
    graph = transformers.llama(
        layers=layers,
        hidden=hidden,
        heads=heads,
        kv_heads=kv_heads,
        intermediate=intermediate,
        vocab=vocab,
        tied=tied,
    )
    return _model(
        graph,
        slug=f"llama-{layers}l-{hidden}d",
        name=f"Llama ({layers} layers, hidden {hidden})",
        family="transformer-decoder",
        description=(
            f"Llama style causal decoder with {layers} RMSNorm pre-norm blocks, rotary attention "
            f"({heads} query / {kv_heads} key-value heads) and a SwiGLU MLP, as Hugging Face "
            "LlamaForCausalLM builds it."
        ),
        bindings={"seq": positions},
        reference=(
            f"transformers LlamaForCausalLM (num_hidden_layers={layers}, hidden_size={hidden}, "
            f"num_attention_heads={heads}, num_key_value_heads={kv_heads}, "
            f"intermediate_size={intermediate}, vocab_size={vocab}, tie_word_embeddings={tied})"
        ),
    )


def lstm_classifier(
    *,
    vocab: int = 20000,
    embed: int = 128,
    hidden: int = 256,
    layers: int = 1,
    classes: int = 2,
    bidirectional: bool = False,
    seq: int = 128,
    cell: str = "lstm",
) -> ZooModel:
    """An LSTM text classifier (embedding, LSTM, last time step, linear) of any size; ``cell``
    ``gru`` or ``rnn`` puts a GRU or an Elman RNN in the LSTM's place."""
    graph = rnn.lstm_classifier(
        vocab=vocab,
        embed=embed,
        hidden=hidden,
        layers=layers,
        classes=classes,
        bidirectional=bidirectional,
        cell=cell,
    )
    module = {"lstm": "LSTM", "gru": "GRU", "rnn": "RNN"}[cell]
    return _model(
        graph,
        slug=f"{cell}-classifier-{layers}l-{hidden}d",
        name=f"{module} classifier ({layers} layers, hidden {hidden})",
        family="rnn",
        description=(
            f"Text classifier: token embedding, batch-first {module}, the last time step's "
            f"output, and a linear layer, built from PyTorch nn.Embedding, nn.{module} and "
            "nn.Linear."
        ),
        bindings={"seq": seq},
        reference=(
            f"torch.nn: Embedding({vocab}, {embed}) -> {module}({embed}, {hidden}, "
            f"num_layers={layers}, bidirectional={bidirectional}, batch_first=True) -> "
            f"Linear({hidden * (2 if bidirectional else 1)}, {classes})"
        ),
    )


def _cnn(graph: Graph, slug: str, name: str, params: int, reference: str, what: str) -> ZooModel:
    return _model(
        graph,
        slug=slug,
        name=name,
        family="cnn",
        description=f"{what} ({reference}).",
        bindings={"image": 224},
        reference=reference,
        reference_params=params,
    )


def _zoo() -> dict[str, ZooModel]:
    models = [
        _cnn(
            cnn.alexnet(),
            "alexnet",
            "AlexNet",
            61_100_840,
            "torchvision.models.alexnet",
            "AlexNet: five convolutions with max pooling and three fully connected layers",
        ),
        _cnn(
            cnn.vgg(),
            "vgg-16",
            "VGG-16",
            138_357_544,
            "torchvision.models.vgg16",
            "VGG-16 without batch norm: thirteen 3x3 convolutions in five stages and three "
            "fully connected layers",
        ),
        _cnn(
            cnn.googlenet(),
            "googlenet",
            "GoogLeNet",
            6_624_904,
            "torchvision.models.googlenet",
            "GoogLeNet (Inception v1) with batch norm, without the auxiliary classifiers",
        ),
        _cnn(
            cnn.resnet(),
            "resnet-50",
            "ResNet-50",
            25_557_032,
            "torchvision.models.resnet50",
            "ResNet-50 v1.5: bottleneck residual blocks with the stride on the 3x3 convolution",
        ),
        _cnn(
            cnn.mobilenet_v2(),
            "mobilenet-v2",
            "MobileNetV2",
            3_504_872,
            "torchvision.models.mobilenet_v2",
            "MobileNetV2 at width 1.0: inverted residual blocks with depthwise convolutions "
            "and ReLU6",
        ),
        replace(
            vit(),
            slug="vit-b-16",
            name="ViT-B/16",
            description=(
                "ViT-Base with 16x16 patches at 224x224 and a 1000-class head, as Hugging Face "
                "ViTForImageClassification builds it (google/vit-base-patch16-224)."
            ),
            reference_params=86_567_656,
        ),
        replace(
            bert(),
            slug="bert-base",
            name="BERT-base",
            description=(
                "BERT-base (uncased vocabulary) with its pooler, as Hugging Face BertModel "
                "builds it (bert-base-uncased)."
            ),
            reference_params=109_482_240,
        ),
        replace(
            gpt2(),
            slug="gpt-2",
            name="GPT-2 small",
            description=(
                "GPT-2 small (124M) with its tied LM head, as Hugging Face GPT2LMHeadModel "
                "builds it (openai-community/gpt2)."
            ),
            reference_params=124_439_808,
        ),
        replace(
            llama(
                layers=32,
                hidden=4096,
                heads=32,
                kv_heads=32,
                intermediate=11008,
                vocab=32000,
                positions=4096,
            ),
            slug="llama-2-7b",
            name="Llama-2-7B",
            description=(
                "Llama 2 7B with an untied LM head, as Hugging Face LlamaForCausalLM builds it "
                "(meta-llama/Llama-2-7b-hf)."
            ),
            reference_params=6_738_415_616,
        ),
        replace(
            llama(
                layers=32,
                hidden=4096,
                heads=32,
                kv_heads=8,
                intermediate=14336,
                vocab=128256,
                positions=8192,
            ),
            slug="llama-3-8b",
            name="Llama-3-8B",
            description=(
                "Llama 3 8B with grouped-query attention (8 key-value heads) and an untied LM "
                "head, as Hugging Face LlamaForCausalLM builds it (meta-llama/Meta-Llama-3-8B)."
            ),
            reference_params=8_030_261_248,
        ),
        replace(
            gpt2(layers=96, hidden=12288, heads=96, intermediate=49152, positions=2048),
            slug="gpt-3-175b",
            name="GPT-3 175B",
            description=(
                "GPT-3 175B as the GPT-2 architecture scaled to 96 layers, hidden 12288 and 2048 "
                "positions with dense attention and a tied head (Hugging Face GPT2LMHeadModel): "
                "174,604,259,328 parameters."
            ),
        ),
        replace(
            lstm_classifier(),
            slug="lstm-classifier",
            name="LSTM text classifier",
            # 20000*128 + 4*256*(128+256) + 8*256 + 256*2 + 2
            reference_params=2_955_778,
        ),
        _model(
            cnn.unet3d(),
            slug="3d-unet-kits19",
            name="3D U-Net (KiTS19)",
            family="cnn",
            description=(
                "MLPerf's 3D U-Net for KiTS19 kidney tumor segmentation: 3-d convolutions with "
                "instance norm and ReLU, filters 32-64-128-256-320, strided-convolution "
                "downsampling and transposed-convolution upsampling with skip concatenations, "
                "3 output classes, on 128^3 single-channel patches "
                "(mlcommons/inference vision/medical_imaging/3d-unet-kits19)."
            ),
            bindings={"image": 128},
            reference=(
                "mlcommons/training image_segmentation/pytorch/model/unet3d.py Unet3D(1, 3, "
                "normalization='instancenorm', activation='relu')"
            ),
            reference_params=31_190_243,
        ),
    ]
    return {model.slug: model for model in models}


ZOO: Mapping[str, ZooModel] = MappingProxyType(_zoo())
