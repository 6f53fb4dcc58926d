"""capplan: the Capacity Planner from a terminal (runs on httpx alone, no server code)."""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any, TextIO, TypeVar

import httpx

from app.client.transport import ApiError, Json, JsonClient

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

DESCRIPTION = """\
The Capacity Planner from a terminal: memory estimates, GPU and MIG fit checks, MIG plans,
admission checks and CPU-vs-GPU inference recommendations.

examples:
  capplan estimate llama-3-8b --batch 8 --precision bf16
  capplan estimate llama-3-8b --mode training --batch 16 --micro-batch 2 \\
      --checkpointing full --zero 3 --dp 8 --tp 2 --gpu h100-sxm
  capplan fit llama-3-8b --gpu a100-80gb --batch 8 --seq 4096
  capplan import onnx model.onnx --slug my-model
  capplan import hf-config config.json --slug my-llama
  capplan import torch mypkg.models:build --input input_ids:batch,seq:int64 --seq 2048 --slug m
  capplan recommend resnet-50 --slo-ms 20 --target 1000 --price intel-xeon-6980p=0.3
  capplan --url http://planner:8000 --json hardware show l4
"""

EPILOG = f"""\
options anywhere: --url, --token, --json and --timeout go before or after the subcommand.
The server is --url or CAPPLAN_URL (default http://127.0.0.1:8000); the key --token or
CAPPLAN_TOKEN (CAPPLAN_API_KEY also works). Tables by default, --json for the raw answer.

exit codes:
  {EXIT_OK}    ok: fits, valid layout, admission allowed, an eligible candidate
  {EXIT_VERDICT_NO}    the answer is no: does not fit (estimate --gpu, fit), no MIG profile fits,
       INVALID layout (mig validate), DENIED (admission), no eligible candidate (recommend)
  {EXIT_USAGE}    usage: bad arguments, unknown or ambiguous --gpu, unreadable input file,
       a module import torch cannot trace
  {EXIT_API_ERROR}    the server answered with an error (4xx/5xx; its detail is on stderr)
  {EXIT_UNREACHABLE}    the server could not be reached (connection refused, timeout)
  {EXIT_BROKEN_PIPE}  the output pipe closed early (capplan ... | head), as SIGPIPE in a shell
"""

# The API's enumerations, spelled here so that the CLI needs no server code
# (tests/test_capplan.py checks them against app.domain).
PRECISIONS = ("fp32", "tf32", "bf16", "fp16", "amp_bf16", "amp_fp16", "mixed_bf16",
              "mixed_fp16", "fp8", "int8", "int8_weight_only", "int4", "fp4")  # fmt: skip
OPTIMIZERS = ("sgd", "sgd_momentum", "adam", "adamw", "adagrad", "rmsprop", "lion", "adam_8bit",
              "adafactor")  # fmt: skip
OPTIMIZER_IMPLS = ("auto", "for_loop", "foreach", "fused")
CHECKPOINTING = ("none", "selective", "full")
ATTENTIONS = ("eager", "sdpa_math", "flash", "mem_efficient")
LOGITS = ("last", "all")
RUNTIMES = ("pytorch_cuda", "pytorch_cpu")
OBJECTIVES = ("cost", "energy", "latency")
PRICE_KINDS = ("on_demand", "reserved", "spot")
SCENARIOS = ("offline", "server", "single_stream")
SERVING_RUNTIMES = (
    "tensorrt",
    "torch_compile",
    "pytorch_eager",
    "tensorflow",
    "onnxruntime",
    "vllm",
)
BATCHINGS = ("static", "continuous")
PARALLELISMS = ("tensor", "pipeline", "both")
DEVICE_KINDS = ("gpu", "cpu", "edge", "tpu")
# Keys of a recommendation's calibration: the kinds, with GPUs split by architecture
# (gpu_ampere, gpu_hopper; gpu: the others) and CPUs by AMX (cpu_amx)
CALIBRATION_CLASSES = ("gpu", "gpu_ampere", "gpu_hopper", "cpu", "cpu_amx", "edge", "tpu")
CALIBRATION_FIELDS = ("compute_efficiency", "memory_efficiency", "activation_cache_share",
                      "host_link_efficiency", "kernel_launch_overhead_us",
                      "host_dispatch_us", "request_overhead_us",
                      "half_precision_scale")  # fmt: skip
# The recommendation request's integer bounds (tests/test_capplan.py checks them against the
# request schema): a value outside them is a usage error here, not a 422 from the server.
MAX_TOKENS = 16_777_216  # prompt and generated tokens, their means
MAX_BEAM_WIDTH = 16
MAX_KV_BLOCK_TOKENS = 4096
MAX_GROUP_GPUS = 8  # tensor_parallel_max, pipeline_parallel_max


def version() -> str:
    """The installed package's version (the client package, else the whole service)."""
    for distribution in ("capacity-planner-client", "capacity-planner"):
        try:
            return metadata.version(distribution)
        except metadata.PackageNotFoundError:
            continue
    return "unknown (not installed)"


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


def _dump(result: Any) -> str:
    return json.dumps(result, indent=2)


