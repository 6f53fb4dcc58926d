"""Pin: the search ranks offline and single-stream options on their times alone and builds the
prediction of the batch it shows only (``predict_seconds``, ``option_row``); the answer must be
the one the whole evaluation gives (every option predicted and assessed, ``best_batch`` per
candidate, ``rank``), figure for figure. A regression pin of a speed-up, not a model rule."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import pytest

from app.domain.graph.analysis import GraphAnalysis, InputDecl, analyze
from app.domain.hardware import DeviceKind, FrameworkOverhead, HardwareSpec, PriceKind
from app.domain.performance.batch_search import (
    _option_row,
    in_scenario,
    largest_fitting,
    row_of,
    search,
)
from app.domain.performance.calibration import DEFAULT_CALIBRATIONS, calibration_class
from app.domain.performance.candidates import Candidate, Runnable
from app.domain.performance.decoding import DecoderServing
from app.domain.performance.phases import PhasedRequest, decoder_request, forward_request
from app.domain.performance.pipeline import PipelinePlan
from app.domain.performance.precision_schemes import PRECISION_SCHEMES, PrecisionScheme
from app.domain.performance.recommend import (
    MemoryFit,
    Objective,
    Requirements,
    Scenario,
    assess,
    best_batch,
    rank,
)
from app.domain.performance.roofline import predict, predict_seconds
from app.domain.performance.runtimes import (
    RUNTIME_PROFILES,
    ServingRuntime,
    calibrations_for,
    with_decode_host_overhead,
)
from app.domain.performance.tensor_parallel import shard
from app.domain.precision import DType, Precision
from app.domain.workload import Runtime
from app.domain.zoo.transformers import llama as llama_graph

MLP: list[dict[str, Any]] = [
    {"name": "fc1", "op": "linear", "out_features": 512},
    {"name": "act", "op": "relu"},
    {"name": "fc2", "op": "linear", "out_features": 64},
]


def _device(slug: str, kind: DeviceKind, **changes: Any) -> HardwareSpec:
    base = HardwareSpec(
        slug=slug,
        name=slug,
        kind=kind,
        peak_flops_per_s={
            DType.FP32: 20e12,
            DType.FP16: 300e12,
            DType.BF16: 300e12,
            DType.INT8: 600e12,
        },
        memory_bandwidth_bytes_per_s=2e12,
        memory_bytes=40 * 2**20,
        host_link_bytes_per_s=None if kind is DeviceKind.CPU else 30e9,
        host_link_source="test",
        tdp_watts=300.0,
        price_usd_per_hour=2.0,
        price_kind=PriceKind.ON_DEMAND,
        sm_count=None if kind is DeviceKind.CPU else 108,
        cpu_cores=56 if kind is DeviceKind.CPU else None,
    )
    return replace(base, **changes)


DEVICES = [
    _device("gpu", DeviceKind.GPU),
    _device(
        "small-gpu",
        DeviceKind.GPU,
        memory_bytes=6 * 2**20,
        sm_count=20,
        compute_fraction=0.25,
        bandwidth_fraction=0.25,
    ),
    _device("unpriced-gpu", DeviceKind.GPU, price_usd_per_hour=None, price_kind=None),
    _device("spot-gpu", DeviceKind.GPU, price_kind=PriceKind.SPOT),
    _device("no-tdp-gpu", DeviceKind.GPU, tdp_watts=None, sm_count=None),
    _device("cpu", DeviceKind.CPU, memory_bytes=64 * 2**20, price_usd_per_hour=1.0),
]
SCHEMES = [PRECISION_SCHEMES[p] for p in (Precision.FP32, Precision.FP16, Precision.INT8)]


@dataclass
class _Source:
    """A workload source over a small graph whose memory need grows 1 MiB per batch row."""

    decoder: bool
    plan: DecoderServing = field(
        default_factory=lambda: DecoderServing(
            prompt_tokens_max=32,
            prompt_tokens_mean=32,
            generated_tokens_max=8,
            generated_tokens_mean=8,
        )
    )

    def _analysis(self, batch: int, seq: int = 1) -> GraphAnalysis:
        if not self.decoder:
            return analyze(
                (InputDecl(name="x", shape=("batch", 256)),), MLP, {"batch": batch}, training=False
            )
        inputs, layers = llama_graph(
            layers=2, hidden=64, heads=4, kv_heads=2, intermediate=128, vocab=100
        )
        return analyze(inputs, layers, {"batch": batch, "seq": seq}, training=False)

    def memory_fit(self, batch: int, scheme: PrecisionScheme, candidate: Candidate) -> MemoryFit:
        required = int(batch * 2**20 * scheme.activation_bytes / 2)
        available = candidate.device.memory_bytes
        return MemoryFit(required_bytes=required, available_bytes=available, detail="test")

    def floor_fit(
        self, batch: int, scheme: PrecisionScheme, candidate: Candidate
    ) -> MemoryFit | None:
        fit = self.memory_fit(batch, scheme, candidate)
        return (
            None
            if fit.fits
            else replace(fit, required_bytes=fit.required_bytes // 2 + 1, exact=False)
        )

    def overfills(self, batch: int, scheme: PrecisionScheme, candidate: Candidate) -> bool:
        return not self.memory_fit(batch, scheme, candidate).fits

    def fits(self, batch: int, scheme: PrecisionScheme, candidate: Candidate) -> bool:
        return self.memory_fit(batch, scheme, candidate).fits

    def max_concurrent_requests(
        self, scheme: PrecisionScheme, candidate: Candidate, limit: int
    ) -> int:
        return largest_fitting(limit, lambda n: self.fits(n, scheme, candidate))

    def sharded(self, batch: int, scheme: PrecisionScheme, degree: int) -> PhasedRequest:
        return shard(self.workload(batch, scheme), degree)

    def staged(
        self, batch: int, scheme: PrecisionScheme, stages: int, tensor: int = 1
    ) -> PipelinePlan:
        raise NotImplementedError("no pipeline candidates here")

    def workload(self, batch: int, scheme: PrecisionScheme) -> PhasedRequest:
        if not self.decoder:
            return forward_request(self._analysis(batch), scheme, batch=batch)
        return decoder_request(
            self._analysis(batch, 32),
            self._analysis(batch),
            scheme,
            batch=batch,
            prompt_tokens=32,
            generated_tokens=8,
        )


def _reference(
    source: _Source,
    runnable: list[Runnable],
    batches: list[int],
    cals: Any,
    requirements: Requirements,
    scenario: Scenario,
    host_step_s: float,
) -> list[Any]:
    """Every option predicted and assessed, the best batch of each candidate, ranked."""
    options: dict[tuple[str, str], list[Any]] = {}
    for candidate, scheme in runnable:
        for batch in batches:
            fit = source.memory_fit(batch, scheme, candidate)
            cal = cals[calibration_class(candidate.device, scheme)]
            prediction = predict(source.workload(batch, scheme), candidate.device, cal)
            prediction = in_scenario(with_decode_host_overhead(prediction, host_step_s), scenario)
            found = options.setdefault((candidate.device.slug, scheme.precision.value), [])
            found.append(assess(prediction, fit, requirements))
            if not fit.fits:
                break
    objective = requirements.objective
    return rank([best_batch(found, objective) for found in options.values()], objective)


REQUIREMENTS = [
    Requirements(objective=Objective.COST, latency_slo_s=2e-4),
    Requirements(objective=Objective.COST, latency_slo_s=1e-9),  # nothing meets it
    Requirements(objective=Objective.ENERGY, throughput_target_per_s=1e6),
    Requirements(objective=Objective.LATENCY, latency_slo_s=1e-3, slo_margin_fraction=0.5),
    Requirements(objective=Objective.COST, throughput_target_per_s=5e5, price_kind=PriceKind.SPOT),
]


# vllm serves decoders only: its encoder pair is not a case
DECODER_RUNTIMES = [
    (decoder, runtime)
    for decoder in (False, True)
    for runtime in (ServingRuntime.TENSORRT, ServingRuntime.PYTORCH_EAGER, ServingRuntime.VLLM)
    if decoder or runtime is not ServingRuntime.VLLM
]


@pytest.mark.parametrize(("decoder", "runtime"), DECODER_RUNTIMES)
@pytest.mark.parametrize("scenario", [Scenario.OFFLINE, Scenario.SINGLE_STREAM])
@pytest.mark.parametrize("requirements", REQUIREMENTS)
def test_the_search_shows_what_the_whole_evaluation_shows(
    decoder: bool, runtime: ServingRuntime, scenario: Scenario, requirements: Requirements
) -> None:
    source = _Source(decoder=decoder)
    cals = calibrations_for(runtime, {})
    host_step_s = RUNTIME_PROFILES[runtime].host_overhead_per_sequence_step_s
    runnable = [
        (Candidate(device=d, runtime=Runtime.CUDA, overhead=FrameworkOverhead()), s)
        for d in DEVICES
        for s in SCHEMES
    ]
    batches = [1] if scenario is Scenario.SINGLE_STREAM else [1, 2, 4, 8, 16, 32, 64]
    found = search(
        source,
        runnable,
        batches=batches,
        calibrations=cals,
        requirements=requirements,
        scenario=scenario,
        objective=requirements.objective,
        host_step_s=host_step_s,
        sizes_given=False,
        max_batch_size=64,
    )
    expected = _reference(source, runnable, batches, cals, requirements, scenario, host_step_s)
    assert found == expected
    assert [a.prediction.assumptions for a in found] == [a.prediction.assumptions for a in expected]


@pytest.mark.parametrize("decoder", [False, True])
def test_an_options_row_is_its_assessments_row(decoder: bool) -> None:
    """Every option's times and row, computed without the prediction, are the prediction's
    and its assessment's, bit for bit (under each scenario and serving runtime)."""
    source = _Source(decoder=decoder)
    checked = 0
    for runtime in (ServingRuntime.TENSORRT, ServingRuntime.PYTORCH_EAGER, ServingRuntime.VLLM):
        cals = calibrations_for(runtime, {})
        host_step_s = RUNTIME_PROFILES[runtime].host_overhead_per_sequence_step_s
        for device in DEVICES:
            candidate = Candidate(device=device, runtime=Runtime.CUDA, overhead=FrameworkOverhead())
            for scheme in SCHEMES:
                cal = cals[calibration_class(device, scheme)]
                for batch in (1, 3, 16):
                    workload = source.workload(batch, scheme)
                    full = predict(workload, device, cal)
                    times = (full.latency_s, full.interval_s, full.first_token_s, full.per_token_s)
                    assert predict_seconds(workload, device, cal) == times
                    fit = source.memory_fit(batch, scheme, candidate)
                    for scenario in (Scenario.OFFLINE, Scenario.SINGLE_STREAM):
                        shown = in_scenario(with_decode_host_overhead(full, host_step_s), scenario)
                        for requirements in REQUIREMENTS:
                            expected = row_of(
                                assess(shown, fit, requirements), requirements.objective
                            )
                            row = _option_row(
                                workload,
                                (candidate, scheme),
                                cal,
                                fit,
                                host_step_s,
                                scenario,
                                requirements,
                            )
                            assert row == expected
                            checked += 1
    assert checked == 3 * len(DEVICES) * len(SCHEMES) * 3 * 2 * len(REQUIREMENTS)
    assert DEFAULT_CALIBRATIONS  # the shipped classes priced every device above
