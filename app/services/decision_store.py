"""Admission decisions of stored workloads, computed when the planning data is written.

A review of a pod that names a stored workload must not estimate anything: a burst of reviews
would queue behind the estimates, and an estimate that outlives its review's deadline keeps a
thread and a database slot. So the inputs of every verdict (the workload's requirement on a
GPU profile, the usable bytes of each resource it offers, the smallest MIG resource that
holds it: an ``app.domain.admission.Evaluation``) are computed when a workload, its model or a
hardware profile is written through the service, in the same transaction, and stored in
``admission_decision``. A review reads one row and applies the policy.

* **Fresh**: a row is used while the workload, model and hardware versions it was computed
  from are the rows' current versions, and it was computed by this code (``EVALUATOR``, a
  fingerprint of the modules the estimate depends on: a release with other rules keeps its
  own rows, so during a rolling upgrade each release reads what it computed).
* **Bounded at write time**: a write computes its pairs for at most ``WRITE_BUDGET_S`` (the
  estimate is cancelled cooperatively at that deadline, app.domain.budget); the pairs it did
  not finish are left missing for the refresher. Each pair has a work deadline of its own
  (``PAIR_BUDGET_S``): one that overruns it is stored as ``too_expensive`` (the review answers
  it by the failure policy, saying so), and so are the workload's other pairs (the estimate's
  cost does not depend on the GPU). An estimate whose work units (app.domain.budget) are over
  the default ``CAPPLAN_MAX_WORK_UNITS`` is stored as ``too_expensive`` without trying. The
  write is never refused for its cost.
* **Missing or stale rows** (written before this revision, by another release, by a write
  outside the service such as ``catalog-sync``, or left by a write's budget) are computed by
  the review within its own deadline, cancelled with its answer (app.services.admission), and
  stored by ``refresh_stale``, which the webhook's refresher runs in the background
  (app.api.routes.admission).
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

from pydantic import ValidationError
from sqlalchemy.orm import Session
from sqlalchemy.orm.exc import StaleDataError

from app.config import Settings
from app.db.models import AdmissionDecision, Hardware, ModelArchitecture, Workload, utcnow
from app.db.repositories import DecisionRepository, HardwareRepository, WorkloadRepository
from app.domain.admission import WHOLE_GPU, EngineOnResource, Evaluation
from app.domain.budget import CancelToken, WorkCancelled, WorkEstimate, bound
from app.domain.errors import DomainError
from app.domain.mig.layout import kubernetes_resource, smallest_fitting
from app.domain.workload import DEFAULT_SAFETY_MARGIN_FRACTION
from app.schemas.estimates import WorkloadInput
from app.schemas.workloads import WorkloadBase
from app.services.convert import GraphSource, geometry, model_graph, to_spec, workload_fields
from app.services.engine_fit import EngineFit
from app.services.errors import PreconditionFailed, ServiceError
from app.services.pipeline import Required, engine_on, estimates_work, required_memory

PAIR_BUDGET_S = 10.0  # past this deadline one (workload, hardware) evaluation is too expensive
# Checked before computing: an estimate over CAPPLAN_MAX_WORK_UNITS' default (the limit the API
# refuses one with) is too expensive without trying (app.domain.budget's units, ~0.5 us each).
MAX_WORK_UNITS: int = Settings.model_fields["max_work_units"].default
WRITE_BUDGET_S = 3.0  # a write computes for at most this long; the pairs left stay missing
SWEEP_BUDGET_S = 60.0  # the refresher's budget per batch
KEEP_OTHER_RELEASES = timedelta(days=7)  # other releases' rows outlive a rolling upgrade
ESTIMATED, TOO_EXPENSIVE, INVALID = "estimated", "too_expensive", "invalid"

_APP = Path(__file__).resolve().parent.parent
logger = logging.getLogger("app.admission")


def _fingerprint() -> str:
    """A digest of the code an evaluation depends on (the domain, the schemas' defaults, the
    estimate pipeline and this module): equal for every process of one release."""
    paths = sorted(
        [
            *(_APP / "domain").rglob("*"),
            *(_APP / "schemas").rglob("*.py"),
            *(
                _APP / "services" / name
                for name in (
                    "convert.py",
                    "pipeline.py",
                    "decision_store.py",
                    "engine_fit.py",
                    "engines.py",
                    "serving_geometry.py",
                )
            ),
        ]
    )
    digest = hashlib.sha256()
    for path in paths:
        if path.is_file() and "__pycache__" not in path.parts:
            digest.update(path.relative_to(_APP).as_posix().encode())
            digest.update(path.read_bytes())
    return digest.hexdigest()[:32]


EVALUATOR = _fingerprint()


def describe(label: str, spec: WorkloadInput, precision: str) -> str:
    """``chat inference bs 8 bf16``: how a verdict's message names the workload."""
    return f"{label} {spec.mode.value} bs {spec.batch_size} {precision}"