class UsageError(Exception):
    """A command line that cannot be carried out (exit code 2)."""


@dataclass(frozen=True, slots=True)
class IntIn:
    """An argparse ``type``: an integer in [low, high], else a usage error naming the range
    (the server's bounds, so that a bad value never reaches it)."""

    low: int
    high: int

    def __call__(self, text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"expected an integer in [{self.low}, {self.high}], got {text!r}"
            ) from None
        if not self.low <= value <= self.high:
            raise argparse.ArgumentTypeError(f"must be in [{self.low}, {self.high}], got {value}")
        return value


# -- request bodies ----------------------------------------------------------------------------


def _bindings(values: list[str] | None) -> dict[str, int]:
    bindings: dict[str, int] = {}
    for value in values or []:
        name, _, number = value.partition("=")
        if not name or not number.isdigit():
            raise UsageError(f"--bind {value!r}: expected NAME=INTEGER (e.g. --bind heads=32)")
        bindings[name] = int(number)
    return bindings


def _workload(args: argparse.Namespace) -> Json:
    """The WorkloadSpec body: only what the command line gives (the server fills the rest
    from its one default table and echoes every default it used)."""
    spec: Json = {"model": args.model, "mode": args.mode, "batch_size": args.batch}
    for key, value in (
        ("micro_batch_size", args.micro_batch),
        ("precision", args.precision),
        ("sequence_length", args.seq),
        ("image_size", args.image),
        ("optimizer", args.optimizer),
        ("optimizer_impl", args.optimizer_impl),
        ("checkpointing", args.checkpointing),
        ("attention", args.attention),
        ("logits", args.logits),
        ("kv_cache", args.kv_cache),
    ):
        if value is not None:
            spec[key] = value
    if args.fp32_grad_buffer:
        spec["fp32_grad_buffer"] = True
    if args.bind:
        spec["bindings"] = _bindings(args.bind)
    parallelism = {
        key: value
        for key, value in (
            ("data", args.dp),
            ("tensor", args.tp),
            ("pipeline", args.pp),
            ("zero_stage", args.zero),
            ("gradient_as_bucket_view", args.grad_bucket_view),
        )
        if value is not None
    }
    if parallelism:
        spec["parallelism"] = parallelism
    return spec


def _estimate_body(args: argparse.Namespace, hardware: str | None) -> Json:
    """A MemoryEstimateRequest: the workload, the device and the estimate's own options."""
    body = _workload(args)
    if hardware:
        body["hardware"] = hardware
    if args.runtime:
        body["runtime"] = args.runtime
    if args.safety_margin is not None:
        body["safety_margin_fraction"] = args.safety_margin
    overhead = {
        key: value
        for key, value in (
            ("cuda_context_bytes", args.cuda_context),
            ("workspace_bytes", args.workspace),
            ("fragmentation_fraction", args.fragmentation),
            ("round_allocations", args.round_allocations),
            ("expandable_segments", args.expandable_segments),
        )
        if value is not None
    }
    if overhead:
        body["framework_overhead"] = overhead
    if getattr(args, "per_layer", False):
        body["per_layer"] = True
    return body


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


# -- --gpu -------------------------------------------------------------------------------------

_MEMORY_PART = re.compile(r"^(\d+(?:\.\d+)?)gb$")
MEMORY_TOLERANCE = 0.03  # "80gb" names 80 GiB or 80 GB, give or take 3 %


def _words(text: str) -> list[str]:
    return [w for w in re.split(r"[^a-z0-9.]+", text.lower()) if w]


def _memory_matches(memory_bytes: int, size: float) -> bool:
    return any(
        abs(memory_bytes - size * unit) <= MEMORY_TOLERANCE * size * unit for unit in (GIB, 10**9)
    )


def resolve_gpu(items: list[Json], query: str) -> str:
    """The hardware slug ``query`` names, or a UsageError listing the candidates.

    An exact slug or an exact part name (``L4``, ``H100 SXM5 80GB``, with or without the
    vendor) wins. Otherwise every ``-``-separated part must be a whole word of the slug or the
    name (``l4`` is not ``l40s``), and a part like ``94gb`` must match the memory size.
    """
    wanted = query.strip().lower()
    for item in items:
        if wanted == item["slug"]:
            return str(item["slug"])
    joined = "-".join(_words(wanted))
    exact = [
        item["slug"]
        for item in items
        if joined in {"-".join(_words(item["name"])),
                      "-".join(_words(f"{item['vendor']} {item['name']}"))}
    ]  # fmt: skip
    if len(exact) == 1:
        return str(exact[0])
    parts = _words(wanted.replace("-", " "))
    sizes = [float(m.group(1)) for p in parts if (m := _MEMORY_PART.match(p))]
    names = [p for p in parts if not _MEMORY_PART.match(p)]

    def named(item: Json, prefix: bool) -> bool:
        words = set(_words(item["slug"].replace("-", " "))) | set(_words(item["name"]))
        words |= set(_words(item["vendor"]))
        if prefix:
            return all(any(w.startswith(p) for w in words) for p in names)
        return all(p in words for p in names)

    for prefix in (False, True):  # whole words first: "l4" never falls through to "l40s"
        by_name = [item for item in items if named(item, prefix)]
        if by_name:
            break
    matches = [i for i in by_name if all(_memory_matches(i["memory_bytes"], s) for s in sizes)]
    if len(matches) == 1:
        return str(matches[0]["slug"])
    listed = matches or by_name
    candidates = ", ".join(f"{i['slug']} ({gib(i['memory_bytes'])})" for i in listed[:12])
    if not listed:
        raise UsageError(f"no hardware matches '{query}'; 'capplan hardware list' lists them")
    if not matches:
        raise UsageError(
            f"no hardware matches '{query}': the memory size does not match; candidates: "
            f"{candidates}"
        )
    raise UsageError(f"'{query}' is ambiguous: {candidates}")


