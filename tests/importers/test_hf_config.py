"""Hugging Face config imports: golden parameter counts, verified with transformers 5.23
(benchmarks/hf_params/results.md), and the reference class of each."""

import json
from typing import Any

import pytest

from app.config import PROJECT_ROOT
from app.domain.zoo import ZOO
from app.importers.hf_config import SUPPORTED_MODEL_TYPES, import_hf_config
from app.importers.result import ImportRejected
from tests.support import attention_layers

CONFIGS = PROJECT_ROOT / "tests" / "fixtures" / "hf_configs"
COUNTS = PROJECT_ROOT / "benchmarks" / "hf_params" / "counts.json"

GOLDEN = {
    "llama-3-8b": (8_030_261_248, "LlamaForCausalLM (LM head untied)"),
    "llama-2-7b": (6_738_415_616, "LlamaForCausalLM (LM head untied)"),
    "mistral-7b-v0.1": (7_241_732_096, "MistralForCausalLM (LM head untied)"),
    "mixtral-8x7b-v0.1": (46_702_792_704, "MixtralForCausalLM (LM head untied)"),
    "qwen2-0.5b": (494_032_768, "Qwen2ForCausalLM (LM head tied)"),
    "gemma-2b": (2_506_172_416, "GemmaForCausalLM (LM head tied)"),
    "gpt2": (124_439_808, "GPT2LMHeadModel (LM head tied)"),
    "pythia-160m": (162_322_944, "GPTNeoXForCausalLM (embed_out untied)"),
    "bert-base-uncased": (109_482_240, "BertModel (with pooler)"),
    "roberta-base": (124_645_632, "RobertaModel (with pooler)"),
    "t5-small-encoder": (35_330_816, "T5EncoderModel"),
    "flan-t5-base-encoder": (109_628_544, "T5EncoderModel"),
    # the full encoder-decoder: pins of what transformers 5.23 counted on the meta device
    # (Flan-T5's lm_head untied, as from_pretrained loads it: benchmarks/hf_params/count.py)
    "t5-small": (60_506_624, "T5ForConditionalGeneration (LM head tied)"),
    "flan-t5-base": (247_577_856, "T5ForConditionalGeneration (LM head untied)"),
    "vit-base-patch16-224-in21k": (86_389_248, "ViTModel (with pooler)"),
    "vit-base-patch16-224": (86_567_656, "ViTForImageClassification (1000 labels, no pooler)"),
    # Issue 31: families people serve. Pins of what transformers 5.23 counted on the meta device
    # (benchmarks/hf_params/count.py, results.md); sources of the configs in SOURCES.md beside them.
    "gpt-bigcode-santacoder": (1_124_886_528, "GPTBigCodeForCausalLM (LM head tied)"),
    "phi-3-mini-4k-instruct": (3_821_079_552, "Phi3ForCausalLM (LM head untied)"),
    "qwen3-0.6b": (596_049_920, "Qwen3ForCausalLM (LM head tied)"),
    "opt-125m": (125_239_296, "OPTForCausalLM (LM head tied)"),
    "opt-350m": (331_196_416, "OPTForCausalLM (LM head tied)"),
    "phi-2": (2_779_683_840, "PhiForCausalLM (LM head untied, with bias)"),
    "bloomz-560m": (559_214_592, "BloomForCausalLM (LM head tied)"),
    "granite-3.3-8b-instruct": (8_170_864_640, "GraniteForCausalLM (LM head tied)"),
    # sliding-window, MLA and MoE families (app/importers/hf_families.py), the same way pinned
    "gemma-2-9b-it": (9_241_705_984, "Gemma2ForCausalLM (LM head tied)"),
    "gemma-3-1b-it": (999_885_952, "Gemma3ForCausalLM (LM head tied)"),
    "gpt-oss-20b": (20_914_757_184, "GptOssForCausalLM (LM head untied)"),
    "deepseek-v2-lite-chat": (15_706_484_224, "DeepseekV2ForCausalLM (LM head untied)"),
    "deepseek-v3": (671_026_404_352, "DeepseekV3ForCausalLM (LM head untied)"),
    "kimi-k2-instruct": (1_026_408_209_408, "DeepseekV3ForCausalLM (LM head untied)"),
    "qwen1.5-moe-a2.7b": (14_315_784_192, "Qwen2MoeForCausalLM (LM head untied)"),
    "qwen3-30b-a3b": (30_532_122_624, "Qwen3MoeForCausalLM (LM head untied)"),
    "llama-4-scout-17b-16e-text": (107_769_861_120, "Llama4ForCausalLM (LM head untied)"),
    "llama-4-maverick-17b-128e-text": (400_711_848_960, "Llama4ForCausalLM (LM head untied)"),
}


