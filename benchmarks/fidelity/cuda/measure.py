"""Measure what PyTorch reports on a CUDA device for inference and training steps.

Run on a machine with a GPU, PyTorch and Transformers (nothing is downloaded: models are built
from configs with random weights), from the repository root::

    python benchmarks/fidelity/cuda/measure.py --out $OUT/cuda_measurements.json --budget-s 540

For every configuration: a warm-up step, then two steady steps; before each step
``torch.cuda.reset_peak_memory_stats()``, after it ``torch.cuda.synchronize()`` and the reads:
``max_memory_allocated``, ``max_memory_reserved``, a subset of ``memory_stats()``, and the
process's device memory beyond the reservation (``mem_get_info`` used minus
``memory_reserved``: the CUDA context and libraries, assuming no other process on the GPU).
Between configurations every tensor is freed, ``empty_cache()`` and the cuBLAS workspaces are
cleared, so each starts from the same state (recorded as ``before``). The JSON is rewritten
(atomically) after every configuration, so a run cut short keeps what it measured.
``compare.py`` (the service's venv) compares the estimates with these records.

``--smoke`` runs tiny configurations on the CPU to check the code paths (CUDA figures null).
``--isolate`` runs every configuration in its own subprocess (a fresh CUDA context each).
``--probes`` also runs ``probes.py`` first, in its own process (written to ``--probes-out``).
"""

from __future__ import annotations

import time

STARTED = time.monotonic()  # the budget counts the imports (torch, transformers) too

import argparse  # noqa: E402
import functools  # noqa: E402
import gc  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import platform  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import traceback  # noqa: E402
from collections.abc import Iterator, Sequence  # noqa: E402
from contextlib import AbstractContextManager, nullcontext  # noqa: E402
from dataclasses import asdict, dataclass  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

HERE = Path(__file__).resolve().parent


def _load_peft_wheels() -> Any:
    """This folder's peft_wheels.py (torch-free), loaded by path: ``measure`` must stay the
    CPU harness's module below."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("peft_wheels", HERE / "peft_wheels.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# --suite peft: peft, accelerate and bitsandbytes unpacked from wheels/ before transformers is
# imported (it decides at import whether they are installed)
PEFT_WHEELS = _load_peft_wheels().early(sys.argv, HERE / "wheels")

# benchmarks/fidelity: the CPU harness's models and helpers. Inserted first, so ``measure``
# below is the CPU harness's module, not this file.
sys.path.insert(0, str(HERE.parent))

import torch  # noqa: E402
import transformers  # noqa: E402
from measure import (  # noqa: E402
    HF_FAMILIES,
    LOSS_DESCRIPTION,
    Config,
    forward,
    make_batch,
    make_optimizer,
    training_loss,
)
from models import build_model, count_params  # noqa: E402
from torch import Tensor, nn  # noqa: E402

sys.path.insert(0, str(HERE))  # this folder's peft_suite (after the CPU harness's modules)
import peft_suite  # noqa: E402
from peft_suite import BNB_OPTIMIZERS, Options  # noqa: E402

HF_FAMILIES.setdefault("llama_tiny", "causal_lm")  # the peft suite's --smoke decoder

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
STAT_KEYS = (
    "allocated_bytes.all.peak",
    "requested_bytes.all.peak",
    "reserved_bytes.all.peak",
    "active_bytes.all.peak",
    "inactive_split_bytes.all.peak",
    "segment.all.peak",
    "segment.large_pool.peak",
    "segment.small_pool.peak",
    "segment.all.current",
    "num_alloc_retries",
    "num_ooms",
    "num_device_alloc",
    "num_device_free",
)
STEADY_STEPS = 2
TRANSFORMERS = ("bert_base", "vit_b16", "gpt2_small", "llama2_7b", "llama3_8b")
DECODERS = ("gpt2_small", "llama2_7b", "llama3_8b")
# Forward GFLOPs of one 224 px image (for the cost order only).
CNN_GFLOPS = {"resnet50": 8.2, "mobilenet_v2": 0.6, "alexnet": 1.4, "vgg16": 31.0}


@dataclass(frozen=True)
class CudaConfig:
    """A CPU-harness ``Config`` plus what only the CUDA runs vary."""

    base: Config
    amp: bool = False  # fp32 weights, forward + loss under autocast(cuda, bfloat16)
    checkpointing: bool = False  # HF gradient_checkpointing_enable(); CNNs: checkpoint per block
    options: Options | None = None  # --suite peft: LoRA / QLoRA and the training options

    @property
    def key(self) -> str:
        """The CPU key plus ``amp_bf16``, ``ckpt`` and the peft suite's tags where they apply."""
        extra = (["amp_bf16"] if self.amp else []) + (["ckpt"] if self.checkpointing else [])
        extra += self.options.tags() if self.options is not None else []
        return "|".join([self.base.key, *extra])

    @property
    def qlora(self) -> peft_suite.Qlora | None:
        """The 4-bit base, if the configuration has one."""
        lora = self.options.lora if self.options is not None else None
        return lora.qlora if lora is not None else None


# ----------------------------------------------------------------------------- configurations


