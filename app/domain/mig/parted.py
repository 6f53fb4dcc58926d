"""A partition plan as an NVIDIA mig-parted configuration."""

from __future__ import annotations

from typing import Any

from app.domain.mig.layout import MigError, MigGeometry, unknown_profile
from app.domain.mig.plan import PartitionPlan

# --------------------------------------------------------------------------------------------
# mig-parted export
# --------------------------------------------------------------------------------------------


def mig_parted_config(
    geometry: MigGeometry, plan: PartitionPlan, *, config_name: str
) -> dict[str, Any]:
    """The plan as an NVIDIA mig-parted configuration (plain dicts, ready for YAML/JSON).

    Parameters
    ----------
    geometry
        The GPU model the plan was made for (fixes the order of ``mig-devices`` keys).
    plan
        A plan from ``plan_partitions``.
    config_name
        Key under ``mig-configs``.

    Returns
    -------
    dict
        ``{"version": "v1", "mig-configs": {config_name: [entry, ...]}}`` with one entry per
        distinct count layout, in order of its first GPU: ``{"devices": [indices],
        "mig-enabled": True, "mig-devices": {profile: count}}``; ``devices`` is ``"all"``
        when a single layout covers every GPU. Profiles appear in the geometry's order.

    Notes
    -----
    mig-parted applies counts only: the driver chooses the placement of each instance, so
    the plan's explicit starts are the layout to verify against (``nvidia-smi mig -lgi``),
    not something mig-parted enforces. Device indices are plan indices; a node with fewer
    GPUs needs the entries split per node.
    """
    if not config_name:
        raise MigError("config_name must not be empty")
    order = {spec.name: i for i, spec in enumerate(geometry.profiles)}
    groups: dict[tuple[tuple[str, int], ...], list[int]] = {}
    for gpu in plan.gpus:
        counts: dict[str, int] = {}
        for inst in gpu.instances:
            if inst.profile not in order:
                raise MigError(unknown_profile(geometry, inst.profile))
            counts[inst.profile] = counts.get(inst.profile, 0) + 1
        key = tuple(sorted(counts.items(), key=lambda kv: order[kv[0]]))
        groups.setdefault(key, []).append(gpu.index)
    entries: list[dict[str, Any]] = []
    for key, devices in groups.items():
        entries.append(
            {
                "devices": "all" if len(groups) == 1 else sorted(devices),
                "mig-enabled": True,
                "mig-devices": dict(key),
            }
        )
    return {"version": "v1", "mig-configs": {config_name: entries}}
