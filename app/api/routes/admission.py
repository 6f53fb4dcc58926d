"""/v1/admission: Kubernetes admission webhook and the simple check form."""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from typing import Annotated, Any

import anyio
from fastapi import APIRouter, Body, Depends, Request, Response

from app.api import examples
from app.api.compute import ComputeOverrun
from app.api.database import Database, DatabaseUnavailable
from app.api.decision_refresher import refresher_for
from app.api.deps import DatabaseDep, get_database, require_reader
from app.api.errors import COMPUTE_EXAMPLES, problem_responses
from app.api.metrics import Metrics
from app.config import Settings
from app.domain.admission import PodSpecError
from app.domain.budget import WorkCancelled
from app.schemas.admission import (
    AdmissionCheckRequest,
    AdmissionCheckResponse,
    AdmissionReviewAnswer,
)
from app.services import admission as service
from app.services.errors import ServiceError
from app.services.state_cache import (
    Generation,
    StateWatch,
    read_digest,
    staleness_of,
    watch_for,
)

logger = logging.getLogger("app.admission")
router = APIRouter(
    prefix="/v1/admission", tags=["admission"], dependencies=[Depends(require_reader)]
)

REVIEW_EXAMPLE: dict[str, Any] = {
    "apiVersion": "admission.k8s.io/v1",
    "kind": "AdmissionReview",
    "request": {
        "uid": "705ab4f5-6393-11e8-b7cc-42010a800002",
        "kind": {"group": "", "version": "v1", "kind": "Pod"},
        "resource": {"group": "", "version": "v1", "resource": "pods"},
        "operation": "CREATE",
        "namespace": "ml",
        "object": {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": "chat",
                "annotations": {
                    "capacity-planner.io/workload": "chat-serving",
                    "capacity-planner.io/gpu": "nvidia-a100-80gb-sxm",
                },
            },
            "spec": {
                "containers": [
                    {
                        "name": "server",
                        "image": "chat:1",
                        "resources": {"limits": {"nvidia.com/mig-3g.40gb": "1"}},
                    }
                ]
            },
        },
    },
}

ANSWER_EXAMPLE: dict[str, Any] = {
    "apiVersion": "admission.k8s.io/v1",
    "kind": "AdmissionReview",
    "response": {
        "uid": "705ab4f5-6393-11e8-b7cc-42010a800002",
        "allowed": True,
        "status": {
            "code": 200,
            "message": "chat-serving inference bs 4 bf16 needs 20.6 GiB; nvidia.com/mig-3g.40gb "
            "gives 39.2 GiB usable",
        },
    },
}


@router.post(
    "/pods",
    summary="Kubernetes ValidatingWebhook for Pods",
    # The raw body is parsed by the handler so that malformed reviews still get an
    # AdmissionReview back; the schema is documented here instead.
    openapi_extra={
        "requestBody": {
            "required": True,
            "description": "An admission.k8s.io/v1 AdmissionReview for a Pod.",
            "content": {
                "application/json": {"schema": {"type": "object"}, "example": REVIEW_EXAMPLE}
            },
        }
    },
    response_model=AdmissionReviewAnswer,
    responses={
        200: {
            "description": "An AdmissionReview with the same uid, allowed, status and warnings.",
            "content": {"application/json": {"example": ANSWER_EXAMPLE}},
        },
        **problem_responses(401, 403, 413, 422, 503),
    },
)
async def admission_pods(request: Request) -> Response:
    """Allow the pod when every container's and init container's GPU resource holds its
    workload (`capacity-planner.io/workload` annotation, or inline `model`, `mode`,
    `batch-size`, `precision` annotations) on the GPU named by `capacity-planner.io/gpu`.

    **Versions.** Only `admission.k8s.io/v1` `AdmissionReview` is spoken (the webhook
    configuration lists `admissionReviewVersions: ["v1"]`, and the API server sends the first
    listed version it supports). Kubernetes expects the answer in the version of the request,
    so a review whose `apiVersion` or `kind` is another value (e.g. `admission.k8s.io/v1beta1`)
    is not evaluated as v1: it is answered `422 application/problem+json` pointing at the
    field, which the API server treats as a failed call and decides by the webhook's own
    `failurePolicy`.

    **Everything else gets an AdmissionReview** (200, the request's uid echoed), decided by
    CAPPLAN_ADMISSION_FAILURE_POLICY (`deny`, or `allow` with a warning) when the review cannot
    be evaluated: a body that is not JSON or is nested too deeply to parse (uid empty), a
    missing uid, `apiVersion` or `kind`, an object that is not a Pod, a malformed pod, an
    unknown workload, model or GPU, an internal error, or a database that is unreachable or does
    not answer within CAPPLAN_ADMISSION_TIMEOUT_S (the answer comes within that time).

    **Stored decisions.** A stored workload's decision on every GPU is computed when the
    workload, its model or the hardware profile is written through the API; a review reads it
    and applies the policy (nothing is estimated). A missing or stale one (and inline
    annotations) is estimated within CAPPLAN_ADMISSION_TIMEOUT_S, stopped at that deadline
    (then the failure policy answers), and stored in the background. A workload stored as too
    expensive to evaluate, a pod with more than 512 containers or more than 16 GPU requests,
    and estimates in a review of more than 200,000 work units are answered by the failure
    policy.

    **Caching.** Decisions are cached per workload, GPU and GPU request and are valid while the
    planning data (hardware, models, workloads) is unchanged: a change through this process is
    reflected in the next review, a change through another process or replica within
    CAPPLAN_CACHE_STALENESS_S (1 s)."""
    # The database and settings are not dependencies: FastAPI solves each dependency on every
    # request, and one costs about a third of what a cached review costs in all.
    db = await get_database(request)
    settings: Settings = request.app.state.settings
    review = service.read_review(await request.body())  # another apiVersion/kind: 422
    tail, reason = await _decide(review, request, db, settings)
    metrics: Metrics = request.app.state.metrics
    metrics.count_admission("pods", allowed=service.is_allowed(tail), reason=reason)
    return Response(service.render(review.uid, tail), media_type="application/json")


