"""Revision 0009 (workload.hardware_slice): expand-only. A workload's MIG slice comes and goes
with the column, the workload itself stays, and a slice the previous release left behind when
it rewrote the hardware is not applied to the new hardware."""

import sqlalchemy as sa
from alembic import command
from sqlalchemy import inspect

from app.db.migrations import alembic_config
from app.db.session import make_engine
from tests.api.test_workloads import SLICE, workload
from tests.support import ClientFactory


def _columns(engine: sa.Engine) -> set[str]:
    inspect(engine).clear_cache()
    return {column["name"] for column in inspect(engine).get_columns("workload")}


def test_the_slice_column_comes_and_goes_and_keeps_the_workloads(
    make_client: ClientFactory, db_url: str
) -> None:
    client = make_client()
    assert client.post("/v1/workloads", json=workload(hardware=SLICE)).status_code == 201
    config = alembic_config(db_url)
    engine = make_engine(db_url)
    try:
        command.downgrade(config, "0008")
        assert "hardware_slice" not in _columns(engine)
        with engine.connect() as connection:
            rows = connection.execute(
                sa.text(
                    "SELECT w.slug, h.slug FROM workload w JOIN hardware h ON h.id = w.hardware_id"
                )
            ).all()
        assert [tuple(row) for row in rows] == [("chat-serving", "nvidia-a100-80gb-sxm")]
        command.upgrade(config, "head")  # 0009 and every later revision: this code's schema
        assert "hardware_slice" in _columns(engine)
    finally:
        engine.dispose()
    # The slice was dropped with the column: the workload targets its whole GPU again.
    client = make_client()
    assert client.get("/v1/workloads/chat-serving").json()["hardware"] == "nvidia-a100-80gb-sxm"
    fit = client.get("/v1/workloads/chat-serving/memory").json()["fit"]
    assert fit["hardware"] == "nvidia-a100-80gb-sxm"


def test_a_slice_is_ignored_once_the_previous_release_rewrote_the_hardware(
    make_client: ClientFactory, db_url: str
) -> None:
    """The previous release's PUT changes `hardware_id` and leaves the column it does not know:
    the stored slice names another GPU then, and the workload targets its new whole device."""
    client = make_client()
    assert client.post("/v1/workloads", json=workload(hardware=SLICE)).status_code == 201
    engine = make_engine(db_url)
    try:
        with engine.begin() as connection:
            connection.execute(
                sa.text(
                    "UPDATE workload SET hardware_id ="
                    " (SELECT id FROM hardware WHERE slug = 'nvidia-h100-sxm'),"
                    " version = version + 1 WHERE slug = 'chat-serving'"
                )
            )
            stored = connection.execute(
                sa.text("SELECT hardware_slice FROM workload WHERE slug = 'chat-serving'")
            ).scalar_one()
    finally:
        engine.dispose()
    assert stored == SLICE
    assert client.get("/v1/workloads/chat-serving").json()["hardware"] == "nvidia-h100-sxm"
    fit = client.get("/v1/workloads/chat-serving/memory").json()["fit"]
    assert fit["hardware"] == "nvidia-h100-sxm"
