"""Op-level probes of the CUDA rules the memory model uses, each recording raw numbers.

    python benchmarks/fidelity/cuda/probes.py --out $OUT/cuda_probes.json

Every probe runs in try/except and records its error instead of stopping the rest; the JSON is
rewritten after every probe. Each probe names the rule it checks so the results can be read
against ``app/domain/memory/cuda_allocator.py``, ``app/domain/hardware.py`` (cuBLAS workspace)
and the saved-tensor rules in ``app/domain/graph/ops/``. ``--smoke`` runs every probe's code
on the CPU (``cuda`` becomes ``cpu``, no side streams, DDP over gloo, smaller models) with every
device counter reading 0: a check of the code paths, not a measurement.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import socket
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

MIB = 2**20
PROBES: dict[str, Callable[[], dict[str, Any]]] = {}
SMOKE = False  # set by main(): smaller tensors on the CPU


def probe(name: str) -> Callable[[Callable[[], dict[str, Any]]], Callable[[], dict[str, Any]]]:
    """Register a probe under ``name`` (run in registration order)."""

    def register(fn: Callable[[], dict[str, Any]]) -> Callable[[], dict[str, Any]]:
        PROBES[name] = fn
        return fn

    return register


def cuda() -> bool:
    return torch.cuda.is_available()


def dev() -> str:
    return "cuda" if cuda() else "cpu"


def sync() -> None:
    if cuda():
        torch.cuda.synchronize()


def fresh() -> None:
    """Free everything cached, the cuBLAS workspaces included."""
    gc.collect()
    if not cuda():
        return
    torch.cuda.synchronize()
    clear = getattr(torch._C, "_cuda_clearCublasWorkspaces", None)
    if clear is not None:
        clear()
    torch.cuda.empty_cache()
    torch.cuda.synchronize()


def allocated() -> int:
    sync()
    return torch.cuda.memory_allocated() if cuda() else 0


def reserved() -> int:
    sync()
    return torch.cuda.memory_reserved() if cuda() else 0


def reset_peak() -> None:
    if cuda():
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()


def peak() -> int:
    sync()
    return torch.cuda.max_memory_allocated() if cuda() else 0


def device_used() -> int:
    """``mem_get_info`` total minus free (the whole device: other processes count too)."""
    if not cuda():
        return 0
    free, total = torch.cuda.mem_get_info()
    return int(total - free)


def diff(a: int, b: int) -> int:
    """``a - b`` (counters read 0 on the CPU)."""
    return a - b


def nbytes(t: Tensor) -> int:
    return t.numel() * t.element_size()


def memory_stats() -> dict[str, Any]:
    return dict(torch.cuda.memory_stats()) if cuda() else {}


def segments() -> int:
    return int(memory_stats().get("segment.all.current", 0))


# -------------------------------------------------------------------------------- the probes


@probe("context")
def context() -> dict[str, Any]:
    """Device memory outside the allocator: after init, first kernel, cuBLAS, cuDNN.

    Run first, in a process that has not touched CUDA before (main() does not).
    """
    out: dict[str, Any] = {"CUDA_MODULE_LOADING": os.environ.get("CUDA_MODULE_LOADING")}

    def used() -> dict[str, int]:
        sync()
        res = reserved()
        return {
            "device_used": device_used(),
            "reserved": res,
            "beyond_reserved": device_used() - res,
        }

    if cuda():
        torch.cuda.init()
    out["after_init"] = used()
    x = torch.ones(1024, device=dev())
    out["after_first_kernel"] = used()
    y = (x * 2 + 1).sum()
    y.item()
    out["after_second_kernel"] = used()
    a = torch.randn(256, 256, device=dev())
    (a @ a).sum().item()
    out["after_first_cublas_fp32"] = used()
    b = a.bfloat16()
    (b @ b).float().sum().item()
    out["after_first_cublas_bf16"] = used()
    conv = nn.Conv2d(3, 8, 3).to(dev())
    conv(torch.randn(1, 3, 32, 32, device=dev())).sum().item()
    out["after_first_cudnn"] = used()
    q = torch.randn(1, 4, 64, 64, device=dev(), dtype=torch.bfloat16)
    F.scaled_dot_product_attention(q, q, q).sum().item()
    out["after_first_sdpa_bf16"] = used()
    del x, y, a, b, conv, q
    return out


@probe("allocator_sizes")
def allocator_sizes() -> dict[str, Any]:
    """round_size / get_allocation_size: allocated and reserved deltas of one fresh request."""
    sizes = [1, 512, 513, MIB - 1, MIB, MIB + 1, 3 * MIB, 9 * MIB, 10 * MIB - 1, 10 * MIB,
             10 * MIB + 1, 11 * MIB, 19 * MIB + MIB // 2, 21 * MIB, 100 * MIB + 1]  # fmt: skip
    rows = []
    for size in sizes:
        fresh()
        a0, r0 = allocated(), reserved()
        reset_peak()
        t = torch.empty(size, dtype=torch.uint8, device=dev())
        a1, r1 = allocated(), reserved()
        stats = memory_stats()
        rows.append(
            {
                "request": size,
                "allocated": diff(a1, a0),
                "reserved": diff(r1, r0),
                "requested_bytes.all.current": stats.get("requested_bytes.all.current"),
                "segment.large_pool.current": stats.get("segment.large_pool.current"),
                "segment.small_pool.current": stats.get("segment.small_pool.current"),
            }
        )
        del t
    return {"rows": rows}


@probe("allocator_packing_and_reuse")
def allocator_packing_and_reuse() -> dict[str, Any]:
    """Small tensors share 2 MiB segments; a freed block is split for smaller requests."""
    out: dict[str, Any] = {}
    for size, count in ((256 * 1024, 9), (4096, 513), (512, 8)):
        fresh()
        a0, r0 = allocated(), reserved()
        held = []
        rows = []
        for _ in range(count):
            held.append(torch.empty(size, dtype=torch.uint8, device=dev()))
            rows.append((diff(allocated(), a0), diff(reserved(), r0), segments()))
        out[f"{count}_x_{size}B"] = {
            "final": {"allocated": rows[-1][0], "reserved": rows[-1][1], "segments": rows[-1][2]},
            # (allocated, reserved, segments) after each allocation, only where reserved changed
            "reserved_steps": [
                {"after": i + 1, "allocated": r[0], "reserved": r[1], "segments": r[2]}
                for i, r in enumerate(rows)
                if i == 0 or r[1] != rows[i - 1][1]
            ],
        }
        del held
    fresh()
    big = torch.empty(100 * MIB, dtype=torch.uint8, device=dev())
    r_big = reserved()
    del big
    r_freed = reserved()
    first = torch.empty(60 * MIB, dtype=torch.uint8, device=dev())
    r_60 = reserved()
    second = torch.empty(30 * MIB, dtype=torch.uint8, device=dev())
    r_90 = reserved()
    third = torch.empty(30 * MIB, dtype=torch.uint8, device=dev())  # no longer fits the rest
    r_120 = reserved()
    out["split_reuse_100MiB"] = {
        "reserved_with_100MiB": r_big,
        "reserved_after_free": r_freed,
        "reserved_after_60MiB": r_60,
        "reserved_after_60_30MiB": r_90,
        "reserved_after_60_30_30MiB": r_120,
        "allocated_end": allocated(),
        "segments_end": segments(),
        "inactive_split_bytes": memory_stats().get("inactive_split_bytes.all.current"),
    }
    del first, second, third
    return out


@probe("cublas_workspace")
def cublas_workspace() -> dict[str, Any]:
    """Allocated bytes that stay after the first GEMM per dtype / path, stream and thread."""
    out: dict[str, Any] = {
        "CUBLAS_WORKSPACE_CONFIG": os.environ.get("CUBLAS_WORKSPACE_CONFIG"),
        "CUBLASLT_WORKSPACE_SIZE": os.environ.get("CUBLASLT_WORKSPACE_SIZE"),
        "TORCH_CUBLASLT_UNIFIED_WORKSPACE": os.environ.get("TORCH_CUBLASLT_UNIFIED_WORKSPACE"),
    }
    gemms = (
        ("fp32_mm", torch.float32, False),
        ("bf16_mm", torch.bfloat16, False),
        ("bf16_linear_bias", torch.bfloat16, True),  # addmm with bias: the cuBLASLt path
        ("fp32_linear_bias", torch.float32, True),
    )
    rows: dict[str, Any] = {}
    for label, dtype, bias in gemms:
        fresh()
        a = torch.randn(512, 512, device=dev(), dtype=dtype)
        w = torch.randn(512, 512, device=dev(), dtype=dtype)
        b = torch.randn(512, device=dev(), dtype=dtype) if bias else None
        before = allocated()
        reset_peak()
        y = F.linear(a, w, b) if bias else a @ w
        after = allocated()
        again = F.linear(a, w, b) if bias else a @ w  # a second call adds no workspace
        after_second = allocated()
        rows[label] = {
            "persisting_extra": diff(after, before) - nbytes(y),
            "second_call_extra": diff(after_second, after) - nbytes(again),
            "peak_minus_before": diff(peak(), before),
            "output_bytes": nbytes(y),
        }
        del a, w, b, y, again
    out["first_gemm"] = rows
    # all three in sequence without clearing: do the dtypes / paths share one workspace?
    fresh()
    base = allocated()
    kept = []
    seq: dict[str, int] = {}
    for label, dtype, bias in gemms:
        a = torch.randn(512, 512, device=dev(), dtype=dtype)
        b = torch.randn(512, device=dev(), dtype=dtype) if bias else None
        kept.append(F.linear(a, a, b) if bias else a @ a)
        del a, b
        seq[label] = diff(allocated(), base) - sum(nbytes(t) for t in kept)
    out["cumulative_in_sequence"] = seq
    del kept
    # a second stream gets its own workspace
    fresh()
    a = torch.randn(512, 512, device=dev())
    (a @ a).sum().item()
    one = allocated()
    stream = torch.cuda.Stream() if cuda() else None
    if stream is not None:
        stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream) if stream is not None else nullcontext():
        c = a @ a
    sync()
    two = allocated()
    out["second_stream_extra"] = diff(two, one) - nbytes(c)
    with torch.cuda.stream(stream) if stream is not None else nullcontext():
        d = (a.bfloat16() @ a.bfloat16()).float()
    sync()
    out["second_stream_bf16_extra"] = diff(allocated(), two) - nbytes(d)
    del a, c, d
    # autograd runs a CUDA backward on its own thread: a second cuBLAS handle
    fresh()
    w = torch.randn(512, 512, device=dev(), requires_grad=True)
    x = torch.randn(512, 512, device=dev())
    loss = (x @ w).sum()
    forward_done = allocated()
    loss.backward()
    backward_done = allocated()
    out["backward_thread_extra"] = diff(backward_done, forward_done) - nbytes(w)
    out["clear_workspaces_available"] = hasattr(torch._C, "_cuda_clearCublasWorkspaces")
    return out


@probe("cudnn_conv_transient")
def cudnn_conv_transient() -> dict[str, Any]:
    """Peak minus before of a first conv forward + backward, benchmark off and on."""
    out: dict[str, Any] = {}
    saved_flag = torch.backends.cudnn.benchmark
    try:
        for benchmark in (False, True):
            for dtype in (torch.float32, torch.bfloat16):
                torch.backends.cudnn.benchmark = benchmark
                fresh()
                conv = nn.Conv2d(64, 64, 3, padding=1).to(dev(), dtype)
                batch = 2 if SMOKE else 32
                x = torch.randn(batch, 64, 56, 56, device=dev(), dtype=dtype, requires_grad=True)
                before = allocated()
                reset_peak()
                y = conv(x)
                forward_peak = diff(peak(), before)
                after_forward = allocated()
                reset_peak()
                y.sum().backward()
                backward_peak = diff(peak(), after_forward)
                label = f"benchmark_{benchmark}_{str(dtype).removeprefix('torch.')}"
                out[label] = {
                    "forward_peak_minus_before": forward_peak,
                    "backward_peak_minus_before": backward_peak,
                    "output_bytes": nbytes(y),
                    "input_bytes": nbytes(x),
                    "weight_bytes": nbytes(conv.weight),
                }
                del conv, x, y
    finally:
        torch.backends.cudnn.benchmark = saved_flag
    return out


def saved_tensors(fn: Callable[[], Tensor], inputs: Sequence[Tensor] = ()) -> dict[str, Any]:
    """Shapes and dtypes autograd saves while ``fn`` runs (input storages flagged)."""
    input_ptrs = {t.untyped_storage().data_ptr() for t in inputs}
    saved: list[dict[str, Any]] = []

    def pack(t: Tensor) -> Tensor:
        ptr = t.untyped_storage().data_ptr() if t.device.type != "meta" else -1
        saved.append(
            {
                "shape": list(t.shape),
                "dtype": str(t.dtype).removeprefix("torch."),
                "bytes": nbytes(t),
                "is_input": ptr in input_ptrs,
            }
        )
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        output = fn()
    new = sum(s["bytes"] for s in saved if not s["is_input"])
    return {
        "saved": saved,
        "saved_new_bytes": new,
        "output_shape": list(output.shape),
        "output_bytes": nbytes(output),
    }


@probe("saved_tensors")
def saved_tensors_probe() -> dict[str, Any]:
    """What SDPA's kernels, dropout and common ops keep for backward."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    out: dict[str, Any] = {"device": dev()}
    backends = {"flash": SDPBackend.FLASH_ATTENTION, "efficient": SDPBackend.EFFICIENT_ATTENTION,
                "math": SDPBackend.MATH}  # fmt: skip
    if hasattr(SDPBackend, "CUDNN_ATTENTION"):
        backends["cudnn"] = SDPBackend.CUDNN_ATTENTION
    shape = (2, 4, 33, 64)
    for dtype in (torch.bfloat16, torch.float32):
        for name, backend in backends.items():
            for dropout in (0.0, 0.1):
                for causal in (False, True):
                    label = f"sdpa_{name}_{str(dtype).removeprefix('torch.')}_dropout{dropout}"
                    label += "_causal" if causal else ""
                    qkv = [
                        torch.randn(*shape, device=dev(), dtype=dtype, requires_grad=True)
                        for _ in range(3)
                    ]
                    try:
                        with sdpa_kernel(backend):
                            out[label] = saved_tensors(
                                lambda: F.scaled_dot_product_attention(  # noqa: B023
                                    *qkv,  # noqa: B023
                                    dropout_p=dropout,  # noqa: B023
                                    is_causal=causal,  # noqa: B023
                                ),
                                qkv,
                            )
                    except RuntimeError as exc:
                        out[label] = {"error": str(exc).splitlines()[0][:300]}
    out["sdpa_qkv_shape"] = list(shape)
    for dtype in (torch.float32, torch.bfloat16):
        suffix = str(dtype).removeprefix("torch.")
        x = torch.randn(8, 1024, device=dev(), dtype=dtype, requires_grad=True)
        w = torch.ones(1024, device=dev(), dtype=dtype, requires_grad=True)
        b = torch.zeros(1024, device=dev(), dtype=dtype, requires_grad=True)
        labels = torch.randint(0, 1024, (8,), device=dev())
        cases: dict[str, Callable[[], Tensor]] = {
            "dropout": lambda: F.dropout(x, 0.1, training=True),  # noqa: B023
            "gelu": lambda: F.gelu(x),  # noqa: B023
            "gelu_tanh": lambda: F.gelu(x, approximate="tanh"),  # noqa: B023
            "silu": lambda: F.silu(x),  # noqa: B023
            "relu": lambda: F.relu(x),  # noqa: B023
            "softmax": lambda: F.softmax(x, dim=-1),  # noqa: B023
            "layer_norm": lambda: F.layer_norm(x, (1024,), w, b),  # noqa: B023
            "cross_entropy": lambda: F.cross_entropy(x, labels),  # noqa: B023
        }
        rms_norm = getattr(F, "rms_norm", None)
        if rms_norm is not None:
            cases["rms_norm"] = lambda: rms_norm(x, (1024,), w)  # noqa: B023
        for name, fn in cases.items():
            try:
                out[f"{name}_{suffix}"] = saved_tensors(fn, [x, w, b, labels])
            except RuntimeError as exc:
                out[f"{name}_{suffix}"] = {"error": str(exc).splitlines()[0][:300]}
    return out


