"""CPU-heavy request work: outside the database slots, bounded, and stopped with its answer.

A handler whose work is mostly computation (an estimate, a recommendation, a MIG fit or plan)
runs in two steps:

1. **Load** in a short database call (``Database.run``): the service reads the rows it needs
   and returns a *thunk*, a function of no arguments that computes the answer from plain data.
   The session, its connection and the database slot are released when the call returns.
2. **Compute** with :meth:`Compute.run`: the thunk runs in a worker thread of its own pool
   under a separate limit (``CAPPLAN_COMPUTE_SLOTS`` per worker process; the others wait at
   most ``CAPPLAN_COMPUTE_QUEUE_TIMEOUT_S`` and are shed with 503 ``compute-busy`` and
   Retry-After). A :class:`app.domain.budget.CancelToken` with the deadline
   (``CAPPLAN_COMPUTE_TIMEOUT_S``) is bound in that thread; the domain's hot loops call
   ``checkpoint()``, so when the deadline passes, or the client disconnects, the computation
   unwinds at its next checkpoint, its thread returns and its slot is released. The caller gets
   :class:`ComputeOverrun` (a 422 ``/problems/too-expensive``, with no Retry-After: the same
   request would overrun again) instead of a 503 that blames the database.

Use it from a route::

    thunk = await db.run(functools.partial(service.prepare_estimate, payload=payload))
    return await compute.run(thunk, request=request)

or in one call, ``await compute.call(db, service.prepare_estimate, request, payload=payload)``.
Work that has no thread of its own to give (the admission webhook's inline path) can bind a
token directly: ``with bound(CancelToken.after(s)): ...`` (app.domain.budget).

Work that never reaches a checkpoint cannot be stopped: it is given a grace period
(``GRACE_S``) after the deadline, then abandoned and counted in ``capplan_compute_stuck``
until its thread returns.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Concatenate, ParamSpec, TypeVar

import anyio
import anyio.to_thread
from prometheus_client import CollectorRegistry, Counter, Gauge
from sqlalchemy.orm import Session
from starlette.requests import Request

from app.api.database import Database
from app.domain.budget import CancelToken, WorkCancelled, bound

T = TypeVar("T")
P = ParamSpec("P")
logger = logging.getLogger("app.compute")

GRACE_S = 1.0  # how long past its deadline a computation may take to reach a checkpoint
DISCONNECT_POLL_S = 0.25  # how often a computing request looks for its client's disconnect


class ComputeBusy(Exception):
    """Every compute slot stayed taken for the whole queue timeout (503, Retry-After)."""

    def __init__(self, slots: int, queue_timeout_s: float) -> None:
        self.detail = (
            f"every compute slot is taken (CAPPLAN_COMPUTE_SLOTS={slots}) and none freed up "
            f"within {queue_timeout_s:g} s (CAPPLAN_COMPUTE_QUEUE_TIMEOUT_S); retry shortly"
        )
        self.retry_after_s = 1
        super().__init__(self.detail)


class ComputeOverrun(Exception):
    """The computation was stopped before it finished (422 ``too-expensive``, no Retry-After).

    ``reason``: ``"deadline"`` (past ``CAPPLAN_COMPUTE_TIMEOUT_S``) or ``"disconnected"`` (the
    client went away; nobody reads that answer)."""

    def __init__(self, reason: str, deadline_s: float) -> None:
        self.reason = reason
        self.deadline_s = deadline_s
        if reason == "deadline":
            self.detail = (
                f"the computation did not finish within {deadline_s:g} s "
                "(CAPPLAN_COMPUTE_TIMEOUT_S) and was stopped; nothing was written. Ask for less "
                "work (fewer devices or precisions, fewer batch sizes, a smaller graph); the same "
                "request would be stopped again"
            )
        else:
            self.detail = f"the computation was stopped ({reason}); nothing was written"
        super().__init__(self.detail)


class Compute:
    """The bounded, cancellable runner of CPU-heavy request work (see the module docstring)."""

    def __init__(
        self, *, slots: int, queue_timeout_s: float, timeout_s: float, budget_units: int
    ) -> None:
        self.slots = slots
        self.budget_units = budget_units  # CAPPLAN_MAX_WORK_UNITS, for the services' check
        self.queue_timeout_s = queue_timeout_s
        self.timeout_s = timeout_s
        self._slot_limiter = anyio.CapacityLimiter(slots)
        # Threads for computations only (not the default pool, not the database's). An
        # abandoned computation releases its token while its thread still runs (counted stuck).
        self._thread_limiter = anyio.CapacityLimiter(slots)
        self._lock = threading.Lock()
        self._stuck = 0
        # Metric hooks (register_compute_metrics): +1/-1 changes and outcomes by kind.
        self.on_running: Callable[[int], None] = lambda _delta: None
        self.on_stuck: Callable[[int], None] = lambda _delta: None
        self.on_stopped: Callable[[str], None] = lambda _reason: None

    @property
    def running(self) -> int:
        """Compute slots taken right now."""
        return int(self._slot_limiter.borrowed_tokens)

    @property
    def stuck(self) -> int:
        """Computations abandoned past deadline + grace whose threads still run."""
        return self._stuck

    async def call(
        self,
        db: Database,
        prepare: Callable[Concatenate[Session, P], Callable[[], T]],
        request: Request | None,
        /,
        *args: P.args,
        **kwargs: P.kwargs,
    ) -> T:
        """Load with ``prepare(session, ...)`` in a short database call, then compute its thunk."""
        thunk = await db.run(lambda session: prepare(session, *args, **kwargs))
        return await self.run(thunk, request=request)

    async def run(
        self,
        work: Callable[[], T],
        *,
        request: Request | None = None,
        timeout_s: float | None = None,
    ) -> T:
        """Run ``work()`` in a compute thread with a cancel token bound (see the module doc).

        Raises :class:`ComputeBusy` when no slot frees up within the queue timeout and
        :class:`ComputeOverrun` when the work is stopped (deadline, client disconnect)."""
        deadline_s = self.timeout_s if timeout_s is None else timeout_s
        try:
            with anyio.fail_after(self.queue_timeout_s):
                await self._slot_limiter.acquire()
        except TimeoutError:
            self.on_stopped("busy")
            raise ComputeBusy(self.slots, self.queue_timeout_s) from None
        self.on_running(1)
        token = CancelToken.after(deadline_s)
        done = threading.Event()

        def bound_work() -> T:
            try:
                with bound(token):
                    return work()
            finally:
                done.set()
                with self._lock:
                    if abandoned:
                        self._stuck -= 1
                        self.on_stuck(-1)

        abandoned = False
        result: list[T] = []
        failure: list[Exception] = []
        try:
            async with anyio.create_task_group() as group:
                if request is not None:
                    group.start_soon(_watch_disconnect, request, token)
                try:
                    with anyio.move_on_after(deadline_s + GRACE_S):
                        result.append(
                            await anyio.to_thread.run_sync(
                                bound_work, abandon_on_cancel=True, limiter=self._thread_limiter
                            )
                        )
                except Exception as exc:  # raised by the work: re-raised below, unwrapped
                    failure.append(exc)
                group.cancel_scope.cancel()
        finally:
            if not result and not failure and not done.is_set():
                token.cancel("deadline")
                with self._lock:
                    if not done.is_set():
                        abandoned = True
                        self._stuck += 1
                        self.on_stuck(1)
            self._slot_limiter.release()
            self.on_running(-1)
        if failure:
            if isinstance(failure[0], WorkCancelled):
                # A checkpoint raised it: the thread has returned, its slot is free.
                reason = _reason(failure[0].reason)
                self.on_stopped(reason)
                logger.warning("computation stopped at a checkpoint: %s", reason)
                raise ComputeOverrun(reason, deadline_s) from None
            raise failure[0]
        if not result:
            self.on_stopped("abandoned")
            logger.warning("computation abandoned %.1f s past its deadline", GRACE_S)
            raise ComputeOverrun("deadline", deadline_s)
        return result[0]


def _reason(token_reason: str) -> str:
    return "deadline" if token_reason == "deadline" else "disconnected"


async def _watch_disconnect(request: Request, token: CancelToken) -> None:
    """Cancel ``token`` once the client has gone away (polled; nobody reads that answer)."""
    while True:
        await anyio.sleep(DISCONNECT_POLL_S)
        try:
            gone = await request.is_disconnected()
        except Exception:  # a transport that cannot tell: keep computing to the deadline
            logger.debug("cannot tell whether the client disconnected", exc_info=True)
            return
        if gone:
            token.cancel("client disconnected")
            return


def register_compute_metrics(registry: CollectorRegistry, compute: Compute) -> None:
    """Computations running, stuck, and stopped by reason, on ``/metrics``."""
    running = Gauge(
        "capplan_compute_running",
        "CPU-heavy computations running now (limit: CAPPLAN_COMPUTE_SLOTS per worker).",
        registry=registry,
        multiprocess_mode="livesum",
    )
    running.set(compute.running)
    compute.on_running = running.inc
    stuck = Gauge(
        "capplan_compute_stuck",
        "Computations abandoned past their deadline whose threads have not returned yet.",
        registry=registry,
        multiprocess_mode="livesum",
    )
    stuck.set(compute.stuck)
    compute.on_stuck = stuck.inc
    stopped = Counter(
        "capplan_compute_stopped",
        "Computations not run to the end, by reason: deadline, client disconnected, busy "
        "(shed before starting), abandoned (no checkpoint reached in the grace period).",
        ["reason"],
        registry=registry,
    )
    compute.on_stopped = lambda reason: stopped.labels(reason).inc()
