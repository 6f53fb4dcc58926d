from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import inspect

from app.db.base import Base
from app.db.migrations import alembic_config, current_revisions, head_revisions
from app.db.session import make_engine
from tests.support import TABLES


def test_database_is_at_head_with_every_table(db_url: str) -> None:
    engine = make_engine(db_url)
    try:
        assert current_revisions(engine) == head_revisions()
        assert set(TABLES) <= set(inspect(engine).get_table_names())
    finally:
        engine.dispose()


def test_models_match_the_migrations(db_url: str) -> None:
    """Autogenerate finds nothing to do: the ORM and the migrations agree."""
    engine = make_engine(db_url)
    try:
        with engine.connect() as connection:
            diff = compare_metadata(MigrationContext.configure(connection), Base.metadata)
        assert diff == []
    finally:
        engine.dispose()


def test_downgrade_to_base_and_upgrade_again(db_url: str) -> None:
    config = alembic_config(db_url)
    engine = make_engine(db_url)
    try:
        command.downgrade(config, "base")
        assert current_revisions(engine) == set()
        assert not set(TABLES) & set(inspect(engine).get_table_names())
        command.upgrade(config, "head")
        assert current_revisions(engine) == head_revisions()
    finally:
        engine.dispose()
