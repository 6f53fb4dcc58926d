"""Decoder serving under TTFT / TPOT p99 bounds (issue 31, point 4): speed and stability.

    .venv/bin/python benchmarks/llm_server_load.py

Builds a temporary SQLite database (migrated, catalog and zoo synced) and asks, in process, the
one question "how many replicas of which GPU / MIG profile / tensor-parallel group serve R
requests/s of this length distribution within these TTFT / TPOT p99 bounds, and what does that
cost" over every catalog device (scenario server, continuous batching, MLPerf's Llama-2-70B
Server bounds 2 s / 200 ms, and a tighter pair). It prints the CPU time of the request (cold:
caches cleared), how many candidates were simulated and how many the objective floor pruned,
the best answers with their replicas and fleet cost, and for each simulated answer how far the
p99s move when the simulated arrivals are doubled (the issue's stability criterion: < 5 %).
A default recommendation (offline, no bounds) is timed beside it: it must stay < 0.5 s.

Then the same question with the requests' lengths spread: fixed lengths (every request at the
mean prompt 512 / output 128) against lognormal prompts (mean 512, p99 2048) and outputs
(mean 128, p99 512), the same maxima (3072 + 1024 tokens: llama-2-7b's 4096 context), on the
devices the fixed answer ranks first: rate per replica, TTFT / TPOT p99, sequences in flight,
replicas and fleet cost side by side, the drawn p99 lengths and the CPU time of each request.
"""

from __future__ import annotations

import sys
import time
from typing import Any

from server_process import synced_sessions

from app.schemas.recommendations import InferenceRecommendationRequest
from app.services.recommendations import clear_caches, recommend

LLM: dict[str, Any] = {
    "model": "llama-2-7b",
    "precisions": ["fp16"],
    "prompt_tokens": 1024,
    "prompt_tokens_mean": 512,
    "generated_tokens": 256,
    "generated_tokens_mean": 128,
    "batching": "continuous",
    "scenario": "server",
    "throughput_target_per_s": 100,
    "limit": 2000,
}
SPREAD_BASE: dict[str, Any] = {
    **LLM,
    "prompt_tokens": 3072,
    "generated_tokens": 1024,
    "ttft_p99_ms": 2000,
    "tpot_p99_ms": 200,
}
FIXED = {**SPREAD_BASE, "prompt_tokens_mean": 512, "generated_tokens_mean": 128}
LOGNORMAL = {
    **{k: v for k, v in SPREAD_BASE.items() if not k.endswith("_mean")},
    "prompt_length_distribution": {"kind": "lognormal", "mean_tokens": 512, "p99_tokens": 2048},
    "generated_length_distribution": {"kind": "lognormal", "mean_tokens": 128, "p99_tokens": 512},
}
CASES: list[tuple[str, dict[str, Any]]] = [
    ("llama-2-7b, TTFT 2 s / TPOT 200 ms", {**LLM, "ttft_p99_ms": 2000, "tpot_p99_ms": 200}),
    ("llama-2-7b, TTFT 500 ms / TPOT 30 ms", {**LLM, "ttft_p99_ms": 500, "tpot_p99_ms": 30}),
    ("default recommendation (offline)", {"model": "llama-2-7b", "latency_slo_ms": 10_000}),
]


