"""Shared base class and field types for the API contract."""

from __future__ import annotations

from typing import Annotated, Generic, TypeVar

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, StringConstraints


def storable(value: str) -> str:
    """Reject text a database cannot store the same way everywhere.

    PostgreSQL refuses NUL in text (SQLite keeps it), and a lone UTF-16 surrogate (which JSON's
    ``\\ud800`` escapes can produce) cannot be encoded as UTF-8 at all.
    """
    if "\x00" in value:
        raise ValueError("must not contain the NUL character (U+0000)")
    if any("\ud800" <= char <= "\udfff" for char in value):
        raise ValueError("must not contain unpaired UTF-16 surrogates (U+D800-U+DFFF)")
    return value


# For path and query parameters (and any free text): 422 naming the parameter, identical on
# SQLite and PostgreSQL, instead of a database error.
StorableStr = Annotated[str, AfterValidator(storable)]

SLUG_PATTERN = r"^[a-z0-9](?:[a-z0-9-]{0,62}[a-z0-9])?$"

Slug = Annotated[
    str,
    StringConstraints(pattern=SLUG_PATTERN, min_length=1, max_length=64),
    Field(
        description="URL-safe identifier: lowercase letters, digits and inner hyphens, 1-64 chars.",
        examples=["nvidia-a100-80gb-sxm"],
    ),
]

# Sizes are integers in bytes; 2**62 leaves room for sums without overflowing a BIGINT.
MAX_BYTES = 2**62


class Schema(BaseModel):
    """Base for every API model: unknown fields are rejected, ORM objects are readable."""

    model_config = ConfigDict(from_attributes=True, extra="forbid", populate_by_name=False)


ItemT = TypeVar("ItemT")


class Page(Schema, Generic[ItemT]):
    """One page of a listing."""

    items: list[ItemT] = Field(
        description="The items on this page, ordered by slug.", examples=[[]]
    )
    total: int = Field(description="Number of items matching the filters.", examples=[27])
    limit: int = Field(description="Page size that was applied.", examples=[50])
    offset: int = Field(description="Number of matching items skipped.", examples=[0])