def _resolve_gpu(client: JsonClient, query: str) -> str:
    return resolve_gpu(client.list_hardware(limit=500)["items"], query)


def _resolve_device(client: JsonClient, query: str) -> str:
    """``query`` as ``slug`` or ``slug/profile`` (one MIG slice, as recommend takes it): the
    part before ``/`` is resolved like --gpu, the profile is passed on for the server to check."""
    name, slash, profile = query.partition("/")
    slug = _resolve_gpu(client, name)
    return f"{slug}/{profile.strip()}" if slash else slug


# What each precision needs of a GPU: the lowest compute capability with hardware for its
# dtypes, and the peaks its math can run at. The server's rule (app.domain.precision.cannot_run),
# restated because the CLI runs without the server's packages; a test checks the two agree.
PRECISION_NEEDS: dict[str, tuple[tuple[int, int] | None, tuple[str, ...]]] = {
    "fp32": (None, ("fp32",)),
    "tf32": ((8, 0), ("tf32",)),
    "bf16": ((8, 0), ("bf16",)),
    "fp16": (None, ("fp16",)),
    "amp_bf16": ((8, 0), ("bf16",)),
    "amp_fp16": (None, ("fp16",)),
    "mixed_bf16": ((8, 0), ("bf16",)),
    "mixed_fp16": (None, ("fp16",)),
    "fp8": ((8, 9), ("fp8",)),
    "int8": (None, ("int8",)),
    "int8_weight_only": (None, ("fp16", "bf16")),
    "int4": (None, ("fp16", "bf16")),
    "fp4": ((10, 0), ("fp4",)),
}


def runs_precision(item: Json, precision: str) -> bool:
    """Whether a listed hardware item can run ``precision``: its compute capability is high
    enough and its peak table lists one of the precision's compute dtypes (the server's rule
    for the MIG fit's larger GPUs)."""
    needs = PRECISION_NEEDS.get(precision)
    if needs is None:
        return True  # a precision this CLI does not know: the server decides
    lowest, dtypes = needs
    text = item.get("compute_capability")
    if lowest is not None and text:
        major, _, minor = str(text).partition(".")
        if major.isdigit() and minor.isdigit() and (int(major), int(minor)) < lowest:
            return False
    return any(dtype in (item.get("peak_flops_per_s") or {}) for dtype in dtypes)


# -- commands ----------------------------------------------------------------------------------


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


def _mig_capable(item: Json) -> bool:
    """A hardware item (``mig``) or a server-listed larger GPU (``mig_capable``)."""
    return bool(item["mig_capable"]) if "mig_capable" in item else item.get("mig") is not None


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


def _with(args: argparse.Namespace, **changes: Any) -> argparse.Namespace:
    return argparse.Namespace(**{**vars(args), **changes})


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


def _load_json(path: str) -> Json:
    try:
        loaded = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise UsageError(f"cannot read {path} as JSON: {exc}") from exc
    if not isinstance(loaded, dict):
        raise UsageError(f"{path} must hold a JSON object")
    return loaded


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


def _prices(values: list[str]) -> dict[str, float]:
    prices: dict[str, float] = {}
    for value in values:
        slug, _, price = value.partition("=")
        try:
            prices[slug] = float(price)
        except ValueError:
            raise UsageError(f"--price {value!r}: expected SLUG=USD_PER_HOUR") from None
    return prices


def _calibration(values: list[str]) -> dict[str, dict[str, float]]:
    calibration: dict[str, dict[str, float]] = {}
    for value in values:
        key, _, number = value.partition("=")
        kind, _, field = key.partition(".")
        if kind not in CALIBRATION_CLASSES or field not in CALIBRATION_FIELDS:
            raise UsageError(
                f"--calibration {value!r}: expected KIND.FIELD=VALUE, KIND one of "
                f"{', '.join(CALIBRATION_CLASSES)}, FIELD one of {', '.join(CALIBRATION_FIELDS)}"
            )
        try:
            calibration.setdefault(kind, {})[field] = float(number)
        except ValueError:
            raise UsageError(f"--calibration {value!r}: {number!r} is not a number") from None
    return calibration


