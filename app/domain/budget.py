"""Work budgets and cooperative cancellation for CPU-heavy requests (pure stdlib).

Two small tools that bound what one request may cost:

1. **A work budget known before the work starts.** :func:`graph_layers` sizes a graph
   (layers as written and as executed, repeats expanded); :func:`work_units` multiplies a graph
   size by the number of evaluations a request asks for (candidates x precisions x batch
   points, or one estimate); :func:`check_budget` raises :class:`WorkBudgetExceeded` naming the
   factors and what to reduce when the product is over the limit. A *work unit* is one layer
   evaluated once (shape inference, memory planning or a roofline prediction of one layer).

2. **Cooperative cancellation.** A :class:`CancelToken` carries a deadline (a monotonic-clock
   instant) and a cancel flag. Whoever runs the work binds it with :func:`bound` (a context
   manager, in the thread that computes); hot loops call :func:`checkpoint`, which raises
   :class:`WorkCancelled` once the token is cancelled or its deadline has passed, so the
   computation unwinds, its thread returns and its slot is released. Without a bound token
   :func:`checkpoint` does nothing (tests, the CLI, pure callers).

Usage::

    from app.domain.budget import CancelToken, bound, checkpoint

    token = CancelToken.after(8.0)         # deadline: 8 s from now
    with bound(token):                     # in the thread that computes
        for layer in layers:
            checkpoint()                   # ~0.15 us; raises WorkCancelled when due
            ...
    token.cancel("client disconnected")    # from any thread: the next checkpoint raises

A checkpoint costs a context-variable read and a clock read (~0.15 us); loops over layers call
it once per :data:`CHECK_EVERY` layers (``if not index & CHECK_EVERY_MASK: checkpoint()``), so
the work stops within milliseconds of its deadline. The runner that owns the deadline and the
slots is app.api.compute.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

# Loops over layers call checkpoint() once per this many layers (a power of two: ``if not
# index & CHECK_EVERY_MASK``), so a 100,000-layer walk pays ~400 checks, not 100,000.
CHECK_EVERY = 256
CHECK_EVERY_MASK = CHECK_EVERY - 1


class WorkCancelled(Exception):
    """The work was stopped at a checkpoint: its deadline passed or it was cancelled.

    ``reason`` is ``"deadline"`` or the reason given to :meth:`CancelToken.cancel`.
    Deliberately not a DomainError: it is not about the input, and no handler may turn it into
    a 422 about a layer."""

    def __init__(self, reason: str, *, deadline_s: float) -> None:
        super().__init__(f"work stopped: {reason}")
        self.reason = reason
        self.deadline_s = deadline_s


class CancelToken:
    """A deadline plus a cancel flag shared between a computing thread and its owner."""

    __slots__ = ("_reason", "deadline", "deadline_s")

    def __init__(self, deadline: float, deadline_s: float) -> None:
        self.deadline = deadline  # time.monotonic() instant
        self.deadline_s = deadline_s  # the allowance it was made with, for messages
        self._reason: str | None = None

    @classmethod
    def after(cls, seconds: float) -> CancelToken:
        """A token whose deadline is ``seconds`` from now."""
        return cls(time.monotonic() + seconds, seconds)

    def cancel(self, reason: str = "cancelled") -> None:
        """Ask the work to stop at its next checkpoint (thread-safe: one attribute write)."""
        if self._reason is None:
            self._reason = reason

    @property
    def reason(self) -> str | None:
        """Why the work was stopped (None: not stopped)."""
        return self._reason

    def expired(self) -> bool:
        """Cancelled, or past the deadline (marks the token with ``"deadline"`` then)."""
        if self._reason is None and time.monotonic() >= self.deadline:
            self._reason = "deadline"
        return self._reason is not None

    def check(self) -> None:
        """Raise :class:`WorkCancelled` when the token is cancelled or past its deadline."""
        if self._reason is None:
            if time.monotonic() < self.deadline:
                return
            self._reason = "deadline"
        raise WorkCancelled(self._reason, deadline_s=self.deadline_s)


_CURRENT: ContextVar[CancelToken | None] = ContextVar("capplan_cancel_token", default=None)


@contextmanager
def bound(token: CancelToken | None) -> Iterator[CancelToken | None]:
    """Make ``token`` the one :func:`checkpoint` checks in this thread (context)."""
    reset = _CURRENT.set(token)
    try:
        yield token
    finally:
        _CURRENT.reset(reset)


def current() -> CancelToken | None:
    """The token bound in this context (None: unbounded work)."""
    return _CURRENT.get()


def checkpoint() -> None:
    """Stop here (raise :class:`WorkCancelled`) if the bound token says so; else return."""
    token = _CURRENT.get()
    if token is not None:
        token.check()


# --------------------------------------------------------------------------------------------
# The work budget
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class GraphSize:
    """How big a graph is: layers as written and as executed.

    Attributes
    ----------
    written_layers : int
        Layer records in the request or stored row, nested ones included [layers].
    executed_layers : int
        Layers after expanding every ``repeat`` ``times`` times [layers]; what a memory plan
        and a roofline prediction walk.
    """

    written_layers: int
    executed_layers: int


def graph_layers(layers: Sequence[Any]) -> GraphSize:
    """Count a graph's layers as written and as executed (``repeat`` bodies times ``times``).

    Robust to graphs not validated yet (a non-integer ``times`` counts as 1): it runs before
    validation to refuse oversized work early, and costs one pass over the records.
    """
    written = 0
    executed = 0
    stack: list[tuple[Sequence[Any], int]] = [(layers, 1)]
    while stack:
        body, factor = stack.pop()
        for raw in body:
            written += 1
            executed += factor
            if not isinstance(raw, Mapping):
                continue
            nested = raw.get("layers")
            if isinstance(nested, list) and nested:
                times = raw.get("times", 1) if raw.get("op") == "repeat" else 1
                if not isinstance(times, int) or isinstance(times, bool) or times < 1:
                    times = 1
                stack.append((nested, factor * times))
    return GraphSize(written_layers=written, executed_layers=executed)


@dataclass(frozen=True, slots=True, kw_only=True)
class WorkFactor:
    """One factor of a work estimate: its value, what it counts, and the request field that
    sets it (what to reduce)."""

    name: str
    value: int
    field: str


# Work units per executed layer of one memory estimate, relative to one layer predicted on one
# device at one precision and batch (the unit, ~0.55 us on the reference machine;
# docs/configuration.md, "Work budgets"). Measured: a recommendation's memory fit (the inference
# peak) ~5.6 us per layer; a full inference estimate (breakdown, allocator replay) ~9.4 us per
# executed layer of a repeated graph (99,990 layers in 0.94 s; distinct layers add their analysis,
# ~28 us each); a training estimate (forward, backward and optimizer events replayed twice) 170-440
# us, growing with depth. Past MAX_REPLAYED_LAYERS executed layers the allocator is not replayed
# (its events dominated both modes' cost): a 99,999-layer repeated graph took 0.69 s of CPU to
# train-estimate and 0.52 s to inference-estimate through the API (+94 / +64 MiB peak RSS) on a
# loaded 2-core machine, about 7 us (12.5 units) per layer: 15 units covers either mode.
PEAK_LAYER_UNITS = 10
INFERENCE_LAYER_UNITS = 20
TRAINING_LAYER_UNITS = 200
UNREPLAYED_LAYER_UNITS = 15


@dataclass(frozen=True, slots=True, kw_only=True)
class WorkTerm:
    """``weight`` x the product of ``factors`` [work units]."""

    factors: tuple[WorkFactor, ...]
    weight: int = 1

    @property
    def units(self) -> int:
        """The term's work [work units]."""
        units = self.weight
        for factor in self.factors:
            units *= max(1, factor.value)
        return units

    def describe(self) -> str:
        """``"1,000 graph layers x 40 devices"`` (with ``"10 x "`` in front for a weight)."""
        product = " x ".join(f"{f.value:,} {f.name}" for f in self.factors)
        return product if self.weight == 1 else f"{self.weight} x {product}"


