"""Answers cached by the state of the planning data, valid across processes within a bound.

The admission webhook and MIG fits answer the same questions over and over, and their answers
depend only on the rows of four tables (hardware with its MIG profiles, model architectures,
workloads). Reading per-request fingerprints of those rows costs a worker-thread hop and queries
per request; instead every cached answer is tagged with the *generation* of the data it was
computed from:

* ``digest``: per table, the row count, the sum of ids, the sum of versions and the latest
  ``updated_at``, read by one query. Every write through the service changes it: an update
  bumps the row's version (SQLAlchemy's version counter; a hardware update also sets
  ``updated_at`` and so covers its MIG profiles), a delete lowers the count, and a create that
  balances a delete has a higher id (PostgreSQL sequences never reuse one; SQLite may reuse the
  highest id, but the new row's ``updated_at`` is then the latest). The digest is read at most
  every ``staleness_s`` (a cached answer is only used while the digest it was checked against was
  read less than ``staleness_s`` ago), so a write by *another* process or replica is reflected in
  every answer that starts more than ``staleness_s`` after the write committed.
* ``local``: a counter of this process's own commits that touched those tables (a SQLAlchemy
  session event on the app's session factory), so a write through *this* process is reflected
  in the very next answer.

Any change anywhere invalidates every cached answer: writes are rare, reviews are not.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
import weakref
from collections.abc import Awaitable, Callable, Hashable
from typing import Generic, TypeVar

from sqlalchemy import event
from sqlalchemy.orm import Session, sessionmaker

from app.config import Settings
from app.db.models import Hardware, MigProfile, ModelArchitecture, Workload
from app.db.repositories import Digest as Digest  # re-exported: the routes' cache keys
from app.db.repositories import planning_data_digest
from app.services.cache import LookupCounter, LruCache

logger = logging.getLogger("app.cache")

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")

Generation = tuple[Digest, int]
_TRACKED = (Hardware, MigProfile, ModelArchitecture, Workload)
_CHANGED = "capplan_planning_data_changed"


def read_digest(session: Session) -> Digest:
    """One query: (table, rows, sum of ids, sum of versions, latest update) per table."""
    return planning_data_digest(session)


class StateWatch:
    """The generation of one database's planning data, as this process knows it."""

    def __init__(self, staleness_s: float) -> None:
        self.staleness_s = staleness_s
        self.local = 0
        self._digest: Digest | None = None
        self._read_at = float("-inf")  # monotonic start of the query that gave ``_digest``
        self._lock = threading.Lock()
        self._inflight: asyncio.Task[Digest] | None = None
        self._inflight_started = float("-inf")

    def bump(self) -> None:
        """This process committed a change to the planning data."""
        with self._lock:
            self.local += 1

    def current(self) -> Generation | None:
        """The generation now, or None when the digest is older than ``staleness_s``."""
        if self._digest is None or time.monotonic() - self._read_at > self.staleness_s:
            return None
        return self._digest, self.local

    def observe(self, digest: Digest, read_at: float) -> None:
        """Record a digest read by a query that started at ``read_at`` (monotonic)."""
        with self._lock:
            if read_at >= self._read_at:
                self._digest, self._read_at = digest, read_at

    async def refresh(self, fetch: Callable[[], Awaitable[Digest]]) -> Generation:
        """Read the digest and answer the generation; requests that need it at the same time
        share one query (if it started less than ``staleness_s`` ago). Raises what ``fetch``
        raises (the database's unavailability)."""
        loop = asyncio.get_running_loop()
        now = time.monotonic()
        task = self._inflight
        if (
            task is None
            or task.done()
            or task.get_loop() is not loop
            or now - self._inflight_started > self.staleness_s
        ):
            task = loop.create_task(self._read(fetch, now))
            task.add_done_callback(_consume_error)
            self._inflight, self._inflight_started = task, now
        digest = await asyncio.shield(task)
        return digest, self.local

    async def generation(self, fetch: Callable[[], Awaitable[Digest]]) -> Generation:
        """The current generation, refreshing the digest when it is too old."""
        return self.current() or await self.refresh(fetch)

    async def _read(self, fetch: Callable[[], Awaitable[Digest]], started: float) -> Digest:
        digest = await fetch()
        self.observe(digest, started)
        return digest