def _check_decoder_serving(args: argparse.Namespace) -> None:
    """The request's rules between decoder-serving flags, checked before anything is sent."""
    for mean, longest in (("prompt_tokens_mean", "prompt_tokens"),
                          ("generated_tokens_mean", "generated_tokens")):  # fmt: skip
        value, maximum = getattr(args, mean), getattr(args, longest)
        if value is not None and maximum is not None and value > maximum:
            raise UsageError(
                f"--{mean.replace('_', '-')} {value} exceeds --{longest.replace('_', '-')} "
                f"{maximum}, the maximum"
            )
    if args.kv_block_tokens is not None and args.batching != "continuous":
        raise UsageError(
            "--kv-block-tokens sizes the paged KV cache of --batching continuous; static "
            "batching reserves the whole padded context"
        )
    if args.beams_share_prompt is not None and args.batching != "continuous":
        raise UsageError(
            "--beams-copy-prompt is about the paged KV cache of --batching continuous; static "
            "batching gives every beam its own padded copy of the prompt"
        )


def _recommend_body(args: argparse.Namespace) -> Json:
    _check_decoder_serving(args)
    payload: Json = {"model": args.model, "objective": args.objective}
    for key, value in (
        ("batch_sizes", args.batch),
        ("max_batch_size", args.max_batch),
        ("precisions", args.precision),
        ("latency_slo_ms", args.slo_ms),
        ("slo_margin", args.slo_margin),
        ("scenario", args.scenario),
        ("serving_runtime", args.serving_runtime),
        ("tensor_parallel_max", args.tensor_parallel_max),
        ("parallelism", args.parallelism),
        ("pipeline_parallel_max", args.pipeline_parallel_max),
        ("price_kind", args.price_kind),
        ("throughput_target_per_s", args.target),
        ("devices", args.devices.split(",") if args.devices else None),
        ("sequence_length", args.seq),
        ("tokens_mean", args.tokens_mean),
        ("image_size", args.image),
        ("prompt_tokens", args.prompt_tokens),
        ("generated_tokens", args.generated_tokens),
        ("prompt_tokens_mean", args.prompt_tokens_mean),
        ("generated_tokens_mean", args.generated_tokens_mean),
        ("batching", args.batching),
        ("beam_width", args.beam_width),
        ("kv_block_tokens", args.kv_block_tokens),
        ("beams_share_prompt", args.beams_share_prompt),
        ("fuse_elementwise", args.fuse),
        ("limit", args.limit),
    ):
        if value is not None:
            payload[key] = value
    if args.bind:
        payload["bindings"] = _bindings(args.bind)
    if args.price:
        payload["prices_usd_per_hour"] = _prices(args.price)
    if args.calibration:
        payload["calibration"] = _calibration(args.calibration)
    return payload


def ranking_column(result: Json) -> tuple[str, str]:
    """The candidate field the server ranks by and its column header (recommend.py's
    ``_objective_key``: fleet $/h with a throughput target, else $/M; J; latency)."""
    objective = result["objective"]
    if objective == "cost":
        if result.get("throughput_target_per_s") is not None:
            return "fleet_cost_usd_per_hour", "fleet $/h"
        return "cost_usd_per_million", "$/M"
    if objective == "energy":
        return "energy_j_per_inference", "J/inf"
    return "latency_ms", "latency ms"


def cmd_recommend(client: JsonClient, args: argparse.Namespace, out: TextIO) -> int:
    payload = _recommend_body(args)
    result = wait_with_progress(
        "ranking devices", lambda: client.recommend_inference(payload), sys.stderr
    )
    candidates = result["candidates"]
    # a tensor-parallel group ("slug x4") is charted as the GPU it is made of
    chosen = list(dict.fromkeys(c["device"].split(" x")[0] for c in candidates[:4]))
    if args.svg and chosen:
        Path(args.svg).write_text(client.roofline_svg(args.model, chosen), encoding="utf-8")
    verdict = EXIT_OK if result["eligible_candidates"] else EXIT_VERDICT_NO
    if args.json:
        out.write(_dump(result) + "\n")
        return verdict
    out.write(result["recommendation"] + "\n\n")
    workload = result["workload"]
    out.write(_echo(workload["bindings"], workload["defaults_used"], workload["attention"]))
    serving = decoder_serving_line(workload)
    out.write((f"decoder serving: {serving}\n" if serving else "") + "\n")
    out.write(recommendation_table(result) + "\n")
    groups = pipeline_lines(result["candidates"])
    if groups:
        out.write("\npipeline groups (--json has every stage and phase):\n" + groups + "\n")
    out.write(
        f"\n{result['eligible_candidates']} of {result['total_candidates']} candidates eligible; "
        f"{len(result['excluded'])} device/precision pairs excluded (--json lists why)\n"
    )
    out.write(f"$/M: {result['price_kind']} prices only")
    budget, margin = result.get("latency_budget_ms"), result.get("slo_margin")
    if budget is not None and margin is not None:
        out.write(f"; SLO met at <= {budget:.4g} ms ({margin:.0%} margin)")
    out.write("\n")
    if args.svg:
        written = f"written to {args.svg}" if chosen else "not written: no candidates"
        out.write(f"roofline of the top devices {written}\n")
    return verdict


