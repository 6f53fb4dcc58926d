"""Bursts, slot limits and deadlines: the service sheds load with 503s and never deadlocks.

The old design held a pooled connection from a sync endpoint until its response was validated
in another worker-thread slot; a burst of more requests than threads + connections deadlocked
until the 30 s pool timeout. These tests fire such bursts at the real app on each database.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import Counter

import anyio.to_thread
import httpx
import pytest
from sqlalchemy.orm import Session
from starlette.types import Receive, Scope, Send

from app.api.database import Database, DatabaseUnavailable
from app.api.inflight import InFlightLimitMiddleware
from tests.api.helpers import PROBLEM_JSON
from tests.support import ApiClient, ClientFactory, ServiceClock

# Wall-clock bounds: run alone after the parallel pass (scripts/test.sh), not beside it.
pytestmark = pytest.mark.timing

BURST = 240  # > 40 threads + 15 connections of the old defaults, many times over
ESTIMATE = {"model": "bert-base", "mode": "training", "batch_size": 4, "precision": "bf16"}


async def _burst(client: httpx.AsyncClient, count: int) -> list[httpx.Response]:
    async def one(index: int) -> httpx.Response:
        if index % 3 == 2:
            body = {**ESTIMATE, "batch_size": index}
            return await client.post("/v1/estimates/memory", json=body)
        if index % 3 == 1:
            return await client.get("/v1/hardware", params={"limit": 5})
        return await client.get("/v1/models/resnet-50")

    # The old code needed the 30 s pool timeout to move at all: fail well before it.
    async with asyncio.timeout(20):
        return await asyncio.gather(*(one(i) for i in range(count)))


def test_burst_is_answered_without_deadlock(client: ApiClient) -> None:
    clock = ServiceClock()
    responses = client.run(_burst(client.async_client, BURST))
    elapsed = clock.elapsed_s
    statuses = Counter(r.status_code for r in responses)
    assert set(statuses) <= {200, 503}, statuses
    for response in responses:
        if response.status_code == 503:  # shedding is allowed, and says when to come back
            assert response.headers["content-type"] == PROBLEM_JSON
            assert response.headers["retry-after"] == "1"
    assert statuses[200] >= BURST // 2, statuses
    assert elapsed < 20
    assert client.app.state.database.in_use == 0  # every slot came back


def test_healthz_needs_neither_the_database_nor_a_worker_thread(client: ApiClient) -> None:
    database: Database = client.app.state.database
    release = threading.Event()

    async def scenario() -> tuple[int, float, int]:
        default_threads = anyio.to_thread.current_default_thread_limiter()
        borrowers = [object() for _ in range(int(default_threads.total_tokens))]
        for borrower in borrowers:  # no worker thread is free
            default_threads.acquire_on_behalf_of_nowait(borrower)
        holders = [  # and every database slot is taken
            asyncio.create_task(database.run(lambda _s: release.wait(10)))
            for _ in range(database.slots)
        ]
        await asyncio.sleep(0.05)
        try:
            assert database.in_use == database.slots
            clock = ServiceClock()
            async with asyncio.timeout(2):
                health = await client.async_client.get("/healthz")
            return health.status_code, clock.elapsed_s, database.in_use
        finally:
            for borrower in borrowers:
                default_threads.release_on_behalf_of(borrower)
            release.set()
            await asyncio.gather(*holders)

    status, seconds, busy_slots = client.run(scenario())
    assert status == 200
    assert busy_slots == client.app.state.database.slots
    assert seconds < 0.5


def test_a_request_that_gets_no_slot_in_time_is_shed_with_503(
    make_client: ClientFactory,
) -> None:
    client = make_client(db_pool_size=1, db_queue_timeout_s=0.2)
    database: Database = client.app.state.database
    release = threading.Event()

    async def scenario() -> httpx.Response:
        holder = asyncio.create_task(database.run(lambda _s: release.wait(10)))
        await asyncio.sleep(0.05)
        try:
            return await client.async_client.get("/v1/models/resnet-50")
        finally:
            release.set()
            await holder

    clock = ServiceClock()
    response = client.run(scenario())
    assert clock.elapsed_s < 2
    assert response.status_code == 503
    assert response.headers["content-type"] == PROBLEM_JSON
    assert response.headers["retry-after"] == "1"
    assert response.json()["type"] == "/problems/database-busy"
    assert "CAPPLAN_DB_QUEUE_TIMEOUT_S" in response.json()["detail"]
    # The slot is free again: the same request now succeeds.
    assert client.get("/v1/models/resnet-50").status_code == 200
    metrics = client.get("/metrics").text
    assert 'capplan_db_failures_total{type="database-busy"} 1.0' in metrics
    assert "capplan_db_slots_in_use 0.0" in metrics


def test_a_call_past_its_deadline_is_abandoned_and_answered_503(
    make_client: ClientFactory,
) -> None:
    client = make_client(db_call_timeout_s=0.3, db_pool_size=2)
    database: Database = client.app.state.database
    release = threading.Event()

    def stuck(session: Session) -> None:
        session.connection()  # holds a connection, like a query to a frozen server
        release.wait(10)

    async def abandon() -> tuple[DatabaseUnavailable, float]:
        clock = ServiceClock()
        with pytest.raises(DatabaseUnavailable) as caught:
            await database.run(stuck)
        return caught.value, clock.elapsed_s

    try:
        error, seconds = client.run(abandon())
        assert seconds < 1.5
        assert error.type_slug == "database-unavailable"
        assert error.retry_after_s == 5
        assert (database.in_use, database.stuck) == (0, 1)  # slot free, thread still out
        # The other connection still serves requests meanwhile.
        assert client.get("/v1/hardware/nvidia-a100-80gb-sxm").status_code == 200
        client.run(abandon())
        assert database.stuck == 2
        # Every connection is held by a stuck call: answered at once, not after a checkout wait.
        clock = ServiceClock()
        response = client.get("/v1/hardware/nvidia-a100-80gb-sxm")
        assert clock.elapsed_s < 0.2
        assert response.status_code == 503
        assert response.json()["type"] == "/problems/database-unavailable"
        assert response.headers["retry-after"] == "5"
        assert "capplan_db_stuck_calls 2.0" in client.get("/metrics").text
    finally:
        release.set()
    # The database "comes back": the stuck calls finish and requests are served again.
    for _ in range(100):
        if database.stuck == 0:
            break
        time.sleep(0.02)
    assert database.stuck == 0
    assert client.get("/v1/hardware/nvidia-a100-80gb-sxm").status_code == 200


def test_requests_over_the_in_flight_limit_wait_then_are_shed_and_probes_bypass() -> None:
    release = asyncio.Event()
    entered: list[str] = []

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        entered.append(scope["path"])
        if scope["path"] == "/slow":
            await release.wait()
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    gate = InFlightLimitMiddleware(app, limit=1, queue_timeout_s=0.2)

    async def scenario() -> tuple[httpx.Response, httpx.Response, httpx.Response, float, float]:
        transport = httpx.ASGITransport(app=gate)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            slow = asyncio.create_task(client.get("/slow"))
            await asyncio.sleep(0.05)
            start = time.perf_counter()
            clock = ServiceClock()
            shed = await client.get("/other")  # waits for the one slot, then gives up
            waited = time.perf_counter() - start  # at least the queue timeout, by the wall clock
            serviced = clock.elapsed_s  # at most a second of the service's own time
            probe = await client.get("/healthz")  # never waits
            release.set()
            return await slow, shed, probe, waited, serviced

    slow, shed, probe, waited, serviced = asyncio.run(scenario())
    assert slow.status_code == 200
    assert probe.status_code == 200
    assert shed.status_code == 503
    assert waited > 0.15
    assert serviced < 1.0
    assert shed.headers["content-type"] == PROBLEM_JSON
    assert shed.headers["retry-after"] == "1"
    assert shed.json()["type"] == "/problems/overloaded"
    assert "CAPPLAN_MAX_IN_FLIGHT" in shed.json()["detail"]
    assert entered == ["/slow", "/healthz"]  # the shed request never reached the app
