"""uvicorn's HTTP protocols, answering requests they reject themselves with problem+json.

A request the HTTP parser cannot read (``Content-Length: abc``, a malformed request line or
header, a Content-Length/Transfer-Encoding conflict) never reaches the app: uvicorn answers it
``400 text/plain`` "Invalid HTTP request received." from ``send_400_response``. These
subclasses answer ``400 application/problem+json`` instead, like every other error of the
service, with a request id in the body, the ``X-Request-ID`` header and the log line. ``serve``
passes the class to uvicorn's ``http=`` setting.
"""

from __future__ import annotations

import asyncio
import json
import logging
import sys
import uuid

from uvicorn.protocols.http.h11_impl import H11Protocol

from app.api.context import request_id_var
from app.api.errors import PROBLEM_JSON, problem_body

access_logger = logging.getLogger("app.access")
_MAX_REASON_CHARS = 200


def _reason() -> str:
    """The parser's own message, when called from its ``except`` block (both uvicorn impls)."""
    exc = sys.exc_info()[1]
    if exc is None:
        return ""
    # h11 quotes the offending bytes ("illegal header line: bytearray(b'...')"): not echoed.
    text = str(exc).split(": bytearray(")[0]
    text = " ".join(text.split()).encode("ascii", "replace").decode()[:_MAX_REASON_CHARS]
    return f": {text}" if text else ""


def protocol_error_response() -> tuple[list[tuple[bytes, bytes]], bytes]:
    """Headers and body of the 400 for a request that is not valid HTTP/1.1."""
    request_id = uuid.uuid4().hex
    token = request_id_var.set(request_id)
    try:
        reason = _reason()
        body = problem_body(
            400,
            "bad-request",
            "Bad request",
            f"the request is not valid HTTP/1.1{reason}; check the request line, the header "
            "syntax and Content-Length/Transfer-Encoding; nothing of it was processed",
        )
        # uvicorn logs its own warning without the id; this line matches the access log's.
        access_logger.info(
            "request",
            extra={"method": "", "path": "", "route": "<invalid-http>", "status": 400,
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


class ProblemH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with a problem+json 400."""

    def send_400_response(self, msg: str) -> None:
        import h11

        headers, payload = protocol_error_response()
        event = h11.Response(status_code=400, headers=headers, reason=b"Bad Request")
        self.transport.write(self.conn.send(event) or b"")
        self.transport.write(self.conn.send(h11.Data(data=payload)) or b"")
        self.transport.write(self.conn.send(h11.EndOfMessage()) or b"")
        self.transport.close()


try:
    from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol
except ImportError:  # httptools not installed: uvicorn itself falls back to h11
    HTTP_PROTOCOL: type[asyncio.Protocol] = ProblemH11Protocol
else:

    class ProblemHttpToolsProtocol(HttpToolsProtocol):
        """uvicorn's httptools protocol (its default) with a problem+json 400."""

        def send_400_response(self, msg: str) -> None:
            headers, payload = protocol_error_response()
            content = [STATUS_LINE[400]]
            for name, value in [*self.server_state.default_headers, *headers]:
                content.extend([name, b": ", value, b"\r\n"])
            content.extend([b"\r\n", payload])
            self.transport.write(b"".join(content))
            self.transport.close()

    HTTP_PROTOCOL = ProblemHttpToolsProtocol
