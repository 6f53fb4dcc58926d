from pathlib import Path

import pytest
import yaml
from sqlalchemy import select

from app.db.models import Hardware
from app.schemas.hardware import HardwareCreate
from app.services.catalog import CatalogError, load_catalog, sync_catalog
from app.services.hardware import create_hardware
from app.services.sync_report import SyncReport
from tests.support import CATALOG_DIR, db_session, table_counts

FIXTURE_DIR = Path(__file__).parent.parent / "fixtures" / "catalog"


def _versions(db_url: str) -> dict[str, tuple[int, str]]:
    with db_session(db_url) as session:
        rows = session.scalars(select(Hardware)).all()
        return {r.slug: (r.version, r.updated_at.isoformat()) for r in rows}


def _sync(db_url: str, directory: Path) -> SyncReport:
    with db_session(db_url) as session:
        return sync_catalog(session, load_catalog(directory))


def test_second_sync_changes_nothing(db_url: str) -> None:
    # The fixture database was synced once already; sync twice more.
    before_counts = table_counts(db_url)
    before = _versions(db_url)
    for _ in range(2):
        report = _sync(db_url, CATALOG_DIR)
        assert not report.changed
    assert _versions(db_url) == before
    assert table_counts(db_url) == before_counts


def test_sync_never_overwrites_or_deletes_user_entries(db_url: str, tmp_path: Path) -> None:
    with db_session(db_url) as session:
        mine = yaml.safe_load((FIXTURE_DIR / "test-gpus.yaml").read_text())["devices"][1]
        mine["name"] = "My own CPU entry"
        create_hardware(session, payload=HardwareCreate.model_validate(mine))
    report = _sync(db_url, FIXTURE_DIR)
    assert report.skipped_user_owned == ["test-cpu"]
    assert report.created == ["test-gpu-mig"]
    # Shipped catalog rows missing from this directory are kept, not deleted.
    assert "nvidia-a100-80gb-sxm" in report.not_in_catalog
    with db_session(db_url) as session:
        row = session.scalars(select(Hardware).where(Hardware.slug == "test-cpu")).one()
        assert (row.name, row.source, row.version) == ("My own CPU entry", "user", 1)
        assert session.scalars(select(Hardware).where(Hardware.slug == "nvidia-t4")).one()


def test_changed_entry_is_updated_and_versioned(db_url: str, tmp_path: Path) -> None:
    _sync(db_url, FIXTURE_DIR)
    data = yaml.safe_load((FIXTURE_DIR / "test-gpus.yaml").read_text())
    data["devices"][0]["tdp_watts"] = 350
    data["devices"][0]["mig"]["profiles"] = data["devices"][0]["mig"]["profiles"][:2]
    (tmp_path / "test-gpus.yaml").write_text(yaml.safe_dump(data))
    report = _sync(db_url, tmp_path)
    assert report.updated == ["test-gpu-mig"]
    assert report.unchanged == ["test-cpu"]
    with db_session(db_url) as session:
        row = session.scalars(select(Hardware).where(Hardware.slug == "test-gpu-mig")).one()
        assert row.version == 2
        assert row.tdp_watts == 350
        assert [p.name for p in row.mig_profiles] == ["1g.5gb", "1g.5gb+me"]


def _write(directory: Path, name: str, data: object) -> None:
    (directory / name).write_text(yaml.safe_dump(data) if not isinstance(data, str) else data)


def test_invalid_catalogs_are_rejected_with_the_file_named(tmp_path: Path) -> None:
    device = yaml.safe_load((FIXTURE_DIR / "test-gpus.yaml").read_text())["devices"][1]

    _write(tmp_path, "a.yaml", {"family": "b", "devices": [device]})
    with pytest.raises(CatalogError, match="a.yaml: family 'b' must equal the file stem"):
        load_catalog(tmp_path)

    _write(tmp_path, "a.yaml", {"family": "a", "devices": [device]})
    _write(tmp_path, "c.yaml", {"family": "c", "devices": [device]})
    with pytest.raises(CatalogError, match="c.yaml: slug 'test-cpu' also defined in a.yaml"):
        load_catalog(tmp_path)

    (tmp_path / "c.yaml").unlink()
    _write(tmp_path, "a.yaml", {"family": "a", "devices": [{**device, "memory_bytes": -1}]})
    with pytest.raises(CatalogError, match=r"a.yaml: devices.0.memory_bytes"):
        load_catalog(tmp_path)

    _write(tmp_path, "a.yaml", {"family": "a", "devices": [{**device, "sources": []}]})
    with pytest.raises(CatalogError, match="sources"):
        load_catalog(tmp_path)

    _write(tmp_path, "a.yaml", "family: [unclosed")
    with pytest.raises(CatalogError, match="not valid YAML"):
        load_catalog(tmp_path)


def test_empty_catalog_directory_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(CatalogError, match="no \\*.yaml"):
        load_catalog(tmp_path)
