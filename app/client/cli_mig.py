"""``capplan mig`` (plan a MIG layout, validate one) and ``capplan admission`` (would the
admission webhook let a pod in).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TextIO

from app.client.cli_devices import _resolve_gpu
from app.client.cli_output import (
    EXIT_OK,
    EXIT_VERDICT_NO,
    UsageError,
    _dump,
    table,
    wait_with_progress,
)
from app.client.cli_requests import _load_json, _with, _workload
from app.client.transport import JsonClient


def cmd_mig(client: JsonClient, args: argparse.Namespace, out: TextIO) -> int:
    payload = _load_json(args.file)
    if args.action == "validate":
        checked = client.validate_layout(payload)
        if args.json:
            out.write(_dump(checked) + "\n")
        else:
            out.write("valid\n" if checked["valid"] else "INVALID\n")
            for violation in checked["violations"]:
                out.write(f"* {violation['rule']}: {violation['message']}\n")
        return EXIT_OK if checked["valid"] else EXIT_VERDICT_NO
    for key, value in (
        ("config_name", args.config_name),
        ("cuda_context_bytes", args.cuda_context),
        ("safety_margin_fraction", args.safety_margin),
    ):
        if value is not None:
            payload[key] = value
    plan = wait_with_progress("planning", lambda: client.mig_plan(payload), sys.stderr)
    if args.json:
        out.write(_dump(plan) + "\n")
        return EXIT_OK
    optimal = " (optimal)" if plan["optimal"] else ""
    out.write(f"{plan['gpu_count']} x {plan['gpu']}{optimal}\n\n")
    rows = [(g["index"], i["profile"], i["start"], i["workload"], i["kubernetes_resource"])
            for g in plan["gpus"] for i in g["instances"]]  # fmt: skip
    out.write(table(rows, ["gpu", "profile", "start", "workload", "resource"]) + "\n\n")
    out.write(plan["mig_parted_yaml"])
    return EXIT_OK


def cmd_admission(client: JsonClient, args: argparse.Namespace, out: TextIO) -> int:
    if args.target.endswith(".json") or Path(args.target).is_file():
        body = _load_json(args.target)
    else:
        if not (args.resource and args.gpu):
            raise UsageError("capplan admission MODEL needs --resource and --gpu")
        body = {"workload": _workload(_with(args, model=args.target)), "resource": args.resource}
    if args.gpu:
        body["gpu_model"] = _resolve_gpu(client, args.gpu)
    if args.resource:
        body["resource"] = args.resource
    if args.count is not None:
        body["count"] = args.count
    result = client.admission_check(body)
    if args.json:
        out.write(_dump(result) + "\n")
    else:
        out.write(f"{'ALLOWED' if result['allowed'] else 'DENIED'}: {result['message']}\n")
        for warning in result.get("warnings", []):
            out.write(f"warning: {warning}\n")
    return EXIT_OK if result["allowed"] else EXIT_VERDICT_NO
