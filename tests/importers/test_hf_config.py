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
    "vit-base-patch16-224-in21k": (86_389_248, "ViTModel (with pooler)"),
    "vit-base-patch16-224": (86_567_656, "ViTForImageClassification (1000 labels, no pooler)"),
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
    assert {bool(layer.get("causal")) for layer in attention} == {decoder}
