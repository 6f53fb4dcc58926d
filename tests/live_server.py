"""The real app behind uvicorn on an ephemeral loopback port, and raw HTTP/1.1 over a socket."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import uvicorn
from fastapi import FastAPI

from app.api.http_server import HTTP_PROTOCOL


@contextmanager
def live_server(
    app: FastAPI, *, http: type[asyncio.Protocol] = HTTP_PROTOCOL
) -> Iterator[tuple[str, int]]:
    """Serve ``app`` as ``capplan-server serve`` does (same protocol class) in a thread."""
    config = uvicorn.Config(
        app, host="127.0.0.1", port=0, http=http, log_config=None, lifespan="on", loop="asyncio"
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        assert thread.is_alive(), "uvicorn stopped while starting"
        assert time.monotonic() < deadline, "uvicorn did not start within 10 s"
        time.sleep(0.01)
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield "127.0.0.1", int(port)
    finally:
        server.should_exit = True
        thread.join(10)


@dataclass(frozen=True)
class RawResponse:
    status: int
    headers: dict[str, str]
    body: bytes
    closed: bool  # the server closed the connection after the response


def _read_response(sock: socket.socket, timeout_s: float) -> RawResponse:
    sock.settimeout(timeout_s)
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, f"connection closed before a full response head: {data!r}"
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    status_line, *lines = head.decode("latin-1").split("\r\n")
    headers = {}
    for line in lines:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    length = int(headers["content-length"])
    while len(body) < length:
        chunk = sock.recv(65536)
        assert chunk, "connection closed inside the response body"
        body += chunk
    closed = False
    if headers.get("connection", "").lower() == "close":  # then it must really close
        try:
            closed = sock.recv(1) == b""
        except ConnectionResetError:
            closed = True
    return RawResponse(int(status_line.split()[1]), headers, body[:length], closed)


def raw_request(address: tuple[str, int], data: bytes, *, timeout_s: float = 5.0) -> RawResponse:
    """Send ``data`` as is and read one response (and whether the server then closed)."""
    with socket.create_connection(address, timeout=timeout_s) as sock:
        sock.sendall(data)
        return _read_response(sock, timeout_s)
