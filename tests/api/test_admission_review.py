"""The webhook as Kubernetes calls it: versions, hostile bodies, outages, and the decision cache.

* another ``apiVersion``/``kind`` is a 422 problem (never evaluated as v1);
* every other body gets an AdmissionReview (never a 500), the uid echoed when it can be read;
* an unreachable, failing or hanging database is answered by the failure policy within 1 s;
* a cached decision needs no database, and a write is reflected at once through this process
  and within the staleness bound through another (another app on the same database stands in for
  another worker process or replica).
"""

from __future__ import annotations

import asyncio
import copy
import json
import threading
import time
from collections.abc import Callable
from typing import Any

import anyio
import pytest
from sqlalchemy import delete, func, select
from sqlalchemy.orm import Session

from app.api.database import Database, unavailable
from app.db.models import AdmissionDecision, Hardware, Workload, utcnow
from app.domain.budget import checkpoint
from app.main import create_app
from app.services import admission as admission_service
from app.services import decision_store, state_cache
from tests.api.helpers import PROBLEM_JSON, assert_problem, without_slug
from tests.api.test_admission import BIG, CHAT, NOTES, _container, review
from tests.support import ApiClient, ClientFactory, ServiceClock, db_session, settings_for

# Wall-clock bounds: run alone after the parallel pass (scripts/test.sh), not beside it.
pytestmark = pytest.mark.timing

REFUSED_URL = "postgresql+psycopg://postgres@127.0.0.1:1/none"  # nothing listens on port 1
FITS = {"nvidia.com/mig-1g.10gb": "1"}
UID = "2b5c1a0e-7d1f-4c55-9a37-5a0f1f3c9e11"
A100_80 = "nvidia-a100-80gb-sxm"
GPT2 = {"model": "gpt-2", "mode": "inference", "batch_size": 1, "sequence_length": 128,
        "precision": "bf16"}  # fmt: skip


STALENESS_S = 0.3  # a short cross-process bound, so that tests waiting for it stay fast


@pytest.fixture
def make(make_client: ClientFactory) -> ClientFactory:
    """Clients of the real app with a short staleness bound."""

    def build(**overrides: Any) -> ApiClient:
        return make_client(**{"cache_staleness_s": STALENESS_S, **overrides})

    return build


def _post(client: ApiClient, body: Any) -> dict[str, Any]:
    # json.dumps escapes lone surrogates (httpx's json= cannot encode them).
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    response = client.post(
        "/v1/admission/pods", content=raw, headers={"content-type": "application/json"}
    )
    assert response.status_code == 200, response.text
    assert response.headers["content-type"] == "application/json"
    answer: dict[str, Any] = response.json()
    assert answer["apiVersion"] == "admission.k8s.io/v1"
    assert answer["kind"] == "AdmissionReview"
    assert set(answer["response"]) <= {"uid", "allowed", "status", "warnings"}
    assert isinstance(answer["response"]["allowed"], bool)
    return dict(answer["response"])


def _stored(client: ApiClient) -> ApiClient:
    for body in (CHAT, BIG):
        assert client.post("/v1/workloads", json=body).status_code == 201
    return client


def _bound_s(client: ApiClient) -> float:
    return state_cache.staleness_of(client.app.state.settings)


# -- versions -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("apiVersion", "admission.k8s.io/v1beta1"),
        ("apiVersion", "x/y"),
        ("apiVersion", 5),
        ("kind", "Foo"),
        ("kind", ["AdmissionReview"]),
    ],
)
def test_another_version_or_kind_is_a_422_not_a_v1_answer(
    client: ApiClient, field: str, value: Any
) -> None:
    body = review(_container("server", FITS), annotations=NOTES, uid=UID)
    body[field] = value
    problem = assert_problem(client.post("/v1/admission/pods", json=body), 422)
    assert problem["errors"][0]["pointer"] == f"/{field}"
    assert "admission.k8s.io/v1" in problem["detail"]


@pytest.mark.parametrize("missing", ["apiVersion", "kind"])
@pytest.mark.parametrize("policy", ["deny", "allow"])
def test_a_missing_version_or_kind_is_answered_by_the_policy(
    make: ClientFactory, missing: str, policy: str
) -> None:
    client = _stored(make(admission_failure_policy=policy))
    body = review(_container("server", FITS), annotations=NOTES, uid=UID)
    assert _post(client, body)["allowed"] is True  # complete, it fits
    del body[missing]
    answer = _post(client, body)
    assert answer["uid"] == UID
    assert answer["allowed"] is (policy == "allow")
    assert f"{missing} missing" in answer["status"]["message"]