def _consume_error(task: asyncio.Task[Digest]) -> None:
    if not task.cancelled() and task.exception() is not None:
        logger.debug("digest refresh failed: %s", type(task.exception()).__name__)


def timed_digest(session: Session) -> tuple[Digest, float]:
    """The digest and when the query started (for ``StateWatch.observe``)."""
    started = time.monotonic()
    return read_digest(session), started


_WATCHES: weakref.WeakKeyDictionary[sessionmaker[Session], StateWatch] = weakref.WeakKeyDictionary()
_WATCHES_LOCK = threading.Lock()


def watch_for(factory: sessionmaker[Session], staleness_s: float) -> StateWatch:
    """The watch of the database behind ``factory`` (one per app), hooked to its commits."""
    watch = _WATCHES.get(factory)
    if watch is not None:
        return watch
    with _WATCHES_LOCK:
        watch = _WATCHES.get(factory)
        if watch is None:
            watch = StateWatch(staleness_s)
            _hook(factory, watch)
            _WATCHES[factory] = watch
    return watch


def _hook(factory: sessionmaker[Session], watch: StateWatch) -> None:
    # The listeners hold the watch weakly: the factory's event registry must not keep it alive.
    ref = weakref.ref(watch)

    def before_flush(session: Session, _context: object, _instances: object) -> None:
        if any(
            isinstance(row, _TRACKED)
            for rows in (session.new, session.dirty, session.deleted)
            for row in rows
        ):
            session.info[_CHANGED] = True

    def after_commit(session: Session) -> None:
        if session.info.pop(_CHANGED, False) and (target := ref()) is not None:
            target.bump()

    def after_rollback(session: Session) -> None:
        session.info.pop(_CHANGED, None)

    event.listen(factory, "before_flush", before_flush)
    event.listen(factory, "after_commit", after_commit)
    event.listen(factory, "after_soft_rollback", lambda session, _previous: after_rollback(session))


class GenerationCache(Generic[K, V]):
    """A bounded LRU of answers, each valid only in the generation it was computed in."""

    def __init__(self, size: int, lookups: LookupCounter | None = None) -> None:
        self.size = size
        self._items: LruCache[K, tuple[Generation, V]] = LruCache(size)
        self._lookups = lookups

    def get(self, key: K, generation: Generation) -> V | None:
        """The answer for ``key`` if it was computed in ``generation`` (a stale one is a miss
        and is replaced by the next ``put``)."""
        found = self._items.get(key)
        if found is None or found[0][1] != generation[1] or found[0][0] != generation[0]:
            if self._lookups is not None:
                self._lookups.count(False)
            return None
        if self._lookups is not None:
            self._lookups.count(True)
        return found[1]

    def put(self, key: K, generation: Generation, value: V) -> None:
        """Store an answer computed from the data of ``generation``."""
        self._items.put(key, (generation, value))

    def clear(self) -> None:
        """Forget everything (benchmarks time cold requests)."""
        self._items.clear()

    def __len__(self) -> int:
        return len(self._items)


class PerWatch(Generic[K, V]):
    """One ``GenerationCache`` per database (per watch): apps on other databases never share."""

    def __init__(self, size: int, name: str | None = None) -> None:
        self.size = size
        self._caches: weakref.WeakKeyDictionary[StateWatch, GenerationCache[K, V]] = (
            weakref.WeakKeyDictionary()
        )
        self._lock = threading.Lock()
        # One count per name, over every database's cache (capplan_cache_lookups_total).
        self._lookups = LookupCounter(name) if name else None

    def of(self, watch: StateWatch) -> GenerationCache[K, V]:
        """The cache of ``watch``'s database."""
        cache = self._caches.get(watch)
        if cache is None:
            with self._lock:
                cache = self._caches.setdefault(watch, GenerationCache(self.size, self._lookups))
        return cache

    def clear(self) -> None:
        """Forget every database's answers."""
        with self._lock:
            for cache in self._caches.values():
                cache.clear()


def staleness_of(settings: Settings) -> float:
    """``CAPPLAN_CACHE_STALENESS_S``."""
    return settings.cache_staleness_s
