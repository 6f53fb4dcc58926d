"""uvicorn's HTTP protocols with the service's own HTTP-level limits and problem+json answers.

A request the HTTP parser cannot read (``Content-Length: abc``, a malformed request line or
header, a Content-Length/Transfer-Encoding conflict) never reaches the app: uvicorn answers it
``400 text/plain`` "Invalid HTTP request received." from ``send_400_response``. These
subclasses answer ``400 application/problem+json`` instead, like every other error of the
service, with a request id in the body, the ``X-Request-ID`` header and the log line. ``serve``
passes the class to uvicorn's ``http=`` setting.

They also bound the request head before anything parses it into a request, so before routing,
authentication and every middleware (:class:`HttpLimits`, settings ``CAPPLAN_MAX_URL_BYTES``,
``CAPPLAN_MAX_HEADER_BYTES``, ``CAPPLAN_HEADER_TIMEOUT_S``):

* a request target longer than the URL limit is a ``414`` and a header section larger than the
  header limit a ``431`` (problem+json, then the connection closes). uvicorn accumulates the
  target and httptools each header by concatenation, so an unbounded 64 MiB header cost seconds
  of event-loop CPU: here the parser is never fed more of a head than the limits allow;
* a connection must deliver a complete request head within the header timeout from its first
  byte (or from the connection's start): a client trickling its headers (slowloris) is
  answered ``408`` and closed, one that sends nothing is closed. Between requests uvicorn's
  keep-alive timeout closes idle connections as before.
"""

from __future__ import annotations

import asyncio
import json
import logging
import sys
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

from uvicorn.protocols.http.h11_impl import H11Protocol

from app.api.context import request_id_var
from app.api.errors import PROBLEM_JSON, problem_body

access_logger = logging.getLogger("app.access")
_MAX_REASON_CHARS = 200
# The request line around its target: method, spaces, "HTTP/1.1" and CRLF.
_REQUEST_LINE_SLACK = 64
# After a 414/431 the server stops writing and reads (and drops) what the client is still
# sending for at most this long (and this many bytes) before it closes, so the client can read
# the answer instead of a connection reset.
LINGER_S = 1.0
LINGER_BYTES = 4 * 2**20


@dataclass(frozen=True, slots=True)
class HttpLimits:
    """Limits on a request head, enforced by the HTTP protocol before the app sees it."""

    max_url_bytes: int = 8192
    max_header_bytes: int = 32768
    header_timeout_s: float = 10.0

    @property
    def max_head_bytes(self) -> int:
        """The most bytes of one request head the parser is ever given."""
        return self.max_url_bytes + self.max_header_bytes + _REQUEST_LINE_SLACK

    @classmethod
    def from_settings(cls, settings: Any) -> HttpLimits:
        return cls(
            max_url_bytes=settings.max_url_bytes,
            max_header_bytes=settings.max_header_bytes,
            header_timeout_s=settings.header_timeout_s,
        )


class _HeadTooLarge(Exception):
    """Raised from a parser callback: the URL or the header section is over its limit."""

    def __init__(self, status: int) -> None:
        super().__init__(status)
        self.status = status


def _reason() -> str:
    """The parser's own message, when called from its ``except`` block (both uvicorn impls)."""
    exc = sys.exc_info()[1]
    if exc is None:
        return ""
    # h11 quotes the offending bytes ("illegal header line: bytearray(b'...')"): not echoed.
    text = str(exc).split(": bytearray(")[0]
    text = " ".join(text.split()).encode("ascii", "replace").decode()[:_MAX_REASON_CHARS]
    return f": {text}" if text else ""


def _limit_problem(status: int, limits: HttpLimits) -> tuple[str, str, str]:
    """Type slug, title and detail of a 408, 414 or 431 from the protocol."""
    if status == 414:
        return (
            "uri-too-long",
            "URI too long",
            f"the request target exceeds {limits.max_url_bytes} bytes (setting "
            "CAPPLAN_MAX_URL_BYTES); send long inputs in a request body",
        )
    if status == 431:
        return (
            "header-too-large",
            "Request header fields too large",
            f"the request's header section exceeds {limits.max_header_bytes} bytes (setting "
            "CAPPLAN_MAX_HEADER_BYTES)",
        )
    return (
        "request-timeout",
        "Request timeout",
        f"the request head did not arrive within {limits.header_timeout_s:g} s (setting "
        "CAPPLAN_HEADER_TIMEOUT_S)",
    )


