import logging

import pytest

from tests.api.helpers import assert_problem, hardware
from tests.support import ApiClient, ClientFactory, table_counts

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
