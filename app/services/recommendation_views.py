"""The API view of a recommendation: the response, each ranked candidate and the words that
explain how its figures were made (formulas, assumptions, defaults used)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from app.domain.hardware import DeviceKind, PriceKind
from app.domain.performance.batch_search import SERVER_TOP
from app.domain.performance.calibration import (
    GPU_HALF_PRECISION_SCALE,
    Calibration,
    CalibrationClass,
    calibration_class,
)
from app.domain.performance.candidates import Candidate
from app.domain.performance.decoding import Batching, kv_bytes_per_request
from app.domain.performance.explanation import explain
from app.domain.performance.pipeline import ParallelStrategy
from app.domain.performance.precision_schemes import PRECISION_SCHEMES, PrecisionScheme
from app.domain.performance.prediction import Bound, PipelineTiming, Prediction
from app.domain.performance.recommend import (
    Assessment,
    Requirements,
    Scenario,
    price_of_kind,
)
from app.domain.performance.request_lengths import LENGTH_SAMPLING
from app.domain.performance.runtimes import DEFAULT_RUNTIME, RUNTIME_PROFILES, ServingRuntime
from app.domain.performance.serving import MAX_STABLE_REQUESTS, ServerLoad
from app.domain.precision import Precision
from app.domain.workload import default_attention
from app.schemas.estimates import DefaultUsedRow
from app.schemas.recommendations import (
    CalibrationRead,
    DecoderServingRead,
    Exclusion,
    InferenceRecommendationRequest,
    InferenceRecommendationResponse,
    PhaseRead,
    PipelinePhaseRead,
    PipelineRead,
    PipelineStageRead,
    RankedCandidate,
    RooflineInputs,
    ServerScenarioRead,
    TimeShares,
    WorkloadSummary,
)
from app.services.convert import fuse_elementwise
from app.services.recommendation_llm import llm_server_read
from app.services.recommendation_source import ModelSource

FORMULAS = [
    "t_kernel = max(F / P_eff, D / BW_eff) + launches x t_launch, with P_eff = peak[dtype] x "
    "compute_fraction x min(1, compute_efficiency x precision_scale) (precision_scale: "
    "half_precision_scale for fp16 / bf16 math, else 1) and BW_eff = bandwidth x "
    "bandwidth_fraction x memory_efficiency",
    "B (bytes moved by a kernel) = weight bytes W + input bytes I + output bytes O (+ KV cache "
    "read and written, KV) at the precision; D (its DRAM bytes) = W + KV + (1 - "
    "activation_cache_share) x (I + O)",
    "kernel time of a phase = max(sum of t_kernel (+ all-reduces), launches x "
    "host_dispatch): a serving framework issuing kernels from the host (host_dispatch per "
    "kernel, 0 under tensorrt) overlaps the device's work, launches being asynchronous; the "
    "excess is the phase's host_wait_s",
    "GPU phase latency = h2d_bytes / L_eff + kernel time + d2h_bytes / L_eff, with L_eff = "
    "host link x host_link_efficiency; CPUs and unified-memory SoCs copy nothing",
    "latency = request_overhead + sum over phases of repeats x phase latency",
    "throughput = batch / interval; interval = max(kernel time, h2d time, d2h time, "
    "request_overhead) on accelerators (copies and host work overlap the kernels), = latency "
    "on CPUs",
    "devices_needed = ceil(throughput_target / throughput)",
    "cost_usd_per_million = price_usd_per_hour / 3600 / throughput x 1e6; fleet cost = "
    "devices_needed x price",
    "energy_j_per_inference = TDP x latency / batch (an upper bound)",
    "operational intensity = FLOPs / DRAM bytes; ridge point = P_eff / BW_eff; a kernel above "
    "the ridge point is compute-bound",
]

ASSUMPTIONS = [
    "per-layer FLOPs, parameters and shapes come from the model analysis (GET "
    "/v1/models/{slug}/summary); a multiply-add is 2 FLOPs",
    "weights are read once per kernel (embeddings: only the gathered rows; a tied LM head: "
    "the shared matrix); intermediates inside attention / MLP / LSTM layers stay on chip",
    "element-wise layers fuse into the kernel before them unless fuse_elementwise is false",
    "composite layers launch one kernel per weight matrix plus one",
    "a mixture-of-experts layer reads the router and the experts its tokens are routed to: "
    "E x (1 - (1 - k/E)^T) of E experts for T tokens routed top-k (uniform routing): k at "
    "batch-1 decode, all of them in a prefill",
    "fits_in_memory: the one requirement (as POST /v1/estimates/memory's fit, MIG fit and "
    "admission): the memory engine's inference peak (runtime pytorch_cuda for GPUs and SoCs, "
    "pytorch_cpu for CPUs; attention as PyTorch SDPA picks it; decoder logits for the last "
    "position) + CUDA context + workspace + a 5 % margin, against device memory or the MIG "
    "profile's usable memory; precisions follow the one table (fp8 and int8 are W8A8, "
    "int8_weight_only W8A16, int4 W4A16)",
    "a MIG slice gets compute_slices / total of the compute and memory_slices / total of the "
    "bandwidth, the whole host link, and its share of TDP and price",
    "decoders: latency = time to first token (request overhead + prefill) + (generated_tokens - 1)"
    " decode steps at the mean context prompt_tokens + generated_tokens / 2",
    "CPU figures are per socket, as the catalog lists CPUs",
]


def recommendation_response(
    payload: InferenceRecommendationRequest,
    source: ModelSource,
    *,
    pool: Sequence[Candidate],
    runnable: Sequence[tuple[Candidate, PrecisionScheme]],
    ranked: list[Assessment],
    excluded: list[Exclusion],
    calibrations: Mapping[CalibrationClass, Calibration],
    requirements: Requirements,
    batches: list[int],
) -> InferenceRecommendationResponse:
    """The API view of a ranked recommendation: the paragraph, the workload, the first
    ``limit`` candidates, what was left out, the calibrations, formulas and assumptions."""
    cals = calibrations
    unpriced = len({a.prediction.device.slug for a in ranked if a.cost_usd_per_million is None})
    paragraph = explain(
        ranked, requirements, model=source.label, unpriced=unpriced, excluded=len(excluded)
    )
    first = source.workload(1, runnable[0][1])
    summary_bindings = (
        source.bindings(1, seq=source.prompt_tokens) if source.decoder else source.bindings(1)
    )
    budget = requirements.latency_budget_s
    return InferenceRecommendationResponse(
        recommendation=paragraph,
        objective=payload.objective,
        scenario=payload.scenario,
        serving_runtime=payload.serving_runtime,
        latency_slo_ms=payload.latency_slo_ms,
        slo_margin=None if budget is None else payload.slo_margin,
        latency_budget_ms=None if budget is None else budget * 1e3,
        price_kind=payload.price_kind,
        throughput_target_per_s=payload.throughput_target_per_s,
        workload=WorkloadSummary(
            model=source.label,
            decoder=source.decoder,
            params=source.analysis(summary_bindings).params,
            bindings=summary_bindings,
            flops_per_inference=float(first.flops),
            prompt_tokens=source.prompt_tokens if source.decoder else None,
            generated_tokens=source.generated_tokens if source.decoder else None,
            prompt_tokens_mean=source.plan.prompt_tokens_mean if source.decoder else None,
            generated_tokens_mean=source.plan.generated_tokens_mean if source.decoder else None,
            batching=source.plan.batching if source.decoder else None,
            beam_width=source.plan.beam_width if source.decoder else None,
            kv_block_tokens=(
                source.plan.kv_block_tokens if source.decoder and source.plan.continuous else None
            ),
            beams_share_prompt=(
                source.plan.prompt_shared_by_beams
                if source.decoder and source.plan.continuous
                else None
            ),
            batch_sizes=batches,
            attention=_attention_used(source, summary_bindings, runnable),
            defaults_used=_defaults_used(payload, source, batches),
        ),
        candidates=[
            ranked_candidate(
                index,
                item,
                source.plan.priced_generated_tokens if source.decoder else None,
                _serving_read(source, item) if source.decoder else None,
            )
            for index, item in enumerate(ranked[: payload.limit], start=1)
        ],
        total_candidates=len(ranked),
        eligible_candidates=sum(1 for a in ranked if a.eligible),
        excluded=excluded,
        calibration={cls: calibration_read(cal) for cls, cal in cals.items()},
        formulas=FORMULAS,
        assumptions=[
            *ASSUMPTIONS,
            *_padding_note(source),
            *([f"decoder serving: {source.plan.describe()}"] if source.decoder else []),
            *_scenario_note(payload, requirements),
            *_pipeline_note(runnable),
            *_half_precision_note(ranked),
            *_cpu_runtime_note(payload.serving_runtime, ranked),
            *_host_work_note(payload.serving_runtime, source),
            _prices_note(pool, payload.price_kind),
        ],
    )


def _host_work_note(runtime: ServingRuntime, source: ModelSource) -> list[str]:
    """How a runtime's host work between decode steps is priced (only when it has some)."""
    host_s = RUNTIME_PROFILES[runtime].host_overhead_per_sequence_step_s
    if host_s <= 0.0 or not source.decoder:
        return []
    return [
        f"{runtime.value}: the engine's host work between steps, {host_s * 1e6:g} us per "
        "sequence per step, runs serially with the GPU: a request of b sequences with one "
        "prefill and g - 1 decode steps takes h x b x g longer, each token h x b longer; the "
        "total is part of each accelerator candidate's inputs.request_overhead_s (CPUs keep "
        "their calibration)"
    ]


