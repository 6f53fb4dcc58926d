"""`capplan-server serve --workers 2` for real: /metrics adds up every worker, logs are JSON."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from tests.api.test_metrics import samples, value
from tests.live_server import raw_request
from tests.support import SqliteDatabases

# Wall-clock bounds: run alone after the parallel pass (scripts/test.sh), not beside it.
pytestmark = pytest.mark.timing

WORKERS = 2


@dataclass
class Server:
    base: str
    log: Path
    metrics_dir: Path
    process: subprocess.Popen[bytes]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _get(url: str) -> httpx.Response:
    # A new connection per request: the kernel hands connections to either worker.
    return httpx.get(url, timeout=10, headers={"Connection": "close"})


@pytest.fixture(scope="module")
def server(
    sqlite_databases: SqliteDatabases, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Server]:
    work = tmp_path_factory.mktemp("serve")
    metrics_dir = work / "metrics"
    metrics_dir.mkdir()
    (metrics_dir / "counter_999999999.db").write_bytes(b"left over from an earlier run")
    port = _free_port()
    env = {
        **os.environ,
        "CAPPLAN_DATABASE_URL": f"sqlite:///{work / 'capplan.db'}",
        "CAPPLAN_API_KEYS": "",
        "CAPPLAN_LOG_LEVEL": "INFO",
        "PROMETHEUS_MULTIPROC_DIR": str(metrics_dir),
        # Read by each worker's HTTP protocol from the environment (not the defaults).
        "CAPPLAN_MAX_HEADER_BYTES": "16384",
        "CAPPLAN_HEADER_TIMEOUT_S": "1",
    }
    with sqlite_databases.fresh() as url:
        Path(url.removeprefix("sqlite:///")).rename(work / "capplan.db")
    log = work / "server.log"
    with log.open("wb") as stderr:
        process = subprocess.Popen(
            [sys.executable, "-m", "app.cli", "serve", "--workers", str(WORKERS),
             "--port", str(port)],
            cwd=work, env=env, stdout=stderr, stderr=stderr,
        )  # fmt: skip
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 90
        while True:
            assert process.poll() is None, log.read_text()
            assert time.monotonic() < deadline, f"workers not up in 90 s:\n{log.read_text()}"
            try:
                text = _get(f"{base}/metrics").text
                if value(text, "capplan_worker_processes") == WORKERS:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.3)
        yield Server(base, log, metrics_dir, process)
    finally:
        process.send_signal(signal.SIGINT)
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _served_by(server: Server, route: str) -> set[int]:
    """Pids of the workers whose access log shows ``route``."""
    pids = set()
    for line in server.log.read_text().splitlines():
        record = json.loads(line)
        if record.get("logger") == "app.access" and record.get("route") == route:
            pids.add(record["pid"])
    return pids


def test_counters_add_up_over_every_worker_and_never_go_back(server: Server) -> None:
    assert "counter_999999999.db" not in os.listdir(server.metrics_dir)  # emptied at start
    base_text = _get(f"{server.base}/metrics").text
    assert value(base_text, "capplan_http_requests_total", method="GET", route="/healthz",
                 status="200") == 0  # fmt: skip
    review = {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {"uid": "u", "object": {"kind": "Pod", "spec": {"containers": [{"name": "c"}]}}},
    }
    sent = 0
    reviews = 0
    totals = []
    with ThreadPoolExecutor(8) as pool:
        for _ in range(5):
            codes = list(pool.map(lambda _: _get(f"{server.base}/healthz").status_code, range(40)))
            assert codes == [200] * 40
            sent += 40
            answers = list(
                pool.map(
                    lambda _: httpx.post(f"{server.base}/v1/admission/pods", json=review,
                                         headers={"Connection": "close"}, timeout=10),
                    range(10),
                )
            )  # fmt: skip
            assert all(a.json()["response"]["allowed"] for a in answers)
            reviews += 10
            for _ in range(3):  # whichever worker answers the scrape: the same totals
                text = _get(f"{server.base}/metrics").text
                healthz = value(text, "capplan_http_requests_total", method="GET",
                                route="/healthz", status="200")  # fmt: skip
                assert healthz == sent
                decisions = value(text, "capplan_admission_decisions_total", endpoint="pods",
                                  outcome="allowed", reason="no_gpu")  # fmt: skip
                assert decisions == reviews
                totals.append(
                    sum(
                        v
                        for (name, _), v in samples(text).items()
                        if name == "capplan_http_requests_total"
                    )
                )
    assert totals == sorted(totals)  # monotonic
    assert totals[-1] >= sent + reviews
    # Preconditions that make the sums meaningful: both workers served requests and scrapes.
    assert len(_served_by(server, "/healthz")) == WORKERS
    assert len(_served_by(server, "/metrics")) == WORKERS


def test_gauges_and_process_metrics_cover_each_live_worker(server: Server) -> None:
    text = _get(f"{server.base}/metrics").text
    assert value(text, "capplan_worker_processes") == WORKERS
    assert value(text, "capplan_db_pool_size") == 4 * WORKERS  # CAPPLAN_DB_POOL_SIZE default
    assert value(text, "capplan_db_pool_checked_out") == 0
    pids = {
        dict(labels)["pid"]
        for (name, labels), _ in samples(text).items()
        if name == "process_resident_memory_bytes"
    }
    assert len(pids) == WORKERS
    assert str(server.process.pid) not in pids  # the workers, not the supervisor
    for pid in pids:
        assert value(text, "process_resident_memory_bytes", pid=pid) > 1e6


def test_every_log_line_is_plain_json(server: Server) -> None:
    lines = server.log.read_text().splitlines()
    assert lines
    records = [json.loads(line) for line in lines]  # every line is one JSON object
    assert all("\x1b" not in line and "\\u001b" not in line for line in lines)
    assert all("color_message" not in record for record in records)
    # uvicorn's own records (which carry color_message) went through the formatter, per worker
    started = {r["pid"] for r in records if r["msg"].startswith("Started server process")}
    assert len(started) == WORKERS


def test_every_worker_enforces_the_http_limits_of_the_environment(server: Server) -> None:
    """Oversized heads are answered by each worker's protocol with the environment's limits,
    and a connection that trickles its head is answered 408 and closed after 1 s."""
    host, port = server.base.removeprefix("http://").split(":")
    address = (host, int(port))
    pad = b"X-Pad: " + b"p" * 17_000 + b"\r\n"  # over 16384, under the 32768 default
    for _ in range(6):  # new connections: the kernel spreads them over both workers
        answer = raw_request(address, b"GET /healthz HTTP/1.1\r\nHost: t\r\n" + pad + b"\r\n")
        assert answer.status == 431
        assert b"16384 bytes (setting CAPPLAN_MAX_HEADER_BYTES)" in answer.body
        url = raw_request(address, b"GET /" + b"u" * 9000 + b" HTTP/1.1\r\nHost: t\r\n\r\n")
        assert url.status == 414
    start = time.monotonic()
    with socket.create_connection(address, timeout=10) as sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: t\r\nX-Slow: ")
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    assert data.startswith(b"HTTP/1.1 408 "), data[:80]
    assert 0.9 < time.monotonic() - start < 8