# -- hostile and malformed bodies -----------------------------------------------------------


def _nested(depth: int) -> bytes:
    return b"[" * depth + b"]" * depth


@pytest.mark.parametrize(
    "raw",
    [
        pytest.param(_nested(10_000), id="array-10000-deep"),
        pytest.param(b'{"a":' * 10_000 + b"1" + b"}" * 10_000, id="object-10000-deep"),
        pytest.param(
            b'{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"u",'
            b'"object":' + _nested(10_000) + b"}}",
            id="review-with-a-deep-object",
        ),
        pytest.param(b"[]", id="array"),
        pytest.param(b'"review"', id="string"),
        pytest.param(b"1e999", id="number"),
        pytest.param(b"true", id="bool"),
        pytest.param(b"\xff\xfe\x00", id="not-utf8"),
        pytest.param(b"", id="empty"),
    ],
)
def test_unreadable_bodies_get_an_admission_review(client: ApiClient, raw: bytes) -> None:
    answer = _post(client, raw)
    assert answer["uid"] == ""
    assert answer["allowed"] is False
    assert answer["status"] == {
        "code": 403,
        "message": "denied: malformed AdmissionReview: request.uid is missing",
    }


def _set(path: str, value: Any) -> Callable[[dict[str, Any]], None]:
    def change(pod: dict[str, Any]) -> None:
        *parents, last = path.split(".")
        target = pod
        for name in parents:
            target = target[int(name)] if isinstance(target, list) else target[name]
        if isinstance(target, list):
            target[int(last)] = value
        else:
            target[last] = value

    return change


GARBAGE: dict[str, Callable[[dict[str, Any]], None]] = {
    "object-is-a-number": lambda body: body["request"].update(object=5),
    "object-is-a-deployment": lambda body: body["request"]["object"].update(kind="Deployment"),
    "spec-is-a-list": lambda body: _set("spec", [])(body["request"]["object"]),
    "containers-not-objects": lambda body: _set("spec.containers", [1, "x"])(
        body["request"]["object"]
    ),
    "resources-a-string": lambda body: _set("spec.containers.0.resources", "gpu")(
        body["request"]["object"]
    ),
    "limits-a-list": lambda body: _set("spec.containers.0.resources", {"limits": [1]})(
        body["request"]["object"]
    ),
    "quantity-negative": lambda body: _set(
        "spec.containers.0.resources", {"limits": {"nvidia.com/gpu": "-1"}}
    )(body["request"]["object"]),
    "quantity-huge": lambda body: _set(
        "spec.containers.0.resources", {"limits": {"nvidia.com/gpu": "9" * 5000}}
    )(body["request"]["object"]),
    "gpu-with-nul": lambda body: _set(
        "metadata.annotations", {**NOTES, "capacity-planner.io/gpu": "nvidia\x00a100"}
    )(body["request"]["object"]),
    "gpu-uppercase": lambda body: _set(
        "metadata.annotations", {**NOTES, "capacity-planner.io/gpu": "NVIDIA-A100"}
    )(body["request"]["object"]),
    "gpu-unknown": lambda body: _set(
        "metadata.annotations", {**NOTES, "capacity-planner.io/gpu": "nvidia-x9"}
    )(body["request"]["object"]),
    "workload-with-surrogate": lambda body: _set(
        "metadata.annotations", {**NOTES, "capacity-planner.io/workload": "chat\ud800"}
    )(body["request"]["object"]),
    "workload-10k-chars": lambda body: _set(
        "metadata.annotations", {**NOTES, "capacity-planner.io/workload": "w" * 10_000}
    )(body["request"]["object"]),
    "inline-model-with-nul": lambda body: _set(
        "metadata.annotations",
        {"capacity-planner.io/model": "gpt\x002", "capacity-planner.io/gpu": A100_80},
    )(body["request"]["object"]),
    "inline-batch-not-a-number": lambda body: _set(
        "metadata.annotations",
        {
            "capacity-planner.io/model": "gpt-2",
            "capacity-planner.io/batch-size": "lots",
            "capacity-planner.io/gpu": A100_80,
        },
    )(body["request"]["object"]),
    "annotations-a-list": lambda body: _set("metadata.annotations", ["x"])(
        body["request"]["object"]
    ),
    "unknown-mig-profile": lambda body: _set(
        "spec.containers.0.resources", {"limits": {"nvidia.com/mig-9g.99gb": "1"}}
    )(body["request"]["object"]),
}