def _pipeline_note(runnable: Sequence[tuple[Candidate, PrecisionScheme]]) -> list[str]:
    """How pipeline-parallel candidates are timed (only when one is offered)."""
    if not any(candidate.pipeline_parallel > 1 for candidate, _ in runnable):
        return []
    return [
        "pipeline parallel: the blocks are split evenly over p GPUs in order (vLLM's "
        "get_pp_indices: the remainder to the stages before the last; embedding on the first, "
        "final norm and LM head on the last); a batch of B runs as m = min(B, p) micro-batches "
        "of ceil(B / m); per phase step each stage's kernels are timed by the roofline on one "
        "micro-batch (T_s) and the hidden state crosses the GPU link (NVLink, else PCIe) at the "
        "host-link efficiency plus 10 us (X_s, not overlapped with the next micro-batch); a "
        "step takes the cycle I = max(m x max(T_s + X_s), sum T_s + sum X_s); latency = request "
        "overhead + sum of repeats x (copies + I); interval = sum of repeats x I; each "
        "candidate's pipeline block has every number, with the steady-state idle share and "
        "the GPipe bubble (p - 1) / (m + p - 1) of a batch run alone (not priced)"
    ]


def _prices_note(pool: Sequence[Candidate], kind: PriceKind) -> str:
    """Which prices the costs use (kind, region, date per device), and which devices are not
    ranked by cost because they have no price of that kind."""
    used: list[str] = []
    other: list[str] = []
    missing = 0
    seen: set[str] = set()
    for candidate in pool:
        device = candidate.device
        slug = device.parent or device.slug  # a slice pays its share of its GPU's price
        if slug in seen:
            continue
        seen.add(slug)
        price, _ = price_of_kind(device, kind)
        if price is not None:
            whole = price / device.compute_fraction
            region = device.price_region or "region not stated"
            when = "date unknown" if device.price_date is None else device.price_date.isoformat()
            origin = "request" if device.price_source.startswith("request") else "catalog"
            used.append(f"{slug} {whole:.4g} ({region}, {when}, {origin})")
        elif device.price_usd_per_hour is None:
            missing += 1
        else:
            found = "no kind" if device.price_kind is None else device.price_kind.value
            other.append(f"{slug} ({found})")
    text = f"costs use {kind.value} prices only, per whole device [USD/h]"
    text += ": " + ", ".join(used) if used else ": none of the candidates has one"
    if any(c.device.parent is not None for c in pool):
        text += "; a MIG slice pays its share of compute slices of its GPU's price"
    skipped = []
    if other:
        skipped.append("priced with another kind: " + ", ".join(other))
    if missing:
        skipped.append(f"{missing} without a price")
    if skipped:
        text += "; not ranked by cost: " + "; ".join(skipped)
    return text


