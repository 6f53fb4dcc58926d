"""A sha256 of the full inference recommendation response, per request: the oracle of a change
meant to leave recommendations byte-identical (a speed-up of the search or the roofline).

    .venv/bin/python benchmarks/recommendation_digest.py [--save FILE | --check FILE]

Builds a fresh synced SQLite database (benchmarks/server_process.py), and for each request (the
cases of benchmarks/recommendation_speed.py, then variants: narrowed precisions, MIG slices
only, a latency SLO nothing meets, other objectives, a throughput target, continuous batching,
explicit batch sizes) clears the caches, computes the recommendation and prints the sha256 of
its ``model_dump_json()``. ``--save`` writes ``{label: digest}`` to FILE; ``--check`` compares
with FILE and exits 1 on any difference. Run it on the base tree and on the changed tree.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path
from typing import Any

from recommendation_speed import CASES
from server_process import synced_sessions

from app.schemas.recommendations import InferenceRecommendationRequest
from app.services.recommendations import clear_caches, recommend

MIG_SLICES = [
    "nvidia-a100-80gb-sxm/1g.10gb",
    "nvidia-a100-80gb-sxm/3g.40gb",
    "nvidia-a30/1g.6gb",
    "nvidia-h100-sxm/2g.20gb",
]
CPUS = ["intel-xeon-platinum-8480plus", "amd-epyc-9654", "aws-graviton3", "intel-xeon-6980p"]


def _label(case: dict[str, Any]) -> str:
    return str(case.get("model") or "bert-large")


def requests() -> list[tuple[str, dict[str, Any]]]:
    """(label, request) for every case of the speed benchmark and the variants."""
    found = []
    for case, _ in CASES:
        found.append((f"{_label(case)} {case.get('scenario', 'offline')}", case))
    resnet = {"model": "resnet-50", "latency_slo_ms": 20}
    llama = {"model": "llama-2-7b", "latency_slo_ms": 10_000}
    bert_large = CASES[2][0]
    found += [
        ("resnet-50 fp16+int8", resnet | {"precisions": ["fp16", "int8"]}),
        ("resnet-50 mig", resnet | {"devices": MIG_SLICES}),
        ("resnet-50 slo none meets", resnet | {"latency_slo_ms": 0.001}),
        ("resnet-50 energy", resnet | {"objective": "energy"}),
        ("resnet-50 latency", resnet | {"objective": "latency"}),
        ("resnet-50 throughput", resnet | {"throughput_target_per_s": 20_000}),
        ("resnet-50 batches", resnet | {"batch_sizes": [1, 3, 8, 100]}),
        ("resnet-50 no slo", {"model": "resnet-50"}),
        (
            "bert-base tokens_mean",
            {
                "model": "bert-base",
                "sequence_length": 384,
                "tokens_mean": 170,
                "latency_slo_ms": 50,
            },
        ),
        ("bert-large fp16 server", bert_large | {"precisions": ["fp16"], "scenario": "server"}),
        ("llama-2-7b bf16", llama | {"precisions": ["bf16"]}),
        ("llama-2-7b mig", llama | {"devices": MIG_SLICES}),
        ("llama-2-7b slo none meets", llama | {"latency_slo_ms": 1}),
        ("llama-2-7b continuous", llama | {"batching": "continuous"}),
        ("llama-2-7b energy", llama | {"objective": "energy"}),
        ("llama-2-7b throughput", llama | {"throughput_target_per_s": 50}),
        ("gpt-3-175b latency", {"model": "gpt-3-175b", "objective": "latency"}),
        (
            "gpt-3-175b both",
            {"model": "gpt-3-175b", "latency_slo_ms": 60_000, "parallelism": "both", "limit": 40},
        ),
        ("gpt-3-175b tp8", {"model": "gpt-3-175b", "tensor_parallel_size": 8}),
        ("resnet-50 single_stream", resnet | {"scenario": "single_stream"}),
        (
            "resnet-50 eager cpu",
            resnet | {"serving_runtime": "pytorch_eager", "devices": CPUS, "limit": 50},
        ),
        (
            "bert-base eager energy",
            {
                "model": "bert-base",
                "sequence_length": 128,
                "serving_runtime": "pytorch_eager",
                "objective": "energy",
                "throughput_target_per_s": 500,
            },
        ),
        ("llama-2-7b vllm", llama | {"serving_runtime": "vllm"}),
        (
            "llama-2-7b vllm single_stream",
            llama | {"serving_runtime": "vllm", "scenario": "single_stream"},
        ),
        (
            "llama-2-7b beams",
            llama | {"beam_width": 4, "batching": "continuous", "prompt_tokens_mean": 300},
        ),
        ("llama-2-7b spot", llama | {"price_kind": "spot", "limit": 100}),
        (
            "gpt-3-175b fp16 server",
            {
                "model": "gpt-3-175b",
                "precisions": ["fp16"],
                "latency_slo_ms": 60_000,
                "scenario": "server",
            },
        ),
    ]
    return found


def digests() -> dict[str, str]:
    """{label: sha256 of the response's JSON} (or of the error, for a refused request)."""
    found = {}
    with synced_sessions() as sessions:
        for label, case in requests():
            with sessions() as session:
                clear_caches()
                try:
                    payload = InferenceRecommendationRequest.model_validate(case)
                    text = recommend(session, payload=payload).model_dump_json()
                except Exception as error:  # a refused request is pinned by its message
                    text = f"{type(error).__name__}: {error}"
            found[label] = hashlib.sha256(text.encode()).hexdigest()
            print(f"{found[label]}  {label}  ({len(text):,} chars)", flush=True)
    return found


def main() -> int:
    """Print the digests; save or check them."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--save", type=Path)
    parser.add_argument("--check", type=Path)
    args = parser.parse_args()
    found = digests()
    if args.save:
        args.save.write_text(json.dumps(found, indent=1) + "\n")
    if args.check:
        expected = json.loads(args.check.read_text())
        moved = [label for label in expected if found.get(label) != expected[label]]
        print(f"{len(moved)} of {len(expected)} differ: {moved}" if moved else "all identical")
        return 1 if moved else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