def decoder_serving_line(workload: Json) -> str | None:
    """How a decoder's requests are served, in one line (None for other models)."""
    if not workload.get("decoder") or workload.get("batching") is None:
        return None
    continuous = workload["batching"] == "continuous"
    parts = [f"{workload['batching']} batching"]
    for what in ("prompt", "generated"):
        mean, maximum = workload.get(f"{what}_tokens_mean"), workload.get(f"{what}_tokens")
        if mean is None or mean == maximum:
            parts.append(f"{what} {maximum} tokens")
        else:
            priced = "priced at the mean" if continuous else "padded to the maximum"
            parts.append(f"{what} mean {mean} / max {maximum} tokens ({priced})")
    beams = workload.get("beam_width") or 1
    if beams > 1:
        parts.append(f"beam search, {beams} beams per request")
    if continuous and workload.get("kv_block_tokens"):
        parts.append(f"paged KV cache in blocks of {workload['kv_block_tokens']} tokens")
    if continuous and beams > 1 and workload.get("beams_share_prompt") is not None:
        parts.append(
            "the beams share the prompt's KV cache"
            if workload["beams_share_prompt"]
            else "every beam holds its own copy of the prompt's KV cache"
        )
    return "; ".join(parts)


def pipeline_lines(candidates: list[Json]) -> str:
    """One line per pipeline-parallel candidate: stages, micro-batches, the link, and per
    phase the steady-state idle share and the GPipe bubble of a lone batch."""
    lines = []
    for c in candidates:
        pipeline = c.get("pipeline")
        if not pipeline:
            continue
        sizes = [stage["blocks"] for stage in pipeline["stage_layout"]]
        blocks = (
            f"{sizes[0]} blocks each"
            if len(set(sizes)) == 1
            else ("+".join(map(str, sizes)) + " blocks")
        )
        idle = ", ".join(
            f"{phase['name']} {phase['idle_fraction']:.1%}" for phase in pipeline["phases"]
        )
        bubble = max(phase["gpipe_bubble_fraction"] for phase in pipeline["phases"])
        lines.append(
            f"  #{c['rank']} {c['device']}: {pipeline['stages']} stages of {blocks}, "
            f"{pipeline['micro_batches']} micro-batches of {pipeline['micro_batch_size']}, "
            f"{pipeline['link_bytes_per_s'] / 1e9:,.0f} GB/s between stages; idle {idle}; "
            f"GPipe bubble {bubble:.0%} for a lone batch"
        )
    return "\n".join(lines)


def _value(candidate: Json, key: str) -> Any:
    """A candidate field; ``block.field`` reads a nested one (None when the block is)."""
    block, _, field = key.partition(".")
    if not field:
        return candidate.get(key)
    return (candidate.get(block) or {}).get(field)


def recommendation_table(result: Json) -> str:
    """The ranked candidates with the column they are ranked by (and, for decoders, the
    time to first token, per-token latency and tokens per second; with continuous batching
    the concurrent requests and the most whose KV cache fits)."""
    key, header = ranking_column(result)
    decoder = bool(result["workload"].get("decoder"))
    continuous = decoder and result["workload"].get("batching") == "continuous"
    columns: list[tuple[str, str]] = [
        ("rank", "#"), ("device", "device"), ("precision", "precision"),
        ("batch_size", "concurrent" if continuous else "batch"),
    ]  # fmt: skip
    if continuous:
        columns.append(("decoder_serving.max_concurrent_requests", "max (KV)"))
    columns.append(("latency_ms", "latency ms"))
    if decoder:
        columns += [("time_to_first_token_ms", "TTFT ms"), ("per_token_latency_ms", "ms/token"),
                    ("tokens_per_s", "tokens/s")]  # fmt: skip
    columns += [("throughput_per_s", "seq/s" if decoder else "per s"),
                ("devices_needed", "devices"), ("cost_usd_per_million", "$/M")]  # fmt: skip
    if key not in {k for k, _ in columns}:
        columns.append((key, header))
    columns += [("bound", "bound"), ("fits_in_memory", "fits")]
    rows = [
        [_value(c, k) for k, _ in columns]
        + ["yes" if c["eligible"] else "; ".join(c["reasons"])[:40]]
        for c in result["candidates"]
    ]
    headers = [f"{h} (ranked)" if k == key else h for k, h in columns] + ["eligible"]
    return table(rows, headers) + f"\nranked: eligible first, then by {header} (ascending)"


def cmd_health(client: JsonClient, args: argparse.Namespace, out: TextIO) -> int:
    ready = client.ready()
    out.write(json.dumps(ready, indent=2) + "\n" if args.json else f"{ready['status']}\n")
    return EXIT_OK


# -- parser ------------------------------------------------------------------------------------


def _global_options(parser: argparse.ArgumentParser) -> None:
    """--url, --token, --json, --timeout: on the top parser and on every subcommand, with
    SUPPRESS defaults so a value given before the subcommand is not reset after it."""
    quiet = argparse.SUPPRESS
    parser.add_argument("--json", action="store_true", default=quiet,
                        help="print the raw JSON answer")  # fmt: skip
    parser.add_argument("--url", default=quiet, help="server URL (CAPPLAN_URL)")
    parser.add_argument("--token", "--api-key", dest="token", default=quiet,
                        help="API key (CAPPLAN_TOKEN or CAPPLAN_API_KEY)")  # fmt: skip
    parser.add_argument("--timeout", type=float, default=quiet,
                        help="seconds to wait for an answer (default 60)")  # fmt: skip