def _scenario_note(
    payload: InferenceRecommendationRequest, requirements: Requirements
) -> list[str]:
    """How the server scenario turns batch timings into a rate and a p99, and what single
    stream means."""
    if payload.scenario is Scenario.SINGLE_STREAM:
        return [
            "scenario single_stream: one sample per query, the next sent when the answer is "
            "back (MLPerf SingleStream); every candidate at batch 1, its latency the request's "
            "(the model is deterministic: the p90 MLPerf reports is that latency) and its "
            "throughput 1 / latency, at which costs are priced (copies, host work and the "
            "next request do not overlap the kernels). The MLPerf SingleStream rows are scored "
            "on this latency (benchmarks/calibration/results.md)"
        ]
    if payload.scenario is Scenario.SERVER and requirements.token_bounds:
        return [
            "scenario server, decoder serving: requests arrive one at a time as a Poisson "
            "process and are served by continuous batching (every engine iteration runs one "
            "decode step of each sequence in flight and the prompt tokens of newly admitted "
            "ones, within max_num_batched_tokens, FCFS, as vLLM's scheduler; a finished "
            "sequence leaves at once); at most as many sequences in flight as the KV pool "
            "holds at the request's maximum lengths (the largest fitting concurrency); "
            + (
                "every request at the mean prompt and output lengths"
                if requirements.request_lengths is None
                else "each request draws its own prompt and output lengths "
                f"({requirements.request_lengths.describe()}; {LENGTH_SAMPLING}) and is "
                "admitted while its own KV blocks fit in the pool beside those in flight"
            )
            + ". Per candidate, the largest arrival "
            "rate whose simulated TTFT p99 and TPOT p99 stay within "
            f"{(requirements.ttft_p99_s or 0) * 1e3:.4g} ms and "
            f"{(requirements.tpot_p99_s or 0) * 1e3:.4g} ms over a run of twice the arrivals "
            "and move by less than 5 % from the shorter run (each candidate's llm_server.note "
            "says what came out); replicas and fleet cost follow from that rate"
        ]
    budget = requirements.latency_budget_s
    if payload.scenario is not Scenario.SERVER or budget is None:
        return []
    return [
        f"scenario server: requests arrive one at a time as a Poisson process; when the device "
        f"frees up it takes everything waiting up to a batch cap (greedy dynamic batching); "
        f"per candidate, the largest arrival rate whose simulated p99 latency stays within "
        f"{budget * 1e3:.4g} ms (the SLO less its margin) over a run and over a run of twice "
        f"the arrivals, and moves by less than 5 % between the two (the run doubled up to "
        f"{2 * MAX_STABLE_REQUESTS:,} arrivals before the rate is lowered), is its throughput "
        f"and that p99 its latency, batch latency and interval interpolated between the batch "
        f"sizes tried, "
        f"the cap chosen among them (each candidate's server.note says what came out); a "
        f"candidate whose lone request misses the budget is shown at its offline figures "
        f"with the reason. The queue is simulated for the candidates whose "
        f"{requirements.objective.value} at their rate ceiling can still rank among the "
        f"{SERVER_TOP} best; the others are listed ineligible at their offline figures "
        f"('not simulated', with that floor)"
    ]


