"""Model architecture contract."""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Annotated, Any, ClassVar, Literal

from pydantic import Field, StringConstraints

from app.schemas.base import Page, Schema, Slug


class Provenance(StrEnum):
    """Where an architecture came from; `builtin` ones are read-only."""

    BUILTIN = "builtin"
    USER = "user"
    ONNX = "onnx"
    HF_CONFIG = "hf_config"


Dim = (
    Annotated[int, Field(ge=1, le=2**40)]
    | Annotated[str, StringConstraints(pattern=r"^[A-Za-z_][A-Za-z0-9_]{0,31}$")]
)


class InputSpec(Schema):
    """One model input tensor; symbolic dims (`batch`, `seq`) are bound at estimate time."""

    name: str = Field(
        pattern=r"^[A-Za-z_][A-Za-z0-9_.-]{0,63}$",
        description="Input name, referable from a layer's `inputs`.",
        examples=["image"],
    )
    shape: list[Dim] = Field(
        min_length=1,
        max_length=8,
        description="Dimensions: positive integers or symbols such as `batch` and `seq`.",
        examples=[["batch", 3, 224, 224]],
    )
    dtype: Literal["float", "int64"] = Field(
        default="float",
        description="`float`: the compute precision chosen per estimate; `int64`: token ids.",
        examples=["float"],
    )


LAYERS_EXAMPLE: list[dict[str, Any]] = [
    {"name": "conv1", "op": "conv2d", "out_channels": 64, "kernel_size": 3, "padding": 1},
    {"name": "relu1", "op": "relu", "inplace": True},
    {"name": "pool", "op": "adaptive_avgpool2d", "output_size": 1},
    {"name": "flatten", "op": "flatten", "start_dim": 1},
    {"name": "fc", "op": "linear", "out_features": 10},
]


class ModelBase(Schema):
    """Fields a client supplies for a model architecture."""

    name: str = Field(
        min_length=1, max_length=200, description="Display name.", examples=["Tiny CNN"]
    )
    family: str = Field(
        min_length=1,
        max_length=64,
        pattern=r"^[a-z0-9][a-z0-9_-]*$",
        description="Architecture family used for filtering (cnn, transformer, rnn, ...).",
        examples=["cnn"],
    )
    description: str | None = Field(
        default=None, max_length=4000, description="Free-form description.", examples=[None]
    )
    inputs: list[InputSpec] = Field(
        min_length=1, max_length=16, description="Model inputs, in order."
    )
    layers: list[dict[str, Any]] = Field(
        min_length=1,
        max_length=10_000,
        description=(
            "Layer graph: each layer is `{name, op, inputs?, ...attributes}`; layers read the "
            "previous layer unless `inputs` names earlier layers or model inputs. `block` and "
            "`repeat` (with `times`) nest `layers`. Unknown ops and attributes are rejected."
        ),
        examples=[LAYERS_EXAMPLE],
    )
    default_bindings: dict[str, Annotated[int, Field(ge=1, le=2**40)]] = Field(
        default_factory=dict,
        description="Values for symbolic dims other than `batch` (e.g. `seq`, `image`) used "
        "when an estimate does not give them.",
        examples=[{"image": 32}],
    )
    quantization_config: dict[str, Any] | None = Field(
        default=None,
        description="A pre-quantized checkpoint's `quantization_config` (its HF config.json "
        "object, kept as given; the hf-config import copies it): GPTQ / AWQ (W4A16), "
        "compressed-tensors (W8A8 int8 / FP8, WNA16), FP8, MXFP4, checked as vLLM 0.19 reads "
        "it, or a saved bitsandbytes 4-bit one (422 naming `quantization_config/<key>`). The "
        "memory estimate then prices the quantized linears as the checkpoint stores them "
        "(packed values, scales, zero points, g_idx) and the rest in the unquantized dtype; "
        "the vLLM endpoint reads it from here. Null: an unquantized model.",
        examples=[None],
    )
    torch_dtype: Literal["bfloat16", "float16", "float32"] | None = Field(
        default=None,
        description="The checkpoint's `torch_dtype` (the hf-config import copies it): with a "
        "`quantization_config`, the dtype of its unquantized weights and activations when an "
        "estimate gives no precision. Null: not stated.",
        examples=[None],
    )


class ModelCreate(ModelBase):
    """A new model architecture."""

    slug: Slug = Field(examples=["tiny-cnn"])


class ModelReplace(ModelBase):
    """A full replacement of a model architecture (PUT); the slug is taken from the path."""


class ModelRead(ModelCreate):
    """A stored model architecture."""

    # Read from rows that were checked when written (the Create/Replace bodies): not re-walked.
    check_storable_text: ClassVar[bool] = False

    provenance: Provenance = Field(
        description="`builtin` entries are read-only.", examples=["user"]
    )
    layer_count: int = Field(description="Layers after expanding blocks and repeats.", examples=[5])
    version: int = Field(description="Optimistic-concurrency version (the ETag).", examples=[1])
    created_at: datetime = Field(
        description="Creation time (UTC).", examples=["2026-11-22T06:00:00Z"]
    )
    updated_at: datetime = Field(
        description="Last change (UTC).", examples=["2026-11-22T06:00:00Z"]
    )


ModelList = Page[ModelRead]
