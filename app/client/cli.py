"""capplan: the Capacity Planner from a terminal (runs on httpx alone, no server code).

This module is the entry point: the argument parser and ``main``. The commands live in
``cli_estimate`` (estimate, fit), ``cli_recommend``, ``cli_imports``, ``cli_catalog``
(models, hardware, workloads, health) and ``cli_mig`` (MIG plans and layouts, admission),
over ``cli_requests`` (request bodies and the API's spellings), ``cli_devices`` (--gpu) and
``cli_output`` (tables, progress, exit codes). Names with a leading underscore are private to
the command line's modules.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import metadata
from typing import Any, TextIO

import httpx

from app.client.cli_catalog import cmd_hardware, cmd_health, cmd_models, cmd_workloads
from app.client.cli_estimate import cmd_estimate, cmd_fit
from app.client.cli_imports import cmd_import_hf, cmd_import_onnx, cmd_import_torch
from app.client.cli_mig import cmd_admission, cmd_mig
from app.client.cli_output import (
    EXIT_API_ERROR,
    EXIT_BROKEN_PIPE,
    EXIT_OK,
    EXIT_UNREACHABLE,
    EXIT_USAGE,
    EXIT_VERDICT_NO,
    UsageError,
)
from app.client.cli_recommend import cmd_recommend
from app.client.cli_requests import (
    ATTENTIONS,
    BATCHINGS,
    BNB_COMPUTE_DTYPES,
    CHECKPOINTING,
    DEVICE_KINDS,
    LOGITS,
    LORA_BIASES,
    LORA_KINDS,
    MAX_BEAM_WIDTH,
    MAX_GROUP_GPUS,
    MAX_KV_BLOCK_TOKENS,
    MAX_LOSS_CHUNKS,
    MAX_TOKENS,
    OBJECTIVES,
    OPTIMIZER_IMPLS,
    OPTIMIZERS,
    PARALLELISMS,
    PRECISIONS,
    PRICE_KINDS,
    QUANT_TYPES,
    RUNTIMES,
    SCENARIOS,
    SERVING_RUNTIMES,
)
from app.client.transport import ApiError, JsonClient

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


def version() -> str:
    """The installed package's version (the client package, else the whole service)."""
    for distribution in ("capacity-planner-client", "capacity-planner"):
        try:
            return metadata.version(distribution)
        except metadata.PackageNotFoundError:
            continue
    return "unknown (not installed)"


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
    tuning = parser.add_argument_group("training options (default off)")
    for flag, text in (
        ("--optimizer-in-backward", "the optimizer step fused into backward (gradients freed)"),
        ("--keep-gradients", "zero_grad(set_to_none=False): gradients kept between steps"),
        ("--activation-offload", "saved activations offloaded to pinned host memory (CUDA)"),
        ("--cpu-offload", "ZeRO-3 / FSDP (--zero 3): shards and optimizer on the host"),
        ("--compile", "torch.compile (Inductor): pointwise chains recomputed in backward"),
    ):
        tuning.add_argument(flag, action="store_true", help=text)
    tuning.add_argument("--loss-chunks", type=IntIn(1, MAX_LOSS_CHUNKS), metavar="N",
                        help="chunked cross-entropy over N chunks of tokens")  # fmt: skip
    tuning.add_argument("--tokens-per-batch", type=IntIn(1, MAX_TOKENS), metavar="N",
                        help="packed sequences: N tokens per micro-batch")  # fmt: skip
    lora = parser.add_argument_group(
        "LoRA / QLoRA (training; any of these adds the lora object, PEFT's defaults for the rest)"
    )
    lora.add_argument("--lora-r", type=int, metavar="R", help="LoRA rank (default 8)")
    lora.add_argument("--lora-alpha", type=int, metavar="ALPHA", help="lora_alpha (default 8)")
    lora.add_argument("--lora-target", action="append", metavar="NAME",
                      help="target module name (repeat): q_proj, c_attn, query, q ...")  # fmt: skip
    lora.add_argument("--lora-regex", metavar="REGEX", help="target modules by re.fullmatch")
    lora.add_argument("--lora-kind", choices=LORA_KINDS, help="target modules by kind")
    lora.add_argument("--lora-dropout", type=float, metavar="P", help="lora_dropout (default 0)")
    lora.add_argument("--lora-bias", choices=LORA_BIASES, help="trainable biases (default none)")
    lora.add_argument("--lora-save", action="append", metavar="NAME",
                      help="modules_to_save entry (repeat), e.g. lm_head")  # fmt: skip
    lora.add_argument("--dora", action="store_true", help="use_dora: DoRA's magnitude vector")
    lora.add_argument("--qlora", choices=QUANT_TYPES, metavar="{nf4,fp4}",
                      help="a 4-bit bitsandbytes base of this bnb_4bit_quant_type")  # fmt: skip
    lora.add_argument("--double-quant", action="store_true",
                      help="QLoRA: bnb_4bit_use_double_quant")  # fmt: skip
    lora.add_argument("--bnb-compute-dtype", choices=BNB_COMPUTE_DTYPES,
                      help="QLoRA: bnb_4bit_compute_dtype (default fp32)")  # fmt: skip


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
