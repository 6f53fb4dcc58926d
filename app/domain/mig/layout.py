"""NVIDIA MIG: profiles, layout validity, fit, and partition planning (pure).

A MIG-capable GPU is partitioned into GPU instances. Each profile has compute slices, memory
slices, a usable memory size, a maximum count, and allowed start positions on the memory-slice
axis. A layout is valid when every instance sits on an allowed start of its profile, the
memory-slice intervals ``[start, start + memory_slices)`` do not overlap and stay within the
GPU, per-profile counts stay within their maxima, the instance count stays within the GPU's
maximum, and compute slices sum to at most the GPU's total.

Public API: ``validate_layout`` (one GPU's layout against those rules), ``valid_layouts``
(every valid layout of a geometry), ``plan_partitions`` (the fewest GPUs hosting a set of
demands, with explicit layouts) and ``mig_parted_config`` (a plan as a mig-parted config).

References
----------
NVIDIA Multi-Instance GPU User Guide, "Supported MIG Profiles" and "Placement of GPU
instances"; NVIDIA/mig-parted configuration format.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass

from app.domain.errors import DomainError
from app.domain.fit import fits
from app.domain.units import MIB


@dataclass(frozen=True, slots=True, kw_only=True)
class MigProfileSpec:
    """One GPU-instance profile of a GPU model."""

    name: str
    memory_mib: int
    compute_slices: int
    memory_slices: int
    max_instances: int
    placements: tuple[int, ...]
    # Streaming multiprocessors of one instance as NVIDIA's profile table gives it (not
    # proportional: 14 on an A100 1g slice, 98 on its 7g); None: not published / not stored.
    sm_count: int | None = None

    @property
    def memory_bytes(self) -> int:
        """Usable memory [B]."""
        return self.memory_mib * MIB


@dataclass(frozen=True, slots=True, kw_only=True)
class MigGeometry:
    """A GPU model's MIG geometry and profiles."""

    gpu: str
    total_compute_slices: int
    total_memory_slices: int
    max_gpu_instances: int
    profiles: tuple[MigProfileSpec, ...]

    def profile(self, name: str) -> MigProfileSpec | None:
        """The profile called ``name``, if any."""
        return next((p for p in self.profiles if p.name == name), None)


def kubernetes_resource(profile_name: str) -> str:
    """Extended resource the NVIDIA device plugin advertises (``+me`` becomes ``.me``)."""
    return "nvidia.com/mig-" + profile_name.replace("+", ".")


def smallest_fitting(geometry: MigGeometry, required_bytes: int) -> MigProfileSpec | None:
    """The profile with the fewest compute slices, then the least memory, that holds
    ``required_bytes``; ties broken by name so the answer never depends on input order."""
    fitting = [p for p in geometry.profiles if fits(required_bytes, p.memory_bytes)]
    if not fitting:
        return None
    return min(fitting, key=lambda p: (p.compute_slices, p.memory_mib, p.memory_slices, p.name))


# --------------------------------------------------------------------------------------------
# Errors
# --------------------------------------------------------------------------------------------


class MigError(DomainError):
    """A MIG planning request is invalid (unknown profile, bad replica count, no demands)."""


# --------------------------------------------------------------------------------------------
# Layout validation
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class Placement:
    """One GPU instance of a layout: a profile at a start on the memory-slice axis."""

    profile: str
    start: int


@dataclass(frozen=True, slots=True, kw_only=True)
class LayoutViolation:
    """One broken validity rule of a layout.

    ``rule`` is one of ``unknown_profile``, ``bad_start``, ``out_of_range``, ``overlap``,
    ``count_over_max``, ``instances_over_max``, ``compute_over_total``; ``instances`` are the
    indices (into the validated sequence) of the instances involved, ascending.
    """

    rule: str
    message: str
    instances: tuple[int, ...]


def _interval(start: int, memory_slices: int) -> str:
    return f"[{start},{start + memory_slices})"


