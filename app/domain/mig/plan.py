"""MIG partition planning: the fewest GPUs hosting a set of demands, with explicit layouts."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction

from app.domain.mig.layout import (
    ConcreteLayout,
    MigError,
    MigGeometry,
    MigProfileSpec,
    Placement,
    enumerate_layouts,
    profiles_named,
    unknown_profile,
    validate_layout,
)

MAX_REPLICAS_PER_DEMAND = 10_000
SEARCH_NODE_BUDGET = 40_000
"""Nodes the exact covering search may expand before it settles for its best bound.

A node budget, not a time budget, so that the same request always gives the same plan."""

# --------------------------------------------------------------------------------------------
# Planning: data
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class Demand:
    """``replicas`` GPU instances of ``profile`` for ``workload``."""

    workload: str
    profile: str
    replicas: int


@dataclass(frozen=True, slots=True, kw_only=True)
class PlacedInstance:
    """One replica of a workload on a GPU instance at ``start`` (memory-slice axis)."""

    workload: str
    profile: str
    start: int


@dataclass(frozen=True, slots=True, kw_only=True)
class GpuAssignment:
    """One planned GPU: its instances (by start) and what is left of it."""

    index: int
    instances: tuple[PlacedInstance, ...]
    free_compute_slices: int
    free_memory_slices: int
    unused_memory_slices: tuple[int, ...]

    def placements(self) -> tuple[Placement, ...]:
        """The layout, as ``validate_layout`` takes it."""
        return tuple(Placement(profile=i.profile, start=i.start) for i in self.instances)


@dataclass(frozen=True, slots=True, kw_only=True)
class PartitionPlan:
    """GPUs that host every demanded replica.

    ``optimal`` is true when the GPU count is proven minimal; otherwise the exact search ran
    out of its node budget and ``lower_bound_gpus`` is the best proven lower bound.
    """

    gpus: tuple[GpuAssignment, ...]
    optimal: bool
    lower_bound_gpus: int

    @property
    def gpu_count(self) -> int:
        """Number of GPUs in the plan."""
        return len(self.gpus)


# --------------------------------------------------------------------------------------------
# Planning: covering search
# --------------------------------------------------------------------------------------------

_Vector = tuple[int, ...]


class _BudgetExhausted(Exception):
    """The covering search expanded more nodes than it may."""


def _maximal(vectors: Sequence[_Vector]) -> list[_Vector]:
    """The vectors no other vector dominates component-wise, in descending order."""
    kept: list[_Vector] = []
    # A dominating vector has a larger sum, so it is kept before the ones it dominates.
    for vector in sorted(set(vectors), key=lambda v: (-sum(v), tuple(-x for x in v))):
        if not any(all(a <= b for a, b in zip(vector, other, strict=True)) for other in kept):
            kept.append(vector)
    return sorted(kept, reverse=True)


def _lp_relaxation(layouts: Sequence[_Vector], demand: _Vector) -> tuple[list[float], list[float]]:
    """Solve the covering LP ``min sum(x) s.t. sum_L x_L c_L >= d, x >= 0``.

    Parameters
    ----------
    layouts
        Count vectors ``c_L`` (every profile occurs in at least one).
    demand
        The demand vector ``d``.

    Returns
    -------
    (y, x)
        A dual solution ``y`` (weights per profile with ``y . c_L <= 1`` for every layout, up
        to float rounding) and the primal solution ``x`` (GPUs per layout).

    Notes
    -----
    Dense-tableau primal simplex on the dual ``max d . y s.t. c_L . y <= 1, y >= 0``, whose
    origin is feasible, with Bland's rule (no cycling on this very degenerate problem). Floats
    are fine: the caller turns ``y`` into an exact, rescaled dual-feasible vector before using
    it as a bound, and uses ``x`` only as a rounding hint.
    """
    k, n = len(demand), len(layouts)
    width = k + n
    eps = 1e-9
    rows = [
        [float(c) for c in layout] + [1.0 if j == i else 0.0 for j in range(n)] + [1.0]
        for i, layout in enumerate(layouts)
    ]
    cost = [-float(d) for d in demand] + [0.0] * n + [0.0]
    basis = [k + i for i in range(n)]
    for _ in range(50 * (width + 1)):
        enter = next((j for j in range(width) if cost[j] < -eps), None)
        if enter is None:
            break
        leave = -1
        best = math.inf
        for i, row in enumerate(rows):
            if row[enter] > eps:
                ratio = row[-1] / row[enter]
                if ratio < best - eps or (ratio <= best + eps and basis[i] < basis[leave]):
                    best, leave = ratio, i
        if leave < 0:  # cannot happen for a covering LP; float noise at worst
            break
        pivot_row = rows[leave]
        pivot = pivot_row[enter]
        for j in range(width + 1):
            pivot_row[j] /= pivot
        for row in (*rows, cost):
            if row is not pivot_row and row[enter] != 0.0:
                factor = row[enter]
                for j in range(width + 1):
                    row[j] -= factor * pivot_row[j]
        basis[leave] = enter
    dual = [0.0] * k
    for i, var in enumerate(basis):
        if var < k:
            dual[var] = max(rows[i][-1], 0.0)
    primal = [max(cost[k + i], 0.0) for i in range(n)]
    return dual, primal


class _Cover:
    """Exact minimum cover of a demand vector by layout count vectors.

    Every GPU takes one layout; a set of layouts covers ``d`` when their count vectors sum to
    at least ``d`` component-wise (validity is hereditary, so surplus instances are dropped).
    """

    def __init__(self, layouts: Sequence[_Vector], weights: Sequence[_Vector]) -> None:
        self.layouts = list(layouts)
        self.k = len(self.layouts[0])
        # Dual-feasible bounds: for any weight w >= 0, cap = max_L w . c_L makes w / cap
        # feasible for the dual LP, so ceil(w . r / cap) GPUs are needed to cover r.
        self.bounds: list[tuple[_Vector, int]] = []
        for w in weights:
            cap = max(sum(a * b for a, b in zip(w, c, strict=True)) for c in self.layouts)
            if cap > 0 and any(w):
                self.bounds.append((w, cap))
        self.order = weights[0]
        self.holders = [[i for i, c in enumerate(self.layouts) if c[p] > 0] for p in range(self.k)]
        self.failed: dict[_Vector, int] = {}
        self.nodes = 0

    def bound(self, need: _Vector) -> int:
        """A lower bound on the GPUs that cover ``need``."""
        best = 0
        for w, cap in self.bounds:
            value = -(-sum(a * b for a, b in zip(w, need, strict=True)) // cap)
            best = max(best, value)
        return best

    def children(self, need: _Vector) -> list[tuple[int, _Vector]]:
        """Branch on the most constrained uncovered profile: some GPU must host it."""
        profile = min(
            (p for p in range(self.k) if need[p] > 0), key=lambda p: (len(self.holders[p]), p)
        )
        seen: dict[_Vector, tuple[int, int]] = {}
        for i in self.holders[profile]:
            c = self.layouts[i]
            child = tuple(max(r - x, 0) for r, x in zip(need, c, strict=True))
            gain = sum(w * (r - x) for w, r, x in zip(self.order, need, child, strict=True))
            if child not in seen:
                seen[child] = (gain, i)
        ranked = sorted(seen.items(), key=lambda kv: (-kv[1][0], kv[1][1]))
        kept: list[tuple[int, _Vector]] = []
        for child, (_, i) in ranked:
            if not any(all(a <= b for a, b in zip(o, child, strict=True)) for _, o in kept):
                kept.append((i, child))
        return kept

    def greedy(self, need: _Vector) -> list[int]:
        """First-fit-decreasing in layout space: each new GPU takes the layout that hosts the
        most of the largest outstanding profiles (layouts carry concrete positions)."""
        chosen: list[int] = []
        while any(need):
            best = max(
                range(len(self.layouts)),
                key=lambda i: (
                    tuple(min(r, c) for r, c in zip(need, self.layouts[i], strict=True)),
                    -i,
                ),
            )
            chosen.append(best)
            need = tuple(max(r - c, 0) for r, c in zip(need, self.layouts[best], strict=True))
        return chosen

    def search(self, root: _Vector, gpus: int, budget: int) -> list[int] | None:
        """A cover of ``root`` with at most ``gpus`` layouts, or None when none exists.

        Iterative depth-first branch and bound; states proven uncoverable with ``g`` GPUs are
        memoised. Raises ``_BudgetExhausted`` past ``budget`` expanded nodes.
        """
        if not any(root):
            return []
        if self.failed.get(root, -1) >= gpus or self.bound(root) > gpus:
            return None
        path: list[int] = []
        stack = [(root, gpus, iter(self.children(root)))]
        while stack:
            need, left, branches = stack[-1]
            advanced = False
            for index, child in branches:
                if not any(child):
                    return [*path, index]
                if left - 1 <= 0 or self.failed.get(child, -1) >= left - 1:
                    continue
                if self.bound(child) > left - 1:
                    continue
                self.nodes += 1
                if self.nodes > budget:
                    raise _BudgetExhausted
                path.append(index)
                stack.append((child, left - 1, iter(self.children(child))))
                advanced = True
                break
            if not advanced:
                self.failed[need] = max(self.failed.get(need, -1), left)
                stack.pop()
                if path:
                    path.pop()
        return None

    def minimum(self, need: _Vector, lower: int, upper: list[int], budget: int) -> list[int]:
        """Raise ``lower`` one GPU at a time until a cover is found (then it is minimal)."""
        for gpus in range(lower, len(upper)):
            found = self.search(need, gpus, budget)
            if found is not None:
                return found
        return upper


def _rational_weights(values: Sequence[float]) -> _Vector:
    fractions = [Fraction(max(v, 0.0)).limit_denominator(10_000) for v in values]
    scale = math.lcm(*(f.denominator for f in fractions))
    return tuple(int(f * scale) for f in fractions)


def _solve_cover(
    layouts: Sequence[_Vector], demand: _Vector, extra_weights: Sequence[_Vector]
) -> tuple[list[int], int, bool]:
    """Minimum number of layouts covering ``demand``.

    Parameters
    ----------
    layouts
        Maximal count vectors of the valid layouts (over the demanded profiles).
    demand
        Replicas per profile.
    extra_weights
        More bound weights (compute and memory slices per profile).

    Returns
    -------
    (cover, lower_bound, optimal)
        Layout indices (one per GPU), the best proven lower bound, and whether the cover
        is proven minimal (``len(cover) == lower_bound``).

    Notes
    -----
    1. Lower bound: the LP relaxation's dual ``y`` (made exact and rescaled), together with
       compute-slice, memory-slice, instance-count and per-profile bounds, each of the form
       ``ceil(w . d / max_L w . c_L)``.
    2. Upper bounds: first-fit-decreasing in layout space, and LP rounding (``floor(x_L)``
       GPUs per layout, the small residual demand solved exactly by the search below).
    3. If they differ, an exact branch and bound over the demand vector (branch on the most
       constrained uncovered profile, memoised failures, the bounds of step 1 at every node)
       tries ``lower``, ``lower + 1``, ... GPUs within ``SEARCH_NODE_BUDGET`` nodes.
    """
    dual, primal = _lp_relaxation(layouts, demand)
    k = len(demand)
    weights: list[_Vector] = [_rational_weights(dual)]
    weights += [tuple(1 if q == p else 0 for q in range(k)) for p in range(k)]
    weights.append(tuple(1 for _ in range(k)))
    weights += extra_weights
    cover = _Cover(layouts, weights)
    lower = cover.bound(demand)
    best = cover.greedy(demand)
    budget = SEARCH_NODE_BUDGET
    if len(best) > lower:
        floors = [math.floor(x + 1e-7) for x in primal]
        for slack in (0, 1):
            base = [max(f - slack, 0) for f in floors]
            covered = [sum(b * c[p] for b, c in zip(base, layouts, strict=True)) for p in range(k)]
            residual = tuple(max(d - s, 0) for d, s in zip(demand, covered, strict=True))
            fixed = [i for i, b in enumerate(base) for _ in range(b)]
            rest = cover.greedy(residual)
            cover.nodes = 0
            try:
                rest = cover.minimum(residual, cover.bound(residual), rest, budget)
            except _BudgetExhausted:
                pass
            if len(fixed) + len(rest) < len(best):
                best = fixed + rest
            if len(best) == lower:
                break
    if len(best) == lower:
        return best, lower, True
    cover.nodes = 0
    try:
        best = cover.minimum(demand, lower, best, budget)
    except _BudgetExhausted:
        proven = max(lower, cover.failed.get(demand, -1) + 1)
        return best, proven, len(best) == proven
    return best, len(best), True


# --------------------------------------------------------------------------------------------
# Planning: from a cover to concrete GPUs
# --------------------------------------------------------------------------------------------


def _room(
    geometry: MigGeometry, specs: tuple[MigProfileSpec, ...], layout: ConcreteLayout
) -> tuple[int, int, int]:
    """How much room ``layout`` leaves: the compute and memory slices of the largest single
    instance (any profile of the geometry) that can still be added, and how many
    ``(profile, start)`` additions are possible at all."""
    occupied: set[int] = set()
    compute = 0
    counts: dict[str, int] = {}
    for index, start in layout:
        spec = specs[index]
        occupied.update(range(start, start + spec.memory_slices))
        compute += spec.compute_slices
        counts[spec.name] = counts.get(spec.name, 0) + 1
    largest = (0, 0)
    options = 0
    if len(layout) >= geometry.max_gpu_instances:
        return (0, 0, 0)
    for spec in geometry.profiles:
        if (
            counts.get(spec.name, 0) >= spec.max_instances
            or compute + spec.compute_slices > geometry.total_compute_slices
        ):
            continue
        for start in set(spec.placements):
            end = start + spec.memory_slices
            if 0 <= start and end <= geometry.total_memory_slices:
                if not occupied.intersection(range(start, end)):
                    options += 1
                    largest = max(largest, (spec.compute_slices, spec.memory_slices))
    return (*largest, options)


def _concrete_for(
    geometry: MigGeometry,
    specs: tuple[MigProfileSpec, ...],
    by_counts: dict[_Vector, list[ConcreteLayout]],
    counts: _Vector,
) -> ConcreteLayout:
    """The concrete layout for ``counts`` that leaves the most room (``_room``) for later
    instances; ties go to the lexicographically smallest ``(start, profile)`` list."""

    def key(layout: ConcreteLayout) -> tuple[int, int, int, list[tuple[int, str]]]:
        compute, memory, options = _room(geometry, specs, layout)
        return (-compute, -memory, -options, [(s, specs[i].name) for i, s in layout])

    return min(by_counts[counts], key=key)


def _check_demands(geometry: MigGeometry, demands: Sequence[Demand]) -> dict[tuple[str, str], int]:
    if not demands:
        raise MigError("no demands: give at least one (workload, profile, replicas)")
    merged: dict[tuple[str, str], int] = {}
    for demand in demands:
        if geometry.profile(demand.profile) is None:
            raise MigError(unknown_profile(geometry, demand.profile))
        if not demand.workload:
            raise MigError(f"a demand for {demand.profile} has an empty workload name")
        replicas = demand.replicas
        if isinstance(replicas, bool) or not 1 <= replicas <= MAX_REPLICAS_PER_DEMAND:
            raise MigError(
                f"workload '{demand.workload}' ({demand.profile}): replicas must be between 1 "
                f"and {MAX_REPLICAS_PER_DEMAND:,}, got {replicas}"
            )
        key = (demand.workload, demand.profile)
        merged[key] = merged.get(key, 0) + replicas
    return merged


def plan_partitions(geometry: MigGeometry, demands: Sequence[Demand]) -> PartitionPlan:
    """The fewest GPUs of ``geometry`` that host every demanded replica, with their layouts.

    Parameters
    ----------
    geometry
        The GPU model's MIG geometry.
    demands
        Replicas per (workload, profile); demands for the same pair are added up.

    Returns
    -------
    PartitionPlan
        One ``GpuAssignment`` per GPU, each an explicit layout that passes
        ``validate_layout``. ``optimal`` says whether the GPU count is proven minimal.

    Raises
    ------
    MigError
        No demands, an unknown profile (the message lists the valid ones), an empty workload
        name, replicas outside ``1..10,000``, or a profile no layout of the geometry can hold.

    Notes
    -----
    1. Enumerate every valid layout over the demanded profiles (concrete starts), group them
       by count vector and keep the maximal vectors: since every validity rule is hereditary,
       any cover by maximal vectors can drop surplus instances and stay valid.
    2. Solve "fewest layouts whose count vectors sum to at least the demand" exactly (see
       ``_solve_cover``: LP bound, FFD and LP-rounding upper bounds, branch and bound).
    3. Trim the cover to the demand (surplus goes to the last GPUs), order GPUs by their
       count vectors (largest profiles first), give each count vector the concrete layout
       that leaves the most compute placeable, and hand out slots profile by profile to
       workloads in name order, so a workload's replicas sit on consecutive slots.

    Everything is sorted by stable keys (profile size and name, workload name), so the plan
    does not depend on the order of ``demands``.
    """
    merged = _check_demands(geometry, demands)
    specs = profiles_named(geometry, sorted({profile for _, profile in merged}))
    position = {spec.name: p for p, spec in enumerate(specs)}
    demand = [0] * len(specs)
    for (_, profile), replicas in merged.items():
        demand[position[profile]] += replicas
    by_counts: dict[_Vector, list[ConcreteLayout]] = {}
    for layout in enumerate_layouts(geometry, specs):
        counts = [0] * len(specs)
        for index, _ in layout:
            counts[index] += 1
        by_counts.setdefault(tuple(counts), []).append(layout)
    maximal = _maximal(list(by_counts))
    for p, spec in enumerate(specs):
        if not any(v[p] for v in maximal):
            raise MigError(
                f"profile {spec.name} fits no layout of {geometry.gpu}: check its placements, "
                "slices and maximum count"
            )
    extra = [
        tuple(s.compute_slices for s in specs),
        tuple(s.memory_slices for s in specs),
    ]
    chosen, lower, optimal = _solve_cover(maximal, tuple(demand), extra)

    remaining = list(demand)
    actual: list[_Vector] = []
    for vector in sorted((maximal[i] for i in chosen), reverse=True):
        take = tuple(min(r, c) for r, c in zip(remaining, vector, strict=True))
        remaining = [r - t for r, t in zip(remaining, take, strict=True)]
        if any(take):
            actual.append(take)
    if any(remaining):
        raise AssertionError(f"cover leaves {remaining} replicas unplaced")
    actual.sort(reverse=True)

    concrete = {c: _concrete_for(geometry, specs, by_counts, c) for c in sorted(set(actual))}
    layouts = [concrete[counts] for counts in actual]
    slots: dict[int, list[tuple[int, int]]] = {p: [] for p in range(len(specs))}
    for gpu, layout in enumerate(layouts):
        for index, start in layout:
            slots[index].append((gpu, start))
    placed: list[list[PlacedInstance]] = [[] for _ in layouts]
    for p, spec in enumerate(specs):
        owners = [
            workload
            for (workload, profile), replicas in sorted(merged.items())
            if profile == spec.name
            for _ in range(replicas)
        ]
        for workload, (gpu, start) in zip(owners, slots[p], strict=True):
            placed[gpu].append(PlacedInstance(workload=workload, profile=spec.name, start=start))

    gpus: list[GpuAssignment] = []
    for gpu, instances in enumerate(placed):
        instances.sort(key=lambda inst: inst.start)
        used: set[int] = set()
        compute = 0
        for inst in instances:
            spec = specs[position[inst.profile]]
            used.update(range(inst.start, inst.start + spec.memory_slices))
            compute += spec.compute_slices
        assignment = GpuAssignment(
            index=gpu,
            instances=tuple(instances),
            free_compute_slices=geometry.total_compute_slices - compute,
            free_memory_slices=geometry.total_memory_slices - len(used),
            unused_memory_slices=tuple(
                s for s in range(geometry.total_memory_slices) if s not in used
            ),
        )
        violations = validate_layout(geometry, assignment.placements())
        if violations:
            raise AssertionError(f"planned GPU {gpu} is invalid: {violations[0].message}")
        gpus.append(assignment)
    return PartitionPlan(gpus=tuple(gpus), optimal=optimal, lower_bound_gpus=lower)