@pytest.mark.parametrize("name", sorted(GARBAGE))
@pytest.mark.parametrize("policy", ["deny", "allow"])
def test_a_review_with_a_uid_and_garbage_elsewhere_gets_a_policy_answer(
    make: ClientFactory, name: str, policy: str
) -> None:
    client = _stored(make(admission_failure_policy=policy))
    body = review(_container("server", FITS), annotations=NOTES, uid=UID)
    GARBAGE[name](body)
    answer = _post(client, body)
    assert answer["uid"] == UID
    assert "internal error" not in answer["status"]["message"]  # each has its own reason
    if policy == "deny":
        assert answer["allowed"] is False
        assert answer["status"]["code"] == 403
        assert answer["status"]["message"].startswith("denied: ")
    else:
        assert answer["allowed"] is True
        assert answer["status"]["message"].startswith("not checked: ")
        assert answer["warnings"][0].startswith("capacity-planner: ")


def test_uids_are_echoed_exactly(client: ApiClient) -> None:
    for uid in ('quote"and\\backslash', "üñï©ødé", "x" * 5000):
        body = review(_container("web", {"cpu": "1"}), uid=uid)
        assert _post(client, body)["uid"] == uid


# -- outages and internal errors ------------------------------------------------------------


def _refused_client(**overrides: Any) -> ApiClient:
    settings = settings_for(REFUSED_URL, db_connect_timeout_s=1, **overrides)
    return ApiClient(create_app(settings))


@pytest.mark.parametrize("policy", ["deny", "allow"])
def test_an_unreachable_database_is_answered_by_the_policy_within_a_second(policy: str) -> None:
    client = _refused_client(admission_failure_policy=policy)
    try:
        body = review(_container("server", FITS), annotations=NOTES, uid=UID)
        for _ in range(3):  # the first, and the next ones (no cached digest to lean on)
            clock = ServiceClock()
            answer = _post(client, body)
            assert clock.elapsed_s < 1.0
            assert answer["uid"] == UID
            assert answer["allowed"] is (policy == "allow")
            assert "database" in answer["status"]["message"]
        # A pod without GPUs needs no database: it is allowed whatever the policy.
        assert _post(client, review(_container("web"), uid=UID))["allowed"] is True
        # The other database routes say 503, not 500.
        fit = client.post("/v1/mig/fit", json={"gpu": A100_80, "workload": GPT2})
        assert fit.status_code == 503
        assert fit.headers["content-type"] == PROBLEM_JSON
    finally:
        client.close()


