"""Shared base class and field types for the API contract."""

from __future__ import annotations

import re
from collections.abc import Iterator
from datetime import date, datetime, time, timedelta
from decimal import Decimal
from enum import Enum
from typing import Annotated, ClassVar, Generic, Literal, Self, TypeVar, get_args, get_origin

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    StringConstraints,
    ValidationError,
    model_validator,
)
from pydantic_core import InitErrorDetails, PydanticCustomError, PydanticSerializationError, to_json


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

# Every string of every request body (dict keys and free-form JSON such as model layers and HF
# configs included) goes through `storable`: see `Schema._storable_text` below.
_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")
# A body with thousands of bad strings is reported by its first few.
MAX_UNSTORABLE_ERRORS = 20
Location = tuple[int | str, ...]


def _unstorable_message(value: str) -> str | None:
    if _UNSTORABLE.search(value) is None:
        return None
    try:
        storable(value)
    except ValueError as exc:
        return str(exc)
    return "must not contain NUL or unpaired UTF-16 surrogates"  # pragma: no cover - regex agrees


def _maybe_unstorable(container: object) -> bool:
    """Cheap pre-check of a container (one pass in Rust): False only when every string in it is
    storable. NUL comes out of JSON encoding as the escape ``\\u0000`` and a lone surrogate
    cannot be encoded at all; a false alarm (a literal backslash-u0000 text) only costs the walk.
    """
    try:
        return b"\\u0000" in to_json(container)
    except (PydanticSerializationError, ValueError, TypeError, RecursionError):
        return True


_SURROGATES = re.compile("[\ud800-\udfff]")


def _escape(match: re.Match[str]) -> str:
    return f"\\u{ord(match.group()):04x}"


def unstorable_strings(value: object, loc: Location = ()) -> Iterator[tuple[Location, str]]:
    """Where ``value`` holds text that :func:`storable` rejects, and why, container by container.

    Lists, tuples, sets and dicts (keys and values) are walked without recursion (a deeply nested
    body cannot overflow the stack); nested pydantic models are skipped, as they check themselves.
    A dict key is located as ``(..., key, "[key]")``, as pydantic locates key errors; a lone
    surrogate in a key is shown as ``\\udXXX`` text (a location must be encodable).
    """
    stack: list[tuple[object, Location]] = [(value, loc)]
    while stack:
        item, where = stack.pop()
        if isinstance(item, str):
            message = _unstorable_message(item)
            if message is not None:
                yield where, message
        elif isinstance(item, dict):
            pending = []
            for key, child in item.items():
                name = _SURROGATES.sub(_escape, key) if isinstance(key, str) else key
                if isinstance(key, str) and (message := _unstorable_message(key)) is not None:
                    yield (*where, name, "[key]"), message
                pending.append((child, (*where, name)))
            stack.extend(reversed(pending))
        elif isinstance(item, (list, tuple)):
            stack.extend((child, (*where, i)) for i, child in reversed(list(enumerate(item))))
        elif isinstance(item, (set, frozenset)):
            stack.extend((child, where) for child in item)


def _may_hold_text(annotation: object) -> bool:
    """Whether a field of this type can hold client text: str, Any, or a container of them.

    Numbers, booleans, dates, enums, literals and nested models (which check themselves) cannot,
    so most fields of big responses cost nothing.
    """
    origin = get_origin(annotation)
    if origin is Annotated:
        return _may_hold_text(get_args(annotation)[0])
    if origin is Literal:
        return False
    if origin is not None:  # unions and containers: any member or item type
        return any(_may_hold_text(arg) for arg in get_args(annotation) if arg is not Ellipsis)
    if isinstance(annotation, type):
        return not issubclass(annotation, _TEXTLESS)
    return True  # Any, TypeVars, forward references: check


_TEXTLESS = (int, float, bool, bytes, Decimal, datetime, date, time, timedelta, Enum, BaseModel,
             type(None))  # fmt: skip
_TEXT_FIELDS: dict[type[BaseModel], tuple[str, ...]] = {}


def _text_fields(cls: type[BaseModel]) -> tuple[str, ...]:
    found = _TEXT_FIELDS.get(cls)
    if found is None:
        found = _TEXT_FIELDS[cls] = tuple(
            name
            for name, info in cls.model_fields.items()
            if getattr(cls, "check_storable_text", True) and _may_hold_text(info.annotation)
        )
    return found


def _unstorable_errors(model: BaseModel) -> list[InitErrorDetails]:
    errors: list[InitErrorDetails] = []
    for name in _text_fields(type(model)):
        value = model.__dict__.get(name)
        if isinstance(value, str):
            if _UNSTORABLE.search(value) is None:
                continue
        elif not isinstance(value, (dict, list, tuple, set, frozenset)) or not value:
            continue
        elif not _maybe_unstorable(value):
            continue
        for where, message in unstorable_strings(value, (name,)):
            errors.append(
                InitErrorDetails(
                    type=PydanticCustomError("unstorable_text", message), loc=where, input=None
                )
            )
            if len(errors) >= MAX_UNSTORABLE_ERRORS:
                return errors
    return errors


def located_error(model: str, loc: Location, message: str) -> ValidationError:
    """A validation error at ``loc`` inside the model being validated: raised from a model
    validator, it reaches the client as a 422 whose pointer names that field (a plain ValueError
    would point at the model as a whole)."""
    return ValidationError.from_exception_data(
        model,
        [InitErrorDetails(type=PydanticCustomError("value_error", message), loc=loc, input=None)],
    )


SLUG_PATTERN = r"^[a-z0-9](?:[a-z0-9-]{0,62}[a-z0-9])?$"

# No example here: each field says what it names (a model, a GPU, a workload), with its own.
Slug = Annotated[
    str,
    StringConstraints(pattern=SLUG_PATTERN, min_length=1, max_length=64),
    Field(
        description="URL-safe identifier: lowercase letters, digits and inner hyphens, 1-64 chars."
    ),
]

# Sizes are integers in bytes; 2**62 leaves room for sums without overflowing a BIGINT.
MAX_BYTES = 2**62


class Schema(BaseModel):
    """Base for every API model: unknown fields are rejected, ORM objects are readable."""

    model_config = ConfigDict(from_attributes=True, extra="forbid", populate_by_name=False)
    # Opting out is for responses only: problem details (they may quote what a client sent) and
    # the *Read views of rows checked when written. A contract test keeps every request body in.
    check_storable_text: ClassVar[bool] = True

    @model_validator(mode="after")
    def _storable_text(self) -> Self:
        """Reject NUL and lone surrogates in every string field, container and dict key (422
        naming the field, e.g. ``/layers/3/name``, identical on SQLite and PostgreSQL)."""
        errors = _unstorable_errors(self)
        if errors:
            raise ValidationError.from_exception_data(type(self).__name__, errors)
        return self


ItemT = TypeVar("ItemT")


class Page(Schema, Generic[ItemT]):
    """One page of a listing."""

    items: list[ItemT] = Field(
        description="The items on this page, ordered by slug.", examples=[[]]
    )
    total: int = Field(description="Number of items matching the filters.", examples=[27])
    limit: int = Field(description="Page size that was applied.", examples=[50])
    offset: int = Field(description="Number of matching items skipped.", examples=[0])
