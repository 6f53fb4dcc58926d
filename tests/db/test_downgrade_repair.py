"""catalog-sync after `alembic downgrade` and upgrade again: the catalog rows' content digest
survives the downgrade, the dropped columns come back empty, and the sync must notice."""

import re
from typing import Any

import pytest
from alembic import command
from sqlalchemy import select

from app.cli import main
from app.config import get_settings
from app.db.migrations import alembic_config
from app.db.models import Hardware, ModelArchitecture
from app.schemas.hardware import HardwareCreate
from app.services.catalog import drifted_fields, load_catalog, sync_catalog
from app.services.hardware import create_hardware
from app.services.zoo import sync_zoo
from tests.api.helpers import hardware
from tests.support import CATALOG_DIR, ClientFactory, db_session

RECOMMEND = "/v1/recommendations/inference"


def _bounce(db_url: str, revision: str) -> None:
    config = alembic_config(db_url)
    command.downgrade(config, revision)
    command.upgrade(config, "head")


def _h100(db_url: str) -> dict[str, Any]:
    with db_session(db_url) as session:
        row = session.scalars(select(Hardware).where(Hardware.slug == "nvidia-h100-sxm")).one()
        return {
            "sm_count": row.sm_count,
            "gpu_link_type": row.gpu_link_type,
            "gpu_link_bandwidth_bytes_per_s": row.gpu_link_bandwidth_bytes_per_s,
            "price_kind": row.price_kind,
            "mig_sm_counts": sorted((p.name, p.sm_count) for p in row.mig_profiles),
            "version": row.version,
        }


def _price_kinds(db_url: str) -> dict[str, str | None]:
    with db_session(db_url) as session:
        rows = session.scalars(select(Hardware).where(Hardware.price_usd_per_hour.is_not(None)))
        return {row.slug: row.price_kind for row in rows if row.source == "catalog"}


def _eligible(make_client: ClientFactory) -> tuple[int, int]:
    # A new app each time: what a restarted pod would answer.
    client = make_client()
    response = client.post(RECOMMEND, json={"model": "resnet-50", "latency_slo_ms": 20})
    assert response.status_code == 200, response.text
    body = response.json()
    return body["eligible_candidates"], body["total_candidates"]


@pytest.mark.parametrize("revision", ["0003", "0005"])
def test_sync_repairs_what_a_downgrade_dropped(
    db_url: str, make_client: ClientFactory, revision: str
) -> None:
    """0003 drops every price's kind (and the GPU links and SM counts); 0005 only the SM
    counts. After the upgrade the rows are empty there while their digest still matches."""
    before = _h100(db_url)
    kinds = _price_kinds(db_url)
    assert before["sm_count"] == 132
    assert before["price_kind"] == "on_demand"
    assert set(kinds.values()) == {"on_demand", "reserved"}
    eligible_before, total = _eligible(make_client)
    assert eligible_before > 0

    _bounce(db_url, revision)
    lost = _h100(db_url)
    assert lost["sm_count"] is None
    assert {count for _, count in lost["mig_sm_counts"]} == {None}
    if revision == "0003":
        assert lost["gpu_link_type"] is None
        assert lost["price_kind"] is None
        assert set(_price_kinds(db_url).values()) == {None}
        # The outage the issue measured: no price has a kind, so nothing is ranked by cost.
        assert _eligible(make_client) == (0, total)

    entries = load_catalog(CATALOG_DIR)
    with db_session(db_url) as session:
        report = sync_catalog(session, entries)
    assert report.created == []
    assert report.updated == []
    repaired = {line.split(" ")[0]: line for line in report.repaired}
    assert "nvidia-h100-sxm" in repaired
    assert "sm_count" in repaired["nvidia-h100-sxm"]
    profiles = len(before["mig_sm_counts"])
    assert f"mig_profiles.sm_count ({profiles} of {profiles})" in repaired["nvidia-h100-sxm"]
    if revision == "0003":
        assert "price_kind" in repaired["nvidia-h100-sxm"]
        assert "gpu_link_type" in repaired["nvidia-h100-sxm"]
    # Only rows that lost something are written (a CPU has no SM count, link or price kind).
    assert "intel-xeon-platinum-8480plus" in report.unchanged

    after = _h100(db_url)
    assert {k: v for k, v in after.items() if k != "version"} == {
        k: v for k, v in before.items() if k != "version"
    }
    assert after["version"] == lost["version"] + 1
    assert _price_kinds(db_url) == kinds
    with db_session(db_url) as session:
        rows = {row.slug: row for row in session.scalars(select(Hardware))}
        assert {e.slug: drifted_fields(rows[e.slug], e) for e in entries} == {
            e.slug: [] for e in entries
        }
    assert _eligible(make_client) == (eligible_before, total)

    with db_session(db_url) as session:
        again = sync_catalog(session, entries)
    assert not again.changed
    assert again.repaired == []


