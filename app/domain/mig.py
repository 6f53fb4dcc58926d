"""NVIDIA MIG: profiles, layout validity, fit, and partition planning (pure).

A MIG-capable GPU is partitioned into GPU instances. Each profile has compute slices, memory
slices, a usable memory size, a maximum count, and allowed start positions on the memory-slice
axis. A layout is valid when every instance sits on an allowed start of its profile, the
memory-slice intervals ``[start, start + memory_slices)`` do not overlap and stay within the
GPU, per-profile counts stay within their maxima, the instance count stays within the GPU's
maximum, and compute slices sum to at most the GPU's total.

References
----------
NVIDIA Multi-Instance GPU User Guide, "Supported MIG Profiles" and "Placement of GPU
instances"; NVIDIA/mig-parted configuration format.
"""

from __future__ import annotations

from dataclasses import dataclass

MIB = 2**20


@dataclass(frozen=True, slots=True, kw_only=True)
class MigProfileSpec:
    """One GPU-instance profile of a GPU model."""

    name: str
    memory_mib: int
    compute_slices: int
    memory_slices: int
    max_instances: int
    placements: tuple[int, ...]

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
    fitting = [p for p in geometry.profiles if p.memory_bytes >= required_bytes]
    if not fitting:
        return None
    return min(fitting, key=lambda p: (p.compute_slices, p.memory_mib, p.memory_slices, p.name))
