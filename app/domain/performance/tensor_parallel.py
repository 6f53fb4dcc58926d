"""Tensor parallelism: a request sharded over GPUs and the all-reduces between them (pure)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from functools import partial

from app.domain.hardware import HardwareSpec
from app.domain.parallel import TensorParallelError, check_tensor_parallel, kv_heads_per_rank
from app.domain.performance.calibration import Calibration
from app.domain.performance.errors import RooflineInputError
from app.domain.performance.kernels import Kernel
from app.domain.performance.phases import LazyKernels, PhasedRequest

ALLREDUCE_LATENCY_S = 10e-6  # per NCCL all-reduce of a small message inside a node (assumed)


def link_between_gpus(device: HardwareSpec, cal: Calibration, *, what: str) -> tuple[float, str]:
    """The effective link between two GPUs of ``device``'s kind and where it comes from: the
    catalog's GPU link (NVLink), else the host link (PCIe), times the calibrated host-link
    efficiency [B/s per direction]."""
    if device.gpu_link_bytes_per_s is not None:
        raw, source = device.gpu_link_bytes_per_s, "the catalog's GPU link (NVLink)"
    elif device.host_link_bytes_per_s is not None:
        raw, source = device.host_link_bytes_per_s, "the host link (no GPU link: PCIe)"
    else:
        raise RooflineInputError(f"{device.slug}: {what} needs a GPU or host link between the GPUs")
    return raw * cal.host_link_efficiency, source


@dataclass(frozen=True, slots=True, kw_only=True)
class AllReduce:
    """A ring all-reduce between the ``degree`` GPUs of a tensor-parallel group."""

    degree: int
    link_bytes_per_s: float  # effective, per direction, per GPU
    source: str

    @classmethod
    def between(cls, device: HardwareSpec, degree: int, cal: Calibration) -> AllReduce:
        """Over the device's GPU link (NVLink), else its host link, at the calibrated
        host-link efficiency."""
        link, source = link_between_gpus(device, cal, what="tensor parallelism")
        return cls(degree=degree, link_bytes_per_s=link, source=source)

    def seconds(self, count: int, total_bytes: int) -> float:
        """``count`` all-reduces of ``total_bytes`` in all [s].

        Notes
        -----
        A ring all-reduce sends and receives ``2 (t - 1) / t`` of the buffer per GPU:
        ``t_ar = n * alpha + 2 (t - 1) / t * B / L_eff`` (``alpha``: per-call latency,
        ``L_eff``: link x calibrated link efficiency).
        """
        ring = 2 * (self.degree - 1) / self.degree
        return count * ALLREDUCE_LATENCY_S + ring * total_bytes / self.link_bytes_per_s


def kv_cache_share_bytes(kv_cache_bytes: int, kv_heads: int, degree: int) -> int:
    """One GPU's share of a layer's KV cache traffic [B]: its ``kv_heads_per_rank`` of the
    ``kv_heads`` (:func:`app.domain.parallel.kv_heads_per_rank`: replicated past them), or
    ``1 / degree`` when the heads are unknown."""
    if not kv_heads:
        return -(-kv_cache_bytes // degree)
    return -(-kv_cache_bytes * kv_heads_per_rank(kv_heads, degree) // kv_heads)


def _split_nth(kernels: Sequence[Kernel], degree: int, index: int) -> Kernel:
    """One tensor-parallel GPU's share of ``kernels[index]`` (see :func:`shard`)."""
    k = kernels[index]
    return Kernel(  # the constructor, not dataclasses.replace: ~4x faster per kernel
        name=k.name,
        ops=k.ops,
        flops=-(-k.flops // degree),
        weight_bytes=-(-k.weight_bytes // degree),
        input_bytes=k.input_bytes,
        output_bytes=k.output_bytes,
        kv_cache_bytes=kv_cache_share_bytes(k.kv_cache_bytes, k.kv_heads, degree),
        intermediate_bytes=-(-k.intermediate_bytes // degree),
        launches=k.launches,
        gemms=tuple(g.split(degree) for g in k.gemms),
        heads=k.heads,
        kv_heads=k.kv_heads,
    )


def shard(request: PhasedRequest, degree: int) -> PhasedRequest:
    """One GPU's share of ``request`` split Megatron-style across ``degree`` GPUs.

    Parameters
    ----------
    request : the whole request on one device
    degree : GPUs in the tensor-parallel group [-]

    Returns
    -------
    share : every kernel's FLOPs, weights and spilled attention scores divided by ``degree``
        (attention heads and MLP columns split; activations between kernels stay whole, a
        conservative reading of the replicated norms and residuals), its KV cache traffic
        that of ``max(1, kv_heads // degree)`` KV heads (replicated past them, as vLLM), and
        two all-reduces of the hidden state per attention layer (after the attention output
        projection and after the MLP)

    Raises
    ------
    RooflineInputError
        When ``degree`` < 2, the graph has no attention layer (nothing to split by heads), or
        ``degree`` cannot split an attention layer's heads
        (:func:`app.domain.parallel.check_tensor_parallel`: vLLM refuses to start).
    """
    if degree < 2:
        raise RooflineInputError(f"tensor parallelism needs >= 2 GPUs, got {degree}")
    phases = []
    attention_layers = 0
    checked: set[tuple[int, int]] = set()
    for phase in request.phases:
        source = phase.kernels
        runs = phase._runs[0] if phase._runs else tuple((i, 1) for i in range(len(source)))
        allreduces = allreduce_bytes = 0
        for index, count in runs:
            k = source[index]
            if k.heads and (k.heads, k.kv_heads) not in checked:
                checked.add((k.heads, k.kv_heads))
                try:
                    check_tensor_parallel(k.heads, k.kv_heads, degree, layer=k.name)
                except TensorParallelError as exc:
                    raise RooflineInputError(str(exc)) from exc
            if "attention" in k.ops:
                attention_layers += count
                allreduces += 2 * count
                allreduce_bytes += 2 * count * k.output_bytes
        share = replace(
            phase,
            kernels=LazyKernels(len(source), partial(_split_nth, source, degree), runs),
            allreduces=allreduces,
            allreduce_bytes=allreduce_bytes,
        )
        share._runs.append(runs)  # kernels alike stay alike when split alike
        phases.append(share)
    if not attention_layers:
        raise RooflineInputError(
            "tensor parallelism splits attention heads and MLP columns: the graph has no "
            "attention layer"
        )
    return replace(
        request,
        phases=tuple(phases),
        tensor_parallel=degree,
        assumptions=(
            *request.assumptions,
            f"tensor parallel across {degree} GPUs (Megatron-style): each runs 1/{degree} of "
            "the FLOPs and weights and reads max(1, kv_heads // "
            f"{degree}) KV heads a layer (replicated past them, as vLLM); two ring "
            "all-reduces of the hidden state per "
            f"layer, {ALLREDUCE_LATENCY_S * 1e6:g} us each plus 2 (t - 1) / t of it over the "
            "link",
        ),
    )
