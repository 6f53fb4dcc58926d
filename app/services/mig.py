"""MIG use cases: profile listing, fit checks, layout validation and partition plans."""

from __future__ import annotations

from collections.abc import Callable

import yaml
from sqlalchemy.orm import Session

from app.db.models import Hardware
from app.db.repositories import HardwareRepository
from app.domain.budget import (
    WorkEstimate,
    check_budget,
    checkpoint,
)
from app.domain.fit import fits
from app.domain.mig.layout import (
    MigError,
    MigGeometry,
    MigProfileSpec,
    Placement,
    kubernetes_resource,
    smallest_fitting,
)
from app.domain.mig.layout import validate_layout as check_layout
from app.domain.mig.parted import mig_parted_config
from app.domain.mig.plan import Demand, plan_partitions
from app.domain.precision import Precision
from app.schemas.estimates import WorkloadInput
from app.schemas.hardware import MigProfileRead
from app.schemas.mig import (
    FitAlternatives,
    LargerGpu,
    LayoutValidateRequest,
    LayoutValidateResponse,
    MigFitRequest,
    MigFitResponse,
    MigPlanRequest,
    MigPlanResponse,
    MigProfileList,
    PlanItem,
    PlannedGpu,
    PlannedInstance,
    PlannedWorkload,
    ProfileFit,
    Violation,
)
from app.services.convert import (
    GraphSource,
    geometry,
    model_graph,
    runs_precision,
    split_gpu,
)
from app.services.engine_fit import EngineFit, engine_read
from app.services.errors import (
    InvalidInput,
)
from app.services.pipeline import (
    BUDGET_SETTING,
    Required,
    engine_on,
    estimates_work,
    graph_pointer,
    mig_hardware,
    require_profile,
    required_lines,
    required_memory_of,
    spec_pointers,
    workload_spec,
)
from app.services.state_cache import Digest, PerWatch, timed_digest

MAX_BATCH_SEARCH = 1_048_576
# A process sees one MIG instance: CUDA enumerates a single MIG device per process (NVIDIA MIG
# User Guide, "CUDA Device Enumeration"), so an engine's tensor x pipeline group of several
# GPUs cannot be formed from slices.
ONE_SLICE = (
    "a tensor x pipeline group of {gpus} GPUs cannot span MIG slices: CUDA shows a process one "
    "MIG instance (NVIDIA MIG User Guide, CUDA device enumeration)"
)
MAX_PLAN_REPLICAS = 100_000


def list_profiles(session: Session, *, slug: str) -> MigProfileList:
    """Every MIG profile of a GPU with memory in bytes and MiB."""
    row = mig_hardware(session, slug)
    unconfirmed = {p.name: list(p.unconfirmed) for p in row.mig_profiles}
    geo = geometry(row)
    return MigProfileList(
        gpu=geo.gpu,
        total_compute_slices=geo.total_compute_slices,
        total_memory_slices=geo.total_memory_slices,
        max_gpu_instances=geo.max_gpu_instances,
        profiles=[
            MigProfileRead(
                name=p.name,
                memory_mib=p.memory_mib,
                memory_bytes=p.memory_bytes,
                compute_slices=p.compute_slices,
                sm_count=p.sm_count,
                memory_slices=p.memory_slices,
                max_instances=p.max_instances,
                placements=list(p.placements),
                kubernetes_resource=kubernetes_resource(p.name),
                unconfirmed=unconfirmed[p.name],
            )
            for p in geo.profiles
        ],
    )


def _engine_profile_fit(profile: MigProfileSpec, engine: EngineFit) -> ProfileFit:
    """A profile's fit for a workload with an engine: the engine's requirement against what the
    slice shows (app.domain.fit.fits, the engine's own verdict); a multi-GPU group never."""
    gpus = engine.resolved.tensor_parallel_size * engine.resolved.pipeline_parallel_size
    required = engine.requirement.required_bytes
    verdict = fits(required, engine.visible_bytes) and gpus == 1
    reason = engine.reason if gpus == 1 else ONE_SLICE.format(gpus=gpus)
    return ProfileFit(
        profile=profile.name,
        kubernetes_resource=kubernetes_resource(profile.name),
        compute_slices=profile.compute_slices,
        usable_bytes=engine.visible_bytes,
        required_bytes=required,
        headroom_bytes=engine.visible_bytes - required,
        fits=verdict,
        limiting_factor="none" if verdict else "memory",
        reason=None if verdict else reason,
        engine=engine_read(engine),
    )


