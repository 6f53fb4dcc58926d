"""Expand-then-contract: which schemas this code serves (`/readyz`, `capplan-server migrate`),
and that every migration keeps the previous release's code working."""

from collections.abc import Callable, Iterator
from contextlib import contextmanager

import pytest
import sqlalchemy as sa
from alembic import command
from alembic.migration import MigrationContext
from alembic.operations import Operations
from alembic.script import ScriptDirectory
from sqlalchemy import Connection, MetaData

from app import cli
from app.config import get_settings
from app.db.migrations import alembic_config, head_revisions, schema_check, upgrade_to_head
from app.db.schema_compat import structural_problems
from app.db.session import make_engine
from tests.api.helpers import assert_problem, hardware
from tests.support import ClientFactory

FUTURE = "9999_a_later_release"


@contextmanager
def _connection(db_url: str) -> Iterator[Connection]:
    engine = make_engine(db_url)
    try:
        with engine.begin() as connection:
            yield connection
    finally:
        engine.dispose()


def _later_release(db_url: str, change: Callable[[Operations], None]) -> None:
    """What a later release's migration would do: ``change`` the schema and stamp a revision
    this code does not ship."""
    with _connection(db_url) as connection:
        change(Operations(MigrationContext.configure(connection)))
        connection.execute(sa.text("UPDATE alembic_version SET version_num = :v"), {"v": FUTURE})


def _expand(ops: Operations) -> None:
    with ops.batch_alter_table("hardware") as batch:
        batch.add_column(sa.Column("rack_units", sa.Integer(), nullable=True))
        batch.add_column(sa.Column("cooling", sa.String(16), nullable=False, server_default="air"))
    ops.create_table("hardware_note", sa.Column("id", sa.Integer(), primary_key=True))


def test_at_head_the_schema_is_current(db_url: str) -> None:
    with _connection(db_url) as connection:
        check = schema_check(connection)
    assert check.status == "current"
    assert check.ready
    assert set(check.database_revisions) == head_revisions()
    assert check.problems == ()


def test_a_later_release_that_only_expands_keeps_this_code_ready_and_serving(
    db_url: str, make_client: ClientFactory
) -> None:
    """Rollback (this code on the next release's schema) and the old pods of a rolling upgrade:
    new nullable / defaulted columns and new tables do not stop reads or writes."""
    _later_release(db_url, _expand)
    client = make_client()
    body = client.get("/readyz").json()
    assert body["status"] == "ready"
    assert body["schema_status"] == "newer"
    assert body["migration"] == [FUTURE]
    assert body["code_revision"] == sorted(head_revisions())
    assert client.get("/v1/hardware/nvidia-h100-sxm").json()["sm_count"] == 132
    created = client.post("/v1/hardware", json=hardware(slug="written-by-old-code"))
    assert created.status_code == 201, created.text
    with _connection(db_url) as connection:
        cooling = connection.execute(
            sa.text("SELECT cooling FROM hardware WHERE slug = 'written-by-old-code'")
        ).scalar_one()
    assert cooling == "air"
    recommended = client.post(
        "/v1/recommendations/inference", json={"model": "resnet-50", "latency_slo_ms": 20}
    )
    assert recommended.status_code == 200
    assert recommended.json()["eligible_candidates"] > 0


@pytest.mark.parametrize(
    ("change", "named"),
    [
        pytest.param(
            lambda ops: _batch_drop(ops),
            "column hardware.sm_count is missing",
            id="contract-too-early",
        ),
        pytest.param(
            lambda ops: _batch_add_required(ops),
            "column workload.priority is NOT NULL without a server default",
            id="not-null-without-default",
        ),
    ],
)
def test_a_later_release_this_code_cannot_use_is_not_ready_and_says_why(
    db_url: str, make_client: ClientFactory, change: Callable[[Operations], None], named: str
) -> None:
    _later_release(db_url, change)
    body = assert_problem(make_client().get("/readyz"), 503, "not-ready")
    assert named in body["detail"]
    assert FUTURE in body["detail"]


def _batch_drop(ops: Operations) -> None:
    with ops.batch_alter_table("hardware") as batch:
        batch.drop_column("sm_count")


def _batch_add_required(ops: Operations) -> None:
    # workload is empty in a fresh database, so the column can be added without a default.
    with ops.batch_alter_table("workload") as batch:
        batch.add_column(sa.Column("priority", sa.Integer(), nullable=False))