@probe("autocast_weight_cache")
def autocast_weight_cache() -> dict[str, Any]:
    """16-bit weight copies autocast keeps during forward, released when it exits."""
    out: dict[str, Any] = {}
    for grad in (True, False):
        fresh()
        model = nn.Sequential(*(nn.Linear(2048, 2048) for _ in range(8))).to(dev())
        x = torch.randn(16, 2048, device=dev())
        before = allocated()
        with torch.set_grad_enabled(grad), torch.autocast(dev(), dtype=torch.bfloat16):
            y = model(x)
            inside = allocated()
        after = allocated()
        weights = sum(p.numel() for p in model.parameters() if p.dim() == 2)
        out[f"grad_enabled_{grad}"] = {
            "inside_minus_before": diff(inside, before),
            "after_exit_minus_before": diff(after, before),
            "bf16_weight_bytes": weights * 2,
            "bf16_bias_bytes": sum(p.numel() * 2 for p in model.parameters() if p.dim() == 1),
            "output_bytes": nbytes(y),
        }
        del model, x, y
    return out


def _linear_stack(width: int, depth: int) -> nn.Module:
    return nn.Sequential(*(nn.Linear(width, width) for _ in range(depth))).to(dev())


@probe("optimizer_step")
def optimizer_step() -> dict[str, Any]:
    """Peak minus before of optimizer.step(), first step (state created) and second."""
    out: dict[str, Any] = {}
    width, depth = (256, 2) if SMOKE or not cuda() else (4096, 6)  # 6 x 4096^2: ~100M params
    variants: dict[str, Callable[[list[nn.Parameter]], torch.optim.Optimizer]] = {
        "adamw_foreach": lambda p: torch.optim.AdamW(p, foreach=True),
        "adamw_fused": lambda p: torch.optim.AdamW(p, fused=True),
        "adamw_for_loop": lambda p: torch.optim.AdamW(p, foreach=False),
        "adamw_default": lambda p: torch.optim.AdamW(p),
        "sgd_momentum_foreach": lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9, foreach=True),
        "sgd_momentum_for_loop": lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9, foreach=False),
        "sgd_foreach": lambda p: torch.optim.SGD(p, lr=0.1, foreach=True),
    }
    for name, make in variants.items():
        try:
            fresh()
            model = _linear_stack(width, depth)
            for p in model.parameters():
                p.grad = torch.randn_like(p)
            optimizer = make(list(model.parameters()))
            steps = []
            for _ in range(2):
                before = allocated()
                reset_peak()
                optimizer.step()
                after = allocated()
                steps.append({"peak_minus_before": diff(peak(), before),
                              "after_minus_before": diff(after, before)})  # fmt: skip
            params = list(model.parameters())
            out[name] = {
                "param_bytes": sum(nbytes(p) for p in params),
                "largest_param_bytes": max(nbytes(p) for p in params),
                "n_params": len(params),
                "steps": steps,
            }
            del model, optimizer
        except Exception as exc:  # noqa: BLE001
            out[name] = {"error": f"{type(exc).__name__}: {exc}"[:300]}
    return out


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _init_process_group() -> str:
    """World size 1 over NCCL (checked with one all_reduce), else gloo."""
    import torch.distributed as dist

    errors = []
    for backend in ("nccl", "gloo") if cuda() else ("gloo",):
        try:
            dist.init_process_group(
                backend, rank=0, world_size=1, init_method=f"tcp://127.0.0.1:{_free_port()}"
            )
            probe_tensor = torch.ones(1, device=dev())
            dist.all_reduce(probe_tensor)
            sync()
            return backend
        except Exception as exc:  # noqa: BLE001
            errors.append(f"{backend}: {type(exc).__name__}: {exc}"[:300])
            if dist.is_initialized():
                dist.destroy_process_group()
    raise RuntimeError("; ".join(errors))