def _cfg(model: str, mode: str, batch: int, **kw: Any) -> CudaConfig:
    amp = kw.pop("amp", False)
    ckpt = kw.pop("checkpointing", False)
    options = kw.pop("options", None)
    if model in (*TRANSFORMERS, "llama_tiny"):
        kw.setdefault("attn", "sdpa")
    if model in ("resnet50", "mobilenet_v2", "alexnet", "vgg16", "vit_b16"):
        kw.setdefault("image_size", 224)
    return CudaConfig(
        Config(model, mode, batch, **kw), amp=amp, checkpointing=ckpt, options=options
    )


def _smoke_configs() -> list[CudaConfig]:
    """Tiny configurations through every code path, small enough for a CPU."""
    return [
        _cfg("lstm_classifier", "inference", 2, seq_len=8),
        _cfg("lstm_classifier", "inference", 2, seq_len=8, grad_mode="inference_mode"),
        _cfg("lstm_classifier", "training", 2, optimizer="adamw_fused", seq_len=8),
        _cfg("mobilenet_v2", "training", 2, optimizer="sgd", image_size=64, checkpointing=True),
        _cfg(
            "resnet50", "training", 2, optimizer="adamw_foreach", image_size=64, checkpointing=True
        ),
        _cfg("resnet50", "inference", 1, image_size=64, dtype="bf16"),
        _cfg("gpt2_small", "inference", 1, seq_len=8, layers=1, use_cache=True),
        _cfg("gpt2_small", "inference", 1, seq_len=8, layers=1, use_cache=False, dtype="bf16"),
        _cfg("gpt2_small", "training", 1, seq_len=8, layers=1, optimizer="adamw_foreach", amp=True),
        _cfg("bert_base", "training", 1, seq_len=8, layers=1, optimizer="sgd", checkpointing=True),
        _cfg("vit_b16", "training", 1, layers=1, optimizer="sgd_momentum", attn="eager"),
        _cfg("llama3_8b", "inference", 1, seq_len=8, layers=1, use_cache=True, dtype="bf16"),
    ]


def _cnn_configs() -> Iterator[CudaConfig]:
    for model in ("resnet50", "mobilenet_v2", "alexnet", "vgg16"):
        for batch in (1, 8, 32):
            for dtype in ("fp32", "bf16"):
                yield _cfg(model, "inference", batch, dtype=dtype)
        yield _cfg(model, "inference", 8, grad_mode="inference_mode")
        for batch in (8, 32):
            for optimizer in ("sgd", "sgd_momentum", "adamw_foreach", "adamw_fused"):
                yield _cfg(model, "training", batch, optimizer=optimizer)
            yield _cfg(model, "training", batch, optimizer="adamw_foreach", amp=True)
            if model in ("resnet50", "mobilenet_v2"):  # torch.utils.checkpoint per block
                yield _cfg(model, "training", batch, optimizer="adamw_foreach", checkpointing=True)
    for batch in (8, 32):
        yield _cfg("lstm_classifier", "inference", batch, seq_len=128)
        for optimizer in ("sgd_momentum", "adamw_foreach"):
            yield _cfg("lstm_classifier", "training", batch, optimizer=optimizer, seq_len=128)
    yield _cfg("lstm_classifier", "training", 32, optimizer="adamw_fused", seq_len=128)


def _encoder_configs() -> Iterator[CudaConfig]:
    for model, shape in (("bert_base", {"seq_len": 128}), ("vit_b16", {})):
        for batch in (1, 4, 16):
            for dtype in ("fp32", "bf16"):
                yield _cfg(model, "inference", batch, dtype=dtype, **shape)
            for optimizer in ("sgd", "sgd_momentum", "adamw_foreach", "adamw_fused"):
                yield _cfg(model, "training", batch, optimizer=optimizer, **shape)
            yield _cfg(model, "training", batch, optimizer="adamw_foreach", amp=True, **shape)
            yield _cfg(
                model, "training", batch, optimizer="adamw_foreach", checkpointing=True, **shape
            )
        yield _cfg(model, "inference", 4, grad_mode="inference_mode", **shape)
        yield _cfg(model, "inference", 4, attn="eager", **shape)
        yield _cfg(model, "training", 4, optimizer="adamw_foreach", attn="eager", **shape)
    for batch in (1, 4):  # BERT at sequence 512
        yield _cfg("bert_base", "inference", batch, seq_len=512)
        yield _cfg("bert_base", "training", batch, optimizer="adamw_foreach", seq_len=512)
        yield _cfg("bert_base", "training", batch, optimizer="adamw_foreach", seq_len=512, amp=True)


