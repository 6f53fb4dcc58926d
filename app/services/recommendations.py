"""Inference recommendation use cases: load the model and the candidate devices, convert them
once, run the domain's search (app.domain.performance.batch_search) outside the database, and
render the answer (recommendation_views); the roofline chart."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from sqlalchemy.orm import Session

from app.charts import Roof, RoofPoint, binding_phrases, roofline_svg
from app.db.models import Hardware
from app.db.repositories import HardwareRepository
from app.domain.budget import (
    PEAK_LAYER_UNITS,
    WorkEstimate,
    WorkFactor,
    check_budget,
    checkpoint,
    graph_layers,
    work_units,
)
from app.domain.hardware import HardwareSpec, PriceKind, mig_slice
from app.domain.performance.batch_search import LLM_TOP, batch_sizes, search
from app.domain.performance.calibration import DEFAULT_CALIBRATIONS, calibration_class
from app.domain.performance.candidates import Candidate, runnable_candidates
from app.domain.performance.precision_schemes import PRECISION_SCHEMES
from app.domain.performance.roofline import kernel_points, predict, unsupported_reason
from app.domain.performance.runtimes import (
    DECODER_ONLY,
    RUNTIME_PROFILES,
    ServingRuntime,
    calibrations_for,
)
from app.domain.precision import Precision
from app.schemas.recommendations import (
    Exclusion,
    InferenceRecommendationRequest,
    InferenceRecommendationResponse,
)
from app.services.cache import collector_paused
from app.services.convert import (
    GraphSource,
    calibration_overrides,
    decoder_serving,
    fuse_elementwise,
    geometry,
    hardware_spec,
    model_graph,
    recommendation_requirements,
)
from app.services.engine_fit import engine_gate
from app.services.errors import InvalidInput, NotFound
from app.services.pipeline import BUDGET_SETTING, require_profile, workload_pointers
from app.services.recommendation_source import ModelSource, checkpoint_precisions, source_of
from app.services.recommendation_source import clear_caches as clear_caches  # benchmarks use it
from app.services.recommendation_views import recommendation_response

# --------------------------------------------------------------------------------------------
# Devices
# --------------------------------------------------------------------------------------------


def _candidate(row: Hardware, device: HardwareSpec) -> Candidate:
    return Candidate(device=device, runtime=device.runtime, overhead=device.overhead)


def _slices(row: Hardware, whole: HardwareSpec) -> list[HardwareSpec]:
    if row.mig_total_compute_slices is None:
        return []
    geo = geometry(row)
    return [mig_slice(whole, geo, profile) for profile in geo.profiles]


def candidates(
    session: Session,
    names: Sequence[str] | None,
    prices: Mapping[str, float],
    price_kind: PriceKind = PriceKind.ON_DEMAND,
) -> list[Candidate]:
    """The named devices (``slug`` or ``slug/profile``), or every device and MIG slice; a
    request's ``prices`` are prices of ``price_kind``."""
    return candidates_of(HardwareRepository(session).all_by_slug(), names, prices, price_kind)


def candidates_of(
    rows: Mapping[str, Hardware],
    names: Sequence[str] | None,
    prices: Mapping[str, float],
    price_kind: PriceKind = PriceKind.ON_DEMAND,
) -> list[Candidate]:
    """:func:`candidates` from the hardware rows by slug, already loaded."""
    for slug in prices:
        if slug not in rows:
            raise NotFound(
                f"prices_usd_per_hour names hardware profile '{slug}', which does not exist; "
                "GET /v1/hardware lists them"
            )
    if names is None:
        found = []
        for slug in sorted(rows):
            whole = hardware_spec(
                rows[slug], price_usd_per_hour=prices.get(slug), request_price_kind=price_kind
            )
            found += [_candidate(rows[slug], d) for d in [whole, *_slices(rows[slug], whole)]]
        return found
    chosen = []
    for name in names:
        slug, _, profile_name = name.partition("/")
        row = rows.get(slug)
        if row is None:
            raise NotFound(f"hardware profile '{slug}' does not exist; GET /v1/hardware lists them")
        whole = hardware_spec(
            row, price_usd_per_hour=prices.get(slug), request_price_kind=price_kind
        )
        if not profile_name:
            chosen.append(_candidate(row, whole))
            continue
        if row.mig_total_compute_slices is None:
            raise NotFound(f"'{slug}' does not support MIG, so it has no profile '{profile_name}'")
        geo = geometry(row)
        chosen.append(_candidate(row, mig_slice(whole, geo, require_profile(geo, profile_name))))
    return chosen


