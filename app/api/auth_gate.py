"""Authenticate before the request body is read.

FastAPI reads (and parses) a request's body before it runs the route's dependencies, so an
unauthenticated client could make the server receive and parse a 100 MiB ONNX upload or a
large JSON body before it was told 401. This middleware finds each route's auth guards
(``require_writer`` / ``require_reader`` from app.api.deps, wherever they sit in the route's
dependency tree) once, when the middleware stack is built, and runs them on the request's
headers the moment the route first asks for its body: a rejected request gets the same 401/403
problem+json the dependency would give, and not one body byte is received. Routes keep their
dependencies (the OpenAPI security schemes come from them) and check again, cheaply; requests
whose route reads no body are answered by the dependency itself, as before.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable
from typing import Any

from fastapi import HTTPException
from fastapi.dependencies.models import Dependant
from fastapi.security.base import SecurityBase
from starlette.requests import Request
from starlette.routing import BaseRoute, Router
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app.api.deps import require_reader, require_writer
from app.config import Settings

AUTH_GUARDS: tuple[Callable[..., Any], ...] = (require_writer, require_reader)


def auth_guards(dependant: Dependant) -> tuple[Dependant, ...]:
    """The auth guards (``require_writer``/``require_reader``) in a dependency tree."""
    found: list[Dependant] = []
    for sub in dependant.dependencies:
        if sub.call in AUTH_GUARDS:
            _check_headers_only(sub)
            found.append(sub)
        else:
            found.extend(auth_guards(sub))
    return tuple(found)


def _check_headers_only(guard: Dependant) -> None:
    """Fail at start-up when a guard would need more than the request itself."""
    for node in (guard, *guard.dependencies):
        params = (node.path_params, node.query_params, node.header_params, node.body_params)
        if any(params) or (node is not guard and node.dependencies):
            raise TypeError(f"auth guard part {node.call!r} is not a function of the request")
    for sub in guard.dependencies:
        if not isinstance(sub.call, SecurityBase) and sub.request_param_name is None:
            raise TypeError(f"auth guard dependency {sub.call!r} does not take the request")


async def run_guard(guard: Dependant, request: Request) -> None:
    """Evaluate ``guard`` as FastAPI would, from the request's headers; raises HTTPException."""
    values: dict[str, Any] = {}
    for sub in guard.dependencies:
        assert sub.call is not None
        assert sub.name is not None
        if isinstance(sub.call, SecurityBase):
            value = sub.call(request)
        else:
            value = sub.call(**{str(sub.request_param_name): request})
        values[sub.name] = await value if inspect.isawaitable(value) else value
    assert guard.call is not None
    result = guard.call(**values)
    if inspect.isawaitable(result):
        await result


def route_dependants(router: Router) -> Iterable[tuple[BaseRoute, Dependant]]:
    """Every API route with its effective dependency tree (including include-time ones)."""
    try:
        from fastapi.routing import iter_route_contexts  # FastAPI with lazily included routers
    except ImportError:  # older FastAPI: included routes are plain APIRoutes
        for route in router.routes:
            dependant = getattr(route, "dependant", None)
            if isinstance(dependant, Dependant):
                yield route, dependant
        return
    for context in iter_route_contexts(router.routes):
        dependant = getattr(context, "dependant", None)
        if isinstance(dependant, Dependant):
            yield context.original_route, dependant


async def _no_body() -> Message:
    raise RuntimeError("an auth guard must not read the request body")


def _announces_body(scope: Scope) -> bool:
    for name, value in scope.get("headers", ()):
        if name == b"transfer-encoding" or (name == b"content-length" and value.strip() != b"0"):
            return True
    return False


class AuthGateMiddleware:
    """Run a route's auth guards before its first body read (see the module docstring)."""

    def __init__(self, app: ASGIApp, *, router: Router, settings: Settings) -> None:
        self.app = app
        self.enabled = bool(settings.api_key_list)  # open dev mode: nothing to check
        self.guards: dict[int, tuple[Dependant, ...]] = {}
        self._routes: list[BaseRoute] = []  # keeps the ids above valid
        if not self.enabled:
            # Open dev mode checks nothing, so the routes' dependency trees are not walked:
            # walking them makes FastAPI build every route's request models now (~0.3-0.6 s
            # per app on the 2-core machine), which it otherwise builds per route when first
            # matched; a test suite builds thousands of apps.
            return
        for route, dependant in route_dependants(router):
            self.guards[id(route)] = self.guards.get(id(route), ()) + auth_guards(dependant)
            self._routes.append(route)

    def guards_for(self, route: Any) -> tuple[Dependant, ...]:
        """The guards of a matched route (from its own dependant if it was not seen at start)."""
        guards = self.guards.get(id(route))
        if guards is None:
            dependant = getattr(route, "dependant", None)
            guards = auth_guards(dependant) if isinstance(dependant, Dependant) else ()
        return guards

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not self.enabled:
            await self.app(scope, receive, send)
            return
        checked = False
        refused = False

        async def gated_receive() -> Message:
            nonlocal checked, refused
            if not checked:
                checked = True
                # The router has picked the route by now (scope["route"]); the body is untouched.
                for guard in self.guards_for(scope.get("route")):
                    try:
                        await run_guard(guard, Request(scope, receive=_no_body))
                    except HTTPException:
                        refused = True
                        raise  # FastAPI answers it like the dependency's own 401/403
            return await receive()

        async def closing_send(message: Message) -> None:
            if refused and message["type"] == "http.response.start" and _announces_body(scope):
                # The body is never read: close, so the client stops sending it and no unread
                # bytes sit ahead of a next request on this connection.
                headers = [*message.get("headers", ()), (b"connection", b"close")]
                message = {**message, "headers": headers}
            await send(message)

        await self.app(scope, gated_receive, closing_send)
