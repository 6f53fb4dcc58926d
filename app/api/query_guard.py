"""Unknown query parameters are a 422, not silently ignored.

A misspelt option (``seq_len=512`` for ``sequence_length``) would otherwise give an answer for
the default instead of the value the caller meant. Every GET route is checked against the query
parameters it declares (its dependencies included); other methods are left alone, since the
Kubernetes API server adds ``?timeout=`` to webhook calls.
"""

from __future__ import annotations

from fastapi import Request
from fastapi.dependencies.models import Dependant
from fastapi.exceptions import RequestValidationError
from fastapi.routing import APIRoute

_ALLOWED: dict[int, frozenset[str]] = {}


def declared_query_names(route: APIRoute) -> frozenset[str]:
    """The query parameter names (aliases) a route declares, its dependencies included."""
    names = _ALLOWED.get(id(route))
    if names is None:
        found: set[str] = set()
        pending: list[Dependant] = [route.dependant]
        while pending:
            dependant = pending.pop()
            found.update(param.alias for param in dependant.query_params)
            pending.extend(dependant.dependencies)
        names = _ALLOWED[id(route)] = frozenset(found)
    return names


async def reject_unknown_query(request: Request) -> None:
    """422 naming each query parameter the GET route does not declare, and the valid ones."""
    if request.method != "GET" or not request.query_params:
        return
    route = request.scope.get("route")
    if not isinstance(route, APIRoute):
        return
    allowed = declared_query_names(route)
    unknown = [name for name in dict.fromkeys(request.query_params.keys()) if name not in allowed]
    if not unknown:
        return
    valid = ", ".join(sorted(allowed)) or "none"
    raise RequestValidationError(
        [
            {
                "type": "unknown_query_parameter",
                "loc": ("query", name),
                "msg": f"unknown query parameter '{name}'; valid: {valid}",
                "input": request.query_params.get(name),
            }
            for name in unknown
        ]
    )