DECODER_OPTIONS = (
    "ttft_p99_ms",
    "tpot_p99_ms",
    "max_num_batched_tokens",
    "max_num_seqs",
    "prompt_tokens_mean",
    "generated_tokens_mean",
    "prompt_length_distribution",
    "generated_length_distribution",
    "batching",
    "beam_width",
    "kv_block_tokens",
    "beams_share_prompt",
)


def _runtimes_for_any_model() -> str:
    """The serving runtimes a model that is not a decoder may ask for, in words."""
    names = [runtime.value for runtime in ServingRuntime if runtime not in DECODER_ONLY]
    return f"{', '.join(names[:-1])} or {names[-1]}"


def _check_decoder_options(payload: InferenceRecommendationRequest, source: ModelSource) -> None:
    """Decoder serving options are refused for a model that is not a decoder."""
    given = [name for name in DECODER_OPTIONS if name in payload.model_fields_set]
    if given and not source.decoder:
        raise InvalidInput(
            f"{', '.join(given)} {'describe' if len(given) > 1 else 'describes'} decoder LLM "
            f"serving; {source.label} has no causal "
            "self-attention over a `seq` input (not a decoder)",
            pointer=f"/{given[0]}",
        )
    if payload.serving_runtime in DECODER_ONLY and not source.decoder:
        raise InvalidInput(
            f"serving_runtime {payload.serving_runtime.value} is profiled on decoder LLM "
            f"serving only; {source.label} has no causal self-attention over a `seq` input "
            f"(not a decoder): use {_runtimes_for_any_model()}",
            pointer="/serving_runtime",
        )


def _batches(payload: InferenceRecommendationRequest) -> list[int]:
    """The batch sizes the request asks to try (app.domain.performance.batch_search)."""
    return batch_sizes(payload.scenario, payload.batch_sizes, payload.max_batch_size)


# --------------------------------------------------------------------------------------------
# The use case
# --------------------------------------------------------------------------------------------


def recommend(
    session: Session, *, payload: InferenceRecommendationRequest
) -> InferenceRecommendationResponse:
    """Rank every candidate device and precision at its best batch size, and explain."""
    return prepare_recommend(session, payload=payload)()


def prepare_recommend(
    session: Session, *, payload: InferenceRecommendationRequest, limit_units: int | None = None
) -> Callable[[], InferenceRecommendationResponse]:
    """Load the model and the candidate devices, check the work budget (``limit_units``:
    graph layers x devices x precisions x batch sizes, app.domain.budget), and return the
    recommendation's computation, which needs no database (app.api.compute)."""
    pointers = workload_pointers("", inline_architecture=payload.architecture is not None)
    with pointers:
        graph = model_graph(session, payload.model, payload.architecture)
        rows = HardwareRepository(session).all_by_slug()
    pool = candidates_of(rows, payload.devices, payload.prices_usd_per_hour, payload.price_kind)
    if limit_units is not None:
        work = recommendation_work(graph, payload, len(pool))
        check_budget(work, limit_units, setting=BUDGET_SETTING)

    def compute() -> InferenceRecommendationResponse:
        with (
            collector_paused(),
            workload_pointers("", inline_architecture=payload.architecture is not None),
        ):
            return _recommend(graph, pool, payload=payload)

    return compute


# One continuous-batching server simulated to stable TTFT / TPOT p99s (bisection over 2,000
# arrivals, a check over 4,000): about 0.1 s of CPU on the loaded 2-core reference machine
# (benchmarks/llm_server_load.py), 200,000 units of ~0.5 us.
LLM_SERVER_UNITS = 200_000
# With request length distributions a simulation takes about twice as long (more back-offs
# before the doubled run is stable: benchmarks/llm_server_load.py, lognormal vs fixed lengths,
# 2.1 s vs 1.0 s of CPU for the catalog under 2 s / 200 ms, ~0.1 s more per simulated server).
LLM_SERVER_LENGTHS_FACTOR = 2


