"""MIG layout validity, layout enumeration, optimal partition planning and mig-parted export.

Geometries come from the shipped hardware catalog (``hardware_catalog/*.yaml``), loaded here
with ``yaml.safe_load``; the domain module itself never reads files.
"""

from __future__ import annotations

import dataclasses
import functools
import random
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import yaml

from app.domain.errors import DomainError
from app.domain.mig.layout import (
    MigError,
    MigGeometry,
    MigProfileSpec,
    Placement,
    valid_layouts,
    validate_layout,
)
from app.domain.mig.parted import mig_parted_config
from app.domain.mig.plan import Demand, PartitionPlan, _BudgetExhausted, _Cover, plan_partitions

CATALOG = Path(__file__).resolve().parents[2] / "hardware_catalog"


@functools.cache
def geometry(slug: str) -> MigGeometry:
    """The MIG geometry of catalog device ``slug``."""
    for path in sorted(CATALOG.glob("*.yaml")):
        data: dict[str, Any] = yaml.safe_load(path.read_text())
        for device in data["devices"]:
            if device["slug"] == slug:
                mig = device["mig"]
                return MigGeometry(
                    gpu=device["name"],
                    total_compute_slices=mig["total_compute_slices"],
                    total_memory_slices=mig["total_memory_slices"],
                    max_gpu_instances=mig["max_gpu_instances"],
                    profiles=tuple(
                        MigProfileSpec(
                            name=p["name"],
                            memory_mib=p["memory_mib"],
                            compute_slices=p["compute_slices"],
                            memory_slices=p["memory_slices"],
                            max_instances=p["max_instances"],
                            placements=tuple(p["placements"]),
                        )
                        for p in mig["profiles"]
                    ),
                )
    raise KeyError(slug)


A100_40 = "nvidia-a100-40gb-sxm"
A100_80 = "nvidia-a100-80gb-sxm"
A30 = "nvidia-a30"
H100 = "nvidia-h100-sxm"
RTX_PRO = "nvidia-rtx-pro-6000-blackwell"


def layout(*items: tuple[str, int]) -> list[Placement]:
    return [Placement(profile=profile, start=start) for profile, start in items]


def rules(slug: str, *items: tuple[str, int]) -> list[str]:
    return [v.rule for v in validate_layout(geometry(slug), layout(*items))]


def demands(*items: tuple[str, str, int]) -> list[Demand]:
    return [Demand(workload=w, profile=p, replicas=n) for w, p, n in items]


def check_plan(slug: str, plan: PartitionPlan, wanted: Sequence[Demand]) -> None:
    """Every GPU valid, indices 0..n-1, free figures right, each replica placed exactly once."""
    geo = geometry(slug)
    assert [gpu.index for gpu in plan.gpus] == list(range(len(plan.gpus)))
    placed: Counter[tuple[str, str]] = Counter()
    for gpu in plan.gpus:
        assert gpu.instances, "a planned GPU hosts at least one replica"
        assert validate_layout(geo, gpu.placements()) == ()
        assert [i.start for i in gpu.instances] == sorted(i.start for i in gpu.instances)
        specs = [geo.profile(i.profile) for i in gpu.instances]
        assert all(s is not None for s in specs)
        used = {
            s
            for i, spec in zip(gpu.instances, specs, strict=True)
            if spec is not None
            for s in range(i.start, i.start + spec.memory_slices)
        }
        compute = sum(spec.compute_slices for spec in specs if spec is not None)
        assert gpu.free_compute_slices == geo.total_compute_slices - compute
        assert gpu.free_memory_slices == geo.total_memory_slices - len(used)
        assert set(gpu.unused_memory_slices) == set(range(geo.total_memory_slices)) - used
        placed.update((i.workload, i.profile) for i in gpu.instances)
    expected: Counter[tuple[str, str]] = Counter()
    for d in wanted:
        expected[(d.workload, d.profile)] += d.replicas
    assert placed == expected