def _smallest(geo: MigGeometry, fitting: list[ProfileFit]) -> MigProfileSpec | None:
    """The qualifying profile with the fewest compute slices, then the least memory (the order
    of app.domain.mig.layout.smallest_fitting, for requirements that differ per profile)."""
    names = {f.profile for f in fitting if f.fits}
    chosen = [p for p in geo.profiles if p.name in names]
    if not chosen:
        return None
    return min(chosen, key=lambda p: (p.compute_slices, p.memory_mib, p.memory_slices, p.name))


def _profile_fit(profile: MigProfileSpec, required: int) -> ProfileFit:
    verdict = fits(required, profile.memory_bytes)
    return ProfileFit(
        profile=profile.name,
        kubernetes_resource=kubernetes_resource(profile.name),
        compute_slices=profile.compute_slices,
        usable_bytes=profile.memory_bytes,
        required_bytes=required,
        headroom_bytes=profile.memory_bytes - required,
        fits=verdict,
        limiting_factor="none" if verdict else "memory",
    )


def fit(session: Session, *, payload: MigFitRequest) -> MigFitResponse:
    """Which profiles of a GPU hold the workload; if none, what would."""
    return prepare_fit(session, payload=payload)()


def fit_search_points(spec: WorkloadInput) -> int:
    """Estimates a fit may compute: its own, and when no profile holds it, a binary search
    over batch sizes 1 .. min(batch_size, MAX_BATCH_SEARCH) (one estimate per step)."""
    return 2 + min(spec.batch_size, MAX_BATCH_SEARCH).bit_length()


def prepare_fit(
    session: Session, *, payload: MigFitRequest, limit_units: int | None = None
) -> Callable[[], MigFitResponse]:
    """Load what :func:`fit` needs (the GPU, the workload, its graph, the larger GPUs) and
    check the work budget (graph layers x estimates, ``limit_units``); the returned function
    computes the fit without the database (app.api.compute)."""
    slug, named_profile = split_gpu(payload)
    row = mig_hardware(session, slug)
    geo = geometry(row)
    requested_profile = require_profile(geo, named_profile) if named_profile else None
    with spec_pointers("/workload", payload.workload):
        spec = workload_spec(session, payload.workload)
        graph = model_graph(session, spec.model, spec.architecture)
    if spec.engine is None:
        for name in ("min_concurrency", "max_model_len"):
            if getattr(payload, name) is not None:
                raise InvalidInput(
                    f"{name} asks about a serving engine: give the workload an `engine`",
                    pointer=f"/{name}",
                )
    if limit_units is not None:
        work = estimates_work(
            graph,
            spec,
            1 if spec.engine is not None else fit_search_points(spec),
            graph_pointer("/workload", payload.workload),
            "/workload/batch_size",
        )
        check_budget(work, limit_units, setting=BUDGET_SETTING)
    # Every GPU, smallest first: the "GPUs that would fit" are picked once the requirement and
    # the resolved precision are known (columns only: read after the session has closed).
    gpus = HardwareRepository(session).gpus_by_memory()

    def compute() -> MigFitResponse:
        with spec_pointers("/workload", payload.workload):
            return _fit(payload, row, geo, requested_profile, spec, graph, gpus)

    return compute


def _fit(
    payload: MigFitRequest,
    row: Hardware,
    geo: MigGeometry,
    requested_profile: MigProfileSpec | None,
    spec: WorkloadInput,
    graph: GraphSource,
    gpus: list[Hardware],
) -> MigFitResponse:
    need = required_memory_of(
        graph,
        spec,
        row,
        cuda_context_bytes=payload.cuda_context_bytes,
        safety_margin_fraction=payload.safety_margin_fraction,
    )
    if spec.engine is not None:
        return _engine_fit(payload, row, geo, requested_profile, spec, graph, gpus, need)
    required = need.required_bytes
    profile_fits = [_profile_fit(p, required) for p in geo.profiles]
    smallest = smallest_fitting(geo, required)
    alternatives = None
    if smallest is None:
        alternatives = _alternatives(
            payload, row, geo, required, need.run.resolved.precision, spec, graph, gpus
        )
    return MigFitResponse(
        gpu=geo.gpu,
        required_bytes=required,
        required=need.lines,
        estimate_peak_phase=need.run.result.peak_phase,
        profiles=profile_fits,
        smallest_fitting_profile=smallest.name if smallest else None,
        smallest_fitting_resource=kubernetes_resource(smallest.name) if smallest else None,
        requested=_profile_fit(requested_profile, required) if requested_profile else None,
        alternatives=alternatives,
        assumptions=list(need.run.result.assumptions),
        attention=need.run.attention,
        defaults_used=need.run.defaults_used(),
    )


