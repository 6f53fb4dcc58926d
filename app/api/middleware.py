"""ASGI middleware: body size limit, ONNX import gate, request ids, access logs and metrics."""

from __future__ import annotations

import asyncio
import json
import logging
import math
import re
import time
import uuid
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app.api.context import request_id_var
from app.api.errors import (
    IMPORT_PEAK_FACTOR,
    PROBLEM_JSON,
    import_busy_detail,
    import_memory_detail,
    internal_error_body,
    problem_body,
    too_large_detail,
)
from app.api.metrics import Metrics

access_logger = logging.getLogger("app.access")
error_logger = logging.getLogger("app.api")
_REQUEST_ID_RE = re.compile(r"^[A-Za-z0-9._-]{1,128}$")


class _BodyTooLarge(Exception):
    pass


async def send_problem(
    send: Send,
    status: int,
    body: dict[str, Any],
    headers: list[tuple[bytes, bytes]] | None = None,
) -> None:
    """Answer a problem+json document from ASGI middleware."""
    payload = json.dumps(body).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", PROBLEM_JSON.encode()),
                (b"content-length", str(len(payload)).encode()),
                *(headers or []),
            ],
        }
    )
    await send({"type": "http.response.body", "body": payload})


class BodySizeLimitMiddleware:
    """Reject bodies over ``max_bytes`` with 413, by Content-Length or while streaming.

    ``path_limits`` maps exact paths to their own limit and the setting that sets it (ONNX
    uploads are larger than any JSON body).
    """

    def __init__(
        self,
        app: ASGIApp,
        *,
        max_bytes: int,
        path_limits: dict[str, tuple[int, str]] | None = None,
    ) -> None:
        self.app = app
        self.default = (max_bytes, "CAPPLAN_MAX_REQUEST_BYTES")
        self.path_limits = path_limits or {}

    def _too_large(self, path: str, limit: int, setting: str) -> dict[str, Any]:
        return problem_body(
            413,
            "payload-too-large",
            "Payload too large",
            too_large_detail(limit, setting),
            instance=path,
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = scope.get("path", "")
        max_bytes, setting = self.path_limits.get(path, self.default)
        for name, value in scope.get("headers", []):
            if name == b"content-length":
                try:
                    declared = int(value)
                except ValueError:
                    declared = -1
                if declared < 0:
                    body = problem_body(
                        400, "bad-request", "Bad request", "invalid Content-Length", instance=path
                    )
                    await send_problem(send, 400, body)
                    return
                if declared > max_bytes:
                    await send_problem(send, 413, self._too_large(path, max_bytes, setting))
                    return
        received = 0
        exceeded = False
        replied = False

        async def limited_receive() -> Message:
            nonlocal received, exceeded
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > max_bytes:
                    exceeded = True
                    raise _BodyTooLarge
            return message

        async def guarded_send(message: Message) -> None:
            # Frameworks may turn the receive error into their own 400; answer 413 instead.
            nonlocal replied
            if exceeded:
                if message["type"] == "http.response.start" and not replied:
                    replied = True
                    await send_problem(send, 413, self._too_large(path, max_bytes, setting))
                return
            replied = replied or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, limited_receive, guarded_send)
        except _BodyTooLarge:
            if not replied:
                await send_problem(send, 413, self._too_large(path, max_bytes, setting))


