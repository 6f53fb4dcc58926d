from datetime import UTC, datetime

from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import Table, inspect, select

from app.db.base import Base
from app.db.migrations import alembic_config, current_revisions, head_revisions
from app.db.models import ModelArchitecture
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


def test_upgrade_strips_fused_from_stored_attention_layers(db_url: str) -> None:
    """0003: a graph stored with ``fused`` (how attention was computed) loses the attribute;
    the implementation is a request option now."""
    config = alembic_config(db_url)
    engine = make_engine(db_url)
    table = ModelArchitecture.__table__
    assert isinstance(table, Table)
    layers = [
        {"name": "attn", "op": "attention", "num_heads": 2, "fused": True},
        {
            "name": "blocks",
            "op": "repeat",
            "count": 2,
            "layers": [{"name": "a", "op": "attention", "num_heads": 2, "fused": False}],
        },
        {"name": "fc", "op": "linear", "out_features": 4},
    ]
    try:
        command.downgrade(config, "0002")
        now = datetime.now(UTC)
        with engine.begin() as connection:
            connection.execute(
                table.insert().values(
                    version=1,
                    slug="legacy-fused",
                    name="legacy",
                    family="test",
                    provenance="user",
                    inputs=[{"name": "x", "shape": ["batch", 4, 8]}],
                    layers=layers,
                    default_bindings={},
                    created_at=now,
                    updated_at=now,
                )
            )
        command.upgrade(config, "head")
        with engine.begin() as connection:
            stored, version = connection.execute(
                select(table.c.layers, table.c.version).where(table.c.slug == "legacy-fused")
            ).one()
            connection.execute(table.delete().where(table.c.slug == "legacy-fused"))
        assert stored == [
            {"name": "attn", "op": "attention", "num_heads": 2},
            {
                "name": "blocks",
                "op": "repeat",
                "count": 2,
                "layers": [{"name": "a", "op": "attention", "num_heads": 2}],
            },
            {"name": "fc", "op": "linear", "out_features": 4},
        ]
        assert version == 2
    finally:
        command.upgrade(config, "head")
        engine.dispose()
