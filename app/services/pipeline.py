"""The estimate pipeline shared by the use cases: load a model, resolve the workload from the one
default table, analyse, estimate, and the one requirement (app.domain.fit). No use case imports
another; they all come here."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError
from sqlalchemy.orm import Session

from app.db.models import Hardware, Workload
from app.db.repositories import HardwareRepository, WorkloadRepository
from app.domain.budget import (
    WorkEstimate,
    WorkFactor,
    check_budget,
    estimate_work,
    graph_layers,
)
from app.domain.errors import GraphError
from app.domain.fit import FitInputError, Requirement, requirement
from app.domain.fit import fit as fit_verdict
from app.domain.graph.analysis import GraphAnalysis, analyze
from app.domain.hardware import (
    FrameworkOverhead,
)
from app.domain.memory.checkpoint import CheckpointError, checkpoint_precision
from app.domain.memory.estimate import (
    MAX_REPLAYED_LAYERS,
    MemoryEstimate,
    MemoryInputError,
    MemoryRequest,
    check_tensor_parallel_heads,
    estimate_memory,
)
from app.domain.mig.layout import (
    MigGeometry,
    MigProfileSpec,
)
from app.domain.parallel import TensorParallelError
from app.domain.peft import LoraError
from app.domain.peft.qlora import check_qlora_device
from app.domain.units import GIB
from app.domain.workload import (
    Attention,
    GpuTraits,
    Logits,
    Mode,
    ResolvedWorkload,
    Runtime,
    TrainingOptionError,
    resolve,
)
from app.schemas.estimates import (
    BreakdownLine,
    CudaMemoryRead,
    DefaultUsedRow,
    FitSummary,
    KeptTensorRow,
    LayerRow,
    MemoryEstimateRequest,
    MemoryEstimateResponse,
    OverheadSpec,
    RequiredLine,
    WorkloadInput,
)
from app.schemas.workloads import (
    WorkloadBase,
)
from app.services.cache import LruCache
from app.services.convert import (
    DeviceTarget,
    GraphSource,
    device_target,
    domain_workload,
    hardware_gpu,
    hardware_overhead,
    hardware_runtime,
    input_decls,
    model_graph,
    overhead_sources,
    to_spec,
    workload_fields,
)
from app.services.engine_fit import (
    EngineFit,
    check_engine,
    device_memory,
    engine_choice,
    engine_fit,
    engine_read,
)
from app.services.errors import InvalidInput, NotFound
from app.services.model_store import invalid_graph

MAX_REPORTED_BYTES = 2**63 - 1
BUDGET_SETTING = "CAPPLAN_MAX_WORK_UNITS"


def analyze_graph(
    inputs: Sequence[Mapping[str, Any]],
    layers: Sequence[Mapping[str, Any]],
    bindings: Mapping[str, int],
    *,
    training: bool,
    resolved: ResolvedWorkload | None = None,
    logits: Logits = Logits.ALL,
    attention: Attention | None = None,
) -> GraphAnalysis:
    """Analyse a stored or inline graph; an invalid graph is a 422 naming layer and field.
    ``resolved`` (a whole workload) decides attention, runtime, precision and logits; without
    it, ``logits`` and ``attention`` do (None: SDPA's choice on CUDA at fp32)."""
    options: dict[str, Any] = {"logits": logits, "attention": attention}
    if resolved is not None:
        options = {
            "attention": resolved.attention,
            "runtime": resolved.runtime,
            "precision": resolved.precision,
            "logits": resolved.logits,
            "gpu": resolved.gpu,
        }
    try:
        return analyze(input_decls(inputs), layers, bindings, training=training, **options)
    except GraphError as exc:
        raise invalid_graph(exc, layers) from exc


@dataclass(frozen=True, slots=True)
class EstimateRun:
    """One memory estimate of a workload, with what it was computed from."""

    label: str
    micro_batch: int
    bindings: dict[str, int]
    analysis: GraphAnalysis
    result: MemoryEstimate
    resolved: ResolvedWorkload
    context_default: str = ""  # CUDA: what the CUDA context table's default assumed
    checkpoint_default: DefaultUsedRow | None = None  # precision from a checkpoint's dtype
    decoder_default: DefaultUsedRow | None = None  # an encoder-decoder's decoder length

    @property
    def attention(self) -> list[str]:
        """The attention implementations used, with why."""
        return [f"{impl.value}: {why}" for impl, why in self.analysis.attention_used]

    def defaults_used(self) -> list[DefaultUsedRow]:
        """The options the request left out and the values they got."""
        rows = [
            DefaultUsedRow(option=d.option, value=d.value, reason=d.reason)
            for d in self.resolved.defaults_used
        ]
        if self.checkpoint_default is not None:
            rows.append(self.checkpoint_default)
        if self.decoder_default is not None:
            rows.append(self.decoder_default)
        if self.resolved.attention is None and self.analysis.attention_used:
            value = ", ".join(impl.value for impl, _ in self.analysis.attention_used)
            why = "; ".join(why for _, why in self.analysis.attention_used)
            rows.append(DefaultUsedRow(option="attention", value=value, reason=why))
        if self.context_default and self.result.cuda is not None:
            rows.append(
                DefaultUsedRow(
                    option="cuda_context_bytes",
                    value=str(self.result.cuda.context_bytes),
                    reason=self.context_default,
                )
            )
        return rows


_CACHE: LruCache[tuple[Any, ...], EstimateRun] = LruCache(size=256, name="estimate_runs")
# A run keeps its graph analysis, so an entry's memory grows with the executed layers: measured
# ~13 MiB for the 90,001-layer model of benchmarks/webhook_throughput.py, whose decisions on the
# 44 catalog GPUs (one key each: the GPU's traits) took a served process to 880 MiB (200 MiB
# with 2 entries), over the deploy kit's 512 Mi. Runs of larger graphs are not kept: at this
# bound an entry is ~0.7 MiB, the full cache ~185 MiB; the largest seeded model (gpt-3-175b)
# executes 774.
CACHED_RUN_MAX_LAYERS = 5_000


def run_estimate(
    session: Session,
    spec: WorkloadInput,
    *,
    runtime: Runtime | None,
    hardware_runtime: Runtime | None,
    overhead: FrameworkOverhead,
    per_layer: bool = False,
    batch_size: int | None = None,
    gpu: GpuTraits | None = None,
) -> EstimateRun:
    """Estimate ``spec`` (optionally at another batch size) with its defaults resolved from the
    one default table: ``runtime`` is the request's (None: ``hardware_runtime``, else CUDA);
    ``gpu`` the GPU profile's traits (its compute capability decides precision and attention)."""
    return estimate_graph(
        model_graph(session, spec.model, spec.architecture),
        spec,
        runtime=runtime,
        hardware_runtime=hardware_runtime,
        overhead=overhead,
        per_layer=per_layer,
        batch_size=batch_size,
        gpu=gpu,
    )


def _declares(inputs: Sequence[Mapping[str, Any]], symbol: str) -> bool:
    """Whether an input's shape names ``symbol``."""
    return any(symbol in item.get("shape", ()) for item in inputs)


def check_decoder_length(inputs: Sequence[Mapping[str, Any]], spec: WorkloadInput) -> None:
    """A 422 naming ``decoder_sequence_length`` for a model with no ``decoder_seq`` dim (no
    decoder input: an encoder or a decoder-only model)."""
    if spec.decoder_sequence_length is None:
        return
    if not _declares(inputs, "decoder_seq"):
        raise InvalidInput(
            "decoder_sequence_length binds an encoder-decoder's decoder_seq dim; this model "
            "has no decoder input (no input shape names decoder_seq): use sequence_length",
            pointer="/decoder_sequence_length",
        )


def estimate_graph(
    graph: GraphSource,
    spec: WorkloadInput,
    *,
    runtime: Runtime | None,
    hardware_runtime: Runtime | None,
    overhead: FrameworkOverhead,
    per_layer: bool = False,
    batch_size: int | None = None,
    gpu: GpuTraits | None = None,
) -> EstimateRun:
    """:func:`run_estimate` of a graph already loaded (``model_graph``): no database needed, so
    it runs outside the database slots (app.api.compute)."""
    inputs, layers, defaults, label, graph_key, checkpoint = graph
    checkpoint_default: DefaultUsedRow | None = None
    if checkpoint is not None and spec.precision is None:  # the checkpoint's own dtype
        precision, why = checkpoint_precision(checkpoint.layout, checkpoint.torch_dtype)
        spec = spec.model_copy(update={"precision": precision})
        checkpoint_default = DefaultUsedRow(option="precision", value=precision.value, reason=why)
    cache_key = None
    if graph_key:  # stored models only: inline graphs are not worth hashing
        cache_key = (
            graph_key,
            spec.model_dump_json(),
            runtime,
            hardware_runtime,
            overhead,
            per_layer,
            batch_size,
            gpu,
        )
        cached = _CACHE.get(cache_key)
        if cached is not None:
            return cached
    check_engine(graph, spec)  # an engine's options this model refuses: 422 before estimating
    check_decoder_length(inputs, spec)
    workload = domain_workload(spec, runtime)
    try:
        resolved = resolve(
            workload,
            model_bindings=defaults,
            hardware_runtime=hardware_runtime,
            batch_size=batch_size,
            gpu=gpu,
        )
    except TrainingOptionError as exc:  # e.g. activation_offload on a CPU runtime
        raise InvalidInput(str(exc), pointer=f"/{exc.field}") from exc
    batch, micro = resolved.batch_size, resolved.micro_batch_size
    bindings = dict(resolved.bindings)
    decoder_default = None
    if "seq" in bindings and "decoder_seq" not in bindings and _declares(inputs, "decoder_seq"):
        decoder_default = DefaultUsedRow(
            option="decoder_sequence_length",
            value=str(bindings["seq"]),
            reason="the decoder as long as the input: decoder_seq follows seq",
        )
    analysis = analyze_graph(
        inputs, layers, bindings, training=spec.mode is Mode.TRAINING, resolved=resolved
    )
    request = MemoryRequest(
        mode=resolved.mode,
        precision=resolved.precision,
        optimizer=resolved.optimizer,
        optimizer_impl=resolved.optimizer_impl,
        checkpointing=resolved.checkpointing,
        runtime=resolved.runtime,
        parallelism=resolved.parallelism,
        accumulation_steps=max(1, batch // micro),
        kv_cache=resolved.kv_cache,
        fp32_grad_buffer=resolved.fp32_grad_buffer,
        overhead=overhead,
        attention=resolved.attention,
        logits=resolved.logits,
        lora=resolved.lora,
        training_options=resolved.training_options,
        checkpoint=None if checkpoint is None else checkpoint.layout,
    )
    try:
        check_tensor_parallel_heads(analysis, request.parallelism.tensor)
    except TensorParallelError as exc:  # vLLM refuses to start with it: nothing to estimate
        raise InvalidInput(str(exc), pointer="/parallelism/tensor") from exc
    try:
        if resolved.lora is not None and resolved.lora.qlora is not None:
            gpu_cc = resolved.gpu.compute_capability if resolved.gpu is not None else None
            check_qlora_device(resolved.lora.qlora, gpu_cc)
        result = estimate_memory(analysis, request, per_layer=per_layer)
    except LoraError as exc:  # the option the LoRA configuration names
        raise InvalidInput(str(exc), pointer=exc.pointer) from exc
    except TrainingOptionError as exc:  # the training option that contradicts another
        raise InvalidInput(str(exc), pointer=f"/{exc.field}") from exc
    except CheckpointError as exc:  # the option a pre-quantized checkpoint contradicts
        raise InvalidInput(str(exc), pointer=f"/{exc.field}") from exc
    except MemoryInputError as exc:
        raise InvalidInput(str(exc)) from exc
    if result.peak_bytes > MAX_REPORTED_BYTES:
        raise InvalidInput(
            f"the estimate ({result.peak_bytes:.3e} B) exceeds 2^63 bytes; reduce batch_size or "
            "sequence_length",
            pointer="/batch_size",
        )
    run = EstimateRun(
        label=label,
        micro_batch=micro,
        bindings=bindings,
        analysis=analysis,
        result=result,
        resolved=resolved,
        context_default=overhead.context_default,
        checkpoint_default=checkpoint_default,
        decoder_default=decoder_default,
    )
    if cache_key is not None and len(analysis.layers) <= CACHED_RUN_MAX_LAYERS:
        _CACHE.put(cache_key, run)
    return run


def required_of(
    run: EstimateRun, safety_margin_fraction: float, sources: Mapping[str, str] | None = None
) -> Requirement:
    """The one requirement computation (app.domain.fit) for an estimate run."""
    try:
        return requirement(
            run.result.peak_bytes,
            run.result.lines,
            safety_margin_fraction=safety_margin_fraction,
            sources=sources,
        )
    except FitInputError as exc:
        raise InvalidInput(str(exc), pointer="/safety_margin_fraction") from exc


def required_lines(required: Requirement) -> list[RequiredLine]:
    """A requirement's lines as the API shows them."""
    return [
        RequiredLine(key=line.key, bytes=line.bytes, detail=line.formula) for line in required.lines
    ]


def _mig_gpu_slugs(session: Session) -> list[str]:
    return HardwareRepository(session).mig_capable_slugs()


def mig_hardware(session: Session, slug: str) -> Hardware:
    """The hardware row of a MIG-capable GPU (404 naming the valid ones; 422 without MIG)."""
    row = HardwareRepository(session).get(slug)
    if row is None:
        raise NotFound(
            f"hardware profile '{slug}' does not exist; MIG-capable GPUs: "
            + ", ".join(_mig_gpu_slugs(session))
        )
    if row.mig_total_compute_slices is None:
        raise InvalidInput(
            f"'{slug}' does not support MIG; MIG-capable GPUs: "
            + ", ".join(_mig_gpu_slugs(session)),
            pointer="/gpu",
        )
    return row


def require_profile(geo: MigGeometry, name: str) -> MigProfileSpec:
    """The named profile, or a 404 listing the valid ones."""
    profile = geo.profile(name)
    if profile is None:
        raise NotFound(
            f"'{geo.gpu}' has no MIG profile '{name}'; valid profiles: "
            + ", ".join(p.name for p in geo.profiles)
        )
    return profile


GRAPH_FIELDS = ("layers", "inputs", "default_bindings")  # of an architecture


@contextmanager
def workload_pointers(
    prefix: str, *, stored: bool = False, inline_architecture: bool = False
) -> Iterator[None]:
    """Place the JSON pointers of 422s about a workload where the request holds it.

    The estimate pipeline points at a workload's own fields (``/batch_size``) and at a graph's
    (``/layers/3/op``); a request may nest the workload (``/workload`` in a MIG fit or an
    admission check, ``/workloads/2/workload`` in a plan, ``""`` at the top of a memory
    estimate or a recommendation) and holds an inline graph under ``architecture``; a stored
    model's graph is named by ``model`` (the detail says which layer). A stored workload
    (``stored``: a slug) is one field: its problems point at it. Pointers at the
    request's other fields (``/gpu``, ``/safety_margin_fraction``) are left as they are.
    """
    try:
        yield
    except InvalidInput as exc:
        pointer = exc.pointer or ""
        head = pointer.split("/")[1] if pointer.startswith("/") else ""
        about_workload = head in WorkloadInput.model_fields or head in GRAPH_FIELDS
        if stored and (about_workload or head == "workload"):
            exc.pointer = prefix or pointer
        elif head in GRAPH_FIELDS and inline_architecture:
            exc.pointer = f"{prefix}/architecture{pointer}"
        elif head in GRAPH_FIELDS:  # a stored model's graph: the request names it by slug
            exc.pointer = f"{prefix}/model"
        elif about_workload:
            exc.pointer = f"{prefix}{pointer}"
        raise


def spec_pointers(prefix: str, workload: WorkloadInput | str) -> AbstractContextManager[None]:
    """:func:`workload_pointers` for a request's workload (inline or a stored slug)."""
    if isinstance(workload, str):
        return workload_pointers(prefix, stored=True)
    return workload_pointers(prefix, inline_architecture=workload.architecture is not None)


def workload_spec(session: Session, workload: WorkloadInput | str) -> WorkloadInput:
    """An inline workload as is, or a stored one (by slug) as the estimate's inputs."""
    return workload if not isinstance(workload, str) else stored_spec(session, workload)


@dataclass(frozen=True, slots=True)
class Required:
    """A workload's requirement on a GPU (app.domain.fit) with the estimate it came from."""

    lines: list[RequiredLine]
    required_bytes: int
    run: EstimateRun
    requirement: Requirement
    # a workload with an engine: its fit on the whole GPU, whose requirement this is (the
    # usable memory is then what the GPU shows to CUDA, engine.visible_bytes)
    engine: EngineFit | None = None


def required_memory(
    session: Session,
    spec: WorkloadInput,
    row: Hardware,
    *,
    cuda_context_bytes: int | None,
    safety_margin_fraction: float,
    batch_size: int | None = None,
) -> Required:
    """Estimate (with the GPU profile's CUDA context and workspace, the context overridable)
    + safety margin, as named lines: the one requirement computation."""
    return required_memory_of(
        model_graph(session, spec.model, spec.architecture),
        spec,
        row,
        cuda_context_bytes=cuda_context_bytes,
        safety_margin_fraction=safety_margin_fraction,
        batch_size=batch_size,
    )


def required_memory_of(
    graph: GraphSource,
    spec: WorkloadInput,
    row: Hardware,
    *,
    cuda_context_bytes: int | None,
    safety_margin_fraction: float,
    batch_size: int | None = None,
) -> Required:
    """:func:`required_memory` of a graph already loaded (no database: app.api.compute)."""
    override = (
        None if cuda_context_bytes is None else OverheadSpec(cuda_context_bytes=cuda_context_bytes)
    )
    run = estimate_graph(
        graph,
        spec,
        runtime=None,
        hardware_runtime=Runtime.CUDA,
        overhead=hardware_overhead(row, override),
        batch_size=batch_size,
        gpu=hardware_gpu(row),
    )
    engine = engine_on(graph, spec, row)
    if engine is not None:  # the engine's start-up memory is the requirement
        required = engine.requirement
    else:
        required = required_of(run, safety_margin_fraction, overhead_sources(row, override))
    return Required(
        lines=required_lines(required),
        required_bytes=required.required_bytes,
        run=run,
        requirement=required,
        engine=engine,
    )


def engine_on(
    graph: GraphSource,
    spec: WorkloadInput,
    row: Hardware,
    profile: MigProfileSpec | None = None,
    *,
    sequences: int | None = None,
    max_model_len: int | None = None,
) -> EngineFit | None:
    """The workload's engine on a GPU (or one MIG ``profile`` of it), None without an engine
    (app.services.engine_fit: the requirement and the engine's verdict)."""
    choice = engine_choice(spec)
    if choice is None:
        return None
    return engine_fit(
        graph,
        choice,
        device_memory(row, profile),
        sequences=sequences,
        max_model_len=max_model_len,
    )


def estimates_work(
    graph: GraphSource, spec: WorkloadInput, estimates: int, pointer: str, field: str
) -> WorkEstimate:
    """The work of ``estimates`` memory estimates of ``spec`` on a loaded graph
    (app.domain.budget): the graph is reduced through ``pointer`` (``/architecture/layers``
    inline, ``/model`` stored), the number of estimates through ``field``."""
    size = graph_layers(graph[1])
    return estimate_work(
        size,
        WorkFactor(name="estimates", value=estimates, field=field),
        field=pointer,
        training=spec.mode is Mode.TRAINING,
        replayed=size.executed_layers <= MAX_REPLAYED_LAYERS,
    )


def graph_pointer(prefix: str, workload: WorkloadInput | str) -> str:
    """Where a request names a workload's graph (for budget problems)."""
    if isinstance(workload, str):
        return prefix or "/workload"
    if workload.architecture is not None:
        return f"{prefix}/architecture/layers"
    return f"{prefix}/model"


def workload_row(session: Session, slug: str) -> Workload:
    row = WorkloadRepository(session).get(slug)
    if row is None:
        raise NotFound(f"workload '{slug}' does not exist; GET /v1/workloads lists them")
    return row


def stored_spec(session: Session, slug: str) -> WorkloadInput:
    """The estimate inputs of a stored workload (404 unknown, 422 when not estimable)."""
    row = workload_row(session, slug)
    try:
        return to_spec(WorkloadBase.model_validate(workload_fields(row)))
    except ValidationError as exc:
        first = exc.errors(include_url=False, include_input=False)[0]
        where = ".".join(str(part) for part in first["loc"])
        raise InvalidInput(
            f"stored workload '{slug}' is not estimable: {where}: {first['msg']}",
            pointer="/workload",
        ) from exc
    except InvalidInput as exc:
        raise InvalidInput(
            f"stored workload '{slug}' is not estimable: {exc.detail}", pointer="/workload"
        ) from exc


def _hardware(session: Session, name: str | None) -> DeviceTarget | None:
    return None if name is None else device_target(session, name)


def estimate_response(
    session: Session, *, payload: MemoryEstimateRequest
) -> MemoryEstimateResponse:
    """Estimate the footprint of a stored or inline model."""
    return prepare_estimate_response(session, payload=payload)()


def prepare_estimate_response(
    session: Session, *, payload: MemoryEstimateRequest, limit_units: int | None = None
) -> Callable[[], MemoryEstimateResponse]:
    """Load what :func:`estimate_response` needs and return the computation (no database).

    With ``limit_units``, the work (the graph's executed layers, one estimate) is checked
    against it first (app.domain.budget: WorkBudgetExceeded)."""
    target = _hardware(session, payload.hardware)
    hardware = None if target is None else target.row
    graph = model_graph(session, payload.model, payload.architecture)
    if limit_units is not None:
        check_budget(
            estimates_work(graph, payload, 1, graph_pointer("", payload), "/batch_size"),
            limit_units,
            setting=BUDGET_SETTING,
        )
    runtime = hardware_runtime(hardware)
    overhead = hardware_overhead(hardware, payload.framework_overhead)
    gpu = None if target is None else target.gpu

    def compute() -> MemoryEstimateResponse:
        run = estimate_graph(
            graph,
            payload,
            runtime=payload.runtime,
            hardware_runtime=runtime,
            overhead=overhead,
            per_layer=payload.per_layer,
            gpu=gpu,
        )
        engine = None
        if target is not None:
            engine = engine_on(graph, payload, target.row, target.profile)
        return _response(run, payload, target, engine)

    return compute


def _response(
    run: EstimateRun,
    payload: MemoryEstimateRequest,
    target: DeviceTarget | None,
    engine: EngineFit | None = None,
) -> MemoryEstimateResponse:
    label, micro, bindings = run.label, run.micro_batch, run.bindings
    analysis, result = run.analysis, run.result
    assumptions = list(result.assumptions)
    fit = None
    engine_figures = None if engine is None else engine_read(engine)
    if engine is not None:
        assumptions.append(
            f"engine: {engine.engine} serves the model; its figures on {engine.device} "
            "(`engine`) decide the fit, not the breakdown above, which is the PyTorch forward "
            "at the workload's batch and sequence"
        )
    elif payload.engine is not None:
        assumptions.append(
            "engine: its start-up figures are per GPU; give `hardware` for them and its fit"
        )
    if target is not None and engine is not None:  # the engine's requirement, on what CUDA shows
        verdict = fit_verdict(engine.requirement, engine.visible_bytes)
        fit = FitSummary(
            hardware=target.name,
            memory_bytes=target.memory_bytes,
            usable_bytes=verdict.usable_bytes,
            required_bytes=verdict.required_bytes,
            required=required_lines(engine.requirement),
            safety_margin_fraction=engine.requirement.safety_margin_fraction,
            fits=verdict.fits,
            headroom_bytes=verdict.headroom_bytes,
            engine=engine_figures,
        )
    elif target is not None:
        required = required_of(
            run,
            payload.safety_margin_fraction,
            overhead_sources(target.row, payload.framework_overhead),
        )
        verdict = fit_verdict(required, target.memory_bytes)
        fit = FitSummary(
            hardware=target.name,
            memory_bytes=target.memory_bytes,
            usable_bytes=verdict.usable_bytes,
            required_bytes=verdict.required_bytes,
            required=required_lines(required),
            safety_margin_fraction=required.safety_margin_fraction,
            fits=verdict.fits,
            headroom_bytes=verdict.headroom_bytes,
        )
    layers = None
    if payload.per_layer:
        layers = [
            LayerRow(
                name=row.name,
                op=row.op,
                output_shape=list(row.output_shape),
                params=row.params,
                flops=row.flops,
                output_bytes=row.output_bytes,
                saved_bytes=row.saved_bytes,
                kept_for_backward=[
                    KeptTensorRow(
                        label=kept.label,
                        source=kept.source,
                        elements=kept.elements,
                        dtype=kept.dtype,
                        bytes=kept.bytes,
                    )
                    for kept in row.kept
                ],
            )
            for row in result.layers
        ]
    return MemoryEstimateResponse(
        model=label,
        mode=payload.mode,
        runtime=result.runtime,
        precision=run.resolved.precision,
        batch_size=payload.batch_size,
        micro_batch_size=micro,
        bindings=bindings,
        params=result.params,
        trainable_params=result.trainable_params,
        flops_per_forward=analysis.flops,
        breakdown=[
            BreakdownLine(
                key=line.key,
                bytes=line.bytes,
                gib=round(line.bytes / GIB, 3),
                formula=line.formula,
                assumptions=list(line.assumptions),
            )
            for line in result.lines
        ],
        peak_bytes=result.peak_bytes,
        peak_gib=round(result.peak_bytes / GIB, 3),
        peak_phase=result.peak_phase,
        phase_peaks=dict(result.phase_peaks),
        first_iteration_peak_bytes=result.first_iteration_peak_bytes,
        first_iteration_peak_phase=result.first_iteration_peak_phase,
        seed_rule_bytes=result.seed_rule_bytes,
        assumptions=assumptions,
        attention=run.attention,
        defaults_used=run.defaults_used(),
        cuda=None
        if result.cuda is None
        else CudaMemoryRead.model_validate(result.cuda, from_attributes=True),
        host_memory=[
            BreakdownLine(
                key=line.key,
                bytes=line.bytes,
                gib=round(line.bytes / GIB, 3),
                formula=line.formula,
                assumptions=list(line.assumptions),
            )
            for line in result.host_lines or ()
        ],
        fit=fit,
        engine=engine_figures,
        layers=layers,
    )
