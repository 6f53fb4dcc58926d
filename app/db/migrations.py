"""Run Alembic migrations and report whether a database is at head."""

from __future__ import annotations

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Connection, Engine

from app.config import PROJECT_ROOT


def alembic_config(url: str | None = None) -> Config:
    """The project's Alembic config, optionally pointed at ``url``."""
    config = Config(str(PROJECT_ROOT / "alembic.ini"))
    config.set_main_option("script_location", str(PROJECT_ROOT / "migrations"))
    config.attributes["configure_logging"] = False
    if url is not None:
        config.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    return config


def upgrade_to_head(url: str) -> None:
    """Apply every pending migration to the database at ``url``."""
    command.upgrade(alembic_config(url), "head")


def head_revisions() -> set[str]:
    """Revisions the code expects."""
    return set(ScriptDirectory.from_config(alembic_config()).get_heads())


def current_revisions(bind: Engine | Connection) -> set[str]:
    """Revisions the database is at (empty when it was never migrated)."""
    if isinstance(bind, Connection):
        return set(MigrationContext.configure(bind).get_current_heads())
    with bind.connect() as connection:
        return set(MigrationContext.configure(connection).get_current_heads())
