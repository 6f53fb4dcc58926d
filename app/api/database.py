"""Database work for request handlers: off the event loop, bounded, and shed when it cannot run.

Every handler that needs the database hands a function of a ``Session`` to ``Database.run``.
The function runs in a worker thread with its own session, which is opened, used and closed
inside that thread, so:

* a request never holds a connection while it waits for anything else (a thread, the event
  loop, response validation): the old design held a pooled connection from the endpoint until
  its response was validated in another thread-pool slot, and a burst deadlocked threads
  against connections until the 30 s pool timeout;
* at most ``pool_size`` requests work on the database at once; the others wait on the event
  loop for a slot, holding nothing, for at most ``queue_timeout_s`` and are then shed with a
  503 and ``Retry-After``;
* a call that has not finished after ``call_timeout_s`` (a frozen or partitioned database
  answers nothing, and PostgreSQL's own ``statement_timeout`` cannot fire in a stopped server)
  is answered 503; its thread is left to finish on its own and returns its connection when the
  database comes back;
* connection failures (refused, reset, timed out, pool exhausted) are 503s naming the
  database, never 500s, and the next request simply tries again: recovery needs no restart.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Concatenate, ParamSpec, TypeVar

import anyio
import anyio.to_thread
from prometheus_client import CollectorRegistry, Counter, Gauge
from sqlalchemy import exc as sa_exc
from sqlalchemy.orm import Session, sessionmaker

T = TypeVar("T")
P = ParamSpec("P")
logger = logging.getLogger("app.db")


class DatabaseUnavailable(Exception):
    """The database cannot do this request's work now; answered 503 with Retry-After."""

    def __init__(self, detail: str, *, type_slug: str, retry_after_s: int) -> None:
        super().__init__(detail)
        self.detail = detail
        self.type_slug = type_slug
        self.retry_after_s = retry_after_s


def busy(queue_timeout_s: float) -> DatabaseUnavailable:
    """All database slots stayed taken for the whole queue timeout."""
    return DatabaseUnavailable(
        f"the service is at its database concurrency limit and no slot freed up within "
        f"{queue_timeout_s:g} s (setting CAPPLAN_DB_QUEUE_TIMEOUT_S); retry shortly",
        type_slug="database-busy",
        retry_after_s=1,
    )


def unavailable(reason: str) -> DatabaseUnavailable:
    """The database did not answer, or answered that it cannot serve."""
    return DatabaseUnavailable(
        f"the database is not available ({reason}); retry shortly",
        type_slug="database-unavailable",
        retry_after_s=5,
    )


# Errors that say "the database cannot serve now", as opposed to a bug or bad data.
_UNAVAILABLE_ERRORS: tuple[type[Exception], ...] = (
    sa_exc.OperationalError,  # refused, reset, server shut down, statement timeout, locked
    sa_exc.InterfaceError,  # connection closed under us
    sa_exc.TimeoutError,  # pool checkout timed out (connections held by stuck calls)
)


@dataclass(slots=True)
class _Call:
    abandoned: bool = False
    finished: bool = False


