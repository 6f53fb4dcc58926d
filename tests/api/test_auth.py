import asyncio
import json
import logging
import re
from dataclasses import dataclass

import pytest
from fastapi import FastAPI
from starlette.types import Message

from app.api.auth_gate import auth_guards, route_dependants
from app.api.deps import require_reader, require_writer
from app.api.errors import PROBLEM_JSON
from app.main import create_app
from tests.api.helpers import assert_problem, hardware
from tests.live_server import live_server, raw_request
from tests.support import ApiClient, ClientFactory, settings_for, table_counts

KEYS = "first-key-0123456789,second-key-9876543210"


def test_writes_need_a_key_when_keys_are_configured(
    make_client: ClientFactory, db_url: str
) -> None:
    client = make_client(api_keys=KEYS)
    before = table_counts(db_url)
    missing = assert_problem(client.post("/v1/hardware", json=hardware()), 401, "unauthorized")
    assert "Authorization: Bearer" in missing["detail"]
    assert (
        client.post("/v1/hardware", json=hardware())
        .headers["www-authenticate"]
        .startswith("Bearer")
    )
    wrong = client.post(
        "/v1/hardware", json=hardware(), headers={"Authorization": "Bearer not-a-key"}
    )
    assert_problem(wrong, 403, "forbidden")
    assert_problem(client.post("/v1/hardware", json=hardware(), headers={"X-API-Key": "nope"}), 403)
    assert table_counts(db_url) == before


@pytest.mark.parametrize(
    "headers",
    [
        {"Authorization": "Bearer first-key-0123456789"},
        {"Authorization": "Bearer second-key-9876543210"},
        {"X-API-Key": "second-key-9876543210"},
    ],
)
def test_valid_keys_are_accepted(make_client: ClientFactory, headers: dict[str, str]) -> None:
    client = make_client(api_keys=KEYS)
    assert client.post("/v1/hardware", json=hardware(), headers=headers).status_code == 201


def test_auth_is_checked_before_the_body_is_trusted(make_client: ClientFactory) -> None:
    client = make_client(api_keys=KEYS)
    response = client.put("/v1/hardware/nvidia-t4", json={"junk": True})
    assert response.status_code in (401, 422)
    assert response.status_code != 200


def test_reads_are_open_by_default(make_client: ClientFactory) -> None:
    client = make_client(api_keys=KEYS)
    assert client.get("/v1/hardware").status_code == 200
    assert client.get("/v1/models").status_code == 200


def test_reads_can_be_closed(make_client: ClientFactory) -> None:
    client = make_client(api_keys=KEYS, require_auth_for_reads=True)
    assert_problem(client.get("/v1/hardware"), 401)
    assert_problem(client.get("/v1/models/x", headers={"X-API-Key": "bad"}), 403)
    ok = client.get("/v1/hardware", headers={"X-API-Key": "first-key-0123456789"})
    assert ok.status_code == 200
    assert client.get("/healthz").status_code == 200  # probes stay open


def test_open_dev_mode_accepts_writes_without_a_key(client: ApiClient) -> None:
    assert client.post("/v1/hardware", json=hardware()).status_code == 201


def test_keys_never_reach_the_logs(
    make_client: ClientFactory, caplog: pytest.LogCaptureFixture
) -> None:
    client = make_client(api_keys=KEYS)
    with caplog.at_level(logging.DEBUG):
        client.post("/v1/hardware", json=hardware(), headers={"X-API-Key": "guess-1234"})
        client.post("/v1/hardware", json=hardware(), headers={"X-API-Key": "first-key-0123456789"})
    logged = "\n".join(f"{r.getMessage()} {r.__dict__}" for r in caplog.records)
    assert "request" in logged
    assert "guess-1234" not in logged
    assert "first-key-0123456789" not in logged


# -- the auth gate: 401/403 before a single body byte is received ------------------------------

ONNX_HEAD = (
    b"POST /v1/models/import/onnx HTTP/1.1\r\nHost: test\r\n"
    b"Content-Type: multipart/form-data; boundary=b0undary\r\n"
    b"Content-Length: 20971520\r\n"
)


@dataclass
class AsgiResult:
    status: int
    headers: dict[str, str]
    body: bytes
    receive_calls: int


def _asgi(
    app: FastAPI,
    method: str,
    path: str,
    body: bytes = b"{}",
    headers: dict[str, str] | None = None,
) -> AsgiResult:
    """Call the app as an ASGI server would, counting the receive() calls (body reads)."""
    calls = 0
    sent: list[Message] = []

    async def receive() -> Message:
        nonlocal calls
        calls += 1
        return {"type": "http.request", "body": body, "more_body": False}

    async def send(message: Message) -> None:
        sent.append(message)

    all_headers = {"content-type": "application/json", **(headers or {})}
    all_headers["content-length"] = str(len(body))
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": method,
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "root_path": "",
        "query_string": b"",
        "headers": [(k.lower().encode(), v.encode()) for k, v in all_headers.items()],
        "client": ("127.0.0.1", 50000),
        "server": ("test", 80),
    }
    asyncio.run(app(scope, receive, send))
    start = next(m for m in sent if m["type"] == "http.response.start")
    return AsgiResult(
        status=start["status"],
        headers={k.decode(): v.decode() for k, v in start["headers"]},
        body=b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body"),
        receive_calls=calls,
    )


