import inspect
import json
import re
from collections.abc import Callable
from typing import Any

import pytest

from app.domain.graph.analysis import GraphAnalysis, analyze
from app.domain.graph.format import validate_graph
from app.domain.workload import Attention, Runtime
from app.domain.zoo import ZOO, ZooModel, bert, gpt2, llama, lstm_classifier, vit
from app.domain.zoo import transformers as zoo_transformers
from tests.support import attention_layers

SLUG = re.compile(r"^[a-z0-9](?:[a-z0-9-]{0,62}[a-z0-9])?$")
FAMILIES = {"cnn", "transformer-encoder", "transformer-decoder", "vision-transformer", "rnn"}
SHORT_SEQ = 16  # parameters do not depend on the sequence length


def run(
    model: ZooModel,
    batch: int = 1,
    attention: Attention = Attention.EAGER,
    runtime: Runtime = Runtime.CPU,
    **bindings: int,
) -> GraphAnalysis:
    return analyze(
        model.inputs,
        model.layers,
        {"batch": batch, **model.default_bindings, **bindings},
        training=True,
        attention=attention,
        runtime=runtime,
    )


def short(model: ZooModel, batch: int = 1) -> GraphAnalysis:
    """Default bindings, but a short sequence for the big text models."""
    if "seq" in model.default_bindings and model.family.startswith("transformer"):
        return run(model, batch, seq=SHORT_SEQ)
    return run(model, batch)


def lstm_params(vocab: int, embed: int, hidden: int, classes: int) -> int:
    return vocab * embed + 4 * hidden * (embed + hidden) + 8 * hidden + hidden * classes + classes


def decoder_block(hidden: int, inner: int) -> int:
    """Attention with biases, GELU MLP with biases, two layer norms."""
    return 4 * hidden * hidden + 4 * hidden + 2 * hidden * inner + inner + hidden + 4 * hidden


EXACT = {
    "alexnet": 61_100_840,
    "vgg-16": 138_357_544,
    "googlenet": 6_624_904,
    "resnet-50": 25_557_032,
    "mobilenet-v2": 3_504_872,
    "vit-b-16": 86_567_656,
    "bert-base": 109_482_240,
    "gpt-2": 124_439_808,
    "llama-2-7b": 6_738_415_616,
    "llama-3-8b": 8_030_261_248,
    "lstm-classifier": lstm_params(20000, 128, 256, 2),
    # PyTorch 2.13 CPU: the MLPerf Unet3D(1, 3) (mlcommons/inference 3d-unet-kits19
    # pytorch_checkpoint_SUT.py) built from code counts 31,190,243 parameters
    "3d-unet-kits19": 31_190_243,
}


def test_zoo_lists_every_model_in_order() -> None:
    assert list(ZOO) == [*list(EXACT)[:-2], "gpt-3-175b", "lstm-classifier", "3d-unet-kits19"]


@pytest.mark.parametrize(("slug", "expected"), list(EXACT.items()))
def test_exact_parameter_counts(slug: str, expected: int) -> None:
    model = ZOO[slug]
    assert model.reference_params == expected
    assert short(model).params == expected


def test_lstm_classifier_count_is_pytorchs() -> None:
    # Embedding 20000x128; LSTM weight_ih 4*256x128, weight_hh 4*256x256, b_ih and b_hh 4*256.
    assert lstm_params(20000, 128, 256, 2) == 2_560_000 + 393_216 + 2_048 + 514 == 2_955_778


def test_gpt3_is_175b_and_its_description_states_the_count() -> None:
    model = ZOO["gpt-3-175b"]
    params = short(model).params
    assert model.reference_params is None
    assert abs(params - 175e9) / 175e9 < 0.01
    assert f"{params:,}" in model.description
    hidden, vocab = 12288, 50257
    assert params == vocab * hidden + 2048 * hidden + 96 * decoder_block(hidden, 4 * hidden) + (
        2 * hidden
    )


def test_gpt3_analyzes_at_full_context() -> None:
    analysis = run(ZOO["gpt-3-175b"], seq=2048)
    assert analysis.output_shape == (1, 2048, 50257)


def test_vgg16_walkthrough() -> None:
    layers = {layer.name: layer for layer in run(ZOO["vgg-16"]).layers}
    assert layers["conv1_1"].params == 1_792  # 64 * 3 * 3 * 3 + 64
    assert layers["conv1_2"].params == 36_928  # 64 * 64 * 3 * 3 + 64
    assert layers["flatten"].output_shape == (1, 25_088)  # 7 * 7 * 512
    first = next(layer for layer in run(ZOO["vgg-16"], batch=32).layers if layer.op == "conv2d")
    assert first.output_numel == 224 * 224 * 64 * 32