def _verdict(tail: bytes) -> tuple[bytes, str]:
    """An evaluated answer with its reason (cached or not: cache hits are counted apart)."""
    return tail, "fits" if service.is_allowed(tail) else "does_not_fit"


async def _decide(
    review: service.Review, request: Request, db: Database, settings: Settings
) -> tuple[bytes, str]:
    """The answer after the uid (cached, evaluated, or by the failure policy) and the reason
    for ``capplan_admission_decisions_total``. Never raises."""
    policy = settings.admission_failure_policy
    timeout_s = settings.admission_timeout_s
    deadline = time.monotonic() + timeout_s
    asked: service.Question | None = None
    try:
        if review.pod is None:
            raise service.ReviewError(review.problem or "malformed AdmissionReview")
        asked = service.question(review.pod)
        if asked is None:
            return service.NO_GPU, "no_gpu"
        watch = watch_for(request.app.state.session_factory, staleness_of(settings))
        cache = service.DECISIONS.of(watch)
        generation = watch.current()
        if generation is not None and (cached := cache.get(asked.key, generation)) is not None:
            return _verdict(cached)  # no database, no thread, no timer
        with anyio.fail_after(timeout_s):
            return _verdict(
                await _cached_or_evaluated(
                    asked, request, watch, db, timeout_s, deadline, generation
                )
            )
    except service.DecisionPending as exc:  # a stored workload's decision the refresher makes
        refresher_for(request.app.state.session_factory).poke()
        return service.on_failure(policy, str(exc)), "timeout"
    except (service.ReviewError, PodSpecError, ServiceError) as exc:
        return service.on_failure(policy, service.failure_reason(exc)), "invalid_review"
    except DatabaseUnavailable as exc:
        tail = service.on_failure(policy, f"capacity-planner's database: {exc.detail}")
        return tail, "database_unavailable"
    except (TimeoutError, WorkCancelled):
        # The estimate (a stale or missing stored decision, or inline annotations) stops at its
        # next checkpoint past the deadline: nothing computes after this answer.
        if asked is not None and asked.stored:
            refresher_for(request.app.state.session_factory).poke()
        tail = service.on_failure(
            policy, f"no decision within {timeout_s:g} s (CAPPLAN_ADMISSION_TIMEOUT_S)"
        )
        return tail, "timeout"
    except Exception:  # an internal error must still produce a well-formed answer
        logger.exception("admission review failed")
        tail = service.on_failure(policy, "internal error in capacity-planner; see its logs")
        return tail, "internal_error"