def _load(name: str) -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads((CONFIGS / f"{name}.json").read_text())
    return loaded


@pytest.mark.parametrize("name", list(GOLDEN))
def test_parameter_counts_equal_transformers(name: str) -> None:
    params, reference = GOLDEN[name]
    imported = import_hf_config(_load(name))
    assert imported.parameter_count == params
    assert imported.reference == f"transformers {reference}"


def test_golden_numbers_are_the_measured_ones() -> None:
    """benchmarks/hf_params/count.py wrote counts.json from transformers itself."""
    measured = json.loads(COUNTS.read_text())
    assert sorted(measured) == sorted(GOLDEN) == sorted(p.stem for p in CONFIGS.glob("*.json"))
    assert {name: entry["params"] for name, entry in measured.items()} == {
        name: params for name, (params, _) in GOLDEN.items()
    }


def test_zoo_counts_agree_with_imports() -> None:
    for slug, config in [("llama-3-8b", "llama-3-8b"), ("gpt-2", "gpt2"), ("vit-b-16",
                         "vit-base-patch16-224"), ("bert-base", "bert-base-uncased")]:  # fmt: skip
        assert ZOO[slug].reference_params == import_hf_config(_load(config)).parameter_count


def test_gqa_head_dim_tied_and_gating_change_the_count() -> None:
    base = _load("llama-2-7b")
    gqa = import_hf_config({**base, "num_key_value_heads": 8}).parameter_count
    # k and v projections shrink from 4096 to 1024 outputs in each of 32 layers
    assert import_hf_config(base).parameter_count - gqa == 32 * 2 * 4096 * (4096 - 1024)
    tied = import_hf_config({**base, "tie_word_embeddings": True}).parameter_count
    assert import_hf_config(base).parameter_count - tied == 32000 * 4096
    wide = import_hf_config({**base, "head_dim": 256}).parameter_count
    assert wide - import_hf_config(base).parameter_count == 32 * 4 * 4096 * (32 * 256 - 4096)
    plain = import_hf_config({**_load("gpt2"), "activation_function": "relu"})
    assert plain.parameter_count == 124_439_808
    layers = plain.layers[3]["layers"]
    assert next(layer for layer in layers if layer["op"] == "mlp")["activation"] == "relu"


def test_defaults_and_sequence_lengths() -> None:
    assert import_hf_config(_load("gpt2")).default_bindings == {"seq": 1024}
    assert import_hf_config(_load("llama-3-8b")).default_bindings == {"seq": 4096}
    assert import_hf_config(_load("roberta-base")).default_bindings == {"seq": 512}
    assert import_hf_config(_load("vit-base-patch16-224")).default_bindings == {"image": 224}
    with pytest.raises(ImportRejected, match="1024 learned positions"):
        import_hf_config(_load("gpt2"), sequence_length=2048)


def test_unknown_model_type_lists_the_supported_ones() -> None:
    with pytest.raises(ImportRejected) as caught:
        import_hf_config({"model_type": "mamba"})
    assert caught.value.kind == "unsupported-model-type"
    assert all(model_type in caught.value.detail for model_type in SUPPORTED_MODEL_TYPES)
    with pytest.raises(ImportRejected, match="exceeds num_local_experts"):
        import_hf_config({**_load("mixtral-8x7b-v0.1"), "num_experts_per_tok": 9})


@pytest.mark.parametrize("name", list(GOLDEN))
def test_imports_say_where_attention_is_not_how(name: str) -> None:
    """Issue 12: no ``fused`` (or other implementation) attribute; decoders are causal."""
    imported = import_hf_config(_load(name))
    attention = attention_layers(imported.layers)
    assert attention
    for layer in attention:
        assert "fused" not in layer
    decoder = "ForCausalLM" in GOLDEN[name][1] or "LMHead" in GOLDEN[name][1]
    expected = {decoder}
    if "ForConditionalGeneration" in GOLDEN[name][1]:
        expected = {False, True}  # the encoder's self-attention, then the decoder's (causal)
    assert {bool(layer.get("causal")) for layer in attention} == expected


def _block(imported: Any) -> list[dict[str, Any]]:
    block: list[dict[str, Any]] = next(
        layer for layer in imported.layers if layer["op"] == "repeat"
    )["layers"]
    return block