def _engine_fit(
    payload: MigFitRequest,
    row: Hardware,
    geo: MigGeometry,
    requested_profile: MigProfileSpec | None,
    spec: WorkloadInput,
    graph: GraphSource,
    gpus: list[Hardware],
    need: Required,
) -> MigFitResponse:
    """The MIG fit of a workload with an engine: the smallest profile on which the engine
    starts with at least N sequences of L tokens (``min_concurrency``, ``max_model_len``), each
    other profile with its reason; the requirement differs per profile (the engine's defaults
    and claim follow the memory each shows)."""

    def on(profile: MigProfileSpec | None, hardware: Hardware = row) -> EngineFit:
        found = engine_on(
            graph,
            spec,
            hardware,
            profile,
            sequences=payload.min_concurrency,
            max_model_len=payload.max_model_len,
        )
        assert found is not None  # the workload has an engine
        return found

    whole = on(None)
    profile_fits = [_engine_profile_fit(p, on(p)) for p in geo.profiles]
    smallest = _smallest(geo, profile_fits)
    alternatives = None
    if smallest is None:
        precision = need.run.resolved.precision
        larger: list[Hardware] = []
        for gpu in gpus:
            if len(larger) == 5:
                break
            if gpu.slug != row.slug and runs_precision(gpu, precision) and on(None, gpu).fits:
                larger.append(gpu)
        biggest = max(geo.profiles, key=lambda p: (p.memory_mib, p.compute_slices, p.name))
        alternatives = FitAlternatives(
            full_gpu_fits=whole.fits,
            full_gpu_memory_bytes=whole.visible_bytes,
            larger_gpus=[
                LargerGpu(
                    hardware=gpu.slug,
                    memory_bytes=gpu.memory_bytes,
                    mig_capable=gpu.mig_total_compute_slices is not None,
                )
                for gpu in larger
            ],
            largest_batch_on_biggest_profile=None,
            biggest_profile=biggest.name,
        )
    requested = None
    if requested_profile is not None:
        requested = next(f for f in profile_fits if f.profile == requested_profile.name)
    return MigFitResponse(
        gpu=geo.gpu,
        required_bytes=whole.requirement.required_bytes,
        required=required_lines(whole.requirement),
        estimate_peak_phase=need.run.result.peak_phase,
        profiles=profile_fits,
        smallest_fitting_profile=smallest.name if smallest else None,
        smallest_fitting_resource=kubernetes_resource(smallest.name) if smallest else None,
        requested=requested,
        alternatives=alternatives,
        engine=engine_read(whole),
        assumptions=[
            f"requirement: {whole.engine}'s start-up memory (app.domain.fit.engine_requirement):"
            " the least memory a device must show to CUDA for the engine to start with at "
            f"least {whole.min_concurrency} sequence(s) of {whole.resolved.max_model_len:,} "
            "tokens; its defaults (max_num_batched_tokens, max_num_seqs) follow the memory "
            "each profile shows, so the requirement differs per profile",
            "a MIG slice shows its catalog usable memory to CUDA; a whole GPU: "
            + whole.visible_source,
            *need.run.result.assumptions,
        ],
        attention=need.run.attention,
        defaults_used=need.run.defaults_used(),
    )


# Fit answers (rendered JSON) per database, keyed by the request, valid in the generation of the
# planning data they were computed in (app.services.state_cache). Errors are not cached.
FITS: PerWatch[str, bytes] = PerWatch(size=256, name="mig_fits")


def fit_with_digest(session: Session, *, payload: MigFitRequest) -> tuple[bytes, Digest, float]:
    """``fit`` rendered as the response body, with the digest of the data it saw (read first,
    in the same session, so the answer is at least as new as the digest)."""
    render, digest, read_at = prepare_fit_with_digest(session, payload=payload)
    return render(), digest, read_at