def _decoder_configs() -> Iterator[CudaConfig]:
    """GPT-2 small, and Llama-2-7B (MHA) and Llama-3-8B (GQA, 8 KV heads) widths at 2 layers."""
    for model in DECODERS:
        dec: dict[str, Any] = {"layers": None if model == "gpt2_small" else 2}
        for batch in (1, 4, 16):
            for seq in (128, 512):
                for dtype in ("fp32", "bf16"):
                    for cache in (False, True):
                        yield _cfg(
                            model, "inference", batch, seq_len=seq, dtype=dtype, use_cache=cache,
                            **dec,
                        )  # fmt: skip
                yield _cfg(model, "training", batch, seq_len=seq, optimizer="adamw_foreach", **dec)
                yield _cfg(
                    model, "training", batch, seq_len=seq, optimizer="adamw_foreach", amp=True,
                    **dec,
                )  # fmt: skip
        big: dict[str, Any] = {"seq_len": 512, **dec}
        for optimizer in ("sgd", "sgd_momentum", "adamw_fused"):
            yield _cfg(model, "training", 4, optimizer=optimizer, **big)
        yield _cfg(model, "training", 4, optimizer="adamw_foreach", checkpointing=True, **big)
        yield _cfg(model, "training", 4, optimizer="adamw_fused", amp=True, **big)
        yield _cfg(model, "training", 4, optimizer="adamw_foreach", dtype="bf16", **big)
        yield _cfg(model, "training", 4, optimizer="adamw_foreach", attn="eager", **big)
        yield _cfg(model, "inference", 4, use_cache=True, attn="eager", **big)
        yield _cfg(model, "inference", 4, use_cache=False, attn="eager", **big)
        yield _cfg(model, "inference", 4, use_cache=True, grad_mode="inference_mode", **big)


@functools.cache
def _params(model: str, layers: int | None) -> int:
    """Parameter count from a meta-device build (cheap; for the cost order)."""
    if model == "llama_tiny":
        return 300_000
    return count_params(build_model(model, layers=layers, device="meta"))


def estimated_seconds(cfg: CudaConfig) -> float:
    """Rough wall time of one configuration on an H100 (build + copy + 4 passes)."""
    base = cfg.base
    params = _params(base.model, base.layers)
    build = 0.3 + params * 4 / (1.0e9 if base.model in ("llama2_7b", "llama3_8b") else 3e8)
    if base.model in CNN_GFLOPS:
        flops = CNN_GFLOPS[base.model] * 1e9 * base.batch
    elif base.model == "lstm_classifier":
        flops = 1e9 * base.batch
    else:
        tokens = base.batch * (197 if base.model == "vit_b16" else (base.seq_len or 128))
        flops = 2.0 * params * tokens
    if base.mode == "training":
        flops *= 3
    if base.mode == "training" and cfg.checkpointing:
        flops *= 4 / 3
    rate = 1.5e14 if (cfg.amp or base.dtype == "bf16") else 2.5e13
    return (
        build
        + (STEADY_STEPS + 2) * flops / rate
        + 0.2
        + peft_suite.extra_seconds(cfg.options, params, base.optimizer)
    )


def configs(smoke: bool = False, suite: str = "base") -> list[CudaConfig]:
    """Every configuration of the suite, cheapest first, so a budget cut keeps a useful set."""
    if suite == "peft":
        specs = peft_suite.peft_specs(smoke)
        chosen = [_cfg(m, mode, b, options=o, **dict(kw)) for m, mode, b, kw, o in specs]
        unique = {c.key: c for c in chosen}
        assert len(unique) == len(chosen), "duplicate keys in the peft suite"
        return chosen if smoke else sorted(unique.values(), key=estimated_seconds)
    if smoke:
        return _smoke_configs()
    found: dict[str, CudaConfig] = {}
    for cfg in (*_cnn_configs(), *_encoder_configs(), *_decoder_configs()):
        found.setdefault(cfg.key, cfg)
    return sorted(found.values(), key=estimated_seconds)


# ------------------------------------------------------------------------------------ device


def _cuda() -> bool:
    return torch.cuda.is_available()


def _device() -> torch.device:
    return torch.device("cuda" if _cuda() else "cpu")


def _sync() -> None:
    if _cuda():
        torch.cuda.synchronize()


def clean_slate() -> dict[str, int | None]:
    """Free what can be freed; return allocated/reserved afterwards (to prove the clean start)."""
    gc.collect()
    if not _cuda():
        return {"allocated": None, "reserved": None}
    torch.cuda.synchronize()
    clear = getattr(torch._C, "_cuda_clearCublasWorkspaces", None)
    if clear is not None:
        clear()
    torch.cuda.empty_cache()
    torch.cuda.synchronize()
    return {"allocated": torch.cuda.memory_allocated(), "reserved": torch.cuda.memory_reserved()}


def read_step() -> dict[str, Any]:
    """The counters after a step (null on the CPU)."""
    if not _cuda():
        names = ("max_memory_allocated", "max_memory_reserved", "memory_stats", "allocated_after")
        names += ("reserved_after", "device_used_bytes", "context_bytes")
        return dict.fromkeys(names)
    torch.cuda.synchronize()
    free, total = torch.cuda.mem_get_info()
    reserved = torch.cuda.memory_reserved()
    stats = torch.cuda.memory_stats()
    return {
        "max_memory_allocated": torch.cuda.max_memory_allocated(),
        "max_memory_reserved": torch.cuda.max_memory_reserved(),
        "memory_stats": {key: stats.get(key) for key in STAT_KEYS},
        "allocated_after": torch.cuda.memory_allocated(),
        "reserved_after": reserved,
        "device_used_bytes": total - free,
        "context_bytes": total - free - reserved,
    }


