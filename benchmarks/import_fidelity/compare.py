"""Import fidelity: every measured model through every import route, estimated and compared
with what PyTorch really allocated (service venv, no torch).

    .venv/bin/python benchmarks/import_fidelity/compare.py

Routes (artifacts written by ``export.py``):

* ``onnx``: ONNX with weights inline (``out/onnx/<model>.<mode>.onnx``, not committed);
* ``graph``: graph-only ONNX, initializers pointing at a ``.data`` file that is not there
  (``graphs/<model>.<mode>.onnx``, or ``out/graph/`` for those over 2 MB);
* ``trace``: the PyTorch tracer's ``POST /v1/models`` body fragment
  (``graphs/<model>.traced.json``; the tracer traces in training mode).

ONNX is imported with ``app.importers.onnx_model.import_onnx(data, lenient=False)``; every
graph is then validated as the API stores it (``ModelCreate`` and ``validated_layer_count``).
Each measured record of the model is estimated exactly as ``benchmarks/fidelity/compare.py``
estimates the zoo graph (its ``_request``, bindings and first-iteration peak for training),
with the record's batch, sequence length and image size as bindings. Inference records use the
``eval``-mode export; training records the ``train``-mode one where dropout or batch norm make
training differ, else the ``eval`` one (``training_export`` in the manifest; README.md).

Targets (issue 14): for every route, parameter counts exact for every model, median |error|
vs the measured peak <= 3 % and p90 <= 15 %, and no model that fails to import. Exit 1 when
one is missed.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(REPO))

from app.domain.errors import GraphError  # noqa: E402
from app.domain.memory.estimate import analyze_for, estimate_memory  # noqa: E402
from app.domain.workload import Mode  # noqa: E402
from app.importers.result import ImportRejected  # noqa: E402
from app.schemas.models import ModelCreate  # noqa: E402
from app.services.convert import input_decls  # noqa: E402
from app.services.errors import InvalidInput  # noqa: E402
from app.services.model_store import validated_layer_count  # noqa: E402
from benchmarks.fidelity.compare import _request, estimate_row  # noqa: E402

FIDELITY = REPO / "benchmarks" / "fidelity"
GRAPHS = HERE / "graphs"
OUT = HERE / "out"
ROUTES = ("onnx", "graph", "trace")
ROUTE_TITLES = {
    "onnx": "ONNX with weights",
    "graph": "ONNX graph only",
    "trace": "PyTorch tracer",
}
TARGET_MEDIAN, TARGET_P90 = 3.0, 15.0


def artifact_name(record: dict[str, Any]) -> str:
    """Which exported model a measured record belongs to."""
    if record["model"] == "llama2_7b":
        return "llama2_7b_l2" if record.get("layers") == 2 else "llama2_7b"
    return str(record["model"])


def export_mode(record: dict[str, Any]) -> str:
    """``eval`` for inference; for training the export ``export.py`` chose for the model
    (``train`` when dropout or batch norm make training mode differ)."""
    if record["mode"] != "training":
        return "eval"
    entry = _manifest().get("models", {}).get(artifact_name(record), {})
    return str(entry.get("training_export", "train"))


_MANIFEST: dict[str, Any] = {}


def _manifest() -> dict[str, Any]:
    if not _MANIFEST:
        path = GRAPHS / "manifest.json"
        _MANIFEST.update(json.loads(path.read_text()) if path.exists() else {"models": {}})
    return _MANIFEST


def artifact_path(route: str, name: str, mode: str) -> Path:
    if route == "onnx":
        return OUT / "onnx" / f"{name}.{mode}.onnx"
    if route == "graph":
        committed = GRAPHS / f"{name}.{mode}.onnx"
        return committed if committed.exists() else OUT / "graph" / f"{name}.{mode}.onnx"
    return GRAPHS / f"{name}.traced.json"  # the tracer always traces in training mode


@dataclass
class Imported:
    """A stored-model body (as POST /v1/models would hold it), or why there is none."""

    body: dict[str, Any] | None = None
    error: str | None = None
    not_applicable: str | None = None
    unsupported: list[str] = field(default_factory=list)
    assumptions: list[str] = field(default_factory=list)


def _validated(body: dict[str, Any]) -> dict[str, Any]:
    """Validate a ``POST /v1/models`` body as the API does; returns the stored fields."""
    payload = ModelCreate.model_validate(body)
    validated_layer_count(payload)
    return payload.model_dump()


def import_artifact(route: str, name: str, mode: str, *, lenient: bool = False) -> Imported:
    path = artifact_path(route, name, mode)
    if not path.exists():
        if route == "onnx" and name == "llama2_7b":
            return Imported(not_applicable="full-size 7B: graph-only and tracer routes only")
        reason = _export_error(route, name, mode)
        return Imported(error=reason or f"no artifact {path.relative_to(HERE)} (run export.py)")
    base = {"slug": f"{name}-{mode}-{route}".replace("_", "-"), "name": name, "family": "import"}
    try:
        if route == "trace":
            fragment = json.loads(path.read_text())
            body = {**base, **{k: fragment[k] for k in ("inputs", "layers")}}
            body["default_bindings"] = fragment.get("default_bindings") or {}
            return Imported(
                body=_validated(body), assumptions=list(fragment.get("assumptions", []))
            )
        from app.importers.onnx_model import import_onnx

        graph = import_onnx(path.read_bytes(), lenient=lenient)
        body = {
            **base,
            "inputs": [
                {
                    "name": decl.name,
                    "shape": list(decl.shape),
                    "dtype": "int64" if decl.kind.value == "int64" else "float",
                }
                for decl in graph.inputs
            ],
            "layers": graph.layers,
            "default_bindings": graph.default_bindings,
        }
        return Imported(
            body=_validated(body),
            unsupported=[f"{u.source_op} x{u.count}" for u in graph.unsupported],
            assumptions=list(graph.assumptions),
        )
    except ImportRejected as exc:
        return Imported(error=f"{exc.kind}: {exc.detail}")
    except InvalidInput as exc:
        return Imported(error=f"invalid graph: {exc}")
    except Exception as exc:  # a crash in one import must not end the run
        return Imported(error=f"{type(exc).__name__}: {exc}")


def _export_error(route: str, name: str, mode: str) -> str | None:
    entry = _manifest().get("models", {}).get(name, {})
    which = entry.get("trace", {}) if route == "trace" else entry.get("onnx", {}).get(mode, {})
    error = which.get("error")
    return f"export failed: {error}" if error else None


@dataclass
class Row:
    route: str
    key: str
    model: str
    mode: str
    measured: int
    params_measured: int
    zoo_estimated: int
    estimated: int | None = None
    params: int | None = None
    error: str | None = None
    not_applicable: str | None = None
    lenient_estimated: int | None = None
    lenient_error: str | None = None

    @property
    def error_pct(self) -> float | None:
        if self.estimated is None:
            return None
        return 100.0 * (self.estimated - self.measured) / self.measured

    @property
    def vs_zoo_pct(self) -> float | None:
        if self.estimated is None:
            return None
        return 100.0 * (self.estimated - self.zoo_estimated) / self.zoo_estimated


def estimate(body: dict[str, Any], record: dict[str, Any]) -> tuple[int, int]:
    """Estimated peak and parameter count, as ``benchmarks/fidelity/compare.py`` does."""
    request = _request(record)
    bindings = {**body["default_bindings"], "batch": record["batch"]}
    if record.get("seq_len"):
        bindings["seq"] = record["seq_len"]
    if record.get("image_size"):
        bindings["image"] = record["image_size"]
    analysis = analyze_for(input_decls(body["inputs"]), body["layers"], bindings, request)
    result = estimate_memory(analysis, request)
    if request.mode is Mode.TRAINING and result.first_iteration_peak_bytes is not None:
        return result.first_iteration_peak_bytes, analysis.params
    return result.peak_bytes, analysis.params


def _short(text: str, limit: int = 160) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def build_rows(
    records: list[dict[str, Any]], routes: list[str], lenient: bool
) -> tuple[list[Row], dict[tuple[str, str, str], Imported]]:
    cache: dict[tuple[str, str, str, bool], Imported] = {}
    rows: list[Row] = []
    for route in routes:
        for record in records:
            name, mode = artifact_name(record), export_mode(record)
            zoo = estimate_row(record)
            row = Row(
                route=route,
                key=record["key"],
                model=name,
                mode=record["mode"],
                measured=record["peak_bytes"],
                params_measured=record["params"],
                zoo_estimated=zoo.estimated_bytes,
            )
            rows.append(row)
            key = (route, name, mode, False)
            if key not in cache:
                cache[key] = import_artifact(route, name, mode)
            imported = cache[key]
            if imported.not_applicable:
                row.not_applicable = imported.not_applicable
                continue
            if imported.body is None:
                row.error = imported.error
                if lenient and route != "trace":
                    lkey = (route, name, mode, True)
                    if lkey not in cache:
                        cache[lkey] = import_artifact(route, name, mode, lenient=True)
                    if cache[lkey].body is not None:
                        try:
                            row.lenient_estimated, _ = estimate(cache[lkey].body, record)
                        except Exception as exc:
                            row.lenient_error = f"{type(exc).__name__}: {exc}"
                    else:
                        row.lenient_error = cache[lkey].error
                continue
            try:
                row.estimated, row.params = estimate(imported.body, record)
            except (GraphError, ValueError, KeyError) as exc:
                row.error = f"estimate failed: {type(exc).__name__}: {exc}"
    imports = {k[:3]: v for k, v in cache.items() if not k[3]}
    return rows, imports


def p90(values: list[float]) -> float:
    """Nearest-rank 90th percentile."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(0.9 * len(ordered)) - 1)]


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def _mib(value: int | None) -> str:
    return "-" if value is None else f"{value / 2**20:,.1f}"


