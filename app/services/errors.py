"""Errors raised by use cases; the API maps each class to an HTTP status."""

from __future__ import annotations


class ServiceError(Exception):
    """Base class: ``detail`` is a message a person can act on."""

    def __init__(self, detail: str) -> None:
        self.detail = detail
        super().__init__(detail)


class NotFound(ServiceError):
    """The named resource does not exist."""


class AlreadyExists(ServiceError):
    """A resource with that slug exists already."""


class ReadOnly(ServiceError):
    """Built-in (catalog or zoo) entries cannot be changed through the API."""


class InUse(ServiceError):
    """The resource is referenced by another and cannot be deleted."""


class PreconditionFailed(ServiceError):
    """The client's If-Match does not match the current version."""


class PreconditionRequired(ServiceError):
    """A write to an existing resource came without If-Match."""


class InvalidInput(ServiceError):
    """Input that passed schema validation but is semantically wrong."""

    def __init__(self, detail: str, *, pointer: str | None = None) -> None:
        super().__init__(detail)
        self.pointer = pointer


class ImportFailed(InvalidInput):
    """An ONNX file or HF config that cannot be imported; ``problems`` name each cause."""

    def __init__(
        self,
        detail: str,
        *,
        kind: str,
        pointer: str | None = None,
        problems: tuple[tuple[str, str], ...] = (),
    ) -> None:
        super().__init__(detail, pointer=pointer)
        self.kind = kind
        self.problems = problems