def gpu_processes() -> dict[str, Any]:
    """Who else uses the GPU: ``torch.cuda.list_gpu_processes()`` and nvidia-smi, if present."""
    out: dict[str, Any] = {}
    if not _cuda():
        return out
    try:
        out["list_gpu_processes"] = torch.cuda.list_gpu_processes()
    except Exception as exc:  # noqa: BLE001
        out["list_gpu_processes"] = f"error: {type(exc).__name__}: {exc}"[:300]
    try:
        query = ["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader"]
        done = subprocess.run(query, capture_output=True, text=True, timeout=15, check=False)
        out["nvidia_smi_compute_apps"] = (done.stdout or done.stderr).strip()[:2000]
        out["own_pid"] = os.getpid()
    except Exception as exc:  # noqa: BLE001
        out["nvidia_smi_compute_apps"] = f"error: {type(exc).__name__}: {exc}"[:300]
    return out


def _call(fn: Any) -> Any:
    try:
        return fn()
    except Exception as exc:  # noqa: BLE001
        return f"error: {type(exc).__name__}: {exc}"[:200]


def environment() -> dict[str, Any]:
    """Versions, the device, the allocator and kernel settings."""
    cuda_backend = torch.backends.cuda
    env: dict[str, Any] = {
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "python": platform.python_version(),
        "cuda": torch.version.cuda,
        "cudnn": _call(
            lambda: torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
        ),
        "PYTORCH_CUDA_ALLOC_CONF": os.environ.get("PYTORCH_CUDA_ALLOC_CONF"),
        "PYTORCH_ALLOC_CONF": os.environ.get("PYTORCH_ALLOC_CONF"),
        "CUBLAS_WORKSPACE_CONFIG": os.environ.get("CUBLAS_WORKSPACE_CONFIG"),
        "CUBLASLT_WORKSPACE_SIZE": os.environ.get("CUBLASLT_WORKSPACE_SIZE"),
        "TORCH_CUBLASLT_UNIFIED_WORKSPACE": os.environ.get("TORCH_CUBLASLT_UNIFIED_WORKSPACE"),
        "CUDA_MODULE_LOADING": os.environ.get("CUDA_MODULE_LOADING"),
        "CUDA_VISIBLE_DEVICES": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "flash_sdp_enabled": _call(cuda_backend.flash_sdp_enabled),
        "mem_efficient_sdp_enabled": _call(cuda_backend.mem_efficient_sdp_enabled),
        "math_sdp_enabled": _call(cuda_backend.math_sdp_enabled),
        "cudnn_sdp_enabled": _call(getattr(cuda_backend, "cudnn_sdp_enabled", lambda: None)),
        "matmul_allow_tf32": _call(lambda: cuda_backend.matmul.allow_tf32),
        "cudnn_allow_tf32": _call(lambda: torch.backends.cudnn.allow_tf32),
        "cudnn_benchmark": torch.backends.cudnn.benchmark,
        "allocator_backend": _call(
            getattr(torch.cuda, "get_allocator_backend", lambda: None) if _cuda() else lambda: None
        ),
    }
    if _cuda():
        props = torch.cuda.get_device_properties(0)
        free, total = torch.cuda.mem_get_info()
        env |= {
            "device": props.name,
            "capability": f"{props.major}.{props.minor}",
            "sm_count": props.multi_processor_count,
            "total_memory": props.total_memory,
            "mem_get_info_total": total,
            "driver": _call(lambda: torch._C._cuda_getDriverVersion()),
        }
    return env


# ------------------------------------------------------------------------------- one config


class Checkpointed(nn.Module):
    """Recomputes ``inner`` in backward (``torch.utils.checkpoint``, non-reentrant)."""

    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, x: Tensor) -> Tensor:
        if self.training and torch.is_grad_enabled():
            out: Tensor = torch.utils.checkpoint.checkpoint(self.inner, x, use_reentrant=False)
            return out
        result: Tensor = self.inner(x)
        return result


def enable_checkpointing(name: str, model: nn.Module) -> str:
    """HF ``gradient_checkpointing_enable()``, or a checkpoint around every CNN block."""
    if name in (*TRANSFORMERS, "llama_tiny"):
        # transformers 5 renamed it (the old name warns); both run the same HF checkpointing
        for method in ("activation_checkpointing_enable", "gradient_checkpointing_enable"):
            enable = getattr(model, method, None)
            if enable is not None:
                enable()
                return f"hf {method}()"
        raise ValueError(f"{name}: this transformers has no gradient checkpointing")
    stages: list[nn.Sequential]
    if name == "resnet50":
        stages = [getattr(model, f"layer{i}") for i in range(1, 5)]
    elif name == "mobilenet_v2":
        stages = [model.features]  # type: ignore[list-item]
    else:
        raise ValueError(f"no checkpointing defined for {name}")
    for stage in stages:
        for index, block in enumerate(stage):
            stage[index] = Checkpointed(block)
    return "torch.utils.checkpoint per block"