# --------------------------------------------------------------------------------------------
# validate_layout
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "items",
    [
        # NVIDIA MIG user guide, A100-40GB examples.
        [("3g.20gb", 4), ("2g.10gb", 2), ("1g.5gb", 0), ("1g.5gb", 1)],
        [("2g.10gb", 4), *[("1g.5gb", s) for s in (0, 1, 2, 3, 6)]],
        [("4g.20gb", 0), ("3g.20gb", 4)],
        [("3g.20gb", 0), ("3g.20gb", 4)],
        [("7g.40gb", 0)],
        [("1g.5gb", s) for s in range(7)],
        [("1g.10gb", s) for s in (0, 2, 4, 6)],
        [("2g.10gb", 0), ("2g.10gb", 2), ("2g.10gb", 4), ("1g.5gb+me", 6)],
        [],
    ],
)
def test_valid_a100_40gb_layouts(items: list[tuple[str, int]]) -> None:
    assert validate_layout(geometry(A100_40), layout(*items)) == ()


def test_two_4g_instances_break_count_and_compute() -> None:
    violations = validate_layout(geometry(A100_40), layout(("4g.20gb", 0), ("4g.20gb", 4)))
    assert [v.rule for v in violations] == ["bad_start", "count_over_max", "compute_over_total"]
    bad_start, count, compute = violations
    assert bad_start.instances == (1,)
    assert "allowed starts: 0" in bad_start.message
    assert count.instances == (0, 1)
    assert "2 instances of 4g.20gb" in count.message
    assert "at most 1" in count.message
    assert compute.instances == (0, 1)
    assert "sum to 8" in compute.message
    assert "has 7" in compute.message


def test_bad_start_lists_the_allowed_starts() -> None:
    (violation,) = validate_layout(geometry(A100_40), layout(("1g.5gb", 7)))
    assert violation.rule == "bad_start"
    assert violation.instances == (0,)
    assert violation.message == (
        "instance 0 (1g.5gb at 7): 1g.5gb cannot start at memory slice 7; "
        "allowed starts: 0, 1, 2, 3, 4, 5, 6"
    )


def test_same_slice_twice_overlaps() -> None:
    (violation,) = validate_layout(geometry(A100_40), layout(("1g.5gb", 0), ("1g.5gb", 0)))
    assert violation.rule == "overlap"
    assert violation.instances == (0, 1)
    assert violation.message == (
        "instance 1 (1g.5gb at 0) overlaps instance 0 (1g.5gb at 0): memory slices [0,1) and [0,1)"
    )


def test_full_gpu_instance_leaves_no_room() -> None:
    assert rules(A100_40, ("7g.40gb", 0), ("1g.5gb", 0)) == ["overlap", "compute_over_total"]


def test_overlap_message_names_both_instances_and_intervals() -> None:
    violations = validate_layout(
        geometry(A100_80), layout(("3g.40gb", 0), ("2g.20gb", 4), ("1g.10gb", 3))
    )
    assert [v.message for v in violations] == [
        "instance 2 (1g.10gb at 3) overlaps instance 0 (3g.40gb at 0): "
        "memory slices [3,4) and [0,4)"
    ]
    assert violations[0].instances == (0, 2)


def test_out_of_range_and_unknown_profile() -> None:
    violations = validate_layout(geometry(A100_40), layout(("1g.10gb", 7), ("9g.99gb", 0)))
    assert [(v.rule, v.instances) for v in violations] == [
        ("bad_start", (0,)),
        ("out_of_range", (0,)),
        ("unknown_profile", (1,)),
    ]
    assert "memory slices [7,9) lie outside the GPU's 8 memory slices [0,8)" in (
        violations[1].message
    )
    assert "valid profiles: 1g.5gb, 1g.5gb+me, 1g.10gb, 2g.10gb, 3g.20gb, 4g.20gb, 7g.40gb" in (
        violations[2].message
    )


def test_media_extension_profile_is_limited_to_one_instance() -> None:
    violations = validate_layout(geometry(A100_40), layout(("1g.5gb+me", 0), ("1g.5gb+me", 1)))
    assert [(v.rule, v.instances) for v in violations] == [("count_over_max", (0, 1))]


def test_instances_over_max() -> None:
    geo = dataclasses.replace(geometry(A100_40), max_gpu_instances=3)
    violations = validate_layout(geo, layout(*[("1g.5gb", s) for s in range(4)]))
    assert [(v.rule, v.instances) for v in violations] == [("instances_over_max", (0, 1, 2, 3))]
    assert "4 GPU instances" in violations[0].message
    assert "at most 3" in violations[0].message


