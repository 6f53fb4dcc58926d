"""How long one in-process memory estimate takes (issue: GPT-3 175B training under 5 ms;
issue 29: a 99,999-layer repeated graph under 1 s, as before the allocator replay).

Run: .venv/bin/python benchmarks/estimate_speed.py [--runs N] [OLD_TREE ...]
It builds nothing but Python objects (no tensors): graph analysis + the memory model, timed
end to end per estimate (cold: nothing is cached between runs), and prints the median, p90 and
minimum over repeated runs, with the load average, since other work on the machine shows up in
the median; and the median and minimum CPU time of the process (``time.process_time``), which a
loaded machine disturbs less. Besides the zoo models, a ``repeat`` of one linear layer
(64 -> 64, batch 8, fp32) 30,000 and 99,999 times, in both modes, as CPU seconds.

Each OLD_TREE (an older checkout, e.g. ``git archive <commit> | tar -x -C /tmp/old``; it needs
``app.domain.memory.estimate.analyze_for``) is timed after this tree by running this script with
``PYTHONPATH`` pointing at it, so the two trees' figures come from the same machine and minutes.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from app.domain.graph.analysis import InputDecl, analyze
from app.domain.memory.estimate import MemoryRequest, analyze_for, estimate_memory
from app.domain.precision import Precision
from app.domain.workload import Mode
from app.domain.zoo import ZOO

CASES = [
    ("gpt-3-175b", Mode.TRAINING, Precision.MIXED_BF16, {"batch": 1, "seq": 2048}),
    ("gpt-3-175b", Mode.INFERENCE, Precision.BF16, {"batch": 1, "seq": 2048}),
    ("llama-3-8b", Mode.TRAINING, Precision.BF16, {"batch": 8, "seq": 8192}),
    ("resnet-50", Mode.TRAINING, Precision.FP32, {"batch": 256, "image": 224}),
]
RUNS = 200
TARGET_MS = 5.0
REPEATED = [(30_000, Mode.TRAINING), (30_000, Mode.INFERENCE)]
REPEATED += [(99_999, Mode.TRAINING), (99_999, Mode.INFERENCE)]
REPEATED_RUNS = 3
REPEATED_TARGET_S = 1.0


def time_case(
    slug: str, mode: Mode, precision: Precision, bindings: dict[str, int], runs: int = RUNS
) -> tuple[list[float], list[float]]:
    """Wall and CPU time (``time.process_time``) of analyze_for + estimate_memory per run [ms]
    (CUDA defaults: SDPA's attention for the precision, every position's logits)."""
    model = ZOO[slug]
    request = MemoryRequest(mode=mode, precision=precision)
    samples, cpu = [], []
    for _ in range(runs):
        start, start_cpu = time.perf_counter(), time.process_time()
        analysis = analyze_for(model.inputs, model.layers, bindings, request)
        estimate_memory(analysis, request)
        samples.append((time.perf_counter() - start) * 1000)
        cpu.append((time.process_time() - start_cpu) * 1000)
    return samples, cpu


def time_repeated(times: int, mode: Mode) -> list[float]:
    """CPU seconds of analyze + estimate_memory per run for a ``repeat`` of one linear layer."""
    layers = [
        {
            "name": "stack",
            "op": "repeat",
            "times": times,
            "layers": [{"name": "fc", "op": "linear", "out_features": 64}],
        }
    ]
    inputs = [InputDecl(name="x", shape=("batch", 64))]
    request = MemoryRequest(mode=mode)
    samples = []
    for _ in range(REPEATED_RUNS):
        start = time.process_time()
        analysis = analyze(inputs, layers, {"batch": 8}, training=mode is Mode.TRAINING)
        estimate_memory(analysis, request)
        samples.append(time.process_time() - start)
    return samples


def main() -> None:
    """Print one line per case, then the same for every OLD_TREE given."""
    args = sys.argv[1:]
    runs = RUNS
    if args[:1] == ["--runs"]:
        runs, args = int(args[1]), args[2:]
    trees = [Path(arg).resolve() for arg in args]
    import app

    print(f"tree: {Path(app.__file__).resolve().parent.parent}")
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"load average: {load} ({os.cpu_count()} CPUs)")
    print(
        f"{'model':<12} {'mode':<10} {'precision':<11} {'median ms':>9} {'p90 ms':>7} "
        f"{'min ms':>7} {'CPU med':>7} {'CPU min':>7}  target"
    )
    for slug, mode, precision, bindings in CASES:
        wall, cpu = time_case(slug, mode, precision, bindings, runs)
        samples = sorted(wall)
        median = statistics.median(samples)
        p90 = samples[int(0.9 * len(samples))]
        verdict = "ok" if median < TARGET_MS else "OVER"
        print(
            f"{slug:<12} {mode.value:<10} {precision.value:<11} {median:9.2f} {p90:7.2f} "
            f"{samples[0]:7.2f} {statistics.median(cpu):7.2f} {min(cpu):7.2f}  "
            f"<{TARGET_MS} ms {verdict}"
        )
    print(f"{'repeated linear':<23} {'mode':<10} {'median CPU s':>12} {'max':>6}  target")
    for times, mode in REPEATED:
        cpu = sorted(time_repeated(times, mode))
        median = statistics.median(cpu)
        verdict = "ok" if median < REPEATED_TARGET_S else "OVER"
        print(
            f"{f'x {times:,} layers':<23} {mode.value:<10} {median:12.3f} {cpu[-1]:6.3f}  "
            f"<{REPEATED_TARGET_S} s {verdict}"
        )
    for tree in trees:
        print()
        env = {**os.environ, "PYTHONPATH": str(tree)}
        script = str(Path(__file__).resolve())
        subprocess.run(
            [sys.executable, script, "--runs", str(runs)], cwd=tree, env=env, check=False
        )


if __name__ == "__main__":
    main()
