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
    if isinstance(fraction, bool) or not isinstance(fraction, int | float):
        raise FitInputError(f"safety_margin_fraction must be a number, got {fraction!r}")
    if not (math.isfinite(fraction) and 0 <= fraction < 1):
        raise FitInputError(f"safety_margin_fraction must be in [0, 1), got {fraction!r}")
    by_key = {line.key: line.bytes for line in lines}
    context = by_key.get("cuda_context", 0)
    workspace = by_key.get("workspace", 0)
    estimate = peak_bytes - context - workspace
    total = estimate + context + workspace
    margin = math.ceil(total * Fraction(repr(float(fraction))))
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