def _half_precision_note(ranked: Sequence[Assessment]) -> list[str]:
    """How fp16 / bf16 math is priced (only when a candidate's math ran at a 16-bit scale other
    than 1)."""
    scales = {
        scale
        for a in ranked
        if (scale := a.prediction.calibration.precision_scale(a.prediction.compute_dtype)) != 1.0
    }
    if not scales:
        return []
    return [
        "fp16 / bf16 math runs at half_precision_scale x the calibrated compute efficiency ("
        + ", ".join(f"{x:g}" for x in sorted(scales))
        + "; capped at the peak): the efficiencies are fitted on int8 rows, and 16-bit tensor "
        f"math reaches a larger share of its own peak (the GPUs' {GPU_HALF_PRECISION_SCALE:g}: "
        "fitted on 15 published fp16 TensorRT-LLM runs on the A100 and H100 SXM, 1.27-1.29 with "
        "either left out); each candidate's inputs.precision_scale says what it ran at"
    ]


def _cpu_runtime_note(runtime: ServingRuntime, ranked: Sequence[Assessment]) -> list[str]:
    """What a serving runtime other than the default does to the CPU candidates (only when
    one is ranked): its CPU scale, or that CPUs keep the MLPerf-grade calibration."""
    if runtime is DEFAULT_RUNTIME or not any(
        a.prediction.device.kind is DeviceKind.CPU for a in ranked
    ):
        return []
    profile = RUNTIME_PROFILES[runtime]
    if profile.cpu_compute_efficiency_scale is not None:
        return [f"{runtime.value} on CPUs: {profile.cpu_basis}"]
    return [
        f"{runtime.value} on CPUs: no published CPU measurements of it, so CPU candidates keep "
        "the calibration fitted on MLPerf rows (Intel's optimized stacks: IPEX, OpenVINO); a "
        "stock framework can run slower (stock PyTorch runs 1.0-2.8x behind IPEX on a Xeon "
        "8380, benchmarks/calibration/runtimes.md)"
    ]


