"""Admit at most N requests into the application at once; the probes always get in.

Every request costs the event loop a few hundred microseconds of middleware, routing and body
validation before it first waits (for a database slot, say). When hundreds of connections send
at the same moment, that work is queued in one go, and a liveness probe arriving behind it waited
for all of it (~160 ms for 500 requests on this machine). Parked here, outside every other
layer, a request costs a few microseconds until it is admitted, so the loop stays responsive;
`/healthz`, `/readyz`, `/metrics` and the admission webhook bypass the limit. A request that is
not admitted within the queue timeout is shed with 503 problem+json and `Retry-After`, like a
request that gets no database slot.
"""

from __future__ import annotations

import asyncio

from starlette.types import ASGIApp, Receive, Scope, Send

from app.api.errors import overloaded_detail, problem_body
from app.api.middleware import send_problem

# The probes, and the admission webhook: the API server's call must never queue behind slow
# requests (it has its own deadline, CAPPLAN_ADMISSION_TIMEOUT_S, and answers by its failure
# policy when the database cannot help in time).
UNGATED = frozenset({"/healthz", "/readyz", "/metrics", "/v1/admission/pods"})


class InFlightLimitMiddleware:
    """At most ``limit`` requests (other than the probes) inside the app at once."""

    def __init__(self, app: ASGIApp, *, limit: int, queue_timeout_s: float) -> None:
        self.app = app
        self.limit = limit
        self.queue_timeout_s = queue_timeout_s
        self._semaphore: asyncio.Semaphore | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def _gate(self) -> asyncio.Semaphore:
        loop = asyncio.get_running_loop()
        if self._semaphore is None or self._loop is not loop:  # one per event loop (tests)
            self._semaphore, self._loop = asyncio.Semaphore(self.limit), loop
        return self._semaphore

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope.get("path") in UNGATED:
            await self.app(scope, receive, send)
            return
        gate = self._gate()
        try:
            async with asyncio.timeout(self.queue_timeout_s):
                await gate.acquire()
        except TimeoutError:
            body = problem_body(
                503,
                "overloaded",
                "Overloaded",
                overloaded_detail(self.limit, self.queue_timeout_s),
                instance=scope.get("path", ""),
            )
            await send_problem(send, 503, body, headers=[(b"retry-after", b"1")])
            return
        try:
            await self.app(scope, receive, send)
        finally:
            gate.release()
