"""CPU cost of an engine pod's admission decision, in process (no HTTP, no database).

What the webhook computes for a pod running ``vllm serve`` on a GPU the catalog lists (after it
has read the model and hardware rows): parse the pod's command line
(app.domain.engines.cli), the decoder geometry of the stored graph (remembered per graph
version: measured both cold and warm; the profile forward's graph peak is remembered per graph
version, tokens, TP and dtype in both), and vLLM's start-up memory, requirement and verdict on
the whole GPU and each of its MIG profiles (app.services.engine_fit, as
app.services.decision_store.engine_evaluation runs it). Figures are ``time.process_time`` per
decision, the minimum of ``--repeat`` rounds of ``--n`` decisions (the machine may be shared).

Target (issue 31, point 5 and the admission work budget): the engine part of a review well
inside the review's 0.8 s deadline; printed, and the exit status is 1 above 5 ms a decision.

    .venv/bin/python benchmarks/engines/engine_admission_cost.py [--n 200] [--repeat 5]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from app.domain.engines.cli import engine_command  # noqa: E402
from app.domain.precision import ComputeCapability  # noqa: E402
from app.domain.zoo import ZOO  # noqa: E402
from app.schemas.engine_options import VllmEngineOptions  # noqa: E402
from app.schemas.estimates import WorkloadInput  # noqa: E402
from app.services import engine_fit  # noqa: E402
from app.services.convert import domain_engine  # noqa: E402
from app.services.zoo import zoo_fields  # noqa: E402

TARGET_S = 0.005
ARGV = ["vllm", "serve", "/models/llama-3-8b", "--max-model-len", "4096", "-tp", "1",
        "--gpu-memory-utilization", "0.9", "--port", "8000"]  # fmt: skip
GIB = 2**30
# An H100 80GB's seven MIG profiles' usable memory [MiB] (hardware_catalog/nvidia-hopper.yaml)
PROFILES_MIB = (9856, 9856, 19968, 19968, 40192, 40192, 81152)


def _decision(graph: tuple, cold: bool) -> bool:  # type: ignore[type-arg]
    command = engine_command(ARGV)
    assert command is not None
    options = dict(command.options)
    spec = WorkloadInput.model_validate(
        {"model": "llama-3-8b", "mode": "inference", "batch_size": 1,
         "engine": VllmEngineOptions.model_validate({"name": "vllm", **options})}
    )  # fmt: skip
    if cold:
        engine_fit._GEOMETRY.clear()
    choice = domain_engine(spec)
    assert choice is not None
    h100 = engine_fit.EngineDevice("h100", round(79.19 * GIB), "logs", ComputeCapability(9, 0))
    whole = engine_fit.engine_fit(graph, choice, h100)
    starts = whole.fits
    for mib in PROFILES_MIB:
        device = engine_fit.EngineDevice("slice", mib * 2**20, "catalog", ComputeCapability(9, 0))
        fit = engine_fit.engine_fit(graph, choice, device)
        starts = starts or fit.fits
    return starts


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=200)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    fields = zoo_fields(ZOO["llama-3-8b"])
    graph = (fields["inputs"], fields["layers"], fields["default_bindings"], "llama-3-8b", "k")
    worst = 0.0
    for label, cold in (("warm (geometry remembered)", False), ("cold (geometry mapped)", True)):
        best = float("inf")
        for _ in range(args.repeat):
            start = time.process_time()
            for _ in range(args.n):
                _decision(graph, cold)
            best = min(best, (time.process_time() - start) / args.n)
        worst = max(worst, best)
        print(f"engine pod decision, {label}: {best * 1e6:,.0f} us CPU (min of {args.repeat})")
    ok = worst <= TARGET_S
    print(f"target <= {TARGET_S * 1e3:g} ms: {'met' if ok else 'MISSED'}")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