def build(cfg: CudaConfig) -> nn.Module:
    """The model on the device, in the config's weight dtype (fp32 for autocast); with LoRA
    PEFT's model (QLoRA: loaded in 4 bits onto the device, prepare_model_for_kbit_training)."""
    base = cfg.base
    dtype = DTYPES["fp32" if cfg.amp else base.dtype]

    def build_base(weights: torch.dtype) -> nn.Module:
        if base.model == "llama_tiny":
            return peft_suite.tiny_llama(weights)
        attn = base.attn or "sdpa"
        return build_model(base.model, attn=attn, layers=base.layers, dtype=weights)

    lora = cfg.options.lora if cfg.options is not None else None
    if cfg.qlora is not None:
        assert lora is not None
        model = peft_suite.load_4bit(
            base.model, base.layers, base.attn or "sdpa", cfg.qlora, build_base
        )
        model = peft_suite.apply_lora(model, lora)
        if cfg.qlora.use_gradient_checkpointing:
            model.checkpointing_impl = "peft prepare_model_for_kbit_training"  # type: ignore[assignment]
        if cfg.checkpointing:
            model.checkpointing_impl = enable_checkpointing(base.model, model)  # type: ignore[assignment]
        return model  # on the device already (device_map)
    # Built (and converted) on the CPU, then moved: the parameters reach the device one by one,
    # as a model loaded on the CPU and moved with .to("cuda") does.
    model = build_base(dtype)
    if base.attn is not None:
        impl = getattr(getattr(model, "config", None), "_attn_implementation", base.attn)
        if impl != base.attn:
            model.set_attn_implementation(base.attn)  # type: ignore[operator]
    ckpt_impl = enable_checkpointing(base.model, model) if cfg.checkpointing else None
    if lora is not None:  # after checkpointing: PEFT then makes the embeddings' output need grad
        model = peft_suite.apply_lora(model, lora)
    if ckpt_impl is not None:
        model.checkpointing_impl = ckpt_impl  # type: ignore[assignment]
    return model.to(_device())


def _to_device(
    inputs: dict[str, Tensor], labels: Tensor | None
) -> tuple[dict[str, Tensor], Tensor | None]:
    """Move inputs and labels; a label tensor that is an input (causal LM) stays one tensor."""
    device = _device()
    moved = {name: t.to(device) for name, t in inputs.items()}
    if labels is None:
        return moved, None
    for name, t in inputs.items():
        if labels is t:
            return moved, moved[name]
    return moved, labels.to(device)


def _autocast(cfg: CudaConfig) -> AbstractContextManager[Any]:
    if not cfg.amp:
        return nullcontext()
    return torch.autocast("cuda" if _cuda() else "cpu", dtype=torch.bfloat16)


def one_step(
    cfg: CudaConfig,
    model: nn.Module,
    inputs: dict[str, Tensor],
    labels: Tensor | None,
    optimizer: torch.optim.Optimizer | None,
) -> None:
    """One training step (zero_grad, forward + loss, backward, step) or one inference forward."""
    base = cfg.base
    if base.mode == "training":
        assert optimizer is not None
        assert labels is not None
        options = cfg.options or Options()
        optimizer.zero_grad(set_to_none=not options.keep_gradients)
        torchtune = options.activation_offload and options.offload_impl == "torchtune"
        save_on_cpu = options.activation_offload and not torchtune
        offload = peft_suite.offload_context() if save_on_cpu else nullcontext()
        with _autocast(cfg), offload:
            if torchtune:  # the forward under OffloadActivations, the loss outside it
                with model.capplan_offload:  # type: ignore[union-attr]
                    logits = model(**inputs, use_cache=False).logits
                loss = peft_suite.causal_lm_loss(logits, labels)
                del logits
            elif options.loss_chunks:
                ids = inputs["input_ids"]
                loss = peft_suite.chunked_loss(model, ids, labels, options.loss_chunks)
            else:
                loss = training_loss(base, model, inputs, labels)
        loss.backward()
        del loss
        optimizer.step()
    else:
        grad = torch.inference_mode() if base.grad_mode == "inference_mode" else torch.no_grad()
        with grad, _autocast(cfg):
            output = forward(base, model, inputs)
        del output


def _kernel_label(op: str) -> str | None:
    """flash | efficient | cudnn | math | flash_for_cpu | overrideable, from an ATen op name."""
    if "attention" not in op:
        return None
    if op.endswith("_for_cpu"):
        return "flash_for_cpu"
    for word, label in (
        ("flash_attention", "flash"),
        ("efficient_attention", "efficient"),
        ("cudnn_attention", "cudnn"),
        ("attention_math", "math"),
        ("overrideable", "overrideable"),
    ):
        if word in op:
            return label
    return None


def attention_kernel(
    cfg: CudaConfig, model: nn.Module, inputs: dict[str, Tensor], labels: Tensor | None
) -> tuple[str | None, list[str]]:
    """Which attention kernel a forward in the config's mode runs, from the profiler's op names.

    Run after the measured steps (the profiler records host-side op names only). For training
    the forward and loss run in train mode with grad enabled (dropout active), then are dropped.
    """
    if cfg.base.model not in TRANSFORMERS:
        return None, []
    activities = [torch.profiler.ProfilerActivity.CPU]
    with torch.profiler.profile(activities=activities) as prof:
        if cfg.base.mode == "training":
            assert labels is not None
            with _autocast(cfg):
                loss = training_loss(cfg.base, model, inputs, labels)
            del loss
        else:
            with torch.no_grad(), _autocast(cfg):
                output = forward(cfg.base, model, inputs)
            del output
    names = sorted({event.key for event in prof.key_averages()})
    attention_ops = [n for n in names if "attention" in n or n in ("aten::softmax", "aten::bmm")]
    if cfg.base.attn == "eager":
        return "eager", attention_ops
    found = sorted({label for name in names if (label := _kernel_label(name)) is not None})
    return ("+".join(found) if found else "unknown"), attention_ops