@probe("ddp_fsdp_single_process")
def ddp_fsdp() -> dict[str, Any]:
    """DDP buckets (gradient_as_bucket_view off/on) and FSDP at world size 1."""
    import torch.distributed as dist

    out: dict[str, Any] = {}
    width, depth = (256, 2) if SMOKE or not cuda() else (4096, 6)
    used0 = device_used()
    out["backend"] = _init_process_group()
    out["process_group_device_used"] = diff(device_used(), used0)

    def step(model: nn.Module) -> dict[str, Any]:
        x = torch.randn(8, width, device=dev())
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
        before = allocated()
        reset_peak()
        model(x).sum().backward()
        after_backward = allocated()
        backward_peak = diff(peak(), before)
        reset_peak()
        optimizer.step()
        result = {
            "backward_peak_minus_before": backward_peak,
            "after_backward_minus_before": diff(after_backward, before),
            "step_peak_minus_before": diff(peak(), before),
            "after_step_minus_before": diff(allocated(), before),
            "grad_bytes": sum(nbytes(p.grad) for p in model.parameters() if p.grad is not None),
        }
        del optimizer
        return result

    try:
        fresh()
        plain = _linear_stack(width, depth)
        out["param_bytes"] = sum(nbytes(p) for p in plain.parameters())
        out["plain"] = step(plain)
        del plain
        for view in (False, True):
            label = f"ddp_bucket_view_{view}"
            try:
                fresh()
                base = _linear_stack(width, depth)
                a0, u0 = allocated(), device_used()
                wrapped = nn.parallel.DistributedDataParallel(base, gradient_as_bucket_view=view)
                out[label] = {
                    "wrap_extra": diff(allocated(), a0),
                    "wrap_device_used_extra": diff(device_used(), u0),
                    **step(wrapped),
                    "bucket_bytes_cap": getattr(wrapped, "bucket_bytes_cap", None),
                }
                del wrapped, base
            except Exception as exc:  # noqa: BLE001
                out[label] = {"error": f"{type(exc).__name__}: {exc}"[:300]}
        out["fsdp"] = _fsdp(step, width, depth)
    finally:
        dist.destroy_process_group()
    return out


