"""Fixtures: every database test runs on SQLite, and on PostgreSQL when TEST_DATABASE_URL is set.

In CI (CI=true) a missing TEST_DATABASE_URL fails the PostgreSQL half instead of skipping it.
"""

from __future__ import annotations

import gc
import os
from collections.abc import Iterator
from typing import Any

import pytest

from app.main import create_app
from tests.support import (
    ApiClient,
    ClientFactory,
    PostgresDatabases,
    SqliteDatabases,
    WallClock,
    settings_for,
)

BACKENDS = ["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)]


@pytest.fixture(scope="session")
def sqlite_databases(tmp_path_factory: pytest.TempPathFactory) -> SqliteDatabases:
    return SqliteDatabases(tmp_path_factory.mktemp("sqlite"))


@pytest.fixture(scope="session")
def postgres_databases() -> Iterator[PostgresDatabases]:
    url = os.environ.get("TEST_DATABASE_URL")
    if not url:
        if os.environ.get("CI"):
            pytest.fail("CI=true but TEST_DATABASE_URL is not set: PostgreSQL tests cannot run")
        pytest.skip("TEST_DATABASE_URL not set; PostgreSQL tests skipped (SQLite ran)")
    databases = PostgresDatabases(url)
    yield databases
    databases.close()


@pytest.fixture(params=BACKENDS)
def db_url(request: pytest.FixtureRequest) -> Iterator[str]:
    """A fresh, migrated database with the shipped catalog loaded."""
    name = "sqlite_databases" if request.param == "sqlite" else "postgres_databases"
    databases = request.getfixturevalue(name)
    with databases.fresh() as url:
        yield url


@pytest.fixture
def make_client(db_url: str) -> Iterator[ClientFactory]:
    """Build clients of the real app on this test's database with settings overrides."""
    clients: list[ApiClient] = []

    def build(**overrides: Any) -> ApiClient:
        client = ApiClient(create_app(settings_for(db_url, **overrides)))
        clients.append(client)
        return client

    yield build
    for client in clients:
        client.close()


@pytest.fixture
def client(make_client: ClientFactory) -> ApiClient:
    """A client of the app in open dev mode (no API keys)."""
    return make_client()


@pytest.fixture(autouse=True)
def _heap_of_a_fresh_process(request: pytest.FixtureRequest) -> Iterator[None]:
    """Wall-clock tests measure the service, not this test process's heap.

    Every earlier test's apps, clients and catalogs stay reachable here (far more tracked
    objects than a served process holds), so a full collection of the cyclic garbage
    collector during a timed request scanned them all: 0.5-1.5 s pauses on a 2-core VM,
    measured with a gc callback, which failed the 0.5 s / 1 s bounds about once in five
    timing passes. A served process freezes what it built at start-up (``app.main``'s
    lifespan: ``gc.collect(); gc.freeze()``) and its caches are bounded: after
    recommendations for 8 zoo models its full collection took 45 ms on the same VM. So
    during a timing test what the earlier tests left is frozen (out of the collector's
    scans, as a fresh server's start-up objects are; freezing scans nothing) and unfrozen
    after; what the test itself builds is collected as in a server.
    """
    if request.node.get_closest_marker("timing") is None:
        yield
        return
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


@pytest.fixture(autouse=True)
def _wall_clock_limits(request: pytest.FixtureRequest) -> Iterator[None]:
    """Apps built outside timing-marked tests get the loaded-machine limits (tests/support.py):
    their outcome must not depend on how busy the machine is."""
    WallClock.timed = request.node.get_closest_marker("timing") is not None
    try:
        yield
    finally:
        WallClock.timed = True