class Database:
    """The only way request handlers reach the database (see the module docstring)."""

    def __init__(
        self,
        session_factory: sessionmaker[Session],
        *,
        slots: int,
        queue_timeout_s: float,
        call_timeout_s: float,
    ) -> None:
        self._session_factory = session_factory
        self.slots = slots
        self.queue_timeout_s = queue_timeout_s
        self.call_timeout_s = call_timeout_s
        self._slot_limiter = anyio.CapacityLimiter(slots)
        # Threads for database calls only, separate from the default pool (response
        # validation of sync endpoints, file uploads) so neither can starve the other. Calls
        # abandoned at their deadline release their token while their thread still runs.
        self._thread_limiter = anyio.CapacityLimiter(slots)
        self._lock = threading.Lock()
        self._stuck = 0  # abandoned calls whose threads still wait on the database
        # Metric hooks (see register_database_metrics): failures by kind, and the changes of
        # slots in use and of stuck calls (+1/-1), so that gauges add up across workers.
        self.on_failure: Callable[[str], None] = lambda _kind: None
        self.on_slots: Callable[[int], None] = lambda _delta: None
        self.on_stuck: Callable[[int], None] = lambda _delta: None

    @property
    def stuck(self) -> int:
        """Calls given up on at their deadline whose threads have not come back yet."""
        return self._stuck

    @property
    def in_use(self) -> int:
        """Slots taken right now (for metrics and tests)."""
        return int(self._slot_limiter.borrowed_tokens)

    def _tracked(self, work: Callable[[Session], T], call: _Call) -> T:
        """``_call``, counted as stuck once its request has given up on it (see ``run``)."""
        try:
            return self._call(work)
        finally:
            with self._lock:
                call.finished = True
                if call.abandoned:
                    self._stuck -= 1
                    self.on_stuck(-1)

    def _call(self, work: Callable[[Session], T]) -> T:
        try:
            with self._session_factory() as session:
                return work(session)
        except _UNAVAILABLE_ERRORS as exc:
            logger.warning("database unavailable: %s", type(exc.__cause__ or exc).__name__)
            raise unavailable(type(exc.__cause__ or exc).__name__) from exc
        except sa_exc.DBAPIError as exc:
            if exc.connection_invalidated:
                raise unavailable("connection lost") from exc
            raise

    async def run(self, work: Callable[[Session], T], *, timeout_s: float | None = None) -> T:
        """Run ``work(session)`` in a worker thread with a session of its own.

        Raises ``DatabaseUnavailable`` when no slot frees up within the queue timeout, when the
        call takes longer than ``timeout_s`` (default: the call timeout), or when the database
        cannot be reached.
        """
        deadline_s = self.call_timeout_s if timeout_s is None else timeout_s
        if self._stuck >= self.slots:
            # Every pooled connection is held by an abandoned call that has not come back: no
            # call could get a connection, so answer now instead of after the checkout timeout.
            self.on_failure("database-unavailable")
            raise unavailable(f"{self._stuck} earlier calls are still waiting for it")
        try:
            with anyio.fail_after(min(self.queue_timeout_s, deadline_s)):
                await self._slot_limiter.acquire()
        except TimeoutError:
            self.on_failure("database-busy")
            raise busy(min(self.queue_timeout_s, deadline_s)) from None
        self.on_slots(1)
        call = _Call()
        try:
            with anyio.fail_after(deadline_s) as scope:
                return await anyio.to_thread.run_sync(
                    self._tracked, work, call, abandon_on_cancel=True, limiter=self._thread_limiter
                )
        except TimeoutError:
            if not scope.cancel_called:
                raise
            with self._lock:
                if not call.finished:
                    call.abandoned = True
                    self._stuck += 1
                    self.on_stuck(1)
            logger.warning("database call abandoned after %.2f s", deadline_s)
            self.on_failure("database-unavailable")
            raise unavailable(f"no answer within {deadline_s:g} s") from None
        except DatabaseUnavailable:
            self.on_failure("database-unavailable")
            raise
        finally:
            self._slot_limiter.release()
            self.on_slots(-1)

    async def call(
        self,
        function: Callable[Concatenate[Session, P], T],
        *args: P.args,
        **kwargs: P.kwargs,
    ) -> T:
        """``run`` for a service function: ``await db.call(service.get, slug=slug)``."""
        return await self.run(lambda session: function(session, *args, **kwargs))


def register_database_metrics(registry: CollectorRegistry, database: Database) -> None:
    """Slots in use, stuck calls and database failures by type, on ``/metrics``.

    The gauges follow the changes (+1/-1) rather than reading ``database`` at scrape time: a
    scrape reaches one worker, and with several workers the gauges are sums over the live
    workers (see app.api.metrics)."""
    slots = Gauge(
        "capplan_db_slots_in_use",
        "Requests working on the database right now (limit: CAPPLAN_DB_POOL_SIZE per worker).",
        registry=registry,
        multiprocess_mode="livesum",
    )
    slots.set(database.in_use)
    database.on_slots = slots.inc
    stuck = Gauge(
        "capplan_db_stuck_calls",
        "Calls given up on at CAPPLAN_DB_CALL_TIMEOUT_S whose threads still wait on the database.",
        registry=registry,
        multiprocess_mode="livesum",
    )
    stuck.set(database.stuck)
    database.on_stuck = stuck.inc
    failures = Counter(
        "capplan_db_failures",
        "Requests answered 503 because the database was busy or unavailable, by problem type.",
        ["type"],
        registry=registry,
    )
    database.on_failure = lambda kind: failures.labels(kind).inc()
