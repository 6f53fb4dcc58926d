"""What the server holds: ``capplan models``, ``hardware`` and ``workloads`` (list, show,
delete), and ``capplan health``.
"""

from __future__ import annotations

import argparse
import json
from typing import Any, TextIO

from app.client.cli_devices import _mig_capable, _resolve_gpu
from app.client.cli_output import EXIT_OK, UsageError, _dump, _field_table, _flatten, gib, table
from app.client.transport import Json, JsonClient


def _need_slug(args: argparse.Namespace) -> str:
    if not args.slug:
        raise UsageError(f"capplan {args.command} {args.action}: a slug is required")
    return str(args.slug)


def cmd_models(client: JsonClient, args: argparse.Namespace, out: TextIO) -> int:
    if args.action == "show":
        model = client.get_model(_need_slug(args))
        if args.json:
            out.write(_dump(model) + "\n")
            return EXIT_OK
        summary = client.model_summary(args.slug)
        out.write(f"{model['slug']}: {model['name']} ({model['family']}, {model['provenance']})\n")
        out.write(f"{summary['total_params']:,} parameters, {model['layer_count']} layers\n")
        return EXIT_OK
    if args.action == "delete":
        model = client.get_model(_need_slug(args))
        client.delete_model(args.slug, if_match=model["version"])
        out.write(f"deleted {args.slug}\n")
        return EXIT_OK
    page = client.list_models(family=args.family, provenance=args.provenance, limit=500)
    if args.json:
        out.write(_dump(page) + "\n")
        return EXIT_OK
    rows = [(m["slug"], m["name"], m["family"], m["provenance"], m["layer_count"])
            for m in page["items"]]  # fmt: skip
    out.write(table(rows, ["slug", "name", "family", "provenance", "layers"]) + "\n")
    return EXIT_OK


def cmd_hardware(client: JsonClient, args: argparse.Namespace, out: TextIO) -> int:
    if args.action == "show":
        item = client.get_hardware(_resolve_gpu(client, _need_slug(args)))
        if args.json:
            out.write(_dump(item) + "\n")
            return EXIT_OK
        out.write(_hardware_tables(item))
        return EXIT_OK
    page = client.list_hardware(kind=args.kind, limit=500)
    if args.json:
        out.write(_dump(page) + "\n")
        return EXIT_OK
    rows = [(h["slug"], h["vendor"], h["name"], h["kind"], gib(h["memory_bytes"]), _mig_capable(h))
            for h in page["items"]]  # fmt: skip
    out.write(table(rows, ["slug", "vendor", "name", "kind", "memory", "MIG"]) + "\n")
    return EXIT_OK


def _hardware_tables(item: Json) -> str:
    """A hardware profile: its fields, peaks per dtype and MIG profiles, with units."""
    fields: list[tuple[str, Any]] = [
        ("slug", item["slug"]),
        ("name", f"{item['vendor']} {item['name']}"),
        ("memory", f"{gib(item['memory_bytes'])} ({item['memory_bytes']:,} B)"),
        ("memory bandwidth", f"{item['memory_bandwidth_bytes_per_s'] / 1e9:,.1f} GB/s"),
    ]
    if item.get("tdp_watts") is not None:
        fields.append(("TDP", f"{item['tdp_watts']:,.0f} W"))
    if item.get("price_usd_per_hour") is not None:
        fields.append(("price", f"${item['price_usd_per_hour']:,.2f}/h"))
    shown = {"slug", "vendor", "name", "memory_bytes", "memory_bandwidth_bytes_per_s",
             "tdp_watts", "price_usd_per_hour", "peak_flops_per_s", "peak_sparse_flops_per_s",
             "mig"}  # fmt: skip
    fields += _flatten({k: v for k, v in item.items() if k not in shown})
    text = _field_table(fields) + "\n"
    dense = item.get("peak_flops_per_s") or {}
    sparse = item.get("peak_sparse_flops_per_s") or {}
    if dense or sparse:
        rows = [(dtype, _tflops(dense.get(dtype)), _tflops(sparse.get(dtype)))
                for dtype in sorted({*dense, *sparse})]  # fmt: skip
        text += "\n" + table(rows, ["dtype", "dense TFLOP/s", "sparse TFLOP/s"]) + "\n"
    mig = item.get("mig")
    if mig:
        text += (
            f"\nMIG: {mig['total_compute_slices']} compute / {mig['total_memory_slices']} memory "
            f"slices, up to {mig['max_gpu_instances']} instances\n"
        )
        profiles = [
            (p["name"], p["kubernetes_resource"], p["compute_slices"], p["memory_slices"],
             f"{p['memory_mib']:,} MiB", p["max_instances"],
             ",".join(str(s) for s in p["placements"]))
            for p in mig["profiles"]
        ]  # fmt: skip
        headers = ["profile", "resource", "compute", "memory slices", "memory", "max", "starts"]
        text += table(profiles, headers) + "\n"
    return text


def _tflops(value: float | None) -> float | None:
    return None if value is None else value / 1e12


def cmd_workloads(client: JsonClient, args: argparse.Namespace, out: TextIO) -> int:
    if args.action == "show":
        workload = client.get_workload(_need_slug(args))
        if args.json:
            out.write(_dump(workload) + "\n")
        else:
            out.write(_field_table(_flatten(workload)) + "\n")
        return EXIT_OK
    page = client.list_workloads(limit=500)
    if args.json:
        out.write(_dump(page) + "\n")
        return EXIT_OK
    rows = [(w["slug"], w["model"], w["mode"], w["batch_size"], w["precision"])
            for w in page["items"]]  # fmt: skip
    out.write(table(rows, ["slug", "model", "mode", "batch", "precision"]) + "\n")
    return EXIT_OK


def cmd_health(client: JsonClient, args: argparse.Namespace, out: TextIO) -> int:
    ready = client.ready()
    out.write(json.dumps(ready, indent=2) + "\n" if args.json else f"{ready['status']}\n")
    return EXIT_OK
