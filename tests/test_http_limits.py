"""HTTP-level limits of the served app: URL and header size, the header-read timeout.

The real app behind uvicorn (both protocol classes) on a loopback port, raw HTTP over sockets:
the limits hold in the protocol, before routing, authentication and every middleware.
"""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator

import pytest

from app.api.errors import PROBLEM_JSON
from app.api.http_server import HTTP_PROTOCOL, HttpLimits, ProblemH11Protocol, with_limits
from app.config import Settings
from app.main import create_app
from tests.live_server import RawResponse, _read_response, live_server, raw_request
from tests.support import settings_for

LIMITS = HttpLimits(max_url_bytes=2048, max_header_bytes=8192, header_timeout_s=0.5)
PROTOCOLS = {"httptools": HTTP_PROTOCOL, "h11": ProblemH11Protocol}


@pytest.fixture(scope="module")
def servers() -> Iterator[dict[str, tuple[str, int]]]:
    """Keys configured and required for reads: a request that reached the auth gate is a 401."""
    app = create_app(settings_for("sqlite://", api_keys="k1", require_auth_for_reads=True))
    with (
        live_server(app, http=with_limits(HTTP_PROTOCOL, LIMITS)) as default,
        live_server(app, http=with_limits(ProblemH11Protocol, LIMITS)) as h11,
    ):
        yield {"httptools": default, "h11": h11}


def _get(target: bytes, headers: bytes = b"") -> bytes:
    return b"GET " + target + b" HTTP/1.1\r\nHost: t\r\n" + headers + b"\r\n"


def _problem(response: RawResponse, status: int, slug: str) -> dict[str, object]:
    assert response.status == status, response.body
    assert response.headers["content-type"] == PROBLEM_JSON
    body: dict[str, object] = json.loads(response.body)
    assert body["type"] == f"/problems/{slug}"
    assert body["status"] == status
    assert body["request_id"] == response.headers["x-request-id"]
    assert response.closed
    return body


@pytest.mark.parametrize("protocol", list(PROTOCOLS))
def test_a_url_over_the_limit_is_a_414_before_auth(
    servers: dict[str, tuple[str, int]], protocol: str
) -> None:
    address = servers[protocol]
    # Within the limit the request reaches the app (and its auth gate: 401).
    assert raw_request(address, _get(b"/v1/models/" + b"a" * 2000)).status == 401
    body = _problem(raw_request(address, _get(b"/v1/models/" + b"a" * 2100)), 414, "uri-too-long")
    assert "2048 bytes (setting CAPPLAN_MAX_URL_BYTES)" in str(body["detail"])
    # A URL far over the limit is cut off after the limit, never read whole.
    huge = raw_request(address, _get(b"/" + b"a" * 2**20))
    _problem(huge, 414, "uri-too-long")


@pytest.mark.parametrize("protocol", list(PROTOCOLS))
def test_a_header_section_over_the_limit_is_a_431_before_auth(
    servers: dict[str, tuple[str, int]], protocol: str
) -> None:
    address = servers[protocol]
    fits = b"X-Pad: " + b"p" * 7000 + b"\r\n"
    assert raw_request(address, _get(b"/v1/hardware", fits)).status == 401
    one_big = b"X-Pad: " + b"p" * 9000 + b"\r\n"
    body = _problem(raw_request(address, _get(b"/v1/hardware", one_big)), 431, "header-too-large")
    assert "8192 bytes (setting CAPPLAN_MAX_HEADER_BYTES)" in str(body["detail"])
    many = b"".join(b"X-%d: %s\r\n" % (i, b"v" * 90) for i in range(100))  # ~10 KB in all
    _problem(raw_request(address, _get(b"/v1/hardware", many)), 431, "header-too-large")
    # 2 MiB of one header: answered after the limit, the rest of it dropped unread.
    huge = b"X-Pad: " + b"p" * 2**21 + b"\r\n"
    _problem(raw_request(address, _get(b"/healthz", huge)), 431, "header-too-large")
    # The server is fine afterwards.
    assert raw_request(address, _get(b"/healthz")).status == 200


def _trickle(address: tuple[str, int], data: bytes, pause_s: float) -> socket.socket:
    sock = socket.create_connection(address, timeout=5)
    sock.sendall(data)
    time.sleep(pause_s)
    return sock


def _answer_or_close(sock: socket.socket, *, timeout_s: float) -> bytes:
    """What the server sends before it closes (b"" when it closes without an answer)."""
    sock.settimeout(timeout_s)
    data = b""
    try:
        while chunk := sock.recv(65536):
            data += chunk
    except ConnectionResetError:
        pass
    return data


@pytest.mark.timing
@pytest.mark.parametrize("protocol", list(PROTOCOLS))
def test_connections_trickling_headers_are_answered_408_and_closed(
    servers: dict[str, tuple[str, int]], protocol: str
) -> None:
    address = servers[protocol]
    start = time.monotonic()
    slow = [socket.create_connection(address, timeout=5) for _ in range(40)]
    for sock in slow:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: t\r\n")
    silent = [socket.create_connection(address, timeout=5) for _ in range(10)]
    # A trickle: one header line every 0.1 s, never the end of the head.
    for i in range(3):
        time.sleep(0.1)
        for sock in slow:
            sock.sendall(b"X-%d: y\r\n" % i)
    assert raw_request(address, _get(b"/healthz")).status == 200  # others are served meanwhile
    for sock in slow:
        answer = _answer_or_close(sock, timeout_s=5)
        assert answer.startswith(b"HTTP/1.1 408 "), answer[:80]
        assert b"/problems/request-timeout" in answer
        sock.close()
    for sock in silent:  # never sent a byte: closed without an answer
        assert _answer_or_close(sock, timeout_s=5) == b""
        sock.close()
    # Header timeout 0.5 s; a loaded 2-core machine closes all 50 well within 5 s.
    assert time.monotonic() - start < 5


@pytest.mark.timing
@pytest.mark.parametrize("protocol", list(PROTOCOLS))
def test_the_header_timeout_does_not_touch_keep_alive_connections_between_requests(
    servers: dict[str, tuple[str, int]], protocol: str
) -> None:
    with socket.create_connection(servers[protocol], timeout=5) as sock:
        for _ in range(2):
            sock.sendall(_get(b"/healthz"))
            assert _read_response(sock, 5).status == 200
            # Idle for longer than the header timeout, shorter than uvicorn's keep-alive (5 s).
            time.sleep(1.0)


def test_limits_come_from_the_settings() -> None:
    settings = Settings(
        _env_file=None,
        max_url_bytes=4096,
        max_header_bytes=16384,
        header_timeout_s=3,
    )
    limits = HttpLimits.from_settings(settings)
    assert limits == HttpLimits(max_url_bytes=4096, max_header_bytes=16384, header_timeout_s=3)
    assert limits.max_head_bytes > 4096 + 16384
    defaults = HttpLimits.from_settings(Settings(_env_file=None))
    assert defaults == HttpLimits()  # the protocol's own defaults are the settings'