def _starts(spec: MigProfileSpec) -> str:
    return ", ".join(str(s) for s in spec.placements) or "none"


def validate_layout(
    geometry: MigGeometry, placements: Sequence[Placement]
) -> tuple[LayoutViolation, ...]:
    """Check one GPU's layout against the MIG validity rules.

    Parameters
    ----------
    geometry
        The GPU model's MIG geometry.
    placements
        The GPU instances, in any order; violations refer to them by index.

    Returns
    -------
    tuple of LayoutViolation
        Empty when the layout is valid. Otherwise, in this fixed order: per-instance problems
        in instance order (``unknown_profile``, ``bad_start``, ``out_of_range``), overlapping
        pairs ``(i, j)`` with ``i < j`` in lexicographic order, ``count_over_max`` per profile
        in the geometry's profile order, then ``instances_over_max`` and
        ``compute_over_total``. Instances of unknown profiles take part in no other check.

    Notes
    -----
    The rules are those of the module docstring (the NVML checks). Every rule is hereditary:
    removing instances from a valid layout leaves it valid, which the planner relies on.
    Media-extension profiles (``+me``) are held to one instance each through their
    ``max_instances``; whether two *different* ``+me``-style profiles may share a GPU is
    unconfirmed in the reference data, and these rules allow it.
    """
    violations: list[LayoutViolation] = []
    known: list[tuple[int, Placement, MigProfileSpec]] = []
    total = geometry.total_memory_slices
    for i, placement in enumerate(placements):
        spec = geometry.profile(placement.profile)
        label = f"instance {i} ({placement.profile} at {placement.start})"
        if spec is None:
            names = ", ".join(p.name for p in geometry.profiles)
            violations.append(
                LayoutViolation(
                    rule="unknown_profile",
                    message=f"{label}: {geometry.gpu} has no profile '{placement.profile}'; "
                    f"valid profiles: {names}",
                    instances=(i,),
                )
            )
            continue
        known.append((i, placement, spec))
        if placement.start not in spec.placements:
            violations.append(
                LayoutViolation(
                    rule="bad_start",
                    message=f"{label}: {spec.name} cannot start at memory slice "
                    f"{placement.start}; allowed starts: {_starts(spec)}",
                    instances=(i,),
                )
            )
        end = placement.start + spec.memory_slices
        span = _interval(placement.start, spec.memory_slices)
        if placement.start < 0 or end > total:
            violations.append(
                LayoutViolation(
                    rule="out_of_range",
                    message=f"{label}: memory slices {span} lie outside the GPU's "
                    f"{total} memory slices [0,{total})",
                    instances=(i,),
                )
            )
    for a, (i, pi, si) in enumerate(known):
        for j, pj, sj in known[a + 1 :]:
            if pi.start < pj.start + sj.memory_slices and pj.start < pi.start + si.memory_slices:
                violations.append(
                    LayoutViolation(
                        rule="overlap",
                        message=f"instance {j} ({pj.profile} at {pj.start}) overlaps instance {i} "
                        f"({pi.profile} at {pi.start}): memory slices "
                        f"{_interval(pj.start, sj.memory_slices)} and "
                        f"{_interval(pi.start, si.memory_slices)}",
                        instances=(i, j),
                    )
                )
    for spec in geometry.profiles:
        members = tuple(i for i, _, s in known if s.name == spec.name)
        if len(members) > spec.max_instances:
            violations.append(
                LayoutViolation(
                    rule="count_over_max",
                    message=f"{len(members)} instances of {spec.name} (instances "
                    f"{', '.join(map(str, members))}); at most {spec.max_instances} allowed "
                    f"on {geometry.gpu}",
                    instances=members,
                )
            )
    everyone = tuple(i for i, _, _ in known)
    if len(known) > geometry.max_gpu_instances:
        violations.append(
            LayoutViolation(
                rule="instances_over_max",
                message=f"{len(known)} GPU instances; {geometry.gpu} allows at most "
                f"{geometry.max_gpu_instances}",
                instances=everyone,
            )
        )
    compute = sum(s.compute_slices for _, _, s in known)
    if compute > geometry.total_compute_slices:
        terms = " + ".join(f"{s.compute_slices} ({s.name})" for _, _, s in known)
        violations.append(
            LayoutViolation(
                rule="compute_over_total",
                message=f"compute slices sum to {compute} = {terms}; {geometry.gpu} has "
                f"{geometry.total_compute_slices}",
                instances=everyone,
            )
        )
    return tuple(violations)