def evaluation_of(
    session: Session, *, spec: WorkloadInput, label: str, hardware: Hardware
) -> tuple[Evaluation, Required]:
    """Estimate ``spec`` on ``hardware`` (the one requirement computation, with the GPU's CUDA
    context and workspace and the default safety margin) and list what the GPU offers.
    Checks the bound cancel token (app.domain.budget) wherever the estimate does."""
    need = required_memory(
        session,
        spec,
        hardware,
        cuda_context_bytes=None,
        safety_margin_fraction=DEFAULT_SAFETY_MARGIN_FRACTION,
    )
    if spec.engine is not None:  # the engine's verdict per resource (closed form)
        graph = model_graph(session, spec.model, spec.architecture)
        return engine_evaluation(graph, spec, label=label, hardware=hardware), need
    resources = {WHOLE_GPU: hardware.memory_bytes}
    smallest = None
    if hardware.mig_total_compute_slices is not None:
        geo = geometry(hardware)
        resources.update({kubernetes_resource(p.name): p.memory_bytes for p in geo.profiles})
        fitting = smallest_fitting(geo, need.required_bytes)
        smallest = kubernetes_resource(fitting.name) if fitting else None
    evaluation = Evaluation(
        summary=describe(label, spec, need.run.resolved.precision.value),
        gpu=hardware.slug,
        required_bytes=need.required_bytes,
        smallest_fitting_resource=smallest,
        resources=resources,
    )
    return evaluation, need


def _on_resource(fit: EngineFit) -> EngineOnResource:
    return EngineOnResource(
        required_bytes=fit.requirement.required_bytes,
        usable_bytes=fit.visible_bytes,
        kv_tokens=fit.memory.kv_tokens,
        max_concurrency=fit.memory.max_concurrency,
        max_model_len=fit.resolved.max_model_len,
        reason=fit.reason,
    )


def engine_evaluation(
    graph: GraphSource, spec: WorkloadInput, *, label: str, hardware: Hardware
) -> Evaluation:
    """A workload with an engine on ``hardware``: the engine's requirement and figures on the
    whole GPU and on each MIG profile (closed form, no graph estimate: microseconds a
    resource), the smallest MIG resource where it fits (one slice: a group of several GPUs
    cannot be slices)."""
    whole = engine_on(graph, spec, hardware)
    assert whole is not None  # spec.engine is set
    engines = {WHOLE_GPU: _on_resource(whole)}
    resources = {WHOLE_GPU: whole.visible_bytes}
    gpus = whole.resolved.tensor_parallel_size * whole.resolved.pipeline_parallel_size
    smallest = None
    if hardware.mig_total_compute_slices is not None:
        fitting = []
        for profile in geometry(hardware).profiles:
            fit = engine_on(graph, spec, hardware, profile)
            assert fit is not None
            name = kubernetes_resource(profile.name)
            engines[name] = _on_resource(fit)
            resources[name] = fit.visible_bytes
            if fit.fits and gpus == 1:
                fitting.append(profile)
        if fitting:  # the order of app.domain.mig.layout.smallest_fitting
            best = min(
                fitting, key=lambda p: (p.compute_slices, p.memory_mib, p.memory_slices, p.name)
            )
            smallest = kubernetes_resource(best.name)
    return Evaluation(
        summary=f"{label} on {whole.engine} (tp {whole.resolved.tensor_parallel_size}, pp "
        f"{whole.resolved.pipeline_parallel_size}, max_model_len "
        f"{whole.resolved.max_model_len:,})",
        gpu=hardware.slug,
        required_bytes=whole.requirement.required_bytes,
        smallest_fitting_resource=smallest,
        resources=resources,
        engine=engines,
        engine_name=whole.engine,
        engine_gpus=gpus,
    )


def engine_json(evaluation: Evaluation) -> dict[str, Any] | None:
    """An evaluation's engine part as the decision row stores it (None: no engine)."""
    if evaluation.engine is None:
        return None
    return {
        "name": evaluation.engine_name,
        "gpus": evaluation.engine_gpus,
        "resources": {
            name: {
                "required_bytes": entry.required_bytes,
                "usable_bytes": entry.usable_bytes,
                "kv_tokens": entry.kv_tokens,
                "max_concurrency": entry.max_concurrency,
                "max_model_len": entry.max_model_len,
                "reason": entry.reason,
            }
            for name, entry in evaluation.engine.items()
        },
    }