def prepare_fit_with_digest(
    session: Session, *, payload: MigFitRequest, limit_units: int | None = None
) -> tuple[Callable[[], bytes], Digest, float]:
    """:func:`fit_with_digest` in two steps: the digest and the loading (this session), and
    the returned function that computes and renders the body (no database)."""
    digest, read_at = timed_digest(session)
    compute = prepare_fit(session, payload=payload, limit_units=limit_units)

    def render() -> bytes:
        body = compute().model_dump_json(by_alias=True, exclude_none=True)
        return body.encode()

    return render, digest, read_at


def _alternatives(
    payload: MigFitRequest,
    row: Hardware,
    geo: MigGeometry,
    required: int,
    precision: Precision,
    spec: WorkloadInput,
    graph: GraphSource,
    gpus: list[Hardware],
) -> FitAlternatives:
    biggest = max(geo.profiles, key=lambda p: (p.memory_mib, p.compute_slices, p.name))
    larger = [
        (gpu.slug, gpu.memory_bytes, gpu.mig_total_compute_slices is not None)
        for gpu in gpus
        if fits(required, gpu.memory_bytes) and runs_precision(gpu, precision)
    ][:5]
    return FitAlternatives(
        full_gpu_fits=fits(required, row.memory_bytes),
        full_gpu_memory_bytes=row.memory_bytes,
        larger_gpus=[
            LargerGpu(hardware=slug, memory_bytes=memory_bytes, mig_capable=mig)
            for slug, memory_bytes, mig in larger
        ],
        largest_batch_on_biggest_profile=_largest_batch(payload, row, biggest, spec, graph),
        biggest_profile=biggest.name,
    )


def _largest_batch(
    payload: MigFitRequest,
    row: Hardware,
    profile: MigProfileSpec,
    spec: WorkloadInput,
    graph: GraphSource,
) -> int | None:
    """Binary search for the largest batch whose requirement fits ``profile`` (memory grows
    with the batch size, so the predicate is monotone)."""

    def holds(batch: int) -> bool:
        checkpoint()
        need = required_memory_of(
            graph,
            spec,
            row,
            cuda_context_bytes=payload.cuda_context_bytes,
            safety_margin_fraction=payload.safety_margin_fraction,
            batch_size=batch,
        )
        return fits(need.required_bytes, profile.memory_bytes)

    if not holds(1):
        return None
    low, high = 1, min(spec.batch_size, MAX_BATCH_SEARCH)
    while low < high:
        middle = (low + high + 1) // 2
        if holds(middle):
            low = middle
        else:
            high = middle - 1
    return low


def validate_layout(session: Session, *, payload: LayoutValidateRequest) -> LayoutValidateResponse:
    """Check a layout against the GPU's MIG rules."""
    geo = geometry(mig_hardware(session, payload.gpu))
    for item in payload.instances:
        require_profile(geo, item.profile)
    violations = check_layout(
        geo, [Placement(profile=item.profile, start=item.start) for item in payload.instances]
    )
    return LayoutValidateResponse(
        gpu=geo.gpu,
        valid=not violations,
        violations=[
            Violation(rule=v.rule, message=v.message, instances=list(v.instances))
            for v in violations
        ],
    )


def _plan_profile(
    payload: MigPlanRequest,
    row: Hardware,
    geo: MigGeometry,
    index: int,
    item: PlanItem,
    loaded: tuple[WorkloadInput, GraphSource] | None,
) -> PlannedWorkload:
    if item.profile is not None:
        require_profile(geo, item.profile)
        return PlannedWorkload(name=item.name, profile=item.profile, replicas=item.replicas)
    assert item.workload is not None
    assert loaded is not None
    spec, graph = loaded
    with spec_pointers(f"/workloads/{index}/workload", item.workload):
        required = required_memory_of(
            graph,
            spec,
            row,
            cuda_context_bytes=payload.cuda_context_bytes,
            safety_margin_fraction=payload.safety_margin_fraction,
        ).required_bytes
        if spec.engine is not None:  # per profile: the engine's requirement on each slice
            fitted = []
            for profile in geo.profiles:
                engine = engine_on(graph, spec, row, profile)
                assert engine is not None
                fitted.append(_engine_profile_fit(profile, engine))
            chosen = _smallest(geo, fitted)
            if chosen is not None:
                required = next(f.required_bytes for f in fitted if f.profile == chosen.name)
        else:
            chosen = smallest_fitting(geo, required)
    if chosen is None:
        biggest = max(p.memory_bytes for p in geo.profiles)
        raise InvalidInput(
            f"workload '{item.name}' needs {required / 2**30:.1f} GiB; the biggest profile of "
            f"'{geo.gpu}' gives {biggest / 2**30:.1f} GiB (POST /v1/mig/fit for alternatives)",
            pointer="/workloads",
        )
    return PlannedWorkload(
        name=item.name, profile=chosen.name, replicas=item.replicas, required_bytes=required
    )


