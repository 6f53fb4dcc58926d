"""Op-level probes of the CUDA rules the memory model uses, each recording raw numbers.

    python benchmarks/fidelity/cuda/probes.py --out $OUT/cuda_probes.json

Every probe runs in try/except and records its error instead of stopping the rest. On a
machine without CUDA (``--smoke``) the probes that need it record ``"skipped"``. Each probe names
the rule it checks (the service's source for it) so the results can be read against
``app/domain/memory/cuda_allocator.py``, ``app/domain/hardware.py`` (cuBLAS workspace) and the
saved-tensor rules in ``app/domain/graph/ops.py``.
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
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

MIB = 2**20
PROBES: dict[str, Callable[[], dict[str, Any]]] = {}


def probe(name: str) -> Callable[[Callable[[], dict[str, Any]]], Callable[[], dict[str, Any]]]:
    def register(fn: Callable[[], dict[str, Any]]) -> Callable[[], dict[str, Any]]:
        PROBES[name] = fn
        return fn

    return register


def fresh() -> None:
    """Free everything cached, the cuBLAS workspaces included."""
    gc.collect()
    torch.cuda.synchronize()
    clear = getattr(torch._C, "_cuda_clearCublasWorkspaces", None)
    if clear is not None:
        clear()
    torch.cuda.empty_cache()


def counters() -> tuple[int, int]:
    torch.cuda.synchronize()
    return torch.cuda.memory_allocated(), torch.cuda.memory_reserved()


@probe("context")
def context() -> dict[str, Any]:
    """Device memory outside the allocator: after init, first kernel, cuBLAS, cuDNN."""
    out: dict[str, Any] = {}

    def used() -> int:
        free, total = torch.cuda.mem_get_info()
        return total - free - torch.cuda.memory_reserved()

    torch.cuda.init()
    out["after_init"] = used()
    x = torch.ones(1024, device="cuda")
    out["after_first_kernel"] = used()
    a = torch.randn(256, 256, device="cuda")
    (a @ a).sum().item()
    out["after_first_cublas"] = used()
    conv = nn.Conv2d(3, 8, 3).cuda()
    conv(torch.randn(1, 3, 32, 32, device="cuda")).sum().item()
    out["after_first_cudnn"] = used()
    del x, a, conv
    return out


@probe("allocator_sizes")
def allocator_sizes() -> dict[str, Any]:
    """round_size / get_allocation_size: allocated and reserved deltas of one fresh request."""
    sizes = [1, 512, 513, MIB - 1, MIB, MIB + 1, 3 * MIB, 9 * MIB, 10 * MIB - 1, 10 * MIB,
             10 * MIB + 1, 11 * MIB, 19 * MIB + MIB // 2, 21 * MIB, 100 * MIB + 1]  # fmt: skip
    rows = []
    for size in sizes:
        fresh()
        a0, r0 = counters()
        t = torch.empty(size, dtype=torch.uint8, device="cuda")
        a1, r1 = counters()
        rows.append({"request": size, "allocated": a1 - a0, "reserved": r1 - r0})
        del t
    return {"rows": rows}


@probe("allocator_packing_and_reuse")
def allocator_packing_and_reuse() -> dict[str, Any]:
    """Small tensors share 2 MiB segments; a freed block is split for smaller requests."""
    fresh()
    a0, r0 = counters()
    small = [torch.empty(4096, dtype=torch.uint8, device="cuda") for _ in range(513)]
    a1, r1 = counters()
    del small
    fresh()
    big = torch.empty(100 * MIB, dtype=torch.uint8, device="cuda")
    del big
    _, r2 = counters()
    first = torch.empty(60 * MIB, dtype=torch.uint8, device="cuda")
    second = torch.empty(30 * MIB, dtype=torch.uint8, device="cuda")
    a3, r3 = counters()
    del first, second
    return {
        "513_x_4KiB": {"allocated": a1 - a0, "reserved": r1 - r0},
        "reserved_after_free_100MiB": r2,
        "after_60_and_30MiB": {"allocated": a3, "reserved": r3},
    }


@probe("cublas_workspace")
def cublas_workspace() -> dict[str, Any]:
    """The allocated bytes that stay after the first GEMM per dtype, stream and thread."""
    out: dict[str, Any] = {}
    gemms = (
        ("fp32_mm", torch.float32, False),
        ("bf16_mm", torch.bfloat16, False),
        ("bf16_linear_bias", torch.bfloat16, True),  # the cuBLASLt path
    )
    for label, dtype, bias in gemms:
        fresh()
        a = torch.randn(512, 512, device="cuda", dtype=dtype)
        w = torch.randn(512, 512, device="cuda", dtype=dtype)
        b = torch.randn(512, device="cuda", dtype=dtype) if bias else None
        before, _ = counters()
        y = F.linear(a, w, b)
        after, _ = counters()
        out[label] = after - before - y.numel() * y.element_size()
        del a, w, b, y
    fresh()
    a = torch.randn(512, 512, device="cuda")
    (a @ a).sum().item()
    one, _ = counters()
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        c = a @ a
    stream.synchronize()
    two, _ = counters()
    out["second_stream_extra"] = two - one - c.numel() * c.element_size()
    # autograd runs a CUDA backward on its own thread: a second cuBLAS handle
    fresh()
    w = torch.randn(512, 512, device="cuda", requires_grad=True)
    x = torch.randn(512, 512, device="cuda")
    loss = (x @ w).sum()
    forward_done, _ = counters()
    loss.backward()
    backward_done, _ = counters()
    out["backward_thread_extra"] = backward_done - forward_done - w.numel() * 4
    out["CUBLAS_WORKSPACE_CONFIG"] = os.environ.get("CUBLAS_WORKSPACE_CONFIG")
    return out


@probe("cudnn_conv_transient")
def cudnn_conv_transient() -> dict[str, Any]:
    """Peak minus before of a first conv forward + backward, benchmark off and on."""
    out: dict[str, Any] = {}
    for benchmark in (False, True):
        torch.backends.cudnn.benchmark = benchmark
        fresh()
        conv = nn.Conv2d(64, 64, 3, padding=1).cuda()
        x = torch.randn(32, 64, 56, 56, device="cuda", requires_grad=True)
        before, _ = counters()
        torch.cuda.reset_peak_memory_stats()
        y = conv(x)
        y.sum().backward()
        torch.cuda.synchronize()
        out[f"benchmark_{benchmark}"] = {
            "peak_minus_before": torch.cuda.max_memory_allocated() - before,
            "output_bytes": y.numel() * y.element_size(),
        }
        del conv, x, y
    torch.backends.cudnn.benchmark = False
    return out


def saved_tensors(fn: Callable[[], torch.Tensor]) -> list[dict[str, Any]]:
    """Shapes and dtypes autograd saves while ``fn`` runs."""
    saved: list[dict[str, Any]] = []

    def pack(t: torch.Tensor) -> torch.Tensor:
        saved.append(
            {"shape": list(t.shape), "dtype": str(t.dtype), "bytes": t.numel() * t.element_size()}
        )
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn()
    return saved


@probe("saved_tensors")
def saved_tensors_probe() -> dict[str, Any]:
    """What SDPA's kernels, dropout and common ops keep for backward on CUDA."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    out: dict[str, Any] = {}
    backends = {"flash": SDPBackend.FLASH_ATTENTION, "efficient": SDPBackend.EFFICIENT_ATTENTION,
                "math": SDPBackend.MATH}  # fmt: skip
    for dtype in (torch.bfloat16, torch.float32):
        for name, backend in backends.items():
            for dropout in (0.0, 0.1):
                label = f"sdpa_{name}_{str(dtype).removeprefix('torch.')}_dropout{dropout}"
                q, k, v = (torch.randn(2, 4, 33, 64, device="cuda", dtype=dtype, requires_grad=True)
                           for _ in range(3))  # fmt: skip
                try:
                    with sdpa_kernel(backend):
                        out[label] = saved_tensors(
                            lambda: F.scaled_dot_product_attention(q, k, v, dropout_p=dropout)  # noqa: B023
                        )
                except RuntimeError as exc:
                    out[label] = {"error": str(exc)[:200]}
    x = torch.randn(8, 1024, device="cuda", requires_grad=True)
    out["dropout"] = saved_tensors(lambda: F.dropout(x, 0.1, training=True))
    out["gelu"] = saved_tensors(lambda: F.gelu(x))
    out["silu"] = saved_tensors(lambda: F.silu(x))
    out["layer_norm"] = saved_tensors(lambda: F.layer_norm(x, (1024,)))
    labels = torch.randint(0, 1024, (8,), device="cuda")
    out["cross_entropy"] = saved_tensors(lambda: F.cross_entropy(x, labels))
    return out