@pytest.mark.parametrize(
    ("slug", "shape"),
    [
        ("alexnet", (2, 1000)),
        ("vgg-16", (2, 1000)),
        ("googlenet", (2, 1000)),
        ("resnet-50", (2, 1000)),
        ("mobilenet-v2", (2, 1000)),
        ("vit-b-16", (2, 1000)),
        ("bert-base", (2, 768)),
        ("gpt-2", (2, SHORT_SEQ, 50257)),
        ("llama-2-7b", (2, SHORT_SEQ, 32000)),
        ("llama-3-8b", (2, SHORT_SEQ, 128256)),
        ("gpt-3-175b", (2, SHORT_SEQ, 50257)),
        ("lstm-classifier", (2, 2)),
    ],
)
def test_output_shapes(slug: str, shape: tuple[int, ...]) -> None:
    assert short(ZOO[slug], batch=2).output_shape == shape


def test_bert_last_hidden_state_and_pooler() -> None:
    layers = {layer.name: layer for layer in run(ZOO["bert-base"], batch=2).layers}
    assert layers["encoder.11.mlp_ln"].output_shape == (2, 512, 768)
    assert layers["pooler_tanh"].output_shape == (2, 768)
    assert run(bert(pooler=False), batch=2, seq=128).output_shape == (2, 128, 768)


def test_cnn_feature_maps_match_torchvision() -> None:
    resnet = {layer.name: layer.output_shape for layer in run(ZOO["resnet-50"]).layers}
    assert resnet["layer1.0.add"] == (1, 256, 56, 56)
    assert resnet["layer4.blocks.1.relu"] == (1, 2048, 7, 7)
    googlenet = {layer.name: layer.output_shape for layer in run(ZOO["googlenet"]).layers}
    assert googlenet["maxpool1"] == (1, 64, 56, 56)
    assert googlenet["inception3b.concat"] == (1, 480, 28, 28)
    assert googlenet["inception5b.concat"] == (1, 1024, 7, 7)
    mobilenet = {layer.name: layer.output_shape for layer in run(ZOO["mobilenet-v2"]).layers}
    assert mobilenet["stage7.0.project_bn"] == (1, 320, 7, 7)
    vit_shapes = {layer.name: layer.output_shape for layer in run(ZOO["vit-b-16"]).layers}
    assert vit_shapes["position_embeddings"] == (1, 197, 768)


@pytest.mark.parametrize("slug", list(ZOO))
def test_zoo_entry_is_well_formed(slug: str) -> None:
    model = ZOO[slug]
    assert model.slug == slug
    assert SLUG.match(slug)
    assert model.family in FAMILIES
    assert model.name
    assert model.description
    assert model.reference
    assert "batch" not in model.default_bindings
    validate_graph(model.layers, [decl.name for decl in model.inputs])
    json.dumps(model.layers)  # plain dicts and lists


def test_default_bindings() -> None:
    seqs = {"bert-base": 512, "gpt-2": 1024, "llama-2-7b": 4096, "llama-3-8b": 8192}
    seqs |= {"gpt-3-175b": 2048, "lstm-classifier": 128}
    images = {"3d-unet-kits19": 128}  # MLPerf's 128^3 sub-volumes
    for slug, model in ZOO.items():
        expected = {"seq": seqs[slug]} if slug in seqs else {"image": images.get(slug, 224)}
        assert dict(model.default_bindings) == expected, slug


def test_builders_at_default_sizes_give_the_zoo_graphs() -> None:
    assert gpt2().layers == ZOO["gpt-2"].layers
    assert bert().layers == ZOO["bert-base"].layers
    assert vit().layers == ZOO["vit-b-16"].layers
    assert lstm_classifier().layers == ZOO["lstm-classifier"].layers


def test_gpt2_builder_closed_form() -> None:
    hidden, vocab, positions = 128, 1000, 64
    model = gpt2(layers=2, hidden=hidden, heads=4, vocab=vocab, positions=positions)
    expected = vocab * hidden + positions * hidden + 2 * decoder_block(hidden, 4 * hidden)
    assert run(model).params == expected + 2 * hidden
    assert run(model, batch=3).output_shape == (3, positions, vocab)
    custom = gpt2(layers=1, hidden=64, heads=2, vocab=100, positions=32, intermediate=100)
    assert run(custom).params == 100 * 64 + 32 * 64 + decoder_block(64, 100) + 2 * 64


def test_bert_builder_closed_form() -> None:
    hidden, vocab, positions, inner = 96, 500, 128, 200
    model = bert(
        layers=3, hidden=hidden, heads=4, vocab=vocab, positions=positions, intermediate=inner
    )
    embeddings = (vocab + positions + 2) * hidden + 2 * hidden
    pooler = hidden * hidden + hidden
    assert run(model).params == embeddings + 3 * decoder_block(hidden, inner) + pooler


