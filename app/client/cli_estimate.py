"""``capplan estimate`` and ``capplan fit``: a model's memory footprint, its fit on a whole GPU
or a MIG profile and, when it does not fit, what would.
"""

from __future__ import annotations

import argparse
import sys
from typing import TextIO

from app.client.cli_devices import _mig_capable, _resolve_device, runs_precision
from app.client.cli_output import (
    EXIT_OK,
    EXIT_VERDICT_NO,
    UsageError,
    _dump,
    _echo,
    gib,
    table,
    wait_with_progress,
)
from app.client.cli_requests import _estimate_body, _with, _workload
from app.client.transport import Json, JsonClient


def _write_estimate(result: Json, out: TextIO) -> None:
    out.write(
        f"{result['model']}: {result['mode']}, batch {result['batch_size']}"
        + (
            f" (micro-batch {result['micro_batch_size']})"
            if result.get("micro_batch_size", result["batch_size"]) != result["batch_size"]
            else ""
        )
        + f", {result['precision']} ({result['params']:,} parameters)\n"
    )
    out.write(
        _echo(result.get("bindings"), result.get("defaults_used", []), result.get("attention", []))
        + "\n"
    )
    rows = [(line["key"], line["bytes"], gib(line["bytes"]))
            for line in result["breakdown"] if line["bytes"]]  # fmt: skip
    out.write(table(rows, ["line", "bytes", "GiB"]) + "\n\n")
    peak = result["peak_bytes"]
    out.write(f"peak {gib(peak)} ({peak:,} B) at {result['peak_phase']}\n")
    cuda = result.get("cuda")
    if cuda is not None:
        out.write(
            f"on CUDA: max_memory_allocated {gib(cuda['allocated_bytes'])}, max_memory_reserved "
            f"{gib(cuda['reserved_bytes'])}, + context = device total "
            f"{gib(cuda['device_total_bytes'])}\n"
        )


def cmd_estimate(client: JsonClient, args: argparse.Namespace, out: TextIO) -> int:
    gpu = _resolve_device(client, args.gpu) if args.gpu else None
    result = client.estimate_memory(_estimate_body(args, gpu))
    fit = result.get("fit")
    if args.json:
        out.write(_dump(result) + "\n")
    else:
        _write_estimate(result, out)
        if fit is not None:
            _write_whole_gpu_fit(client, args, fit, out, result["precision"])
    return EXIT_OK if fit is None or fit["fits"] else EXIT_VERDICT_NO


def _write_whole_gpu_fit(
    client: JsonClient, args: argparse.Namespace, fit: Json, out: TextIO, result_precision: str
) -> None:
    """The fit on a whole device and, when it does not fit, what would."""
    hardware, required = fit["hardware"], fit["required_bytes"]
    precision = str(result_precision)
    out.write(
        f"{'fits' if fit['fits'] else 'does NOT fit'} {hardware}: needs {gib(required)} of "
        f"{gib(fit['usable_bytes'])} usable, headroom {gib(fit['headroom_bytes'])}\n"
    )
    if fit["fits"]:
        return
    # The same rules as POST /v1/mig/fit's alternatives, with the whole device as the slot:
    # GPUs that hold it and run its precision (no V100 or T4 for bf16).
    larger = sorted(
        (h for h in client.list_hardware(kind="gpu", limit=500)["items"]
         if h["memory_bytes"] >= required and runs_precision(h, precision)),
        key=lambda h: (h["memory_bytes"], h["slug"]),
    )[:5]  # fmt: skip
    _write_alternatives(out, larger, required, precision)
    what, size = wait_with_progress(
        "searching the largest batch", lambda: _largest_batch(client, args, hardware), sys.stderr
    )
    if size is None:
        out.write(f"even {what} 1 does not fit {hardware}\n")
    else:
        out.write(f"largest {what} that fits {hardware}: {size}\n")


def _write_alternatives(out: TextIO, larger: list[Json], required: int, precision: str) -> None:
    if larger:
        out.write(
            f"\nGPUs whose whole memory holds {gib(required)} and that run {precision} "
            "(smallest first):\n"
        )
        rows = [
            (h.get("hardware", h.get("slug")), gib(h["memory_bytes"]), _mig_capable(h))
            for h in larger
        ]
        out.write(table(rows, ["hardware", "memory", "MIG"]) + "\n")
    else:
        out.write(f"no catalog GPU that runs {precision} holds {gib(required)} on one device\n")


