"""Server CPU per request on the stability mix (issue 29, point 5), this tree and older ones.

The mix is the read side of a long stability run: model reads (GET /v1/models/resnet-50),
hardware listings (GET /v1/hardware?limit=20), memory estimates (POST /v1/estimates/memory,
BERT-base training at 64 batch sizes, so most are not one cached answer) and MIG fits
(POST /v1/mig/fit of a stored workload on an A100 80GB), 7:2:4:3 as ``burst.py`` sends them.
Each request goes through the real app (``create_app``, middleware, routing, SQLite) with
httpx's ASGITransport in this process, one at a time, so the process's CPU time
(``time.process_time``) is the server's CPU plus the client's share of httpx, the same for every
tree. After a warm-up of one period of the mix (64 requests), it reports CPU seconds per
request for the mix and per kind, the median of ``--rounds`` rounds; then the CPU seconds of
one estimate of a 99,999-layer ``repeat`` (an inline architecture) in each mode.

    .venv/bin/python benchmarks/read_mix_cpu.py [--requests 400] [--rounds 3] [OLD_TREE ...]

Each OLD_TREE (a directory holding an older checkout, e.g. made with
``git archive <commit> | tar -x -C /tmp/old``) is measured by running this script there
(``PYTHONPATH`` pointing at it, with this interpreter), after this tree, and printed with its
ratio to this tree. On a loaded machine an older tree's 99,999-layer estimate can run past the
8 s limits (a 422 too-expensive, or a 503 from a tree that computed inside its database call)
and stop the run: raise them for every tree with ``CAPPLAN_COMPUTE_TIMEOUT_S=120
CAPPLAN_DB_CALL_TIMEOUT_S=120`` in the environment (their settings read it; CPU is unchanged).

``--live``: each tree is served instead (``python -m app.cli serve``, its default settings, one
worker, a fresh SQLite database in a temporary folder, log level WARNING) and the same requests
are sent over one kept-alive HTTP connection; the CPU is the server process's (and its
children's) user + system time from /proc, so it includes uvicorn, the middleware and the
metrics of a real deployment.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
WORKLOAD = {
    "slug": "chat",
    "name": "Chat",
    "model": "llama-3-8b",
    "mode": "inference",
    "batch_size": 8,
    "sequence_length": 4096,
    "precision": "bf16",
}


# issue 29: a memory estimate of this inline graph took 0.9 s before the allocator replay and
# 8 s (18 s of CPU) after it
REPEATED = {
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


# One period of the mix: its estimates use 16 batch sizes (1 + index % 64 at the estimate
# slots), so after it every estimate of the plain mix is answered from the estimate cache, as in
# a long stability run; with --distinct-estimates none is.
WARM_UP = 64


def _mix(index: int, distinct: bool = False) -> tuple[str, str, str, dict[str, Any] | None]:
    """Request ``index`` of the mix: (kind, method, path, body); ``distinct``: every estimate
    at its own batch size (none answered from the estimate cache)."""
    slot = index % 16
    if slot < 7:
        return "GET model", "GET", "/v1/models/resnet-50", None
    if slot < 9:
        return "GET hardware", "GET", "/v1/hardware?limit=20", None
    if slot < 13:
        batch = 1 + (index if distinct else index % 64)  # mostly not one cached answer
        body = {"model": "bert-base", "mode": "training", "batch_size": batch, "precision": "bf16"}
        return "POST estimate", "POST", "/v1/estimates/memory", body
    body = {"workload": "chat", "gpu": "nvidia-a100-80gb-sxm"}
    return "POST mig fit", "POST", "/v1/mig/fit", body


def measure(requests: int, rounds: int, distinct: bool) -> dict[str, Any]:
    """CPU seconds per request of this interpreter's ``app`` (the tree on ``sys.path``)."""
    import httpx

    from app.config import Settings
    from app.db.migrations import upgrade_to_head
    from app.db.session import make_engine, make_session_factory
    from app.main import create_app
    from app.services.catalog import load_catalog, sync_catalog
    from app.services.zoo import sync_zoo

    tree = Path(sys.modules["app"].__file__ or ".").resolve().parent.parent
    with tempfile.TemporaryDirectory() as folder:
        url = f"sqlite:///{folder}/mix.db"
        upgrade_to_head(url)
        engine = make_engine(url)
        with make_session_factory(engine)() as session:
            sync_catalog(session, load_catalog(tree / "hardware_catalog"))
            sync_zoo(session)
        engine.dispose()
        settings = Settings(
            _env_file=None,  # type: ignore[call-arg]
            database_url=url,
            api_keys="",
            require_auth_for_reads=False,
            catalog_dir=tree / "hardware_catalog",
        )
        app = create_app(settings)

        async def run() -> dict[str, Any]:
            transport = httpx.ASGITransport(app=app)
            async with (
                app.router.lifespan_context(app),
                httpx.AsyncClient(transport=transport, base_url="http://bench") as client,
            ):
                created = await client.post("/v1/workloads", json=WORKLOAD)
                assert created.status_code in (200, 201), created.text
                for index in range(WARM_UP):
                    kind, method, path, body = _mix(index)
                    response = await client.request(method, path, json=body)
                    assert response.status_code == 200, (kind, response.text)
                totals: list[float] = []
                per_kind: dict[str, list[float]] = defaultdict(list)
                for round_ in range(rounds):
                    spent: dict[str, float] = defaultdict(float)
                    counts: dict[str, int] = defaultdict(int)
                    gc.collect()
                    start = time.process_time()
                    for index in range(requests):
                        at = WARM_UP + round_ * requests + index
                        kind, method, path, body = _mix(at, distinct)
                        before = time.process_time()
                        response = await client.request(method, path, json=body)
                        spent[kind] += time.process_time() - before
                        counts[kind] += 1
                        assert response.status_code == 200, (kind, response.text)
                    totals.append((time.process_time() - start) / requests)
                    for kind in spent:
                        per_kind[kind].append(spent[kind] / counts[kind])
                repeated = {}
                for mode in ("training", "inference"):
                    body = {"architecture": REPEATED, "mode": mode, "batch_size": 8}
                    start = time.process_time()
                    response = await client.post("/v1/estimates/memory", json=body)
                    repeated[mode] = time.process_time() - start
                    assert response.status_code == 200, response.text
                return {
                    "tree": str(tree),
                    "repeated_cpu_s": repeated,
                    "cpu_s_per_request": statistics.median(totals),
                    "rounds": totals,
                    "per_kind": {k: statistics.median(v) for k, v in sorted(per_kind.items())},
                }

        return asyncio.run(run())


