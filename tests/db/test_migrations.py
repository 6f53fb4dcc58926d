from datetime import UTC, date, datetime

import pytest
import sqlalchemy as sa
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import Table, inspect, select
from sqlalchemy.exc import IntegrityError

from app.db.base import Base
from app.db.migrations import alembic_config, current_revisions, head_revisions
from app.db.models import Hardware, MigProfile, ModelArchitecture
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


def test_prices_get_their_kind_columns_and_keep_the_price(db_url: str) -> None:
    """0004: a price stored before prices carried a kind keeps its figure with kind NULL
    (unknown: never ranked by cost); the database refuses an unknown kind; downgrading drops
    the four columns and keeps the price."""
    config = alembic_config(db_url)
    engine = make_engine(db_url)
    json_columns = {"peak_flops_per_s", "peak_sparse_flops_per_s", "unconfirmed", "sources"}
    legacy = sa.table(
        "hardware",
        *(
            sa.column(name, sa.JSON() if name in json_columns else None)
            for name in LEGACY_HARDWARE
            if name not in ("created_at", "updated_at")
        ),
        sa.column("created_at", sa.DateTime(timezone=True)),
        sa.column("updated_at", sa.DateTime(timezone=True)),
    )
    try:
        command.downgrade(config, "0003")
        assert "price_kind" not in {c["name"] for c in inspect(engine).get_columns("hardware")}
        with engine.begin() as connection:
            connection.execute(legacy.insert().values(**LEGACY_HARDWARE))
        command.upgrade(config, "head")
        columns = {c["name"] for c in inspect(engine).get_columns("hardware")}
        assert {"price_kind", "price_region", "price_date", "price_source"} <= columns
        table = Hardware.__table__
        assert isinstance(table, Table)
        where = table.c.slug == "legacy-priced"
        with engine.begin() as connection:
            row = connection.execute(
                select(table.c.price_usd_per_hour, table.c.price_kind, table.c.price_date).where(
                    where
                )
            ).one()
            assert tuple(row) == (2.5, None, None)
            connection.execute(
                table.update()
                .where(where)
                .values(price_kind="reserved", price_date=date(2026, 1, 2), price_region="x")
            )
            assert connection.execute(select(table.c.price_date).where(where)).scalar_one() == (
                date(2026, 1, 2)
            )
        with pytest.raises(IntegrityError), engine.begin() as connection:
            connection.execute(table.update().where(where).values(price_kind="list"))
        command.downgrade(config, "0003")
        assert "price_kind" not in {c["name"] for c in inspect(engine).get_columns("hardware")}
        with engine.begin() as connection:
            price = connection.execute(
                sa.select(legacy.c.price_usd_per_hour).where(legacy.c.slug == "legacy-priced")
            ).scalar_one()
            connection.execute(legacy.delete().where(legacy.c.slug == "legacy-priced"))
        assert price == 2.5
    finally:
        command.upgrade(config, "head")
        engine.dispose()


def test_gpu_link_columns_come_and_go(db_url: str) -> None:
    """0005: rows stored before it have no GPU link (NULL: peers over the host link);
    downgrading drops the two columns and keeps the row."""
    config = alembic_config(db_url)
    engine = make_engine(db_url)
    table = Hardware.__table__
    assert isinstance(table, Table)
    try:
        command.downgrade(config, "0004")
        assert "gpu_link_type" not in {c["name"] for c in inspect(engine).get_columns("hardware")}
        command.upgrade(config, "head")
        columns = {c["name"] for c in inspect(engine).get_columns("hardware")}
        assert {"gpu_link_type", "gpu_link_bandwidth_bytes_per_s"} <= columns
        with engine.begin() as connection:
            links = connection.execute(
                select(table.c.gpu_link_type, table.c.gpu_link_bandwidth_bytes_per_s)
            ).all()
        assert all(tuple(link) == (None, None) for link in links)  # unsynced rows: none yet
        command.downgrade(config, "0004")
        assert "gpu_link_type" not in {c["name"] for c in inspect(engine).get_columns("hardware")}
    finally:
        command.upgrade(config, "head")
        engine.dispose()