def _padding_note(source: ModelSource) -> list[str]:
    """How an encoder's inputs are priced when the request says they carry no padding."""
    if source.tokens_mean is None or source.decoder:
        return []
    padded = source.bindings(1).get("seq")
    return [
        f"padding-free: compute, latency and throughput priced at {source.tokens_mean} tokens "
        f"per input (tokens_mean); memory at the padded {padded} tokens"
    ]


def _attention_used(
    source: ModelSource,
    bindings: dict[str, int],
    runnable: Sequence[tuple[Candidate, PrecisionScheme]],
) -> list[str]:
    """The attention kernels behind the figures (none without attention layers)."""
    if not source.analysis(bindings).attention_used:
        return []
    found = ["latency: one fused attention kernel per layer (the roofline prices no S x S "
             "scores)"]  # fmt: skip
    for candidate, scheme in runnable:
        precision = Precision(scheme.precision.value)
        impl, why = default_attention(
            candidate.runtime, precision, training=False, dropout=False, gpu=candidate.device.gpu
        )
        line = f"memory on {candidate.runtime.value} at {precision.value}: {impl.value} ({why})"
        if line not in found:
            found.append(line)
    return found


def _defaults_used(
    payload: InferenceRecommendationRequest, source: ModelSource, batches: list[int]
) -> list[DefaultUsedRow]:
    """Every option the request left out that the figures depend on, and its value."""
    given = payload.model_fields_set
    rows: list[DefaultUsedRow] = []
    names = {
        name for spec in source.inputs for name in spec.get("shape", ()) if isinstance(name, str)
    }
    if source.decoder:
        for option, value in (
            ("prompt_tokens", payload.prompt_tokens),
            ("generated_tokens", payload.generated_tokens),
        ):
            if option not in given:
                rows.append(DefaultUsedRow(option=option, value=str(value), reason="API default"))
        rows.append(
            DefaultUsedRow(
                option="logits",
                value="last",
                reason="decoder serving computes the last position's logits (memory fit)",
            )
        )
        rows += _decoder_defaults(payload, given)
    shape_options: tuple[tuple[str, str, int | None], ...] = (
        ("sequence_length", "seq", payload.sequence_length),
        ("image_size", "image", payload.image_size),
    )
    for option, symbol, given_size in shape_options:
        if symbol == "seq" and source.decoder:
            continue
        default = source.defaults.get(symbol)
        if given_size is None and symbol in names and symbol not in payload.bindings and default:
            rows.append(
                DefaultUsedRow(option=option, value=str(default), reason="the model's default")
            )
    if payload.batch_sizes is None:
        reason = f"powers of two up to max_batch_size={payload.max_batch_size}"
        if payload.scenario is Scenario.SINGLE_STREAM:
            reason = "scenario single_stream: one sample per query"
        rows.append(
            DefaultUsedRow(option="batch_sizes", value=", ".join(map(str, batches)), reason=reason)
        )
    if "precisions" not in given:
        rows.append(
            DefaultUsedRow(
                option="precisions",
                value=", ".join(p.value for p in payload.precisions),
                reason="API default",
            )
        )
    if payload.devices is None:
        rows.append(
            DefaultUsedRow(
                option="devices", value="all", reason="every hardware profile and MIG slice"
            )
        )
    if "price_kind" not in given:
        rows.append(
            DefaultUsedRow(
                option="price_kind",
                value=payload.price_kind.value,
                reason="costs are ranked among list (pay-as-you-go) prices only",
            )
        )
    if payload.latency_slo_ms is not None and "slo_margin" not in given:
        rows.append(
            DefaultUsedRow(
                option="slo_margin",
                value=f"{payload.slo_margin:g}",
                reason=f"a prediction within {payload.slo_margin:.0%} of the SLO does not "
                "meet it: the latency is predicted, not measured",
            )
        )
    rows += _scenario_and_parallel_defaults(payload, given)
    rows.append(
        DefaultUsedRow(
            option="runtime",
            value="per candidate",
            reason="memory fit: pytorch_cpu on CPUs, pytorch_cuda on GPUs; latency: the "
            "calibrated efficiencies under serving_runtime's profile",
        )
    )
    if "serving_runtime" not in given:
        rows.append(
            DefaultUsedRow(
                option="serving_runtime",
                value=payload.serving_runtime.value,
                reason="the calibration's own: fitted on MLPerf results (TensorRT-grade "
                "engines); torch_compile, pytorch_eager, tensorflow and onnxruntime have fitted "
                "profiles, "
                "and vllm one for decoder serving",
            )
        )
    if "fuse_elementwise" not in given:
        fuse = fuse_elementwise(payload)
        rows.append(
            DefaultUsedRow(
                option="fuse_elementwise",
                value=str(fuse).lower(),
                reason=f"{payload.serving_runtime.value} "
                + (
                    "fuses element-wise layers into the kernel before them"
                    if fuse
                    else "runs one kernel per layer"
                ),
            )
        )
    return rows


