"""Model import contract: Hugging Face config.json and ONNX uploads."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from app.schemas.base import Schema, Slug
from app.schemas.models import ModelRead

LLAMA_CONFIG_EXAMPLE: dict[str, Any] = {
    "model_type": "llama",
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_attention_heads": 32,
    "num_hidden_layers": 32,
    "num_key_value_heads": 8,
    "max_position_embeddings": 8192,
    "rms_norm_eps": 1e-05,
    "tie_word_embeddings": False,
    "vocab_size": 128256,
}


class ImportFields(Schema):
    """What a client may say about the model being imported (besides its source)."""

    slug: Slug = Field(examples=["my-llama-3-8b"])
    name: str | None = Field(
        default=None,
        min_length=1,
        max_length=200,
        description="Display name; default: taken from the source.",
        examples=["My Llama 3 8B"],
    )
    family: str | None = Field(
        default=None,
        min_length=1,
        max_length=64,
        pattern=r"^[a-z0-9][a-z0-9_-]*$",
        description="Family for filtering; default: `transformer-decoder`, "
        "`transformer-encoder`, `vision-transformer` (HF) or `onnx`.",
        examples=["transformer-decoder"],
    )
    description: str | None = Field(
        default=None,
        max_length=4000,
        description="Free-form description; default: what was imported from where.",
        examples=[None],
    )
    sequence_length: int | None = Field(
        default=None,
        ge=1,
        le=1_048_576,
        description="Default sequence length stored with the model (its `seq` binding); "
        "default: the smaller of the model's positions and 4096 (HF), or 128 (ONNX).",
        examples=[4096],
    )


class HfConfigImport(ImportFields):
    """A Hugging Face `config.json`, imported without downloading anything."""

    config: dict[str, Any] = Field(
        description="The contents of the model's `config.json`. `model_type` picks the family: "
        "llama, mistral, mixtral, qwen2, qwen3, gemma, granite, phi3, phi, gpt2, gpt_bigcode, "
        "gpt_neox, opt, bloom, bert, roberta, t5 (encoder-decoder; `architectures: "
        '["T5EncoderModel"]`: the encoder alone), vit, and the served families gemma2, '
        "gemma3_text, gpt_oss, deepseek_v2, deepseek_v3, kimi_k2, qwen2_moe, qwen3_moe, "
        "llama4_text.",
        examples=[LLAMA_CONFIG_EXAMPLE],
    )


class OpMappingRead(Schema):
    """How one kind of source op (or module) became graph ops."""

    source_op: str = Field(
        description="ONNX op type, or the top-level module of a Hugging Face model.",
        examples=["Conv"],
    )
    count: int = Field(description="How many there were.", examples=[53])
    mapped_to: list[str] = Field(
        description="Graph ops each became; empty when folded away (shape arithmetic, "
        "identity, a transposed weight).",
        examples=[["conv2d"]],
    )


class UnsupportedOpRead(Schema):
    """An op the importer cannot map."""

    source_op: str = Field(description="ONNX op type (domain-qualified if custom).",
                           examples=["NonMaxSuppression"])  # fmt: skip
    count: int = Field(description="How many nodes use it.", examples=[1])
    nodes: list[str] = Field(description="The first few node names.", examples=[["/nms/NMS"]])


class ImportReport(Schema):
    """What was imported and how."""

    source: Literal["onnx", "hf_config"] = Field(description="Import source.",
                                                 examples=["onnx"])  # fmt: skip
    parameter_count: int = Field(
        description="Trainable parameters of the stored graph (shape inference).",
        examples=[25_557_032],
    )
    source_parameter_count: int | None = Field(
        default=None,
        description="ONNX: parameters counted from the initializers; always equal to "
        "`parameter_count` (an import where they differ is rejected). Null for HF configs.",
        examples=[25_557_032],
    )
    reference: str = Field(
        description="What the count reproduces: the transformers class, or the ONNX initializers.",
        examples=["transformers LlamaForCausalLM (LM head untied)"],
    )
    op_mapping: list[OpMappingRead] = Field(description="Source ops and the graph ops they became.")
    unsupported_ops: list[UnsupportedOpRead] = Field(
        description="Ops imported as shape-preserving zero-parameter layers (lenient ONNX "
        "imports only; otherwise they are a 422).",
        examples=[[]],
    )
    assumptions: list[str] = Field(
        description="Everything the importer had to assume.",
        examples=[["batch-norm running statistics are buffers, not parameters"]],
    )


class ModelImportResponse(Schema):
    """The stored model and the import report."""

    model: ModelRead = Field(description="The stored model (provenance `onnx` or `hf_config`).")
    report: ImportReport = Field(
        description="The import report: counts, op mapping, unsupported ops, assumptions."
    )
