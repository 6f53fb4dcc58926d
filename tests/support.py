"""Test helpers: per-test databases on SQLite and PostgreSQL, and a sync httpx client."""

from __future__ import annotations

import asyncio
import importlib.util
import itertools
import os
import shutil
import sys
import time
from collections.abc import Callable, Coroutine, Iterator
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType
from typing import Any, TypeVar

import httpx
from fastapi import FastAPI
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session

from app.config import PROJECT_ROOT, Settings
from app.db.migrations import upgrade_to_head
from app.db.session import make_engine, make_session_factory
from app.services.catalog import load_catalog, sync_catalog
from app.services.zoo import sync_zoo

T = TypeVar("T")

CATALOG_DIR = PROJECT_ROOT / "hardware_catalog"
TABLES = ("hardware", "mig_profile", "model_architecture", "workload")


@contextmanager
def db_session(url: str) -> Iterator[Session]:
    """A session on its own engine, disposed afterwards."""
    engine = make_engine(url)
    try:
        with make_session_factory(engine)() as session:
            yield session
    finally:
        engine.dispose()


def prepare(url: str) -> None:
    """Migrate to head and load the shipped catalog."""
    upgrade_to_head(url)
    with db_session(url) as session:
        sync_catalog(session, load_catalog(CATALOG_DIR))
        sync_zoo(session)