@dataclass(frozen=True, slots=True, kw_only=True)
class WorkEstimate:
    """The work a request will do: a sum of products of its factors.

    Attributes
    ----------
    terms : tuple of WorkTerm
        What the work is made of (one term per kind of evaluation).
    """

    terms: tuple[WorkTerm, ...]

    @property
    def units(self) -> int:
        """Total work [work units]: the sum of the terms."""
        return sum(term.units for term in self.terms)

    @property
    def factors(self) -> tuple[WorkFactor, ...]:
        """Every factor of every term, each request field once (its largest value)."""
        chosen: dict[str, WorkFactor] = {}
        for term in self.terms:
            for factor in term.factors:
                if factor.field not in chosen or factor.value > chosen[factor.field].value:
                    chosen[factor.field] = factor
        return tuple(chosen.values())

    def describe(self) -> str:
        """``"1,000 graph layers x 40 devices + 10 x 1,000 executed layers"``."""
        return " + ".join(term.describe() for term in self.terms)

    def __add__(self, other: WorkEstimate) -> WorkEstimate:
        return WorkEstimate(terms=self.terms + other.terms)


def work_units(*factors: WorkFactor, weight: int = 1) -> WorkEstimate:
    """The work of evaluations counted by the product of ``factors``, ``weight`` units each.

    Parameters
    ----------
    factors : WorkFactor
        For example graph layers [layers], candidate devices [1], precisions [1], batch sizes
        searched [1]. A factor below 1 counts as 1 (an empty list still costs one pass).
    weight : int
        Work units per evaluation [work units]: 1 for a layer predicted on one device,
        :data:`PEAK_LAYER_UNITS`, :data:`INFERENCE_LAYER_UNITS` or
        :data:`TRAINING_LAYER_UNITS` for a layer of a memory estimate.

    Returns
    -------
    WorkEstimate
        One term: ``units`` = weight x prod(max(1, factor.value)) [work units]. Add estimates
        (``a + b``) for requests that do several kinds of work.

    Notes
    -----
    A work unit is about half a microsecond of CPU on the reference machine (2 cores, one
    layer predicted on one device at one precision and batch). The rule is an upper bound:
    memoisation and cloned repeat iterations make some evaluations cheaper, and the limit it is
    checked against (CAPPLAN_MAX_WORK_UNITS) was set from measured CPU time per unit.
    """
    return WorkEstimate(terms=(WorkTerm(factors=tuple(factors), weight=weight),))