def test_violations_come_in_a_fixed_order() -> None:
    items = [("4g.20gb", 0), ("1g.5gb", 7), ("nope", 0), ("4g.20gb", 0), ("2g.10gb", 2)]
    first = validate_layout(geometry(A100_40), layout(*items))
    assert [(v.rule, v.instances) for v in first] == [
        ("bad_start", (1,)),
        ("unknown_profile", (2,)),
        ("overlap", (0, 3)),
        ("overlap", (0, 4)),
        ("overlap", (3, 4)),
        ("count_over_max", (0, 3)),
        ("compute_over_total", (0, 1, 3, 4)),
    ]
    assert validate_layout(geometry(A100_40), layout(*items)) == first


def test_a30_layouts() -> None:
    assert rules(A30, ("2g.12gb", 0), ("1g.6gb", 2), ("1g.6gb", 3)) == []
    assert rules(A30, ("2g.12gb", 0), ("2g.12gb+me", 2)) == []
    assert rules(A30, ("4g.24gb", 0)) == []
    assert rules(A30, ("1g.6gb", 0), ("1g.6gb", 1), ("1g.6gb", 2), ("1g.6gb+me", 3)) == []
    assert rules(A30, ("2g.12gb", 1)) == ["bad_start"]
    assert rules(A30, ("2g.12gb", 2), ("4g.24gb", 0)) == ["overlap", "compute_over_total"]
    assert rules(A30, ("1g.6gb+me", 0), ("1g.6gb+me", 1)) == ["count_over_max"]
    assert rules(A30, ("1g.6gb", 4)) == ["bad_start", "out_of_range"]


def test_h100_layouts() -> None:
    assert rules(H100, ("3g.40gb", 0), ("3g.40gb", 4)) == []
    assert rules(H100, ("3g.40gb", 0), ("2g.20gb", 4), ("1g.20gb", 6)) == []
    assert rules(H100, ("4g.40gb", 0), ("2g.20gb", 4), ("1g.10gb", 6)) == []
    assert rules(H100, ("2g.20gb", 6)) == ["bad_start"]
    assert rules(H100, ("4g.40gb", 0), ("2g.20gb", 4), ("1g.20gb", 6)) == []
    assert rules(H100, ("4g.40gb", 0), ("3g.40gb", 4), ("1g.10gb", 3)) == [
        "overlap",
        "compute_over_total",
    ]


# --------------------------------------------------------------------------------------------
# valid_layouts
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("slug", "count"), [(A30, 83), (A100_40, 2318), (A100_80, 2318), (H100, 2318), (RTX_PRO, 1248)]
)
def test_every_enumerated_layout_is_valid_and_distinct(slug: str, count: int) -> None:
    geo = geometry(slug)
    layouts = valid_layouts(geo)
    assert len(layouts) == count
    assert len({frozenset((p.profile, p.start) for p in lay) for lay in layouts}) == count
    assert all(validate_layout(geo, lay) == () for lay in layouts)


def test_enumeration_is_complete_for_the_a30() -> None:
    """Every subset of (profile, start) pairs that passes validate_layout is enumerated."""
    geo = geometry(A30)
    options = [(p.name, s) for p in geo.profiles for s in p.placements]
    found: set[frozenset[tuple[str, int]]] = set()

    def grow(first: int, chosen: list[tuple[str, int]]) -> None:
        if validate_layout(geo, layout(*chosen)):
            return
        if chosen:
            found.add(frozenset(chosen))
        for i in range(first, len(options)):
            grow(i + 1, [*chosen, options[i]])

    grow(0, [])
    assert found == {frozenset((p.profile, p.start) for p in lay) for lay in valid_layouts(geo)}


def test_valid_layouts_restricted_to_profiles() -> None:
    layouts = valid_layouts(geometry(A100_80), ["3g.40gb", "4g.40gb"])
    assert sorted(tuple((p.profile, p.start) for p in lay) for lay in layouts) == [
        (("3g.40gb", 0),),
        (("3g.40gb", 0), ("3g.40gb", 4)),
        (("3g.40gb", 4),),
        (("4g.40gb", 0),),
        (("4g.40gb", 0), ("3g.40gb", 4)),
    ]
    with pytest.raises(MigError, match="valid profiles"):
        valid_layouts(geometry(A100_80), ["5g.50gb"])