class SqliteDatabases:
    """A migrated template file, copied for every test."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.template = directory / "template.db"
        prepare(f"sqlite:///{self.template}")
        self._ids = itertools.count()

    @contextmanager
    def fresh(self) -> Iterator[str]:
        path = self.directory / f"test-{next(self._ids)}.db"
        shutil.copyfile(self.template, path)
        try:
            yield f"sqlite:///{path}"
        finally:
            path.unlink(missing_ok=True)


class PostgresDatabases:
    """A migrated template database, cloned with CREATE DATABASE ... TEMPLATE per test."""

    def __init__(self, admin_url: str) -> None:
        self.admin_url = make_url(admin_url)
        self.prefix = f"capplan_test_{os.getpid()}"
        self.template = f"{self.prefix}_tmpl"
        self._ids = itertools.count()
        self._admin = create_engine(self.admin_url, isolation_level="AUTOCOMMIT")
        self._drop(self.template)
        self._execute(f'CREATE DATABASE "{self.template}"')
        prepare(self.url_for(self.template))

    def url_for(self, name: str) -> str:
        return self.admin_url.set(database=name).render_as_string(hide_password=False)

    def _execute(self, sql: str) -> None:
        with self._admin.connect() as connection:
            connection.execute(text(sql))

    def _drop(self, name: str) -> None:
        self._execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

    @contextmanager
    def fresh(self) -> Iterator[str]:
        name = f"{self.prefix}_{next(self._ids)}"
        self._execute(f'CREATE DATABASE "{name}" TEMPLATE "{self.template}"')
        try:
            yield self.url_for(name)
        finally:
            self._drop(name)

    def close(self) -> None:
        self._drop(self.template)
        self._admin.dispose()


def table_counts(url: str) -> dict[str, int]:
    """Rows per table, to prove a rejected request wrote nothing."""
    engine = make_engine(url)
    try:
        with engine.connect() as connection:
            return {
                table: int(connection.execute(text(f"SELECT count(*) FROM {table}")).scalar_one())
                for table in TABLES
            }
    finally:
        engine.dispose()


class ApiClient:
    """A synchronous facade over ``httpx.AsyncClient`` + ``ASGITransport`` (the real app)."""

    def __init__(self, app: FastAPI) -> None:
        self.app = app
        self._runner = asyncio.Runner()
        transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
        self._client = httpx.AsyncClient(transport=transport, base_url="http://test")

    def request(self, method: str, url: str, **kwargs: Any) -> httpx.Response:
        return self._runner.run(self._client.request(method, url, **kwargs))

    def get(self, url: str, **kwargs: Any) -> httpx.Response:
        return self.request("GET", url, **kwargs)

    def post(self, url: str, **kwargs: Any) -> httpx.Response:
        return self.request("POST", url, **kwargs)

    def put(self, url: str, **kwargs: Any) -> httpx.Response:
        return self.request("PUT", url, **kwargs)

    def delete(self, url: str, **kwargs: Any) -> httpx.Response:
        return self.request("DELETE", url, **kwargs)

    @property
    def async_client(self) -> httpx.AsyncClient:
        """The underlying async client, for concurrent requests inside ``run``."""
        return self._client

    def run(self, coroutine: Coroutine[Any, Any, T]) -> T:
        """Run ``coroutine`` on this client's event loop (the app's loop)."""
        return self._runner.run(coroutine)

    def close(self) -> None:
        self._runner.run(self._client.aclose())
        self._runner.close()
        self.app.state.engine.dispose()


ClientFactory = Callable[..., ApiClient]


def _runqueue_waits_ns() -> dict[str, int]:
    """Per thread of this process: nanoseconds spent runnable but waiting for a CPU (schedstat)."""
    waits = {}
    for task in Path("/proc/self/task").iterdir():
        try:
            fields = (task / "schedstat").read_text().split()
        except OSError:  # the thread ended while we looked
            continue
        waits[task.name] = int(fields[1])
    return waits


class ServiceClock:
    """Wall-clock seconds since creation, less the time this process's threads waited for a CPU.

    A timing test bounds what the service does, not how busy the machine is: on a 2-core machine
    at load 8 a thread that is ready to answer can wait seconds for a core (the admission tests'
    0.3 s budget was answered after 1.27 s of wall-clock time in such a run). Linux counts that
    wait per thread (``/proc/<pid>/task/<tid>/schedstat``, second field); it is subtracted here.
    With several threads runnable at once their waits add up, so the figure can only come out
    lower than the unloaded time: the bounds stay bounds, and an answer that never comes still
    fails them. Lower bounds (a request waited at least its queue timeout) use the wall clock.
    """

    def __init__(self) -> None:
        assert Path("/proc/self/schedstat").exists(), "timing tests need Linux schedstat"
        self._start_s = time.perf_counter()
        self._waits_ns = _runqueue_waits_ns()

    @property
    def elapsed_s(self) -> float:
        wall_s = time.perf_counter() - self._start_s
        waited_ns = 0
        for tid, now_ns in _runqueue_waits_ns().items():
            before_ns = self._waits_ns.get(tid, 0)
            waited_ns += now_ns - before_ns if now_ns >= before_ns else now_ns  # a reused tid
        return max(0.0, wall_s - waited_ns / 1e9)


# Wall-clock limits for tests outside the `timing` marker: as long as the settings allow, so a
# loaded 2-core machine (a neighbouring worker, CI's other pass, a full collection of this test
# process's heap) cannot turn a correct answer into a budget's fallback. Timing-marked tests keep
# the shipped defaults, and every test that is about a limit sets it explicitly.
LOADED_MACHINE_LIMITS: dict[str, Any] = {
    "admission_timeout_s": 30.0,
    "db_call_timeout_s": 600.0,
    "db_queue_timeout_s": 60.0,
}


class WallClock:
    """Whether the running test asserts wall-clock bounds (set per test by tests/conftest.py)."""

    timed = True


def settings_for(url: str, **overrides: Any) -> Settings:
    """Settings for a test database, ignoring the developer's environment and .env.

    Outside timing-marked tests the wall-clock limits are relaxed (``LOADED_MACHINE_LIMITS``)
    unless the test sets them."""
    values: dict[str, Any] = {
        "database_url": url,
        "api_keys": "",
        "require_auth_for_reads": False,
        "catalog_dir": CATALOG_DIR,
        **({} if WallClock.timed else LOADED_MACHINE_LIMITS),
        **overrides,
    }
    return Settings(_env_file=None, **values)


def load_script(path: Path, name: str) -> ModuleType:
    """Import a benchmark script (benchmarks/ is not a package) as module ``name``."""
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve their module through sys.modules
    spec.loader.exec_module(module)
    return module


def attention_layers(layers: Any) -> list[dict[str, Any]]:
    """Every ``attention`` layer of a graph, blocks' inner layers included."""
    found = []
    for layer in layers:
        if layer["op"] == "attention":
            found.append(layer)
        found += attention_layers(layer.get("layers", []))
    return found
