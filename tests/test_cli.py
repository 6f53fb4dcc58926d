"""The `capplan-server` commands the README and the container use."""

import asyncio
import json
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import uvicorn
import yaml

from app.api.errors import PROBLEM_JSON
from app.api.http_server import HTTP_PROTOCOL, ProblemH11Protocol
from app.cli import main
from app.config import get_settings
from app.main import create_app
from tests.live_server import live_server, raw_request
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


# -- serve: requests the HTTP parser rejects are problem+json 400s -----------------------------


def test_serve_runs_uvicorn_with_the_problem_protocol(
    env_db: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: dict[str, Any] = {}
    monkeypatch.setattr(uvicorn, "run", lambda app, **kwargs: seen.update(kwargs))
    monkeypatch.setattr("app.cli.configure_logging", lambda level: None)
    assert main(["serve", "--port", "8123"]) == 0
    assert seen["http"] is HTTP_PROTOCOL
    assert seen["port"] == 8123
    assert main(["serve", "--workers", "2"]) == 0  # worker processes get the class too
    assert seen["http"] is HTTP_PROTOCOL


PROTOCOL_ERRORS = {
    "Content-Length: abc": b"POST /v1/mig/fit HTTP/1.1\r\nHost: t\r\nContent-Length: abc\r\n\r\n",
    "negative Content-Length": (
        b"POST /v1/mig/fit HTTP/1.1\r\nHost: t\r\nContent-Length: -1\r\n\r\n"
    ),
    "malformed request line": b"GARBAGE\r\n\r\n",
    "malformed header": b"GET /healthz HTTP/1.1\r\nHost: t\r\nBad Header: y\r\n\r\n",
    "bytes outside ASCII in the path": b"GET /v1/hardware/\xff HTTP/1.1\r\nHost: t\r\n\r\n",
}


@pytest.fixture(scope="module")
def protocol_servers() -> Iterator[dict[str, tuple[str, int]]]:
    """The app behind both protocol classes (httptools, uvicorn's default, and h11)."""
    app = create_app(settings_for("sqlite://"))
    with (
        live_server(app, http=HTTP_PROTOCOL) as default,
        live_server(app, http=ProblemH11Protocol) as h11,
    ):
        yield {"default": default, "h11": h11}


@pytest.mark.parametrize("server", ["default", "h11"])
@pytest.mark.parametrize("case", list(PROTOCOL_ERRORS))
def test_requests_the_parser_rejects_get_a_problem_400(
    protocol_servers: dict[str, tuple[str, int]], server: str, case: str
) -> None:
    response = raw_request(protocol_servers[server], PROTOCOL_ERRORS[case])
    assert response.status == 400
    assert response.headers["content-type"] == PROBLEM_JSON
    body = json.loads(response.body)
    assert body["type"] == "/problems/bad-request"
    assert body["status"] == 400
    assert body["detail"].startswith("the request is not valid HTTP/1.1")
    assert body["request_id"] == response.headers["x-request-id"]
    assert response.closed


def test_the_parser_reason_is_named(protocol_servers: dict[str, tuple[str, int]]) -> None:
    response = raw_request(protocol_servers["default"], PROTOCOL_ERRORS["Content-Length: abc"])
    assert "Content-Length" in json.loads(response.body)["detail"]


@pytest.mark.parametrize("server", ["default", "h11"])
def test_valid_requests_are_unaffected(
    protocol_servers: dict[str, tuple[str, int]], server: str
) -> None:
    response = raw_request(protocol_servers[server], b"GET /healthz HTTP/1.1\r\nHost: t\r\n\r\n")
    assert response.status == 200
    assert json.loads(response.body) == {"status": "ok"}
