"""Revision 0008 (admission_decision): expand-only, and it comes and goes without touching the
rows the previous release reads."""

import sqlalchemy as sa
from alembic import command
from sqlalchemy import inspect, select

from app.db.migrations import alembic_config
from app.db.models import Workload
from app.db.session import make_engine
from tests.api.test_admission import CHAT
from tests.support import ClientFactory, db_session


def test_the_decision_table_comes_and_goes_and_keeps_the_workloads(
    make_client: ClientFactory, db_url: str
) -> None:
    client = make_client()
    assert client.post("/v1/workloads", json=CHAT).status_code == 201
    config = alembic_config(db_url)
    engine = make_engine(db_url)
    try:
        command.downgrade(config, "0007")
        assert "admission_decision" not in inspect(engine).get_table_names()
        with db_session(db_url) as session:
            assert session.scalars(select(Workload.slug)).all() == ["chat"]
        command.upgrade(config, "0008")
        inspect(engine).clear_cache()
        assert "admission_decision" in inspect(engine).get_table_names()
        with engine.connect() as connection:
            # Rows stored before the revision have no decisions: the refresher computes them.
            count = connection.scalar(sa.text("SELECT count(*) FROM admission_decision"))
            assert count == 0
    finally:
        engine.dispose()
