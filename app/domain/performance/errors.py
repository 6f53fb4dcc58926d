"""The error the roofline model raises for a request or device it cannot evaluate (pure)."""

from __future__ import annotations

from app.domain.errors import DomainError


class RooflineInputError(DomainError):
    """A request or device that the roofline model cannot evaluate."""
