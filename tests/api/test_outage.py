"""A database that refuses connections or answers nothing: 503s naming it, quickly, not 500s.

Every route that depends on the database gateway (found from the routes' dependencies) is
called with a request that reaches the database on a healthy one (checked first, on the test
database), then on an app whose PostgreSQL is unreachable: refused (a port nothing listens on)
or frozen (a socket that accepts and never answers, like a SIGSTOPped server). Each answers
503 application/problem+json with Retry-After and a database problem type within the
configured timeouts; the admission webhook answers a valid AdmissionReview by its failure
policy within 1 s; /healthz stays 200 and /readyz says 503.
"""

from __future__ import annotations

import asyncio
import copy
import json
import re
import socket
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest

from app.api.auth_gate import route_dependants
from app.api.deps import get_database
from app.api.routes.admission import REVIEW_EXAMPLE
from app.config import PROJECT_ROOT
from app.main import create_app
from tests.api.helpers import PROBLEM_JSON, hardware, model, without_slug
from tests.importers import onnx_models
from tests.support import ApiClient, ServiceClock, settings_for

# Wall-clock bounds: run alone after the parallel pass (scripts/test.sh), not beside it.
pytestmark = pytest.mark.timing

REFUSED_URL = "postgresql+psycopg://postgres@127.0.0.1:1/none"
CALL_TIMEOUT_S = 0.5
CONNECT_TIMEOUT_S = 1
ADMISSION_TIMEOUT_S = 0.5
# Requests run concurrently; each must be answered within its deadline plus scheduling slack.
SLACK_S = 1.0

A100 = "nvidia-a100-80gb-sxm"
INFERENCE = {"model": "gpt-2", "mode": "inference", "batch_size": 1, "sequence_length": 128,
             "precision": "bf16"}  # fmt: skip
ESTIMATE = {"model": "resnet-50", "mode": "inference", "batch_size": 1, "precision": "bf16"}
WORKLOAD = {"slug": "outage-chat", "name": "Chat", **INFERENCE, "hardware": A100}
GPT2_CONFIG = json.loads((PROJECT_ROOT / "tests/fixtures/hf_configs/gpt2.json").read_text())
IF_MATCH = {"If-Match": '"1"'}


@dataclass(frozen=True)
class Call:
    method: str
    path: str
    kwargs: dict[str, Any] = field(default_factory=dict)


