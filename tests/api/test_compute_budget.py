"""Bounded CPU-heavy work (issue 29, point 1): a work budget checked before computing, the
computation outside the database slots, stopped at its deadline with a problem of its own."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest

from app.api.compute import Compute
from app.api.database import Database
from app.api.errors import COMPUTE_EXAMPLES
from tests.api.helpers import PROBLEM_JSON
from tests.support import ApiClient, ClientFactory, ServiceClock

TOO_EXPENSIVE = "/problems/too-expensive"


def distinct_linear_graph(layers: int, *, width: int = 64) -> dict[str, Any]:
    """An inline graph of ``layers`` linear layers of distinct widths (no cache hit between
    them: each layer's semantics and roofline kernels are evaluated)."""
    return {
        "inputs": [{"name": "x", "shape": ["batch", width]}],
        "layers": [
            {"name": f"fc{i}", "op": "linear", "out_features": width + i} for i in range(layers)
        ],
    }


def _counts(client: ApiClient) -> tuple[int, int, int]:
    """Stored models, hardware profiles and workloads: a refused request writes nothing."""
    return (
        client.get("/v1/models", params={"limit": 1}).json()["total"],
        client.get("/v1/hardware", params={"limit": 1}).json()["total"],
        client.get("/v1/workloads", params={"limit": 1}).json()["total"],
    )


def _too_expensive(response: httpx.Response) -> dict[str, Any]:
    assert response.status_code == 422, response.text
    assert response.headers["content-type"] == PROBLEM_JSON
    assert "retry-after" not in response.headers  # the same request would fail again
    body: dict[str, Any] = response.json()
    assert body["type"] == TOO_EXPENSIVE
    assert body["title"] == "Too expensive"
    return body


def test_a_recommendation_over_the_budget_is_refused_before_computing(
    make_client: ClientFactory,
) -> None:
    client = make_client(max_work_units=100_000)
    before = _counts(client)
    request = {"model": "resnet-50", "max_batch_size": 65536}
    body = _too_expensive(client.post("/v1/recommendations/inference", json=request))
    # resnet-50: 107 layers as written, 187 executed; 144 devices and slices; 4 precisions;
    # 17 batch sizes (1 .. 65536): 107 x 144 x 4 x 17 + 10 x 187 x 4 x 17 = 1,174,904
    assert body["detail"].startswith(
        "this request asks for 1,174,904 work units (107 graph layers x 144 devices x 4 "
        "precisions x 17 batch sizes + 10 x 187 executed layers x 4 precisions x 17 batch "
        "sizes); the limit is 100,000 (CAPPLAN_MAX_WORK_UNITS); reduce "
    )
    pointers = [error["pointer"] for error in body["errors"]]
    assert pointers == ["/model", "/devices", "/max_batch_size", "/precisions"]
    assert _counts(client) == before
    compute: Compute = client.app.state.compute
    assert compute.running == 0
    metrics = client.get("/metrics").text
    assert "capplan_compute_running 0.0" in metrics
    # Less of it is served: one device, one precision, batch sizes up to 16.
    smaller = {**request, "devices": ["nvidia-a10"], "precisions": ["fp16"], "max_batch_size": 16}
    assert client.post("/v1/recommendations/inference", json=smaller).status_code == 200


def _example(status: int, name: str) -> dict[str, Any]:
    body = dict(COMPUTE_EXAMPLES[status][name]["value"])
    assert body.pop("request_id")
    return body


def _answer(response: httpx.Response) -> dict[str, Any]:
    body: dict[str, Any] = response.json()
    assert body.pop("request_id") == response.headers["x-request-id"]
    return body


def test_a_10000_layer_inline_recommendation_is_refused_with_default_settings(
    client: ApiClient,
) -> None:
    """The documented example (OpenAPI: too-expensive) is this answer."""
    request = {"architecture": distinct_linear_graph(10_000)}
    response = client.post("/v1/recommendations/inference", json=request)
    body = _too_expensive(response)
    assert "10,000 graph layers x 144 devices x 4 precisions x 9 batch sizes" in body["detail"]
    assert "(CAPPLAN_MAX_WORK_UNITS)" in body["detail"]
    assert body["errors"][0]["pointer"] == "/architecture/layers"
    assert _answer(response) == _example(422, "too-expensive")


def test_estimate_fit_and_plan_over_the_budget_are_refused(make_client: ClientFactory) -> None:
    client = make_client(max_work_units=1_000)
    before = _counts(client)
    estimate = {"model": "llama-2-7b", "mode": "inference", "batch_size": 1}
    body = _too_expensive(client.post("/v1/estimates/memory", json=estimate))
    # 20 units per executed layer of an inference estimate; llama-2-7b executes 196 layers
    assert "asks for 3,920 work units (20 x 196 executed layers x 1 estimates)" in body["detail"]
    assert [e["pointer"] for e in body["errors"]] == ["/model"]
    query = client.get("/v1/estimates/memory", params=estimate)
    assert _too_expensive(query)["detail"] == body["detail"]
    # A MIG fit counts the batch search it may need: batch 4096 -> 2 + 13 estimates.
    fit = {"workload": {**estimate, "batch_size": 4096}, "gpu": "nvidia-a100-80gb-sxm"}
    body = _too_expensive(client.post("/v1/mig/fit", json=fit))
    assert "20 x 196 executed layers x 15 estimates" in body["detail"]
    assert [e["pointer"] for e in body["errors"]] == [
        "/workload/model",
        "/workload/batch_size",
    ]
    plan = {
        "gpu": "nvidia-a100-80gb-sxm",
        "workloads": [{"name": "chat", "replicas": 2, "workload": estimate}],
    }
    body = _too_expensive(client.post("/v1/mig/plan", json=plan))
    assert [e["pointer"] for e in body["errors"]] == ["/workloads/0/workload/model"]
    # A training estimate counts 200 units per executed layer.
    training = {**estimate, "mode": "training"}
    body = _too_expensive(client.post("/v1/estimates/memory", json=training))
    assert "asks for 39,200 work units (200 x 196 executed layers" in body["detail"]
    assert _counts(client) == before


def test_the_largest_repeated_graph_is_estimated_within_the_default_budget(
    make_client: ClientFactory,
) -> None:
    """99,991 executed layers (the graph limit is 100,000) are past the allocator replay's
    10,000 layers, so either mode costs 15 units per executed layer (1,499,865 of the default
    2,000,000; before the replay bound a training estimate took 44 s of CPU and +580 MiB)."""
    body = [{"name": f"fc{i}", "op": "linear", "out_features": 64} for i in range(10)]
    graph = {
        "inputs": [{"name": "x", "shape": ["batch", 64]}],
        "layers": [{"name": "blocks", "op": "repeat", "times": 9_999, "layers": body}],
    }
    request = {"architecture": graph, "mode": "inference", "batch_size": 8}
    client = make_client()
    for mode in ("inference", "training"):
        response = client.post("/v1/estimates/memory", json={**request, "mode": mode})
        assert response.status_code == 200, response.text
    # The same request one unit under its cost is refused, naming the figures.
    tight = make_client(max_work_units=1_499_864)
    training = tight.post("/v1/estimates/memory", json={**request, "mode": "training"})
    assert (
        "asks for 1,499,865 work units (15 x 99,991 executed layers"
        in (_too_expensive(training)["detail"])
    )


def test_a_computation_past_its_deadline_is_stopped_with_its_own_problem(
    make_client: ClientFactory,
) -> None:
    client = make_client(compute_timeout_s=0.05, max_work_units=10**9)
    request = {"architecture": distinct_linear_graph(400, width=96)}
    response = client.post("/v1/recommendations/inference", json=request)
    body = _too_expensive(response)
    assert body["detail"].startswith(
        "the computation did not finish within 0.05 s (CAPPLAN_COMPUTE_TIMEOUT_S) and was "
        "stopped; nothing was written."
    )
    compute: Compute = client.app.state.compute
    database: Database = client.app.state.database
    # Stopped at a checkpoint: its thread has returned, no slot is held.
    assert (compute.running, compute.stuck, database.in_use, database.stuck) == (0, 0, 0, 0)
    metrics = client.get("/metrics").text
    assert 'capplan_compute_stopped_total{reason="deadline"} 1.0' in metrics
    assert "capplan_compute_stuck 0.0" in metrics
    assert 'capplan_db_failures_total{type="database-unavailable"}' not in metrics
    assert client.get("/v1/models/resnet-50").status_code == 200
    expected = _example(422, "too-expensive-deadline")
    expected["detail"] = expected["detail"].replace("within 8 s", "within 0.05 s")
    assert _answer(response) == expected


def test_reads_are_served_while_a_long_computation_runs_on_one_database_slot(
    make_client: ClientFactory,
) -> None:
    """With a single database connection, a read is answered while a recommendation computes:
    the computation holds a compute slot, not the database's (before, it held the one slot
    for its whole run and the read was shed with 503)."""
    client = make_client(
        db_pool_size=1,
        db_queue_timeout_s=0.5,
        compute_timeout_s=30,
        max_work_units=10**9,
    )
    compute: Compute = client.app.state.compute
    database: Database = client.app.state.database
    request = {"architecture": distinct_linear_graph(1_500, width=80)}

    async def scenario() -> tuple[httpx.Response, list[int], int]:
        heavy = asyncio.create_task(
            client.async_client.post("/v1/recommendations/inference", json=request)
        )
        for _ in range(500):
            if compute.running:
                break
            await asyncio.sleep(0.01)
        statuses = []
        overlapped = 0
        for _ in range(3):
            statuses.append((await client.async_client.get("/v1/models/resnet-50")).status_code)
            overlapped += compute.running
        return await heavy, statuses, overlapped

    heavy, statuses, overlapped = client.run(scenario())
    assert statuses == [200, 200, 200]
    assert overlapped >= 1  # at least one read was answered while the computation ran
    assert heavy.status_code == 200
    assert (compute.running, database.in_use) == (0, 0)


def test_requests_over_the_compute_slots_wait_then_are_shed(make_client: ClientFactory) -> None:
    client = make_client(compute_slots=1, compute_queue_timeout_s=0.2)
    compute: Compute = client.app.state.compute
    release = asyncio.Event()

    async def scenario() -> httpx.Response:
        loop = asyncio.get_running_loop()

        def hold() -> None:
            asyncio.run_coroutine_threadsafe(release.wait(), loop).result(10)

        holder = asyncio.create_task(compute.run(hold))
        while not compute.running:
            await asyncio.sleep(0.01)
        try:
            estimate = {"model": "resnet-50", "mode": "inference", "batch_size": 1}
            return await client.async_client.post("/v1/estimates/memory", json=estimate)
        finally:
            release.set()
            await holder

    response = client.run(scenario())
    assert response.status_code == 503
    assert response.headers["retry-after"] == "1"
    body = _answer(response)
    assert body["type"] == "/problems/compute-busy"
    assert "CAPPLAN_COMPUTE_SLOTS" in body["detail"]
    expected = _example(503, "compute-busy")
    expected.update(instance="/v1/estimates/memory")
    expected["detail"] = (
        expected["detail"].replace("SLOTS=2", "SLOTS=1").replace("within 2 s", "within 0.2 s")
    )
    assert body == expected
    assert 'capplan_compute_stopped_total{reason="busy"} 1.0' in client.get("/metrics").text


def test_inline_graph_errors_still_point_at_the_layer(client: ApiClient) -> None:
    """A 422 raised while computing (outside the database call) keeps its JSON pointer."""
    graph = distinct_linear_graph(3)
    graph["layers"][1]["inputs"] = ["nowhere"]
    response = client.post(
        "/v1/estimates/memory",
        json={"architecture": graph, "mode": "inference", "batch_size": 1},
    )
    assert response.status_code == 422
    assert response.json()["errors"][0]["pointer"].startswith("/architecture/layers/1")


@pytest.mark.timing
def test_an_overrun_is_answered_soon_after_its_deadline(make_client: ClientFactory) -> None:
    client = make_client(compute_timeout_s=0.5, max_work_units=10**9)
    request = {"architecture": distinct_linear_graph(3_000, width=72)}
    clock = ServiceClock()
    response = client.post("/v1/recommendations/inference", json=request)
    seconds = clock.elapsed_s
    _too_expensive(response)
    assert seconds < 0.5 + 1.5  # the deadline, plus one checkpoint interval on a loaded host


def test_a_stored_workloads_memory_is_bounded_like_an_estimate(make_client: ClientFactory) -> None:
    """``GET /v1/workloads/{slug}/memory`` loads in a database call and computes under the
    runner: over the work budget it is refused before computing, naming the model."""
    client = make_client()
    workload = {"slug": "chat", "name": "chat", "model": "llama-2-7b", "mode": "inference"}
    created = client.post("/v1/workloads", json={**workload, "batch_size": 1, "precision": "bf16"})
    assert created.status_code == 201, created.text
    assert client.get("/v1/workloads/chat/memory").status_code == 200
    tight = make_client(max_work_units=1_000)
    body = _too_expensive(tight.get("/v1/workloads/chat/memory"))
    assert "asks for 3,920 work units (20 x 196 executed layers x 1 estimates)" in body["detail"]
    assert [e["pointer"] for e in body["errors"]] == ["/model"]


def test_a_model_summary_past_its_deadline_is_stopped(make_client: ClientFactory) -> None:
    """``GET /v1/models/{slug}/summary`` analyses the graph outside the database slots; past
    CAPPLAN_COMPUTE_TIMEOUT_S it stops with the too-expensive problem, nothing written."""
    client = make_client(compute_timeout_s=0.01)
    deep = {
        "slug": "deep",
        "name": "Deep",
        "family": "mlp",
        "inputs": [{"name": "x", "shape": ["batch", 64]}],
        "layers": [
            {
                "name": "stack",
                "op": "repeat",
                "times": 99_999,
                "layers": [{"name": "fc", "op": "linear", "out_features": 64}],
            }
        ],
    }
    assert client.post("/v1/models", json=deep).status_code == 201
    before = _counts(client)
    body = _too_expensive(client.get("/v1/models/deep/summary"))
    assert "CAPPLAN_COMPUTE_TIMEOUT_S" in body["detail"]
    assert _counts(client) == before
    # Within its deadline the same summary is answered.
    roomy = make_client(compute_timeout_s=60)
    summary = roomy.get("/v1/models/deep/summary", params={"batch_size": 2})
    assert summary.status_code == 200, summary.text
    assert summary.json()["layer_count"] == 99_999