def optimizer_impl(optimizer: torch.optim.Optimizer | None) -> str | None:
    """foreach | fused | for_loop: what ``step()`` runs for these parameters."""
    if optimizer is None:
        return None
    defaults = optimizer.defaults
    if defaults.get("fused"):
        return "fused"
    if defaults.get("foreach") is not None:
        return "foreach" if defaults["foreach"] else "for_loop"
    try:
        from torch.optim.optimizer import _default_to_fused_or_foreach

        params = [p for group in optimizer.param_groups for p in group["params"]]
        fused, foreach = _default_to_fused_or_foreach(params, False, use_fused=False)
    except Exception:  # noqa: BLE001
        return None
    return "fused" if fused else ("foreach" if foreach else "for_loop")


def _tensor_bytes(tensors: Sequence[Tensor]) -> int:
    """Bytes of the distinct storages (tied weights and views once)."""
    seen: dict[int, int] = {}
    for t in tensors:
        storage = t.untyped_storage()
        seen[storage.data_ptr()] = storage.nbytes()
    return sum(seen.values())


def _counters() -> dict[str, int | None]:
    if not _cuda():
        return {"allocated": None, "reserved": None}
    torch.cuda.synchronize()
    return {"allocated": torch.cuda.memory_allocated(), "reserved": torch.cuda.memory_reserved()}


def run_config(cfg: CudaConfig, record: dict[str, Any]) -> None:
    """Measure one configuration (from a clean slate) into ``record``."""
    base = cfg.base
    started = time.perf_counter()
    torch.manual_seed(0)
    model = build(cfg)
    record["params"] = count_params(model)
    record["param_bytes"] = _tensor_bytes(list(model.parameters()))
    record["buffer_bytes"] = _tensor_bytes(list(model.buffers()))
    record["checkpointing_impl"] = getattr(model, "checkpointing_impl", None)
    options = cfg.options
    if options is not None:
        record |= peft_suite.peft_counts(model)
        record["checkpoint_function"] = peft_suite.checkpoint_function(model)
    cpu_inputs, cpu_labels = make_batch(base, model)
    inputs, labels = _to_device(cpu_inputs, cpu_labels)
    del cpu_inputs, cpu_labels
    if options is not None and options.loss_chunks and labels is not None:
        labels = peft_suite.shifted_labels(inputs["input_ids"])  # torchtune's shifted labels
    record["input_bytes"] = _tensor_bytes(
        [*inputs.values(), *([labels] if labels is not None else [])]
    )
    optimizer: Any = None
    if base.mode == "training" and options is not None:
        model.train()
        name = base.optimizer or "sgd"
        trainable = [p for p in model.parameters() if p.requires_grad]

        def make(params: list[nn.Parameter]) -> torch.optim.Optimizer:
            if name in BNB_OPTIMIZERS:
                return peft_suite.make_bnb_optimizer(name, params)
            return make_optimizer(name, params)

        if options.activation_offload and options.offload_impl == "torchtune":
            model.capplan_offload = peft_suite.torchtune_context(model, HERE / "wheels")  # type: ignore[assignment]
        if options.optimizer_in_backward:
            optimizer = peft_suite.InBackward.build(trainable, make)
        else:
            optimizer = make(trainable)
        record["optimizer_impl"] = (
            "bitsandbytes" if name in BNB_OPTIMIZERS else optimizer_impl(optimizer)
        )
    elif base.mode == "training":
        model.train()
        assert base.optimizer is not None
        optimizer = make_optimizer(base.optimizer, list(model.parameters()))
        record["optimizer_impl"] = optimizer_impl(optimizer)
    else:
        model.eval()
    record["baseline"] = _counters()
    record["build_s"] = round(time.perf_counter() - started, 2)
    steps: list[dict[str, Any]] = []
    record["steps"] = steps
    for index in range(1 + STEADY_STEPS):
        if _cuda():
            torch.cuda.reset_peak_memory_stats()
            if options is not None:
                peft_suite.reset_host_peak()
        began = time.perf_counter()
        one_step(cfg, model, inputs, labels, optimizer)
        steps.append({"warmup": index == 0, **read_step()})
        steps[-1]["step_s"] = round(time.perf_counter() - began, 3)
        if options is not None:
            steps[-1]["host_memory"] = peft_suite.host_memory_peak()
    params = list(model.parameters())
    record["grad_bytes"] = _tensor_bytes([p.grad for p in params if p.grad is not None])
    record["optimizer_state_bytes"] = (
        _tensor_bytes(
            [t for s in optimizer.state.values() for t in s.values() if isinstance(t, Tensor)]
        )
        if optimizer is not None
        else 0
    )
    if options is not None and optimizer is not None:
        record["paged_state_bytes"] = peft_suite.paged_bytes(optimizer)
        if not options.optimizer_in_backward:  # every trainable parameter got its gradient
            missing = [n for n, p in model.named_parameters() if p.requires_grad and p.grad is None]
            record["trainable_without_grad"] = missing[:20]
    if optimizer is not None:
        optimizer.zero_grad(set_to_none=True)  # room for the kernel check's forward
    try:
        kernel, ops = attention_kernel(cfg, model, inputs, labels)
        record["attention_kernel"], record["attention_ops"] = kernel, ops
    except Exception as exc:  # noqa: BLE001  (the measurement is done; keep it)
        record["attention_kernel"] = f"error: {type(exc).__name__}: {exc}"[:300]
    if isinstance(optimizer, peft_suite.InBackward):
        optimizer.close()  # its hooks would keep the model allocated (InBackward.close)
    record["elapsed_s"] = round(time.perf_counter() - started, 2)


