"""Burst benchmark: N simultaneous mixed requests against `capplan-server serve`, default settings.

For each backend (SQLite in a temporary folder; PostgreSQL in a scratch database created on the
server named by --postgres-url or TEST_DATABASE_URL, dropped afterwards) the script migrates,
syncs the catalog, stores one workload, starts `serve` with its default settings (one worker
process), warms it up, and then opens N connections at once, each sending one request of a mix:
reads (GET /v1/models/resnet-50, GET /v1/hardware), memory estimates, MIG fits and admission
reviews. While the burst runs, a separate process asks /healthz every 20 ms on its own
connection.

Printed per backend: status counts per kind of request, p50/p99/max latency, how many took over
5 s, and /healthz latency during the burst. Target (issue 11): every request answered, no 5xx
other than 503 load shedding (with Retry-After), none over 5 s, /healthz under 100 ms.
Exits 1 when a target is missed.

    .venv/bin/python benchmarks/burst.py [--requests 500] [--backends sqlite,postgresql]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import socket
import statistics
import tempfile
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from multiprocessing.synchronize import Event as EventType
from pathlib import Path
from typing import Any

from admission_load import WORKLOAD, _review
from server_process import add_backend_arguments, database, free_port, serving

LATENCY_TARGET_S = 5.0
HEALTHZ_TARGET_MS = 100.0


def _http(method: str, path: str, port: int, body: dict[str, Any] | None = None) -> bytes:
    payload = json.dumps(body).encode() if body is not None else b""
    head = f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n"
    if body is not None:
        head += f"Content-Type: application/json\r\nContent-Length: {len(payload)}\r\n"
    return head.encode() + b"\r\n" + payload


def _mix(index: int, port: int) -> tuple[str, bytes]:
    """Request ``index`` of the burst: (kind, raw HTTP/1.1 request)."""
    slot = index % 20
    if slot < 7:
        return "GET model", _http("GET", "/v1/models/resnet-50", port)
    if slot < 9:
        return "GET hardware", _http("GET", "/v1/hardware?limit=20", port)
    if slot < 13:
        batch = 1 + index % 64  # different estimates, not one cached answer
        body = {"model": "bert-base", "mode": "training", "batch_size": batch, "precision": "bf16"}
        return "POST estimate", _http("POST", "/v1/estimates/memory", port, body)
    if slot < 16:
        body = {"workload": "chat", "gpu": "nvidia-a100-80gb-sxm"}
        return "POST mig fit", _http("POST", "/v1/mig/fit", port, body)
    return "POST admission", _http(
        "POST", "/v1/admission/pods", port, _review("nvidia.com/mig-3g.40gb")
    )


async def _send(port: int, request: bytes, timeout_s: float) -> tuple[int, dict[str, str], bytes]:
    """One request on its own connection: (status, headers, body); status 0 = no answer."""
    try:
        async with asyncio.timeout(timeout_s):
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(request)
            raw = await reader.read()
            writer.close()
    except (TimeoutError, OSError):
        return 0, {}, b""
    head, _, body = raw.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    if not lines or len(lines[0].split(" ")) < 2:
        return 0, {}, b""
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    return int(lines[0].split(" ")[1]), headers, body


def _probe_healthz(port: int, stop: EventType, results: Connection) -> None:
    """Ask /healthz every 20 ms on one kept-alive connection until ``stop``; send latencies."""
    latencies_ms: list[float] = []
    ask = f"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n".encode()
    with socket.create_connection(("127.0.0.1", port), timeout=30) as conn:
        stream = conn.makefile("rb")
        while not stop.is_set():
            start = time.perf_counter()
            conn.sendall(ask)
            length = 0
            while (line := stream.readline()) not in (b"\r\n", b""):
                if line.lower().startswith(b"content-length:"):
                    length = int(line.split(b":")[1])
            stream.read(length)
            latencies_ms.append((time.perf_counter() - start) * 1000)
            time.sleep(0.02)
    results.send(latencies_ms)


@dataclass
class BurstResult:
    statuses: dict[str, Counter[int]] = field(default_factory=lambda: defaultdict(Counter))
    latencies_s: list[float] = field(default_factory=list)
    healthz_ms: list[float] = field(default_factory=list)
    bad_503: int = 0  # 503s without Retry-After or not problem+json
    elapsed_s: float = 0.0


async def _burst(port: int, count: int) -> BurstResult:
    result = BurstResult()
    requests = [_mix(i, port) for i in range(count)]
    for kind, request in dict(requests).items():
        status, _, _ = await _send(port, request, 30)  # warm-up: imports, caches
        if status != 200:
            raise RuntimeError(f"warm-up {kind} answered {status}")

    async def one(kind: str, request: bytes) -> None:
        start = time.perf_counter()
        status, headers, _ = await _send(port, request, 60)
        result.latencies_s.append(time.perf_counter() - start)
        result.statuses[kind][status] += 1
        if status == 503 and (
            "retry-after" not in headers
            or headers.get("content-type") != "application/problem+json"
        ):
            result.bad_503 += 1

    # The probe runs in its own process: the burst's client loop (500 connections opening at
    # once) must not count as server latency.
    receiver, sender = multiprocessing.Pipe(duplex=False)
    stop = multiprocessing.Event()
    prober = multiprocessing.Process(target=_probe_healthz, args=(port, stop, sender))
    prober.start()
    await asyncio.sleep(0.2)
    begin = time.perf_counter()
    await asyncio.gather(*(one(kind, request) for kind, request in requests))
    result.elapsed_s = time.perf_counter() - begin
    stop.set()
    result.healthz_ms = receiver.recv()
    prober.join(10)
    return result


async def _prepare(port: int) -> None:
    status, _, body = await _send(port, _http("POST", "/v1/workloads", port, WORKLOAD), 30)
    if status != 201:
        raise RuntimeError(f"storing the workload answered {status}: {body[:300]!r}")


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _report(backend: str, count: int, result: BurstResult) -> bool:
    print(f"\n== {backend}: {count} simultaneous requests, burst took {result.elapsed_s:.2f} s")
    totals: Counter[int] = Counter()
    for kind in sorted(result.statuses):
        counts = result.statuses[kind]
        totals.update(counts)
        print(f"  {kind:15s} " + ", ".join(f"{s}: {n}" for s, n in sorted(counts.items())))
    print("  all             " + ", ".join(f"{s}: {n}" for s, n in sorted(totals.items())))
    lat = result.latencies_s
    over = sum(1 for value in lat if value > LATENCY_TARGET_S)
    print(
        f"  latency s: p50 {statistics.median(lat):.3f}, p99 {_percentile(lat, 0.99):.3f}, "
        f"max {max(lat):.3f}; over {LATENCY_TARGET_S:g} s: {over}"
    )
    hz = result.healthz_ms
    print(
        f"  /healthz during the burst ({len(hz)} probes): p50 {statistics.median(hz):.1f} ms, "
        f"p99 {_percentile(hz, 0.99):.1f} ms, max {max(hz):.1f} ms"
    )
    unanswered = totals[0]
    server_errors = sum(n for status, n in totals.items() if status >= 500 and status != 503)
    ok = (
        unanswered == 0
        and server_errors == 0
        and result.bad_503 == 0
        and over == 0
        and max(hz) < HEALTHZ_TARGET_MS
    )
    print(
        f"  target: unanswered {unanswered}, 5xx other than 503 {server_errors}, 503 without "
        f"Retry-After/problem+json {result.bad_503}, over 5 s {over}, /healthz max "
        f"{max(hz):.1f} ms < {HEALTHZ_TARGET_MS:g} -> {'MET' if ok else 'MISSED'}"
    )
    return ok


def main() -> int:
    """Run the burst on each backend and print its figures."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=500, help="simultaneous requests")
    add_backend_arguments(parser)
    args = parser.parse_args()
    print(f"cores: {os.cpu_count()}; server: `serve` with default settings (1 worker)")
    all_ok = True
    for backend in args.backends.split(","):
        port = free_port()
        with (
            tempfile.TemporaryDirectory() as tmp,
            database(backend, args.postgres_url, Path(tmp), CAPPLAN_LOG_LEVEL="WARNING") as env,
            serving(env, port),
        ):
            asyncio.run(_prepare(port))
            result = asyncio.run(_burst(port, args.requests))
            all_ok &= _report(backend, args.requests, result)
    return 0 if all_ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