def recommendation_work(
    graph: GraphSource, payload: InferenceRecommendationRequest, devices: int
) -> WorkEstimate:
    """The work of a recommendation, known before computing (app.domain.budget): every layer
    as written predicted on every candidate device (MIG slices included) at every precision and
    batch size, plus a memory estimate of every executed layer per precision and batch size."""
    size = graph_layers(graph[1])
    where = "/architecture/layers" if payload.architecture is not None else "/model"
    precisions = WorkFactor(name="precisions", value=len(payload.precisions), field="/precisions")
    batches = WorkFactor(
        name="batch sizes",
        value=len(_batches(payload)),
        field="/batch_sizes" if payload.batch_sizes is not None else "/max_batch_size",
    )
    work = work_units(
        WorkFactor(name="graph layers", value=size.written_layers, field=where),
        WorkFactor(name="devices", value=devices, field="/devices"),
        precisions,
        batches,
    ) + work_units(
        WorkFactor(name="executed layers", value=size.executed_layers, field=where),
        precisions,
        batches,
        weight=PEAK_LAYER_UNITS,
    )
    if payload.ttft_p99_ms is None:
        return work
    # Under TTFT / TPOT bounds about LLM_TOP servers are simulated in full (the rest are
    # pruned by their objective floor or fail fast): LLM_SERVER_UNITS each.
    servers = min(devices * len(payload.precisions), LLM_TOP)
    varied = (
        payload.prompt_length_distribution is not None
        or payload.generated_length_distribution is not None
    )
    return work + work_units(
        WorkFactor(name="simulated LLM servers", value=servers, field="/devices"),
        weight=LLM_SERVER_UNITS * (LLM_SERVER_LENGTHS_FACTOR if varied else 1),
    )


def _recommend(
    graph: GraphSource, pool: list[Candidate], *, payload: InferenceRecommendationRequest
) -> InferenceRecommendationResponse:
    source = source_of(
        graph,
        bindings=payload.bindings,
        sequence_length=payload.sequence_length,
        image_size=payload.image_size,
        prompt_tokens=payload.prompt_tokens,
        generated_tokens=payload.generated_tokens,
        fuse_elementwise=fuse_elementwise(payload),
        tokens_mean=payload.tokens_mean,
        serving=decoder_serving(payload),
    )
    _check_decoder_options(payload, source)
    cals = calibrations_for(payload.serving_runtime, calibration_overrides(payload.calibration))
    precisions, contradicted = checkpoint_precisions(source, payload.precisions, pool)
    runnable, left_out = runnable_candidates(
        source,
        pool,
        [PRECISION_SCHEMES[p] for p in precisions],
        payload.parallelism,
        tensor_parallel_max=payload.tensor_parallel_max,
        pipeline_parallel_max=payload.pipeline_parallel_max,
        tensor_parallel_size=payload.tensor_parallel_size,
    )
    runnable, engine_out = engine_gate(graph, payload.engine, runnable)  # eligibility
    excluded = [
        Exclusion(device=e.device, precision=e.precision, reason=e.reason) for e in left_out
    ] + [Exclusion(device=d, precision=p, reason=r) for d, p, r in engine_out + contradicted]
    if engine_out and not runnable:
        raise InvalidInput(
            "the engine starts on no candidate: "
            + "; ".join(f"{d}: {r}" for d, _, r in engine_out[:5]),
            pointer="/engine",
        )
    if not runnable:
        raise InvalidInput(
            "no candidate device can run the requested precisions: "
            + "; ".join(f"{e.device} {e.precision.value}: {e.reason}" for e in excluded[:10]),
            pointer="/precisions",
        )
    requirements = recommendation_requirements(payload)
    batches = _batches(payload)
    ranked = search(
        source,
        runnable,
        batches=batches,
        calibrations=cals,
        requirements=requirements,
        scenario=payload.scenario,
        objective=payload.objective,
        host_step_s=RUNTIME_PROFILES[payload.serving_runtime].host_overhead_per_sequence_step_s,
        sizes_given=payload.batch_sizes is not None,
        max_batch_size=payload.max_batch_size,
        shown=payload.limit,
    )
    return recommendation_response(
        payload,
        source,
        pool=pool,
        runnable=runnable,
        ranked=ranked,
        excluded=excluded,
        calibrations=cals,
        requirements=requirements,
        batches=batches,
    )


# --------------------------------------------------------------------------------------------
# Roofline picture
# --------------------------------------------------------------------------------------------

MAX_CHART_DEVICES = 8


def roofline_chart(session: Session, **options: Any) -> str:
    """An SVG roofline of a stored model's kernels on up to eight devices (or MIG slices)."""
    return prepare_roofline_chart(session, **options)()


