"""How long one in-process memory estimate takes (issue: GPT-3 175B training under 5 ms).

Run: .venv/bin/python benchmarks/estimate_speed.py
It builds nothing but Python objects (no tensors): graph analysis + the memory model, timed
end to end per estimate (cold: nothing is cached between runs), and prints the median, p90 and
minimum over repeated runs, with the load average, since other work on the machine shows up in
the median.
"""

from __future__ import annotations

import os
import statistics
import time

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


def time_case(slug: str, mode: Mode, precision: Precision, bindings: dict[str, int]) -> list[float]:
    """Wall time of analyze_for + estimate_memory per run [ms] (CUDA defaults: SDPA's attention
    for the precision, every position's logits)."""
    model = ZOO[slug]
    request = MemoryRequest(mode=mode, precision=precision)
    samples = []
    for _ in range(RUNS):
        start = time.perf_counter()
        analysis = analyze_for(model.inputs, model.layers, bindings, request)
        estimate_memory(analysis, request)
        samples.append((time.perf_counter() - start) * 1000)
    return samples


def main() -> None:
    """Print one line per case."""
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"load average: {load} ({os.cpu_count()} CPUs)")
    print(
        f"{'model':<12} {'mode':<10} {'precision':<11} {'median ms':>9} {'p90 ms':>7} "
        f"{'min ms':>7}  target"
    )
    for slug, mode, precision, bindings in CASES:
        samples = sorted(time_case(slug, mode, precision, bindings))
        median = statistics.median(samples)
        p90 = samples[int(0.9 * len(samples))]
        verdict = "ok" if median < TARGET_MS else "OVER"
        print(
            f"{slug:<12} {mode.value:<10} {precision.value:<11} {median:9.2f} {p90:7.2f} "
            f"{samples[0]:7.2f}  <{TARGET_MS} ms {verdict}"
        )


if __name__ == "__main__":
    main()