# --------------------------------------------------------------------------------------------
# plan_partitions: golden cases, optimality against brute force, determinism
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("items", "gpus"),
    [
        ([("a", "1g.10gb", 7)], 1),
        ([("a", "1g.10gb", 8)], 2),
        ([("a", "4g.40gb", 1), ("b", "3g.40gb", 1)], 1),
        ([("a", "4g.40gb", 2)], 2),
        ([("a", "2g.20gb", 3), ("b", "1g.10gb", 1)], 1),
        ([("a", "7g.80gb", 3)], 3),
        ([("a", "3g.40gb", 3)], 2),
        ([("a", "1g.20gb", 5)], 2),
        ([("a", "1g.10gb+me", 3)], 3),
        ([("a", "3g.40gb", 1), ("b", "2g.20gb", 2)], 1),
        ([("a", "3g.40gb", 1), ("b", "1g.10gb", 5)], 2),
    ],
)
def test_golden_plans_on_a100_80gb(items: list[tuple[str, str, int]], gpus: int) -> None:
    wanted = demands(*items)
    plan = plan_partitions(geometry(A100_80), wanted)
    assert plan.gpu_count == gpus
    assert plan.optimal
    assert plan.lower_bound_gpus == gpus
    check_plan(A100_80, plan, wanted)


def test_golden_layouts_are_explicit() -> None:
    plan = plan_partitions(geometry(A100_80), demands(("a", "2g.20gb", 3), ("b", "1g.10gb", 1)))
    (gpu,) = plan.gpus
    assert [(i.workload, i.profile, i.start) for i in gpu.instances] == [
        ("a", "2g.20gb", 0),
        ("a", "2g.20gb", 2),
        ("a", "2g.20gb", 4),
        ("b", "1g.10gb", 6),
    ]
    assert (gpu.free_compute_slices, gpu.free_memory_slices) == (0, 1)
    assert gpu.unused_memory_slices == (7,)


def test_partial_gpu_keeps_room_for_large_instances() -> None:
    """A lone 1g replica goes where a 4g instance (start 0 only) still fits next to it."""
    plan = plan_partitions(geometry(A100_80), demands(("a", "1g.10gb", 8)))
    assert [(i.profile, i.start) for i in plan.gpus[1].instances] == [("1g.10gb", 6)]
    later = [*plan.gpus[1].placements(), Placement(profile="4g.40gb", start=0)]
    assert validate_layout(geometry(A100_80), later) == ()


def brute_force_gpus(slug: str, wanted: Sequence[Demand]) -> int:
    """Fewest GPUs by trying k = 1, 2, ... and searching replica -> (GPU, start) assignments,
    checking each partial GPU layout with validate_layout (independent of the planner)."""
    geo = geometry(slug)
    specs = {p.name: p for p in geo.profiles}
    # Most constrained first (fewest per GPU, then largest), so dead ends show up early.
    replicas = sorted(
        (d.profile for d in wanted for _ in range(d.replicas)),
        key=lambda name: (
            specs[name].max_instances,
            -specs[name].memory_slices,
            -specs[name].compute_slices,
            name,
        ),
    )

    def fits(k: int) -> bool:
        per_profile = Counter(replicas)
        if any(n > k * specs[name].max_instances for name, n in per_profile.items()):
            return False
        gpus: list[list[Placement]] = [[] for _ in range(k)]
        dead_ends: set[tuple[int, tuple[tuple[tuple[str, int], ...], ...]]] = set()

        def place(i: int) -> bool:
            if i == len(replicas):
                return True
            # GPUs are interchangeable and so are replicas of one profile: the state is the
            # multiset of GPU contents after placing replicas[:i].
            state = (i, tuple(sorted(tuple(sorted((p.profile, p.start) for p in g)) for g in gpus)))
            if state in dead_ends:
                return False
            name = replicas[i]
            for gpu in gpus:
                for start in specs[name].placements:
                    gpu.append(Placement(profile=name, start=start))
                    if not validate_layout(geo, gpu) and place(i + 1):
                        return True
                    gpu.pop()
                if not gpu:
                    break  # the other empty GPUs are the same as this one
            dead_ends.add(state)
            return False

        return place(0)

    k = 1
    while not fits(k):
        k += 1
    return k