def main() -> int:
    """Print each case's figures; exit 1 when an answer is not stable or a default
    recommendation takes 0.5 s or more."""
    ok = True
    with synced_sessions() as sessions:
        for label, case in CASES:
            payload = InferenceRecommendationRequest.model_validate(case)
            with sessions() as session:
                clear_caches()
                start, cpu = time.perf_counter(), time.process_time()
                result = recommend(session, payload=payload)
                wall_ms = (time.perf_counter() - start) * 1000
                cpu_ms = (time.process_time() - cpu) * 1000
            candidates = result.candidates
            simulated = [c for c in candidates if c.llm_server is not None]
            pruned = [c for c in candidates if any("not simulated" in r for r in c.reasons)]
            print(f"\n## {label}")
            print(
                f"cold: {wall_ms:.0f} ms wall, {cpu_ms:.0f} ms CPU; {len(candidates)} candidates, "
                f"{len(simulated)} simulated, {len(pruned)} pruned by the objective floor"
            )
            if "ttft_p99_ms" not in case:
                verdict = "ok" if wall_ms < 500 else "OVER"
                ok &= wall_ms < 500
                print(f"default recommendation < 500 ms: {verdict}")
                continue
            worst = max((c.llm_server.p99_drift for c in simulated if c.llm_server), default=0.0)
            unstable = [c.device for c in simulated if c.llm_server and not c.llm_server.stable]
            ok &= not unstable
            print(
                f"largest p99 move when the simulated arrivals are doubled: {worst:.1%} "
                f"(target < 5 %); not stable: {unstable or 'none'}"
            )
            print("| device | rate/s per replica | TTFT p99 ms | TPOT p99 ms | in flight | "
                  "limited by | replicas | fleet USD/h |")  # fmt: skip
            print("|---|---|---|---|---|---|---|---|")
            for c in [c for c in candidates if c.eligible][:5]:
                load = c.llm_server
                assert load is not None
                fleet = (
                    "-" if c.fleet_cost_usd_per_hour is None else f"{c.fleet_cost_usd_per_hour:.2f}"
                )
                print(
                    f"| {c.device} | {load.arrival_rate_per_s:.3g} | {load.ttft_p99_ms:.0f} | "
                    f"{load.tpot_p99_ms:.1f} | {load.mean_sequences_in_flight:.1f} of "
                    f"{load.max_num_seqs} | {load.limited_by} | {c.devices_needed} | {fleet} |"
                )
        for bounds in ((2000, 200), (500, 30)):
            ok &= _compare(sessions, *bounds)
    return 0 if ok else 1


def _timed(sessions: Any, case: dict[str, Any]) -> tuple[Any, float]:
    payload = InferenceRecommendationRequest.model_validate(case)
    with sessions() as session:
        clear_caches()
        cpu = time.process_time()
        result = recommend(session, payload=payload)
        return result, (time.process_time() - cpu) * 1000


def _compare(sessions: Any, ttft_ms: float, tpot_ms: float) -> bool:
    """Fixed vs lognormal lengths, the same means and maxima: print both answers' figures on
    the fixed answer's first devices; True when every simulated answer is stable."""
    bounds = {"ttft_p99_ms": ttft_ms, "tpot_p99_ms": tpot_ms}
    fixed, fixed_ms = _timed(sessions, {**FIXED, **bounds})
    spread, spread_ms = _timed(sessions, {**LOGNORMAL, **bounds})
    print(
        f"\n## fixed vs lognormal lengths (llama-2-7b, TTFT {ttft_ms:g} ms / TPOT {tpot_ms:g} ms, "
        "100 requests/s)"
    )
    print(f"cold CPU: fixed {fixed_ms:.0f} ms, lognormal {spread_ms:.0f} ms")
    by_device = {c.device: c for c in spread.candidates if c.llm_server is not None}
    sample = next(iter(by_device.values()), None)
    if sample is not None and sample.llm_server is not None and sample.llm_server.lengths:
        drawn = sample.llm_server.lengths
        print(
            f"drawn: prompts mean {drawn.prompt.mean_tokens:.0f}, p99 {drawn.prompt.p99_tokens}; "
            f"outputs mean {drawn.generated.mean_tokens:.0f}, p99 {drawn.generated.p99_tokens} "
            f"(sigma {drawn.prompt.sigma:.3f} / {drawn.generated.sigma:.3f})"
        )
    print("| device | lengths | rate/s per replica | TTFT p99 ms | TPOT p99 ms | in flight | "
          "limited by | drift | replicas | fleet USD/h |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|---|")
    stable = True
    for c in [c for c in fixed.candidates if c.eligible][:5]:
        for label, row in (("fixed", c), ("lognormal", by_device.get(c.device))):
            load = None if row is None else row.llm_server
            if row is None or load is None:
                print(f"| {c.device} | {label} | - | - | - | - | - | - | - | - |")
                continue
            stable &= load.stable
            fleet = "-" if row.fleet_cost_usd_per_hour is None else (
                f"{row.fleet_cost_usd_per_hour:.2f}")  # fmt: skip
            print(
                f"| {c.device} | {label} | {load.arrival_rate_per_s:.3g} | "
                f"{load.ttft_p99_ms:.0f} | {load.tpot_p99_ms:.1f} | "
                f"{load.mean_sequences_in_flight:.1f} of {load.max_num_seqs} | "
                f"{load.limited_by} | {load.p99_drift:.1%} | {row.devices_needed} | {fleet} |"
            )
    worst = max(
        (c.llm_server.p99_drift for c in spread.candidates if c.llm_server is not None),
        default=0.0,
    )
    print(f"lognormal: largest p99 move when the arrivals are doubled {worst:.1%} (< 5 %)")
    return stable


if __name__ == "__main__":
    sys.exit(main())
