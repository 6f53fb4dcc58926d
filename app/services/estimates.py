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
from app.domain.workload import Mode, Parallelism, Runtime
from app.schemas.estimates import (
    BreakdownLine,
    FitSummary,
    InlineArchitecture,
    KeptTensorRow,
    LayerRow,
    MemoryEstimateRequest,
    MemoryEstimateResponse,
    ModelSummary,
    ModelSummaryRow,
    OverheadSpec,
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
) -> GraphAnalysis:
    """Analyse a stored or inline graph; an invalid graph is a 422 naming layer and field."""
    try:
        return analyze(_decls(inputs), layers, bindings, training=training)
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


def _runtime(payload: MemoryEstimateRequest, hardware: Hardware | None) -> Runtime:
    if payload.runtime is not None:
        return payload.runtime
    if hardware is not None and hardware.kind == "cpu":
        return Runtime.CPU
    return Runtime.CUDA


@dataclass(frozen=True, slots=True)
class EstimateRun:
    """One memory estimate of a workload, with what it was computed from."""

    label: str
    micro_batch: int
    bindings: dict[str, int]
    analysis: GraphAnalysis
    result: MemoryEstimate


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


def run_estimate(
    session: Session,
    spec: WorkloadSpec,
    *,
    runtime: Runtime,
    overhead: FrameworkOverhead,
    per_layer: bool = False,
    batch_size: int | None = None,
) -> EstimateRun:
    """Estimate ``spec`` (optionally at another batch size) for a runtime and its overheads."""
    inputs, layers, defaults, label, graph_key = model_graph(session, spec.model, spec.architecture)
    cache_key = None
    if graph_key:  # stored models only: inline graphs are not worth hashing
        cache_key = (graph_key, spec.model_dump_json(), runtime, overhead, per_layer, batch_size)
        cached = _CACHE.get(cache_key)
        if cached is not None:
            return cached
    batch = batch_size or spec.batch_size
    micro = min(spec.micro_batch_size or batch, batch)
    bindings = bind_dims(
        defaults,
        spec.bindings,
        batch=micro,
        sequence_length=spec.sequence_length,
        image_size=spec.image_size,
    )
    analysis = analyze_graph(inputs, layers, bindings, training=spec.mode is Mode.TRAINING)
    par = spec.parallelism
    request = MemoryRequest(
        mode=spec.mode,
        precision=spec.precision,
        optimizer=spec.optimizer,
        optimizer_impl=spec.optimizer_impl,
        checkpointing=spec.checkpointing,
        runtime=runtime,
        parallelism=Parallelism(
            data=par.data, tensor=par.tensor, pipeline=par.pipeline, zero_stage=par.zero_stage
        ),
        accumulation_steps=max(1, batch // micro),
        kv_cache=spec.kv_cache,
        fp32_grad_buffer=spec.fp32_grad_buffer,
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
        label=label, micro_batch=micro, bindings=bindings, analysis=analysis, result=result
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
        runtime=_runtime(payload, hardware),
        overhead=hardware_overhead(hardware, payload.framework_overhead),
        per_layer=payload.per_layer,
    )
    return _response(
        run.label, payload, run.micro_batch, run.bindings, run.analysis, run.result, hardware
    )


def _response(
    label: str,
    payload: MemoryEstimateRequest,
    micro: int,
    bindings: dict[str, int],
    analysis: GraphAnalysis,
    result: MemoryEstimate,
    hardware: Hardware | None,
) -> MemoryEstimateResponse:
    fit = None
    if hardware is not None:
        fit = FitSummary(
            hardware=hardware.slug,
            memory_bytes=hardware.memory_bytes,
            fits=result.peak_bytes <= hardware.memory_bytes,
            headroom_bytes=hardware.memory_bytes - result.peak_bytes,
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
        precision=payload.precision,
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