def _routes_with(app: FastAPI, guard: object) -> list[tuple[str, str]]:
    """(method, path with slugs filled in) of every API route that depends on ``guard``."""
    found = []
    for route, dependant in route_dependants(app.router):
        if any(g.call is guard for g in auth_guards(dependant)):
            path = re.sub(r"\{[^}]+\}", "x", str(getattr(route, "path", "")))
            found += [(method, path) for method in sorted(getattr(route, "methods", ()))]
    return found


def _problem(result: AsgiResult, status: int) -> dict[str, object]:
    assert result.status == status, result.body
    assert result.headers["content-type"] == PROBLEM_JSON
    body: dict[str, object] = json.loads(result.body)
    assert body["status"] == status
    return body


def test_writes_are_refused_before_their_body_is_read() -> None:
    app = create_app(settings_for("sqlite://", api_keys=KEYS))
    writes = _routes_with(app, require_writer)
    # The rule comes from the routes' dependencies; these are known writes and reads.
    assert ("POST", "/v1/models/import/onnx") in writes
    assert ("POST", "/v1/hardware") in writes
    assert ("PUT", "/v1/models/x") in writes
    for read in ("/v1/estimates/memory", "/v1/mig/fit", "/v1/mig/plan", "/v1/admission/pods",
                 "/v1/mig/layouts/validate", "/v1/recommendations/inference"):  # fmt: skip
        assert ("POST", read) not in writes
    for method, path in writes:
        missing = _asgi(app, method, path)
        assert _problem(missing, 401)["type"] == "/problems/unauthorized", (method, path)
        assert missing.headers["www-authenticate"].startswith("Bearer")
        assert missing.receive_calls == 0, (method, path)
        wrong = _asgi(app, method, path, headers={"X-API-Key": "not-a-key"})
        assert _problem(wrong, 403)["type"] == "/problems/forbidden"
        assert wrong.receive_calls == 0, (method, path)
    # The gate answers what the dependency would: same detail, and it closes the connection
    # whose body it left unread.
    refused = _asgi(app, "POST", "/v1/hardware", body=json.dumps(hardware()).encode())
    assert "Authorization: Bearer" in str(_problem(refused, 401)["detail"])
    assert refused.headers["connection"] == "close"


def test_the_onnx_upload_is_not_read_without_a_key() -> None:
    app = create_app(settings_for("sqlite://", api_keys=KEYS))
    form = b'--b0undary\r\nContent-Disposition: form-data; name="slug"\r\n\r\nx\r\n--b0undary--\r\n'
    multipart = {"content-type": "multipart/form-data; boundary=b0undary"}
    refused = _asgi(app, "POST", "/v1/models/import/onnx", body=form, headers=multipart)
    assert _problem(refused, 401)["instance"] == "/v1/models/import/onnx"
    assert refused.receive_calls == 0
    accepted = _asgi(
        app,
        "POST",
        "/v1/models/import/onnx",
        body=form,
        headers={**multipart, "Authorization": "Bearer first-key-0123456789"},
    )
    assert accepted.receive_calls >= 1  # with the key the form is read (and lacks its file)
    assert _problem(accepted, 422)["type"] == "/problems/validation-error"


def test_reads_posted_with_a_body_are_gated_only_when_reads_need_a_key() -> None:
    open_reads = create_app(settings_for("sqlite://", api_keys=KEYS))
    closed_reads = create_app(settings_for("sqlite://", api_keys=KEYS, require_auth_for_reads=True))
    reads = _routes_with(open_reads, require_reader)
    posted = [(method, path) for method, path in reads if method == "POST"]
    assert ("POST", "/v1/mig/fit") in posted
    assert ("POST", "/v1/admission/pods") in posted
    for method, path in posted:
        passed = _asgi(open_reads, method, path)
        assert passed.status != 401, (method, path)
        assert passed.receive_calls >= 1
        refused = _asgi(closed_reads, method, path)
        assert _problem(refused, 401)["type"] == "/problems/unauthorized"
        assert refused.receive_calls == 0, (method, path)


def test_open_dev_mode_has_no_gate() -> None:
    app = create_app(settings_for("sqlite://"))
    assert _asgi(app, "POST", "/v1/hardware", body=b"{").status == 400  # read and parsed


def test_the_routes_keep_their_security_schemes() -> None:
    app = create_app(settings_for("sqlite://", api_keys=KEYS))
    operation = app.openapi()["paths"]["/v1/models/import/onnx"]["post"]
    schemes = {name for requirement in operation["security"] for name in requirement}
    assert schemes == {"HTTPBearer", "APIKeyHeader"}


def test_a_20_mib_upload_without_a_key_is_refused_before_it_is_sent() -> None:
    app = create_app(settings_for("sqlite://", api_keys=KEYS))
    with live_server(app) as address:
        # Only the head is sent: a server that waited for the 20 MiB would time out here.
        response = raw_request(address, ONNX_HEAD + b"\r\n", timeout_s=5)
    assert response.status == 401
    assert response.headers["content-type"] == PROBLEM_JSON
    assert json.loads(response.body)["type"] == "/problems/unauthorized"
    assert response.closed
