"""Engine and session factory."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session, sessionmaker


@dataclass(frozen=True, slots=True)
class PoolOptions:
    """How a serving process talks to its database (values: the `CAPPLAN_DB_*` settings).

    ``pool_size`` connections are kept and never exceeded; a checkout waits at most
    ``checkout_timeout_s``. On PostgreSQL, connecting gives up after ``connect_timeout_s``,
    the server cancels statements after ``statement_timeout_s``, and TCP keepalives notice a
    peer that vanished from the network.
    """

    pool_size: int
    checkout_timeout_s: float
    connect_timeout_s: int
    statement_timeout_s: float


def _enable_sqlite_foreign_keys(dbapi_connection: Any, _record: Any) -> None:
    cursor = dbapi_connection.cursor()
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.close()


def make_engine(url: str, pool: PoolOptions | None = None) -> Engine:
    """Create an engine; SQLite gets foreign keys on and a parent directory.

    Without ``pool`` (migrations, scripts) statements have no time limit; the service passes
    its settings.
    """
    parsed = make_url(url)
    kwargs: dict[str, Any] = {}
    if pool is not None:
        kwargs = {
            "pool_size": pool.pool_size,
            "max_overflow": 0,
            "pool_timeout": pool.checkout_timeout_s,
        }
    if parsed.get_backend_name() == "sqlite":
        database = parsed.database
        in_memory = not database or database == ":memory:"
        if not in_memory:
            Path(str(database)).parent.mkdir(parents=True, exist_ok=True)
        connect_args: dict[str, Any] = {"check_same_thread": False}
        if pool is not None:
            # How long SQLite waits on another connection's write lock.
            connect_args["timeout"] = pool.statement_timeout_s
        if in_memory:
            kwargs = {}  # an in-memory database lives in one connection (StaticPool-like)
        engine = create_engine(url, connect_args=connect_args, **kwargs)
        event.listen(engine, "connect", _enable_sqlite_foreign_keys)
        return engine
    if parsed.get_backend_name() == "postgresql" and pool is not None:
        kwargs["connect_args"] = {
            "connect_timeout": pool.connect_timeout_s,
            "options": f"-c statement_timeout={int(pool.statement_timeout_s * 1000)}",
            "keepalives": 1,
            "keepalives_idle": 10,
            "keepalives_interval": 3,
            "keepalives_count": 3,
        }
    return create_engine(url, pool_pre_ping=pool is None, **kwargs)


def make_session_factory(engine: Engine) -> sessionmaker[Session]:
    """A session factory that keeps loaded objects usable after commit."""
    return sessionmaker(bind=engine, expire_on_commit=False)
