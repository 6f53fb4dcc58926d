"""Measure what PyTorch really allocates on the CPU for inference and one training step.

Usage (from the repository root)::

    benchmarks/fidelity/.venv/bin/python benchmarks/fidelity/measure.py [--only SUBSTRING]
        [--out PATH] [--probes-out PATH]

For every configuration the peak is ``baseline_bytes`` (params, buffers, inputs and labels live
before the step) plus the maximum extra bytes the CPU allocator held during the step, read from
``torch.profiler``'s memory events and cross-checked by a ``TorchDispatchMode`` storage tracker
(see ``memtrack.py``). Op-level probes (``probes.py``) go to ``probes.md``; the method is first
validated on allocations whose size is known exactly.
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import json
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import probes
import torch
import torch.nn.functional as F
import transformers
from memtrack import MemoryMeter, RegionPeak, unique_storage_bytes
from models import EXPECTED_PARAMS, build_model, check_param_counts, count_params
from torch import Tensor, nn

HERE = Path(__file__).resolve().parent
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
HF_FAMILIES = {
    "vit_b16": "vit",
    "bert_base": "bert",
    "gpt2_small": "causal_lm",
    "llama2_7b": "causal_lm",
    "llama3_8b": "causal_lm",
}
IMAGE_MODELS = {"alexnet", "vgg16", "googlenet", "resnet50", "mobilenet_v2", "vit_b16"}
# Headroom kept free when deciding whether a full-size model fits in this machine's memory.
MEMORY_HEADROOM = 3 << 30


@dataclass(frozen=True)
class Config:
    """One measured configuration; ``key`` is its stable identifier."""

    model: str
    mode: str  # "inference" | "training"
    batch: int
    dtype: str = "fp32"
    optimizer: str | None = None  # sgd_momentum | adamw | adamw_foreach | adamw_fused
    seq_len: int | None = None
    image_size: int | None = None
    attn: str | None = None  # HF attn_implementation
    layers: int | None = None  # reduced depth
    use_cache: bool | None = None  # causal-LM inference only
    grad_mode: str = "no_grad"  # inference: no_grad | inference_mode
    # bf16 training: autograd's NN-layout bf16 GEMMs run at ~1 GFLOP/s on CPUs without
    # AVX512-BF16/AMX (a 1-layer Llama-width step at seq 16 took 66 s here); opt-in.
    slow: bool = False

    @property
    def key(self) -> str:
        """E.g. ``resnet50|training|fp32|sgd_momentum|bs8|img224``."""
        parts = [self.model + (f"-{self.layers}L" if self.layers else ""), self.mode, self.dtype]
        parts += [p for p in (self.optimizer, self.attn) if p]
        parts.append(f"bs{self.batch}")
        parts.append(f"seq{self.seq_len}" if self.seq_len else f"img{self.image_size}")
        if self.use_cache is not None:
            parts.append("kv_cache" if self.use_cache else "no_cache")
        if self.mode == "inference" and self.grad_mode != "no_grad":
            parts.append(self.grad_mode)
        return "|".join(parts)

    @property
    def family(self) -> str:
        """cnn | lstm (a recurrent classifier) | vit | bert | causal_lm."""
        if self.model in RECURRENT_CLASSIFIERS:
            return "lstm"
        return HF_FAMILIES.get(self.model, "cnn")


def _cnn_configs() -> Iterator[Config]:
    for model in ("alexnet", "vgg16", "googlenet", "resnet50", "mobilenet_v2"):
        for batch in (1, 8):
            for grad_mode in ("no_grad", "inference_mode"):
                yield Config(model, "inference", batch, image_size=224, grad_mode=grad_mode)
            for optimizer in ("sgd_momentum", "adamw"):
                yield Config(model, "training", batch, optimizer=optimizer, image_size=224)
        if model == "resnet50":
            for optimizer in ("adamw_foreach", "adamw_fused"):
                yield Config(model, "training", 1, optimizer=optimizer, image_size=224)


RECURRENT_CLASSIFIERS = ("lstm_classifier", "gru_classifier", "rnn_classifier")


def _lstm_configs() -> Iterator[Config]:
    for model in RECURRENT_CLASSIFIERS:
        for grad_mode in ("no_grad", "inference_mode"):
            yield Config(model, "inference", 32, seq_len=128, grad_mode=grad_mode)
        for optimizer in ("sgd_momentum", "adamw"):
            yield Config(model, "training", 32, optimizer=optimizer, seq_len=128)
        # a second shape: the GRU/RNN constants are fitted on the first, checked on this one
        yield Config(model, "inference", 64, seq_len=256)
        yield Config(model, "training", 64, optimizer="sgd_momentum", seq_len=256)


def _vit_configs() -> Iterator[Config]:
    vit: dict[str, Any] = {"image_size": 224}
    for batch in (1, 4):
        for attn in ("sdpa", "eager"):
            yield Config("vit_b16", "inference", batch, attn=attn, **vit)
        yield Config("vit_b16", "training", batch, optimizer="adamw", attn="sdpa", **vit)
    yield Config("vit_b16", "inference", 1, attn="sdpa", grad_mode="inference_mode", **vit)
    yield Config("vit_b16", "training", 1, optimizer="sgd_momentum", attn="sdpa", **vit)
    yield Config("vit_b16", "training", 4, optimizer="adamw", attn="eager", **vit)
    yield Config("vit_b16", "inference", 1, dtype="bf16", attn="sdpa", **vit)
    yield Config(
        "vit_b16", "training", 1, dtype="bf16", optimizer="adamw", attn="sdpa", slow=True, **vit
    )


def _text_configs(model: str) -> Iterator[Config]:
    """BERT / GPT-2: SDPA everywhere, eager at every inference shape and the largest training."""
    causal = model != "bert_base"
    caches: Sequence[bool | None] = (False, True) if causal else (None,)
    first = caches[0]
    for batch in (1, 4):
        for seq in (128, 512):
            for cache in caches:
                yield Config(model, "inference", batch, seq_len=seq, attn="sdpa", use_cache=cache)
            yield Config(model, "inference", batch, seq_len=seq, attn="eager", use_cache=first)
            yield Config(model, "training", batch, optimizer="adamw", seq_len=seq, attn="sdpa")
    yield Config(model, "training", 4, optimizer="adamw", seq_len=512, attn="eager")
    yield Config(
        model, "inference", 1, seq_len=128, attn="sdpa", use_cache=first, grad_mode="inference_mode"
    )
    yield Config(model, "training", 1, optimizer="sgd_momentum", seq_len=128, attn="sdpa")
    yield Config(model, "inference", 1, dtype="bf16", seq_len=128, attn="sdpa", use_cache=first)
    yield Config(
        model,
        "training",
        1,
        dtype="bf16",
        optimizer="adamw",
        seq_len=128,
        attn="sdpa",
        slow=not causal,
    )


def _llama_configs() -> Iterator[Config]:
    """Llama-2-7B widths at 2 layers (fp32 + bf16), then the full 32 layers in bf16."""
    llama: dict[str, Any] = {"model": "llama2_7b", "batch": 1, "layers": 2}
    for seq in (128, 512):
        for cache in (False, True):
            yield Config(mode="inference", seq_len=seq, attn="sdpa", use_cache=cache, **llama)
        yield Config(mode="training", optimizer="adamw", seq_len=seq, attn="sdpa", **llama)
    yield Config(mode="inference", seq_len=512, attn="eager", use_cache=False, **llama)
    yield Config(mode="training", optimizer="adamw", seq_len=512, attn="eager", **llama)
    for cache in (False, True):
        yield Config(
            mode="inference", dtype="bf16", seq_len=128, attn="sdpa", use_cache=cache, **llama
        )
    for seq in (128, 512):
        yield Config(
            mode="training",
            dtype="bf16",
            optimizer="adamw",
            seq_len=seq,
            attn="sdpa",
            slow=True,
            **llama,
        )
    yield Config(
        "llama2_7b", "inference", 1, dtype="bf16", seq_len=128, attn="sdpa", use_cache=True
    )


def all_configs() -> list[Config]:
    """Every configuration, grouped so that one model instance serves consecutive configs."""
    return [
        *_cnn_configs(),
        *_lstm_configs(),
        *_vit_configs(),
        *_text_configs("bert_base"),
        *_text_configs("gpt2_small"),
        *_llama_configs(),
    ]


# --------------------------------------------------------------------------- one measurement


def make_batch(cfg: Config, model: nn.Module) -> tuple[dict[str, Tensor], Tensor | None]:
    """Random model inputs and (for training) int64 labels of the right shape."""
    dtype = DTYPES[cfg.dtype]
    batch = cfg.batch
    labels: Tensor | None = None
    if cfg.model in IMAGE_MODELS:
        size = cfg.image_size or 224
        pixels = torch.randn(batch, 3, size, size, dtype=dtype)
        inputs = {"pixel_values" if cfg.family == "vit" else "x": pixels}
        labels = torch.randint(0, 1000, (batch,))
    elif cfg.family == "lstm":
        inputs = {"tokens": torch.randint(0, 20000, (batch, cfg.seq_len or 0))}
        labels = torch.randint(0, 2, (batch,))
    else:
        vocab = model.config.vocab_size  # type: ignore[union-attr]
        ids = torch.randint(0, vocab, (batch, cfg.seq_len or 0))
        inputs = {"input_ids": ids}
        if cfg.family == "bert":
            labels = torch.randint(0, model.config.hidden_size, (batch,))  # type: ignore[union-attr]
        else:
            labels = ids  # causal LM: labels=input_ids, HF shifts them inside its loss
    return inputs, (labels if cfg.mode == "training" else None)


LOSS_DESCRIPTION = {
    "cnn": "F.cross_entropy(logits, labels[int64 B])",
    "lstm": "F.cross_entropy(logits[B,2], labels[int64 B])",
    "vit": "F.cross_entropy(logits[B,1000], labels[int64 B])",
    "bert": "F.cross_entropy(pooler_output[B,768] as logits, labels[int64 B] in [0,768))",
    "causal_lm": "labels=input_ids: HF ForCausalLMLoss (shifts labels, upcasts logits to fp32)",
}


def forward(cfg: Config, model: nn.Module, inputs: dict[str, Tensor]) -> Any:
    """One inference forward pass (causal LMs get the config's ``use_cache``)."""
    if cfg.family in ("cnn", "lstm"):
        return model(*inputs.values())
    if cfg.family == "causal_lm":
        return model(**inputs, use_cache=bool(cfg.use_cache))
    return model(**inputs)


def training_loss(
    cfg: Config, model: nn.Module, inputs: dict[str, Tensor], labels: Tensor
) -> Tensor:
    """Forward plus loss, keeping only the loss (the model's other outputs are dropped)."""
    if cfg.family == "causal_lm":
        loss: Tensor = model(**inputs, labels=labels, use_cache=False).loss
        return loss
    if cfg.family in ("cnn", "lstm"):
        return F.cross_entropy(model(*inputs.values()), labels)
    output = model(**inputs)
    logits = output.logits if cfg.family == "vit" else output.pooler_output
    return F.cross_entropy(logits, labels)


def make_optimizer(name: str, params: list[nn.Parameter]) -> torch.optim.Optimizer:
    """The optimizer variants measured (here and by cuda/measure.py): PyTorch's default
    implementation unless the name says foreach, fused or for_loop."""
    if name == "sgd":
        return torch.optim.SGD(params, lr=0.01)
    if name == "sgd_momentum":
        return torch.optim.SGD(params, lr=0.01, momentum=0.9)
    variants: dict[str, dict[str, bool]] = {
        "adamw": {},
        "adamw_foreach": {"foreach": True},
        "adamw_fused": {"fused": True},
        "adamw_for_loop": {"foreach": False},
    }
    return torch.optim.AdamW(params, lr=1e-4, **variants[name])


def attention_kernel(cfg: Config, ops: set[str]) -> str | None:
    """Which attention computation ran, read from the ATen ops of the region."""
    if cfg.attn == "eager":
        return "eager: matmul + softmax (materialises scores)"
    for op, label in (
        ("aten::_scaled_dot_product_flash_attention_for_cpu", "sdpa: flash_attention_for_cpu"),
        ("aten::_scaled_dot_product_attention_math", "sdpa: math (materialises scores)"),
    ):
        if op in ops:
            return label
    return None


def _grad_context(cfg: Config) -> AbstractContextManager[Any]:
    return torch.inference_mode() if cfg.grad_mode == "inference_mode" else torch.no_grad()


def run_config(cfg: Config, model: nn.Module) -> dict[str, Any]:
    """Measure one configuration on an already-built model; returns its JSON record."""
    torch.manual_seed(0)
    inputs, labels = make_batch(cfg, model)
    params = list(model.parameters())
    buffers = list(model.buffers())
    batch_tensors = [*inputs.values(), *([labels] if labels is not None else [])]
    baseline = unique_storage_bytes([*params, *buffers, *batch_tensors])
    optimizer: torch.optim.Optimizer | None = None
    started = time.perf_counter()
    if cfg.mode == "training":
        assert labels is not None
        assert cfg.optimizer is not None
        model.train()
        optimizer = make_optimizer(cfg.optimizer, params)
        with MemoryMeter() as meter:
            optimizer.zero_grad(set_to_none=True)
            with meter.phase("forward"):
                loss = training_loss(cfg, model, inputs, labels)
            with meter.phase("backward"):
                loss.backward()
            del loss
            with meter.phase("optimizer"):
                optimizer.step()
    else:
        model.eval()
        with _grad_context(cfg), MemoryMeter() as meter:
            with meter.phase("forward"):
                output = forward(cfg, model, inputs)
            del output
    elapsed = time.perf_counter() - started
    ops = meter.ops()
    grads = [p.grad for p in params if p.grad is not None]
    state = (
        [t for s in optimizer.state.values() for t in s.values() if isinstance(t, Tensor)]
        if optimizer is not None
        else []
    )
    record = _record(cfg, model, meter.profiler_result, meter.tracker_result, baseline)
    record |= {
        "optimizer_impl": probes.optimizer_impl(ops) if optimizer is not None else None,
        "attention_kernel": attention_kernel(cfg, ops),
        "grad_bytes": unique_storage_bytes(grads),
        "optimizer_state_bytes": unique_storage_bytes(state),
        "input_bytes": unique_storage_bytes(batch_tensors),
        "elapsed_s": round(elapsed, 2),
    }
    # After the step only grads and optimizer state should remain of what the step allocated.
    record["unexplained_final_bytes"] = (
        record["final_extra_bytes"] - record["grad_bytes"] - record["optimizer_state_bytes"]
    )
    model.zero_grad(set_to_none=True)
    return record


def _record(
    cfg: Config, model: nn.Module, prof: RegionPeak, tracker: RegionPeak, baseline: int
) -> dict[str, Any]:
    params = list(model.parameters())
    return {
        "key": cfg.key,
        "model": cfg.model,
        "mode": cfg.mode,
        "dtype": cfg.dtype,
        "optimizer": cfg.optimizer,
        "batch": cfg.batch,
        "seq_len": cfg.seq_len,
        "image_size": cfg.image_size,
        "attn_implementation": cfg.attn,
        "layers": cfg.layers,
        "use_cache": cfg.use_cache,
        "grad_mode": cfg.grad_mode if cfg.mode == "inference" else None,
        "loss": LOSS_DESCRIPTION[cfg.family] if cfg.mode == "training" else None,
        "params": count_params(model),
        "baseline_bytes": baseline,
        "peak_bytes": baseline + prof.peak_extra,
        "peak_phase": prof.peak_phase,
        "phase_peak_bytes": {phase: baseline + b for phase, b in prof.phase_peaks.items()},
        "final_extra_bytes": prof.final_extra,
        "param_bytes": unique_storage_bytes(params),
        "buffer_bytes": unique_storage_bytes(list(model.buffers())),
        "method_agreement": {
            "profiler_peak_bytes": baseline + prof.peak_extra,
            "dispatch_peak_bytes": baseline + tracker.peak_extra,
            "dispatch_peak_phase": tracker.peak_phase,
            "extra_ratio": round(tracker.peak_extra / prof.peak_extra, 4)
            if prof.peak_extra
            else None,
        },
        "torch_version": torch.__version__,
        "transformers_version": transformers.__version__,
    }


def available_memory_bytes() -> int:
    """``MemAvailable`` from ``/proc/meminfo``."""
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("MemAvailable missing from /proc/meminfo")


def release_freed_memory() -> None:
    """Hand freed heap pages back to the OS (glibc), so the process RSS stays close to what
    is live when the next model is built; the allocator-level numbers do not depend on it."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except OSError:
        return


def skipped_record(cfg: Config, reason: str) -> dict[str, Any]:
    """Record for a configuration that was not measured."""
    return {"key": cfg.key, "model": cfg.model, "mode": cfg.mode, "skipped": reason}


def run_all(configs: list[Config], include_slow: bool) -> list[dict[str, Any]]:
    """Measure ``configs`` in order, reusing one model for consecutive configs of a model."""
    records: list[dict[str, Any]] = []
    model: nn.Module | None = None
    model_id: tuple[str, int | None] | None = None
    for cfg in configs:
        if cfg.slow and not include_slow:
            reason = "bf16 training: CPU bf16 GEMMs too slow here; run with --include-slow"
            records.append(skipped_record(cfg, reason))
            print(f"SKIP {cfg.key}: {reason}", flush=True)
            continue
        if model_id != (cfg.model, cfg.layers):
            model = None
            gc.collect()
            release_freed_memory()
            if cfg.layers is None and cfg.model in HF_FAMILIES:
                needed = EXPECTED_PARAMS[cfg.model] * DTYPES[cfg.dtype].itemsize
                if needed + MEMORY_HEADROOM > available_memory_bytes():
                    reason = f"needs {needed / 2**30:.1f} GiB of params; not enough free memory"
                    records.append(skipped_record(cfg, reason))
                    print(f"SKIP {cfg.key}: {reason}", flush=True)
                    continue
            model = build_model(
                cfg.model, attn=cfg.attn or "sdpa", layers=cfg.layers, dtype=DTYPES[cfg.dtype]
            )
            model_id = (cfg.model, cfg.layers)
        assert model is not None
        dtype = DTYPES[cfg.dtype]
        if next(model.parameters()).dtype != dtype:
            model.to(dtype)
        if cfg.attn is not None and model.config._attn_implementation != cfg.attn:  # type: ignore[union-attr]
            model.set_attn_implementation(cfg.attn)  # type: ignore[operator]
        gc.collect()
        record = run_config(cfg, model)
        records.append(record)
        print(_summary(record), flush=True)
    return records


def _summary(r: dict[str, Any]) -> str:
    agree = r["method_agreement"]
    return (
        f"{r['key']:<62} base {r['baseline_bytes'] / 2**20:9.1f} MiB  "
        f"peak {r['peak_bytes'] / 2**20:9.1f} MiB ({r['peak_phase']})  "
        f"dispatch {agree['dispatch_peak_bytes'] / 2**20:9.1f} MiB  {r['elapsed_s']:6.1f}s"
    )


# --------------------------------------------------------------------------- method validation


@dataclass(frozen=True)
class Check:
    """A known allocation pattern and what both methods read for it."""

    name: str
    expected_peak: int
    expected_final: int
    profiler: RegionPeak
    tracker: RegionPeak

    @property
    def passed(self) -> bool:
        """Both methods read the expected peak and final bytes exactly."""
        return all(
            (r.peak_extra, r.final_extra) == (self.expected_peak, self.expected_final)
            for r in (self.profiler, self.tracker)
        )


def validate_methods() -> list[Check]:
    """Run both trackers on allocations whose sizes are known exactly."""
    checks: list[Check] = []
    with MemoryMeter() as m:
        x = torch.empty(10_000_000)
        del x
    checks.append(Check("torch.empty(10_000_000) fp32, freed", 40_000_000, 0, *_both(m)))

    a, b, d = torch.randn(1000, 2000), torch.randn(2000, 3000), torch.randn(3000, 500)
    with MemoryMeter() as m:
        c = a @ b  # 12,000,000 B
        e = c @ d  # 2,000,000 B
        del c
    checks.append(
        Check("c=a@b [1000x3000]; e=c@d [1000x500]; del c", 14_000_000, 2_000_000, *_both(m))
    )
    del e

    w = torch.randn(2000, 3000, requires_grad=True)
    with MemoryMeter() as m:
        loss = (a @ w).relu().sum()  # mm out 12 MB + relu out 12 MB (saved) + 4 B loss
        loss.backward()  # relu grad 12 MB + w.grad 24 MB; saved relu out freed first
        del loss
    # Peak in backward: relu grad (12 MB) + w.grad (24 MB) + the 4-byte loss and its 4-byte grad.
    checks.append(
        Check("(a@w).relu().sum().backward(), w [2000x3000]", 36_000_008, 24_000_000, *_both(m))
    )
    return checks


def _both(meter: MemoryMeter) -> tuple[RegionPeak, RegionPeak]:
    return meter.profiler_result, meter.tracker_result


def validation_markdown(checks: list[Check], counts: dict[str, int]) -> str:
    """Method validation and parameter-count checks as Markdown."""
    lines = [
        "## Method validation",
        "",
        "| check | expected peak B | profiler peak B | dispatch peak B "
        "| expected final B | profiler final B | dispatch final B | ok |",
        "|---|---:|---:|---:|---:|---:|---:|---|",
    ]
    for c in checks:
        lines.append(
            f"| {c.name} | {c.expected_peak:,} | {c.profiler.peak_extra:,} "
            f"| {c.tracker.peak_extra:,} | {c.expected_final:,} | {c.profiler.final_extra:,} "
            f"| {c.tracker.final_extra:,} | {'yes' if c.passed else 'NO'} |"
        )
    lines += ["", "Parameter counts (asserted, built on the meta device): "]
    lines.append(", ".join(f"{name} {n:,}" for name, n in counts.items()) + ".")
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    """Validate the method, run the probes and the configurations, write the outputs."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", help="run only configs/probes whose key/name contains this")
    parser.add_argument("--out", type=Path, default=HERE / "measurements.json")
    parser.add_argument("--probes-out", type=Path, default=HERE / "probes.md")
    parser.add_argument(
        "--include-slow", action="store_true", help="also run the bf16 training configs"
    )
    args = parser.parse_args(argv)
    torch.manual_seed(0)
    torch.set_num_threads(2)
    transformers.logging.set_verbosity_error()
    started = time.perf_counter()

    counts = check_param_counts()
    checks = validate_methods()
    for c in checks:
        print(
            f"validation: {c.name}: expected peak {c.expected_peak:,} final {c.expected_final:,}; "
            f"profiler {c.profiler.peak_extra:,}/{c.profiler.final_extra:,}; "
            f"dispatch {c.tracker.peak_extra:,}/{c.tracker.final_extra:,} "
            f"-> {'ok' if c.passed else 'MISMATCH'}"
        )
    if not all(c.passed for c in checks):
        print("method validation failed", file=sys.stderr)
        return 1

    op_results, opt_results = probes.run_all(args.only)
    if op_results or opt_results:
        header = (
            f"torch {torch.__version__}, transformers {transformers.__version__}, "
            f"{torch.get_num_threads()} threads, CPU capability "
            f"{torch.backends.cpu.get_cpu_capability()}."
        )
        text = probes.to_markdown(op_results, opt_results, header)
        args.probes_out.write_text(text + "\n" + validation_markdown(checks, counts))
        print(f"wrote {len(op_results) + len(opt_results)} probes to {args.probes_out}")

    configs = [c for c in all_configs() if args.only is None or args.only in c.key]
    records = run_all(configs, args.include_slow)
    if records:
        args.out.write_text(json.dumps(records, indent=1) + "\n")
        print(f"wrote {len(records)} records to {args.out}")
    print(f"total {time.perf_counter() - started:.0f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