_NOW = datetime(2026, 11, 24, tzinfo=UTC)
LEGACY_HARDWARE = {
    "version": 1,
    "slug": "legacy-priced",
    "vendor": "Acme",
    "name": "Old GPU",
    "kind": "gpu",
    "memory_bytes": 2**34,
    "memory_bandwidth_bytes_per_s": 10**12,
    "peak_flops_per_s": {"fp32": 1e13},
    "peak_sparse_flops_per_s": {},
    "host_link_type": "PCIe Gen4 x16",
    "price_usd_per_hour": 2.5,
    "unconfirmed": [],
    "sources": ["test"],
    "source": "user",
    "created_at": _NOW,
    "updated_at": _NOW,
}


def test_sm_count_column_comes_and_goes_and_keeps_the_row(db_url: str) -> None:
    """0006: a row stored before it has no SM count (NULL: no wave quantization) and can be
    given one; downgrading drops the column and keeps the row."""
    config = alembic_config(db_url)
    engine = make_engine(db_url)
    json_columns = {"peak_flops_per_s", "peak_sparse_flops_per_s", "unconfirmed", "sources"}
    legacy_row = {**LEGACY_HARDWARE, "slug": "legacy-sm", "price_kind": "on_demand"}
    legacy = sa.table(
        "hardware",
        *(
            sa.column(name, sa.JSON() if name in json_columns else None)
            for name in legacy_row
            if name not in ("created_at", "updated_at")
        ),
        sa.column("created_at", sa.DateTime(timezone=True)),
        sa.column("updated_at", sa.DateTime(timezone=True)),
    )
    table = Hardware.__table__
    assert isinstance(table, Table)
    try:
        command.downgrade(config, "0005")
        assert "sm_count" not in {c["name"] for c in inspect(engine).get_columns("hardware")}
        with engine.begin() as connection:
            connection.execute(legacy.insert().values(**legacy_row))
        command.upgrade(config, "head")
        assert "sm_count" in {c["name"] for c in inspect(engine).get_columns("hardware")}
        where = table.c.slug == "legacy-sm"
        with engine.begin() as connection:
            assert connection.execute(select(table.c.sm_count).where(where)).scalar_one() is None
            connection.execute(table.update().where(where).values(sm_count=108))
            assert connection.execute(select(table.c.sm_count).where(where)).scalar_one() == 108
        command.downgrade(config, "0005")
        assert "sm_count" not in {c["name"] for c in inspect(engine).get_columns("hardware")}
        with engine.begin() as connection:
            price = connection.execute(
                sa.select(legacy.c.price_usd_per_hour).where(legacy.c.slug == "legacy-sm")
            ).scalar_one()
            connection.execute(legacy.delete().where(legacy.c.slug == "legacy-sm"))
        assert price == 2.5
    finally:
        command.upgrade(config, "head")
        engine.dispose()