# --------------------------------------------------------------------------------------------
# Layout enumeration
# --------------------------------------------------------------------------------------------

ConcreteLayout = tuple[tuple[int, int], ...]
"""A concrete layout as ``(profile index, start)`` pairs in start order."""


def _largest_first(spec: MigProfileSpec) -> tuple[int, int, int, str]:
    return (-spec.compute_slices, -spec.memory_slices, -spec.memory_mib, spec.name)


@functools.lru_cache(maxsize=128)
def enumerate_layouts(
    geometry: MigGeometry, specs: tuple[MigProfileSpec, ...]
) -> tuple[ConcreteLayout, ...]:
    """Every valid layout (the empty one included) built from ``specs`` only."""
    total = geometry.total_memory_slices
    starting: list[list[int]] = [[] for _ in range(total)]
    for index, spec in enumerate(specs):
        for start in sorted(set(spec.placements)):
            if 0 <= start and start + spec.memory_slices <= total and spec.memory_slices > 0:
                starting[start].append(index)
    counts = [0] * len(specs)
    chosen: list[tuple[int, int]] = []
    found: list[ConcreteLayout] = []

    def walk(slice_: int, compute: int) -> None:
        if slice_ >= total:
            found.append(tuple(chosen))
            return
        walk(slice_ + 1, compute)
        if len(chosen) >= geometry.max_gpu_instances:
            return
        for index in starting[slice_]:
            spec = specs[index]
            if (
                counts[index] < spec.max_instances
                and compute + spec.compute_slices <= geometry.total_compute_slices
            ):
                counts[index] += 1
                chosen.append((index, slice_))
                walk(slice_ + spec.memory_slices, compute + spec.compute_slices)
                chosen.pop()
                counts[index] -= 1

    walk(0, 0)
    return tuple(found)


def valid_layouts(
    geometry: MigGeometry, profiles: Sequence[str] | None = None
) -> tuple[tuple[Placement, ...], ...]:
    """Every non-empty valid layout of ``geometry`` with concrete starts.

    Parameters
    ----------
    geometry
        The GPU model's MIG geometry.
    profiles
        Restrict the layouts to these profile names (unknown names raise ``MigError``);
        ``None`` means every profile of the geometry.

    Returns
    -------
    tuple of tuple of Placement
        Each layout's instances in start order. Layouts are generated by a walk along the
        memory-slice axis that, at every free slice, either leaves it empty or starts an
        instance there, so each set of instances appears exactly once. The enumeration is
        cached per geometry and profile set.
    """
    specs = profiles_named(geometry, profiles)
    return tuple(
        tuple(Placement(profile=specs[i].name, start=s) for i, s in layout)
        for layout in enumerate_layouts(geometry, specs)
        if layout
    )


def profiles_named(
    geometry: MigGeometry, names: Sequence[str] | None
) -> tuple[MigProfileSpec, ...]:
    if names is None:
        return tuple(sorted(geometry.profiles, key=_largest_first))
    specs: list[MigProfileSpec] = []
    for name in sorted(set(names)):
        spec = geometry.profile(name)
        if spec is None:
            raise MigError(unknown_profile(geometry, name))
        specs.append(spec)
    return tuple(sorted(specs, key=_largest_first))


def unknown_profile(geometry: MigGeometry, name: str) -> str:
    names = ", ".join(p.name for p in geometry.profiles)
    return f"unknown MIG profile '{name}' for {geometry.gpu}; valid profiles: {names}"