def test_multi_query_attention_has_one_kv_head() -> None:
    """GPTBigCode's fused c_attn: q (hidden) + k and v of one head (head_dim) each, with biases."""
    santacoder = _load("gpt-bigcode-santacoder")
    mqa = import_hf_config(santacoder)
    assert {layer["num_kv_heads"] for layer in attention_layers(mqa.layers)} == {1}
    assert any("multi-query" in note for note in mqa.assumptions)
    mha = import_hf_config({**santacoder, "multi_query": False})
    hidden, head_dim, layers = 2048, 2048 // 16, 24
    # k and v grow from one head to all 16: weights and biases, in each of 24 layers
    grown = 2 * (hidden * (hidden - head_dim) + (hidden - head_dim))
    assert mha.parameter_count - mqa.parameter_count == layers * grown
    assert mqa.default_bindings == {"seq": 2048}
    with pytest.raises(ImportRejected, match="2048 learned positions"):
        import_hf_config(santacoder, sequence_length=2049)


def test_fused_and_multiplied_llama_variants_count_as_llama() -> None:
    """Phi-3's fused qkv_proj / gate_up_proj and Granite's multipliers add no parameters."""
    for name in ("phi-3-mini-4k-instruct", "granite-3.3-8b-instruct"):
        config = _load(name)
        as_llama = import_hf_config({**config, "model_type": "llama"}).parameter_count
        assert import_hf_config(config).parameter_count == as_llama == GOLDEN[name][0]
    # Phi3Attention builds its projections without bias whatever attention_bias says
    phi3 = _load("phi-3-mini-4k-instruct")
    biased = import_hf_config({**phi3, "attention_bias": True})
    assert biased.parameter_count == GOLDEN["phi-3-mini-4k-instruct"][0]


def test_qwen3_per_head_norms_are_stored_tensors() -> None:
    qwen3 = _load("qwen3-0.6b")
    imported = import_hf_config(qwen3)
    block = _block(imported)
    norms = [layer for layer in block if layer["name"] in ("q_norm", "k_norm")]
    assert [(layer["op"], layer["shape"]) for layer in norms] == [("tensor", [128])] * 2
    attention = next(layer for layer in block if layer["op"] == "attention")
    assert attention["inputs"] == ["input_layernorm"]
    assert attention["head_dim"] == 128
    # the same geometry as a Llama with an explicit head_dim, plus 2 x head_dim per layer
    as_llama = import_hf_config({**qwen3, "model_type": "llama"}).parameter_count
    assert imported.parameter_count - as_llama == 28 * 2 * 128
    # Qwen3Config's head_dim is 128 when the config leaves it out, not hidden / heads (64)
    no_head_dim = {k: v for k, v in qwen3.items() if k != "head_dim"}
    assert import_hf_config(no_head_dim).parameter_count == imported.parameter_count


def test_opt_positions_projections_and_post_norm() -> None:
    small, medium = import_hf_config(_load("opt-125m")), import_hf_config(_load("opt-350m"))
    names = [layer["name"] for layer in medium.layers]
    assert names[:3] == ["embed_tokens", "project_in", "embed_positions"]
    assert names[-3:] == ["layers", "project_out", "lm_head"]  # post-LN: no final LayerNorm
    assert "final_layer_norm" in [layer["name"] for layer in small.layers]
    assert "project_in" not in [layer["name"] for layer in small.layers]
    positions = next(layer for layer in small.layers if layer["name"] == "embed_positions")
    assert positions["num_embeddings"] == 2048 + 2  # OPT's offset of 2
    assert small.default_bindings == {"seq": 2048}
    with pytest.raises(ImportRejected, match="2048 learned positions"):
        import_hf_config(_load("opt-125m"), sequence_length=2049)
    mlp = next(layer for layer in _block(small) if layer["op"] == "mlp")
    assert mlp["activation"] == "relu"
    assert mlp["bias"] is True
    unbiased = import_hf_config({**_load("opt-125m"), "enable_bias": False}).parameter_count
    # q, k, v, out (768 each) and fc1 (3072), fc2 (768) biases in 12 layers
    assert small.parameter_count - unbiased == 12 * (4 * 768 + 3072 + 768)


def test_phi2_parallel_block_biased_head_and_qk_layernorm() -> None:
    phi2 = _load("phi-2")
    imported = import_hf_config(phi2)
    block = _block(imported)
    assert next(layer for layer in block if layer["op"] == "mlp")["inputs"] == ["input_layernorm"]
    assert block[-1]["inputs"] == ["@input", "attn_drop", "mlp_drop"]
    head = imported.layers[-1]
    assert head["name"] == "lm_head"
    assert "bias" not in head  # linear's default: with bias
    normed = import_hf_config({**phi2, "qk_layernorm": True}).parameter_count
    # q_layernorm and k_layernorm: weight and bias of 2560 / 32 = 80 each, in 32 layers
    assert normed - imported.parameter_count == 32 * 2 * 2 * 80