def render(
    rows: list[Row], imports: dict[tuple[str, str, str], Imported], routes: list[str]
) -> tuple[str, bool]:
    ok = True
    summary = ["## Summary per route", ""]
    summary += [
        "| route | cases estimated | failed | training median / p90 % | inference median / p90 % "
        "| all median / p90 % | params | failed imports | targets |",
        "|---|---:|---:|---|---|---|---|---|---|",
    ]
    for route in routes:
        mine = [r for r in rows if r.route == route and not r.not_applicable]
        done = [r for r in mine if r.error_pct is not None]
        failed = [r for r in mine if r.error_pct is None]

        def stats(rs: list[Row]) -> str:
            errors = [abs(r.error_pct) for r in rs if r.error_pct is not None]
            if not errors:
                return "-"
            return f"{statistics.median(errors):.1f} / {p90(errors):.1f}"

        all_errors = [abs(r.error_pct) for r in done if r.error_pct is not None]
        bad_params = sorted({r.model for r in done if r.params != r.params_measured})
        failed_imports = sorted(
            f"{name}.{mode}"
            for (rt, name, mode), imp in imports.items()
            if rt == route and imp.body is None and not imp.not_applicable
        )
        route_ok = (
            bool(all_errors)
            and not failed
            and not bad_params
            and statistics.median(all_errors) <= TARGET_MEDIAN
            and p90(all_errors) <= TARGET_P90
        )
        ok = ok and route_ok
        summary.append(
            f"| {ROUTE_TITLES[route]} | {len(done)} / {len(mine)} | {len(failed)} "
            f"| {stats([r for r in done if r.mode == 'training'])} "
            f"| {stats([r for r in done if r.mode == 'inference'])} | {stats(done)} "
            f"| {'exact' if not bad_params else 'MISMATCH: ' + ', '.join(bad_params)} "
            f"| {', '.join(failed_imports) or 'none'} | {'met' if route_ok else 'NOT met'} |"
        )
    summary += [
        "",
        f"Targets: every route median |error| <= {TARGET_MEDIAN:g} %, p90 <= {TARGET_P90:g} %, "
        "parameter counts exact, no failed import (a case whose import failed counts as failed).",
        "",
        "## Imports",
        "",
        "| route | artifact | result | unsupported ops (lenient) / notes |",
        "|---|---|---|---|",
    ]
    for (route, name, mode), imp in sorted(imports.items()):
        if imp.not_applicable:
            result, notes = "n/a", imp.not_applicable
        elif imp.body is None:
            result, notes = "FAILED", _short(imp.error or "?", 400)
        else:
            fused = [a for a in imp.assumptions if a.startswith("fused")]
            result = f"ok, {len(imp.body['layers'])} layers"
            notes = _short("; ".join(fused), 300) if fused else ""
        summary.append(f"| {ROUTE_TITLES[route]} | {name}.{mode} | {result} | {notes} |")
    table = [
        "",
        "## Every case",
        "",
        "| route | configuration | measured MiB | estimated MiB | error % | zoo est. MiB "
        "| vs zoo % | params | lenient est. (diagnosis) |",
        "|---|---|---:|---:|---:|---:|---:|---|---|",
    ]
    for r in rows:
        if r.not_applicable:
            table.append(
                f"| {r.route} | {_cell(r.key)} | {_mib(r.measured)} | n/a | | "
                f"{_mib(r.zoo_estimated)} | | | {r.not_applicable} |"
            )
            continue
        if r.error_pct is None:
            lenient = ""
            if r.lenient_estimated is not None:
                err = 100.0 * (r.lenient_estimated - r.measured) / r.measured
                lenient = f"{_mib(r.lenient_estimated)} MiB ({err:+.1f} %)"
            elif r.lenient_error:
                lenient = "lenient also fails: " + _short(r.lenient_error, 100)
            table.append(
                f"| {r.route} | {_cell(r.key)} | {_mib(r.measured)} | FAILED | | "
                f"{_mib(r.zoo_estimated)} | | | {lenient} ({_short(r.error or '?', 100)}) |"
            )
            continue
        params = (
            "exact" if r.params == r.params_measured else f"{r.params:,} vs {r.params_measured:,}"
        )
        table.append(
            f"| {r.route} | {_cell(r.key)} | {_mib(r.measured)} | {_mib(r.estimated)} "
            f"| {r.error_pct:+.1f} | {_mib(r.zoo_estimated)} | {r.vs_zoo_pct:+.1f} "
            f"| {params} | |"
        )
    return "\n".join([*summary, *table]), ok


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--measurements", type=Path, default=FIDELITY / "measurements.json")
    parser.add_argument("--out", type=Path, default=HERE / "results.md")
    parser.add_argument("--routes", nargs="*", default=list(ROUTES), choices=ROUTES)
    parser.add_argument("--no-lenient", action="store_true", help="skip the lenient diagnosis")
    args = parser.parse_args()
    records = [r for r in json.loads(args.measurements.read_text()) if "skipped" not in r]
    rows, imports = build_rows(records, args.routes, lenient=not args.no_lenient)
    report, ok = render(rows, imports, args.routes)
    versions = _manifest().get("versions", {})
    header = (
        "# Import fidelity: imported graphs' estimates vs measured peak memory (PyTorch CPU)\n\n"
        f"Measurements: `benchmarks/fidelity/measurements.json` ({len(records)} measured "
        f"cases). Exported with torch {versions.get('torch', '?')}, transformers "
        f"{versions.get('transformers', '?')}, onnxscript {versions.get('onnxscript', '?')}, "
        f"opset {versions.get('opset', '?')} by `export.py`; imported and estimated by "
        "`compare.py` for runtime `pytorch_cpu`; training compares the first iteration's peak. "
        "`vs zoo` compares with the built-in zoo graph's estimate of the same case.\n\n"
    )
    args.out.write_text(header + report + "\n")
    print(report)
    print(f"\ntargets {'met' if ok else 'NOT met'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
