"""Over-budget benchmark: the hostile set of issue 29 against `capplan-server serve`, defaults.

For each backend (SQLite in a temporary folder; PostgreSQL in a scratch database created on the
server named by --postgres-url or TEST_DATABASE_URL, dropped afterwards) the script migrates,
syncs the catalog, starts `serve` with its default settings (one worker process) and sends the
hostile set, one step at a time:

* four simultaneous GPT-3 175B recommendations (every precision, ``max_batch_size`` 65536,
  scenario server, beam widths 16, 15, 14, 13);
* a recommendation for an inline graph of 1,000 distinct linear layers up to batch 65536, and
  the same at the default batch sizes;
* a recommendation and a memory estimate for an inline graph of 10,000 distinct layers;
* two recommendations of 350 distinct layers and two training estimates of 9,991 repeated
  layers at once, each just under the default work limit (the most the budget lets in: the
  RSS they reach is what the limit has to keep under the deploy kit's);
* inference and training estimates of a 99,990-layer repeated graph (within the budget: past
  10,000 executed layers the allocator is not replayed; before that bound its training replay
  ran for 44 s and +580 MiB).

Throughout, a reader asks ``GET /v1/models/resnet-50`` every 50 ms, and the server's RSS
(the process and its children) is sampled every 100 ms. After each hostile answer one more read
is timed. Printed per step: status and problem type, seconds, the read right after it; then the
reads' statuses (any ``database-unavailable`` while the database is up is a failure), the
slowest read, server CPU seconds, and the RSS baseline and peak against the deploy kit's memory
limit (deploy/kubernetes/deployment.yaml: 512 Mi).

Targets (issue 29): after any over-budget request an unrelated read is answered 200 within
1 s; no ``database-unavailable`` while the database is up; RSS under the deploy kit's limit.
Exits 1 when one is missed.

    .venv/bin/python benchmarks/over_budget.py [--backends sqlite,postgresql]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from server_process import (
    add_backend_arguments,
    database,
    free_port,
    start,
    stop,
    tree_cpu_s,
    tree_rss_bytes,
    wait_ready,
)

MEMORY_LIMIT_BYTES = 512 * 2**20  # deploy/kubernetes/deployment.yaml: limits.memory 512Mi
READ_AFTER_TARGET_S = 1.0
READ = "/v1/models/resnet-50"
PRECISIONS = [
    "fp32",
    "tf32",
    "bf16",
    "fp16",
    "amp_bf16",
    "amp_fp16",
    "mixed_bf16",
    "mixed_fp16",
    "fp8",
    "int8",
    "int8_weight_only",
    "int4",
    "fp4",
]


def distinct_linear(layers: int) -> dict[str, Any]:
    return {
        "inputs": [{"name": "x", "shape": ["batch", 64]}],
        "layers": [
            {"name": f"fc{i}", "op": "linear", "out_features": 64 + i} for i in range(layers)
        ],
    }


def repeated_linear(layers: int) -> dict[str, Any]:
    body = [{"name": f"fc{i}", "op": "linear", "out_features": 64} for i in range(10)]
    return {
        "inputs": [{"name": "x", "shape": ["batch", 64]}],
        "layers": [{"name": "blocks", "op": "repeat", "times": layers // 10, "layers": body}],
    }


def gpt3(beam: int) -> dict[str, Any]:
    return {
        "model": "gpt-3-175b",
        "precisions": PRECISIONS,
        "max_batch_size": 65536,
        "scenario": "server",
        "latency_slo_ms": 60_000,
        "beam_width": beam,
    }


STEPS: list[tuple[str, list[tuple[str, dict[str, Any]]]]] = [
    (
        "4 x GPT-3 175B, every precision, batch <= 65536, server, beam 16..13",
        [("/v1/recommendations/inference", gpt3(beam)) for beam in (16, 15, 14, 13)],
    ),
    (
        "recommendation, 1,000 distinct layers, batch <= 65536",
        [
            (
                "/v1/recommendations/inference",
                {"architecture": distinct_linear(1_000), "max_batch_size": 65536},
            )
        ],
    ),
    (
        "recommendation, 1,000 distinct layers, default batches",
        [("/v1/recommendations/inference", {"architecture": distinct_linear(1_000)})],
    ),
    (
        "recommendation, 10,000 distinct layers",
        [("/v1/recommendations/inference", {"architecture": distinct_linear(10_000)})],
    ),
    (
        "memory estimate, 10,000 distinct layers, training",
        [
            (
                "/v1/estimates/memory",
                {"architecture": distinct_linear(10_000), "mode": "training", "batch_size": 8},
            )
        ],
    ),
    (
        "2 x recommendation, 350 distinct layers (1,940,400 units: under the default limit)",
        [("/v1/recommendations/inference", {"architecture": distinct_linear(350)})] * 2,
    ),
    (
        "2 x memory estimate, 9,991 repeated layers, training (1,998,200 units: at the limit)",
        [
            (
                "/v1/estimates/memory",
                {"architecture": repeated_linear(9_999), "mode": "training", "batch_size": 8},
            )
        ]
        * 2,
    ),
    (
        "memory estimate, 99,990 repeated layers, inference (1,499,865 units: within)",
        [
            (
                "/v1/estimates/memory",
                {"architecture": repeated_linear(99_990), "mode": "inference", "batch_size": 8},
            )
        ],
    ),
    (
        "memory estimate, 99,990 repeated layers, training (1,499,865 units: within)",
        [
            (
                "/v1/estimates/memory",
                {"architecture": repeated_linear(99_990), "mode": "training", "batch_size": 8},
            )
        ],
    ),
]


@dataclass
class Watch:
    """What the reader and the RSS sampler saw."""

    reads: Counter[str] = field(default_factory=Counter)
    slowest_read_s: float = 0.0
    rss_bytes: list[int] = field(default_factory=list)
    stop: bool = False


def _kind(response: httpx.Response) -> str:
    if response.headers.get("content-type", "").startswith("application/problem+json"):
        return f"{response.status_code} {response.json().get('type', '?')}"
    return str(response.status_code)


async def _reader(base: str, watch: Watch) -> None:
    async with httpx.AsyncClient(base_url=base, timeout=30) as client:
        while not watch.stop:
            start = time.perf_counter()
            try:
                response = await client.get(READ)
                watch.reads[_kind(response)] += 1
            except httpx.HTTPError as exc:
                watch.reads[type(exc).__name__] += 1
            watch.slowest_read_s = max(watch.slowest_read_s, time.perf_counter() - start)
            await asyncio.sleep(0.05)


async def _sampler(pid: int, watch: Watch) -> None:
    while not watch.stop:
        watch.rss_bytes.append(tree_rss_bytes(pid))
        await asyncio.sleep(0.1)


async def _scenario(base: str, pid: int) -> tuple[Watch, list[str], bool]:
    watch = Watch()
    lines: list[str] = []
    ok = True
    async with httpx.AsyncClient(base_url=base, timeout=120) as client:
        await client.get(READ)  # warm
        watch.rss_bytes.append(tree_rss_bytes(pid))
        tasks = [
            asyncio.create_task(_reader(base, watch)),
            asyncio.create_task(_sampler(pid, watch)),
        ]
        for label, requests in STEPS:
            first_sample = len(watch.rss_bytes)
            start = time.perf_counter()
            answers = await asyncio.gather(
                *(client.post(path, json=body) for path, body in requests)
            )
            seconds = time.perf_counter() - start
            read_start = time.perf_counter()
            async with httpx.AsyncClient(base_url=base, timeout=30) as fresh:
                read = await fresh.get(READ)
            read_s = time.perf_counter() - read_start
            kinds = Counter(_kind(answer) for answer in answers)
            step_peak = max(watch.rss_bytes[first_sample:] or [tree_rss_bytes(pid)])
            met = read.status_code == 200 and read_s <= READ_AFTER_TARGET_S
            ok &= met
            lines.append(
                f"  {label}\n"
                f"    answers {dict(kinds)} in {seconds:.2f} s; unrelated read after it: "
                f"{read.status_code} in {read_s * 1000:.0f} ms{'' if met else '  <-- MISSED'}; "
                f"RSS peak {step_peak / 2**20:.0f} MiB"
            )
        watch.stop = True
        await asyncio.gather(*tasks)
    return watch, lines, ok


def main() -> int:
    """Run the hostile set on each backend and print its figures."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_backend_arguments(parser)
    args = parser.parse_args()
    print(f"cores: {os.cpu_count()}; server: `serve` with default settings (1 worker)")
    all_ok = True
    for backend in args.backends.split(","):
        with (
            tempfile.TemporaryDirectory() as tmp,
            database(backend, args.postgres_url, Path(tmp), CAPPLAN_LOG_LEVEL="WARNING") as env,
        ):
            port = free_port()
            server = start(env, port)
            try:
                cpu_before = tree_cpu_s(server.pid) or 0.0  # start-up included, as before
                wait_ready(server, port)
                watch, lines, ok = asyncio.run(_scenario(f"http://127.0.0.1:{port}", server.pid))
                cpu = (tree_cpu_s(server.pid) or 0.0) - cpu_before
            finally:
                stop(server)
        outage = sum(n for kind, n in watch.reads.items() if "database-unavailable" in kind)
        peak = max(watch.rss_bytes)
        under = peak < MEMORY_LIMIT_BYTES
        ok &= outage == 0 and under
        all_ok &= ok
        print(f"{backend}:")
        print("\n".join(lines))
        print(
            f"  reads of {READ} throughout: {dict(watch.reads)}; slowest "
            f"{watch.slowest_read_s * 1000:.0f} ms; database-unavailable: {outage}"
            f"{'' if outage == 0 else '  <-- MISSED'}"
        )
        print(
            f"  server RSS: {watch.rss_bytes[0] / 2**20:.0f} MiB before, peak "
            f"{peak / 2**20:.0f} MiB (limit {MEMORY_LIMIT_BYTES / 2**20:.0f} MiB)"
            f"{'' if under else '  <-- MISSED'}; server CPU {cpu:.1f} s"
        )
    return 0 if all_ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
