"""Memory estimate and model summary use cases."""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from sqlalchemy.orm import Session

from app.charts import breakdown_svg
from app.db.models import Hardware
from app.db.repositories import HardwareRepository, ModelRepository
from app.domain.errors import GraphError
from app.domain.fit import FitInputError, Requirement, requirement
from app.domain.fit import fit as fit_verdict
from app.domain.graph.analysis import GraphAnalysis, InputDecl, LayerAnalysis, analyze
from app.domain.graph.ops import TensorKind
from app.domain.hardware import FrameworkOverhead
from app.domain.memory.estimate import (
    MemoryEstimate,
    MemoryInputError,
    MemoryRequest,
    estimate_memory,
    precision_plan,
)
from app.domain.precision import Precision
from app.domain.units import GIB
from app.domain.workload import (
    Logits,
    Mode,
    Parallelism,
    ResolvedWorkload,
    Runtime,
    WorkloadInputError,
    resolve,
)
from app.domain.workload import WorkloadSpec as DomainWorkloadSpec
from app.schemas.estimates import (
    BreakdownLine,
    DefaultUsedRow,
    FitSummary,
    InlineArchitecture,
    KeptTensorRow,
    LayerRow,
    MemoryEstimateRequest,
    MemoryEstimateResponse,
    ModelSummary,
    ModelSummaryRow,
    OverheadSpec,
    RequiredLine,
    WorkloadSpec,
)
from app.services.errors import InvalidInput, NotFound
from app.services.models import invalid_graph

MAX_REPORTED_BYTES = 2**63 - 1


def _decls(inputs: Sequence[Mapping[str, Any]]) -> list[InputDecl]:
    return [
        InputDecl(
            name=spec["name"],
            shape=tuple(spec["shape"]),
            kind=TensorKind.INDEX if spec.get("dtype") == "int64" else TensorKind.FLOAT,
        )
        for spec in inputs
    ]


def bind_dims(
    defaults: Mapping[str, int],
    extra: Mapping[str, int],
    *,
    batch: int,
    sequence_length: int | None,
    image_size: int | None,
) -> dict[str, int]:
    """Symbol bindings: the model's defaults, the request's, then batch, seq and image."""
    bound = {**defaults, **extra, "batch": batch}
    if sequence_length is not None:
        bound["seq"] = sequence_length
    if image_size is not None:
        bound["image"] = image_size
    return dict(sorted(bound.items()))


def analyze_graph(
    inputs: Sequence[Mapping[str, Any]],
    layers: Sequence[Mapping[str, Any]],
    bindings: Mapping[str, int],
    *,
    training: bool,
    resolved: ResolvedWorkload | None = None,
    logits: Logits = Logits.ALL,
) -> GraphAnalysis:
    """Analyse a stored or inline graph; an invalid graph is a 422 naming layer and field."""
    options: dict[str, Any] = {"logits": logits}
    if resolved is not None:
        options = {
            "attention": resolved.attention,
            "runtime": resolved.runtime,
            "precision": resolved.precision,
            "logits": resolved.logits,
        }
    try:
        return analyze(_decls(inputs), layers, bindings, training=training, **options)
    except GraphError as exc:
        raise invalid_graph(exc) from exc


def _hardware(session: Session, slug: str | None) -> Hardware | None:
    if slug is None:
        return None
    row = HardwareRepository(session).get(slug)
    if row is None:
        raise NotFound(f"hardware profile '{slug}' does not exist; GET /v1/hardware lists them")
    return row


def hardware_overhead(
    hardware: Hardware | None, override: OverheadSpec | None = None
) -> FrameworkOverhead:
    """The framework overhead defaults of a hardware profile, with request overrides."""
    values: dict[str, Any] = {}
    if hardware is not None and hardware.framework_overhead:
        values.update(hardware.framework_overhead)
    if override is not None:
        values.update(override.model_dump(exclude_none=True))
    return FrameworkOverhead(**values)


def hardware_runtime(hardware: Hardware | None) -> Runtime | None:
    """The runtime a hardware profile implies (None without one)."""
    if hardware is None:
        return None
    return Runtime.CPU if hardware.kind == "cpu" else Runtime.CUDA