def _left_out(
    given: set[str], candidates: Sequence[tuple[bool, str, object, str]]
) -> list[DefaultUsedRow]:
    """A row per (applies, option, value, reason) whose option applies and was not given."""
    return [
        DefaultUsedRow(option=option, value=str(value), reason=reason)
        for applies, option, value, reason in candidates
        if applies and option not in given
    ]


def _decoder_defaults(
    payload: InferenceRecommendationRequest, given: set[str]
) -> list[DefaultUsedRow]:
    """A decoder's serving options the request left out."""
    return _left_out(
        given,
        (
            (
                True,
                "prompt_tokens_mean",
                payload.prompt_tokens,
                "prompt_tokens: every request at the maximum length",
            ),
            (
                True,
                "generated_tokens_mean",
                payload.generated_tokens,
                "generated_tokens: every request at the maximum length",
            ),
            (
                True,
                "batching",
                payload.batching.value,
                "vllm always batches in flight, with a paged KV cache"
                if payload.serving_runtime is ServingRuntime.VLLM
                else "a batch padded to the maximum lengths runs until its longest output "
                "(continuous: in-flight batching with a paged KV cache, as TensorRT-LLM and "
                "vLLM serve)",
            ),
            (
                True,
                "beam_width",
                payload.beam_width,
                "one sequence per request (greedy or sampled decoding)",
            ),
            (
                payload.batching is Batching.CONTINUOUS,
                "kv_block_tokens",
                payload.kv_block_tokens,
                "TensorRT-LLM's tokens_per_block default",
            ),
            (
                payload.batching is Batching.CONTINUOUS and payload.beam_width > 1,
                "beams_share_prompt",
                str(payload.beams_share_prompt).lower(),
                "the beams share the prompt's full KV blocks and each decode step reads the "
                "cached prompt once per request, as TensorRT-LLM and vLLM do (false: every beam "
                "holds its own copy, as Neural Speed does)",
            ),
        ),
    )


def _scenario_and_parallel_defaults(
    payload: InferenceRecommendationRequest, given: set[str]
) -> list[DefaultUsedRow]:
    """The scenario and the multi-GPU options the request left out."""
    return _left_out(
        given,
        (
            (
                True,
                "scenario",
                payload.scenario.value,
                "throughput at the best batch with every request already waiting "
                "(MLPerf Offline; server: Poisson arrivals under the latency SLO)",
            ),
            (
                True,
                "parallelism",
                payload.parallelism.value,
                "a model whose batch 1 fits no single GPU is offered on tensor-parallel "
                "groups of GPUs (pipeline or both on request)",
            ),
            (
                payload.parallelism is not ParallelStrategy.PIPELINE,
                "tensor_parallel_max",
                payload.tensor_parallel_max,
                "tensor-parallel groups of 2, 4 or 8 GPUs at most (one node)",
            ),
            (
                payload.parallelism is not ParallelStrategy.TENSOR,
                "pipeline_parallel_max",
                payload.pipeline_parallel_max,
                "pipeline groups of 2, 4 or 8 stages at most (one node)",
            ),
        ),
    )


