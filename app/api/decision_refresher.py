"""The webhook's refresher: stores the admission decisions that are missing or stale.

Decisions of stored workloads are computed when the planning data is written through the
service (app.services.decision_store). Rows that are missing or stale for another reason (the
database was upgraded to the revision that added them, ``catalog-sync`` or another release
wrote a row, a write's budget ran out) are found by a review, which estimates within its own
deadline and then *pokes* this refresher. The refresher computes every missing or stale
decision in one background thread per process (batches of ``BATCH`` pairs, each evaluation
under the per-pair work deadline, committed per batch) and deletes other releases' rows older
than a week, then waits for the next poke; after ``IDLE_EXIT_S`` without one its thread ends.
Replicas doing the same at the same time are harmless: the rows are upserts of the same values.
"""

from __future__ import annotations

import logging
import threading
import time
import weakref

from sqlalchemy.orm import Session, sessionmaker

from app.services import decision_store

logger = logging.getLogger("app.admission")

BATCH = 200
IDLE_EXIT_S = 30.0
RETRY_S = 5.0  # after a failed sweep (database unavailable), before the next try


class DecisionRefresher:
    """One database's background sweep of missing or stale admission decisions."""

    def __init__(self, session_factory: sessionmaker[Session]) -> None:
        self._factory = weakref.ref(session_factory)  # the registry below is keyed by it
        self._wake = threading.Event()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self.sweeps = 0  # completed sweeps (for tests and benchmarks)
        self.stored = 0  # decisions stored

    def poke(self) -> None:
        """Ask for a sweep soon (starts the thread when it is not running). Cheap."""
        self._wake.set()
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="capplan-decision-refresher", daemon=True
                )
                self._thread.start()

    def _run(self) -> None:
        while True:
            if not self._wake.wait(IDLE_EXIT_S):
                with self._lock:
                    if not self._wake.is_set():
                        self._thread = None
                        return
                continue
            self._wake.clear()
            if not self._sweep():
                time.sleep(RETRY_S)

    def _sweep(self) -> bool:
        """Store every missing or stale decision; False when the database failed."""
        try:
            while True:
                factory = self._factory()
                if factory is None:  # the app is gone
                    return True
                with factory() as session:
                    stored = decision_store.refresh_stale(session, limit=BATCH)
                self.stored += stored
                if stored == 0:
                    with factory() as session:
                        decision_store.prune_other_releases(session)
                    self.sweeps += 1
                    return True
        except Exception:  # the next poke tries again; reviews still take the bounded path
            logger.warning("admission decision refresh failed", exc_info=True)
            return False


_REFRESHERS: weakref.WeakKeyDictionary[sessionmaker[Session], DecisionRefresher] = (
    weakref.WeakKeyDictionary()
)
_LOCK = threading.Lock()


def refresher_for(factory: sessionmaker[Session]) -> DecisionRefresher:
    """The refresher of the database behind ``factory`` (one per app)."""
    with _LOCK:
        found = _REFRESHERS.get(factory)
        if found is None:
            found = _REFRESHERS[factory] = DecisionRefresher(factory)
        return found
