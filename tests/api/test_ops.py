import json
import logging
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from fastapi import APIRouter

from app.db.migrations import head_revisions
from app.logs import JsonFormatter
from app.main import create_app
from tests.api.helpers import assert_problem, hardware
from tests.support import ApiClient, ClientFactory, settings_for, table_counts


def test_healthz(client: ApiClient) -> None:
    response = client.get("/healthz")
    assert response.status_code == 200
    assert response.json() == {"status": "ok"}


def test_readyz_when_migrated(client: ApiClient, db_url: str) -> None:
    body = client.get("/readyz").json()
    assert body["status"] == "ready"
    assert body["migration"] == sorted(head_revisions())
    assert body["database"] in db_url


def test_readyz_is_503_on_an_unmigrated_database(tmp_path: Path) -> None:
    client = ApiClient(create_app(settings_for(f"sqlite:///{tmp_path / 'empty.db'}")))
    try:
        body = assert_problem(client.get("/readyz"), 503, "not-ready")
        assert "capplan-server migrate" in body["detail"]
        assert client.get("/healthz").status_code == 200
    finally:
        client.close()


def test_readyz_is_503_when_the_database_is_unreachable() -> None:
    url = "postgresql+psycopg://nobody@127.0.0.1:1/none?connect_timeout=1"
    client = ApiClient(create_app(settings_for(url)))
    try:
        body = assert_problem(client.get("/readyz"), 503, "not-ready")
        assert "127.0.0.1" not in body["detail"]
    finally:
        client.close()


def test_metrics_count_requests_per_route_template(client: ApiClient) -> None:
    client.get("/v1/hardware/nvidia-t4")
    client.get("/v1/hardware/nvidia-l4")
    client.get("/v1/hardware/no-such")
    text = client.get("/metrics").text
    assert (
        'capplan_http_requests_total{method="GET",route="/v1/hardware/{slug}",status="200"} 2.0'
        in text
    )
    assert 'route="/v1/hardware/{slug}",status="404"} 1.0' in text
    assert 'capplan_http_request_duration_seconds_bucket{le="0.005",method="GET"' in text


def test_metrics_label_unknown_paths_together(client: ApiClient) -> None:
    client.get("/docs")
    client.get("/wp-admin/1")
    client.get("/wp-admin/2")
    text = client.get("/metrics").text
    assert 'route="/docs",status="200"} 1.0' in text
    assert 'route="<unmatched>",status="404"} 2.0' in text
    assert "wp-admin" not in text


def test_request_id_is_echoed_or_generated(client: ApiClient) -> None:
    given = client.get("/healthz", headers={"X-Request-ID": "abc-123"})
    assert given.headers["x-request-id"] == "abc-123"
    generated = client.get("/healthz", headers={"X-Request-ID": "bad id with spaces"})
    assert len(generated.headers["x-request-id"]) == 32
    problem = client.get("/v1/hardware/nothing", headers={"X-Request-ID": "trace-42"})
    assert problem.json()["request_id"] == "trace-42"


def test_access_log_is_json_with_request_id(
    client: ApiClient, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO, logger="app.access"):
        client.get("/v1/hardware/nvidia-t4", headers={"X-Request-ID": "log-me"})
    records = [r for r in caplog.records if r.name == "app.access"]
    assert records
    line = json.loads(JsonFormatter().format(records[-1]))
    assert line["msg"] == "request"
    assert line["route"] == "/v1/hardware/{slug}"
    assert line["status"] == 200
    assert line["duration_ms"] >= 0


def test_unhandled_errors_are_500_problems_without_internals(db_url: str) -> None:
    app = create_app(settings_for(db_url))
    router = APIRouter()

    @router.get("/boom")
    def boom() -> None:
        raise RuntimeError("secret internals: SELECT * FROM hardware")

    app.include_router(router)
    client = ApiClient(app)
    try:
        body = assert_problem(client.get("/boom"), 500, "internal-error")
        assert "secret" not in json.dumps(body)
        assert body["request_id"]
    finally:
        client.close()


def test_body_over_the_limit_is_413(make_client: ClientFactory, db_url: str) -> None:
    client = make_client(max_request_bytes=1024)
    before = table_counts(db_url)
    payload = hardware(notes="x" * 2000)
    body = assert_problem(client.post("/v1/hardware", json=payload), 413, "payload-too-large")
    assert "1024 bytes" in body["detail"]
    assert table_counts(db_url) == before


def test_streamed_body_over_the_limit_is_413(make_client: ClientFactory, db_url: str) -> None:
    client = make_client(max_request_bytes=1024)
    before = table_counts(db_url)

    async def chunks() -> AsyncIterator[bytes]:
        for _ in range(10):
            yield b" " * 200

    response = client.post(
        "/v1/hardware", content=chunks(), headers={"content-type": "application/json"}
    )
    assert_problem(response, 413)
    assert table_counts(db_url) == before


def test_unknown_route_and_method_are_problems(client: ApiClient) -> None:
    assert_problem(client.get("/v2/whatever"), 404)
    assert_problem(client.request("PATCH", "/v1/hardware"), 405)


def test_docs_and_redoc_are_served(client: ApiClient) -> None:
    assert "swagger" in client.get("/docs").text.lower()
    assert "redoc" in client.get("/redoc").text.lower()