def test_bloom_alibi_has_no_position_limit() -> None:
    bloom = _load("bloomz-560m")
    imported = import_hf_config(bloom)
    assert imported.default_bindings == {"seq": 4096}
    assert import_hf_config(bloom, sequence_length=100_000).default_bindings == {"seq": 100_000}
    assert [layer["name"] for layer in imported.layers][:2] == [
        "word_embeddings", "word_embeddings_layernorm"]  # fmt: skip
    post = import_hf_config({**bloom, "apply_residual_connection_post_layernorm": True})
    assert post.parameter_count == imported.parameter_count
    add = next(layer for layer in _block(post) if layer["name"] == "attn_add")
    assert add["inputs"][0] == "input_layernorm"


@pytest.mark.parametrize(
    ("name", "change", "pointer"),
    [
        ("gpt-bigcode-santacoder", {"n_head": 15}, "/config/n_head"),
        ("gpt-bigcode-santacoder", {"num_key_value_heads": 4}, "/config/num_key_value_heads"),
        ("gpt-bigcode-santacoder", {"multi_query": False, "num_key_value_heads": 1},
         "/config/num_key_value_heads"),
        ("opt-125m", {"num_attention_heads": 7}, "/config/num_attention_heads"),
        ("phi-3-mini-4k-instruct", {"num_key_value_heads": 5}, "/config/num_key_value_heads"),
        ("phi-3-mini-4k-instruct", {"num_attention_heads": 7}, "/config/num_attention_heads"),
        ("phi-2", {"num_attention_heads": 7}, "/config/num_attention_heads"),
        ("bloomz-560m", {"num_attention_heads": 7}, "/config/num_attention_heads"),
        ("qwen3-0.6b", {"num_key_value_heads": 3}, "/config/num_key_value_heads"),
        ("opt-125m", {"ffn_dim": 0}, "/config/ffn_dim"),
    ],
)  # fmt: skip
def test_contradicting_fields_are_named(name: str, change: dict[str, Any], pointer: str) -> None:
    with pytest.raises(ImportRejected) as caught:
        import_hf_config({**_load(name), **change})
    assert caught.value.pointer == pointer
    assert pointer.rsplit("/", 1)[1] in caught.value.detail


def test_t5_builds_the_encoder_decoder_unless_the_architecture_is_the_encoder() -> None:
    """T5ForConditionalGeneration: shared embedding, encoder, decoder with cross-attention,
    a relative position bias in the first block of each stack; T5EncoderModel: the encoder."""
    full = import_hf_config(_load("t5-small"))
    encoder = import_hf_config({**_load("t5-small"), "architectures": ["T5EncoderModel"]})
    assert encoder.parameter_count == GOLDEN["t5-small-encoder"][0]
    assert full.family == "transformer-encoder-decoder"
    assert encoder.family == "transformer-encoder"
    # t5-small: 6 decoder blocks of self-attention (4 x 512 x 512), cross-attention (the same),
    # 3 RMSNorm weights, a ReLU MLP (2 x 512 x 2048); a decoder bias table (32 x 8) and its
    # final norm; the LM head is the shared embedding (tied)
    block = 4 * 512 * 512 * 2 + 3 * 512 + 2 * 512 * 2048
    assert full.parameter_count - encoder.parameter_count == 6 * block + 32 * 8 + 512
    names = [layer["name"] for layer in full.layers]
    assert names.count("relative_attention_bias") == 1
    assert "decoder_relative_attention_bias" in names
    decoder = next(layer for layer in full.layers if layer["name"] == "decoder_block")
    assert decoder["times"] == 6
    inner = {layer["name"]: layer for layer in decoder["layers"]}
    assert inner["attn"]["causal"] is True
    # k and v of the cross-attention read the encoder's output, q the decoder's stream
    assert inner["EncDecAttention.k"]["inputs"] == inner["EncDecAttention.v"]["inputs"]
    assert inner["EncDecAttention.k"]["inputs"] == ["final_drop"]
    assert "inputs" not in inner["EncDecAttention.q"]
    assert full.layers[-1]["tied_to"] == "shared"
    untied = import_hf_config({**_load("t5-small"), "tie_word_embeddings": False})
    assert untied.parameter_count - full.parameter_count == 32128 * 512
    fewer = import_hf_config({**_load("t5-small"), "num_decoder_layers": 2})
    assert full.parameter_count - fewer.parameter_count == 4 * block


