"""Peak memory of an ONNX import: in memory, and through HTTP against a served process.

Run: .venv/bin/python benchmarks/import_memory.py [--mib 90] [--concurrent 6] [--skip-http]

In memory: builds an MLP whose float weights take about ``--mib`` MiB, serialises it with its
weights and without them (dims only), and imports each in a fresh subprocess (Linux only),
reporting the resident memory just before ``import_onnx`` (the upload already read) and its
peak during the import (``VmHWM`` after resetting it with ``/proc/self/clear_refs``).

Through HTTP (what an operator sizes a pod by): migrates a temporary SQLite database, starts
``capplan-server serve`` on it with the default settings (one process; the environment's
``CAPPLAN_*`` are removed, ``--env NAME=VALUE`` sets some), and posts the file with its weights
to ``/v1/models/import/onnx``: first one upload alone, then ``--concurrent`` at once. The
server's resident memory is sampled every 5 ms from ``/proc/<pid>/status``, with its own peak
(``VmHWM``). Printed: statuses, RSS at rest and at peak, and the peak's increase per upload and
per MiB uploaded. The deploy kit's memory limit (512 MiB) must stay above the peak.
"""

from __future__ import annotations

import argparse
import contextlib
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import httpx
from server_process import sqlite_served

DEPLOY_LIMIT_MIB = 512  # deploy/kubernetes/deployment.yaml: resources.limits.memory

# Linux: VmRSS now, VmHWM the peak since the last reset (writing 5 to clear_refs resets it).
CHILD = """
import sys
from app.importers.onnx_model import import_onnx
def status(key):
    for line in open('/proc/self/status'):
        if line.startswith(key):
            return int(line.split()[1])
data = open(sys.argv[1], 'rb').read()
open('/proc/self/clear_refs', 'w').write('5')
before = status('VmRSS:')
imported = import_onnx(data)
after = status('VmHWM:')
print(before, after, imported.parameter_count)
"""


