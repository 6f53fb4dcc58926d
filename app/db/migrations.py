"""Run Alembic migrations and say whether this code can serve a database's schema."""

from __future__ import annotations

from functools import lru_cache

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Connection, Engine

from app.config import PROJECT_ROOT
from app.db import models  # noqa: F401  (registers the tables on Base.metadata)
from app.db.base import Base
from app.db.schema_compat import SchemaCheck, check_schema
from app.db.session import make_engine


def alembic_config(url: str | None = None) -> Config:
    """The project's Alembic config, optionally pointed at ``url``."""
    config = Config(str(PROJECT_ROOT / "alembic.ini"))
    config.set_main_option("script_location", str(PROJECT_ROOT / "migrations"))
    config.attributes["configure_logging"] = False
    if url is not None:
        config.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    return config


def upgrade_to_head(url: str) -> SchemaCheck:
    """Apply every pending migration to the database at ``url``.

    A database already migrated by a *later* release (a revision this code does not ship: a
    rollback, or old pods starting during a rolling upgrade) is left as it is when this code
    can use it; Alembic itself would refuse the unknown revision. Raises ``RuntimeError`` when
    it cannot use it. Returns the verdict on the schema it leaves.
    """
    engine = make_engine(url)
    try:
        with engine.connect() as connection:
            before = schema_check(connection)
        if not set(before.database_revisions) <= known_revisions():
            if before.ready:
                return before
            raise RuntimeError(before.describe())
        command.upgrade(alembic_config(url), "head")
        with engine.connect() as connection:
            return schema_check(connection)
    finally:
        engine.dispose()


@lru_cache(maxsize=1)
def _script_revisions() -> tuple[frozenset[str], frozenset[str]]:
    script = ScriptDirectory.from_config(alembic_config())
    heads = frozenset(script.get_heads())
    known = frozenset(revision.revision for revision in script.walk_revisions())
    return heads, known


def head_revisions() -> set[str]:
    """Revisions the code expects."""
    return set(_script_revisions()[0])


def known_revisions() -> frozenset[str]:
    """Every revision this code ships (its head and all before it)."""
    return _script_revisions()[1]


def schema_check(connection: Connection) -> SchemaCheck:
    """Whether this code can serve the database behind ``connection`` (see
    ``app.db.schema_compat``)."""
    heads, known = _script_revisions()
    return check_schema(connection, Base.metadata, code_heads=heads, known_revisions=known)


def current_revisions(bind: Engine | Connection) -> set[str]:
    """Revisions the database is at (empty when it was never migrated)."""
    if isinstance(bind, Connection):
        return set(MigrationContext.configure(bind).get_current_heads())
    with bind.connect() as connection:
        return set(MigrationContext.configure(connection).get_current_heads())