def test_mig_profile_sm_count_column_comes_and_goes_and_keeps_the_profile(db_url: str) -> None:
    """0006: a MIG profile stored before it has no SM count (NULL: its slice gets the GPU's
    proportional share) and can be given one; downgrading drops the column and keeps the
    profile."""
    config = alembic_config(db_url)
    engine = make_engine(db_url)
    json_columns = {"peak_flops_per_s", "peak_sparse_flops_per_s", "unconfirmed", "sources"}
    legacy_row = {**LEGACY_HARDWARE, "slug": "legacy-mig", "price_kind": "on_demand"}
    legacy = sa.table(
        "hardware",
        sa.column("id"),
        *(
            sa.column(name, sa.JSON() if name in json_columns else None)
            for name in legacy_row
            if name not in ("created_at", "updated_at")
        ),
        sa.column("created_at", sa.DateTime(timezone=True)),
        sa.column("updated_at", sa.DateTime(timezone=True)),
    )
    legacy_profile = {
        "position": 0,
        "name": "1g.10gb",
        "memory_mib": 9728,
        "compute_slices": 1,
        "memory_slices": 1,
        "max_instances": 7,
        "placements": [0, 1, 2, 3, 4, 5, 6],
        "unconfirmed": [],
    }
    legacy_profiles = sa.table(
        "mig_profile",
        sa.column("hardware_id"),
        *(
            sa.column(name, sa.JSON() if name in ("placements", "unconfirmed") else None)
            for name in legacy_profile
        ),
    )
    table = MigProfile.__table__
    assert isinstance(table, Table)
    try:
        command.downgrade(config, "0005")
        assert "sm_count" not in {c["name"] for c in inspect(engine).get_columns("mig_profile")}
        with engine.begin() as connection:
            connection.execute(legacy.insert().values(**legacy_row))
            hardware_id = connection.execute(
                select(legacy.c.id).where(legacy.c.slug == "legacy-mig")
            ).scalar_one()
            connection.execute(
                legacy_profiles.insert().values(hardware_id=hardware_id, **legacy_profile)
            )
        command.upgrade(config, "head")
        assert "sm_count" in {c["name"] for c in inspect(engine).get_columns("mig_profile")}
        where = table.c.hardware_id == hardware_id
        with engine.begin() as connection:
            assert connection.execute(select(table.c.sm_count).where(where)).scalar_one() is None
            connection.execute(table.update().where(where).values(sm_count=14))
            assert connection.execute(select(table.c.sm_count).where(where)).scalar_one() == 14
        command.downgrade(config, "0005")
        assert "sm_count" not in {c["name"] for c in inspect(engine).get_columns("mig_profile")}
        with engine.begin() as connection:
            kept = connection.execute(
                select(legacy_profiles.c.name, legacy_profiles.c.memory_mib).where(
                    legacy_profiles.c.hardware_id == hardware_id
                )
            ).one()
            connection.execute(legacy.delete().where(legacy.c.slug == "legacy-mig"))
        assert tuple(kept) == ("1g.10gb", 9728)
    finally:
        command.upgrade(config, "head")
        engine.dispose()


def test_compute_capability_column_comes_and_goes_and_keeps_the_row(db_url: str) -> None:
    """0007 (expand-only): a row stored before it has no compute capability (NULL: the defaults
    assume an Ampere-or-newer GPU, as before) and can be given one; downgrading drops the column
    and keeps the row."""
    config = alembic_config(db_url)
    engine = make_engine(db_url)
    json_columns = {"peak_flops_per_s", "peak_sparse_flops_per_s", "unconfirmed", "sources"}
    legacy_row = {**LEGACY_HARDWARE, "slug": "legacy-cc", "price_kind": "on_demand"}
    legacy = sa.table(
        "hardware",
        *(
            sa.column(name, sa.JSON() if name in json_columns else None)
            for name in legacy_row
            if name not in ("created_at", "updated_at")
        ),
        sa.column("created_at", sa.DateTime(timezone=True)),
        sa.column("updated_at", sa.DateTime(timezone=True)),
    )
    table = Hardware.__table__
    assert isinstance(table, Table)

    def columns() -> set[str]:
        return {c["name"] for c in inspect(engine).get_columns("hardware")}

    try:
        command.downgrade(config, "0006")
        assert "compute_capability" not in columns()
        assert "sm_count" in columns()  # only this revision's column went
        with engine.begin() as connection:
            connection.execute(legacy.insert().values(**legacy_row))
        command.upgrade(config, "head")
        assert "compute_capability" in columns()
        where = table.c.slug == "legacy-cc"
        with engine.begin() as connection:
            read = select(table.c.compute_capability).where(where)
            assert connection.execute(read).scalar_one() is None
            connection.execute(table.update().where(where).values(compute_capability="7.5"))
            assert connection.execute(read).scalar_one() == "7.5"
        command.downgrade(config, "0006")
        assert "compute_capability" not in columns()
        with engine.begin() as connection:
            price = connection.execute(
                sa.select(legacy.c.price_usd_per_hour).where(legacy.c.slug == "legacy-cc")
            ).scalar_one()
            connection.execute(legacy.delete().where(legacy.c.slug == "legacy-cc"))
        assert price == 2.5
    finally:
        command.upgrade(config, "head")
        engine.dispose()