def new_record(cfg: CudaConfig) -> dict[str, Any]:
    """The configuration's fields, named as in the CPU harness's records."""
    base = cfg.base
    fields = {k: v for k, v in asdict(base).items() if k not in ("slow", "attn")}
    return {
        "key": cfg.key,
        **fields,
        "grad_mode": base.grad_mode if base.mode == "inference" else None,
        "optimizer_impl": None,
        "attn_implementation": base.attn,
        "amp": cfg.amp,
        "checkpointing": cfg.checkpointing,
        "loss": LOSS_DESCRIPTION[base.family] if base.mode == "training" else None,
        "device": "cuda" if _cuda() else "cpu",
        "torch_version": torch.__version__,
        "transformers_version": transformers.__version__,
        "estimated_s": round(estimated_seconds(cfg), 2),
        **(_peft_fields(cfg) if cfg.options is not None else {}),
    }


def _peft_fields(cfg: CudaConfig) -> dict[str, Any]:
    """The peft suite's options and the service request they stand for."""
    base = cfg.base
    request = peft_suite.service_request(
        mode=base.mode,
        batch=base.batch,
        seq_len=base.seq_len,
        dtype=base.dtype,
        amp=cfg.amp,
        optimizer=base.optimizer,
        checkpointing=cfg.checkpointing,
        options=cfg.options,
    )
    return {"options": asdict(cfg.options) if cfg.options else None, "request": request}


def measure_one(cfg: CudaConfig) -> dict[str, Any]:
    """A record for ``cfg``; an OOM or any other exception is recorded, not raised."""
    record = new_record(cfg)
    record["before"] = clean_slate()
    began = time.perf_counter()
    try:
        run_config(cfg, record)
    except Exception as exc:  # noqa: BLE001  (an OOM or a missing feature: record, go on)
        record["error"] = f"{type(exc).__name__}: {exc}"[:1000]
        record["trace"] = traceback.format_exc()[-3000:]
        record["oom"] = isinstance(exc, torch.cuda.OutOfMemoryError) or "out of memory" in str(exc)
        record["elapsed_s"] = round(time.perf_counter() - began, 2)
        del exc
    record["after"] = clean_slate()
    return record


# ------------------------------------------------------------------------------------- main


def _write(path: Path, output: dict[str, Any]) -> None:
    """Atomic rewrite, so a kill never leaves a half-written file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(output, indent=1))
    os.replace(tmp, path)


def _run_isolated(cfg: CudaConfig, smoke: bool, timeout: float, suite: str) -> dict[str, Any]:
    """``cfg`` in a subprocess (a fresh CUDA context); its record, or why there is none."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "one.json"
        command = [sys.executable, str(Path(__file__).resolve()), "--key", cfg.key]
        command += ["--out", str(out), "--budget-s", "1e9", "--quiet"]
        command += ["--smoke"] if smoke else []
        command += ["--suite", suite]
        try:
            done = subprocess.run(
                command, capture_output=True, text=True, timeout=max(timeout, 5), check=False
            )
        except subprocess.TimeoutExpired:
            return {**new_record(cfg), "error": f"isolated run exceeded {timeout:.0f} s"}
        try:
            loaded = json.loads(out.read_text())
            record: dict[str, Any] = loaded["records"][0]
            record["isolated"] = True
            record["context_at_start"] = loaded.get("context_at_start")
            return record
        except Exception:  # noqa: BLE001
            tail = (done.stdout + done.stderr)[-2000:]
            return {**new_record(cfg), "error": f"isolated run rc={done.returncode}: {tail}"}


def _run_probes(path: Path, smoke: bool, timeout: float) -> None:
    """probes.py in its own process, so its NCCL and kernels do not enter this context."""
    command = [sys.executable, str(HERE / "probes.py"), "--out", str(path)]
    command += ["--smoke"] if smoke else []
    try:
        subprocess.run(command, timeout=max(timeout, 10), check=False)
    except subprocess.TimeoutExpired:
        print(f"probes.py exceeded {timeout:.0f} s; what it wrote is in {path}", flush=True)


def measured_keys(paths: Sequence[Path]) -> set[str]:
    """Keys measured without error in earlier outputs (for --exclude-measured)."""
    keys: set[str] = set()
    for path in paths:
        loaded = json.loads(path.read_text())
        records = loaded["records"] if isinstance(loaded, dict) else loaded
        keys |= {r["key"] for r in records if r.get("steps") and "error" not in r}
    return keys