def test_a_schema_behind_the_code_is_not_ready(db_url: str, make_client: ClientFactory) -> None:
    command.downgrade(alembic_config(db_url), "0005")
    body = assert_problem(make_client().get("/readyz"), 503, "not-ready")
    assert "behind this code's head" in body["detail"]
    assert "capplan-server migrate" in body["detail"]


def test_migrate_leaves_a_newer_compatible_schema_alone(
    db_url: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`kubectl rollout undo` starts the previous release, whose `migrate` meets a revision it
    does not ship; Alembic alone would fail ("Can't locate revision")."""
    _later_release(db_url, _expand)
    check = upgrade_to_head(db_url)
    assert check.status == "newer"
    monkeypatch.setenv("CAPPLAN_DATABASE_URL", db_url)
    get_settings.cache_clear()
    try:
        assert cli.main(["migrate"]) == 0
    finally:
        get_settings.cache_clear()
    assert "newer than this code's head" in capsys.readouterr().out
    with _connection(db_url) as connection:
        assert schema_check(connection).database_revisions == (FUTURE,)


def test_migrate_refuses_a_newer_schema_it_cannot_use(
    db_url: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _later_release(db_url, _batch_drop)
    with pytest.raises(RuntimeError, match=r"hardware\.sm_count is missing"):
        upgrade_to_head(db_url)
    monkeypatch.setenv("CAPPLAN_DATABASE_URL", db_url)
    get_settings.cache_clear()
    try:
        assert cli.main(["migrate"]) == 1
    finally:
        get_settings.cache_clear()
    assert "hardware.sm_count is missing" in capsys.readouterr().err


def _revisions_in_order() -> list[tuple[str, str | None, object]]:
    script = ScriptDirectory.from_config(alembic_config())
    revisions = [
        (r.revision, r.down_revision, r.module) for r in script.walk_revisions("base", "heads")
    ]
    revisions.reverse()
    return revisions  # type: ignore[return-value]


def test_every_migration_keeps_the_previous_revisions_schema_usable(db_url: str) -> None:
    """The expand rule, checked on each revision (this is what makes the previous release ready
    on the new schema): the schema before it, as the code of that time mapped it, must still be
    usable after it. A revision that contracts must say so in ``contracts`` (and ship in a
    release after the one that stopped using what it drops: test_previous_release.py runs
    that release's code on the result)."""
    config = alembic_config(db_url)
    command.downgrade(config, "base")
    breaking = {}
    try:
        for revision, down, module in _revisions_in_order():
            reason = getattr(module, "contracts", None)
            if down is None:
                command.upgrade(config, revision)
                continue
            with _connection(db_url) as connection:
                before = MetaData()
                before.reflect(connection)
            command.upgrade(config, revision)
            with _connection(db_url) as connection:
                problems = structural_problems(connection, before)
            if reason is not None:
                breaking[revision] = reason
                continue
            assert problems == [], (
                f"migration {revision} is not expand-only: the previous release could not use "
                f"its schema ({problems}); split it (expand now, contract in a later release) or "
                "declare what it contracts in `contracts`"
            )
    finally:
        command.upgrade(config, "head")
    # 0002 (written before this rule) contracts, and says so; a declaration says what and why.
    assert "0002" in breaking
    assert all(isinstance(reason, str) and len(reason) > 20 for reason in breaking.values())


def test_catalog_sync_refuses_a_schema_it_cannot_use_and_runs_on_a_newer_one(
    db_url: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """After `kubectl rollout undo` the previous release's init container syncs its catalog into
    the newer schema; on a schema behind it, it says to migrate instead of failing in SQL."""
    monkeypatch.setenv("CAPPLAN_DATABASE_URL", db_url)
    get_settings.cache_clear()
    try:
        command.downgrade(alembic_config(db_url), "0005")
        assert cli.main(["catalog-sync"]) == 1
        assert "behind this code's head" in capsys.readouterr().err
        command.upgrade(alembic_config(db_url), "head")
        _later_release(db_url, _expand)
        assert cli.main(["catalog-sync"]) == 0
        assert "catalog sync: created 0" in capsys.readouterr().out
    finally:
        get_settings.cache_clear()