def _workload_args(parser: argparse.ArgumentParser, *, model: bool = True) -> None:
    if model:
        parser.add_argument("model", help="model slug (capplan models list lists them)")
    group = parser.add_argument_group("workload (left out: the server's default table)")
    group.add_argument("--mode", choices=["training", "inference"], default="inference")
    group.add_argument("--batch", type=int, default=1, help="batch size (per optimizer step)")
    group.add_argument("--micro-batch", type=int, help="batch per forward pass; divides --batch")
    group.add_argument(
        "--precision",
        choices=PRECISIONS,
        help="default: bf16 inference / amp_bf16 training on CUDA, fp32 on CPU",
    )
    group.add_argument("--seq", type=int, help="sequence length (binds seq)")
    group.add_argument("--image", type=int, help="image size (binds image)")
    group.add_argument("--bind", action="append", metavar="NAME=N",
                       help="another symbolic dim (repeat)")  # fmt: skip
    group.add_argument("--optimizer", choices=OPTIMIZERS, help="training (default adamw)")
    group.add_argument("--optimizer-impl", choices=OPTIMIZER_IMPLS, help="default auto")
    group.add_argument("--checkpointing", choices=CHECKPOINTING,
                       help="activation checkpointing (default none)")  # fmt: skip
    group.add_argument(
        "--attention",
        choices=ATTENTIONS,
        help="attention implementation (default: PyTorch SDPA's choice)",
    )
    group.add_argument("--logits", choices=LOGITS, help="decoder inference (default last)")
    group.add_argument("--kv-cache", action=argparse.BooleanOptionalAction, default=None,
                       help="inference: the KV cache of decoders (default on)")  # fmt: skip
    group.add_argument("--fp32-grad-buffer", action="store_true",
                       help="mixed_* precisions: keep an fp32 gradient buffer")  # fmt: skip
    group.add_argument("--dp", type=int, help="data-parallel degree")
    group.add_argument("--tp", type=int, help="tensor-parallel degree")
    group.add_argument("--pp", type=int, help="pipeline-parallel degree")
    group.add_argument("--zero", type=int, choices=[0, 1, 2, 3], help="ZeRO stage (3: FSDP)")
    group.add_argument("--grad-bucket-view", action=argparse.BooleanOptionalAction, default=None,
                       help="DDP gradient_as_bucket_view (default off)")  # fmt: skip