def build(mib: int, weights: bool) -> bytes:
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    width = 2048
    layers = max(1, mib * 2**20 // (width * width * 4))
    nodes, inits = [], []
    current = "x"
    for i in range(layers):
        w = np.random.default_rng(i).standard_normal((width, width), dtype=np.float32)
        tensor = numpy_helper.from_array(w, f"w{i}")
        if not weights:
            tensor.ClearField("raw_data")
        inits.append(tensor)
        nodes.append(helper.make_node("MatMul", [current, f"w{i}"], [f"h{i}"]))
        nodes.append(helper.make_node("Relu", [f"h{i}"], [f"r{i}"]))
        current = f"r{i}"
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", width])
    y = helper.make_tensor_value_info(current, TensorProto.FLOAT, ["batch", width])
    graph = helper.make_graph(nodes, "mlp", [x], [y], initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return bytes(model.SerializeToString())


def _status_kib(pid: int, key: str) -> int:
    with open(f"/proc/{pid}/status") as handle:
        for line in handle:
            if line.startswith(key):
                return int(line.split()[1])
    raise RuntimeError(f"{key} not in /proc/{pid}/status")


class _Sampler(threading.Thread):
    """The peak resident memory of ``pid`` (KiB) from samples every 5 ms and VmHWM."""

    def __init__(self, pid: int) -> None:
        super().__init__(daemon=True)
        self.pid = pid
        self.peak_kib = 0
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            with contextlib.suppress(OSError, RuntimeError):
                self.peak_kib = max(self.peak_kib, _status_kib(self.pid, "VmRSS:"))
            time.sleep(0.005)


@dataclass
class HttpRound:
    statuses: Counter[int]
    rest_mib: float  # RSS before the uploads
    peak_mib: float  # RSS peak while they ran (max of the samples and VmHWM)
    seconds: float


def _upload(port: int, data: bytes, slug: str) -> int:
    try:
        response = httpx.post(
            f"http://127.0.0.1:{port}/v1/models/import/onnx",
            files={"file": ("model.onnx", data, "application/octet-stream")},
            data={"slug": slug},
            timeout=600,
        )
    except httpx.HTTPError:
        return 0  # no answer (connection closed or reset)
    return response.status_code


def _http_round(pid: int, port: int, data: bytes, count: int, tag: str) -> HttpRound:
    # Start from rest: wait until the previous round's memory (if any) has settled.
    time.sleep(1.0)
    open(f"/proc/{pid}/clear_refs", "w").write("5")  # noqa: SIM115 (reset VmHWM; Linux)
    rest = _status_kib(pid, "VmRSS:")
    sampler = _Sampler(pid)
    sampler.start()
    start = time.perf_counter()
    with ThreadPoolExecutor(count) as pool:
        statuses = Counter(pool.map(lambda i: _upload(port, data, f"{tag}-{i}"), range(count)))
    seconds = time.perf_counter() - start
    sampler.stop.set()
    sampler.join()
    peak = max(sampler.peak_kib, _status_kib(pid, "VmHWM:"))
    return HttpRound(statuses, rest / 1024, peak / 1024, seconds)


def through_http(root: Path, mib: int, concurrent: int, extra_env: dict[str, str]) -> None:
    data = build(mib, weights=True)
    size = len(data) / 2**20
    print(f"\nthrough HTTP: `capplan-server serve` (one process, SQLite), {size:.1f} MiB file "
          f"with weights; server RSS sampled every 5 ms and VmHWM")  # fmt: skip
    print(f"{'uploads':<22} {'statuses':<18} {'RSS rest MiB':>12} {'peak MiB':>9} "
          f"{'+ MiB':>7} {'+ / upload MiB':>15} {'+ / MiB sent':>13} {'s':>6}")  # fmt: skip
    with sqlite_served(root, **extra_env) as (pid, port):
        for label, count in (("1 alone", 1), (f"{concurrent} at once", concurrent)):
            r = _http_round(pid, port, data, count, f"m{count}")
            increase = r.peak_mib - r.rest_mib
            accepted = max(1, r.statuses.get(201, 0))
            shown = ",".join(f"{n}x{s}" for s, n in sorted(r.statuses.items()))
            print(f"{label:<22} {shown:<18} {r.rest_mib:>12.0f} {r.peak_mib:>9.0f} "
                  f"{increase:>7.0f} {increase / accepted:>15.0f} "
                  f"{increase / (size * count):>12.2f}x {r.seconds:>6.1f}")  # fmt: skip
    print(f"deploy kit memory limit: {DEPLOY_LIMIT_MIB} MiB")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=int, default=90)
    parser.add_argument("--concurrent", type=int, default=6)
    parser.add_argument("--skip-http", action="store_true", help="only the in-memory figures")
    parser.add_argument("--skip-memory", action="store_true", help="only the HTTP figures")
    parser.add_argument("--env", action="append", default=[], metavar="CAPPLAN_NAME=VALUE",
                        help="a setting for the served process (repeatable)")  # fmt: skip
    args = parser.parse_args()
    root = Path(__file__).resolve().parents[1]
    extra_env = dict(item.split("=", 1) for item in args.env)
    if not args.skip_memory:
        in_memory(root, args.mib)
    if not args.skip_http:
        through_http(root, args.mib, args.concurrent, extra_env)
    return 0


def in_memory(root: Path, mib: int) -> None:
    print(f"{'file':<14} {'size MiB':>9} {'RSS before MiB':>15} {'peak after MiB':>15} "
          f"{'increase / size':>16}")  # fmt: skip
    for label, weights in (("with weights", True), ("graph only", False)):
        data = build(mib, weights)
        with tempfile.NamedTemporaryFile(suffix=".onnx") as handle:
            handle.write(data)
            handle.flush()
            out = subprocess.run(
                [sys.executable, "-c", CHILD, handle.name],
                cwd=root, capture_output=True, text=True, check=True,
            ).stdout.split()  # fmt: skip
        before, after = int(out[0]) / 1024, int(out[1]) / 1024
        size = len(data) / 2**20
        ratio = f"{(after - before) / size:>15.1f}x" if size >= 1 else f"{'-':>16}"
        print(f"{label:<14} {size:>9.2f} {before:>15.0f} {after:>15.0f} {ratio}")


if __name__ == "__main__":
    raise SystemExit(main())