def protocol_error_response(
    status: int = 400, limits: HttpLimits | None = None
) -> tuple[list[tuple[bytes, bytes]], bytes]:
    """Headers and body of the answer to a request the protocol rejects: a 400 for one that
    is not valid HTTP/1.1, a 408, 414 or 431 for one over :class:`HttpLimits`."""
    request_id = uuid.uuid4().hex
    token = request_id_var.set(request_id)
    try:
        if status == 400:
            reason = _reason()
            slug, title = "bad-request", "Bad request"
            detail = (
                f"the request is not valid HTTP/1.1{reason}; check the request line, the header "
                "syntax and Content-Length/Transfer-Encoding; nothing of it was processed"
            )
            route = "<invalid-http>"
        else:
            slug, title, detail = _limit_problem(status, limits or HttpLimits())
            reason = f": {slug}"
            route = "<http-limit>"
            detail += "; nothing of it was processed"
        body = problem_body(status, slug, title, detail)
        # uvicorn logs its own warning without the id; this line matches the access log's.
        access_logger.info(
            "request",
            extra={"method": "", "path": "", "route": route, "status": status,
                   "duration_ms": 0.0, "reason": reason.removeprefix(": ")},
        )  # fmt: skip
    finally:
        request_id_var.reset(token)
    payload = json.dumps(body).encode()
    headers = [
        (b"content-type", PROBLEM_JSON.encode()),
        (b"content-length", str(len(payload)).encode()),
        (b"x-request-id", request_id.encode()),
        (b"connection", b"close"),
    ]
    return headers, payload


_PHRASES = {
    400: b"Bad Request",
    408: b"Request Timeout",
    414: b"URI Too Long",
    431: b"Request Header Fields Too Large",
}