def _largest_batch(
    client: JsonClient, args: argparse.Namespace, hardware: str
) -> tuple[str, int | None]:
    """What to shrink, and the largest value that fits, by the server's estimate.

    Without --micro-batch: a binary search over the batch size (memory grows with it). With
    --micro-batch the memory follows the micro-batch, so the divisors of the batch below it
    are tried, largest first.
    """
    body = _estimate_body(args, hardware)
    micro = body.get("micro_batch_size")

    def fits(**sizes: int) -> bool:
        return bool(client.estimate_memory({**body, **sizes})["fit"]["fits"])

    if micro is not None:
        divisors = [m for m in range(micro - 1, 0, -1) if args.batch % m == 0]
        return "micro-batch", next((m for m in divisors if fits(micro_batch_size=m)), None)
    if not fits(batch_size=1):
        return "batch", None
    low, high = 1, max(1, args.batch - 1)
    while low < high:
        middle = (low + high + 1) // 2
        if fits(batch_size=middle):
            low = middle
        else:
            high = middle - 1
    return "batch", low


def cmd_fit(client: JsonClient, args: argparse.Namespace, out: TextIO) -> int:
    gpu, slash, named = _resolve_device(client, args.gpu).partition("/")
    if slash:  # slug/profile: the same as --profile
        if args.profile and args.profile != named:
            raise UsageError(f"--gpu names profile {named} and --profile {args.profile}; give one")
        args = _with(args, profile=named)
    hardware = client.get_hardware(gpu)
    if hardware.get("mig") is None:
        if args.profile:
            raise UsageError(f"--profile {args.profile}: {gpu} has no MIG profiles")
        return cmd_estimate(client, _with(args, gpu=gpu), out)
    body: Json = {"workload": _workload(args), "gpu": gpu}
    for key, value in (
        ("profile", args.profile),
        ("cuda_context_bytes", args.cuda_context),
        ("safety_margin_fraction", args.safety_margin),
    ):
        if value is not None:
            body[key] = value
    result = client.mig_fit(body)
    requested = result.get("requested")
    fits = requested["fits"] if requested else result.get("smallest_fitting_profile") is not None
    if args.json:
        out.write(_dump(result) + "\n")
        return EXIT_OK if fits else EXIT_VERDICT_NO
    out.write(f"{args.model} on {gpu}: needs {gib(result['required_bytes'])}\n")
    out.write(_echo(None, result.get("defaults_used", []), result.get("attention", [])) + "\n")
    rows = [
        (p["profile"], p["kubernetes_resource"], gib(p["usable_bytes"]),
         gib(p["headroom_bytes"]), p["fits"])
        for p in result["profiles"]
    ]  # fmt: skip
    out.write(table(rows, ["profile", "resource", "usable", "headroom", "fits"]) + "\n\n")
    if requested:
        verdict = "fits" if requested["fits"] else "does NOT fit"
        out.write(
            f"{requested['profile']}: {verdict}, headroom {gib(requested['headroom_bytes'])}\n"
        )
    if result.get("smallest_fitting_profile"):
        resource = result.get("smallest_fitting_resource")
        out.write(f"smallest fit: {result['smallest_fitting_profile']} ({resource})\n")
        return EXIT_OK if fits else EXIT_VERDICT_NO
    out.write("no MIG profile fits\n")
    alternatives = result.get("alternatives")
    if alternatives:
        whole = "fits" if alternatives["full_gpu_fits"] else "does NOT fit"
        out.write(
            f"the whole {gpu} ({gib(alternatives['full_gpu_memory_bytes'])}, MIG disabled): "
            f"{whole}\n"
        )
        precision = getattr(args, "precision", None) or next(
            (d["value"] for d in result.get("defaults_used", []) if d["option"] == "precision"),
            "its precision",
        )
        _write_alternatives(out, alternatives["larger_gpus"], result["required_bytes"], precision)
        batch = alternatives.get("largest_batch_on_biggest_profile")
        biggest = alternatives["biggest_profile"]
        if batch is None:
            out.write(f"even batch 1 does not fit {biggest}\n")
        else:
            out.write(f"largest batch that fits {biggest}: {batch}\n")
    return EXIT_VERDICT_NO
