"""CORS: off unless CAPPLAN_CORS_ORIGINS names origins; preflights need no API key."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from app.config import Settings
from tests.support import ApiClient, ClientFactory

ORIGIN = "https://planner.example.com"
PREFLIGHT = {
    "Origin": ORIGIN,
    "Access-Control-Request-Method": "POST",
    "Access-Control-Request-Headers": "content-type, x-api-key",
}


def test_cors_is_off_by_default(client: ApiClient) -> None:
    assert Settings(_env_file=None).cors_origin_list == ()
    preflight = client.request("OPTIONS", "/v1/workloads", headers=PREFLIGHT)
    assert preflight.status_code == 405  # no CORS layer answers it
    assert not [h for h in preflight.headers if h.startswith("access-control-")]
    simple = client.get("/v1/hardware", headers={"Origin": ORIGIN})
    assert simple.status_code == 200
    assert "access-control-allow-origin" not in simple.headers


def test_cors_for_configured_origins(make_client: ClientFactory) -> None:
    client = make_client(
        cors_origins=f"{ORIGIN}, http://localhost:3000",
        api_keys="k1",
        require_auth_for_reads=True,
    )
    preflight = client.request("OPTIONS", "/v1/workloads", headers=PREFLIGHT)
    assert preflight.status_code == 200  # answered without an API key
    assert preflight.headers["access-control-allow-origin"] == ORIGIN
    assert "POST" in preflight.headers["access-control-allow-methods"]
    allowed_headers = preflight.headers["access-control-allow-headers"].lower()
    assert "x-api-key" in allowed_headers
    assert "if-match" in allowed_headers
    assert "access-control-allow-credentials" not in preflight.headers
    simple = client.get("/v1/hardware", headers={"Origin": ORIGIN, "X-API-Key": "k1"})
    assert simple.status_code == 200
    assert simple.headers["access-control-allow-origin"] == ORIGIN
    assert "x-request-id" in simple.headers["access-control-expose-headers"].lower()
    # The key is still needed for the request itself, and the answer says so to the page.
    denied = client.get("/v1/hardware", headers={"Origin": ORIGIN})
    assert denied.status_code == 401
    assert denied.headers["access-control-allow-origin"] == ORIGIN
    other = client.request(
        "OPTIONS", "/v1/workloads", headers={**PREFLIGHT, "Origin": "https://evil.example"}
    )
    assert other.status_code == 400
    assert "access-control-allow-origin" not in other.headers


def test_the_setting_is_read_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CAPPLAN_CORS_ORIGINS", "https://a.example, http://127.0.0.1:8080,*")
    settings = Settings(_env_file=None)
    assert settings.cors_origin_list == ("https://a.example", "http://127.0.0.1:8080", "*")


@pytest.mark.parametrize(
    "origins",
    ["planner.example.com", "https://planner.example.com/", "https://a.example/path",
     "ftp://a.example", "https://a.example, javascript:alert(1)"],
)  # fmt: skip
def test_a_value_that_is_not_an_origin_is_refused(origins: str) -> None:
    with pytest.raises(ValidationError, match="is not an origin"):
        Settings(_env_file=None, cors_origins=origins)