def stored_evaluation(decision: AdmissionDecision, gpu: str) -> Evaluation:
    """The evaluation a stored ``estimated`` decision holds."""
    engine = decision.engine
    return Evaluation(
        summary=decision.summary,
        gpu=gpu,
        required_bytes=decision.required_bytes or 0,
        smallest_fitting_resource=decision.smallest_fitting_resource,
        resources=decision.resources,
        engine=None
        if engine is None
        else {name: EngineOnResource(**entry) for name, entry in engine["resources"].items()},
        engine_name="" if engine is None else engine["name"],
        engine_gpus=1 if engine is None else engine["gpus"],
    )


def spec_of(row: Workload) -> WorkloadInput:
    """A stored workload's estimate inputs (``ServiceError`` when they are not valid)."""
    try:
        return to_spec(WorkloadBase.model_validate(workload_fields(row)))
    except ValidationError as exc:
        first = exc.errors(include_url=False, include_input=False)[0]
        where = ".".join(str(part) for part in first["loc"])
        raise ServiceError(
            f"stored workload '{row.slug}' is not estimable: {where}: {first['msg']}"
        ) from exc
    except ServiceError as exc:
        raise ServiceError(f"stored workload '{row.slug}' is not estimable: {exc.detail}") from exc


@dataclass(slots=True)
class _Outcome:
    outcome: str
    summary: str
    detail: str | None = None
    evaluation: Evaluation | None = None


def _evaluate_pair(
    session: Session, workload: Workload, spec: WorkloadInput, hardware: Hardware, until: float
) -> _Outcome | None:
    """One pair's outcome; None when the caller's budget (``until``, monotonic) ran out first
    (the pair stays missing: it is not too expensive, the write had no time left)."""
    own_deadline = time.monotonic() + PAIR_BUDGET_S
    token = CancelToken(min(own_deadline, until), PAIR_BUDGET_S)
    try:
        with bound(token):
            evaluation, _ = evaluation_of(
                session, spec=spec, label=workload.slug, hardware=hardware
            )
    except WorkCancelled:
        return _too_expensive(workload, spec) if own_deadline <= until else None
    except (ServiceError, DomainError) as exc:
        detail = exc.detail if isinstance(exc, ServiceError) else str(exc)
        return _Outcome(INVALID, describe(workload.slug, spec, _precision(spec)), detail)
    except Exception:  # a bug must not fail the write: the review answers it by the policy
        logger.exception("evaluating %s on %s failed", workload.slug, hardware.slug)
        detail = f"internal error evaluating '{workload.slug}' on '{hardware.slug}'; see its logs"
        return _Outcome(INVALID, describe(workload.slug, spec, _precision(spec)), detail)
    return _Outcome(ESTIMATED, evaluation.summary, evaluation=evaluation)


def _precision(spec: WorkloadInput) -> str:
    return spec.precision.value if spec.precision is not None else "default precision"


def _too_expensive(workload: Workload, spec: WorkloadInput, why: str | None = None) -> _Outcome:
    why = why or f"its memory estimate did not finish within {PAIR_BUDGET_S:g} s of work"
    return _Outcome(
        TOO_EXPENSIVE,
        describe(workload.slug, spec, _precision(spec)),
        f"workload '{workload.slug}' is too expensive to evaluate: {why}; use a smaller model "
        "graph",
    )


def work_of(session: Session, spec: WorkloadInput) -> WorkEstimate:
    """The work units of one memory estimate of ``spec`` (app.domain.budget), before any."""
    graph = model_graph(session, spec.model, spec.architecture)
    return estimates_work(graph, spec, 1, "/model", "/batch_size")


def over_budget(session: Session, spec: WorkloadInput) -> str | None:
    """Why ``spec`` is over the write-time work budget (``MAX_WORK_UNITS``), or None."""
    work = work_of(session, spec)
    if work.units <= MAX_WORK_UNITS:
        return None
    return f"{work.units:,} work units ({work.describe()}) are over {MAX_WORK_UNITS:,}"


def _row(workload: Workload, hardware: Hardware, result: _Outcome) -> dict[str, Any]:
    evaluation = result.evaluation
    return {
        "workload_id": workload.id,
        "hardware_id": hardware.id,
        "evaluator": EVALUATOR,
        "workload_version": workload.version,
        "model_version": workload.model.version,
        "hardware_version": hardware.version,
        "outcome": result.outcome,
        "detail": result.detail,
        "summary": result.summary[:300],
        "required_bytes": evaluation.required_bytes if evaluation else None,
        "smallest_fitting_resource": evaluation.smallest_fitting_resource if evaluation else None,
        "resources": dict(evaluation.resources) if evaluation else {},
        "engine": engine_json(evaluation) if evaluation else None,
        "computed_at": utcnow(),
    }


