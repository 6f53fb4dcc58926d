"""The `capplan-server` commands the README and the container use."""

import asyncio
import logging
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from app.cli import main
from app.config import get_settings
from app.main import create_app
from tests.support import settings_for


@pytest.fixture
def env_db(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    monkeypatch.setenv("CAPPLAN_DATA_DIR", str(tmp_path))
    monkeypatch.delenv("CAPPLAN_DATABASE_URL", raising=False)
    get_settings.cache_clear()
    yield tmp_path
    get_settings.cache_clear()


def test_migrate_then_sync_twice(env_db: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["migrate"]) == 0
    assert (env_db / "capplan.db").exists()
    assert main(["catalog-sync"]) == 0
    first = capsys.readouterr().out
    assert "catalog sync: created" in first
    assert "created 0" not in first
    assert main(["catalog-sync"]) == 0
    second = capsys.readouterr().out
    assert "created 0, updated 0" in second


def test_catalog_validate(env_db: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["catalog-validate"]) == 0
    assert "catalog valid" in capsys.readouterr().out


def test_catalog_validate_reports_a_broken_file(
    env_db: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    broken = tmp_path / "catalog"
    broken.mkdir()
    (broken / "bad.yaml").write_text(yaml.safe_dump({"family": "bad", "devices": []}))
    monkeypatch.setenv("CAPPLAN_CATALOG_DIR", str(broken))
    get_settings.cache_clear()
    assert main(["catalog-validate"]) == 1
    assert main(["catalog-sync"]) == 1
    assert "bad.yaml" in capsys.readouterr().err


def test_openapi_export_writes_yaml(tmp_path: Path) -> None:
    target = tmp_path / "openapi.yaml"
    assert main(["openapi", "-o", str(target)]) == 0
    assert yaml.safe_load(target.read_text())["info"]["title"] == "Capacity Planner"


def _start_app(**overrides: str) -> None:
    app = create_app(settings_for("sqlite://", **overrides))

    async def run() -> None:
        async with app.router.lifespan_context(app):
            pass

    asyncio.run(run())


def test_open_dev_mode_is_logged_at_start(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="app"):
        _start_app()
    assert any("OPEN DEV MODE" in r.getMessage() for r in caplog.records)


def test_configured_keys_are_counted_not_logged(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="app"):
        _start_app(api_keys="alpha-secret,beta-secret")
    messages = " ".join(r.getMessage() for r in caplog.records)
    assert "API keys configured: 2" in messages
    assert "secret" not in messages
    assert "OPEN DEV MODE" not in messages