def _fsdp(step: Callable[[nn.Module], dict[str, Any]], width: int, depth: int) -> dict[str, Any]:
    """FSDP2 ``fully_shard`` if this torch has it, else FSDP1, at world size 1."""
    fully_shard = None
    try:
        from torch.distributed.fsdp import fully_shard  # type: ignore[no-redef]
    except ImportError:
        try:
            from torch.distributed._composable.fsdp import fully_shard  # type: ignore[no-redef]
        except ImportError:
            fully_shard = None
    try:
        fresh()
        model = _linear_stack(width, depth)
        a0 = allocated()
        if fully_shard is not None:
            kind = "fsdp2 fully_shard"
            for layer in model:
                fully_shard(layer)
            fully_shard(model)
            wrapped: nn.Module = model
        else:
            from torch.distributed.fsdp import FullyShardedDataParallel

            kind = "fsdp1 FullyShardedDataParallel"
            wrapped = FullyShardedDataParallel(model, device_id=0 if cuda() else None)
        result = {"kind": kind, "wrap_extra": diff(allocated(), a0), **step(wrapped)}
        del wrapped, model
        return result
    except Exception as exc:  # noqa: BLE001
        return {
            "error": f"{type(exc).__name__}: {exc}"[:300],
            "trace": traceback.format_exc()[-800:],
        }


