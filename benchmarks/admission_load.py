"""Load benchmark of the admission webhook against a running server on loopback.

Starts `capplan-server serve` on 127.0.0.1 (a fresh SQLite database in a temporary folder,
migrated, catalog synced, one workload stored), then sends AdmissionReviews open-loop at a
fixed rate (default 400 requests/s for 10 s) and prints p50/p99 latency and the achieved rate.
Target (issues 5 and 11): p99 under 50 ms at 400 requests/s on 2 cores. Exits 1 when missed.
benchmarks/webhook_throughput.py measures throughput and CPU per review next to /healthz.

    .venv/bin/python benchmarks/admission_load.py [--rate 400] [--seconds 10]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
from server_process import free_port, prepare, service_env, serving, tree_cpu_s

WORKLOAD = {
    "slug": "chat",
    "name": "Chat",
    "model": "llama-3-8b",
    "mode": "inference",
    "batch_size": 8,
    "sequence_length": 4096,
    "precision": "bf16",
}
TARGET_P99_MS = 50.0


def pod_review(
    uid: str, name: str, annotations: dict[str, str], containers: list[dict[str, object]]
) -> dict[str, Any]:
    """An AdmissionReview asking to create pod ``name`` in namespace ml."""
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": uid,
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "operation": "CREATE",
            "namespace": "ml",
            "object": {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": name, "annotations": annotations},
                "spec": {"containers": containers},
            },
        },
    }


def _review(resource: str) -> dict[str, Any]:
    """The chat workload's pod on an A100 80GB asking for one ``resource``."""
    notes = {
        "capacity-planner.io/workload": "chat",
        "capacity-planner.io/gpu": "nvidia-a100-80gb-sxm",
    }
    limits = {"limits": {resource: "1"}}
    return pod_review(str(uuid.uuid4()), "chat", notes, [{"name": "server", "resources": limits}])


def _server_env(data_dir: Path, log_level: str | None = "WARNING") -> dict[str, str]:
    """A migrated, catalog-synced SQLite database in ``data_dir`` (``log_level`` None: the
    service default)."""
    env = service_env(CAPPLAN_DATA_DIR=str(data_dir))
    if log_level is not None:
        env["CAPPLAN_LOG_LEVEL"] = log_level
    prepare(env)
    return env


def _request_bytes(port: int, body: dict[str, Any]) -> bytes:
    payload = json.dumps(body).encode()
    head = (
        f"POST /v1/admission/pods HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(payload)}\r\n\r\n"
    )
    return head.encode() + payload


async def _exchange(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, request: bytes
) -> tuple[int, bytes]:
    """One HTTP/1.1 request on a kept-alive connection: (status, body)."""
    writer.write(request)
    head = await reader.readuntil(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    length = 0
    for line in head.split(b"\r\n"):
        if line[:15].lower() == b"content-length:":
            length = int(line[15:])
    return status, await reader.readexactly(length)


async def _load(
    base: str, port: int, rate: float, seconds: float, connections: int
) -> tuple[list[float], int, float]:
    """Open-loop load: request ``i`` is due at ``begin + i / rate``; its latency counts from
    then (time queued for a free connection included, so a slow server cannot hide behind a
    slow client). The client is raw asyncio streams with pre-encoded requests, to leave the
    two cores to the server."""
    async with httpx.AsyncClient(base_url=base, timeout=10) as client:
        created = await client.post("/v1/workloads", json=WORKLOAD)
        created.raise_for_status()
    resources = ("nvidia.com/mig-3g.40gb", "nvidia.com/mig-1g.10gb", "nvidia.com/gpu")
    total = int(rate * seconds)
    requests = [_request_bytes(port, _review(resources[i % len(resources)])) for i in range(total)]
    idle: asyncio.Queue[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = asyncio.Queue()
    for _ in range(connections):
        idle.put_nowait(await asyncio.open_connection("127.0.0.1", port))
    for request in requests[:50]:  # warm up: import paths, caches, every connection
        conn = await idle.get()
        await _exchange(*conn, request)
        idle.put_nowait(conn)
    latencies: list[float] = []
    errors = 0

    async def one(request: bytes, due: float) -> None:
        nonlocal errors
        conn = await idle.get()
        try:
            status, body = await _exchange(*conn, request)
        except (OSError, asyncio.IncompleteReadError, ValueError):
            errors += 1
            return
        idle.put_nowait(conn)
        if status != 200 or b'"allowed"' not in body:
            errors += 1
            return
        latencies.append((time.perf_counter() - due) * 1000)

    tasks = []
    begin = time.perf_counter()
    for index, request in enumerate(requests):
        due = begin + index / rate
        delay = due - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(one(request, due)))
    await asyncio.gather(*tasks)
    elapsed = time.perf_counter() - begin
    while not idle.empty():
        idle.get_nowait()[1].close()
    return latencies, errors, elapsed


def main() -> int:
    """Run the benchmark and print its figures."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", type=float, default=400.0, help="requests per second")
    parser.add_argument("--seconds", type=float, default=10.0, help="duration")
    parser.add_argument("--workers", type=int, default=2, help="server worker processes")
    parser.add_argument("--connections", type=int, default=32, help="kept-alive connections")
    args = parser.parse_args()
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    with (
        tempfile.TemporaryDirectory() as tmp,
        serving(_server_env(Path(tmp)), port, workers=args.workers) as server,
    ):
        cpu_before = tree_cpu_s(server.pid)
        latencies, errors, elapsed = asyncio.run(
            _load(base, port, args.rate, args.seconds, args.connections)
        )
        cpu_after = tree_cpu_s(server.pid)
    latencies.sort()
    done = len(latencies)
    p50 = statistics.median(latencies)
    p99 = latencies[min(done - 1, int(0.99 * done))]
    print(
        f"cores: {os.cpu_count()}, server workers: {args.workers}, offered rate: "
        f"{args.rate:g}/s for {args.seconds:g} s (load generator on the same machine)"
    )
    print(f"requests: {done} ok, {errors} errors, achieved {done / elapsed:.1f}/s")
    print(f"latency ms: p50 {p50:.2f}, p90 {latencies[int(0.9 * done)]:.2f}, p99 {p99:.2f}, "
          f"max {latencies[-1]:.2f}")  # fmt: skip
    if cpu_before is not None and cpu_after is not None:
        used = cpu_after - cpu_before  # includes the 50 warm-up requests
        print(
            f"server CPU: {used:.2f} s for {done + 50} requests = "
            f"{used / (done + 50) * 1000:.2f} ms per request "
            f"({used / elapsed:.2f} of {os.cpu_count()} cores)"
        )
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"load average after the run: {load}")
    ok = errors == 0 and p99 < TARGET_P99_MS
    print(f"target p99 < {TARGET_P99_MS:g} ms: {'met' if ok else 'NOT met'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