class _HeadGuard:
    """The header timeout and the lingering close, shared by both protocol classes.

    ``limits`` is a class attribute: ``None`` reads the settings of the process (so the
    classes work in ``serve --workers N``, whose worker processes import them by name);
    :func:`with_limits` makes a class with explicit ones.
    """

    limits: ClassVar[HttpLimits | None] = None
    transport: asyncio.Transport
    loop: asyncio.AbstractEventLoop
    _head_timer: asyncio.TimerHandle | None = None
    _head_started = False  # some byte of the current head has arrived
    _lingering = False
    _dropped = 0  # bytes read and dropped while lingering
    # Each protocol class writes the problem answer its own way (h11 events or raw bytes).
    _write_response: Callable[[int], None]

    def _limits(self) -> HttpLimits:
        cls = type(self)
        if cls.limits is None:
            from app.config import get_settings

            cls.limits = HttpLimits.from_settings(get_settings())
        return cls.limits

    def _arm_head_timer(self) -> None:
        if self._head_timer is None:
            self._head_timer = self.loop.call_later(
                self._limits().header_timeout_s, self._head_timed_out
            )

    def _head_complete(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_timed_out(self) -> None:
        self._head_timer = None
        if self.transport.is_closing() or self._lingering:
            return
        if self._head_started:
            self._reject(408)
        else:  # a connection that never sent a byte gets no answer, like an idle keep-alive
            self.transport.close()

    def _drop(self, data: bytes) -> None:
        """After a rejection: what the client still sends is read and dropped, up to a cap."""
        self._dropped += len(data)
        if self._dropped > LINGER_BYTES:
            self.transport.close()

    def _reject(self, status: int) -> None:
        """Answer ``status`` problem+json, then read and drop what the client still sends for
        at most ``LINGER_S`` before closing (it can read the answer instead of a reset)."""
        self._head_complete()
        self._write_response(status)
        self._lingering = True
        try:
            if self.transport.can_write_eof():
                self.transport.write_eof()
                self.loop.call_later(LINGER_S, self.transport.close)
                return
        except OSError:  # the client is gone already
            pass
        self.transport.close()  # TLS has no half-close


class ProblemH11Protocol(_HeadGuard, H11Protocol):
    """uvicorn's h11 protocol with a problem+json 400 and :class:`HttpLimits` (h11 buffers a
    head up to its ``max_incomplete_event_size``, set to the head limit: a 431 above)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        import h11

        super().__init__(*args, **kwargs)
        self._head_buffer = bytearray()
        self.conn = h11.Connection(
            h11.SERVER, max_incomplete_event_size=self._limits().max_head_bytes
        )

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm_head_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        self._head_complete()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        import h11

        if self._lingering:
            self._drop(data)
            return
        if self.conn.their_state is h11.IDLE:
            self._head_started = True
            self._arm_head_timer()
            status = self._scan_head(data)
            if status:
                self._reject(status)
                return
        super().data_received(data)
        if self.conn.their_state is not h11.IDLE:
            self._head_complete()
            self._head_started = False
            self._head_buffer.clear()

    def _scan_head(self, data: bytes) -> int:
        """414 or 431 when the head so far is over a limit (h11 itself only bounds the whole
        head, and parses it into a request before the app could check it), else 0."""
        limits = self._limits()
        room = limits.max_head_bytes + 4 - len(self._head_buffer)
        self._head_buffer += data[: max(room, 0)]
        head = self._head_buffer
        line_end = head.find(b"\r\n")
        line = head if line_end < 0 else head[:line_end]
        target = line.split(b" ", 2)[1] if line.count(b" ") >= 1 else b""
        if len(target) > limits.max_url_bytes or len(line) > limits.max_head_bytes:
            return 414
        if line_end >= 0:
            end = head.find(b"\r\n\r\n", line_end)
            fields = (end if end >= 0 else len(head)) - line_end - 2
            if fields > limits.max_header_bytes:
                return 431
        return 0

    def send_400_response(self, msg: str) -> None:
        exc = sys.exc_info()[1]
        status = getattr(exc, "error_status_hint", 400)
        if status == 431:
            self._reject(431)
            return
        self._write_response(400)
        self.transport.close()

    def _write_response(self, status: int) -> None:
        import h11

        headers, payload = protocol_error_response(status, self._limits())
        event = h11.Response(status_code=status, headers=headers, reason=_PHRASES[status])
        try:
            self.transport.write(self.conn.send(event) or b"")
            self.transport.write(self.conn.send(h11.Data(data=payload)) or b"")
            self.transport.write(self.conn.send(h11.EndOfMessage()) or b"")
        except h11.LocalProtocolError:  # h11 refuses to answer in its state: write it raw
            head = [b"HTTP/1.1 %d %s\r\n" % (status, _PHRASES[status])]
            head += [name + b": " + value + b"\r\n" for name, value in headers]
            self.transport.write(b"".join([*head, b"\r\n", payload]))


def with_limits(protocol: type[asyncio.Protocol], limits: HttpLimits) -> type[asyncio.Protocol]:
    """``protocol`` with explicit limits instead of the process's settings."""
    return type(protocol.__name__, (protocol,), {"limits": limits})


try:
    from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol
except ImportError:  # httptools not installed: uvicorn itself falls back to h11
    HTTP_PROTOCOL: type[asyncio.Protocol] = ProblemH11Protocol
else:

    class ProblemHttpToolsProtocol(_HeadGuard, HttpToolsProtocol):
        """uvicorn's httptools protocol (its default) with a problem+json 400 and
        :class:`HttpLimits`: the parser is fed at most ``max_head_bytes`` of a head, the
        target and the header fields are counted as it reports them."""

        _head_bytes = 0  # bytes of the current head given to the parser
        _url_bytes = 0
        _header_bytes = 0
        _in_head = True  # between two requests' heads' ends: counting

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self._arm_head_timer()

        def connection_lost(self, exc: Exception | None) -> None:
            self._head_complete()
            super().connection_lost(exc)

        def data_received(self, data: bytes) -> None:
            if self._lingering:
                self._drop(data)
                return
            if not self._in_head:  # a body (a pipelined head behind it is counted from its end)
                super().data_received(data)
                return
            self._head_started = True
            self._arm_head_timer()
            room = self._limits().max_head_bytes - self._head_bytes
            if len(data) <= room:
                self._head_bytes += len(data)
                super().data_received(data)
                return
            first, rest = data[:room], data[room:]
            self._head_bytes += len(first)
            if first:
                super().data_received(first)
            if self.transport.is_closing() or self._lingering:
                return
            if self._in_head:  # the head did not end within its limit
                self._reject(431 if self._url_bytes <= self._limits().max_url_bytes else 414)
                return
            self.data_received(rest)

        # Parser callbacks
        def on_message_begin(self) -> None:
            super().on_message_begin()
            self._url_bytes = self._header_bytes = 0

        def on_url(self, url: bytes) -> None:
            self._url_bytes += len(url)
            if self._url_bytes > self._limits().max_url_bytes:
                raise _HeadTooLarge(414)
            super().on_url(url)

        def on_header(self, name: bytes, value: bytes) -> None:
            self._header_bytes += len(name) + len(value) + 4  # ": " and CRLF
            if self._header_bytes > self._limits().max_header_bytes:
                raise _HeadTooLarge(431)
            super().on_header(name, value)

        def on_headers_complete(self) -> None:
            self._in_head = False
            self._head_complete()
            super().on_headers_complete()

        def on_message_complete(self) -> None:
            super().on_message_complete()
            self._in_head = True
            self._head_started = False
            self._head_bytes = 0

        def send_400_response(self, msg: str) -> None:
            cause = getattr(sys.exc_info()[1], "__context__", None)
            if isinstance(cause, _HeadTooLarge):
                self._reject(cause.status)
                return
            self._write_response(400)
            self.transport.close()

        def _write_response(self, status: int) -> None:
            headers, payload = protocol_error_response(status, self._limits())
            content = [STATUS_LINE[status]]
            for name, value in [*self.server_state.default_headers, *headers]:
                content.extend([name, b": ", value, b"\r\n"])
            content.extend([b"\r\n", payload])
            self.transport.write(b"".join(content))

    HTTP_PROTOCOL = ProblemHttpToolsProtocol
