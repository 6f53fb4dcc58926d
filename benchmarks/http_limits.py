"""Hostile request heads against `capplan-server serve` (default settings, SQLite).

Run: .venv/bin/python benchmarks/http_limits.py [--mib 64] [--slow 1000] [--root PATH]

Migrates a temporary SQLite database, starts ``serve`` on a loopback port (the environment's
``CAPPLAN_*`` removed), and sends, each while a separate thread asks ``/healthz`` every 20 ms:

* one request with a ``--mib`` MiB header, then one with a ``--mib`` MiB URL: the status (or
  "reset" when the server closed before an answer could be read), the time to it, the
  server's CPU seconds it cost (``/proc/<pid>/stat``) and the slowest ``/healthz`` meanwhile;
* ``--slow`` connections that trickle a header line every second and never end their head
  (slowloris): how many the server still holds open after ``CAPPLAN_HEADER_TIMEOUT_S`` + 5 s.

``--root`` serves another checkout's code (say the previous release) with this interpreter.
Targets (issue 29): 431 / 414 within 1 s and 0.5 s of CPU, ``/healthz`` under 100 ms, no
trickling connection open after the header timeout.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import resource
import socket
import threading
import time
from pathlib import Path

from server_process import ROOT, sqlite_served

HEADER_TIMEOUT_S = 10.0  # the default of CAPPLAN_HEADER_TIMEOUT_S


def _cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as handle:
        fields = handle.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _healthz(port: int) -> float:
    start = time.perf_counter()
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: b\r\nConnection: close\r\n\r\n")
        while sock.recv(65536):
            pass
    return time.perf_counter() - start


class _Prober(threading.Thread):
    """The slowest /healthz while it runs (every 20 ms, a connection each)."""

    def __init__(self, port: int) -> None:
        super().__init__(daemon=True)
        self.port = port
        self.worst_s = 0.0
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            with contextlib.suppress(OSError):
                self.worst_s = max(self.worst_s, _healthz(self.port))
            time.sleep(0.02)


def _huge(pid: int, port: int, request: bytes) -> tuple[str, float, float, float]:
    """(status or 'reset', seconds to it, server CPU seconds, slowest /healthz seconds)."""
    prober = _Prober(port)
    prober.start()
    cpu = _cpu_s(pid)
    start = time.perf_counter()
    answer = b""
    with socket.create_connection(("127.0.0.1", port), timeout=60) as sock:

        def read() -> None:
            nonlocal answer
            with contextlib.suppress(OSError):
                while chunk := sock.recv(65536):
                    answer += chunk

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        with contextlib.suppress(OSError):
            sock.sendall(request)
        reader.join(60)
    elapsed = time.perf_counter() - start
    time.sleep(0.5)  # what the server still does after the answer counts too
    used = _cpu_s(pid) - cpu
    prober.stop.set()
    prober.join()
    status = answer.split(b" ", 2)[1].decode() if answer.startswith(b"HTTP/1.1 ") else "reset"
    return status, elapsed, used, prober.worst_s


def _slowloris(port: int, count: int, wait_s: float) -> tuple[int, int]:
    """(connections opened, still open after ``wait_s``) for ``count`` trickling clients."""
    socks: list[socket.socket] = []
    for _ in range(count):
        with contextlib.suppress(OSError):
            sock = socket.create_connection(("127.0.0.1", port), timeout=5)
            sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: b\r\n")
            sock.setblocking(False)
            socks.append(sock)
    deadline = time.monotonic() + wait_s
    line = 0
    while time.monotonic() < deadline:
        time.sleep(1.0)
        line += 1
        for sock in socks:
            with contextlib.suppress(OSError):
                sock.send(b"X-%d: y\r\n" % line)
    still_open = 0
    for sock in socks:
        try:
            data = sock.recv(65536)
            # An answer (408) is followed by the close; no bytes and no EOF: still open.
            still_open += 0 if data == b"" or data.startswith(b"HTTP/1.1 408") else 1
        except BlockingIOError:
            still_open += 1
        except OSError:
            pass
        sock.close()
    return len(socks), still_open


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=int, default=64)
    parser.add_argument("--slow", type=int, default=1000)
    parser.add_argument("--root", type=Path, default=ROOT, help="checkout whose code is served")
    args = parser.parse_args()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, args.slow + 256)), hard))
    size = args.mib * 2**20
    cases = {
        f"{args.mib} MiB header": b"GET /healthz HTTP/1.1\r\nHost: b\r\nX-Big: "
        + b"a" * size
        + b"\r\n\r\n",
        f"{args.mib} MiB URL": b"GET /healthz?" + b"a" * size + b" HTTP/1.1\r\nHost: b\r\n\r\n",
    }
    failed = False
    with sqlite_served(args.root) as (pid, port):
        print(f"serving {args.root} (pid {pid}, port {port})")
        print(f"{'request':<18} {'status':>7} {'answer s':>9} {'server CPU s':>13} "
              f"{'worst /healthz ms':>18}")  # fmt: skip
        for label, request in cases.items():
            status, elapsed, cpu, worst = _huge(pid, port, request)
            print(f"{label:<18} {status:>7} {elapsed:>9.2f} {cpu:>13.2f} {worst * 1000:>18.0f}")
            failed |= status not in ("414", "431") or elapsed > 1 or cpu > 0.5 or worst > 0.1
        opened, still_open = _slowloris(port, args.slow, HEADER_TIMEOUT_S + 5)
        print(f"slowloris: {opened} connections trickling headers; still open after "
              f"{HEADER_TIMEOUT_S + 5:g} s: {still_open}")  # fmt: skip
        failed |= still_open > 0
        print(f"/healthz afterwards: {_healthz(port) * 1000:.0f} ms")
    print("targets missed" if failed else "targets met")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
