"""Prometheus metrics, correct with any number of worker processes.

With one process (``serve`` with one worker, the tests) each app has its own registry and
``/metrics`` renders it. With several worker processes (``serve --workers N``), a scrape reaches
one worker, which could only report its own share of every counter; instead ``serve`` points
``PROMETHEUS_MULTIPROC_DIR`` at an empty directory before the workers start, every worker writes
its values to files there (prometheus_client's multiprocess mode), and ``/metrics`` aggregates
the files of all workers, dead ones included, so counters keep counting across restarts.
Gauges say how they combine (``multiprocess_mode``): the ones here are sums over live workers.
A worker marks itself dead on shutdown; ``/metrics`` also marks workers that vanished without
shutting down (killed) so their live gauges stop counting.

Process metrics (``process_*``: CPU seconds, resident memory, open file descriptors, start
time) are per process, so they carry a ``pid`` label, one series per live worker, read from
``/proc`` at scrape time.
"""

from __future__ import annotations

import contextlib
import functools
import os
import re
import shutil
import tempfile
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    ProcessCollector,
    generate_latest,
    multiprocess,
)
from prometheus_client.metrics_core import Metric
from sqlalchemy import Engine, event

from app.services.cache import CACHE_LOOKUPS

MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"
# Every worker writes its live gauges (at least ``capplan_worker_processes``) to this file.
_LIVE_FILE = re.compile(r"^gauge_livesum_(\d+)\.db$")


def multiprocess_dir() -> Path | None:
    """The directory of multiprocess mode, or None in single-process mode (prometheus_client
    reads the same variable when it is first imported)."""
    value = os.environ.get(MULTIPROC_ENV)
    return Path(value) if value else None


def prepare_multiprocess_dir(workers: int) -> Callable[[], None]:
    """Set up multiprocess mode for ``serve`` before its workers start; returns the clean-up.

    With several workers: an empty directory in ``PROMETHEUS_MULTIPROC_DIR`` (the operator's,
    emptied of old ``*.db`` files, or a fresh temporary one, removed on exit). With one worker:
    only an operator's directory is emptied (stale files would be counted)."""
    given = multiprocess_dir()
    if given is not None:
        given.mkdir(parents=True, exist_ok=True)
        for stale in given.glob("*.db"):
            stale.unlink()
        return lambda: None
    if workers <= 1:
        return lambda: None
    created = tempfile.mkdtemp(prefix="capplan-metrics-")
    os.environ[MULTIPROC_ENV] = created

    def cleanup() -> None:
        os.environ.pop(MULTIPROC_ENV, None)
        shutil.rmtree(created, ignore_errors=True)

    return cleanup


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    return True


def live_worker_pids(path: Path) -> list[int]:
    """Workers with live gauges in ``path``; those that died without marking themselves dead
    (killed) are marked now, so their live gauges stop counting."""
    pids = []
    for name in os.listdir(path):
        match = _LIVE_FILE.match(name)
        if match is None:
            continue
        pid = int(match.group(1))
        if _alive(pid):
            pids.append(pid)
        else:
            multiprocess.mark_process_dead(pid, str(path))  # type: ignore[no-untyped-call]
    return sorted(pids)


class ProcessMetrics:
    """prometheus_client's process collector for each of ``pids()``, labelled ``pid``."""

    def __init__(self, pids: Callable[[], Iterable[int]]) -> None:
        self.pids = pids

    def collect(self) -> Iterator[Metric]:
        families: dict[str, Metric] = {}
        for pid in self.pids():
            collector = ProcessCollector(pid=functools.partial(int, pid), registry=None)
            for family in collector.collect():
                merged = families.setdefault(
                    family.name, Metric(family.name, family.documentation, family.type)
                )
                for sample in family.samples:
                    merged.add_sample(sample.name, {**sample.labels, "pid": str(pid)}, sample.value)
        yield from families.values()


class Metrics:
    """Prometheus collectors of one app instance (own registry, so apps do not collide)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter(
            "capplan_http_requests_total",
            "HTTP requests by method, route template and status.",
            ["method", "route", "status"],
            registry=self.registry,
        )
        self.latency = Histogram(
            "capplan_http_request_duration_seconds",
            "HTTP request latency by method and route template.",
            ["method", "route"],
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0),
            registry=self.registry,
        )
        self.admission = Counter(
            "capplan_admission_decisions_total",
            "Admission decisions by endpoint (pods: the webhook; check: the simple form), "
            "outcome (allowed, denied) and reason (fits, does_not_fit, no_gpu; for reviews "
            "answered by CAPPLAN_ADMISSION_FAILURE_POLICY: invalid_review, "
            "database_unavailable, timeout, internal_error).",
            ["endpoint", "outcome", "reason"],
            registry=self.registry,
        )
        self.workers = Gauge(
            "capplan_worker_processes",
            "Worker processes serving requests (summed over live workers).",
            registry=self.registry,
            multiprocess_mode="livesum",
        )
        self.workers.set(1)
        # Module-level: the caches themselves are shared by every app of the process.
        self.registry.register(CACHE_LOOKUPS)
        self._process = ProcessMetrics(lambda: [os.getpid()])
        self.registry.register(self._process)

    def count_admission(self, endpoint: str, *, allowed: bool, reason: str) -> None:
        """One admission decision (made by the route that answers it)."""
        self.admission.labels(endpoint, "allowed" if allowed else "denied", reason).inc()

    def render(self) -> bytes:
        """The Prometheus text exposition: this app's registry, or every worker's values in
        multiprocess mode."""
        path = multiprocess_dir()
        if path is None:
            return bytes(generate_latest(self.registry))
        registry = CollectorRegistry()
        registry.register(ProcessMetrics(lambda: live_worker_pids(path)))
        multiprocess.MultiProcessCollector(  # type: ignore[no-untyped-call]
            registry, path=str(path)
        )
        return bytes(generate_latest(registry))

    def shutdown(self) -> None:
        """This worker stops: its live gauges stop counting (its counters stay)."""
        path = multiprocess_dir()
        if path is not None:
            with contextlib.suppress(FileNotFoundError):
                multiprocess.mark_process_dead(  # type: ignore[no-untyped-call]
                    os.getpid(), str(path)
                )


def register_pool_metrics(registry: CollectorRegistry, engine: Engine) -> None:
    """The SQLAlchemy pool's size and connections checked out, summed over live workers."""
    size = Gauge(
        "capplan_db_pool_size",
        "Connections the database pools may hold (CAPPLAN_DB_POOL_SIZE per worker).",
        registry=registry,
        multiprocess_mode="livesum",
    )
    pool_size: Any = getattr(engine.pool, "size", None)
    size.set(pool_size() if callable(pool_size) else 1)  # StaticPool: one connection
    checked_out = Gauge(
        "capplan_db_pool_checked_out",
        "Pooled database connections in use right now.",
        registry=registry,
        multiprocess_mode="livesum",
    )

    def on_checkout(*_args: object) -> None:
        checked_out.inc()

    def on_checkin(*_args: object) -> None:
        checked_out.dec()

    event.listen(engine, "checkout", on_checkout)
    event.listen(engine, "checkin", on_checkin)
