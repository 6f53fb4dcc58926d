"""Stored admission decisions: computed when the planning data is written, read by reviews.

* a review of a stored workload reads its stored decision and estimates nothing;
* writes of the workload, its model or the hardware recompute it in the same transaction;
* a missing or stale decision takes the bounded path (estimated within the review's deadline,
  the refresher poked) and the refresher's sweep stores it;
* a workload too expensive to evaluate is stored as such and answered by the failure policy;
* the review's parse is bounded (containers, GPU requests).
"""

from __future__ import annotations

import asyncio
import copy
from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import delete, func, select, update

from app.api.database import Database
from app.api.decision_refresher import DecisionRefresher
from app.db.models import AdmissionDecision, Hardware, Workload, utcnow
from app.domain.admission import MAX_CONTAINERS, MAX_GPU_REQUESTS
from app.domain.budget import checkpoint
from app.services import admission as admission_service
from app.services import decision_store
from tests.api.helpers import assert_problem, hardware, model, without_slug
from tests.api.test_admission import BIG, CHAT, NOTES, _answer, _container, _put, review
from tests.support import ApiClient, ClientFactory, db_session, table_counts

GENEROUS_S = 20.0  # these tests check outcomes, not time (test_admission_review.py does)
FITS = {"nvidia.com/mig-1g.10gb": "1"}


@pytest.fixture
def client(make_client: ClientFactory) -> ApiClient:
    return make_client(admission_timeout_s=GENEROUS_S)