def prepare_roofline_chart(
    session: Session,
    *,
    model: str,
    devices: Sequence[str],
    precision: Precision,
    batch_size: int,
    sequence_length: int | None = None,
    image_size: int | None = None,
    prompt_tokens: int = 512,
    generated_tokens: int = 128,
    limit_units: int | None = None,
) -> Callable[[], str]:
    """Load the model and devices of :func:`roofline_chart` (work budget: graph layers x
    devices); the returned function draws it without the database (app.api.compute)."""
    if not devices:
        raise InvalidInput("name at least one device", pointer="devices")
    if len(devices) > MAX_CHART_DEVICES:
        raise InvalidInput(
            f"at most {MAX_CHART_DEVICES} devices per chart, got {len(devices)}",
            pointer="devices",
        )
    graph = model_graph(session, model, None)
    pool = candidates_of(HardwareRepository(session).all_by_slug(), devices, {})
    if limit_units is not None:
        size = graph_layers(graph[1])
        work = work_units(
            WorkFactor(name="graph layers", value=size.written_layers, field="model"),
            WorkFactor(name="devices", value=len(pool), field="devices"),
        ) + work_units(
            WorkFactor(name="executed layers", value=size.executed_layers, field="model"),
            weight=PEAK_LAYER_UNITS,
        )
        check_budget(work, limit_units, setting=BUDGET_SETTING)
    source = source_of(
        graph,
        bindings={},
        sequence_length=sequence_length,
        image_size=image_size,
        prompt_tokens=prompt_tokens,
        generated_tokens=generated_tokens,
        fuse_elementwise=True,
    )
    return lambda: _roofline_chart(source, pool, precision=precision, batch_size=batch_size)


def _roofline_chart(
    source: ModelSource, pool: list[Candidate], *, precision: Precision, batch_size: int
) -> str:
    scheme = PRECISION_SCHEMES[precision]
    workload = source.workload(batch_size, scheme)
    roofs: list[Roof] = []
    points: list[RoofPoint] = []
    skipped: list[str] = []
    for candidate in pool:
        checkpoint()
        device = candidate.device
        reason = unsupported_reason(device, scheme)
        if reason is not None:
            skipped.append(f"{device.slug} ({reason})")
            continue
        prediction = predict(
            workload, device, DEFAULT_CALIBRATIONS[calibration_class(device, scheme)]
        )
        index = len(roofs)
        roofs.append(
            Roof(
                label=f"{device.name}, {prediction.compute_dtype.value}",
                peak_flops_per_s=prediction.effective_flops_per_s,
                bandwidth_bytes_per_s=prediction.effective_bandwidth_bytes_per_s,
                spec_peak_flops_per_s=prediction.peak_flops_per_s * device.compute_fraction,
                spec_bandwidth_bytes_per_s=device.memory_bandwidth_bytes_per_s
                * device.bandwidth_fraction,
            )
        )
        for phase in workload.phases:
            points += [
                RoofPoint(
                    roof=index,
                    label=f"{phase.name} {point.name} ({'+'.join(point.ops)})",
                    intensity_flops_per_byte=point.intensity_flops_per_byte,
                    achieved_flops_per_s=point.achieved_flops_per_s,
                    decode=phase.name == "decode",
                )
                for point in kernel_points(phase, prediction)
                if point.achieved_flops_per_s > 0
            ]
    if not roofs:
        raise InvalidInput(
            f"no named device can run {precision.value}: " + "; ".join(skipped),
            pointer="precision",
        )
    subtitle = (
        f"{source.label}: {len(workload.phases[0].kernels)} kernels per "
        f"{workload.phases[0].name}, achieved FLOP/s with launch overhead"
    )
    if skipped:
        subtitle += "; not drawn: " + ", ".join(skipped)
    bound = [source.label, precision.value, f"batch {batch_size}"]
    if source.decoder:  # prefill at the prompt, decode steps up to prompt + generated tokens
        bound.append(f"prompt {source.prompt_tokens} + {source.generated_tokens} generated tokens")
        bound += binding_phrases(source.bindings(batch_size), skip=("batch", "seq"))
    else:
        bound += binding_phrases(source.bindings(batch_size))
    return roofline_svg(
        title=f"Roofline: {', '.join(bound)}",
        subtitle=subtitle,
        roofs=roofs,
        points=points,
    )