def estimate_work(
    graph: GraphSize, estimates: WorkFactor, *, field: str, training: bool, replayed: bool = True
) -> WorkEstimate:
    """The work of ``estimates`` full memory estimates of a graph: every executed layer of each,
    :func:`estimate_layer_units` units per layer (``field``: where the request names the
    graph; ``replayed``: whether the estimate replays the caching allocator)."""
    return work_units(
        WorkFactor(name="executed layers", value=graph.executed_layers, field=field),
        estimates,
        weight=estimate_layer_units(training=training, replayed=replayed),
    )


def estimate_layer_units(*, training: bool, replayed: bool) -> int:
    """Work units per executed layer of one full memory estimate [work units].

    :data:`TRAINING_LAYER_UNITS` or :data:`INFERENCE_LAYER_UNITS` when the caching allocator is
    replayed, :data:`UNREPLAYED_LAYER_UNITS` when it is not (a graph of more than
    ``app.domain.memory.estimate.MAX_REPLAYED_LAYERS`` executed layers: each tensor is rounded
    instead)."""
    if not replayed:
        return UNREPLAYED_LAYER_UNITS
    return TRAINING_LAYER_UNITS if training else INFERENCE_LAYER_UNITS


class WorkBudgetExceeded(Exception):
    """The request's work estimate is over the budget; the message names what to reduce.

    Not a DomainError: the input is valid, only too expensive to serve (the API answers it
    with its own problem type, ``/problems/too-expensive``)."""

    def __init__(self, estimate: WorkEstimate, limit_units: int, setting: str) -> None:
        self.estimate = estimate
        self.limit_units = limit_units
        self.setting = setting
        biggest = sorted(estimate.factors, key=lambda f: -f.value)
        reduce = ", ".join(f"{f.field} ({f.name}: {f.value:,})" for f in biggest if f.value > 1)
        super().__init__(
            f"this request asks for {estimate.units:,} work units ({estimate.describe()}); "
            f"the limit is {limit_units:,} ({setting}); reduce "
            + (reduce or "the graph")
            + " so that the product is under the limit"
        )

    @property
    def fields(self) -> list[str]:
        """The request fields that set the factors above 1, biggest factor first."""
        ordered = sorted(self.estimate.factors, key=lambda f: -f.value)
        return [f.field for f in ordered if f.value > 1]


def check_budget(estimate: WorkEstimate, limit_units: int, *, setting: str) -> WorkEstimate:
    """``estimate`` when it is within ``limit_units``; else :class:`WorkBudgetExceeded`."""
    if estimate.units > limit_units:
        raise WorkBudgetExceeded(estimate, limit_units, setting)
    return estimate