def test_sync_never_repairs_a_user_row_and_says_so(db_url: str) -> None:
    with db_session(db_url) as session:
        payload = hardware(slug="my-gpu", price_usd_per_hour=3.0, price_kind="spot")
        create_hardware(session, payload=HardwareCreate.model_validate(payload))
    _bounce(db_url, "0003")
    with db_session(db_url) as session:
        report = sync_catalog(session, load_catalog(CATALOG_DIR))
    assert [line for line in report.not_repaired if line.startswith("my-gpu ")] == [
        "my-gpu (price without a kind: not ranked by cost until restated with its kind)"
    ]
    assert not any(line.startswith("my-gpu ") for line in report.repaired)
    with db_session(db_url) as session:
        row = session.scalars(select(Hardware).where(Hardware.slug == "my-gpu")).one()
        assert (row.source, row.version, row.price_kind, row.price_usd_per_hour) == (
            "user",
            1,
            None,
            3.0,
        )


def test_a_row_edited_in_the_database_is_repaired(db_url: str) -> None:
    """Not only downgrades: any catalog row that no longer holds its entry is rewritten."""
    with db_session(db_url) as session:
        row = session.scalars(select(Hardware).where(Hardware.slug == "nvidia-t4")).one()
        row.tdp_watts = 1.0
        session.commit()
    with db_session(db_url) as session:
        report = sync_catalog(session, load_catalog(CATALOG_DIR))
    assert report.repaired == ["nvidia-t4 (tdp_watts)"]
    with db_session(db_url) as session:
        row = session.scalars(select(Hardware).where(Hardware.slug == "nvidia-t4")).one()
        assert row.tdp_watts == 70


def test_catalog_sync_command_says_what_it_repaired(
    db_url: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The command the issue ran: it said "unchanged 44" while the rows had lost their kinds,
    SM counts and links."""
    with db_session(db_url) as session:
        payload = hardware(slug="my-gpu", price_usd_per_hour=3.0, price_kind="spot")
        create_hardware(session, payload=HardwareCreate.model_validate(payload))
    _bounce(db_url, "0003")
    monkeypatch.setenv("CAPPLAN_DATABASE_URL", db_url)
    get_settings.cache_clear()
    try:
        assert main(["catalog-sync"]) == 0
        first = capsys.readouterr().out
        assert main(["catalog-sync"]) == 0
        second = capsys.readouterr().out
    finally:
        get_settings.cache_clear()
    repaired = int(re.search(r"repaired (\d+),", first).group(1))  # type: ignore[union-attr]
    unchanged = int(re.search(r"unchanged (\d+),", first).group(1))  # type: ignore[union-attr]
    assert repaired > 0
    assert repaired + unchanged == len(load_catalog(CATALOG_DIR))
    assert "repaired from the catalog file (emptied by a downgrade?): nvidia-h100-sxm (" in first
    assert "user-owned, not repaired" in first
    assert "my-gpu (price without a kind" in first
    assert "catalog sync: created 0, updated 0, unchanged" in second
    assert "repaired 0," in second.splitlines()[0]
    assert "repaired from the catalog file" not in second


def test_zoo_rows_that_lost_a_field_are_repaired(db_url: str) -> None:
    with db_session(db_url) as session:
        row = session.scalars(
            select(ModelArchitecture).where(ModelArchitecture.slug == "gpt-2")
        ).one()
        wanted = dict(row.default_bindings)
        assert wanted
        row.default_bindings = {}  # what a column re-added with its server default holds
        session.commit()
    with db_session(db_url) as session:
        report = sync_zoo(session)
        again = sync_zoo(session)
    assert report.repaired == ["gpt-2 (default_bindings)"]
    assert again.repaired == []
    with db_session(db_url) as session:
        row = session.scalars(
            select(ModelArchitecture).where(ModelArchitecture.slug == "gpt-2")
        ).one()
        assert row.default_bindings == wanted
