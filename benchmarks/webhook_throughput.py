"""Throughput of the admission webhook and MIG fit next to /healthz, on one server process.

Starts `capplan-server serve` with its default settings (one worker process; a fresh SQLite
database in a temporary folder, migrated, catalog synced, one workload stored) and measures, in
one run and side by side:

* closed-loop throughput (``--connections`` kept-alive connections, each sending its next request
  as soon as the previous one is answered, for ``--seconds``) of ``GET /healthz``,
  ``POST /v1/admission/pods`` (a review whose decision is cached) and ``POST /v1/mig/fit``
  (a repeated fit), in ``--rounds`` interleaved rounds (the machine may be shared: the median
  round is printed), with the server's CPU time per request read from /proc;
* open-loop latency of the webhook at ``--rate`` reviews/s (default 400) for ``--seconds``:
  request ``i`` is due at ``start + i / rate`` and its latency counts from then.

Targets (issue 11, point 5): webhook >= 50 % of /healthz, MIG fit >= 35 %, a cached decision
under 1 ms of server CPU, p99 under 50 ms at 400 reviews/s. The client shares the machine (raw
asyncio streams with pre-encoded requests, to leave the cores to the server). It prints figures;
the exit status is 1 when a target is missed.

    .venv/bin/python benchmarks/webhook_throughput.py [--seconds 5] [--connections 16]
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
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from admission_load import (  # noqa: E402  (benchmarks/ is not a package)
    WORKLOAD,
    _cpu_seconds,
    _exchange,
    _free_port,
    _review,
    _start_server,
    _wait_ready,
)

GPU = "nvidia-a100-80gb-sxm"
TARGETS = {"webhook": 0.50, "mig fit": 0.35}
TARGET_CPU_MS = 1.0
TARGET_P99_MS = 50.0

Conn = tuple[asyncio.StreamReader, asyncio.StreamWriter]


def _http(port: int, method: str, path: str, body: bytes | None = None) -> bytes:
    head = f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
    if body is None:
        return (head + "\r\n").encode()
    head += f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    return head.encode() + body


def _requests(port: int) -> dict[str, Callable[[int], bytes]]:
    """Per kind, a function of a sequence number giving a pre-encoded request."""
    reviews = [
        _http(
            port,
            "POST",
            "/v1/admission/pods",
            json.dumps(_review("nvidia.com/mig-7g.80gb")).encode(),
        )
        for _ in range(64)  # distinct uids, one decision
    ]
    fit = _http(port, "POST", "/v1/mig/fit", json.dumps({"gpu": GPU, "workload": "chat"}).encode())
    healthz = _http(port, "GET", "/healthz")
    return {
        "healthz": lambda _: healthz,
        "webhook": lambda i: reviews[i % len(reviews)],
        "mig fit": lambda _: fit,
    }


def _check(kind: str, status: int, body: bytes) -> bool:
    if status != 200:
        return False
    if kind == "webhook":
        answer = json.loads(body)["response"]
        return answer["allowed"] is True and "uid" in answer
    if kind == "mig fit":
        return b'"smallest_fitting_profile"' in body
    return body == b'{"status":"ok"}'


@dataclass
class Round:
    """One closed-loop measurement of one kind of request."""

    kind: str
    done: int
    errors: int
    elapsed_s: float
    cpu_s: float | None

    @property
    def per_s(self) -> float:
        return self.done / self.elapsed_s

    @property
    def cpu_ms(self) -> float | None:
        return None if self.cpu_s is None or not self.done else self.cpu_s / self.done * 1000


async def _closed_loop(
    conns: list[Conn], kind: str, make: Callable[[int], bytes], seconds: float, pid: int
) -> Round:
    done = errors = 0
    counter = 0
    stop_at = 0.0

    async def worker(conn: Conn) -> None:
        nonlocal done, errors, counter
        while time.perf_counter() < stop_at:
            counter += 1
            status, body = await _exchange(*conn, make(counter))
            if _check(kind, status, body):
                done += 1
            else:
                errors += 1

    for conn in conns:  # warm up every connection and the server's caches
        for index in range(3):
            status, body = await _exchange(*conn, make(index))
            if not _check(kind, status, body):
                raise RuntimeError(f"{kind}: unexpected answer {status} {body[:300]!r}")
    cpu_before = _cpu_seconds(pid)
    begin = time.perf_counter()
    stop_at = begin + seconds
    await asyncio.gather(*(worker(conn) for conn in conns))
    elapsed = time.perf_counter() - begin
    cpu_after = _cpu_seconds(pid)
    cpu = None if cpu_before is None or cpu_after is None else cpu_after - cpu_before
    return Round(kind, done, errors, elapsed, cpu)


async def _open_loop(
    conns: list[Conn], make: Callable[[int], bytes], rate: float, seconds: float
) -> tuple[list[float], int, float]:
    idle: asyncio.Queue[Conn] = asyncio.Queue()
    for conn in conns:
        idle.put_nowait(conn)
    latencies: list[float] = []
    errors = 0

    async def one(index: int, due: float) -> None:
        nonlocal errors
        conn = await idle.get()
        status, body = await _exchange(*conn, make(index))
        idle.put_nowait(conn)
        if _check("webhook", status, body):
            latencies.append((time.perf_counter() - due) * 1000)
        else:
            errors += 1

    tasks = []
    begin = time.perf_counter()
    for index in range(int(rate * seconds)):
        due = begin + index / rate
        delay = due - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(one(index, due)))
    await asyncio.gather(*tasks)
    return latencies, errors, time.perf_counter() - begin


async def _run(args: argparse.Namespace, port: int, pid: int) -> int:
    base = f"http://127.0.0.1:{port}"
    await _wait_ready(base)
    async with httpx.AsyncClient(base_url=base, timeout=30) as client:
        (await client.post("/v1/workloads", json=WORKLOAD)).raise_for_status()
    makers = _requests(port)
    conns = [await asyncio.open_connection("127.0.0.1", port) for _ in range(args.connections)]
    rounds: dict[str, list[Round]] = {kind: [] for kind in makers}
    for number in range(args.rounds):
        for kind, make in makers.items():
            result = await _closed_loop(conns, kind, make, args.seconds, pid)
            rounds[kind].append(result)
            cpu = f"{result.cpu_ms:.3f} ms CPU/request" if result.cpu_ms is not None else ""
            print(
                f"round {number + 1} {kind:8s} {result.per_s:8.1f}/s "
                f"({result.done} ok, {result.errors} errors) {cpu}"
            )
    ok = True
    print(
        f"\nclosed loop, {args.connections} connections, {args.seconds:g} s x {args.rounds} "
        f"rounds, 1 server process, {os.cpu_count()} cores shared with the client:"
    )
    health = [r.per_s for r in rounds["healthz"]]
    for kind, results in rounds.items():
        rates = [r.per_s for r in results]
        cpus = [c for r in results if (c := r.cpu_ms) is not None]
        errors = sum(r.errors for r in results)
        ok = ok and errors == 0
        line = f"  {kind:8s} median {statistics.median(rates):8.1f}/s"
        if cpus:
            line += f", server CPU {statistics.median(cpus):.3f} ms/request"
        if kind != "healthz":
            ratios = [rate / h for rate, h in zip(rates, health, strict=True)]
            ratio = statistics.median(ratios)
            met = ratio >= TARGETS[kind]
            ok = ok and met
            line += (
                f", {ratio:.0%} of /healthz (rounds: "
                + ", ".join(f"{x:.0%}" for x in ratios)
                + f"; target {TARGETS[kind]:.0%}: {'met' if met else 'NOT met'})"
            )
        if kind == "webhook" and cpus:
            met = statistics.median(cpus) < TARGET_CPU_MS
            ok = ok and met
            line += f"; CPU target < {TARGET_CPU_MS:g} ms: {'met' if met else 'NOT met'}"
        print(line + (f", {errors} errors" if errors else ""))
    await asyncio.sleep(0.5)
    webhook = makers["webhook"]
    for index in range(50):  # warm-up
        await _exchange(*conns[0], webhook(index))
    cpu_before = _cpu_seconds(pid)
    latencies, errors, elapsed = await _open_loop(conns, webhook, args.rate, args.seconds)
    cpu_after = _cpu_seconds(pid)
    for _, writer in conns:
        writer.close()
    latencies.sort()
    done = len(latencies)
    p99 = latencies[min(done - 1, int(0.99 * done))]
    print(
        f"\nopen loop, {args.rate:g} reviews/s for {args.seconds:g} s: {done} ok, {errors} "
        f"errors, achieved {done / elapsed:.1f}/s; latency ms p50 "
        f"{statistics.median(latencies):.2f}, p90 {latencies[int(0.9 * done)]:.2f}, "
        f"p99 {p99:.2f}, max {latencies[-1]:.2f}"
    )
    if cpu_before is not None and cpu_after is not None:
        used = cpu_after - cpu_before
        per_review_ms = used / max(done, 1) * 1000
        print(f"  server CPU {per_review_ms:.3f} ms/review ({used / elapsed:.2f} cores)")
    met = errors == 0 and p99 < TARGET_P99_MS
    print(f"  target p99 < {TARGET_P99_MS:g} ms: {'met' if met else 'NOT met'}")
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"load average after the run: {load}")
    return 0 if ok and met else 1


def main() -> int:
    """Run the benchmark and print its figures."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=5.0, help="duration of each phase")
    parser.add_argument("--rounds", type=int, default=3, help="closed-loop rounds")
    parser.add_argument("--connections", type=int, default=16, help="kept-alive connections")
    parser.add_argument("--rate", type=float, default=400.0, help="open-loop reviews per second")
    parser.add_argument(
        "--log-level",
        default=None,
        help="CAPPLAN_LOG_LEVEL of the server (default: the service default, INFO)",
    )
    args = parser.parse_args()
    port = _free_port()
    with tempfile.TemporaryDirectory() as tmp:
        server = _start_server(Path(tmp), port, workers=1, log_level=args.log_level)
        try:
            return asyncio.run(_run(args, port, server.pid))
        finally:
            server.terminate()
            server.wait(timeout=10)


if __name__ == "__main__":
    sys.exit(main())
