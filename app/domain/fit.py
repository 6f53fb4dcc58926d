"""ONE requirement and fit computation: the memory a workload needs on a device, and whether it
fits there.

The memory estimate, the MIG fit and plan, the admission webhook and the recommendations all
call :func:`requirement` and :func:`fit`, so one workload on one device (or MIG profile) gets
one required size and one verdict everywhere.

required = estimate + CUDA context + workspace + ceil((the three) x safety margin fraction),
where "estimate" is the memory engine's peak without the context and workspace lines (they are
reported on their own, since they come from the hardware profile or the request, not from the
model). On CPU runtimes both are 0.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction
from functools import lru_cache
from typing import TYPE_CHECKING

from app.domain.errors import DomainError

if TYPE_CHECKING:  # annotations only: the MIG layout reads the verdict, the memory engine the
    # layout (through the hardware spec), so a runtime import would close a loop
    from app.domain.memory.result import MemoryLine


class FitInputError(DomainError):
    """A requirement that cannot be computed (a bad margin)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class RequirementLine:
    """One named part of a requirement, with the arithmetic that gives it."""

    key: str  # memory_estimate, cuda_context, workspace, safety_margin
    bytes: int
    formula: str


@dataclass(frozen=True, slots=True, kw_only=True)
class Requirement:
    """What a workload needs on one device: named lines and their sum."""

    lines: tuple[RequirementLine, ...]
    required_bytes: int
    safety_margin_fraction: float


@dataclass(frozen=True, slots=True, kw_only=True)
class Fit:
    """A requirement against the usable memory of a device or MIG profile."""

    required_bytes: int
    usable_bytes: int
    headroom_bytes: int  # negative: short by
    fits: bool


def requirement(
    peak_bytes: int,
    lines: Sequence[MemoryLine],
    *,
    safety_margin_fraction: float,
    sources: Mapping[str, str] | None = None,
) -> Requirement:
    """The requirement of a memory estimate (its peak and breakdown lines).

    Parameters
    ----------
    peak_bytes : the estimate's peak, context and workspace lines included [B]
    lines : the estimate's breakdown (``cuda_context`` and ``workspace`` are taken from it)
    safety_margin_fraction : reserve on top of the three, in [0, 1) [-]
    sources : where the ``cuda_context`` and ``workspace`` figures come from (shown in their
        formulas; default: the estimate's lines)
    """
    sources = sources or {}
    fraction = safety_margin_fraction
    exact = _margin_fraction(fraction)
    by_key = {line.key: line.bytes for line in lines}
    context = by_key.get("cuda_context", 0)
    workspace = by_key.get("workspace", 0)
    estimate = peak_bytes - context - workspace
    total = estimate + context + workspace
    margin = math.ceil(total * exact)
    parts = (
        RequirementLine(
            key="memory_estimate",
            bytes=estimate,
            formula=f"{peak_bytes:,} [B peak] - {context:,} [B CUDA context] - {workspace:,} "
            f"[B workspace] = {estimate:,} B",
        ),
        RequirementLine(
            key="cuda_context",
            bytes=context,
            formula=f"{context:,} [B CUDA context: "
            f"{sources.get('cuda_context', 'the estimate line')}] = {context:,} B",
        ),
        RequirementLine(
            key="workspace",
            bytes=workspace,
            formula=f"{workspace:,} [B workspace: "
            f"{sources.get('workspace', 'the estimate line')}] = {workspace:,} B",
        ),
        RequirementLine(
            key="safety_margin",
            bytes=margin,
            formula=f"ceil({total:,} [B estimate + context + workspace] x {float(fraction)!r}) "
            f"= {margin:,} B",
        ),
    )
    return Requirement(
        lines=parts,
        required_bytes=sum(line.bytes for line in parts),
        safety_margin_fraction=float(fraction),
    )


def required_bytes(peak_bytes: int, *, safety_margin_fraction: float) -> int:
    """:func:`requirement`'s ``required_bytes`` alone, without its lines and formulas (a
    caller that reads only the number: the recommendation search asks for hundreds) [B].

    The context and workspace lines are parts of the peak, so the sum of the lines is the
    peak plus ``ceil(peak x safety_margin_fraction)`` whatever the breakdown says."""
    return peak_bytes + math.ceil(peak_bytes * _margin_fraction(safety_margin_fraction))


