"""``capplan``: the Capacity Planner from a terminal.

    capplan estimate llama-3-8b --mode inference --batch 8 --precision bf16
    capplan fit llama-3-8b --gpu h100-80gb --mode inference --batch 8 --precision bf16
    capplan import onnx model.onnx --slug my-model
    capplan import hf-config config.json --slug my-llama
    capplan import torch mypkg.models:build --input input_ids:batch,seq:int64 --seq 2048 --slug m
    capplan recommend resnet-50 --slo-ms 20 --target 1000 --price intel-xeon-6980p=0.3

Readable tables by default, ``--json`` for the raw answer. The server is ``--url`` or
CAPPLAN_URL (default http://127.0.0.1:8000); the key ``--api-key`` or CAPPLAN_API_KEY.
Exit codes: 0 ok, 1 the API answered with an error (its problem detail is printed), 2 usage.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TextIO, TypeVar

import httpx
from pydantic import BaseModel

from app.client.api import ApiError, CapacityPlannerClient
from app.domain.units import GIB
from app.schemas.estimates import DefaultUsedRow

T = TypeVar("T")
SHOW_AFTER_S = 1.0


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


# -- output ------------------------------------------------------------------------------------


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


def _dump(result: BaseModel | dict[str, Any] | list[Any]) -> str:
    if isinstance(result, BaseModel):
        return result.model_dump_json(indent=2, exclude_none=True)
    return json.dumps(result, indent=2)


# -- commands ----------------------------------------------------------------------------------


def _workload(args: argparse.Namespace) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "model": args.model,
        "mode": args.mode,
        "batch_size": args.batch,
    }
    # Options left out are decided by the server's one default table (echoed in the header).
    for key, value in (
        ("precision", args.precision),
        ("sequence_length", args.seq),
        ("image_size", args.image),
        ("optimizer", args.optimizer),
        ("attention", args.attention),
        ("logits", args.logits),
    ):
        if value is not None:
            spec[key] = value
    return spec


def _echo(
    bindings: dict[str, int] | None, defaults: list[DefaultUsedRow], attention: list[str]
) -> str:
    """The header lines naming every binding and every default the server used."""
    lines = []
    if bindings:
        lines.append("bindings: " + ", ".join(f"{k}={v}" for k, v in bindings.items()))
    if attention:
        lines.append("attention: " + "; ".join(attention))
    if defaults:
        lines.append("defaults used:")
        lines += [f"  {d.option} = {d.value} ({d.reason})" for d in defaults]
    return "\n".join(lines) + "\n"


def _resolve_gpu(client: CapacityPlannerClient, name: str) -> str:
    """A hardware slug, or the one slug matching every ``-`` part of ``name`` (``h100-sxm``);
    a part like ``80gb`` matches the memory size (within 10 % of 80 GiB or 80 GB)."""
    items = client.list_hardware(limit=500).items
    if name in {item.slug for item in items}:
        return name

    def matches_part(item: Any, part: str) -> bool:
        if part.endswith("gb") and part[:-2].isdigit():
            size = int(part[:-2])
            return any(abs(item.memory_bytes - size * unit) <= 0.1 * size * unit
                       for unit in (GIB, 10**9))  # fmt: skip
        return part in item.slug

    parts = [p for p in name.lower().split("-") if p]
    matches = [item.slug for item in items if all(matches_part(item, p) for p in parts)]
    if len(matches) == 1:
        return matches[0]
    if not matches:
        raise UsageError(f"no hardware slug contains '{name}'; `capplan hardware list` lists them")
    raise UsageError(f"'{name}' is ambiguous: {', '.join(matches)}")


class UsageError(Exception):
    """A command line that cannot be carried out (exit code 2)."""


def cmd_estimate(client: CapacityPlannerClient, args: argparse.Namespace, out: TextIO) -> int:
    payload = _workload(args)
    if args.gpu:
        payload["hardware"] = _resolve_gpu(client, args.gpu)
    result = client.estimate_memory(payload)
    if args.json:
        out.write(_dump(result) + "\n")
        return 0
    out.write(
        f"{result.model}: {result.mode}, batch {result.batch_size}, {result.precision} "
        f"({result.params:,} parameters)\n"
    )
    out.write(_echo(result.bindings, result.defaults_used, result.attention) + "\n")
    rows = [(line.key, line.bytes, gib(line.bytes)) for line in result.breakdown if line.bytes]
    out.write(table(rows, ["line", "bytes", "GiB"]) + "\n\n")
    out.write(f"peak {gib(result.peak_bytes)} ({result.peak_bytes:,} B) at {result.peak_phase}\n")
    if result.cuda is not None:
        cuda = result.cuda
        out.write(
            f"on CUDA: max_memory_allocated {gib(cuda.allocated_bytes)}, max_memory_reserved "
            f"{gib(cuda.reserved_bytes)}, + context = device total {gib(cuda.device_total_bytes)}\n"
        )
    if result.fit is not None:
        verdict = "fits" if result.fit.fits else "does NOT fit"
        out.write(f"{verdict} {result.fit.hardware}: headroom {gib(result.fit.headroom_bytes)}\n")
    return 0


def cmd_fit(client: CapacityPlannerClient, args: argparse.Namespace, out: TextIO) -> int:
    gpu = _resolve_gpu(client, args.gpu)
    hardware = client.get_hardware(gpu)
    if hardware.mig is None:
        args.gpu = gpu
        return cmd_estimate(client, args, out)
    result = client.mig_fit({"workload": _workload(args), "gpu": gpu})
    if args.json:
        out.write(_dump(result) + "\n")
        return 0
    out.write(f"{args.model} on {gpu}: needs {gib(result.required_bytes)}\n")
    out.write(_echo(None, result.defaults_used, result.attention) + "\n")
    rows = [
        (p.profile, p.kubernetes_resource, gib(p.usable_bytes), gib(p.headroom_bytes), p.fits)
        for p in result.profiles
    ]
    out.write(table(rows, ["profile", "resource", "usable", "headroom", "fits"]) + "\n\n")
    if result.smallest_fitting_profile:
        resource = result.smallest_fitting_resource
        out.write(f"smallest fit: {result.smallest_fitting_profile} ({resource})\n")
    else:
        out.write("no MIG profile fits\n")
    return 0


def cmd_import_onnx(client: CapacityPlannerClient, args: argparse.Namespace, out: TextIO) -> int:
    path = Path(args.file)
    if not path.is_file():
        raise UsageError(f"{path} is not a file")
    bar = ProgressBar(f"uploading {path.name}", sys.stderr)
    try:
        result = client.import_onnx(
            path,
            slug=args.slug,
            name=args.name,
            family=args.family,
            sequence_length=args.seq,
            lenient=args.lenient,
            progress=bar.update,
        )
    finally:
        bar.close()
    return _show_import(result, args, out)


def cmd_import_hf(client: CapacityPlannerClient, args: argparse.Namespace, out: TextIO) -> int:
    try:
        config = json.loads(Path(args.file).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise UsageError(f"cannot read {args.file} as JSON: {exc}") from exc
    payload: dict[str, Any] = {"slug": args.slug, "config": config}
    for key, value in (("name", args.name), ("family", args.family), ("sequence_length", args.seq)):
        if value is not None:
            payload[key] = value
    return _show_import(client.import_hf_config(payload), args, out)


def cmd_import_torch(client: CapacityPlannerClient, args: argparse.Namespace, out: TextIO) -> int:
    from app.client import torch_import  # imports torch only when a trace runs

    try:
        inputs = [torch_import.parse_input(text) for text in args.input]
        if os.getcwd() not in sys.path:
            sys.path.insert(0, os.getcwd())  # MODULE may live in the working directory
        factory = torch_import.load_factory(args.factory)
        torch_import.import_torch()
    except torch_import.TraceError as exc:
        raise UsageError(str(exc)) from exc
    try:
        graph = torch_import.trace_factory(factory, inputs, sequence_length=args.seq)
    except torch_import.TraceError as exc:
        sys.stderr.write(f"capplan: cannot import {args.factory}: {exc}\n")
        return 1
    ops = {layer["op"] for layer in graph["layers"]}
    family = args.family or next(
        (f for op, f in (("attention", "transformer"), ("lstm", "rnn"), ("gru", "rnn"),
                         ("conv2d", "cnn")) if op in ops), "custom",
    )  # fmt: skip
    payload: dict[str, Any] = {
        "slug": args.slug,
        "name": args.name or args.factory.rpartition(":")[2],
        "family": family,
        "description": f"Traced from {args.factory} with capplan import torch.",
        "inputs": graph["inputs"],
        "layers": graph["layers"],
        "default_bindings": graph["default_bindings"],
    }
    if args.dry_run:
        out.write(json.dumps(payload, indent=None if args.json else 1) + "\n")
        return 0
    model = client.create_model(payload)
    if args.json:
        out.write(_dump(model) + "\n")
        return 0
    out.write(f"imported '{model.slug}' ({model.name}), {model.layer_count} layers, traced\n")
    counts: dict[str, int] = {}
    for layer in graph["layers"]:
        counts[layer["op"]] = counts.get(layer["op"], 0) + 1
    out.write(table(sorted(counts.items()), ["op", "count"]) + "\n")
    for note in graph["assumptions"]:
        out.write(f"* {note}\n")
    return 0


def _show_import(result: Any, args: argparse.Namespace, out: TextIO) -> int:
    if args.json:
        out.write(_dump(result) + "\n")
        return 0
    report = result.report
    out.write(f"imported '{result.model.slug}' ({result.model.name}), {report.source}\n")
    out.write(f"parameters: {report.parameter_count:,} ({report.reference})\n")
    if report.source_parameter_count is not None:
        out.write(f"from initializers: {report.source_parameter_count:,}\n")
    rows = [(m.source_op, m.count, ", ".join(m.mapped_to) or "(folded)") for m in report.op_mapping]
    out.write("\n" + table(rows, ["source", "count", "graph ops"]) + "\n")
    if report.unsupported_ops:
        rows = [(u.source_op, u.count, ", ".join(u.nodes)) for u in report.unsupported_ops]
        out.write("\nunsupported (imported as opaque):\n" + table(rows, ["op", "count", "nodes"]))
        out.write("\n")
    for note in report.assumptions:
        out.write(f"* {note}\n")
    return 0


def cmd_models(client: CapacityPlannerClient, args: argparse.Namespace, out: TextIO) -> int:
    if args.action == "show":
        model = client.get_model(args.slug)
        if args.json:
            out.write(_dump(model) + "\n")
            return 0
        summary = client.model_summary(args.slug)
        out.write(f"{model.slug}: {model.name} ({model.family}, {model.provenance})\n")
        out.write(f"{summary.total_params:,} parameters, {model.layer_count} layers\n")
        return 0
    if args.action == "delete":
        model = client.get_model(args.slug)
        client.delete_model(args.slug, if_match=model.version)
        out.write(f"deleted {args.slug}\n")
        return 0
    page = client.list_models(family=args.family, provenance=args.provenance, limit=500)
    if args.json:
        out.write(_dump(page) + "\n")
        return 0
    rows = [(m.slug, m.name, m.family, m.provenance.value, m.layer_count) for m in page.items]
    out.write(table(rows, ["slug", "name", "family", "provenance", "layers"]) + "\n")
    return 0


def cmd_hardware(client: CapacityPlannerClient, args: argparse.Namespace, out: TextIO) -> int:
    if args.action == "show":
        item = client.get_hardware(args.slug)
        out.write(_dump(item) + "\n")
        return 0
    page = client.list_hardware(kind=args.kind, limit=500)
    if args.json:
        out.write(_dump(page) + "\n")
        return 0
    rows = [(h.slug, h.vendor, h.name, h.kind, gib(h.memory_bytes), h.mig is not None)
            for h in page.items]  # fmt: skip
    out.write(table(rows, ["slug", "vendor", "name", "kind", "memory", "MIG"]) + "\n")
    return 0


def _load_json(path: str) -> dict[str, Any]:
    try:
        loaded = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise UsageError(f"cannot read {path} as JSON: {exc}") from exc
    if not isinstance(loaded, dict):
        raise UsageError(f"{path} must hold a JSON object")
    return loaded


def cmd_mig(client: CapacityPlannerClient, args: argparse.Namespace, out: TextIO) -> int:
    payload = _load_json(args.file)
    if args.action == "validate":
        checked = client.validate_layout(payload)
        if args.json:
            out.write(_dump(checked) + "\n")
        else:
            out.write("valid\n" if checked.valid else "INVALID\n")
            for violation in checked.violations:
                out.write(f"* {violation.rule}: {violation.message}\n")
        return 0
    plan = wait_with_progress("planning", lambda: client.mig_plan(payload), sys.stderr)
    if args.json:
        out.write(_dump(plan) + "\n")
        return 0
    out.write(f"{plan.gpu_count} x {plan.gpu}{' (optimal)' if plan.optimal else ''}\n\n")
    rows = [(g.index, i.profile, i.start, i.workload, i.kubernetes_resource)
            for g in plan.gpus for i in g.instances]  # fmt: skip
    out.write(table(rows, ["gpu", "profile", "start", "workload", "resource"]) + "\n\n")
    out.write(plan.mig_parted_yaml)
    return 0


def cmd_workloads(client: CapacityPlannerClient, args: argparse.Namespace, out: TextIO) -> int:
    if args.action == "show":
        out.write(_dump(client.get_workload(args.slug)) + "\n")
        return 0
    page = client.list_workloads(limit=500)
    if args.json:
        out.write(_dump(page) + "\n")
        return 0
    rows = [(w.slug, w.model, w.mode.value, w.batch_size, w.precision.value) for w in page.items]
    out.write(table(rows, ["slug", "model", "mode", "batch", "precision"]) + "\n")
    return 0


def cmd_admission(client: CapacityPlannerClient, args: argparse.Namespace, out: TextIO) -> int:
    result = client.admission_check(_load_json(args.file))
    if args.json:
        out.write(_dump(result) + "\n")
    else:
        out.write(f"{'ALLOWED' if result.allowed else 'DENIED'}: {result.message}\n")
        for warning in result.warnings:
            out.write(f"warning: {warning}\n")
    return 0


def _prices(values: list[str]) -> dict[str, float]:
    prices: dict[str, float] = {}
    for value in values:
        slug, _, price = value.partition("=")
        try:
            prices[slug] = float(price)
        except ValueError:
            raise UsageError(f"--price {value!r}: expected SLUG=USD_PER_HOUR") from None
    return prices


def cmd_recommend(client: CapacityPlannerClient, args: argparse.Namespace, out: TextIO) -> int:
    payload: dict[str, Any] = {"model": args.model, "objective": args.objective}
    for key, value in (
        ("batch_sizes", args.batch),
        ("precisions", args.precision),
        ("latency_slo_ms", args.slo_ms),
        ("slo_margin", args.slo_margin),
        ("price_kind", args.price_kind),
        ("throughput_target_per_s", args.target),
        ("devices", args.devices.split(",") if args.devices else None),
        ("sequence_length", args.seq),
        ("image_size", args.image),
        ("prompt_tokens", args.prompt_tokens),
        ("generated_tokens", args.generated_tokens),
        ("limit", args.limit),
    ):
        if value is not None:
            payload[key] = value
    if args.price:
        payload["prices_usd_per_hour"] = _prices(args.price)
    result = wait_with_progress(
        "ranking devices", lambda: client.recommend_inference(payload), sys.stderr
    )
    chosen = list(dict.fromkeys(c.device for c in result.candidates[:4]))
    if args.svg and chosen:
        Path(args.svg).write_text(client.roofline_svg(args.model, chosen), encoding="utf-8")
    if args.json:
        out.write(_dump(result) + "\n")
        return 0
    out.write(result.recommendation + "\n\n")
    workload = result.workload
    out.write(_echo(workload.bindings, workload.defaults_used, workload.attention) + "\n")
    rows = [
        (
            c.rank,
            c.device,
            c.precision,
            c.batch_size,
            c.latency_ms,
            c.throughput_per_s,
            c.devices_needed,
            c.cost_usd_per_million,
            c.bound,
            c.fits_in_memory,
            "yes" if c.eligible else "; ".join(c.reasons)[:40],
        )
        for c in result.candidates
    ]
    headers = ["#", "device", "precision", "batch", "latency ms", "per s", "devices",
               "$/M", "bound", "fits", "eligible"]  # fmt: skip
    out.write(table(rows, headers) + "\n")
    out.write(
        f"\n{result.eligible_candidates} of {result.total_candidates} candidates eligible; "
        f"{len(result.excluded)} device/precision pairs excluded (--json lists why)\n"
    )
    out.write(f"$/M: {result.price_kind.value} prices only")
    if result.latency_budget_ms is not None and result.slo_margin is not None:
        out.write(
            f"; SLO met at <= {result.latency_budget_ms:.4g} ms ({result.slo_margin:.0%} margin)"
        )
    out.write("\n")
    if args.svg:
        written = f"written to {args.svg}" if chosen else "not written: no candidates"
        out.write(f"roofline of the top devices {written}\n")
    return 0


def cmd_health(client: CapacityPlannerClient, args: argparse.Namespace, out: TextIO) -> int:
    ready = client.ready()
    out.write(json.dumps(ready, indent=2) + "\n" if args.json else f"{ready['status']}\n")
    return 0


# -- parser ------------------------------------------------------------------------------------


def _workload_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", help="model slug (GET /v1/models lists them)")
    parser.add_argument("--mode", choices=["training", "inference"], default="inference")
    parser.add_argument("--batch", type=int, default=1, help="batch size")
    parser.add_argument(
        "--precision",
        default=None,
        help="fp32, bf16, amp_bf16, int8, ... (default: the server's table: bf16 inference / "
        "amp_bf16 training on CUDA, fp32 on CPU)",
    )
    parser.add_argument(
        "--attention",
        choices=["eager", "sdpa_math", "flash", "mem_efficient"],
        default=None,
        help="attention implementation (default: PyTorch SDPA's choice)",
    )
    parser.add_argument(
        "--logits", choices=["last", "all"], default=None, help="decoder inference (default last)"
    )
    parser.add_argument("--seq", type=int, help="sequence length")
    parser.add_argument("--image", type=int, help="image size")
    parser.add_argument("--optimizer", help="training optimizer (default adamw)")


def build_parser() -> argparse.ArgumentParser:
    """The ``capplan`` argument parser."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--json", action="store_true", help="print the raw JSON answer")
    common.add_argument("--url", default=None, help="server URL (CAPPLAN_URL)")
    common.add_argument("--api-key", default=None, help="API key (CAPPLAN_API_KEY)")
    parser = argparse.ArgumentParser(
        prog="capplan", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="command", required=True)

    estimate = sub.add_parser("estimate", parents=[common], help="memory footprint of a model")
    _workload_args(estimate)
    estimate.add_argument("--gpu", help="also check the fit on this hardware (slug or part)")
    estimate.set_defaults(run=cmd_estimate)

    fit = sub.add_parser("fit", parents=[common], help="which GPU / MIG profile holds a model")
    _workload_args(fit)
    fit.add_argument("--gpu", required=True, help="hardware slug, or a unique part of one")
    fit.set_defaults(run=cmd_fit)

    imports = sub.add_parser("import", help="import a model").add_subparsers(
        dest="source", required=True
    )
    onnx = imports.add_parser("onnx", parents=[common], help="upload an ONNX file")
    onnx.add_argument("file")
    onnx.add_argument("--lenient", action="store_true", help="import unsupported ops as opaque")
    hf = imports.add_parser("hf-config", parents=[common], help="a Hugging Face config.json")
    hf.add_argument("file")
    for command in (onnx, hf):
        command.add_argument("--slug", required=True)
        command.add_argument("--name")
        command.add_argument("--family")
        command.add_argument("--seq", type=int, help="default sequence length")
    onnx.set_defaults(run=cmd_import_onnx)
    hf.set_defaults(run=cmd_import_hf)
    traced = imports.add_parser(
        "torch", parents=[common], help="trace a PyTorch module locally (needs torch)"
    )
    traced.add_argument("factory", metavar="MODULE:FACTORY", help="class or zero-arg function")
    traced.add_argument(
        "--input",
        action="append",
        required=True,
        metavar="NAME:DIMS[:DTYPE]",
        help="e.g. input_ids:batch,seq:int64 or pixel_values:batch,3,224,224 (repeat)",
    )
    traced.add_argument("--slug", required=True)
    traced.add_argument("--name")
    traced.add_argument("--family")
    traced.add_argument("--seq", type=int, help="default sequence length")
    traced.add_argument("--dry-run", action="store_true", help="print the body, do not post")
    traced.set_defaults(run=cmd_import_torch)

    models = sub.add_parser("models", parents=[common], help="list, show or delete models")
    models.add_argument("action", choices=["list", "show", "delete"])
    models.add_argument("slug", nargs="?")
    models.add_argument("--family")
    models.add_argument("--provenance")
    models.set_defaults(run=cmd_models)

    hardware = sub.add_parser("hardware", parents=[common], help="list or show hardware")
    hardware.add_argument("action", choices=["list", "show"])
    hardware.add_argument("slug", nargs="?")
    hardware.add_argument("--kind", choices=["gpu", "cpu", "tpu", "edge"])
    hardware.set_defaults(run=cmd_hardware)

    mig = sub.add_parser("mig", parents=[common], help="MIG layouts: validate or plan (JSON)")
    mig.add_argument("action", choices=["validate", "plan"])
    mig.add_argument("file", help="request body as a JSON file")
    mig.set_defaults(run=cmd_mig)

    workloads = sub.add_parser("workloads", parents=[common], help="list or show workloads")
    workloads.add_argument("action", choices=["list", "show"])
    workloads.add_argument("slug", nargs="?")
    workloads.set_defaults(run=cmd_workloads)

    admission = sub.add_parser("admission", parents=[common], help="admission check (JSON)")
    admission.add_argument("file", help="POST /v1/admission/check body as a JSON file")
    admission.set_defaults(run=cmd_admission)

    recommend = sub.add_parser(
        "recommend", parents=[common], help="CPU vs GPU vs MIG slice for inference, ranked"
    )
    recommend.add_argument("model", help="stored model slug")
    recommend.add_argument(
        "--batch", type=int, action="append", help="batch size to try (repeat; default: search)"
    )
    recommend.add_argument(
        "--precision", action="append", help="fp32, bf16, fp16, int8, ... (repeat)"
    )
    recommend.add_argument("--slo-ms", type=float, help="latency SLO [ms]")
    recommend.add_argument(
        "--slo-margin", type=float, help="headroom kept under --slo-ms, a fraction (default 0.1)"
    )
    recommend.add_argument("--target", type=float, help="throughput target [inferences/s]")
    recommend.add_argument("--devices", help="comma-separated slugs or slug/profile MIG slices")
    recommend.add_argument("--objective", choices=["cost", "energy", "latency"], default="cost")
    recommend.add_argument(
        "--price", action="append", metavar="SLUG=USD", help="price per hour (repeat)"
    )
    recommend.add_argument(
        "--price-kind",
        choices=["on_demand", "reserved", "spot"],
        help="the kind of price costs are ranked by (default on_demand); --price is of it",
    )
    recommend.add_argument("--seq", type=int, help="sequence length")
    recommend.add_argument("--image", type=int, help="image size")
    recommend.add_argument("--prompt-tokens", type=int, help="decoders: prompt length")
    recommend.add_argument("--generated-tokens", type=int, help="decoders: tokens generated")
    recommend.add_argument("--limit", type=int, default=10, help="rows to show")
    recommend.add_argument("--svg", help="also write the top devices' roofline SVG here")
    recommend.set_defaults(run=cmd_recommend)

    health = sub.add_parser("health", parents=[common], help="is the server ready")
    health.set_defaults(run=cmd_health)
    return parser