def main(argv: Sequence[str] | None = None) -> int:
    """Parse the options, run the chosen configurations, write the JSON."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--out", type=Path, default=HERE / "cuda_measurements.json")
    parser.add_argument("--only", default="", help="run only configs whose key contains this")
    parser.add_argument("--key", help="run only the config with exactly this key")
    parser.add_argument("--budget-s", type=float, default=540.0, help="stop starting configs")
    parser.add_argument("--list", action="store_true", help="print the config keys and exit")
    parser.add_argument(
        "--list-json",
        type=Path,
        help="write the chosen configurations' records (nothing measured) here and exit: "
        "compare.py --check-requests reads them",
    )
    parser.add_argument("--smoke", action="store_true", help="tiny configs (CPU check)")
    parser.add_argument("--part", default="1/1", help="K/N: every N-th config from the K-th")
    parser.add_argument("--isolate", action="store_true", help="each config in a subprocess")
    parser.add_argument("--probes", action="store_true", help="run probes.py first")
    parser.add_argument("--probes-out", type=Path, help="default: cuda_probes.json beside --out")
    parser.add_argument(
        "--exclude-measured",
        type=Path,
        nargs="+",
        default=[],
        help="skip configs measured without error in these earlier outputs",
    )
    parser.add_argument(
        "--suite",
        choices=("base", "peft"),
        default="base",
        help="base: the 277 configurations; peft: LoRA / QLoRA / 8-bit and paged optimizers / "
        "offload / optimizer in backward / chunked loss (peft_suite.py)",
    )
    parser.add_argument(
        "--wheels",
        type=Path,
        default=HERE / "wheels",
        help="--suite peft: wheels of peft, accelerate, bitsandbytes, psutil (fetch_wheels.sh), "
        "unpacked when the image lacks one of them",
    )
    parser.add_argument("--quiet", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    part, parts = (int(x) for x in args.part.split("/"))
    every = configs(args.smoke, args.suite)
    if args.key is not None:
        chosen = [c for c in every if c.key == args.key]
    else:
        done = measured_keys(args.exclude_measured)
        chosen = [c for c in every if args.only in c.key and c.key not in done][part - 1 :: parts]
    if args.list_json is not None:
        _write(args.list_json, {"schema": "cuda_measurements/1", "dry": True,
                                "records": [new_record(c) for c in chosen]})  # fmt: skip
        print(f"{len(chosen)} configurations -> {args.list_json}")
        return 0
    if args.list:
        total = 0.0
        for c in chosen:
            total += estimated_seconds(c)
            print(f"{c.key}  (~{estimated_seconds(c):.1f} s, cumulative ~{total:.0f} s)")
        print(f"{len(chosen)} configurations, estimated ~{total:.0f} s plus imports")
        return 0
    if not _cuda() and not args.smoke:
        print("no CUDA device: use --smoke for a CPU check of the code paths", file=sys.stderr)
        return 2
    transformers.logging.set_verbosity_error()
    if args.probes:
        probes_out = args.probes_out or args.out.with_name("cuda_probes.json")
        _run_probes(probes_out, args.smoke, args.budget_s / 2)
    libraries: dict[str, Any] = {}
    if args.suite == "peft":  # unpacked at import (PEFT_WHEELS) unless main got other argv
        found = PEFT_WHEELS if PEFT_WHEELS is not None else {"peft_suite_missing_on_image": []}
        libraries = {**found, "peft_suite_libraries": peft_suite.library_versions()}
    output: dict[str, Any] = {
        "schema": "cuda_measurements/1",
        "command": sys.argv,
        "environment": {**environment(), **libraries},
        "context_at_start": read_step(),
        "gpu_processes_at_start": gpu_processes(),
        "records": [],
    }
    if _cuda():
        # The default is what a training script sees; keep the runs comparable.
        torch.backends.cudnn.benchmark = False
    longest = 0.0
    for index, cfg in enumerate(chosen):
        elapsed = time.monotonic() - STARTED
        if elapsed + max(2 * longest, estimated_seconds(cfg)) + 5 > args.budget_s:
            output["records"].append({**new_record(cfg), "skipped": "time budget"})
            continue
        began = time.perf_counter()
        # bitsandbytes never frees a paged optimizer's unified memory: such a config runs in
        # its own process, so the memory goes with it
        paged = cfg.options is not None and peft_suite.paged(cfg.base.optimizer)
        if args.isolate or (paged and args.key is None):
            timeout = args.budget_s - (time.monotonic() - STARTED)
            record = _run_isolated(cfg, args.smoke, timeout, args.suite)
        else:
            record = measure_one(cfg)
        longest = max(longest, time.perf_counter() - began)
        output["records"].append(record)
        if index == 0:
            output["gpu_processes_after_first"] = gpu_processes()
        _write(args.out, output)
        if not args.quiet:
            status = record.get("error", "").splitlines()[0] if "error" in record else "ok"
            peak = (record.get("steps") or [{}])[-1].get("max_memory_allocated")
            peak_text = f"{peak / 2**20:10.1f} MiB" if peak is not None else " " * 14
            print(f"{cfg.key:<72} {peak_text} {time.perf_counter() - began:6.1f} s  {status}")
            sys.stdout.flush()
    output["gpu_processes_at_end"] = gpu_processes()
    output["total_s"] = round(time.monotonic() - STARTED, 1)
    _write(args.out, output)
    measured = sum(1 for r in output["records"] if r.get("steps") and "error" not in r)
    errors = sum(1 for r in output["records"] if "error" in r)
    skipped = sum(1 for r in output["records"] if "skipped" in r)
    print(
        f"{measured} of {len(chosen)} configurations measured, {errors} errors, "
        f"{skipped} skipped (budget), {output['total_s']} s -> {args.out}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