def refresh_pairs(
    session: Session,
    pairs: Iterable[tuple[Workload, Hardware]],
    *,
    budget_s: float = WRITE_BUDGET_S,
) -> int:
    """Compute and write (no commit) the decisions of ``pairs`` (rows flushed at their current
    versions); stops starting new ones after ``budget_s``. Returns how many were stored."""
    started = time.monotonic()
    rows: list[dict[str, Any]] = []
    specs: dict[int, WorkloadInput | ServiceError] = {}
    expensive: dict[int, str | None] = {}  # workload id -> why (None: its deadline)
    for workload, hardware in pairs:
        if time.monotonic() - started > budget_s:
            break
        spec = specs.get(workload.id)
        if spec is None:
            try:
                spec = specs[workload.id] = spec_of(workload)
            except ServiceError as exc:
                spec = specs[workload.id] = exc
        if isinstance(spec, ServiceError):
            result = _Outcome(INVALID, workload.slug, spec.detail)
        elif workload.id in expensive:
            result = _too_expensive(workload, spec, expensive[workload.id])
        elif (why := _over_budget_or_none(session, spec)) is not None:
            expensive[workload.id] = why
            result = _too_expensive(workload, spec, why)
        else:
            evaluated = _evaluate_pair(session, workload, spec, hardware, started + budget_s)
            if evaluated is None:
                break  # out of budget: the rest stay missing (the refresher computes them)
            result = evaluated
            if result.outcome == TOO_EXPENSIVE:
                expensive[workload.id] = None
        rows.append(_row(workload, hardware, result))
    DecisionRepository(session).upsert(rows)
    return len(rows)


def _over_budget_or_none(session: Session, spec: WorkloadInput) -> str | None:
    try:
        return over_budget(session, spec)
    except ServiceError:  # an unknown model: the evaluation reports it
        return None


def flush_versioned(session: Session, *, what: str) -> None:
    """Flush a write so that its rows have their new versions (the decisions record them); a
    concurrent writer detected by the version column becomes a 412, as at commit."""
    try:
        session.flush()
    except StaleDataError as exc:
        session.rollback()
        raise PreconditionFailed(f"{what} was changed by another client; GET it again") from exc


def refresh_workload(session: Session, row: Workload) -> int:
    """A written workload's decisions on every hardware profile (call after a flush)."""
    return refresh_pairs(
        session, ((row, hardware) for hardware in HardwareRepository(session).all_by_id())
    )


def refresh_hardware(session: Session, row: Hardware) -> int:
    """Every workload's decision on a written hardware profile (call after a flush)."""
    workloads = WorkloadRepository(session).all_by_id()
    return refresh_pairs(session, ((workload, row) for workload in workloads))


def refresh_model(session: Session, row: ModelArchitecture) -> int:
    """The decisions of the workloads of a written model on every profile (after a flush)."""
    workloads = WorkloadRepository(session).of_model(row.id)
    if not workloads:
        return 0
    hardware = HardwareRepository(session).all_by_id()
    return refresh_pairs(session, ((w, h) for w in workloads for h in hardware))


def prune_other_releases(session: Session) -> int:
    """Delete and commit the decisions other releases computed more than
    ``KEEP_OTHER_RELEASES`` ago (a rolling upgrade or rollback is long over)."""
    pruned = DecisionRepository(session).prune(
        EVALUATOR, computed_before=utcnow() - KEEP_OTHER_RELEASES
    )
    session.commit()
    return pruned


def refresh_stale(session: Session, *, limit: int = 200, budget_s: float = SWEEP_BUDGET_S) -> int:
    """Compute, store and commit up to ``limit`` missing or stale decisions (the refresher's
    sweep); returns how many were stored (0: every decision is fresh)."""
    ids = DecisionRepository(session).stale_pairs(EVALUATOR, limit=limit)
    if not ids:
        return 0
    workloads = WorkloadRepository(session).by_ids(w for w, _ in ids)
    hardware = HardwareRepository(session).by_ids(h for _, h in ids)
    pairs = [(workloads[w], hardware[h]) for w, h in ids if w in workloads and h in hardware]
    stored = refresh_pairs(session, pairs, budget_s=budget_s)
    session.commit()
    return stored