def measure_live(tree: Path, requests: int, rounds: int, distinct: bool) -> dict[str, Any]:
    """The mix against ``tree`` served by ``python -m app.cli serve``: server CPU per request."""
    import httpx

    sys.path.insert(0, str(ROOT / "benchmarks"))
    from server_process import free_port, tree_cpu_s  # (not a package)

    port = free_port()
    base = f"http://127.0.0.1:{port}"
    with tempfile.TemporaryDirectory() as folder:
        env = {k: v for k, v in os.environ.items() if not k.startswith("CAPPLAN_")}
        env |= {"CAPPLAN_DATA_DIR": folder, "CAPPLAN_API_KEYS": "", "PYTHONPATH": str(tree)}
        env["CAPPLAN_LOG_LEVEL"] = "WARNING"
        python = sys.executable
        for command in ("migrate", "catalog-sync"):
            subprocess.run(
                [python, "-m", "app.cli", command],
                cwd=tree,
                env=env,
                check=True,
                capture_output=True,
            )
        server = subprocess.Popen(
            [python, "-m", "app.cli", "serve", "--port", str(port)],
            cwd=tree,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            with httpx.Client(base_url=base, timeout=60) as client:
                for _ in range(300):
                    try:
                        if client.get("/readyz").status_code == 200:
                            break
                    except httpx.TransportError:
                        pass
                    time.sleep(0.1)
                created = client.post("/v1/workloads", json=WORKLOAD)
                assert created.status_code in (200, 201), created.text
                for index in range(WARM_UP):
                    kind, method, path, body = _mix(index)
                    assert client.request(method, path, json=body).status_code == 200, kind
                totals = []
                for round_ in range(rounds):
                    start = tree_cpu_s(server.pid) or 0.0
                    for index in range(requests):
                        at = WARM_UP + round_ * requests + index
                        kind, method, path, body = _mix(at, distinct)
                        response = client.request(method, path, json=body)
                        assert response.status_code == 200, (kind, response.text)
                    totals.append(((tree_cpu_s(server.pid) or 0.0) - start) / requests)
        finally:
            server.terminate()
            server.wait(timeout=30)
    return {
        "tree": f"{tree} (served)",
        "cpu_s_per_request": statistics.median(totals),
        "rounds": totals,
        "per_kind": {},
    }


def _print(result: dict[str, Any], baseline: dict[str, Any] | None) -> None:
    ratio = ""
    if baseline is not None:
        ratio = f"  ({result['cpu_s_per_request'] / baseline['cpu_s_per_request']:.2f}x this tree)"
    print(f"{result['tree']}")
    rounds = ", ".join(f"{1000 * r:.2f}" for r in result["rounds"])
    print(f"  mix: {1000 * result['cpu_s_per_request']:.2f} ms CPU/request{ratio} [{rounds}]")
    for kind, value in result["per_kind"].items():
        print(f"  {kind:<14} {1000 * value:7.2f} ms CPU/request")
    for mode, value in result.get("repeated_cpu_s", {}).items():
        print(f"  POST estimate of a 99,999-layer repeat ({mode}): {value:.2f} s CPU")


def main() -> None:
    """Measure this tree, then every OLD_TREE in its own process."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("old_trees", nargs="*", type=Path)
    parser.add_argument("--requests", type=int, default=400)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--distinct-estimates",
        action="store_true",
        help="every estimate at its own batch size (the estimate cache never answers)",
    )
    parser.add_argument("--live", action="store_true", help="serve each tree; server CPU")
    parser.add_argument("--json", action="store_true", help="print one JSON result (internal)")
    args = parser.parse_args()
    if args.live:
        print(f"load average: {', '.join(f'{x:.2f}' for x in os.getloadavg())}")
        first = None
        for tree in [ROOT, *args.old_trees]:
            live = measure_live(tree.resolve(), args.requests, args.rounds, args.distinct_estimates)
            _print(live, first)
            first = first or live
        return
    result = measure(args.requests, args.rounds, args.distinct_estimates)
    if args.json:
        print(json.dumps(result))
        return
    print(f"load average: {', '.join(f'{x:.2f}' for x in os.getloadavg())}")
    _print(result, None)
    for tree in args.old_trees:
        tree = tree.resolve()
        env = {**os.environ, "PYTHONPATH": str(tree)}
        command = [sys.executable, str(Path(__file__).resolve()), "--json"]
        command += ["--requests", str(args.requests), "--rounds", str(args.rounds)]
        command += ["--distinct-estimates"] if args.distinct_estimates else []
        done = subprocess.run(command, cwd=tree, env=env, capture_output=True, text=True)
        if done.returncode != 0:
            print(f"{tree}: failed\n{done.stderr[-2000:]}")
            continue
        _print(json.loads(done.stdout.strip().splitlines()[-1]), result)


if __name__ == "__main__":
    main()