def test_a_hanging_database_is_answered_by_the_policy_in_time(
    make: ClientFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    client = make(admission_timeout_s=0.3)

    async def hang(self: Database, work: Any, *, timeout_s: float | None = None) -> Any:
        await anyio.sleep(30)

    monkeypatch.setattr(Database, "run", hang)
    clock = ServiceClock()
    answer = _post(client, review(_container("server", FITS), annotations=NOTES, uid=UID))
    assert clock.elapsed_s < 1.0
    assert answer["allowed"] is False
    assert "no decision within 0.3 s" in answer["status"]["message"]


@pytest.mark.parametrize(
    "error",
    [unavailable("OperationalError"), RuntimeError("bug"), RecursionError(), MemoryError()],
    ids=["unavailable", "bug", "recursion", "memory"],
)
def test_a_failing_evaluation_is_answered_by_the_policy(
    make: ClientFactory, monkeypatch: pytest.MonkeyPatch, error: BaseException
) -> None:
    client = _stored(make(admission_failure_policy="allow"))

    def fail(session: Session, *_: Any, **__: Any) -> Any:
        raise error

    monkeypatch.setattr(admission_service, "evaluate_with_digest", fail)
    monkeypatch.setattr(admission_service, "decision_table", fail)
    answer = _post(client, review(_container("server", FITS), annotations=NOTES, uid=UID))
    assert answer["uid"] == UID
    assert answer["allowed"] is True
    assert answer["warnings"][0].startswith("capacity-planner: ")


# -- the decision cache ---------------------------------------------------------------------


def test_a_cached_decision_needs_no_database(
    make: ClientFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    client = _stored(make())
    body = review(_container("server", FITS), annotations=NOTES, uid=UID)
    first = _post(client, body)
    assert first["allowed"] is True
    calls = 0
    real_run = Database.run

    async def counting(self: Database, work: Any, *, timeout_s: float | None = None) -> Any:
        nonlocal calls
        calls += 1
        return await real_run(self, work, timeout_s=timeout_s)

    monkeypatch.setattr(Database, "run", counting)
    start = time.perf_counter()
    for index in range(20):
        again = copy.deepcopy(body)
        again["request"]["uid"] = f"uid-{index}"
        assert _post(client, again) == {**first, "uid": f"uid-{index}"}
    periods = (time.perf_counter() - start) / _bound_s(client)
    # Only the digest is read, once per staleness period: never a query per review.
    assert calls <= int(periods) + 1 < 20


def _put(client: ApiClient, path: str, body: dict[str, Any]) -> None:
    etag = client.get(path).headers["etag"]
    response = client.put(path, json=body, headers={"If-Match": etag})
    assert response.status_code == 200, response.text


def _until(bound_s: float, check: Callable[[], bool]) -> float:
    """Seconds until ``check()`` holds; fails when it does not within the bound (+ slack)."""
    clock = ServiceClock()
    while not check():
        assert clock.elapsed_s < bound_s + 0.5, f"not reflected within {bound_s} s"
        time.sleep(0.02)
    return clock.elapsed_s


def test_a_write_through_another_process_is_reflected_within_the_bound(
    make: ClientFactory,
) -> None:
    webhook = _stored(make())
    other = make()  # another worker process or replica on the same database
    body = review(_container("server", FITS), annotations=NOTES, uid=UID)
    assert _post(webhook, body)["allowed"] is True
    too_big = {k: v for k, v in BIG.items() if k != "slug"}
    _put(other, "/v1/workloads/chat", {**too_big, "name": "Chat"})
    waited = _until(_bound_s(webhook), lambda: _post(webhook, body)["allowed"] is False)
    assert waited <= _bound_s(webhook) + 0.5
    assert "chat inference bs 8 bf16" in _post(webhook, body)["status"]["message"]


def test_a_delete_and_recreate_elsewhere_is_reflected(make: ClientFactory) -> None:
    webhook = make()
    other = make()
    assert other.post("/v1/workloads", json=CHAT).status_code == 201  # the only workload
    body = review(_container("server", FITS), annotations=NOTES, uid=UID)
    assert _post(webhook, body)["allowed"] is True
    etag = other.get("/v1/workloads/chat").headers["etag"]
    assert other.delete("/v1/workloads/chat", headers={"If-Match": etag}).status_code == 204
    # Same slug, same row count, version 1 again (and on SQLite maybe the same id).
    assert other.post("/v1/workloads", json={**BIG, "slug": "chat"}).status_code == 201
    _until(_bound_s(webhook), lambda: _post(webhook, body)["allowed"] is False)


def test_a_write_outside_the_api_is_reflected_within_the_bound(
    make: ClientFactory, db_url: str
) -> None:
    webhook = _stored(make())
    body = review(_container("server", FITS), annotations=NOTES, uid=UID)
    assert _post(webhook, body)["allowed"] is True
    with db_session(db_url) as session:  # another engine: this process's counter never moves
        row = session.scalars(select(Workload).where(Workload.slug == "chat")).one()
        row.batch_size, row.sequence_length, row.updated_at = 512, 4096, utcnow()
        session.commit()
    _until(_bound_s(webhook), lambda: _post(webhook, body)["allowed"] is False)


def test_writes_through_this_process_are_reflected_at_once(client: ApiClient) -> None:
    _stored(client)
    body = review(_container("server", FITS), annotations=NOTES, uid=UID)
    assert _post(client, body)["allowed"] is True
    _put(client, "/v1/workloads/chat", {**without_slug(BIG), "name": "Chat"})
    assert _post(client, body)["allowed"] is False  # no waiting
    _put(client, "/v1/workloads/chat", {**without_slug(CHAT)})
    assert _post(client, body)["allowed"] is True


def test_mig_fit_answers_follow_writes(make: ClientFactory) -> None:
    client = _stored(make())
    other = make()
    request = {"gpu": A100_80, "workload": "chat"}
    first = client.post("/v1/mig/fit", json=request)
    assert first.status_code == 200
    assert first.json()["smallest_fitting_profile"] == "1g.10gb"
    assert client.post("/v1/mig/fit", json=request).json() == first.json()  # cached, equal
    _put(client, "/v1/workloads/chat", {**without_slug(BIG), "name": "Chat"})
    moved = client.post("/v1/mig/fit", json=request).json()  # this process: at once
    assert moved["smallest_fitting_profile"] != "1g.10gb"
    _put(other, "/v1/workloads/chat", {**without_slug(CHAT)})  # another process: bounded

    def back() -> bool:
        return bool(
            client.post("/v1/mig/fit", json=request).json()["smallest_fitting_profile"] == "1g.10gb"
        )

    _until(_bound_s(client), back)


# -- stored decisions under the real budget -------------------------------------------------


def test_a_burst_of_distinct_stored_workloads_is_decided_on_their_merits(
    client: ApiClient,
) -> None:
    """The default budget (0.8 s): every review of a stored workload reads its stored decision,
    so a burst of distinct ones (no answer cache to lean on) is decided, none by the policy."""
    count = 40
    for index in range(count):
        body = {**CHAT, "slug": f"chat-{index}", "batch_size": index + 1}
        assert client.post("/v1/workloads", json=body).status_code == 201

    async def one(index: int) -> dict[str, Any]:
        notes = {**NOTES, "capacity-planner.io/workload": f"chat-{index}"}
        body = review(_container("server", FITS), annotations=notes, uid=f"u{index}")
        response = await client.async_client.post("/v1/admission/pods", json=body)
        return dict(response.json()["response"])

    async def burst() -> list[dict[str, Any]]:
        return await asyncio.gather(*(one(i) for i in range(count)))

    answers = client.run(burst())
    on_merits = [a for a in answers if " needs " in a["status"]["message"]]
    assert len(on_merits) == count, [a["status"]["message"] for a in answers if a not in on_merits]
    assert {a["uid"] for a in answers} == {f"u{i}" for i in range(count)}


def test_an_estimate_in_the_review_stops_with_its_answer(
    make: ClientFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Inline annotations (no stored decision) are estimated within the review's deadline; an
    estimate still running then stops at its next checkpoint: nothing computes after the
    answer, and no database call stays stuck."""
    client = make(admission_timeout_s=0.3)
    running = threading.Event()
    stopped = threading.Event()

    def endless(*_: Any, **__: Any) -> Any:
        running.set()
        try:
            while True:
                checkpoint()
        finally:
            stopped.set()

    monkeypatch.setattr(decision_store, "required_memory", endless)
    notes = {"capacity-planner.io/model": "gpt-2", "capacity-planner.io/gpu": A100_80}
    clock = ServiceClock()
    answer = _post(client, review(_container("server", FITS), annotations=notes, uid=UID))
    assert clock.elapsed_s < 1.0
    assert running.is_set()
    assert answer["allowed"] is False
    assert "no decision within 0.3 s" in answer["status"]["message"]
    _until(1.0, stopped.is_set)  # else the estimate kept computing after the review's answer
    database: Database = client.app.state.database
    _until(1.0, lambda: database.stuck == 0)


def test_the_refresher_stores_what_a_review_found_missing(make: ClientFactory, db_url: str) -> None:
    """Decisions deleted (as after an upgrade to revision 0008): the first review is decided by
    the bounded path and wakes the refresher, whose thread stores every missing decision."""
    client = _stored(make(admission_timeout_s=5))
    with db_session(db_url) as session:
        session.execute(delete(AdmissionDecision))
        session.commit()
        hardware = session.scalar(select(func.count()).select_from(Hardware)) or 0
    answer = _post(client, review(_container("server", FITS), annotations=NOTES, uid=UID))
    assert answer["allowed"] is True

    def stored() -> bool:
        with db_session(db_url) as session:
            count = session.scalar(select(func.count()).select_from(AdmissionDecision))
        return count == 2 * hardware

    _until(10.0, stored)