@pytest.fixture
def pokes(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Records the refresher's pokes instead of starting its thread."""
    calls: list[int] = []
    monkeypatch.setattr(DecisionRefresher, "poke", lambda self: calls.append(1))
    return calls


@pytest.fixture
def no_estimates(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Reviews that estimate fail the test (it records who tried)."""
    tried: list[str] = []

    def refuse(*_: Any, label: str, **__: Any) -> Any:
        tried.append(label)
        raise AssertionError("a review estimated")

    monkeypatch.setattr(admission_service, "evaluation_of", refuse)
    return tried


def _decisions(db_url: str, slug: str) -> list[AdmissionDecision]:
    with db_session(db_url) as session:
        query = (
            select(AdmissionDecision)
            .join(Workload, Workload.id == AdmissionDecision.workload_id)
            .where(Workload.slug == slug)
        )
        rows = list(session.scalars(query))
        session.expunge_all()
        return rows


def _on(db_url: str, slug: str, gpu: str) -> AdmissionDecision:
    with db_session(db_url) as session:
        hardware_id = session.scalars(select(Hardware.id).where(Hardware.slug == gpu)).one()
    (found,) = [d for d in _decisions(db_url, slug) if d.hardware_id == hardware_id]
    return found


def test_a_write_stores_a_decision_per_hardware_profile(client: ApiClient, db_url: str) -> None:
    assert client.post("/v1/workloads", json=CHAT).status_code == 201
    with db_session(db_url) as session:
        profiles = session.scalar(select(func.count()).select_from(Hardware))
    stored = _decisions(db_url, "chat")
    assert len(stored) == profiles
    assert {d.outcome for d in stored} == {"estimated"}
    assert {d.evaluator for d in stored} == {decision_store.EVALUATOR}
    a100 = _on(db_url, "chat", NOTES["capacity-planner.io/gpu"])
    assert a100.summary == "chat inference bs 1 bf16"
    assert a100.smallest_fitting_resource == "nvidia.com/mig-1g.10gb"
    assert a100.resources["nvidia.com/gpu"] == 80 * 2**30
    assert "nvidia.com/mig-7g.80gb" in a100.resources
    # The simple form estimates with the same rules: the same requirement.
    check = client.post(
        "/v1/admission/check",
        json={"workload": "chat", "gpu_model": NOTES["capacity-planner.io/gpu"],
              "resource": "nvidia.com/mig-1g.10gb"},
    )  # fmt: skip
    assert check.json()["required_bytes"] == a100.required_bytes


def test_a_review_of_a_stored_workload_estimates_nothing(
    client: ApiClient, no_estimates: list[str], pokes: list[int]
) -> None:
    for body in (CHAT, BIG):
        assert client.post("/v1/workloads", json=body).status_code == 201
    fits = _answer(client, review(_container("server", FITS), annotations=NOTES))
    assert fits["allowed"] is True
    assert fits["status"]["message"].startswith("chat inference bs 1 bf16 needs ")
    notes = {**NOTES, "capacity-planner.io/workload": "llama-chat"}
    denied = _answer(client, review(_container("server", FITS), annotations=notes))
    assert denied["allowed"] is False
    assert "smallest fitting: mig-3g.40gb" in denied["status"]["message"]
    # Resources the GPU does not offer are decided from the stored row too.
    body = review(_container("s", {"nvidia.com/mig-9g.1gb": "1"}), annotations=NOTES)
    odd = _answer(client, body)
    assert odd["allowed"] is False
    message = odd["status"]["message"]
    assert "has no nvidia.com/mig-9g.1gb; valid: nvidia.com/mig-1g.10gb" in message
    assert no_estimates == []
    assert pokes == []


def test_workload_model_and_hardware_writes_recompute_the_decision(
    client: ApiClient, db_url: str, no_estimates: list[str], pokes: list[int]
) -> None:
    assert client.post("/v1/hardware", json=hardware()).status_code == 201
    assert client.post("/v1/models", json=model()).status_code == 201
    trainer = {"slug": "trainer", "name": "Trainer", "model": "tiny-cnn", "mode": "training",
               "batch_size": 512, "precision": "fp32"}  # fmt: skip
    assert client.post("/v1/workloads", json=trainer).status_code == 201
    notes = {"capacity-planner.io/workload": "trainer", "capacity-planner.io/gpu": "lab-gpu-1"}
    body = review(_container("t", {"nvidia.com/mig-1g.3gb": "1"}), annotations=notes)
    assert _answer(client, body)["allowed"] is True
    first = _on(db_url, "trainer", "lab-gpu-1")
    # Hardware: the slice shrinks to 600 MiB, less than the CUDA context alone.
    smaller = hardware()
    smaller["mig"]["profiles"][0]["memory_mib"] = 600
    _put(client, "/v1/hardware/lab-gpu-1", without_slug(smaller))
    after_hardware = _on(db_url, "trainer", "lab-gpu-1")
    assert after_hardware.hardware_version == first.hardware_version + 1
    assert after_hardware.resources["nvidia.com/mig-1g.3gb"] == 600 * 2**20
    denied = _answer(client, body)
    assert denied["allowed"] is False
    assert "gives 0.6 GiB usable" in denied["status"]["message"]
    _put(client, "/v1/hardware/lab-gpu-1", without_slug(hardware()))
    assert _answer(client, body)["allowed"] is True
    # Model: wider layers need more memory.
    wide = model()
    wide["layers"][0] = {**wide["layers"][0], "out_channels": 512}
    _put(client, "/v1/models/tiny-cnn", without_slug(wide))
    after_model = _on(db_url, "trainer", "lab-gpu-1")
    assert after_model.model_version == first.model_version + 1
    assert (after_model.required_bytes or 0) > (first.required_bytes or 0)
    assert _answer(client, body)["allowed"] is False
    # Workload: a smaller batch fits again.
    _put(client, "/v1/workloads/trainer", {**without_slug(trainer), "batch_size": 1})
    assert _on(db_url, "trainer", "lab-gpu-1").workload_version == first.workload_version + 1
    assert _answer(client, body)["allowed"] is True
    assert no_estimates == []
    assert pokes == []


def test_deletes_remove_the_decisions(client: ApiClient, db_url: str) -> None:
    assert client.post("/v1/hardware", json=hardware()).status_code == 201
    assert client.post("/v1/workloads", json=CHAT).status_code == 201
    assert _on(db_url, "chat", "lab-gpu-1").outcome == "estimated"
    etag = client.get("/v1/hardware/lab-gpu-1").headers["etag"]
    assert client.delete("/v1/hardware/lab-gpu-1", headers={"If-Match": etag}).status_code == 204
    assert all(d.hardware_id for d in _decisions(db_url, "chat"))
    with db_session(db_url) as session:
        orphans = session.scalar(
            select(func.count())
            .select_from(AdmissionDecision)
            .where(AdmissionDecision.hardware_id.not_in(select(Hardware.id)))
        )
        assert orphans == 0
    etag = client.get("/v1/workloads/chat").headers["etag"]
    assert client.delete("/v1/workloads/chat", headers={"If-Match": etag}).status_code == 204
    with db_session(db_url) as session:
        assert session.scalar(select(func.count()).select_from(AdmissionDecision)) == 0


def test_a_stale_decision_takes_the_bounded_path_then_is_refreshed(
    client: ApiClient, db_url: str, pokes: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A write outside the service (another release, a script): the review estimates within its
    deadline and pokes the refresher, whose sweep stores the fresh decision."""
    assert client.post("/v1/workloads", json=CHAT).status_code == 201
    body = review(_container("server", FITS), annotations=NOTES)
    assert _answer(client, body)["allowed"] is True
    with db_session(db_url) as session:
        row = session.scalars(select(Workload).where(Workload.slug == "chat")).one()
        row.batch_size, row.sequence_length, row.updated_at = 512, 1024, utcnow()
        session.commit()
    admission_service.DECISIONS.clear()  # the caches notice within their bound (not timed here)
    admission_service.TABLES.clear()
    stale = _answer(client, body)
    assert stale["allowed"] is False  # decided on its merits, by the bounded path
    assert "chat inference bs 512 bf16" in stale["status"]["message"]
    assert pokes == [1]
    with db_session(db_url) as session:
        stored = decision_store.refresh_stale(session)
        assert stored == len(_decisions(db_url, "chat"))
        assert decision_store.refresh_stale(session) == 0  # nothing left
    refreshed = _on(db_url, "chat", NOTES["capacity-planner.io/gpu"])
    assert refreshed.summary == "chat inference bs 512 bf16"

    def refuse(*_: Any, **__: Any) -> Any:
        raise AssertionError("a review estimated")

    monkeypatch.setattr(admission_service, "evaluation_of", refuse)
    other = copy.deepcopy(body)  # another key: not the answer cache
    other["request"]["object"]["spec"]["containers"][0]["resources"]["limits"] = {
        "nvidia.com/gpu": "1"
    }
    assert "bs 512" in _answer(client, other)["status"]["message"]
    assert pokes == [1]


def test_missing_decisions_after_an_upgrade_are_decided_and_filled(
    client: ApiClient, db_url: str, pokes: list[int]
) -> None:
    """Rows stored before revision 0008 have no decisions: reviews still decide them on their
    merits, and one sweep stores every missing pair."""
    for body in (CHAT, BIG):
        assert client.post("/v1/workloads", json=body).status_code == 201
    with db_session(db_url) as session:
        session.execute(delete(AdmissionDecision))
        session.commit()
    assert _answer(client, review(_container("s", FITS), annotations=NOTES))["allowed"] is True
    assert pokes
    with db_session(db_url) as session:
        profiles = session.scalar(select(func.count()).select_from(Hardware)) or 0
        assert decision_store.refresh_stale(session, limit=10_000) == 2 * profiles
    assert len(_decisions(db_url, "llama-chat")) == profiles


def test_another_releases_decisions_are_not_read(
    client: ApiClient, db_url: str, pokes: list[int]
) -> None:
    assert client.post("/v1/workloads", json=CHAT).status_code == 201
    with db_session(db_url) as session:  # as if an older release had computed them
        session.execute(
            update(AdmissionDecision).values(evaluator="older-release", required_bytes=1)
        )
        session.commit()
    answer = _answer(client, review(_container("s", {"nvidia.com/gpu": "1"}), annotations=NOTES))
    assert "needs 0.0 GiB" not in answer["status"]["message"]
    assert pokes == [1]


def _endless_estimate(calls: list[int]) -> Any:
    def estimate(*_: Any, **__: Any) -> Any:
        calls.append(1)
        while True:
            checkpoint()

    return estimate


@pytest.mark.parametrize(("policy", "allowed"), [("deny", False), ("allow", True)])
def test_a_workload_too_expensive_to_evaluate_is_stored_so_and_answered_by_policy(
    make_client: ClientFactory,
    db_url: str,
    monkeypatch: pytest.MonkeyPatch,
    policy: str,
    allowed: bool,
) -> None:
    client = make_client(admission_timeout_s=GENEROUS_S, admission_failure_policy=policy)
    calls: list[int] = []
    monkeypatch.setattr(decision_store, "PAIR_BUDGET_S", 0.05)
    monkeypatch.setattr(decision_store, "required_memory", _endless_estimate(calls))
    assert client.post("/v1/workloads", json=CHAT).status_code == 201
    stored = _decisions(db_url, "chat")
    assert {d.outcome for d in stored} == {"too_expensive"}
    assert len(calls) == 1  # one overrun: the other profiles are not tried
    answer = _answer(client, review(_container("s", FITS), annotations=NOTES))
    assert answer["allowed"] is allowed
    assert "too expensive to evaluate" in answer["status"]["message"]


@pytest.mark.parametrize(
    ("containers", "reason"),
    [
        (MAX_CONTAINERS + 1, f"at most {MAX_CONTAINERS}"),
        (MAX_GPU_REQUESTS + 1, f"more than {MAX_GPU_REQUESTS} containers"),
    ],
    ids=["containers", "gpu-requests"],
)
def test_oversized_pods_are_answered_by_policy_without_evaluating(
    client: ApiClient, no_estimates: list[str], containers: int, reason: str
) -> None:
    assert client.post("/v1/workloads", json=CHAT).status_code == 201
    pods = [_container(f"c{i}", FITS) for i in range(containers)]
    answer = _answer(client, review(*pods, annotations=NOTES))
    assert answer["allowed"] is False
    assert reason in answer["status"]["message"]


def test_the_most_gpu_requests_are_decided_once_each(
    client: ApiClient, no_estimates: list[str]
) -> None:
    assert client.post("/v1/workloads", json=CHAT).status_code == 201
    pods = [_container(f"c{i}", FITS) for i in range(MAX_GPU_REQUESTS)]
    answer = _answer(client, review(*pods, annotations=NOTES))
    assert answer["allowed"] is True
    assert f"({MAX_GPU_REQUESTS} GPU requests checked)" in answer["status"]["message"]


def test_a_burst_of_distinct_workloads_on_one_gpu_reads_one_table(
    make_client: ClientFactory, monkeypatch: pytest.MonkeyPatch, no_estimates: list[str]
) -> None:
    """Reviews naming distinct stored workloads share one query of the GPU's fresh decisions
    (then each is decided on the event loop), not one database call each."""
    client = make_client(admission_timeout_s=GENEROUS_S, cache_staleness_s=60)
    count = 12
    for index in range(count):
        body = {**CHAT, "slug": f"chat-{index}", "batch_size": index + 1}
        assert client.post("/v1/workloads", json=body).status_code == 201
    calls: list[str] = []
    real_run = Database.run

    async def counting(self: Database, work: Any, *, timeout_s: float | None = None) -> Any:
        calls.append(getattr(work, "func", work).__name__)
        return await real_run(self, work, timeout_s=timeout_s)

    monkeypatch.setattr(Database, "run", counting)

    async def one(index: int) -> dict[str, Any]:
        notes = {**NOTES, "capacity-planner.io/workload": f"chat-{index}"}
        body = review(_container("server", FITS), annotations=notes, uid=f"u{index}")
        response = await client.async_client.post("/v1/admission/pods", json=body)
        return dict(response.json()["response"])

    async def burst() -> list[dict[str, Any]]:
        return await asyncio.gather(*(one(i) for i in range(count)))

    answers = client.run(burst())
    assert [a["status"]["message"].split(" needs ")[0] for a in answers] == [
        f"chat-{i} inference bs {i + 1} bf16" for i in range(count)
    ]
    assert calls.count("decision_table") == 1
    assert "evaluate_with_digest" not in calls


def test_a_graph_too_large_to_estimate_in_a_review_is_answered_by_policy(
    client: ApiClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Inline annotations naming a model larger than a review may estimate: the policy answers
    at once, naming the way out (a stored workload); nothing is estimated."""
    monkeypatch.setattr(admission_service, "REVIEW_MAX_WORK_UNITS", 99)
    tried: list[str] = []
    monkeypatch.setattr(
        admission_service, "evaluation_of", lambda *_, label, **__: tried.append(label)
    )
    assert client.post("/v1/models", json=model()).status_code == 201  # 5 layers
    notes = {
        "capacity-planner.io/model": "tiny-cnn",
        "capacity-planner.io/gpu": "nvidia-a100-80gb-sxm",
    }
    answer = _answer(client, review(_container("s", {"nvidia.com/gpu": "1"}), annotations=notes))
    assert answer["allowed"] is False
    message = answer["status"]["message"]
    assert "model 'tiny-cnn': its estimate is 100 work units" in message
    assert "a review estimates at most 99 within its deadline" in message
    assert tried == []


def test_a_missing_decision_too_large_for_a_review_pokes_the_refresher(
    client: ApiClient, db_url: str, pokes: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A stored workload whose decision a write's budget left missing, with an estimate larger
    than a review may compute: the policy answers at once (nothing estimated), saying the
    decision is being computed, and the refresher is poked; once its sweep has stored the
    decision, the review is decided on its merits. (Before: the answer said "name a stored
    workload" and nothing poked the refresher, so the decision never came.)"""
    assert client.post("/v1/workloads", json=CHAT).status_code == 201
    with db_session(db_url) as session:  # as if the write's budget ran out before any pair
        session.execute(delete(AdmissionDecision))
        session.commit()
    admission_service.DECISIONS.clear()
    admission_service.TABLES.clear()
    monkeypatch.setattr(admission_service, "REVIEW_MAX_WORK_UNITS", 1)
    tried: list[str] = []
    body = review(_container("s", FITS), annotations=NOTES)
    with pytest.MonkeyPatch.context() as patch:  # the review estimates nothing
        patch.setattr(
            admission_service, "evaluation_of", lambda *_, label, **__: tried.append(label)
        )
        pending = _answer(client, body)
    assert pending["allowed"] is False
    message = pending["status"]["message"]
    assert f"workload 'chat': its decision on '{NOTES['capacity-planner.io/gpu']}'" in message
    assert "is not stored yet" in message
    assert "name a stored workload" not in message
    assert tried == []
    assert pokes == [1]
    with db_session(db_url) as session:
        assert decision_store.refresh_stale(session) == len(_decisions(db_url, "chat")) > 0
    admission_service.DECISIONS.clear()
    admission_service.TABLES.clear()
    decided = _answer(client, body)
    assert decided["allowed"] is True
    assert "chat inference bs 1 bf16 needs " in decided["status"]["message"]
    assert pokes == [1]


def test_other_releases_old_decisions_are_pruned(client: ApiClient, db_url: str) -> None:
    assert client.post("/v1/workloads", json=CHAT).status_code == 201
    fresh = len(_decisions(db_url, "chat"))
    with db_session(db_url) as session:
        rows = session.scalars(select(AdmissionDecision)).all()
        old = utcnow() - decision_store.KEEP_OTHER_RELEASES - timedelta(hours=1)
        recent = utcnow() - timedelta(hours=1)
        for index, row in enumerate(rows[:2]):  # two rows of two older releases
            session.add(
                AdmissionDecision(
                    workload_id=row.workload_id,
                    hardware_id=row.hardware_id,
                    evaluator=f"older-{index}",
                    workload_version=1,
                    model_version=1,
                    hardware_version=1,
                    outcome="invalid",
                    summary="x",
                    resources={},
                    computed_at=old if index == 0 else recent,
                )
            )
        session.commit()
        assert decision_store.prune_other_releases(session) == 1  # the week-old one only
    assert sorted(d.evaluator for d in _decisions(db_url, "chat"))[-1] == "older-1"
    assert len(_decisions(db_url, "chat")) == fresh + 1


def test_a_workload_over_the_work_budget_is_stored_too_expensive_without_estimating(
    client: ApiClient, db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[int] = []
    monkeypatch.setattr(decision_store, "MAX_WORK_UNITS", 10)
    monkeypatch.setattr(decision_store, "required_memory", _endless_estimate(calls))
    assert client.post("/v1/workloads", json=CHAT).status_code == 201  # accepted
    stored = _decisions(db_url, "chat")
    assert {d.outcome for d in stored} == {"too_expensive"}
    assert calls == []  # refused by the budget before any estimate
    answer = _answer(client, review(_container("s", FITS), annotations=NOTES))
    assert answer["allowed"] is False
    assert "workload 'chat' is too expensive to evaluate: " in answer["status"]["message"]
    assert "work units" in answer["status"]["message"]


def test_a_check_past_its_deadline_is_a_too_expensive_problem(
    make_client: ClientFactory, db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The simple form estimates (it reports attention and defaults): stopped at
    CAPPLAN_COMPUTE_TIMEOUT_S with 422 too-expensive, no Retry-After, nothing written."""
    client = make_client(compute_timeout_s=0.2)
    calls: list[int] = []
    monkeypatch.setattr(decision_store, "required_memory", _endless_estimate(calls))
    before = table_counts(db_url)
    response = client.post(
        "/v1/admission/check",
        json={"workload": {"model": "gpt-2", "mode": "inference", "batch_size": 1},
              "gpu_model": "nvidia-a100-80gb-sxm", "resource": "nvidia.com/gpu"},
    )  # fmt: skip
    body = assert_problem(response, 422, "too-expensive")
    assert "Retry-After" not in response.headers
    assert "did not finish within 0.2 s" in body["detail"]
    assert calls == [1]
    assert table_counts(db_url) == before