class ImportGateMiddleware:
    """Bound the memory and the number of ONNX imports in progress, before their upload is read.

    An import's peak memory is about ``IMPORT_PEAK_FACTOR`` times its upload (the bytes and the
    parsed model, measured through HTTP by ``benchmarks/import_memory.py``). Each request to
    ``path`` reserves that much of ``memory_bytes`` by its Content-Length (``max_body_bytes``
    without one) and one of ``max_concurrent`` places, and keeps them until its answer: so the
    imports of one process never hold more than ``memory_bytes`` together, and uploads waiting
    for their turn are not read (their spooled files take no disk either). One that needs more
    than ``memory_bytes`` alone is a 413; one that waits longer than ``queue_timeout_s`` a 503
    with Retry-After.
    """

    def __init__(
        self,
        app: ASGIApp,
        *,
        path: str,
        max_concurrent: int,
        memory_bytes: int,
        max_body_bytes: int,
        queue_timeout_s: float,
    ) -> None:
        self.app = app
        self.path = path
        self.max_concurrent = max_concurrent
        self.memory_bytes = memory_bytes
        self.max_body_bytes = max_body_bytes
        self.queue_timeout_s = queue_timeout_s
        self.running = 0
        self.reserved_bytes = 0
        self._changed: asyncio.Condition | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def _condition(self) -> asyncio.Condition:
        loop = asyncio.get_running_loop()
        if self._changed is None or self._loop is not loop:  # one per event loop (tests)
            self._changed, self._loop = asyncio.Condition(), loop
            self.running = self.reserved_bytes = 0
        return self._changed

    def _declared(self, scope: Scope) -> int:
        for name, value in scope.get("headers", []):
            if name == b"content-length":
                try:
                    return max(0, int(value))
                except ValueError:
                    break
        return self.max_body_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope.get("path") != self.path:
            await self.app(scope, receive, send)
            return
        upload = min(self._declared(scope), self.max_body_bytes)
        need = math.ceil(upload * IMPORT_PEAK_FACTOR)
        if need > self.memory_bytes:
            body = problem_body(
                413,
                "payload-too-large",
                "Payload too large",
                import_memory_detail(upload, self.memory_bytes),
                instance=self.path,
            )
            await send_problem(send, 413, body)
            return
        changed = self._condition()

        def free() -> bool:
            return (
                self.running < self.max_concurrent
                and self.reserved_bytes + need <= self.memory_bytes
            )

        try:
            async with asyncio.timeout(self.queue_timeout_s), changed:
                await changed.wait_for(free)
                self.running += 1
                self.reserved_bytes += need
        except TimeoutError:
            body = problem_body(
                503,
                "overloaded",
                "Overloaded",
                import_busy_detail(self.max_concurrent, self.queue_timeout_s),
                instance=self.path,
            )
            await send_problem(send, 503, body, headers=[(b"retry-after", b"5")])
            return
        try:
            await self.app(scope, receive, send)
        finally:
            async with changed:
                self.running -= 1
                self.reserved_bytes -= need
                changed.notify_all()


class RequestContextMiddleware:
    """Give every request an id, log it as one JSON line, and record metrics per route."""

    def __init__(self, app: ASGIApp, *, metrics: Metrics) -> None:
        self.app = app
        self.metrics = metrics
        self._static_paths: frozenset[str] | None = None

    def _route_label(self, scope: Scope) -> str:
        """The route template; fixed paths outside the API routers (docs) keep their path."""
        template = getattr(scope.get("route"), "path", None)
        if isinstance(template, str):
            return template
        if self._static_paths is None:
            routes = getattr(scope.get("app"), "routes", [])
            self._static_paths = frozenset(
                path for r in routes if "{" not in (path := getattr(r, "path", "{"))
            )
        path = scope.get("path", "")
        # Unknown paths share one label so that scanners cannot explode the metric series.
        return path if path in self._static_paths else "<unmatched>"

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request_id = None
        for name, value in scope.get("headers", []):
            if name == b"x-request-id":
                candidate = value.decode("latin-1")
                if _REQUEST_ID_RE.match(candidate):
                    request_id = candidate
        request_id = request_id or uuid.uuid4().hex
        token = request_id_var.set(request_id)
        status = 500
        started = False
        start = time.perf_counter()

        async def send_with_id(message: Message) -> None:
            nonlocal status, started
            if message["type"] == "http.response.start":
                status = message["status"]
                started = True
                headers = list(message.get("headers", []))
                headers.append((b"x-request-id", request_id.encode()))
                message = {**message, "headers": headers}
            await send(message)

        try:
            await self.app(scope, receive, send_with_id)
        except Exception:
            # Logged here with the request id; the client gets a 500 problem without internals.
            error_logger.exception("unhandled error")
            if not started:
                await send_problem(send_with_id, 500, internal_error_body(scope.get("path", "")))
        finally:
            elapsed = time.perf_counter() - start
            template = self._route_label(scope)
            method = scope.get("method", "")
            self.metrics.requests.labels(method, template, str(status)).inc()
            self.metrics.latency.labels(method, template).observe(elapsed)
            access_logger.info(
                "request",
                extra={
                    "method": method,
                    "path": scope.get("path", ""),
                    "route": template,
                    "status": status,
                    "duration_ms": round(elapsed * 1000, 3),
                },
            )
            request_id_var.reset(token)