def test_vit_builder_closed_form() -> None:
    hidden, patch, image, classes = 192, 8, 64, 10
    model = vit(layers=2, hidden=hidden, heads=3, patch=patch, image=image, classes=classes)
    tokens = (image // patch) ** 2 + 1
    embeddings = hidden * 3 * patch * patch + hidden + hidden + tokens * hidden
    head = 2 * hidden + hidden * classes + classes
    assert run(model).params == embeddings + 2 * decoder_block(hidden, 4 * hidden) + head
    assert run(model, batch=4).output_shape == (4, classes)
    with_dropout = vit(layers=2, hidden=hidden, heads=3, patch=patch, image=image, dropout=0.1)
    assert (
        run(with_dropout).params
        == run(vit(layers=2, hidden=hidden, heads=3, patch=patch, image=image)).params
    )


@pytest.mark.parametrize("tied", [False, True])
def test_llama_builder_closed_form(tied: bool) -> None:
    hidden, heads, kv_heads, inner, vocab = 256, 8, 2, 688, 1000
    model = llama(
        layers=2,
        hidden=hidden,
        heads=heads,
        kv_heads=kv_heads,
        intermediate=inner,
        vocab=vocab,
        tied=tied,
    )
    head_dim = hidden // heads
    attention = 2 * hidden * hidden + 2 * hidden * kv_heads * head_dim
    per_layer = attention + 3 * hidden * inner + 2 * hidden
    embed = vocab * hidden
    lm_head = 0 if tied else vocab * hidden
    assert run(model, seq=32).params == embed + lm_head + 2 * per_layer + hidden
    assert run(model, batch=2, seq=32).output_shape == (2, 32, vocab)


def test_llama_7b_closed_form() -> None:
    hidden, inner, vocab = 4096, 11008, 32000
    per_layer = 4 * hidden * hidden + 3 * hidden * inner + 2 * hidden
    assert ZOO["llama-2-7b"].reference_params == 2 * vocab * hidden + 32 * per_layer + hidden


def test_lstm_builder_closed_form() -> None:
    assert run(lstm_classifier(vocab=1000, embed=32, hidden=64, classes=5)).params == lstm_params(
        1000, 32, 64, 5
    )
    deep = lstm_classifier(vocab=1000, embed=32, hidden=64, layers=2, bidirectional=True)
    layer1 = 2 * 4 * 64 * (32 + 64 + 2)
    layer2 = 2 * 4 * 64 * (2 * 64 + 64 + 2)
    assert run(deep).params == 1000 * 32 + layer1 + layer2 + 2 * (2 * 64 + 1)
    assert run(deep, batch=3, seq=7).output_shape == (3, 2)


def test_fused_attention_keeps_parameters_and_drops_the_score_matrix() -> None:
    eager = run(gpt2(layers=1, dropout=0.0), seq=256)
    fused = run(gpt2(layers=1, dropout=0.0), attention=Attention.FLASH, seq=256)
    # With attention dropout in training, PyTorch's fused CPU kernel is not used: SDPA runs
    # its math path and keeps the probabilities like the eager implementation.
    fused_with_dropout = run(gpt2(layers=1), attention=Attention.FLASH, seq=256)
    assert fused_with_dropout.attention_used[0][0] is Attention.SDPA_MATH
    # On CUDA flash supports dropout: no S x S matrix is kept.
    cuda = run(gpt2(layers=1), attention=Attention.FLASH, runtime=Runtime.CUDA, seq=256)
    assert {s.label for layer in cuda.layers if layer.op == "attention" for s in layer.saved} >= {
        "logsumexp"
    }
    assert eager.params == fused.params == fused_with_dropout.params
    saved = [
        {s.label for layer in analysis.layers if layer.op == "attention" for s in layer.saved}
        for analysis in (eager, fused, fused_with_dropout)
    ]
    assert "probs" in saved[0]
    assert "probs" not in saved[1]
    assert "logsumexp" in saved[1]
    assert "probs" in saved[2]


def test_builders_say_where_attention_is_not_how() -> None:
    """No builder takes ``fused`` and no zoo graph carries it: the implementation is a request
    option (``analyze(attention=...)``)."""
    builders: list[Callable[..., Any]] = [gpt2, bert, vit, llama]
    builders += [
        zoo_transformers.gpt2,
        zoo_transformers.bert,
        zoo_transformers.vit,
        zoo_transformers.llama,
        zoo_transformers.gpt_neox,
        zoo_transformers.t5_encoder,
    ]
    for builder in builders:
        assert "fused" not in inspect.signature(builder).parameters, builder.__name__

    transformers = [model for model in ZOO.values() if model.family != "cnn"]
    for model in transformers:
        for layer in attention_layers(model.layers):
            assert "fused" not in layer, model.slug
    assert sum(len(attention_layers(model.layers)) for model in transformers) >= 6


def test_attention_used_and_decoder_flags() -> None:
    """What each zoo model's analysis says about its attention."""
    decoder = run(gpt2(layers=2), attention=Attention.EAGER, runtime=Runtime.CUDA, seq=8)
    assert decoder.is_decoder
    assert decoder.attention_used == ((Attention.EAGER, "requested"),)
    encoder = run(bert(layers=2), batch=2, runtime=Runtime.CUDA, seq=8)
    assert not encoder.is_decoder
    assert all(layer.result.kv_cache_numel == 0 for layer in encoder.layers)
    cnn = run(ZOO["resnet-50"])
    assert (cnn.attention_used, cnn.is_decoder) == ((), False)