def test_t5_reads_encoder_and_decoder_tokens_of_the_input_length() -> None:
    """Two inputs: input_ids [batch, seq] and decoder_input_ids [batch, decoder_seq], both
    embedded by the one shared table; decoder_seq follows seq unless bound."""
    from app.domain.graph.analysis import analyze

    full = import_hf_config(_load("flan-t5-base"), sequence_length=64)
    tokens, decoder_tokens = full.inputs
    assert (tokens.name, tokens.shape) == ("input_ids", ("batch", "seq"))
    assert (decoder_tokens.name, decoder_tokens.shape) == (
        "decoder_input_ids",
        ("batch", "decoder_seq"),
    )
    assert full.default_bindings == {"seq": 64}
    analysis = analyze(full.inputs, full.layers, {"batch": 2, "seq": 64}, training=True)
    by_name = {layer.name: layer for layer in analysis.layers}
    assert by_name["shared"].output_shape == (2, 64, 768)
    assert by_name["shared"].result.params == 32128 * 768
    # the decoder's lookup is the shared table called again: no parameter of its own
    assert by_name["decoder_embeds"].output_shape == (2, 64, 768)
    assert by_name["decoder_embeds"].result.params == 0
    assert by_name["lm_head"].output_shape == (2, 64, 32128)
    scores = [layer for layer in analysis.layers if layer.name.endswith("EncDecAttention.scores")]
    assert len(scores) == 12
    assert scores[0].output_shape == (2, 12, 64, 64)
    longer = analyze(full.inputs, full.layers, {"batch": 2, "seq": 128}, training=True)
    assert {layer.name: layer for layer in longer.layers}["decoder_embeds"].output_shape == (
        2,
        128,
        768,
    )


def test_t5_decoder_length_binds_the_decoder_and_cross_attention_queries() -> None:
    """decoder_seq 4 with seq 64 (a seq2seq fine-tune's labels): the decoder's stream, its
    self-attention and the LM head run over 4 positions, cross-attention's keys and values over
    the encoder's 64; the encoder and the parameter count do not change."""
    from app.domain.graph.analysis import analyze

    full = import_hf_config(_load("flan-t5-base"), sequence_length=64)
    bindings = {"batch": 2, "seq": 64, "decoder_seq": 4}
    analysis = analyze(full.inputs, full.layers, bindings, training=True)
    same = analyze(full.inputs, full.layers, {"batch": 2, "seq": 64}, training=True)
    by_name = {layer.name: layer for layer in analysis.layers}
    assert by_name["decoder_embeds"].output_shape == (2, 4, 768)
    assert by_name["lm_head"].output_shape == (2, 4, 32128)
    scores = [layer for layer in analysis.layers if layer.name.endswith("EncDecAttention.scores")]
    assert scores[0].output_shape == (2, 12, 4, 64)  # [batch, heads, decoder, encoder]
    keys = [layer for layer in analysis.layers if layer.name.endswith("EncDecAttention.k")]
    assert keys[0].output_shape == (2, 64, 768)
    encoder = [layer for layer in analysis.layers if layer.name == "final_layer_norm"]
    assert encoder[0].output_shape == (2, 64, 768)
    assert sum(layer.result.params for layer in analysis.layers) == sum(
        layer.result.params for layer in same.layers
    )
    # the decoder's activations: every decoder-side tensor shrinks 16-fold, the encoder's stay
    lm_head = by_name["lm_head"].output_numel
    assert lm_head * 16 == {layer.name: layer for layer in same.layers}["lm_head"].output_numel


def test_an_embedding_tied_to_a_missing_or_mismatched_table_is_rejected() -> None:
    from app.domain.errors import GraphError
    from app.domain.graph.analysis import InputDecl, analyze
    from app.domain.graph.ops import TensorKind

    ids = InputDecl(name="ids", shape=("batch", 8), kind=TensorKind.INDEX)
    table = {"name": "table", "op": "embedding", "num_embeddings": 100, "embedding_dim": 16}
    again = {"name": "again", "op": "embedding", "num_embeddings": 100, "embedding_dim": 16,
             "tied_to": "table", "inputs": ["ids"]}  # fmt: skip
    ok = analyze([ids], [table, again], {"batch": 2}, training=False)
    assert [layer.result.params for layer in ok.layers] == [1600, 0]
    with pytest.raises(GraphError) as caught:
        analyze([ids], [table, {**again, "num_embeddings": 99}], {"batch": 2}, training=False)
    assert caught.value.field == "tied_to"
    assert caught.value.layer == "again"