@probe("autocast_weight_cache")
def autocast_weight_cache() -> dict[str, Any]:
    """16-bit weight copies autocast keeps during forward, released when it exits."""
    fresh()
    model = nn.Sequential(*(nn.Linear(2048, 2048) for _ in range(8))).cuda()
    x = torch.randn(16, 2048, device="cuda")
    before, _ = counters()
    with torch.autocast("cuda", dtype=torch.bfloat16):
        y = model(x)
        inside, _ = counters()
    after, _ = counters()
    weights = sum(p.numel() for p in model.parameters() if p.dim() == 2)
    return {
        "inside_minus_before": inside - before,
        "after_exit_minus_before": after - before,
        "bf16_weight_bytes": weights * 2,
        "output_bytes": y.numel() * y.element_size(),
    }


@probe("optimizer_step")
def optimizer_step() -> dict[str, Any]:
    """Peak minus before of optimizer.step(), first step (state created) and second."""
    out: dict[str, Any] = {}
    variants: dict[str, Callable[[list[nn.Parameter]], torch.optim.Optimizer]] = {
        "adamw_foreach": lambda p: torch.optim.AdamW(p, foreach=True),
        "adamw_fused": lambda p: torch.optim.AdamW(p, fused=True),
        "adamw_for_loop": lambda p: torch.optim.AdamW(p, foreach=False),
        "sgd_momentum_foreach": lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9, foreach=True),
    }
    for name, make in variants.items():
        fresh()
        model = nn.Sequential(*(nn.Linear(4096, 4096) for _ in range(6))).cuda()  # ~100M
        for p in model.parameters():
            p.grad = torch.randn_like(p)
        optimizer = make(list(model.parameters()))
        steps = []
        for _ in range(2):
            before, _ = counters()
            torch.cuda.reset_peak_memory_stats()
            optimizer.step()
            torch.cuda.synchronize()
            after, _ = counters()
            steps.append({"peak_minus_before": torch.cuda.max_memory_allocated() - before,
                          "after_minus_before": after - before})  # fmt: skip
        out[name] = {"param_bytes": sum(p.numel() * 4 for p in model.parameters()), "steps": steps}
        del model, optimizer
    return out


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@probe("ddp_fsdp_single_process")
def ddp_fsdp() -> dict[str, Any]:
    """DDP buckets (gradient_as_bucket_view off/on) and FSDP at world size 1."""
    import torch.distributed as dist

    out: dict[str, Any] = {}
    init = f"tcp://127.0.0.1:{_free_port()}"
    try:
        dist.init_process_group("nccl", rank=0, world_size=1, init_method=init)
    except Exception:  # noqa: BLE001
        dist.init_process_group("gloo", rank=0, world_size=1, init_method=init)
    out["backend"] = dist.get_backend()

    def step(model: nn.Module) -> dict[str, int]:
        x = torch.randn(8, 4096, device="cuda")
        before, _ = counters()
        torch.cuda.reset_peak_memory_stats()
        model(x).sum().backward()
        torch.cuda.synchronize()
        after, _ = counters()
        return {"peak_minus_before": torch.cuda.max_memory_allocated() - before,
                "after_minus_before": after - before}  # fmt: skip

    def model() -> nn.Module:
        return nn.Sequential(*(nn.Linear(4096, 4096) for _ in range(6))).cuda()

    fresh()
    out["plain"] = step(model())
    for view in (False, True):
        fresh()
        base = model()
        a0, _ = counters()
        wrapped = nn.parallel.DistributedDataParallel(base, gradient_as_bucket_view=view)
        a1, _ = counters()
        out[f"ddp_bucket_view_{view}"] = {"wrap_extra": a1 - a0, **step(wrapped)}
        del wrapped, base
    try:
        from torch.distributed.fsdp import fully_shard

        fresh()
        sharded = model()
        for layer in sharded:
            fully_shard(layer)
        fully_shard(sharded)
        out["fsdp2"] = step(sharded)
        del sharded
    except Exception as exc:  # noqa: BLE001
        out["fsdp2"] = {"error": str(exc)[:300]}
    dist.destroy_process_group()
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path(__file__).with_name("cuda_probes.json"))
    parser.add_argument("--only", default="")
    parser.add_argument("--smoke", action="store_true", help="no CUDA: record every probe skipped")
    args = parser.parse_args()
    results: dict[str, Any] = {"torch": torch.__version__, "cuda": torch.version.cuda}
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        results["device"] = {"name": props.name, "capability": f"{props.major}.{props.minor}"}
    for name, fn in PROBES.items():
        if args.only not in name:
            continue
        if not torch.cuda.is_available():
            results[name] = {"skipped": "no CUDA device"}
            continue
        started = time.perf_counter()
        try:
            results[name] = fn()
        except Exception as exc:  # noqa: BLE001
            results[name] = {"error": f"{type(exc).__name__}: {exc}"[:500],
                             "trace": traceback.format_exc()[-1500:]}  # fmt: skip
        results[name + "_s"] = round(time.perf_counter() - started, 2)
        print(f"{name}: {'error' if 'error' in results[name] else 'ok'}", flush=True)
        args.out.write_text(json.dumps(results, indent=1))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=1))
    print(f"-> {args.out}")
    return 0 if torch.cuda.is_available() or args.smoke else 2


if __name__ == "__main__":
    sys.exit(main())
