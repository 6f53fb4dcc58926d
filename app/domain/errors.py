"""Domain errors: they know nothing about HTTP."""

from __future__ import annotations


class DomainError(Exception):
    """Base class of every error the domain raises."""


class GraphError(DomainError):
    """An architecture graph is invalid; names the layer and the field at fault."""

    def __init__(self, message: str, *, layer: str | None = None, field: str | None = None):
        self.layer = layer
        self.field = field
        where = []
        if layer is not None:
            where.append(f"layer '{layer}'")
        if field is not None:
            where.append(f"field '{field}'")
        self.detail = message
        super().__init__(": ".join([*where, message]))