def test_brute_force_knows_the_golden_answers() -> None:
    assert brute_force_gpus(A100_80, demands(("a", "1g.10gb", 7))) == 1
    assert brute_force_gpus(A100_80, demands(("a", "1g.10gb", 8))) == 2
    assert brute_force_gpus(A100_80, demands(("a", "4g.40gb", 1), ("b", "3g.40gb", 1))) == 1
    assert brute_force_gpus(A100_80, demands(("a", "3g.40gb", 1), ("b", "1g.10gb", 5))) == 2
    assert brute_force_gpus(A30, demands(("a", "2g.12gb", 1), ("b", "1g.6gb+me", 3))) == 3


def random_cases() -> list[tuple[str, list[Demand]]]:
    rng = random.Random(20240611)
    cases: list[tuple[str, list[Demand]]] = []
    for slug in (A100_40, A100_80, A30):
        names = [p.name for p in geometry(slug).profiles]
        for _ in range(24):
            chosen = rng.sample(names, rng.randint(2, min(4, len(names))))
            total = rng.randint(1, 12)
            counts = Counter(rng.choice(chosen) for _ in range(total))
            cases.append(
                (
                    slug,
                    [
                        Demand(workload=rng.choice("xyz"), profile=name, replicas=n)
                        for name, n in sorted(counts.items())
                    ],
                )
            )
    return cases


@pytest.mark.parametrize(("slug", "wanted"), random_cases())
def test_plan_matches_brute_force_minimum(slug: str, wanted: list[Demand]) -> None:
    plan = plan_partitions(geometry(slug), wanted)
    assert plan.gpu_count == brute_force_gpus(slug, wanted)
    assert plan.optimal
    check_plan(slug, plan, wanted)


def test_plan_does_not_depend_on_demand_order() -> None:
    wanted = demands(
        ("web", "1g.10gb", 9),
        ("batch", "3g.40gb", 3),
        ("web", "2g.20gb", 4),
        ("api", "1g.10gb", 5),
        ("big", "7g.80gb", 1),
        ("api", "1g.20gb", 2),
    )
    reference = plan_partitions(geometry(A100_80), wanted)
    check_plan(A100_80, reference, wanted)
    rng = random.Random(7)
    for _ in range(10):
        shuffled = list(wanted)
        rng.shuffle(shuffled)
        assert plan_partitions(geometry(A100_80), shuffled) == reference


def test_same_workload_and_profile_demands_add_up() -> None:
    split = plan_partitions(geometry(A100_80), demands(("a", "1g.10gb", 3), ("a", "1g.10gb", 4)))
    whole = plan_partitions(geometry(A100_80), demands(("a", "1g.10gb", 7)))
    assert split == whole


def test_replicas_of_a_workload_sit_on_consecutive_slots() -> None:
    wanted = demands(("b", "1g.10gb", 6), ("a", "1g.10gb", 6), ("c", "1g.10gb", 3))
    plan = plan_partitions(geometry(A100_80), wanted)
    owners = [i.workload for gpu in plan.gpus for i in gpu.instances]
    assert owners == ["a"] * 6 + ["b"] * 6 + ["c"] * 3


@pytest.mark.parametrize(
    ("items", "gpus"),
    [
        (
            [("a", "1g.10gb", 200), ("b", "2g.20gb", 150), ("c", "3g.40gb", 100)]
            + [("d", "7g.80gb", 50)],
            165,
        ),
        ([("a", "1g.10gb", 500)], 72),
        # 100 x {4g@0, 3g@4}, 50 x {4g@0, 1g.20gb@4, 1g.20gb@6}, 150 x 1g.20gb at 4 a GPU:
        # 188 GPUs = ceil(memory slices 1500 / 8).
        ([("a", "1g.20gb", 250), ("b", "4g.40gb", 150), ("c", "3g.40gb", 100)], 188),
    ],
)
def test_five_hundred_replicas(items: list[tuple[str, str, int]], gpus: int) -> None:
    wanted = demands(*items)
    plan = plan_partitions(geometry(A100_80), wanted)
    assert (plan.gpu_count, plan.optimal) == (gpus, True)
    check_plan(A100_80, plan, wanted)


