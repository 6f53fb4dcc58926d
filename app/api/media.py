"""Non-JSON responses: SVG charts."""

from __future__ import annotations

from typing import Any

from app.api.errors import problem_responses

SVG = "image/svg+xml"


def svg_responses(description: str, *problem_statuses: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI `responses=` for a route that answers an SVG document (and problem+json)."""
    return {
        200: {"description": description, "content": {SVG: {"schema": {"type": "string"}}}},
        **problem_responses(*problem_statuses),
    }