def calibration_read(cal: Calibration) -> CalibrationRead:
    """The API view of a calibration."""
    return CalibrationRead.model_validate(cal)


def _inputs(p: Prediction) -> RooflineInputs:
    device, cal = p.device, p.calibration
    tiling = p.tiling
    return RooflineInputs(
        sm_count=None if tiling is None or not tiling.split_k else tiling.units,
        gemm_tile=None if tiling is None else tiling.tile,
        tiling=None if tiling is None else tiling.assumption,
        precision_convention=PRECISION_SCHEMES[p.precision].convention,
        compute_dtype=p.compute_dtype.value,
        peak_flops_per_s=p.peak_flops_per_s,
        peak_source=p.peak_source,
        compute_fraction=device.compute_fraction,
        calibration_class=calibration_class(device, PRECISION_SCHEMES[p.precision]),
        compute_efficiency=cal.compute_efficiency,
        precision_scale=cal.precision_scale(p.compute_dtype),
        effective_flops_per_s=p.effective_flops_per_s,
        memory_bandwidth_bytes_per_s=device.memory_bandwidth_bytes_per_s,
        bandwidth_fraction=device.bandwidth_fraction,
        memory_efficiency=cal.memory_efficiency,
        activation_cache_share=cal.activation_cache_share,
        effective_bandwidth_bytes_per_s=p.effective_bandwidth_bytes_per_s,
        host_link_bytes_per_s=device.host_link_bytes_per_s if device.needs_host_copy else None,
        host_link_source=device.host_link_source,
        host_link_efficiency=cal.host_link_efficiency,
        effective_host_link_bytes_per_s=p.effective_host_link_bytes_per_s,
        kernel_launch_overhead_s=cal.kernel_launch_overhead_s,
        host_dispatch_s=cal.host_dispatch_s,
        request_overhead_s=p.request_overhead_s,
        tdp_watts=device.tdp_watts,
        price_usd_per_hour=device.price_usd_per_hour,
        price_source=device.price_source,
        price_kind=device.price_kind,
        price_region=device.price_region,
        price_date=device.price_date,
    )


def _serving_read(source: ModelSource, item: Assessment) -> DecoderServingRead:
    """The numbers a decoder candidate's figures come from."""
    p = item.prediction
    plan = source.plan
    scheme = PRECISION_SCHEMES[p.precision]
    most = None
    if plan.continuous:
        candidate = Candidate(
            device=p.device,
            runtime=p.device.runtime,
            overhead=p.device.overhead,
            tensor_parallel=p.tensor_parallel,
            pipeline_parallel=p.pipeline_parallel,
        )
        most = source.max_concurrent_requests(scheme, candidate, MAX_CONCURRENCY_SHOWN)
    per_token = source.kv_bytes_per_token(scheme)
    tokens = plan.kv_tokens_per_request()
    return DecoderServingRead(
        batching=plan.batching,
        concurrent_requests=p.batch,
        max_concurrent_requests=most,
        beam_width=plan.beam_width,
        decode_sequences=p.batch * plan.beam_width,
        prompt_tokens=plan.priced_prompt_tokens,
        decode_steps=plan.decode_steps,
        mean_context_tokens=plan.mean_context_tokens,
        kv_bytes_per_token=per_token,
        kv_tokens_per_request=tokens,
        kv_bytes_per_request=kv_bytes_per_request(
            plan,
            source.kv_bytes_per_token(scheme, p.tensor_parallel),
            gpus=p.pipeline_parallel,
        ),
        note=plan.describe(),
    )


MAX_CONCURRENCY_SHOWN = 65_536  # the largest batch a search may try (MAX_SEARCH_BATCH)