async def _cached_or_evaluated(
    asked: service.Question,
    request: Request,
    watch: StateWatch,
    db: Database,
    timeout_s: float,
    deadline: float,
    checked: Generation | None,
) -> bytes:
    """``checked``: the generation whose cache entry the caller already missed (not looked up
    twice, so each review counts one cache lookup). ``deadline``: the review's, as a
    ``time.monotonic()`` instant (the estimate of the bounded path stops there)."""
    cache = service.DECISIONS.of(watch)
    generation = await watch.generation(lambda: db.run(read_digest, timeout_s=timeout_s))
    if generation != checked:
        cached = cache.get(asked.key, generation)
        if cached is not None:
            return cached
    if asked.stored:
        table = await _table(asked.gpu, watch, db, timeout_s, generation)
        stored = table.get(asked.notes["workload"])
        if stored is not None:  # decided from the stored decision, on the event loop
            tail = service.stored_tail(stored, asked)
            cache.put(asked.key, generation, tail)
            return tail
    local = watch.local  # before evaluating: a commit meanwhile makes the entry stale
    evaluated = await db.run(
        functools.partial(service.evaluate_with_digest, asked=asked, deadline=deadline),
        timeout_s=timeout_s,
    )
    if evaluated.refresh:  # a stored workload without a fresh stored decision
        refresher_for(request.app.state.session_factory).poke()
    watch.observe(evaluated.digest, evaluated.read_at)
    cache.put(asked.key, (evaluated.digest, local), evaluated.tail)
    return evaluated.tail


_LOADING: dict[tuple[int, str], asyncio.Task[tuple[service.DecisionTable, Generation]]] = {}


async def _table(
    gpu: str, watch: StateWatch, db: Database, timeout_s: float, generation: Generation
) -> dict[str, service.Stored]:
    """The GPU's fresh stored decisions in ``generation`` (or newer): from the table cache, or
    loaded by one query that the reviews needing it at the same time share."""
    tables = service.TABLES.of(watch)
    found = tables.get(gpu, generation)
    if found is not None:
        return found.decisions
    key = (id(watch), gpu)
    task = _LOADING.get(key)
    loop = asyncio.get_running_loop()
    if task is None or task.done() or task.get_loop() is not loop:
        task = loop.create_task(_load_table(gpu, watch, db, timeout_s))
        _LOADING[key] = task
        task.add_done_callback(functools.partial(_loaded, key))
    table, _ = await asyncio.shield(task)
    return table.decisions


def _loaded(key: tuple[int, str], task: asyncio.Task[Any]) -> None:
    """Forget a finished load; its error was raised to the reviews that waited for it."""
    if _LOADING.get(key) is task:
        del _LOADING[key]
    if not task.cancelled() and task.exception() is not None:
        logger.debug("decision table load failed: %s", type(task.exception()).__name__)


async def _load_table(
    gpu: str, watch: StateWatch, db: Database, timeout_s: float
) -> tuple[service.DecisionTable, Generation]:
    local = watch.local  # before reading: a commit meanwhile makes the table stale
    table = await db.run(functools.partial(service.decision_table, gpu=gpu), timeout_s=timeout_s)
    watch.observe(table.digest, table.read_at)
    loaded: Generation = (table.digest, local)
    service.TABLES.of(watch).put(gpu, loaded, table)
    return table, loaded


@router.post(
    "/check",
    response_model=AdmissionCheckResponse,
    responses=problem_responses(
        400, 401, 403, 404, 413, 422, 503, examples={422: COMPUTE_EXAMPLES[422]}
    ),
    summary="May a workload run on a GPU resource (simple form)",
)
async def admission_check(
    payload: Annotated[AdmissionCheckRequest, Body(openapi_examples=examples.ADMISSION_CHECK)],
    db: DatabaseDep,
    request: Request,
) -> AdmissionCheckResponse:
    """The webhook's decision for one workload and one resource, for scripts and CI (it
    estimates, to report the attention used and the defaults; stopped at
    CAPPLAN_COMPUTE_TIMEOUT_S with 422 too-expensive)."""
    deadline_s = request.app.state.settings.compute_timeout_s
    try:
        answer = await db.call(service.check, payload=payload, deadline_s=deadline_s)
    except WorkCancelled as exc:
        raise ComputeOverrun("deadline", deadline_s) from exc
    metrics: Metrics = request.app.state.metrics
    reason = "fits" if answer.allowed else "does_not_fit"
    metrics.count_admission("check", allowed=answer.allowed, reason=reason)
    return answer