def _estimate_args(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("device and overheads")
    group.add_argument("--runtime", choices=RUNTIMES, help="default: from the hardware kind")
    group.add_argument("--safety-margin", type=float, metavar="FRACTION",
                       help="reserve in the fit check (default 0.05)")  # fmt: skip
    group.add_argument("--cuda-context", type=int, metavar="BYTES", help="CUDA context [B]")
    group.add_argument("--workspace", type=int, metavar="BYTES", help="cuBLAS workspace [B]")
    group.add_argument("--fragmentation", type=float, metavar="FRACTION",
                       help="a fixed reserve instead of the allocator replay")  # fmt: skip
    group.add_argument("--round-allocations", action=argparse.BooleanOptionalAction,
                       default=None, help="replay the caching allocator (default on)")  # fmt: skip
    group.add_argument(
        "--expandable-segments",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="PYTORCH_CUDA_ALLOC_CONF expandable segments",
    )


def build_parser() -> argparse.ArgumentParser:
    """The capplan argument parser."""
    common = argparse.ArgumentParser(add_help=False)
    _global_options(common)
    parser = argparse.ArgumentParser(
        prog="capplan",
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _global_options(parser)
    parser.add_argument("--version", action="version", version=f"capplan {version()}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def command(name: str, help_text: str, into: Any = sub) -> argparse.ArgumentParser:
        made: argparse.ArgumentParser = into.add_parser(
            name, parents=[common], help=help_text, description=help_text, epilog=EPILOG,
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )  # fmt: skip
        return made

    estimate = command("estimate", "memory footprint of a model (exit 1: does not fit --gpu)")
    _workload_args(estimate)
    estimate.add_argument(
        "--gpu",
        help="also check the fit on this hardware (slug or name; slug/profile for a MIG slice)",
    )
    estimate.add_argument("--per-layer", action="store_true", help="include the per-layer view")
    _estimate_args(estimate)
    estimate.set_defaults(run=cmd_estimate)

    fit = command("fit", "which GPU or MIG profile holds a model (exit 1: none fits)")
    _workload_args(fit)
    fit.add_argument(
        "--gpu",
        required=True,
        help="hardware slug or name (h100-sxm, l4, ...); slug/profile names a MIG profile",
    )
    fit.add_argument("--profile", help="MIG: ask about this profile in particular")
    _estimate_args(fit)
    fit.set_defaults(run=cmd_fit)

    imports = command("import", "import a model").add_subparsers(
        dest="source", required=True, metavar="SOURCE"
    )
    onnx = command("onnx", "upload an ONNX file", imports)
    onnx.add_argument("file")
    onnx.add_argument("--lenient", action="store_true", help="import unsupported ops as opaque")
    hf = command("hf-config", "a Hugging Face config.json", imports)
    hf.add_argument("file")
    for made in (onnx, hf):
        made.add_argument("--slug", required=True)
        made.add_argument("--name")
        made.add_argument("--family")
        made.add_argument("--seq", type=int, help="default sequence length")
    onnx.set_defaults(run=cmd_import_onnx)
    hf.set_defaults(run=cmd_import_hf)
    traced = command("torch", "trace a PyTorch module locally (needs torch)", imports)
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

    models = command("models", "list, show or delete models")
    models.add_argument("action", choices=["list", "show", "delete"])
    models.add_argument("slug", nargs="?")
    models.add_argument("--family")
    models.add_argument("--provenance")
    models.set_defaults(run=cmd_models)

    hardware = command("hardware", "list or show hardware (show takes a slug or a name)")
    hardware.add_argument("action", choices=["list", "show"])
    hardware.add_argument("slug", nargs="?")
    hardware.add_argument("--kind", choices=DEVICE_KINDS)
    hardware.set_defaults(run=cmd_hardware)

    mig = command("mig", "MIG layouts: validate (exit 1: INVALID) or plan, from JSON files")
    mig.add_argument("action", choices=["validate", "plan"])
    mig.add_argument("file", help="request body as a JSON file")
    mig.add_argument("--config-name", help="plan: name of the mig-parted config")
    mig.add_argument("--cuda-context", type=int, metavar="BYTES", help="plan: CUDA context [B]")
    mig.add_argument("--safety-margin", type=float, metavar="FRACTION", help="plan: margin")
    mig.set_defaults(run=cmd_mig)

    workloads = command("workloads", "list or show workloads")
    workloads.add_argument("action", choices=["list", "show"])
    workloads.add_argument("slug", nargs="?")
    workloads.set_defaults(run=cmd_workloads)

    admission = command("admission", "admission check (exit 1: DENIED)")
    admission.add_argument(
        "target", metavar="FILE|MODEL",
        help="a POST /v1/admission/check body as a JSON file, or a model slug with the "
        "workload flags, --resource and --gpu",
    )  # fmt: skip
    admission.add_argument("--resource", help="nvidia.com/mig-1g.10gb or nvidia.com/gpu")
    admission.add_argument("--gpu", help="GPU model: hardware slug or name")
    admission.add_argument("--count", type=int, help="how many of the resource")
    _workload_args(admission, model=False)
    admission.set_defaults(run=cmd_admission)

    recommend = command(
        "recommend", "CPU vs GPU vs MIG slice for inference, ranked (exit 1: none eligible)"
    )
    recommend.add_argument("model", help="stored model slug")
    recommend.add_argument(
        "--batch", type=int, action="append", help="batch size to try (repeat; default: search)"
    )
    recommend.add_argument("--max-batch", type=int, help="largest batch the search tries")
    recommend.add_argument("--precision", action="append", choices=PRECISIONS, help="(repeat)")
    recommend.add_argument("--slo-ms", type=float, help="latency SLO [ms]")
    recommend.add_argument(
        "--slo-margin", type=float, help="headroom kept under --slo-ms, a fraction (default 0.1)"
    )
    recommend.add_argument(
        "--tensor-parallel-max",
        type=IntIn(1, MAX_GROUP_GPUS),
        metavar="GPUS",
        help="largest tensor-parallel group offered when a model fits no single GPU (1-8, "
        "default 8; 1: none)",
    )
    recommend.add_argument(
        "--parallelism",
        choices=PARALLELISMS,
        help="how GPUs are grouped when a model fits no single GPU: tensor (default), pipeline "
        "(layers split into stages) or both (also tensor x pipeline groups)",
    )
    recommend.add_argument(
        "--pipeline-parallel-max",
        type=IntIn(1, MAX_GROUP_GPUS),
        metavar="GPUS",
        help="most pipeline stages a group may have (1-8, default 8; 1: none)",
    )
    recommend.add_argument(
        "--serving-runtime",
        choices=SERVING_RUNTIMES,
        help="the framework serving the model on accelerators (default tensorrt)",
    )
    recommend.add_argument(
        "--scenario",
        choices=SCENARIOS,
        help="offline (default): batches back to back; server: Poisson arrivals, the rate whose "
        "p99 stays within --slo-ms (less its margin)",
    )
    recommend.add_argument("--target", type=float, help="throughput target [inferences/s]")
    recommend.add_argument("--devices", help="comma-separated slugs or slug/profile MIG slices")
    recommend.add_argument("--objective", choices=OBJECTIVES, default="cost")
    recommend.add_argument(
        "--price", action="append", metavar="SLUG=USD", help="price per hour (repeat)"
    )
    recommend.add_argument(
        "--price-kind",
        choices=PRICE_KINDS,
        help="the kind of price costs are ranked by (default on_demand); --price is of it",
    )
    recommend.add_argument(
        "--calibration", action="append", metavar="KIND.FIELD=VALUE",
        help="override a calibrated value, e.g. gpu.compute_efficiency=0.5 (repeat); KIND: "
        "gpu (every GPU), gpu_ampere, gpu_hopper (win over gpu), cpu (no AMX), cpu_amx "
        "(Intel AMX), edge, tpu",
    )  # fmt: skip
    recommend.add_argument("--seq", type=int, help="sequence length (encoders)")
    recommend.add_argument("--tokens-mean", type=int, help="encoders without padding: mean tokens")
    recommend.add_argument("--image", type=int, help="image size")
    recommend.add_argument("--bind", action="append", metavar="NAME=N", help="(repeat)")
    tokens = IntIn(1, MAX_TOKENS)
    decoders = recommend.add_argument_group("decoder LLMs (left out: the server's defaults)")
    decoders.add_argument(
        "--prompt-tokens",
        type=tokens,
        metavar="TOKENS",
        help="prompt length; with --prompt-tokens-mean the maximum (512)",
    )
    decoders.add_argument(
        "--generated-tokens",
        type=tokens,
        metavar="TOKENS",
        help="tokens generated; with --generated-tokens-mean the maximum (128)",
    )
    decoders.add_argument(
        "--prompt-tokens-mean",
        type=tokens,
        metavar="TOKENS",
        help="mean prompt length when prompts vary (default: the maximum)",
    )
    decoders.add_argument(
        "--generated-tokens-mean",
        type=tokens,
        metavar="TOKENS",
        help="mean tokens generated when outputs vary (default: the maximum)",
    )
    decoders.add_argument(
        "--batching",
        choices=BATCHINGS,
        help="static (default): padded batches run to their longest output; continuous: "
        "in-flight batching with a paged KV cache, the mean request priced",
    )
    decoders.add_argument("--beam-width", type=IntIn(1, MAX_BEAM_WIDTH), metavar="K",
                          help="beams per request, 1-16 (default 1)")  # fmt: skip
    decoders.add_argument(
        "--kv-block-tokens",
        type=IntIn(1, MAX_KV_BLOCK_TOKENS),
        metavar="TOKENS",
        help="--batching continuous: tokens per paged KV-cache block, 1-4096 (default 64)",
    )
    decoders.add_argument(
        "--beams-copy-prompt",
        dest="beams_share_prompt",
        action="store_const",
        const=False,
        default=None,
        help="--batching continuous with beams: every beam holds and reads its own copy of "
        "the prompt's KV cache, as Neural Speed does (default: the beams share it, as "
        "TensorRT-LLM and vLLM do)",
    )
    recommend.add_argument("--fuse", action=argparse.BooleanOptionalAction, default=None,
                           help="fuse elementwise layers into kernels (default on)")  # fmt: skip
    recommend.add_argument("--limit", type=int, default=10, help="rows to show")
    recommend.add_argument("--svg", help="also write the top devices' roofline SVG here")
    recommend.set_defaults(run=cmd_recommend)

    health = command("health", "is the server ready")
    health.set_defaults(run=cmd_health)
    return parser


def main(
    argv: Sequence[str] | None = None,
    *,
    http: httpx.Client | None = None,
    out: TextIO | None = None,
    err: TextIO | None = None,
) -> int:
    """Entry point of capplan; ``http`` lets tests pass a client bound to an app."""
    out = out or sys.stdout
    err = err or sys.stderr
    try:
        return _main(argv, http, out, err)
    except BrokenPipeError:
        # capplan ... | head: the reader left. Point stdout at /dev/null so the interpreter's
        # final flush does not raise again, and exit as a shell reports SIGPIPE.
        if out is sys.stdout:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
        return EXIT_BROKEN_PIPE


def _main(argv: Sequence[str] | None, http: httpx.Client | None, out: TextIO, err: TextIO) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help, --version (printed) or a usage error (2)
        sys.stdout.flush()  # inside main's BrokenPipeError guard: capplan --help | head -1
        return EXIT_OK if exc.code in (0, None) else EXIT_USAGE
    for name, default in (("json", False), ("url", None), ("token", None), ("timeout", 60.0)):
        if not hasattr(args, name):
            setattr(args, name, default)
    url = args.url or os.environ.get("CAPPLAN_URL", "http://127.0.0.1:8000")
    key = args.token or os.environ.get("CAPPLAN_TOKEN") or os.environ.get("CAPPLAN_API_KEY")
    client = JsonClient(url, api_key=key, timeout=args.timeout, http=http)
    try:
        code = int(args.run(client, args, out))
        out.flush()
        return code
    except UsageError as exc:
        err.write(f"capplan: {exc}\n")
        return EXIT_USAGE
    except ApiError as exc:
        err.write(f"error {exc.status}: {exc.detail}\n")
        for field in exc.errors[:20]:
            err.write(f"  {field.get('pointer', '')}: {field.get('message', '')}\n")
        return EXIT_API_ERROR
    except (httpx.HTTPError, json.JSONDecodeError) as exc:
        err.write(f"capplan: no answer from {url}: {type(exc).__name__}: {exc}\n")
        return EXIT_UNREACHABLE
    finally:
        if http is None:
            client.close()


if __name__ == "__main__":
    raise SystemExit(main())
