"""``capplan import``: an ONNX file, a Hugging Face ``config.json``, or a PyTorch model traced
on this machine.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import TextIO

from app.client.cli_output import EXIT_OK, ProgressBar, UsageError, _dump, table
from app.client.cli_requests import _load_json
from app.client.transport import Json, JsonClient


def cmd_import_onnx(client: JsonClient, args: argparse.Namespace, out: TextIO) -> int:
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


def cmd_import_hf(client: JsonClient, args: argparse.Namespace, out: TextIO) -> int:
    config = _load_json(args.file)
    payload: Json = {"slug": args.slug, "config": config}
    for key, value in (("name", args.name), ("family", args.family), ("sequence_length", args.seq)):
        if value is not None:
            payload[key] = value
    return _show_import(client.import_hf_config(payload), args, out)


def cmd_import_torch(client: JsonClient, args: argparse.Namespace, out: TextIO) -> int:
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
        raise UsageError(f"cannot import {args.factory}: {exc}") from exc
    ops = {layer["op"] for layer in graph["layers"]}
    family = args.family or next(
        (f for op, f in (("attention", "transformer"), ("lstm", "rnn"), ("gru", "rnn"),
                         ("conv2d", "cnn"), ("conv3d", "cnn"), ("conv_transpose3d", "cnn"))
         if op in ops), "custom",
    )  # fmt: skip
    payload: Json = {
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
        return EXIT_OK
    model = client.create_model(payload)
    if args.json:
        out.write(_dump(model) + "\n")
        return EXIT_OK
    out.write(
        f"imported '{model['slug']}' ({model['name']}), {model['layer_count']} layers, traced\n"
    )
    counts: dict[str, int] = {}
    for layer in graph["layers"]:
        counts[layer["op"]] = counts.get(layer["op"], 0) + 1
    out.write(table(sorted(counts.items()), ["op", "count"]) + "\n")
    for note in graph["assumptions"]:
        out.write(f"* {note}\n")
    return EXIT_OK


def _show_import(result: Json, args: argparse.Namespace, out: TextIO) -> int:
    if args.json:
        out.write(_dump(result) + "\n")
        return EXIT_OK
    report, model = result["report"], result["model"]
    out.write(f"imported '{model['slug']}' ({model['name']}), {report['source']}\n")
    out.write(f"parameters: {report['parameter_count']:,} ({report['reference']})\n")
    if report.get("source_parameter_count") is not None:
        out.write(f"from initializers: {report['source_parameter_count']:,}\n")
    rows = [(m["source_op"], m["count"], ", ".join(m["mapped_to"]) or "(folded)")
            for m in report["op_mapping"]]  # fmt: skip
    out.write("\n" + table(rows, ["source", "count", "graph ops"]) + "\n")
    if report.get("unsupported_ops"):
        rows = [(u["source_op"], u["count"], ", ".join(u["nodes"]))
                for u in report["unsupported_ops"]]  # fmt: skip
        out.write("\nunsupported (imported as opaque):\n" + table(rows, ["op", "count", "nodes"]))
        out.write("\n")
    for note in report.get("assumptions", []):
        out.write(f"* {note}\n")
    return EXIT_OK