def test_other_geometries_plan_optimally() -> None:
    wanted = demands(("a", "2g.12gb", 3), ("b", "1g.6gb+me", 2), ("c", "1g.6gb", 3))
    plan = plan_partitions(geometry(A30), wanted)
    assert (plan.gpu_count, plan.optimal) == (3, True)
    check_plan(A30, plan, wanted)
    wanted = demands(("a", "1g.24gb+me.all", 2), ("b", "2g.48gb+gfx", 2), ("c", "1g.24gb", 1))
    plan = plan_partitions(geometry(RTX_PRO), wanted)
    assert (plan.gpu_count, plan.optimal) == (2, True)
    check_plan(RTX_PRO, plan, wanted)


def test_branch_and_bound_closes_a_weak_bound() -> None:
    """The exact search proves what a weak bound cannot: three 3g instances need two GPUs."""
    # Count vectors over (3g, 1g): {3g, 3g}, {3g, 1g x 4}, {1g x 7}; bound: 7 instances/GPU.
    cover = _Cover([(2, 0), (1, 4), (0, 7)], [(1, 1)])
    need = (3, 0)
    assert cover.bound(need) == 1
    found = cover.minimum(need, 1, cover.greedy((3, 7)) + [0], budget=100)
    assert len(found) == 2
    assert cover.failed[need] == 1
    with pytest.raises(_BudgetExhausted):
        _Cover([(2, 0), (1, 4), (0, 7)], [(1, 1)]).search((9, 9), 3, budget=0)


# --------------------------------------------------------------------------------------------
# mig-parted export
# --------------------------------------------------------------------------------------------


def test_mig_parted_config_groups_devices_by_layout() -> None:
    geo = geometry(A100_80)
    plan = plan_partitions(geo, demands(("a", "1g.10gb", 23), ("b", "3g.40gb", 1)))
    config = mig_parted_config(geo, plan, config_name="capplan")
    assert config == {
        "version": "v1",
        "mig-configs": {
            "capplan": [
                {"devices": [0], "mig-enabled": True, "mig-devices": {"1g.10gb": 4, "3g.40gb": 1}},
                {"devices": [1, 2], "mig-enabled": True, "mig-devices": {"1g.10gb": 7}},
                {"devices": [3], "mig-enabled": True, "mig-devices": {"1g.10gb": 5}},
            ]
        },
    }
    assert list(config) == ["version", "mig-configs"]
    entries = config["mig-configs"]["capplan"]
    assert all(list(e) == ["devices", "mig-enabled", "mig-devices"] for e in entries)


def test_mig_parted_config_uses_all_for_one_shared_layout() -> None:
    geo = geometry(A100_80)
    plan = plan_partitions(geo, demands(("a", "3g.40gb", 2), ("b", "4g.40gb", 2)))
    config = mig_parted_config(geo, plan, config_name="even")
    assert config["mig-configs"]["even"] == [
        {"devices": "all", "mig-enabled": True, "mig-devices": {"3g.40gb": 1, "4g.40gb": 1}}
    ]
    assert yaml.safe_load(yaml.safe_dump(config, sort_keys=False)) == config


# --------------------------------------------------------------------------------------------
# Errors
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("wanted", "match"),
    [
        ([], "no demands"),
        (demands(("a", "5g.50gb", 1)), "valid profiles: 1g.10gb, 1g.10gb\\+me, 1g.20gb"),
        (demands(("a", "1g.10gb", 0)), "between 1 and 10,000, got 0"),
        (demands(("a", "1g.10gb", -3)), "got -3"),
        (demands(("a", "1g.10gb", 10_001)), "got 10001"),
        (demands(("", "1g.10gb", 1)), "empty workload"),
    ],
)
def test_bad_requests_raise_mig_error(wanted: list[Demand], match: str) -> None:
    with pytest.raises(MigError, match=match) as caught:
        plan_partitions(geometry(A100_80), wanted)
    assert isinstance(caught.value, DomainError)


def test_unplaceable_profile_raises() -> None:
    geo = dataclasses.replace(
        geometry(A30),
        profiles=(
            MigProfileSpec(
                name="8g.48gb",
                memory_mib=48_000,
                compute_slices=8,
                memory_slices=8,
                max_instances=1,
                placements=(0,),
            ),
        ),
    )
    with pytest.raises(MigError, match="fits no layout"):
        plan_partitions(geo, demands(("a", "8g.48gb", 1)))


def test_ten_thousand_replicas_is_allowed() -> None:
    plan = plan_partitions(geometry(A100_80), demands(("a", "7g.80gb", 10_000)))
    assert (plan.gpu_count, plan.optimal) == (10_000, True)