@dataclass(frozen=True, slots=True)
class EstimateRun:
    """One memory estimate of a workload, with what it was computed from."""

    label: str
    micro_batch: int
    bindings: dict[str, int]
    analysis: GraphAnalysis
    result: MemoryEstimate
    resolved: ResolvedWorkload

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
        if self.resolved.attention is None and self.analysis.attention_used:
            value = ", ".join(impl.value for impl, _ in self.analysis.attention_used)
            why = "; ".join(why for _, why in self.analysis.attention_used)
            rows.append(DefaultUsedRow(option="attention", value=value, reason=why))
        return rows


# inputs, layers, default bindings, label, and a key that changes whenever the graph does
GraphSource = tuple[list[Any], list[Any], dict[str, int], str, str]


def model_graph(
    session: Session, model: str | None, architecture: InlineArchitecture | None
) -> GraphSource:
    """A stored model (by slug; 404 when unknown) or an inline architecture as a graph."""
    if model is not None:
        row = ModelRepository(session).get(model)
        if row is None:
            raise NotFound(f"model '{model}' does not exist; GET /v1/models lists them")
        # id + version + update time: a row deleted and re-created under the same slug differs
        key = f"{row.slug}:{row.id}:{row.version}:{row.updated_at.isoformat()}"
        return row.inputs, row.layers, row.default_bindings, row.slug, key
    assert architecture is not None  # enforced by the schemas
    inputs = [item.model_dump() for item in architecture.inputs]
    return inputs, architecture.layers, dict(architecture.default_bindings), "inline", ""


K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class LruCache(Generic[K, V]):
    """A small thread-safe LRU for pure functions of their key."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._items: OrderedDict[K, V] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: K) -> V | None:
        """The value for ``key``, or None (and mark it recently used)."""
        with self._lock:
            value = self._items.get(key)
            if value is not None:
                self._items.move_to_end(key)
            return value

    def put(self, key: K, value: V) -> None:
        """Store ``value``, evicting the least recently used beyond ``size``."""
        with self._lock:
            self._items[key] = value
            self._items.move_to_end(key)
            while len(self._items) > self.size:
                self._items.popitem(last=False)

    def clear(self) -> None:
        """Forget everything (benchmarks time cold requests)."""
        with self._lock:
            self._items.clear()

    def __len__(self) -> int:
        return len(self._items)


_CACHE: LruCache[tuple[Any, ...], EstimateRun] = LruCache(size=256)


def domain_workload(spec: WorkloadSpec, runtime: Runtime | None = None) -> DomainWorkloadSpec:
    """The API's workload as the domain's (None options stay None: the default table decides)."""
    par = spec.parallelism
    try:
        return DomainWorkloadSpec(
            mode=spec.mode,
            batch_size=spec.batch_size,
            micro_batch_size=spec.micro_batch_size,
            sequence_length=spec.sequence_length,
            image_size=spec.image_size,
            bindings=dict(spec.bindings),
            precision=spec.precision,
            optimizer=spec.optimizer,
            optimizer_impl=spec.optimizer_impl,
            checkpointing=spec.checkpointing,
            parallelism=Parallelism(
                data=par.data, tensor=par.tensor, pipeline=par.pipeline, zero_stage=par.zero_stage
            ),
            fp32_grad_buffer=spec.fp32_grad_buffer,
            kv_cache=spec.kv_cache,
            attention=spec.attention,
            logits=spec.logits,
            runtime=runtime,
        )
    except WorkloadInputError as exc:
        raise InvalidInput(str(exc)) from exc


def run_estimate(
    session: Session,
    spec: WorkloadSpec,
    *,
    runtime: Runtime | None,
    hardware_runtime: Runtime | None,
    overhead: FrameworkOverhead,
    per_layer: bool = False,
    batch_size: int | None = None,
) -> EstimateRun:
    """Estimate ``spec`` (optionally at another batch size) with its defaults resolved from the
    one default table: ``runtime`` is the request's (None: ``hardware_runtime``, else CUDA)."""
    inputs, layers, defaults, label, graph_key = model_graph(session, spec.model, spec.architecture)
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
        )
        cached = _CACHE.get(cache_key)
        if cached is not None:
            return cached
    resolved = resolve(
        domain_workload(spec, runtime),
        model_bindings=defaults,
        hardware_runtime=hardware_runtime,
        batch_size=batch_size,
    )
    batch, micro = resolved.batch_size, resolved.micro_batch_size
    bindings = dict(resolved.bindings)
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
        kv_cache=True if resolved.kv_cache is None else resolved.kv_cache,
        fp32_grad_buffer=resolved.fp32_grad_buffer,
        overhead=overhead,
    )
    try:
        result = estimate_memory(analysis, request, per_layer=per_layer)
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
    )
    if cache_key is not None:
        _CACHE.put(cache_key, run)
    return run