# One request per database route, keyed by route template; each is valid (it reaches the
# database when the database is up), so an outage can only show up as the database's 503.
CALLS: dict[tuple[str, str], Call] = {
    ("GET", "/readyz"): Call("GET", "/readyz"),
    ("GET", "/v1/hardware"): Call("GET", "/v1/hardware"),
    ("GET", "/v1/hardware/{slug}"): Call("GET", "/v1/hardware/nvidia-t4"),
    ("POST", "/v1/hardware"): Call("POST", "/v1/hardware", {"json": hardware()}),
    ("PUT", "/v1/hardware/{slug}"): Call(
        "PUT",
        f"/v1/hardware/{hardware()['slug']}",
        {"json": without_slug(hardware()), "headers": IF_MATCH},
    ),
    ("DELETE", "/v1/hardware/{slug}"): Call(
        "DELETE", "/v1/hardware/no-such-gpu", {"headers": IF_MATCH}
    ),
    ("POST", "/v1/models/import/hf-config"): Call(
        "POST", "/v1/models/import/hf-config", {"json": {"slug": "gpt2-x", "config": GPT2_CONFIG}}
    ),
    ("POST", "/v1/models/import/onnx"): Call(
        "POST",
        "/v1/models/import/onnx",
        {
            "files": {"file": ("m.onnx", onnx_models.small_cnn(), "application/octet-stream")},
            "data": {"slug": "onnx-x"},
        },
    ),
    ("GET", "/v1/models"): Call("GET", "/v1/models"),
    ("GET", "/v1/models/{slug}"): Call("GET", "/v1/models/resnet-50"),
    ("POST", "/v1/models"): Call("POST", "/v1/models", {"json": model()}),
    ("PUT", "/v1/models/{slug}"): Call(
        "PUT",
        f"/v1/models/{model()['slug']}",
        {"json": without_slug(model()), "headers": IF_MATCH},
    ),
    ("DELETE", "/v1/models/{slug}"): Call(
        "DELETE", "/v1/models/no-such-model", {"headers": IF_MATCH}
    ),
    ("GET", "/v1/models/{slug}/summary"): Call("GET", "/v1/models/resnet-50/summary"),
    ("POST", "/v1/estimates/memory"): Call("POST", "/v1/estimates/memory", {"json": ESTIMATE}),
    ("GET", "/v1/estimates/memory"): Call("GET", "/v1/estimates/memory", {"params": ESTIMATE}),
    ("GET", "/v1/estimates/memory.svg"): Call(
        "GET", "/v1/estimates/memory.svg", {"params": ESTIMATE}
    ),
    ("GET", "/v1/workloads"): Call("GET", "/v1/workloads"),
    ("GET", "/v1/workloads/{slug}"): Call("GET", "/v1/workloads/outage-chat"),
    ("GET", "/v1/workloads/{slug}/memory"): Call("GET", "/v1/workloads/outage-chat/memory"),
    ("POST", "/v1/workloads"): Call("POST", "/v1/workloads", {"json": WORKLOAD}),
    ("PUT", "/v1/workloads/{slug}"): Call(
        "PUT",
        "/v1/workloads/outage-chat",
        {"json": without_slug(WORKLOAD), "headers": IF_MATCH},
    ),
    ("DELETE", "/v1/workloads/{slug}"): Call(
        "DELETE", "/v1/workloads/no-such-workload", {"headers": IF_MATCH}
    ),
    ("GET", "/v1/hardware/{slug}/mig-profiles"): Call("GET", f"/v1/hardware/{A100}/mig-profiles"),
    ("POST", "/v1/mig/fit"): Call(
        "POST", "/v1/mig/fit", {"json": {"gpu": A100, "workload": INFERENCE}}
    ),
    ("POST", "/v1/mig/layouts/validate"): Call(
        "POST",
        "/v1/mig/layouts/validate",
        {"json": {"gpu": A100, "instances": [{"profile": "1g.10gb", "start": 0}]}},
    ),
    ("POST", "/v1/mig/plan"): Call(
        "POST",
        "/v1/mig/plan",
        {"json": {"gpu": A100, "workloads": [{"name": "a", "profile": "1g.10gb", "replicas": 2}]}},
    ),
    ("POST", "/v1/admission/pods"): Call("POST", "/v1/admission/pods", {"json": REVIEW_EXAMPLE}),
    ("POST", "/v1/admission/check"): Call(
        "POST",
        "/v1/admission/check",
        {"json": {"workload": INFERENCE, "resource": "nvidia.com/mig-1g.10gb", "gpu_model": A100}},
    ),
    ("POST", "/v1/engines/vllm/memory"): Call(
        "POST",
        "/v1/engines/vllm/memory",
        {"json": {"model": "llama-3-8b", "hardware": "nvidia-h100-sxm"}},
    ),
    ("POST", "/v1/recommendations/inference"): Call(
        "POST", "/v1/recommendations/inference", {"json": {"model": "resnet-50"}}
    ),
    ("GET", "/v1/recommendations/roofline.svg"): Call(
        "GET",
        "/v1/recommendations/roofline.svg",
        {"params": {"model": "resnet-50", "devices": A100}},
    ),
}
NOT_AN_API_ERROR = {("GET", "/readyz"), ("POST", "/v1/admission/pods")}  # checked on their own


WITHOUT_DATABASE_DEPENDENCY = {("POST", "/v1/admission/pods")}


def _database_routes(client: ApiClient) -> set[tuple[str, str]]:
    def uses_database(dependant: Any) -> bool:
        return any(d.call is get_database or uses_database(d) for d in dependant.dependencies)

    return {
        (method, str(getattr(route, "path", "")))
        for route, dependant in route_dependants(client.app.router)
        if uses_database(dependant)
        for method in getattr(route, "methods", ())
    }


async def _timed(client: httpx.AsyncClient, call: Call) -> tuple[httpx.Response, float]:
    clock = ServiceClock()
    response = await client.request(call.method, call.path, **copy.deepcopy(call.kwargs))
    return response, clock.elapsed_s


