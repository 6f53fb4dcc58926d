"""Each error example of the OpenAPI document is what the service answers for that status.

Every documented problem example (app.api.errors.PROBLEM_EXAMPLES, shown by Swagger UI and
ReDoc under each error status) is provoked on the real app, and the answer must be the example
itself: same type, title, status, detail, instance and errors (the request id differs). The
503s are provoked with shorter timeouts than the defaults their examples quote: their detail
must then differ only by that number.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest
from sqlalchemy.orm import Session

from app.api import examples
from app.api.database import Database
from app.api.errors import IMPORT_TOO_LARGE_EXAMPLES, PROBLEM_EXAMPLES, import_memory_detail
from app.services import models as model_service
from app.services.concurrency import etag_for
from tests.importers import onnx_models
from tests.support import ApiClient, ClientFactory

MODEL = examples.MODEL_CREATE["tiny-cnn"]["value"]
REPLACEMENT = examples.MODEL_REPLACE["wider-head"]["value"]
ESTIMATE = {"model": "llama-2-7b", "mode": "inference", "batch_size": 0}
RECOMMENDATION = {"model": "resnet-50", "tokens_mean": 3}
KEYS = "example-key-0123456789"


def _example(status: int, name: str) -> dict[str, Any]:
    value: dict[str, Any] = dict(PROBLEM_EXAMPLES[status][name]["value"])
    return value


def _answer(response: httpx.Response) -> dict[str, Any]:
    assert response.headers["content-type"] == "application/problem+json", response.text
    body: dict[str, Any] = response.json()
    assert body.pop("request_id") == response.headers["x-request-id"]
    return body


def _expected(status: int, name: str, **replace: str) -> dict[str, Any]:
    body = _example(status, name)
    assert body.pop("request_id")
    for old, new in replace.items():
        assert old in body["detail"]
        body["detail"] = body["detail"].replace(old, new)
    return body


def _with_tiny_cnn(client: ApiClient) -> None:
    assert client.post("/v1/models", json=MODEL).status_code == 201


Provoke = Callable[[ClientFactory], httpx.Response]


def _malformed(make: ClientFactory) -> httpx.Response:
    headers = {"content-type": "application/json"}
    return make().post("/v1/models", content=b'{"slug": "tiny-cnn",', headers=headers)


def _no_key(make: ClientFactory) -> httpx.Response:
    return make(api_keys=KEYS).post("/v1/models", json=MODEL)


def _wrong_key(make: ClientFactory) -> httpx.Response:
    return make(api_keys=KEYS).post("/v1/models", json=MODEL, headers={"X-API-Key": "nope"})


def _not_found(make: ClientFactory) -> httpx.Response:
    return make().get("/v1/models/no-such-model")


def _already_exists(make: ClientFactory) -> httpx.Response:
    client = make()
    _with_tiny_cnn(client)
    return client.post("/v1/models", json=MODEL)


def _read_only(make: ClientFactory) -> httpx.Response:
    client = make()
    etag = client.get("/v1/models/resnet-50").headers["etag"]
    return client.put("/v1/models/resnet-50", json=REPLACEMENT, headers={"If-Match": etag})


def _in_use(make: ClientFactory) -> httpx.Response:
    client = make()
    _with_tiny_cnn(client)
    workload = {**examples.WORKLOAD_CREATE["chat-serving"]["value"], "model": "tiny-cnn"}
    workload["sequence_length"] = None
    assert client.post("/v1/workloads", json=workload).status_code == 201
    return client.delete("/v1/models/tiny-cnn", headers={"If-Match": etag_for(1)})


def _stale(make: ClientFactory) -> httpx.Response:
    client = make()
    _with_tiny_cnn(client)
    return client.put("/v1/models/tiny-cnn", json=REPLACEMENT, headers={"If-Match": '"7"'})


def _too_large(make: ClientFactory) -> httpx.Response:
    body = b'{"slug": "' + b"x" * 1_100_000 + b'"}'
    headers = {"content-type": "application/json"}
    return make().post("/v1/models", content=body, headers=headers)


def _invalid_field(make: ClientFactory) -> httpx.Response:
    return make().post("/v1/estimates/memory", json=ESTIMATE)


def _invalid_combination(make: ClientFactory) -> httpx.Response:
    return make().post("/v1/recommendations/inference", json=RECOMMENDATION)


def _no_if_match(make: ClientFactory) -> httpx.Response:
    client = make()
    _with_tiny_cnn(client)
    return client.put("/v1/models/tiny-cnn", json=REPLACEMENT)


CASES: dict[tuple[int, str], Provoke] = {
    (400, "malformed-json"): _malformed,
    (401, "unauthorized"): _no_key,
    (403, "forbidden"): _wrong_key,
    (404, "not-found"): _not_found,
    (409, "already-exists"): _already_exists,
    (409, "read-only"): _read_only,
    (409, "in-use"): _in_use,
    (412, "stale-version"): _stale,
    (413, "payload-too-large"): _too_large,
    (422, "validation-error"): _invalid_field,
    (422, "invalid-input"): _invalid_combination,
    (428, "if-match-required"): _no_if_match,
}
SLOW_CASES = {(503, "overloaded"), (503, "database-busy"), (503, "database-unavailable")}


def test_every_problem_example_is_provoked_here() -> None:
    documented = {(status, name) for status, named in PROBLEM_EXAMPLES.items() for name in named}
    assert documented == set(CASES) | SLOW_CASES


@pytest.mark.parametrize(("status", "name"), list(CASES), ids=[f"{s}-{n}" for s, n in CASES])
def test_problem_example_is_the_service_answer(
    make_client: ClientFactory, status: int, name: str
) -> None:
    response = CASES[(status, name)](make_client)
    assert response.status_code == status, response.text
    assert _answer(response) == _expected(status, name)


@pytest.fixture
def blocked_get_model(monkeypatch: pytest.MonkeyPatch) -> Iterator[threading.Event]:
    """GET /v1/models/{slug} hangs in its database work (a frozen database) until released."""
    release = threading.Event()
    original = model_service.get_model

    def frozen(session: Session, *, slug: str) -> Any:
        release.wait(10)
        return original(session, slug=slug)

    monkeypatch.setattr(model_service, "get_model", frozen)
    yield release
    release.set()


def test_database_unavailable_example(
    make_client: ClientFactory, blocked_get_model: threading.Event
) -> None:
    client = make_client(db_call_timeout_s=0.3)
    response = client.get("/v1/models/llama-2-7b")
    assert response.status_code == 503
    assert response.headers["retry-after"] == "5"
    expected = _expected(503, "database-unavailable", **{"within 8 s": "within 0.3 s"})
    assert _answer(response) == expected


def test_database_busy_example(make_client: ClientFactory) -> None:
    client = make_client(db_pool_size=1, db_queue_timeout_s=0.2)
    database: Database = client.app.state.database
    release = threading.Event()
    body = examples.MEMORY_ESTIMATE["stored-model"]["value"]

    async def scenario() -> httpx.Response:
        holder = asyncio.create_task(database.run(lambda _s: release.wait(10)))
        await asyncio.sleep(0.05)
        try:
            return await client.async_client.post("/v1/estimates/memory", json=body)
        finally:
            release.set()
            await holder

    response = client.run(scenario())
    assert response.status_code == 503
    assert response.headers["retry-after"] == "1"
    expected = _expected(503, "database-busy", **{"within 2 s": "within 0.2 s"})
    assert _answer(response) == expected


def test_overloaded_example(make_client: ClientFactory, blocked_get_model: threading.Event) -> None:
    client = make_client(max_in_flight=1, db_queue_timeout_s=0.2, db_call_timeout_s=5)
    body = examples.MEMORY_ESTIMATE["stored-model"]["value"]

    async def scenario() -> httpx.Response:
        holder = asyncio.create_task(client.async_client.get("/v1/models/llama-2-7b"))
        await asyncio.sleep(0.05)
        try:
            return await client.async_client.post("/v1/estimates/memory", json=body)
        finally:
            blocked_get_model.set()
            assert (await holder).status_code == 200

    response = client.run(scenario())
    assert response.status_code == 503
    assert response.headers["retry-after"] == "1"
    expected = _expected(
        503, "overloaded", **{"64 requests": "1 requests", "within 2 s": "within 0.2 s"}
    )
    assert _answer(response) == expected


def test_onnx_upload_too_large_example(make_client: ClientFactory) -> None:
    """The upload's own 413 example (CAPPLAN_MAX_IMPORT_BYTES), with a smaller limit."""
    client = make_client(max_import_bytes=2_000)
    response = client.post(
        "/v1/models/import/onnx",
        files={"file": ("model.onnx", onnx_models.small_cnn(), "application/octet-stream")},
        data={"slug": "my-resnet"},
    )
    assert response.status_code == 413
    expected = dict(IMPORT_TOO_LARGE_EXAMPLES["import-payload-too-large"]["value"])
    assert expected.pop("request_id")
    assert "104857600 bytes" in expected["detail"]
    expected["detail"] = expected["detail"].replace("104857600 bytes", "2000 bytes")
    assert _answer(response) == expected


def test_onnx_import_memory_example(make_client: ClientFactory) -> None:
    """The import gate's 413 example (CAPPLAN_IMPORT_MEMORY_BYTES), with a smaller budget."""
    client = make_client(import_memory_bytes=10_000)
    response = client.post(
        "/v1/models/import/onnx",
        files={"file": ("model.onnx", onnx_models.small_cnn(), "application/octet-stream")},
        data={"slug": "my-resnet"},
    )
    assert response.status_code == 413
    expected = dict(IMPORT_TOO_LARGE_EXAMPLES["import-memory-too-large"]["value"])
    assert expected.pop("request_id")
    declared = int(response.request.headers["content-length"])
    assert expected["detail"] == import_memory_detail(104_857_600, 209_715_200)
    expected["detail"] = import_memory_detail(declared, 10_000)
    assert _answer(response) == expected
