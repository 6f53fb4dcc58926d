"""Request bodies from the command line: the workload, the memory estimate's options, and
the API's enumerations and bounds spelled here so that capplan needs no server code.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from app.client.cli_output import UsageError
from app.client.transport import Json

# The API's enumerations, spelled here so that the CLI needs no server code
# (tests/test_capplan.py checks them against app.domain).
PRECISIONS = ("fp32", "tf32", "bf16", "fp16", "amp_bf16", "amp_fp16", "mixed_bf16",
              "mixed_fp16", "fp8", "int8", "int8_weight_only", "int4", "fp4")  # fmt: skip
OPTIMIZERS = ("sgd", "sgd_momentum", "adam", "adamw", "adagrad", "rmsprop", "lion", "adam_8bit",
              "adafactor", "adamw_8bit", "paged_adamw_8bit", "paged_adamw_32bit")  # fmt: skip
OPTIMIZER_IMPLS = ("auto", "for_loop", "foreach", "fused")
CHECKPOINTING = ("none", "selective", "full")
LORA_KINDS = ("attention", "mlp", "all-linear")
LORA_BIASES = ("none", "all", "lora_only")
QUANT_TYPES = ("nf4", "fp4")
BNB_COMPUTE_DTYPES = ("fp32", "bf16", "fp16")
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
MAX_LOSS_CHUNKS = 65_536  # the workload's loss_chunks (tokens_per_batch: MAX_TOKENS)


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
    for key in ("optimizer_in_backward", "keep_gradients", "activation_offload", "compile"):
        if getattr(args, key, False):
            spec[key] = True
    for key in ("loss_chunks", "tokens_per_batch"):
        if getattr(args, key, None) is not None:
            spec[key] = getattr(args, key)
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
            ("cpu_offload", getattr(args, "cpu_offload", False) or None),
        )
        if value is not None
    }
    if parallelism:
        spec["parallelism"] = parallelism
    lora = _lora(args)
    if lora is not None:
        spec["lora"] = lora
    return spec


def _lora(args: argparse.Namespace) -> Json | None:
    """The workload's ``lora`` object from the --lora-* / --dora / --qlora flags (None when
    none is given); a QLoRA flag without --qlora is a usage error."""
    lora: Json = {
        key: value
        for key, value in (
            ("r", getattr(args, "lora_r", None)),
            ("alpha", getattr(args, "lora_alpha", None)),
            ("target_modules", getattr(args, "lora_target", None)),
            ("target_regex", getattr(args, "lora_regex", None)),
            ("target_kind", getattr(args, "lora_kind", None)),
            ("dropout", getattr(args, "lora_dropout", None)),
            ("bias", getattr(args, "lora_bias", None)),
            ("modules_to_save", getattr(args, "lora_save", None)),
        )
        if value is not None
    }
    if getattr(args, "dora", False):
        lora["use_dora"] = True
    quant = getattr(args, "qlora", None)
    double = getattr(args, "double_quant", False)
    compute = getattr(args, "bnb_compute_dtype", None)
    if quant is None and (double or compute is not None):
        raise UsageError(
            "--double-quant and --bnb-compute-dtype describe a QLoRA base: add --qlora"
        )
    if quant is not None:
        qlora: Json = {"bnb_4bit_quant_type": quant}
        if double:
            qlora["bnb_4bit_use_double_quant"] = True
        if compute is not None:
            qlora["bnb_4bit_compute_dtype"] = compute
        lora["qlora"] = qlora
    return lora or None


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


def _with(args: argparse.Namespace, **changes: Any) -> argparse.Namespace:
    return argparse.Namespace(**{**vars(args), **changes})


def _load_json(path: str) -> Json:
    try:
        loaded = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise UsageError(f"cannot read {path} as JSON: {exc}") from exc
    if not isinstance(loaded, dict):
        raise UsageError(f"{path} must hold a JSON object")
    return loaded