def _all(client: ApiClient) -> dict[tuple[str, str], tuple[httpx.Response, float]]:
    async def fire() -> list[tuple[httpx.Response, float]]:
        async with asyncio.timeout(30):
            return await asyncio.gather(*(_timed(client.async_client, c) for c in CALLS.values()))

    return dict(zip(CALLS, client.run(fire()), strict=True))


@pytest.fixture
def frozen_database() -> Iterator[str]:
    """A PostgreSQL URL whose server accepts connections and never says a word."""
    listener = socket.create_server(("127.0.0.1", 0), backlog=128)
    port = listener.getsockname()[1]
    try:
        yield f"postgresql+psycopg://postgres@127.0.0.1:{port}/none"
    finally:
        listener.close()


def _outage_client(url: str) -> ApiClient:
    return ApiClient(
        create_app(
            settings_for(
                url,
                db_pool_size=len(CALLS),  # all at once: each request meets the outage itself
                db_connect_timeout_s=CONNECT_TIMEOUT_S,
                db_call_timeout_s=CALL_TIMEOUT_S,
                db_queue_timeout_s=CALL_TIMEOUT_S,
                admission_timeout_s=ADMISSION_TIMEOUT_S,
            )
        )
    )


def test_every_database_route_has_a_request(client: ApiClient) -> None:
    # The webhook reaches the database through app.state (a dependency is solved per request).
    assert _database_routes(client) | WITHOUT_DATABASE_DEPENDENCY == set(CALLS)


def test_the_requests_reach_the_database_when_it_is_up(client: ApiClient) -> None:
    for route, (response, _) in _all(client).items():
        assert response.status_code < 500, (route, response.text)
        if response.status_code in (400, 422):  # a bad request never reaches the database
            assert response.json()["type"] not in (
                "/problems/validation-error",
                "/problems/malformed-json",
            ), (route, response.text)


def _during_outage(
    outage: str, request: pytest.FixtureRequest
) -> tuple[dict[tuple[str, str], tuple[httpx.Response, float]], httpx.Response]:
    """Every request at once against an unreachable database, then /healthz."""
    url = REFUSED_URL if outage == "refused" else request.getfixturevalue("frozen_database")
    client = _outage_client(url)
    try:
        return _all(client), client.get("/healthz")
    finally:
        client.close()


@pytest.mark.parametrize("outage", ["refused", "frozen"])
def test_an_unreachable_database_is_a_quick_503_naming_it(
    outage: str, request: pytest.FixtureRequest
) -> None:
    answers, health = _during_outage(outage, request)
    deadline_s = max(CALL_TIMEOUT_S, CONNECT_TIMEOUT_S) + SLACK_S
    for route, (response, seconds) in answers.items():
        assert seconds < deadline_s, (route, seconds)
        if route in NOT_AN_API_ERROR:
            continue
        assert response.status_code == 503, (route, response.text)
        assert response.headers["content-type"] == PROBLEM_JSON
        assert response.headers["retry-after"].isdigit()
        problem = response.json()
        assert re.fullmatch(r"/problems/database-(unavailable|busy)", problem["type"]), problem
        assert "database" in problem["detail"]
    ready, _ = answers[("GET", "/readyz")]
    assert ready.status_code == 503
    assert ready.headers["content-type"] == PROBLEM_JSON
    assert health.status_code == 200


@pytest.mark.parametrize("outage", ["refused", "frozen"])
def test_the_webhook_answers_by_its_failure_policy_within_a_second(
    outage: str, request: pytest.FixtureRequest
) -> None:
    answers, _ = _during_outage(outage, request)
    review, seconds = answers[("POST", "/v1/admission/pods")]
    assert seconds < 1.0
    assert review.status_code == 200, review.text
    answer = review.json()
    assert answer["apiVersion"] == "admission.k8s.io/v1"
    assert answer["kind"] == "AdmissionReview"
    assert answer["response"]["uid"] == REVIEW_EXAMPLE["request"]["uid"]
    assert answer["response"]["allowed"] is False  # the default failure policy: deny
