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
cleared, so each starts from the same state (recorded). The JSON is rewritten after every
configuration, so a run cut short keeps what it measured. ``compare.py`` (the service's venv)
compares the estimates with these records.

``--smoke`` runs tiny configurations on the CPU to check the code paths (no CUDA figures).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import sys
import time
import traceback
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # benchmarks/fidelity: the CPU harness's models and helpers

import torch  # noqa: E402
from measure import Config, forward, make_batch, make_optimizer, training_loss  # noqa: E402
from models import build_model, count_params  # noqa: E402
from torch import Tensor, nn  # noqa: E402

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
STAT_KEYS = (
    "allocated_bytes.all.peak",
    "requested_bytes.all.peak",
    "reserved_bytes.all.peak",
    "active_bytes.all.peak",
    "segment.all.peak",
    "segment.large_pool.peak",
    "segment.small_pool.peak",
    "num_alloc_retries",
    "num_ooms",
)
STEADY_STEPS = 2


@dataclass(frozen=True)
class CudaConfig:
    """A CPU-harness ``Config`` plus what only the CUDA runs vary."""

    base: Config
    amp: bool = False  # fp32 weights, forward + loss under autocast(bfloat16)
    checkpointing: bool = False  # Hugging Face gradient_checkpointing_enable()

    @property
    def key(self) -> str:
        extra = (["amp_bf16"] if self.amp else []) + (["ckpt"] if self.checkpointing else [])
        return "|".join([self.base.key, *extra])


def _text(model: str, mode: str, batch: int, seq: int, **kw: Any) -> CudaConfig:
    amp = kw.pop("amp", False)
    ckpt = kw.pop("checkpointing", False)
    kw.setdefault("attn", "sdpa")
    return CudaConfig(Config(model, mode, batch, seq_len=seq, **kw), amp=amp, checkpointing=ckpt)


def configs(smoke: bool = False) -> list[CudaConfig]:
    """Cheap to expensive, so a budget cut keeps a useful set."""
    if smoke:
        return [
            CudaConfig(Config("lstm_classifier", "inference", 2, seq_len=8)),
            CudaConfig(Config("lstm_classifier", "training", 2, optimizer="adamw", seq_len=8)),
            _text("gpt2_small", "inference", 1, 8, layers=1, use_cache=True),
            _text("gpt2_small", "training", 1, 8, layers=1, optimizer="adamw_foreach", amp=True),
            _text("bert_base", "training", 1, 8, layers=1, optimizer="sgd", checkpointing=True),
        ]
    found: list[CudaConfig] = []
    add = found.append
    # CNNs and the LSTM
    for model in ("resnet50", "mobilenet_v2", "alexnet", "vgg16"):
        for batch in (1, 8, 32):
            for dtype in ("fp32", "bf16"):
                add(CudaConfig(Config(model, "inference", batch, dtype=dtype, image_size=224)))
        for batch in (8, 32):
            for optimizer in ("sgd", "sgd_momentum", "adamw_foreach", "adamw_fused"):
                add(
                    CudaConfig(
                        Config(model, "training", batch, optimizer=optimizer, image_size=224)
                    )
                )
            add(
                CudaConfig(
                    Config(model, "training", batch, optimizer="adamw_foreach", image_size=224),
                    amp=True,
                )
            )
    for batch in (8, 32):
        add(CudaConfig(Config("lstm_classifier", "inference", batch, seq_len=128)))
        for optimizer in ("sgd_momentum", "adamw_foreach"):
            add(
                CudaConfig(
                    Config("lstm_classifier", "training", batch, optimizer=optimizer, seq_len=128)
                )
            )
    # encoders
    for model, shape in (("bert_base", {"seq_len": 128}), ("vit_b16", {"image_size": 224})):
        for batch in (1, 4, 16):
            for dtype in ("fp32", "bf16"):
                add(
                    CudaConfig(Config(model, "inference", batch, dtype=dtype, attn="sdpa", **shape))
                )
            for optimizer in ("sgd_momentum", "adamw_foreach", "adamw_fused"):
                add(
                    CudaConfig(
                        Config(model, "training", batch, optimizer=optimizer, attn="sdpa", **shape)
                    )
                )
            add(
                CudaConfig(
                    Config(
                        model, "training", batch, optimizer="adamw_foreach", attn="sdpa", **shape
                    ),
                    amp=True,
                )
            )
            add(
                CudaConfig(
                    Config(
                        model, "training", batch, optimizer="adamw_foreach", attn="sdpa", **shape
                    ),
                    checkpointing=True,
                )
            )
        add(
            CudaConfig(
                Config(model, "training", 4, optimizer="adamw_foreach", attn="eager", **shape)
            )
        )
    # decoders: GPT-2, Llama-2 (MHA) and Llama-3 (GQA) widths at reduced depth
    decoders = (("gpt2_small", None), ("llama2_7b", 2), ("llama3_8b", 2))
    for model, layers in decoders:
        for batch in (1, 4, 16):
            for seq in (128, 512):
                for dtype in ("fp32", "bf16"):
                    for cache in (False, True):
                        add(
                            _text(
                                model,
                                "inference",
                                batch,
                                seq,
                                layers=layers,
                                dtype=dtype,
                                use_cache=cache,
                            )
                        )
                add(_text(model, "training", batch, seq, layers=layers, optimizer="adamw_foreach"))
                add(
                    _text(
                        model,
                        "training",
                        batch,
                        seq,
                        layers=layers,
                        optimizer="adamw_foreach",
                        amp=True,
                    )
                )
        for optimizer in ("sgd", "sgd_momentum", "adamw_fused"):
            add(_text(model, "training", 4, 512, layers=layers, optimizer=optimizer))
        add(
            _text(
                model,
                "training",
                4,
                512,
                layers=layers,
                optimizer="adamw_foreach",
                checkpointing=True,
            )
        )
        add(
            _text(model, "training", 4, 512, layers=layers, optimizer="adamw_foreach", attn="eager")
        )
    return found


# ------------------------------------------------------------------------------------ device


def _cuda() -> bool:
    return torch.cuda.is_available()


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
    return {"allocated": torch.cuda.memory_allocated(), "reserved": torch.cuda.memory_reserved()}


def read_step() -> dict[str, Any]:
    """The counters after a step (None on the CPU)."""
    if not _cuda():
        return {"max_memory_allocated": None, "max_memory_reserved": None, "context_bytes": None}
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


def environment() -> dict[str, Any]:
    """Versions, the device and the allocator settings."""
    import transformers

    env: dict[str, Any] = {
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "python": platform.python_version(),
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
        "PYTORCH_CUDA_ALLOC_CONF": os.environ.get("PYTORCH_CUDA_ALLOC_CONF"),
        "PYTORCH_ALLOC_CONF": os.environ.get("PYTORCH_ALLOC_CONF"),
        "CUBLAS_WORKSPACE_CONFIG": os.environ.get("CUBLAS_WORKSPACE_CONFIG"),
        "CUDA_MODULE_LOADING": os.environ.get("CUDA_MODULE_LOADING"),
        "flash_sdp_enabled": torch.backends.cuda.flash_sdp_enabled(),
        "mem_efficient_sdp_enabled": torch.backends.cuda.mem_efficient_sdp_enabled(),
    }
    if _cuda():
        props = torch.cuda.get_device_properties(0)
        env |= {
            "device": props.name,
            "capability": f"{props.major}.{props.minor}",
            "sm_count": props.multi_processor_count,
            "total_memory": props.total_memory,
        }
    return env


# ------------------------------------------------------------------------------- one config


def _device() -> torch.device:
    return torch.device("cuda" if _cuda() else "cpu")


def build(cfg: CudaConfig) -> nn.Module:
    """The model on the device, in the config's weight dtype (fp32 for autocast)."""
    base = cfg.base
    dtype = DTYPES["fp32" if cfg.amp else base.dtype]
    model = build_model(base.model, attn=base.attn or "sdpa", layers=base.layers, dtype=dtype)
    model = model.to(_device())
    if cfg.checkpointing:
        enable = getattr(model, "activation_checkpointing_enable", None) or getattr(
            model, "gradient_checkpointing_enable", None
        )
        if enable is None:
            raise ValueError(f"{base.model} has no gradient checkpointing to enable")
        enable()
    return model


def _to_device(
    tensors: dict[str, Tensor], labels: Tensor | None
) -> tuple[dict[str, Tensor], Tensor | None]:
    device = _device()
    moved = {name: t.to(device) for name, t in tensors.items()}
    return moved, (labels.to(device) if labels is not None else None)


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
        optimizer.zero_grad(set_to_none=True)
        device_type = "cuda" if _cuda() else "cpu"
        with torch.autocast(device_type, dtype=torch.bfloat16, enabled=cfg.amp):
            loss = training_loss(base, model, inputs, labels)
        loss.backward()
        del loss
        optimizer.step()
    else:
        grad = torch.inference_mode() if base.grad_mode == "inference_mode" else torch.no_grad()
        with grad:
            output = forward(base, model, inputs)
        del output


def attention_kernel(cfg: CudaConfig, model: nn.Module, inputs: dict[str, Tensor]) -> str | None:
    """Which attention kernel a forward runs, from the profiler's op names (after measuring)."""
    if cfg.base.model not in ("bert_base", "vit_b16", "gpt2_small", "llama2_7b", "llama3_8b"):
        return None
    if cfg.base.attn == "eager":
        return "eager"
    activities = [torch.profiler.ProfilerActivity.CPU]
    with torch.no_grad(), torch.profiler.profile(activities=activities) as prof:
        with torch.autocast("cuda" if _cuda() else "cpu", dtype=torch.bfloat16, enabled=cfg.amp):
            forward(replace(cfg.base, mode="inference"), model, inputs)
    names = {event.key for event in prof.key_averages()}
    for op, label in (
        ("flash_attention", "flash"),
        ("efficient_attention", "efficient"),
        ("cudnn_attention", "cudnn"),
        ("_scaled_dot_product_attention_math", "math"),
    ):
        if any(op in name for name in names):
            return label
    return "unknown: " + ",".join(sorted(n for n in names if "attention" in n))[:200]


def run_config(cfg: CudaConfig) -> dict[str, Any]:
    """Measure one configuration from a clean slate; returns its JSON record."""
    record: dict[str, Any] = {
        "key": cfg.key,
        **{k: v for k, v in asdict(cfg.base).items() if k != "slow"},
        "attn_implementation": cfg.base.attn,
        "amp": cfg.amp,
        "checkpointing": cfg.checkpointing,
        "before": clean_slate(),
    }
    started = time.perf_counter()
    torch.manual_seed(0)
    model = build(cfg)
    record["params"] = count_params(model)
    inputs, labels = _to_device(*make_batch(cfg.base, model))
    optimizer = None
    if cfg.base.mode == "training":
        model.train()
        assert cfg.base.optimizer is not None
        optimizer = make_optimizer(cfg.base.optimizer, list(model.parameters()))
    else:
        model.eval()
    _sync()
    record["baseline"] = {
        "allocated": torch.cuda.memory_allocated() if _cuda() else None,
        "reserved": torch.cuda.memory_reserved() if _cuda() else None,
    }
    steps = []
    for index in range(1 + STEADY_STEPS):
        if _cuda():
            torch.cuda.reset_peak_memory_stats()
        one_step(cfg, model, inputs, labels, optimizer)
        steps.append({"warmup": index == 0, **read_step()})
    record["steps"] = steps
    record["param_bytes"] = sum(p.numel() * p.element_size() for p in model.parameters())
    record["grad_bytes"] = sum(
        p.grad.numel() * p.grad.element_size() for p in model.parameters() if p.grad is not None
    )
    record["optimizer_state_bytes"] = (
        sum(
            t.numel() * t.element_size()
            for state in optimizer.state.values()
            for t in state.values()
            if isinstance(t, Tensor)
        )
        if optimizer is not None
        else 0
    )
    record["attention_kernel"] = attention_kernel(cfg, model, inputs)
    record["elapsed_s"] = round(time.perf_counter() - started, 2)
    del model, optimizer, inputs, labels
    return record


# ------------------------------------------------------------------------------------- main


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=HERE / "cuda_measurements.json")
    parser.add_argument("--only", default="", help="run only configs whose key contains this")
    parser.add_argument("--budget-s", type=float, default=540.0, help="stop starting configs")
    parser.add_argument("--list", action="store_true", help="print the config keys and exit")
    parser.add_argument("--smoke", action="store_true", help="tiny configs (CPU check)")
    parser.add_argument("--part", default="1/1", help="K/N: every N-th config from the K-th")
    args = parser.parse_args(argv)
    part, parts = (int(x) for x in args.part.split("/"))
    chosen = [c for c in configs(args.smoke) if args.only in c.key][part - 1 :: parts]
    if args.list:
        print("\n".join(c.key for c in chosen))
        return 0
    if not _cuda() and not args.smoke:
        print("no CUDA device: use --smoke for a CPU check of the code paths", file=sys.stderr)
        return 2
    started = time.perf_counter()
    context_at_start = read_step() if _cuda() else {}
    output: dict[str, Any] = {
        "environment": environment(),
        "context_at_start": context_at_start,
        "records": [],
    }
    longest = 0.0
    for cfg in chosen:
        elapsed = time.perf_counter() - started
        if elapsed + 2 * longest > args.budget_s:
            output["records"].append({"key": cfg.key, "skipped": "time budget"})
            continue
        began = time.perf_counter()
        try:
            record = run_config(cfg)
        except Exception as exc:  # noqa: BLE001  (an OOM or a missing feature: record, go on)
            record = {"key": cfg.key, "error": f"{type(exc).__name__}: {exc}"[:500]}
            record["trace"] = traceback.format_exc()[-1500:]
        record["environment_key"] = "environment"
        output["records"].append(record)
        longest = max(longest, time.perf_counter() - began)
        clean_slate()
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(output, indent=1))
        status = record.get("error") or f"{record.get('elapsed_s')} s"
        print(f"{cfg.key}: {status}", flush=True)
    args.out.write_text(json.dumps(output, indent=1))
    measured = sum(1 for r in output["records"] if "steps" in r)
    print(f"{measured} of {len(chosen)} configurations measured -> {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
