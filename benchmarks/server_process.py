"""Start and stop a `capplan-server serve` process for a benchmark, on a fresh database; or
give an in-process benchmark a fresh, synced database (:func:`synced_sessions`).

Shared by the benchmarks that measure a running server (admission_load, burst, db_outage,
http_limits, import_memory, over_budget, webhook_throughput) and by those that call the
recommendation service in process (llm_server_load, recommendation_speed, server_stability);
``benchmarks/`` is not a package, and a script run as ``python benchmarks/<name>.py`` finds
this module beside it.

The server runs with the service's default settings: every ``CAPPLAN_*`` variable of the
calling shell is removed, API keys are off, and only the settings a benchmark names are set.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import httpx

if TYPE_CHECKING:
    from sqlalchemy.orm import Session, sessionmaker

ROOT = Path(__file__).resolve().parent.parent
PREPARE = ("migrate", "catalog-sync")  # what a fresh database needs before `serve`


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def service_env(**settings: str) -> dict[str, str]:
    """This process's environment with the service's defaults: no ``CAPPLAN_*`` variable but
    API keys off and ``settings`` (``CAPPLAN_LOG_LEVEL="ERROR"``, a database, ...)."""
    env = {name: value for name, value in os.environ.items() if not name.startswith("CAPPLAN_")}
    env.update(CAPPLAN_API_KEYS="", **settings)
    return env


def prepare(env: dict[str, str], commands: Sequence[str] = PREPARE, cwd: Path = ROOT) -> None:
    """Run ``capplan-server <command>`` for each of ``commands`` (migrate, catalog-sync)."""
    for command in commands:
        subprocess.run([sys.executable, "-m", "app.cli", command], cwd=cwd, env=env, check=True,
                       capture_output=True, timeout=300)  # fmt: skip


@contextlib.contextmanager
def database(
    backend: str, postgres_url: str | None, tmp: Path, **settings: str
) -> Iterator[dict[str, str]]:
    """The environment of a fresh, migrated, catalog-synced database of ``backend`` (sqlite:
    in ``tmp``; postgresql: a database created on ``postgres_url``'s server and dropped after)."""
    if backend == "sqlite":
        env = service_env(CAPPLAN_DATA_DIR=str(tmp), **settings)
        prepare(env)
        yield env
        return
    import psycopg
    from sqlalchemy.engine import make_url

    if not postgres_url:
        raise SystemExit("PostgreSQL: pass --postgres-url or set TEST_DATABASE_URL")
    admin = make_url(postgres_url)
    name = f"capplan_bench_{os.getpid()}"
    conninfo = admin.set(drivername="postgresql").render_as_string(hide_password=False)
    with psycopg.connect(conninfo, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        url = admin.set(database=name).render_as_string(hide_password=False)
        env = service_env(CAPPLAN_DATABASE_URL=url, **settings)
        prepare(env)
        yield env
    finally:
        with psycopg.connect(conninfo, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def start(
    env: dict[str, str], port: int, *, workers: int | None = None, cwd: Path = ROOT
) -> subprocess.Popen[bytes]:
    """``capplan-server serve --port <port>`` (``--workers`` when given), output discarded."""
    command = [sys.executable, "-m", "app.cli", "serve", "--port", str(port)]
    if workers is not None:
        command += ["--workers", str(workers)]
    return subprocess.Popen(
        command, cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )


def wait_ready(
    process: subprocess.Popen[bytes], port: int, path: str = "/readyz", timeout_s: float = 120.0
) -> None:
    """Return once ``path`` answers 200; raise if the server exits or ``timeout_s`` passes."""
    deadline = time.monotonic() + timeout_s
    while True:
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(f"http://127.0.0.1:{port}{path}", timeout=2).status_code == 200:
                return
        if process.poll() is not None:
            raise RuntimeError(
                f"capplan-server serve exited during start-up ({process.returncode})"
            )
        if time.monotonic() > deadline:
            raise RuntimeError(f"capplan-server serve did not answer {path} in {timeout_s:g} s")
        time.sleep(0.1)


def stop(process: subprocess.Popen[bytes], timeout_s: float = 15.0) -> None:
    """Terminate the server and wait for it; kill it if it outlives ``timeout_s``."""
    process.terminate()
    try:
        process.wait(timeout_s)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(timeout_s)


@contextlib.contextmanager
def serving(
    env: dict[str, str],
    port: int,
    *,
    workers: int | None = None,
    cwd: Path = ROOT,
    ready_path: str = "/readyz",
) -> Iterator[subprocess.Popen[bytes]]:
    """A started server that answers ``ready_path``; stopped on leaving."""
    process = start(env, port, workers=workers, cwd=cwd)
    try:
        wait_ready(process, port, ready_path)
        yield process
    finally:
        stop(process)


@contextlib.contextmanager
def sqlite_served(root: Path = ROOT, **settings: str) -> Iterator[tuple[int, int]]:
    """``capplan-server serve`` of checkout ``root`` on a migrated SQLite database in a
    temporary folder, logging errors only, once ``/healthz`` answers: (pid, port)."""
    with tempfile.TemporaryDirectory(prefix="capplan-bench-") as work:
        env = service_env(CAPPLAN_DATABASE_URL=f"sqlite:///{work}/capplan.db",
                          CAPPLAN_LOG_LEVEL="ERROR", **settings)  # fmt: skip
        prepare(env, ["migrate"], cwd=root)
        port = free_port()
        with serving(env, port, cwd=root, ready_path="/healthz") as process:
            yield process.pid, port


@contextlib.contextmanager
def synced_sessions() -> Iterator[sessionmaker[Session]]:
    """Sessions on a fresh SQLite database in a temporary folder: migrated, the hardware catalog
    and the model zoo synced; then ``gc.collect(); gc.freeze()``, as ``app.main``'s lifespan does
    before serving, so full collections do not scan the modules, catalog and zoo. The engine is
    disposed and the folder removed on leaving. (The app is imported here, not at the top, so
    that the server benchmarks do not load it.)"""
    from app.config import PROJECT_ROOT
    from app.db.migrations import upgrade_to_head
    from app.db.session import make_engine, make_session_factory
    from app.services.catalog import load_catalog, sync_catalog
    from app.services.zoo import sync_zoo

    with tempfile.TemporaryDirectory(prefix="capplan-bench-") as folder:
        url = f"sqlite:///{Path(folder) / 'bench.db'}"
        upgrade_to_head(url)
        engine = make_engine(url)
        try:
            sessions = make_session_factory(engine)
            with sessions() as session:
                sync_catalog(session, load_catalog(PROJECT_ROOT / "hardware_catalog"))
                sync_zoo(session)
            gc.collect()
            gc.freeze()
            yield sessions
        finally:
            engine.dispose()


def add_backend_arguments(parser: argparse.ArgumentParser) -> None:
    """``--backends`` (sqlite,postgresql) and ``--postgres-url`` for :func:`database`."""
    parser.add_argument("--backends", default="sqlite,postgresql", help="comma-separated")
    parser.add_argument("--postgres-url", default=os.environ.get("TEST_DATABASE_URL"))


def _tree(root: int) -> Iterator[tuple[str, list[str]]]:
    """(pid, /proc/<pid>/stat fields after the command name) of ``root`` and its children."""
    for pid in (p for p in os.listdir("/proc") if p.isdigit()):
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(pid) == root or int(fields[1]) == root:  # fields[1]: parent pid
            yield pid, fields


def tree_cpu_s(root: int) -> float | None:
    """User + system CPU seconds of process ``root`` and its children (Linux /proc), or None."""
    ticks = os.sysconf("SC_CLK_TCK")
    try:
        # fields 11 and 12: utime and stime
        return sum((int(fields[11]) + int(fields[12])) / ticks for _, fields in _tree(root))
    except OSError:
        return None


def tree_rss_bytes(root: int) -> int:
    """Resident memory (VmRSS) of process ``root`` and its children (Linux /proc), bytes."""
    total = 0
    for pid, _ in _tree(root):
        with contextlib.suppress(OSError, ValueError, IndexError):
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1]) * 1024
    return total