def ranked_candidate(
    rank_: int,
    item: Assessment,
    generated: int | None,
    serving: DecoderServingRead | None = None,
) -> RankedCandidate:
    """The API view of one assessed candidate."""
    p = item.prediction
    device = p.device
    split = p.time_split_s
    latency = p.latency_s
    return RankedCandidate(
        rank=rank_,
        device=device.slug,
        device_name=device.name,
        kind=device.kind,
        mig_profile=device.mig_profile,
        precision=p.precision,
        batch_size=p.batch,
        gpus=p.tensor_parallel * p.pipeline_parallel,
        tensor_parallel=p.tensor_parallel,
        pipeline_parallel=p.pipeline_parallel,
        allreduce_link=p.allreduce_link_source or None,
        eligible=item.eligible,
        reasons=list(item.reasons),
        latency_ms=item.latency_s * 1e3,
        throughput_per_s=item.throughput_per_s,
        meets_latency_slo=item.meets_latency_slo,
        devices_needed=item.devices_needed,
        cost_usd_per_million=item.cost_usd_per_million,
        fleet_cost_usd_per_hour=item.fleet_cost_usd_per_hour,
        unpriced_reason=item.unpriced_reason,
        energy_j_per_inference=item.energy_j_per_inference,
        fits_in_memory=item.memory.fits,
        memory_required_bytes=item.memory.required_bytes,
        memory_available_bytes=item.memory.available_bytes,
        memory_detail=item.memory.detail,
        bound=p.bound,
        time_shares=TimeShares(
            compute=split[Bound.COMPUTE] / latency,
            memory=split[Bound.MEMORY] / latency,
            transfer=split[Bound.TRANSFER] / latency,
            overhead=split[Bound.OVERHEAD] / latency,
        ),
        arithmetic_intensity_flops_per_byte=p.arithmetic_intensity_flops_per_byte,
        ridge_point_flops_per_byte=p.ridge_point_flops_per_byte,
        flops_per_inference=p.flops / p.batch,
        time_to_first_token_ms=None if p.first_token_s is None else p.first_token_s * 1e3,
        per_token_latency_ms=None if p.per_token_s is None else p.per_token_s * 1e3,
        tokens_per_s=None if generated is None else item.throughput_per_s * generated,
        inputs=_inputs(p),
        phases=[PhaseRead.model_validate(t) for t in p.phases],
        server=None if item.server is None else _server_read(item.server),
        llm_server=None if item.llm_server is None else llm_server_read(item.llm_server),
        decoder_serving=serving,
        pipeline=None if p.pipeline is None else _pipeline_read(p.pipeline),
    )


def _pipeline_read(timing: PipelineTiming) -> PipelineRead:
    return PipelineRead(
        stages=timing.stages,
        micro_batches=timing.micro_batches,
        micro_batch_size=timing.micro_batch_size,
        link=timing.link_source,
        link_bytes_per_s=timing.link_bytes_per_s,
        transfer_latency_s=timing.transfer_latency_s,
        stage_layout=[
            PipelineStageRead(
                stage=index,
                blocks=span.blocks,
                kernels=span.kernels,
                first_kernel=span.first_kernel,
                last_kernel=span.last_kernel,
            )
            for index, span in enumerate(timing.spans)
        ],
        phases=[
            PipelinePhaseRead(
                name=phase.name,
                stage_s=list(phase.stage_s),
                send_bytes=list(phase.send_bytes),
                send_s=list(phase.send_s),
                slot_s=phase.slot_s,
                round_trip_s=phase.round_trip_s,
                cycle_s=phase.cycle_s,
                idle_fraction=phase.idle_fraction,
                gpipe_bubble_fraction=phase.gpipe_bubble_fraction,
            )
            for phase in timing.phases
        ],
    )


def _server_read(load: ServerLoad) -> ServerScenarioRead:
    return ServerScenarioRead(
        arrival_rate_per_s=load.arrival_rate_per_s,
        p99_latency_ms=load.p99_latency_s * 1e3,
        p99_bound_ms=load.p99_bound_s * 1e3,
        batch_cap=load.batch_cap,
        mean_batch=load.mean_batch,
        utilisation=load.utilisation,
        offline_throughput_per_s=load.offline_throughput_per_s,
        offline_share=load.offline_share,
        requests_simulated=load.requests,
        p99_doubled_ms=load.p99_doubled_s * 1e3,
        p99_drift=load.drift,
        stable=load.stable,
        lowered_for_stability=load.lowered,
        note=load.note(),
    )