def plan(session: Session, *, payload: MigPlanRequest) -> MigPlanResponse:
    """Pack every replica onto the fewest GPUs with explicit valid layouts."""
    return prepare_plan(session, payload=payload)()


def prepare_plan(
    session: Session, *, payload: MigPlanRequest, limit_units: int | None = None
) -> Callable[[], MigPlanResponse]:
    """Load what :func:`plan` needs (the GPU, every workload and its graph), check the work
    budget (the graphs' layers summed, one estimate each, ``limit_units``), and return the
    plan's computation, which needs no database (app.api.compute)."""
    names = [item.name for item in payload.workloads]
    if len(set(names)) != len(names):
        raise InvalidInput("workload names must be unique", pointer="/workloads")
    total = sum(item.replicas for item in payload.workloads)
    if total > MAX_PLAN_REPLICAS:
        raise InvalidInput(
            f"{total:,} replicas in one plan; at most {MAX_PLAN_REPLICAS:,} (split the request)",
            pointer="/workloads",
        )
    row = mig_hardware(session, payload.gpu)
    geo = geometry(row)
    loaded: list[tuple[WorkloadInput, GraphSource] | None] = []
    for index, item in enumerate(payload.workloads):
        if (item.profile is None) == (item.workload is None):
            raise InvalidInput(
                f"workload '{item.name}': give exactly one of 'profile' or 'workload'",
                pointer="/workloads",
            )
        if item.workload is None:
            loaded.append(None)
            continue
        with spec_pointers(f"/workloads/{index}/workload", item.workload):
            spec = workload_spec(session, item.workload)
            loaded.append((spec, model_graph(session, spec.model, spec.architecture)))
    if limit_units is not None:
        work = WorkEstimate(terms=())
        for index, (item, each) in enumerate(zip(payload.workloads, loaded, strict=True)):
            if item.workload is not None and each is not None:
                where = graph_pointer(f"/workloads/{index}/workload", item.workload)
                work += estimates_work(each[1], each[0], 1, where, "/workloads")
        check_budget(work, limit_units, setting=BUDGET_SETTING)

    def compute() -> MigPlanResponse:
        sized = sorted(
            (
                _plan_profile(payload, row, geo, index, item, loaded[index])
                for index, item in enumerate(payload.workloads)
            ),
            key=lambda w: w.name,
        )
        return _plan(payload, geo, sized)

    return compute


def _plan(
    payload: MigPlanRequest, geo: MigGeometry, sized: list[PlannedWorkload]
) -> MigPlanResponse:
    try:
        result = plan_partitions(
            geo,
            [Demand(workload=w.name, profile=w.profile, replicas=w.replicas) for w in sized],
        )
    except MigError as exc:
        raise InvalidInput(str(exc), pointer="/workloads") from exc
    config = mig_parted_config(geo, result, config_name=payload.config_name)
    return MigPlanResponse(
        gpu=geo.gpu,
        gpu_count=len(result.gpus),
        optimal=result.optimal,
        workloads=sized,
        gpus=[
            PlannedGpu(
                index=gpu.index,
                instances=[
                    PlannedInstance(
                        workload=inst.workload,
                        profile=inst.profile,
                        start=inst.start,
                        kubernetes_resource=kubernetes_resource(inst.profile),
                    )
                    for inst in gpu.instances
                ],
                free_compute_slices=gpu.free_compute_slices,
                free_memory_slices=gpu.free_memory_slices,
                unused_memory_slices=list(gpu.unused_memory_slices),
            )
            for gpu in result.gpus
        ],
        mig_parted=config,
        mig_parted_yaml=yaml.safe_dump(config, sort_keys=False),
    )
