"""Structured JSON logs carrying the request id."""

from __future__ import annotations

import json
import logging
import re
import sys
from datetime import UTC, datetime

from app.api.context import request_id_var

_STANDARD = set(logging.makeLogRecord({}).__dict__) | {"message", "asctime", "taskName"}
# uvicorn adds a copy of its message with terminal colours to some records: not for log files.
_DROPPED = frozenset({"color_message"})
# ANSI escape sequences (CSI ... final byte, and two-byte escapes).
_ANSI = re.compile(r"\x1b(?:\[[0-?]*[ -/]*[@-~]|[@-Z\\-_])")


def _plain(value: object) -> object:
    """Strings without ANSI escape sequences (other values as they are)."""
    return _ANSI.sub("", value) if isinstance(value, str) else value


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message, request id and extras, as plain
    text (no ``color_message``, no ANSI escape sequences)."""

    def format(self, record: logging.LogRecord) -> str:
        payload: dict[str, object] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "pid": record.process,  # which worker process, with `serve --workers N`
            "msg": _plain(record.getMessage()),
        }
        request_id = request_id_var.get()
        if request_id is not None:
            payload["request_id"] = request_id
        for key, value in record.__dict__.items():
            if key not in _STANDARD and key not in _DROPPED and not key.startswith("_"):
                payload[key] = _plain(value)
        if record.exc_info:
            payload["exc"] = _plain(self.formatException(record.exc_info))
        return json.dumps(payload, default=str)


def configure_logging(level: str) -> None:
    """Route the app's and uvicorn's logs through the JSON formatter on stderr."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger()
    root.handlers = [handler]
    root.setLevel(level)
    for name in ("uvicorn", "uvicorn.error"):
        logging.getLogger(name).handlers = []
        logging.getLogger(name).propagate = True
    # Alembic's context logs "Will assume ... DDL" on every readiness probe.
    logging.getLogger("alembic").setLevel(max(logging.WARNING, root.level))
    # The access middleware logs every request; uvicorn's own access log would duplicate it.
    logging.getLogger("uvicorn.access").disabled = True
