"""RFC 9457 problem details: the body of every error response."""

from __future__ import annotations

from typing import ClassVar

from pydantic import Field

from app.schemas.base import Schema


class InvalidField(Schema):
    """One invalid input field."""

    check_storable_text: ClassVar[bool] = False  # a pointer may name a key the client sent

    pointer: str = Field(
        description="JSON pointer (body) or parameter name of the field.",
        examples=["/memory_bytes"],
    )
    location: str = Field(
        description="Where the field was: body, query, path or header.", examples=["body"]
    )
    message: str = Field(
        description="What is wrong with it.", examples=["Input should be greater than 0"]
    )
    type: str = Field(description="Machine-readable error code.", examples=["greater_than"])


class Problem(Schema):
    """An error, as `application/problem+json`."""

    check_storable_text: ClassVar[bool] = False  # the detail may quote what the client sent

    type: str = Field(
        description="URI reference identifying the problem type.", examples=["/problems/not-found"]
    )
    title: str = Field(description="Short summary of the problem type.", examples=["Not found"])
    status: int = Field(description="HTTP status code.", examples=[404])
    detail: str = Field(
        description="What went wrong in this occurrence, and what to do about it.",
        examples=["hardware profile 'nvidia-x1' does not exist; GET /v1/hardware lists the slugs"],
    )
    instance: str | None = Field(
        default=None, description="The request path.", examples=["/v1/hardware/nvidia-x1"]
    )
    request_id: str | None = Field(
        default=None,
        description="Request id (also in the X-Request-ID header) to quote in bug reports.",
        examples=["5f0c6c0a9d8e4b0f9a3c2d1e0f9a8b7c"],
    )
    errors: list[InvalidField] | None = Field(
        default=None, description="For 400/422: every invalid field.", examples=[None]
    )
