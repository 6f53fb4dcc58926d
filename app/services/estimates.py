"""Memory estimate and model summary use cases."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from sqlalchemy.orm import Session

from app.charts import ChartFit, binding_phrases, breakdown_svg
from app.db.repositories import ModelRepository
from app.domain.graph.analysis import LayerAnalysis
from app.domain.graph.ops import TensorKind
from app.domain.memory.estimate import (
    precision_plan,
)
from app.domain.precision import Precision
from app.schemas.estimates import (
    MemoryEstimateRequest,
    MemoryEstimateResponse,
    ModelSummary,
    ModelSummaryRow,
)
from app.services.convert import (
    bind_dims,
)
from app.services.errors import (
    NotFound,
)
from app.services.pipeline import (
    analyze_graph,
    prepare_estimate_response,
    spec_pointers,
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
    return prepare_summary(
        session,
        slug=slug,
        batch_size=batch_size,
        sequence_length=sequence_length,
        image_size=image_size,
        precision=precision,
    )()


def prepare_summary(
    session: Session,
    *,
    slug: str,
    batch_size: int,
    sequence_length: int | None,
    image_size: int | None,
    precision: Precision,
) -> Callable[[], ModelSummary]:
    """Load the model for :func:`summarize`; the returned function analyses its graph and builds
    the table without the database (app.api.compute). One analysis of a stored graph, which the
    model's own limits bound (at most 100,000 executed layers: ~0.5 s), so no work budget."""
    row = ModelRepository(session).get(slug)
    if row is None:
        raise NotFound(f"model '{slug}' does not exist; GET /v1/models lists them")
    inputs, layers, defaults = row.inputs, row.layers, row.default_bindings
    return lambda: _summary(
        slug, inputs, layers, defaults, batch_size, sequence_length, image_size, precision
    )


def _summary(
    slug: str,
    inputs: list[dict[str, Any]],
    layers: list[dict[str, Any]],
    defaults: dict[str, int],
    batch_size: int,
    sequence_length: int | None,
    image_size: int | None,
    precision: Precision,
) -> ModelSummary:
    bindings = bind_dims(
        defaults,
        {},
        batch=batch_size,
        sequence_length=sequence_length,
        image_size=image_size,
    )
    analysis = analyze_graph(inputs, layers, bindings, training=False)
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
    return prepare_memory_chart(session, payload=payload)()


def prepare_memory_chart(
    session: Session, *, payload: MemoryEstimateRequest, limit_units: int | None = None
) -> Callable[[], str]:
    """Load what :func:`memory_chart` needs; the returned function draws it (no database)."""
    estimate_of = prepare_estimate(session, payload=payload, limit_units=limit_units)
    return lambda: _chart(estimate_of())


def _chart(result: MemoryEstimateResponse) -> str:
    fit = result.fit
    batch = f"batch {result.batch_size}"
    if result.micro_batch_size != result.batch_size:
        batch += f" (micro-batch {result.micro_batch_size})"
    bound = [result.model, result.mode.value, batch, *binding_phrases(result.bindings)]
    return breakdown_svg(
        title=f"Memory: {', '.join([*bound, result.precision.value])}",
        subtitle=f"peak {result.peak_gib:.3f} GiB in {result.peak_phase} ({result.runtime.value}); "
        "POST /v1/estimates/memory for formulas and assumptions",
        lines=[(line.key, line.bytes) for line in result.breakdown],
        total_bytes=result.peak_bytes,
        fit=None
        if fit is None
        else ChartFit(
            device=fit.hardware,
            required_bytes=fit.required_bytes,
            usable_bytes=fit.usable_bytes,
            fits=fit.fits,
            safety_margin_fraction=fit.safety_margin_fraction,
        ),
    )


def estimate(session: Session, *, payload: MemoryEstimateRequest) -> MemoryEstimateResponse:
    """Estimate the footprint of a stored or inline model (and its fit on `hardware`)."""
    return prepare_estimate(session, payload=payload)()


def prepare_estimate(
    session: Session, *, payload: MemoryEstimateRequest, limit_units: int | None = None
) -> Callable[[], MemoryEstimateResponse]:
    """Load what :func:`estimate` needs (and check the work budget, ``limit_units``); the
    returned function computes the estimate without the database (app.api.compute)."""
    with spec_pointers("", payload):
        compute = prepare_estimate_response(session, payload=payload, limit_units=limit_units)

    def run() -> MemoryEstimateResponse:
        with spec_pointers("", payload):
            return compute()

    return run