def estimate(session: Session, *, payload: MemoryEstimateRequest) -> MemoryEstimateResponse:
    """Estimate the footprint of a stored or inline model."""
    hardware = _hardware(session, payload.hardware)
    run = run_estimate(
        session,
        payload,
        runtime=payload.runtime,
        hardware_runtime=hardware_runtime(hardware),
        overhead=hardware_overhead(hardware, payload.framework_overhead),
        per_layer=payload.per_layer,
    )
    return _response(run, payload, hardware)


def overhead_sources(
    hardware: Hardware | None, override: OverheadSpec | None = None
) -> dict[str, str]:
    """Where the CUDA context and workspace figures come from: the request, the hardware
    profile or the default."""
    profile = (hardware.framework_overhead or {}) if hardware is not None else {}
    given = override.model_dump(exclude_none=True) if override is not None else {}
    sources = {}
    for key, field_name, default in (
        ("cuda_context", "cuda_context_bytes", "default, PyTorch with lazy module loading"),
        ("workspace", "workspace_bytes", "default cuBLAS/cuDNN workspace"),
    ):
        if field_name in given:
            sources[key] = "request override"
        elif hardware is not None and field_name in profile:
            sources[key] = f"hardware profile '{hardware.slug}'"
        else:
            sources[key] = default
    return sources


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


def _response(
    run: EstimateRun, payload: MemoryEstimateRequest, hardware: Hardware | None
) -> MemoryEstimateResponse:
    label, micro, bindings = run.label, run.micro_batch, run.bindings
    analysis, result = run.analysis, run.result
    fit = None
    if hardware is not None:
        required = required_of(
            run,
            payload.safety_margin_fraction,
            overhead_sources(hardware, payload.framework_overhead),
        )
        verdict = fit_verdict(required, hardware.memory_bytes)
        fit = FitSummary(
            hardware=hardware.slug,
            memory_bytes=hardware.memory_bytes,
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
        assumptions=list(result.assumptions),
        attention=run.attention,
        defaults_used=run.defaults_used(),
        fit=fit,
        layers=layers,
    )


def summarize(
    session: Session,
    *,
    slug: str,
    batch_size: int,
    sequence_length: int | None,
    image_size: int | None,
    precision: Precision,
) -> ModelSummary:
    """Per-layer table of a stored model (inference shapes)."""
    row = ModelRepository(session).get(slug)
    if row is None:
        raise NotFound(f"model '{slug}' does not exist; GET /v1/models lists them")
    bindings = bind_dims(
        row.default_bindings,
        {},
        batch=batch_size,
        sequence_length=sequence_length,
        image_size=image_size,
    )
    analysis = analyze_graph(row.inputs, row.layers, bindings, training=False)
    act = precision_plan(precision).activation

    def size(layer: LayerAnalysis) -> int:
        return layer.output_numel * (8 if layer.output_kind is TensorKind.INDEX else act)

    rows = [
        ModelSummaryRow(
            name=layer.name,
            op=layer.op,
            output_shape=list(layer.output_shape),
            params=layer.params,
            flops=layer.flops,
            activation_elements=layer.output_numel,
            activation_bytes=size(layer),
            allocates=layer.allocates_output,
        )
        for layer in analysis.layers
    ]
    return ModelSummary(
        model=slug,
        bindings=bindings,
        precision=precision,
        layers=rows,
        total_params=analysis.params,
        total_flops=analysis.flops,
        total_activation_bytes=sum(r.activation_bytes for r in rows if r.allocates),
        layer_count=len(rows),
    )


def memory_chart(session: Session, *, payload: MemoryEstimateRequest) -> str:
    """The estimate's breakdown as an SVG bar chart in GiB (with the device's memory)."""
    result = estimate(session, payload=payload)
    fit = result.fit
    return breakdown_svg(
        title=f"Memory: {result.model}, {result.mode.value}, batch {result.batch_size}, "
        f"{result.precision.value}",
        subtitle=f"peak {result.peak_gib:.3f} GiB in {result.peak_phase} ({result.runtime.value}); "
        "POST /v1/estimates/memory for formulas and assumptions",
        lines=[(line.key, line.bytes) for line in result.breakdown],
        total_bytes=result.peak_bytes,
        capacity_bytes=None if fit is None else fit.memory_bytes,
        capacity_label="" if fit is None else fit.hardware,
    )
