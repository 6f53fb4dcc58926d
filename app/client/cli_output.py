"""What a capplan command hands the terminal: plain-text tables, sizes in GiB, a progress
line, the echo of the defaults the server used, an exit code, or a usage error.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, TextIO, TypeVar

from app.client.transport import Json

T = TypeVar("T")
SHOW_AFTER_S = 1.0
GIB = 2**30

# Exit codes: scripts branch on the verdict; errors never look like a verdict.
EXIT_OK = 0  # done; fits / valid / allowed / an eligible candidate
EXIT_VERDICT_NO = 1  # does not fit / no MIG profile fits / INVALID layout / DENIED / none eligible
EXIT_USAGE = 2  # bad command line, unknown --gpu, unreadable file (argparse uses 2 as well)
EXIT_API_ERROR = 3  # the server answered 4xx/5xx (its problem detail is printed on stderr)
EXIT_UNREACHABLE = 4  # no answer: connection refused, timeout, not HTTP
EXIT_BROKEN_PIPE = 141  # stdout closed early (capplan ... | head): 128 + SIGPIPE, as a shell


class ProgressBar:
    """A one-line progress bar on a terminal, shown only once an operation passes 1 s."""

    def __init__(
        self,
        label: str,
        stream: TextIO,
        *,
        clock: Callable[[], float] = time.monotonic,
        enabled: bool | None = None,
    ) -> None:
        self.label, self.stream, self.clock = label, stream, clock
        self.start = clock()
        self.enabled = stream.isatty() if enabled is None else enabled
        self.shown = False

    def update(self, done: int | None = None, total: int | None = None) -> None:
        """Redraw: a bar when ``done``/``total`` are known, else the elapsed time."""
        elapsed = self.clock() - self.start
        if not self.enabled or elapsed < SHOW_AFTER_S:
            return
        self.shown = True
        if done is not None and total:
            filled = int(30 * done / total)
            bar = "#" * filled + "-" * (30 - filled)
            text = f"{self.label} [{bar}] {100 * done / total:5.1f}% {done / 2**20:.1f} MiB"
        else:
            text = f"{self.label} ... {elapsed:.1f} s"
        self.stream.write(f"\r{text}")
        self.stream.flush()

    def close(self) -> None:
        """End the line if anything was drawn."""
        if self.shown:
            self.stream.write("\n")
            self.stream.flush()


def wait_with_progress(label: str, call: Callable[[], T], stream: TextIO) -> T:
    """Run ``call`` in a thread, showing the elapsed time once it passes a second."""
    bar = ProgressBar(label, stream)
    result: list[T] = []
    failure: list[BaseException] = []

    def run() -> None:
        try:
            result.append(call())
        except BaseException as exc:  # re-raised in the caller's thread
            failure.append(exc)

    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    while worker.is_alive():
        worker.join(0.1)
        bar.update()
    bar.close()
    if failure:
        raise failure[0]
    return result[0]


def table(rows: Sequence[Sequence[Any]], headers: Sequence[str]) -> str:
    """A plain-text table, numbers right-aligned."""
    cells = [[_cell(v) for v in row] for row in rows]
    widths = [max([len(h), *(len(r[i]) for r in cells)]) for i, h in enumerate(headers)]
    numeric = [all(_is_number(row[i]) for row in rows) and rows for i in range(len(headers))]

    def line(values: Sequence[str]) -> str:
        return "  ".join(
            v.rjust(w) if numeric[i] else v.ljust(w)
            for i, (v, w) in enumerate(zip(values, widths, strict=True))
        ).rstrip()

    return "\n".join([line(headers), line(["-" * w for w in widths]), *map(line, cells)])


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _cell(value: Any) -> str:
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        return f"{value:,.2f}"
    if value is None:
        return "-"
    return str(value)


def gib(value: int) -> str:
    """Bytes as GiB with two decimals."""
    return f"{value / GIB:,.2f} GiB"


def _dump(result: Any) -> str:
    return json.dumps(result, indent=2)


class UsageError(Exception):
    """A command line that cannot be carried out (exit code 2)."""


def _echo(bindings: dict[str, int] | None, defaults: list[Json], attention: list[str]) -> str:
    """The header lines naming every binding and every default the server used."""
    lines = []
    if bindings:
        lines.append("bindings: " + ", ".join(f"{k}={v}" for k, v in bindings.items()))
    if attention:
        lines.append("attention: " + "; ".join(attention))
    if defaults:
        lines.append("defaults used:")
        lines += [f"  {d['option']} = {d['value']} ({d['reason']})" for d in defaults]
    return "\n".join(lines) + "\n"


def _flatten(value: Any, prefix: str = "") -> list[tuple[str, Any]]:
    """``{"a": {"b": 1}, "c": [1, 2]}`` as rows ``a.b 1``, ``c 1, 2`` (empty ones left out)."""
    if isinstance(value, dict):
        rows: list[tuple[str, Any]] = []
        for key, inner in value.items():
            rows += _flatten(inner, f"{prefix}.{key}" if prefix else str(key))
        return rows
    if value is None or value == [] or value == "":
        return []
    if isinstance(value, list):
        return [(prefix, "; ".join(json.dumps(v) if isinstance(v, dict) else str(v)
                                   for v in value))]  # fmt: skip
    return [(prefix, value)]


def _field_table(rows: list[tuple[str, Any]]) -> str:
    def shown(key: str, value: Any) -> str:
        quantity = key.endswith(("_bytes", "_per_s"))  # sizes and rates get separators
        if isinstance(value, int) and not isinstance(value, bool) and not quantity:
            return str(value)  # a year, a version, a count of lanes
        return _cell(value)

    return table([(key, shown(key, value)) for key, value in rows], ["field", "value"])