@lru_cache(maxsize=64)
def _exact_fraction(fraction: float) -> Fraction:
    """``fraction`` as the decimal it prints as (0.1 is 1/10, not the binary double)."""
    return Fraction(repr(float(fraction)))


def _margin_fraction(fraction: float) -> Fraction:
    """A validated safety margin fraction as an exact :class:`~fractions.Fraction`."""
    if isinstance(fraction, bool) or not isinstance(fraction, int | float):
        raise FitInputError(f"safety_margin_fraction must be a number, got {fraction!r}")
    if not (math.isfinite(fraction) and 0 <= fraction < 1):
        raise FitInputError(f"safety_margin_fraction must be in [0, 1), got {fraction!r}")
    return _exact_fraction(float(fraction))


def fits(required_bytes: int, usable_bytes: int) -> bool:
    """THE fit verdict: a requirement fits a device or MIG profile when it is at most its usable
    memory (the margin is a line of the requirement, not a second test here). Every verdict in
    the service (fit, MIG fit and plan, larger GPUs, admission) is this function."""
    return required_bytes <= usable_bytes


def fit(required: Requirement, usable_bytes: int) -> Fit:
    """The verdict of ``required`` on ``usable_bytes`` of memory (:func:`fits`)."""
    return Fit(
        required_bytes=required.required_bytes,
        usable_bytes=usable_bytes,
        headroom_bytes=usable_bytes - required.required_bytes,
        fits=fits(required.required_bytes, usable_bytes),
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class EngineStageNeed:
    """What one GPU of a serving engine's pipeline stage spends before its KV cache, and the
    KV cache it must hold [B] (app.domain.engines: weights, profile-run peak, memory outside
    the allocator, a CUDA-graph pool the engine sizes before its KV cache, KV bytes a token,
    buffers built with the weights such as vLLM's rotary cos/sin cache)."""

    weights_bytes: int
    peak_bytes: int
    non_torch_bytes: int
    graphs_bytes: int  # 0 where the engine captures its graphs after sizing the KV cache
    kv_bytes_per_token: int
    rotary_cache_bytes: int = 0


def engine_kv_bytes_needed(
    kv_bytes_per_token: int, *, sequences: int, max_model_len: int, block_size: int
) -> int:
    """The KV pool that holds ``sequences`` sequences of ``max_model_len`` tokens in whole
    blocks of ``block_size`` tokens [B]: ``ceil(sequences x max_model_len / block_size) x
    block_size x kv_bytes_per_token``. With one sequence it is vLLM's start test
    (``check_enough_kv_cache_memory``, vllm/v1/core/kv_cache_utils.py 0.19); with N, the pool
    whose KV tokens (whole blocks) give a concurrency at ``max_model_len`` of at least N."""
    blocks = -(-(sequences * max_model_len) // block_size)
    return blocks * block_size * kv_bytes_per_token


def smallest_claiming(total_bytes: int, utilization: float) -> int:
    """The least memory ``V`` a device must show for ``floor(utilization x V) >= total_bytes``
    [B]: what an engine that claims ``utilization`` of the memory it sees (vLLM's
    ``requested_memory = gpu_memory_utilization x total_memory``, floored as the engine model
    floors it) needs to be shown. Exact in float arithmetic: the ceil of the quotient is
    corrected by the same product the engine computes."""
    if not 0 < utilization <= 1:
        raise FitInputError(f"utilization must be in (0, 1], got {utilization!r}")
    if total_bytes <= 0:
        return 0
    size = math.ceil(total_bytes / utilization)
    while size > 0 and math.floor(utilization * (size - 1)) >= total_bytes:
        size -= 1
    while math.floor(utilization * size) < total_bytes:
        size += 1
    return size


def engine_requirement(
    stages: Sequence[EngineStageNeed],
    *,
    gpu_memory_utilization: float,
    sequences: int,
    max_model_len: int,
    block_size: int,
    engine: str,
) -> Requirement:
    """The requirement of a serving engine on one GPU: the least memory the GPU must show to
    CUDA for the engine to start with a KV pool of at least ``sequences`` sequences of
    ``max_model_len`` tokens on every pipeline stage [B].

    The engine claims ``gpu_memory_utilization`` of what the GPU shows and sizes its KV pool
    as the claim less weights, profile peak and memory outside the allocator, so it starts
    (with that concurrency) on a GPU showing ``V`` bytes exactly when ``floor(utilization x V)
    >= weights + rotary cache + peak + non-torch + graphs + KV needed`` on the stage that
    needs most; the
    requirement is the least such ``V`` (:func:`smallest_claiming`), and :func:`fits` against
    the memory the GPU shows is the engine's own verdict. Lines: the stage's parts, then the
    ``1 - utilization`` the engine leaves unclaimed (its own margin: no safety margin is
    added on top).
    """
    if sequences < 1 or max_model_len < 1 or block_size < 1 or not stages:
        raise FitInputError("sequences, max_model_len, block_size >= 1 and a stage are needed")
    totals = []
    for stage in stages:
        kv = engine_kv_bytes_needed(
            stage.kv_bytes_per_token,
            sequences=sequences,
            max_model_len=max_model_len,
            block_size=block_size,
        )
        spent = (
            stage.weights_bytes
            + stage.rotary_cache_bytes
            + stage.peak_bytes
            + stage.non_torch_bytes
        )
        # vLLM refuses a pool of zero bytes even without KV layers (NO_MEMORY_MESSAGE)
        totals.append((spent + stage.graphs_bytes + max(kv, 1), kv, stage))
    total, kv, worst = max(totals, key=lambda item: item[0])
    required = smallest_claiming(total, gpu_memory_utilization)
    unclaimed = required - total
    index = totals.index((total, kv, worst))
    where = f", pipeline stage {index} of {len(stages)}" if len(stages) > 1 else ""
    parts = (
        RequirementLine(
            key="engine_weights",
            bytes=worst.weights_bytes,
            formula=f"{worst.weights_bytes:,} [B weights on one GPU{where}] "
            f"= {worst.weights_bytes:,} B",
        ),
        RequirementLine(
            key="engine_rotary_cache",
            bytes=worst.rotary_cache_bytes,
            formula=f"{worst.rotary_cache_bytes:,} [B rotary cos/sin cache built with the "
            f"weights{where}] = {worst.rotary_cache_bytes:,} B",
        ),
        RequirementLine(
            key="engine_profile_peak",
            bytes=worst.peak_bytes,
            formula=f"{worst.peak_bytes:,} [B {engine} profile-run peak] = {worst.peak_bytes:,} B",
        ),
        RequirementLine(
            key="engine_non_torch",
            bytes=worst.non_torch_bytes + worst.graphs_bytes,
            formula=f"{worst.non_torch_bytes:,} [B outside the allocator] + "
            f"{worst.graphs_bytes:,} [B CUDA graphs sized before the KV cache] = "
            f"{worst.non_torch_bytes + worst.graphs_bytes:,} B",
        ),
        RequirementLine(
            key="engine_kv_cache",
            bytes=total
            - worst.weights_bytes
            - worst.rotary_cache_bytes
            - worst.peak_bytes
            - worst.non_torch_bytes
            - worst.graphs_bytes,
            formula=f"ceil({sequences} [sequences] x {max_model_len:,} [tokens] / {block_size} "
            f"[tokens a block]) x {block_size} x {worst.kv_bytes_per_token:,} [B KV a token] = "
            f"{kv:,} B (at least 1 B: the engine refuses an empty pool)",
        ),
        RequirementLine(
            key="engine_unclaimed",
            bytes=unclaimed,
            formula=f"least V with floor({gpu_memory_utilization!r} [gpu_memory_utilization] x V) "
            f">= {total:,} [B the lines above]: V = {required:,} B, of which the engine leaves "
            f"{unclaimed:,} B unclaimed",
        ),
    )
    return Requirement(lines=parts, required_bytes=required, safety_margin_fraction=0.0)
