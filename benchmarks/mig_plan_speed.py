"""How long MIG partition planning takes for 500 replicas (target: well under 1 s).

Run: .venv/bin/python benchmarks/mig_plan_speed.py
Geometries are built by hand from hardware_catalog/nvidia-ampere.yaml (A100 80GB SXM4). Each
case is planned RUNS times; the first run also fills the per-geometry layout cache, so the
first-run time is printed next to the median and p90.
"""

from __future__ import annotations

import statistics
import time

from app.domain.mig.layout import MigGeometry, MigProfileSpec, valid_layouts
from app.domain.mig.plan import Demand, PartitionPlan, plan_partitions

A100_80GB = MigGeometry(
    gpu="A100 80GB SXM4",
    total_compute_slices=7,
    total_memory_slices=8,
    max_gpu_instances=7,
    profiles=(
        MigProfileSpec(
            name="1g.10gb",
            memory_mib=9728,
            compute_slices=1,
            memory_slices=1,
            max_instances=7,
            placements=(0, 1, 2, 3, 4, 5, 6),
        ),
        MigProfileSpec(
            name="1g.10gb+me",
            memory_mib=9728,
            compute_slices=1,
            memory_slices=1,
            max_instances=1,
            placements=(0, 1, 2, 3, 4, 5, 6),
        ),
        MigProfileSpec(
            name="1g.20gb",
            memory_mib=19968,
            compute_slices=1,
            memory_slices=2,
            max_instances=4,
            placements=(0, 2, 4, 6),
        ),
        MigProfileSpec(
            name="2g.20gb",
            memory_mib=19968,
            compute_slices=2,
            memory_slices=2,
            max_instances=3,
            placements=(0, 2, 4),
        ),
        MigProfileSpec(
            name="3g.40gb",
            memory_mib=40192,
            compute_slices=3,
            memory_slices=4,
            max_instances=2,
            placements=(0, 4),
        ),
        MigProfileSpec(
            name="4g.40gb",
            memory_mib=40192,
            compute_slices=4,
            memory_slices=4,
            max_instances=1,
            placements=(0,),
        ),
        MigProfileSpec(
            name="7g.80gb",
            memory_mib=80640,
            compute_slices=7,
            memory_slices=8,
            max_instances=1,
            placements=(0,),
        ),
    ),
)

CASES: dict[str, list[tuple[str, str, int]]] = {
    "mixed 200x1g+150x2g+100x3g+50x7g": [
        ("chat", "1g.10gb", 200),
        ("embed", "2g.20gb", 150),
        ("rerank", "3g.40gb", 100),
        ("train", "7g.80gb", 50),
    ],
    "all 500x1g.10gb": [("tiny", "1g.10gb", 500)],
    "mixed 250x1g.20gb+150x4g+100x3g": [
        ("kv", "1g.20gb", 250),
        ("big", "4g.40gb", 150),
        ("mid", "3g.40gb", 100),
    ],
    "six profiles, 500 replicas": [
        ("a", "1g.10gb", 120),
        ("b", "1g.10gb+me", 30),
        ("c", "1g.20gb", 110),
        ("d", "2g.20gb", 100),
        ("e", "3g.40gb", 90),
        ("f", "4g.40gb", 50),
    ],
}
RUNS = 30
TARGET_MS = 1000.0


def time_case(items: list[tuple[str, str, int]]) -> tuple[list[float], PartitionPlan]:
    """Wall time of plan_partitions per run [ms], and the plan."""
    demands = [Demand(workload=w, profile=p, replicas=n) for w, p, n in items]
    samples = []
    plan = None
    for _ in range(RUNS):
        start = time.perf_counter()
        plan = plan_partitions(A100_80GB, demands)
        samples.append((time.perf_counter() - start) * 1000)
    assert plan is not None
    return samples, plan


def main() -> None:
    """Print one line per case."""
    print(f"valid layouts of {A100_80GB.gpu}: {len(valid_layouts(A100_80GB))}")
    print(
        f"{'case':<34} {'GPUs':>5} {'bound':>5} {'optimal':>7} {'first ms':>8} "
        f"{'median ms':>9} {'p90 ms':>7}  target"
    )
    for name, items in CASES.items():
        samples, plan = time_case(items)
        first = samples[0]
        ordered = sorted(samples)
        median = statistics.median(ordered)
        p90 = ordered[int(0.9 * len(ordered))]
        verdict = "ok" if median < TARGET_MS else "OVER"
        print(
            f"{name:<34} {plan.gpu_count:>5} {plan.lower_bound_gpus:>5} {plan.optimal!s:>7} "
            f"{first:8.2f} {median:9.2f} {p90:7.2f}  <{TARGET_MS:.0f} ms {verdict}"
        )


if __name__ == "__main__":
    main()