def main(
    argv: Sequence[str] | None = None,
    *,
    http: httpx.Client | None = None,
    out: TextIO | None = None,
    err: TextIO | None = None,
) -> int:
    """Entry point of ``capplan``; ``http`` lets tests pass a client bound to an app."""
    out = out or sys.stdout
    err = err or sys.stderr
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:
        return int(exc.code or 0) if exc.code in (0, None) else 2
    if getattr(args, "action", None) in ("show", "delete") and not args.slug:
        err.write(f"capplan {args.command} {args.action}: a slug is required\n")
        return 2
    url = args.url or os.environ.get("CAPPLAN_URL", "http://127.0.0.1:8000")
    key = args.api_key or os.environ.get("CAPPLAN_API_KEY")
    client = CapacityPlannerClient(url, api_key=key, http=http)
    try:
        return int(args.run(client, args, out))
    except UsageError as exc:
        err.write(f"capplan: {exc}\n")
        return 2
    except ApiError as exc:
        err.write(f"error {exc.status}: {exc.detail}\n")
        for field in exc.errors[:20]:
            err.write(f"  {field.get('pointer', '')}: {field.get('message', '')}\n")
        return 1
    except httpx.HTTPError as exc:
        err.write(f"capplan: cannot reach {url}: {exc}\n")
        return 1
    finally:
        if http is None:
            client.close()


if __name__ == "__main__":
    raise SystemExit(main())