# ---------------------------------------------------------------------------------------- main


def _write(path: Path, results: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(results, indent=1))
    os.replace(tmp, path)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the probes (``--only`` picks by name) and write the JSON."""
    global SMOKE
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path(__file__).with_name("cuda_probes.json"))
    parser.add_argument("--only", default="", help="run only probes whose name contains this")
    parser.add_argument("--smoke", action="store_true", help="CPU check of the code paths")
    args = parser.parse_args(argv)
    SMOKE = args.smoke
    if not cuda() and not args.smoke:
        print("no CUDA device: use --smoke for a CPU check of the code paths", file=sys.stderr)
        return 2
    started = time.perf_counter()
    results: dict[str, Any] = {
        "schema": "cuda_probes/1",
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "device": None,
        "smoke": not cuda(),  # on the CPU every device counter reads 0: code-path check only
        "probes": {},
    }
    for name, fn in PROBES.items():
        if args.only not in name:
            continue
        began = time.perf_counter()
        try:
            entry: dict[str, Any] = fn()
        except Exception as exc:  # noqa: BLE001
            entry = {"error": f"{type(exc).__name__}: {exc}"[:500],
                     "trace": traceback.format_exc()[-2000:]}  # fmt: skip
        entry["elapsed_s"] = round(time.perf_counter() - began, 2)
        results["probes"][name] = entry
        if cuda() and results["device"] is None:  # after "context", which must see a new process
            props = torch.cuda.get_device_properties(0)
            results["device"] = {"name": props.name, "capability": f"{props.major}.{props.minor}",
                                 "total_memory": props.total_memory}  # fmt: skip
        status = "error" if "error" in entry else ("skipped" if "skipped" in entry else "ok")
        print(f"probe {name}: {status} ({entry['elapsed_s']} s)", flush=True)
        fresh()
        _write(args.out, results)
    results["total_s"] = round(time.perf_counter() - started, 1)
    _write(args.out, results)
    print(f"{len(results['probes'])} probes -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
