"""Admission decisions: may a pod's workload run on the GPU resources it asks for?"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Hashable
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError
from sqlalchemy.orm import Session

from app.db.repositories import DecisionRepository, HardwareRepository, ModelRepository
from app.domain.admission import (
    Evaluation,
    GpuRequest,
    ResourceError,
    Verdict,
    gpu_requests,
    planner_annotations,
    verdict,
    warning_text,
)
from app.domain.budget import CancelToken, bound
from app.domain.engines.cli import EngineArgsError, EngineCommand, engine_args, engine_command
from app.domain.workload import Mode
from app.schemas.admission import (
    AdmissionCheckRequest,
    AdmissionCheckResponse,
    AdmissionEngineRead,
)
from app.schemas.base import SLUG_PATTERN
from app.schemas.engine_options import VllmEngineOptions
from app.schemas.estimates import WorkloadInput
from app.services.convert import model_graph
from app.services.decision_store import (
    ESTIMATED,
    EVALUATOR,
    engine_evaluation,
    evaluation_of,
    stored_evaluation,
    work_of,
)
from app.services.errors import (
    InvalidInput,
    ServiceError,
)
from app.services.pipeline import (
    spec_pointers,
    workload_row,
    workload_spec,
)
from app.services.state_cache import Digest, PerWatch, timed_digest

# Estimates made inside a review (inline annotations, a stored workload whose decision is
# missing or stale) are at most this many work units (app.domain.budget: ~0.5 us of CPU each
# on an idle 2-core VM, a few times more under load): 10,000 executed layers of an inference
# estimate, 1,000 of a training one, well inside the 0.8 s review budget. The zoo's largest
# (GPT-3 175B, 774 executed layers) is within it in both modes. Larger ones are decided from
# stored decisions only.
REVIEW_MAX_WORK_UNITS = 200_000


class ReviewError(Exception):
    """A review that cannot be evaluated; the message says why."""


class DecisionPending(ReviewError):
    """A stored workload whose stored decision is missing or stale and whose estimate is more
    than a review computes within its deadline: answered by the failure policy while the
    refresher (which the route pokes) computes and stores it."""


def _verdict(evaluation: Evaluation, *, resource: str, count: int, label: str) -> Verdict:
    try:
        return verdict(evaluation, resource=resource, count=count, label=label)
    except ResourceError as exc:
        raise ReviewError(str(exc)) from exc


def check(
    session: Session, *, payload: AdmissionCheckRequest, deadline_s: float | None = None
) -> AdmissionCheckResponse:
    """The simple form for scripts (estimates here: it also reports the attention and the
    defaults used). ``deadline_s``: the estimate stops at its next checkpoint past it
    (``WorkCancelled``, app.domain.budget)."""
    hardware = HardwareRepository(session).get(payload.gpu_model)
    if hardware is None:
        raise InvalidInput(f"hardware '{payload.gpu_model}' does not exist", pointer="/gpu_model")
    with spec_pointers("/workload", payload.workload):
        spec = workload_spec(session, payload.workload)
        label = payload.workload if isinstance(payload.workload, str) else (spec.model or "inline")
        token = CancelToken.after(deadline_s) if deadline_s is not None else None
        with bound(token):
            evaluation, need = evaluation_of(session, spec=spec, label=label, hardware=hardware)
        try:
            decision = _verdict(
                evaluation, resource=payload.resource, count=payload.count, label=label
            )
        except ReviewError as exc:
            raise InvalidInput(str(exc), pointer="/resource") from exc
    engine = None
    if evaluation.engine is not None:
        entry = evaluation.engine[payload.resource]
        engine = AdmissionEngineRead(
            engine=evaluation.engine_name,
            tensor_x_pipeline_gpus=evaluation.engine_gpus,
            required_bytes=entry.required_bytes,
            cuda_visible_bytes=entry.usable_bytes,
            kv_tokens=entry.kv_tokens,
            max_concurrency=entry.max_concurrency,
            max_model_len=entry.max_model_len,
            reason=entry.reason,
        )
    return AdmissionCheckResponse(
        allowed=decision.allowed,
        message=decision.message,
        required_bytes=evaluation.engine[payload.resource].required_bytes
        if evaluation.engine is not None
        else evaluation.required_bytes,
        usable_bytes=decision.usable_bytes,
        smallest_fitting_resource=evaluation.smallest_fitting_resource,
        warnings=list(decision.warnings),
        attention=need.run.attention,
        defaults_used=need.run.defaults_used(),
        engine=engine,
    )


def _inline_spec(notes: dict[str, str]) -> WorkloadInput:
    fields: dict[str, Any] = {
        "model": notes.get("model"),
        "mode": notes.get("mode", "inference"),
        "batch_size": notes.get("batch-size", "1"),
    }
    # Every other option comes from the one default table, as for the API and the CLI.
    for key in ("precision", "attention", "logits"):
        if key in notes:
            fields[key] = notes[key]
    if "sequence-length" in notes:
        fields["sequence_length"] = notes["sequence-length"]
    if "image-size" in notes:
        fields["image_size"] = notes["image-size"]
    if "lora" in notes:  # the workload's lora object as JSON (LoRA / DoRA / QLoRA)
        try:
            fields["lora"] = json.loads(notes["lora"])
        except ValueError as exc:
            raise ReviewError(f"inline workload annotations invalid: lora: {exc}") from exc
    try:
        return WorkloadInput.model_validate(fields)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise ReviewError(f"inline workload annotations invalid: {where}: {first['msg']}") from exc


_INLINE_KEYS = (
    "model",
    "mode",
    "batch-size",
    "precision",
    "sequence-length",
    "image-size",
    "attention",
    "logits",
    "lora",
)
API_VERSION = "admission.k8s.io/v1"
REVIEW_KIND = "AdmissionReview"
_SLUG = re.compile(SLUG_PATTERN)

# Per database and GPU slug, the fresh stored decisions of every workload (a DecisionTable),
# valid in the generation of the planning data they were read in: a burst of reviews naming
# distinct workloads on one GPU costs one query, not one per review.
TABLES: PerWatch[str, DecisionTable] = PerWatch(size=64, name="admission_decision_tables")

# The webhook's answers (everything after the uid, pre-rendered) per database, keyed by what the
# pod asks: its workload (or inline annotations), GPU and GPU requests. Valid in the generation of
# the planning data they were computed in (see app.services.state_cache). Errors are not cached.
DECISIONS: PerWatch[Hashable, bytes] = PerWatch(size=1024, name="admission_decisions")


@dataclass(frozen=True, slots=True)
class Review:
    """What the webhook reads from a body: the uid to echo, and the pod or why there is none."""

    uid: str
    pod: dict[str, Any] | None
    problem: str | None = None


def read_review(raw: bytes) -> Review:
    """Parse an AdmissionReview (``json.loads`` only: no model validation).

    A JSON object whose ``apiVersion`` or ``kind`` is present and is not ``admission.k8s.io/v1``
    ``AdmissionReview`` raises ``InvalidInput`` (answered 422, never evaluated as v1). Anything
    else the webhook can answer is a ``Review``: a body that is not JSON, is nested deeper than
    the parser goes, or lacks ``request.uid`` echoes an empty uid; a missing ``apiVersion`` or
    ``kind``, or an ``object`` that is not a Pod, is a ``problem``.
    """
    try:
        body = json.loads(raw)
    except (ValueError, RecursionError):  # RecursionError: nested deeper than json can parse
        body = None
    if not isinstance(body, dict):
        return Review("", None, "malformed AdmissionReview: request.uid is missing")
    for name, expected in (("apiVersion", API_VERSION), ("kind", REVIEW_KIND)):
        value = body.get(name)
        if value is not None and value != expected:
            shown = value if isinstance(value, str) else json.dumps(value)[:40]
            raise InvalidInput(
                f"{name} {shown[:80]!r} is not supported: this webhook answers "
                f'{API_VERSION} {REVIEW_KIND} only (admissionReviewVersions: ["v1"])',
                pointer=f"/{name}",
            )
    request = body.get("request")
    uid = request.get("uid") if isinstance(request, dict) else None
    if not isinstance(request, dict) or not isinstance(uid, str) or not uid:
        return Review("", None, "malformed AdmissionReview: request.uid is missing")
    missing = [name for name in ("apiVersion", "kind") if name not in body]
    if missing:
        return Review(uid, None, f"malformed AdmissionReview: {' and '.join(missing)} missing")
    pod = request.get("object")
    if not isinstance(pod, dict) or pod.get("kind", "Pod") != "Pod":
        return Review(uid, None, "malformed AdmissionReview: request.object is not a Pod")
    return Review(uid, pod)


@dataclass(frozen=True, slots=True)
class Question:
    """What a pod asks, as far as the decision goes (``key`` identifies it in the cache)."""

    notes: dict[str, str]
    gpu: str
    requests: tuple[GpuRequest, ...]
    key: Hashable
    engine: EngineCommand | None = None  # a serving engine's command line (no stored workload)
    denial: str | None = None  # an engine flag the engine would refuse: denied as it is

    @property
    def stored(self) -> bool:
        """Whether the pod names a stored workload (its decision is computed on writes)."""
        return "workload" in self.notes


def _slug(notes: dict[str, str], name: str) -> str:
    value = notes[name]
    if not _SLUG.match(value):
        raise ReviewError(
            f"capacity-planner.io/{name} {value[:64]!r} is not a slug (lowercase letters, digits "
            "and inner hyphens, 1-64 characters)"
        )
    return value


def question(pod: dict[str, Any]) -> Question | None:
    """What ``pod`` asks (pure), or None when it asks for no GPU. Raises ``ReviewError`` or
    ``PodSpecError`` when it cannot be evaluated."""
    requests = tuple(gpu_requests(pod))
    if not requests:
        return None
    notes = planner_annotations(pod)
    engine, denial = None, None
    if "workload" not in notes:
        try:
            engine = pod_engine(pod, notes, {r.container for r in requests})
        except EngineArgsError as exc:
            denial = f"vLLM would refuse {exc.flag or 'its arguments'}: {exc}"
    if "workload" not in notes and "model" not in notes and engine is None and denial is None:
        raise ReviewError(
            "pod asks for GPUs but names no workload: annotate capacity-planner.io/workload "
            "(or capacity-planner.io/model, mode, batch-size, precision), or run `vllm serve`"
        )
    if notes.get("gpu") is None:
        raise ReviewError(
            "which GPU model? set annotation or nodeSelector capacity-planner.io/gpu to a "
            "hardware slug (GET /v1/hardware)"
        )
    gpu = _slug(notes, "gpu")
    subject: Hashable
    if "workload" in notes:
        subject = ("workload", _slug(notes, "workload"))
    elif engine is not None or denial is not None:
        if "model" in notes:
            _slug(notes, "model")
        subject = (
            "engine",
            notes.get("model"),
            notes.get("min-concurrency"),
            notes.get(QUANTIZATION_CONFIG_NOTE),
            denial,
            None if engine is None else engine.model,
            None if engine is None else tuple(sorted(engine.options.items())),
            None if engine is None else engine.ignored,
        )
    else:
        _slug(notes, "model")
        subject = ("inline", *(notes.get(key) for key in _INLINE_KEYS))
    return Question(
        notes=notes,
        gpu=gpu,
        requests=requests,
        key=(subject, gpu, requests),
        engine=engine,
        denial=denial,
    )


ENGINE_NOTE = "engine"  # capacity-planner.io/engine: vllm (a launcher the webhook cannot read)
ENGINE_ARGS_NOTE = "engine-args"  # capacity-planner.io/engine-args: "--max-model-len 8192 ..."
MIN_CONCURRENCY_NOTE = "min-concurrency"  # policy: deny below this concurrency
# capacity-planner.io/quantization-config: the served checkpoint's quantization_config (JSON,
# from its config.json), which a pre-quantized `-q gptq|awq|...` checkpoint needs: the webhook
# cannot read the checkpoint, and stored models keep only their unquantized graph
QUANTIZATION_CONFIG_NOTE = "quantization-config"


def pod_engine(
    pod: dict[str, Any], notes: dict[str, str], containers: set[str]
) -> EngineCommand | None:
    """The serving engine a pod runs: the ``capacity-planner.io/engine`` annotation with its
    ``engine-args``, else the first GPU container whose command + args run ``vllm serve`` or
    vLLM's OpenAI API server module (None: no engine). Raises ``EngineArgsError`` for a flag
    value vLLM would refuse, ``ReviewError`` for an engine other than vllm."""
    if ENGINE_NOTE in notes:
        name = notes[ENGINE_NOTE]
        if name != "vllm":
            raise ReviewError(
                f"capacity-planner.io/engine {name[:40]!r} is not a modelled engine (vllm)"
            )
        return engine_args(notes.get(ENGINE_ARGS_NOTE, ""))
    spec = pod.get("spec") or {}
    for key in ("containers", "initContainers"):
        for container in spec.get(key) or []:
            if not isinstance(container, dict):
                continue
            if str(container.get("name") or "") not in containers:
                continue
            argv = [*(container.get("command") or []), *(container.get("args") or [])]
            if not all(isinstance(token, str) for token in argv):
                continue
            found = engine_command(argv)
            if found is not None:
                return found
    return None


def served_slug(served: str | None) -> str | None:
    """A served model name as a stored model's slug: its last path segment, lower case, every
    run of other characters than letters and digits a hyphen (``/models/Llama-3-8B`` and
    ``meta-llama/Llama-3-8B`` name ``llama-3-8b``); None when nothing is left."""
    if not served:
        return None
    tail = served.rstrip("/").rsplit("/", 1)[-1].lower()
    slug = re.sub(r"[^a-z0-9]+", "-", tail).strip("-")[:64].strip("-")
    return slug or None


# vLLM's option -> its flag, for messages naming what the pod wrote
_FLAG_OF = {
    "tensor_parallel_size": "--tensor-parallel-size",
    "pipeline_parallel_size": "--pipeline-parallel-size",
    "max_model_len": "--max-model-len",
    "gpu_memory_utilization": "--gpu-memory-utilization",
    "max_num_seqs": "--max-num-seqs",
    "max_num_batched_tokens": "--max-num-batched-tokens",
    "kv_cache_dtype": "--kv-cache-dtype",
    "quantization": "--quantization",
    "dtype": "--dtype",
    "block_size": "--block-size",
    "enforce_eager": "--enforce-eager",
}


class EngineDenied(Exception):
    """An engine configuration vLLM refuses: the review is denied with this message."""


def _engine_spec(asked: Question) -> tuple[WorkloadInput, str]:
    """The workload an engine pod runs (its model as a stored slug) and how to name it."""
    command = asked.engine
    assert command is not None
    notes = asked.notes
    slug = notes.get("model") or served_slug(command.model)
    if slug is None or not _SLUG.match(slug):
        raise ReviewError(
            "which stored model does vLLM serve? annotate capacity-planner.io/model with its "
            f"slug (served name: {str(command.model)[:64]!r})"
        )
    options = dict(command.options)
    if str(options.get("quantization", "")).lower() == "none":  # vLLM's `-q None`: unquantized
        del options["quantization"]
    fields: dict[str, Any] = {"name": "vllm", **options}
    if QUANTIZATION_CONFIG_NOTE in notes:
        try:
            fields["quantization_config"] = json.loads(notes[QUANTIZATION_CONFIG_NOTE])
        except ValueError as exc:
            raise ReviewError(f"capacity-planner.io/{QUANTIZATION_CONFIG_NOTE}: {exc}") from exc
    if MIN_CONCURRENCY_NOTE in notes:
        fields["min_concurrency"] = notes[MIN_CONCURRENCY_NOTE]
    try:
        engine = VllmEngineOptions.model_validate(fields)
    except ValidationError as exc:
        first = exc.errors()[0]
        option = str(first["loc"][0]) if first["loc"] else ""
        if option == "min_concurrency":
            raise ReviewError(f"capacity-planner.io/min-concurrency: {first['msg']}") from exc
        if option == "quantization_config":
            raise ReviewError(
                f"capacity-planner.io/{QUANTIZATION_CONFIG_NOTE}: {first['msg']}"
            ) from exc
        flag = command.flags.get(option, _FLAG_OF.get(option, option))
        shown = command.options.get(option)
        raise EngineDenied(f"vLLM would refuse {flag} {shown!r}: {first['msg']}") from exc
    spec = WorkloadInput(model=slug, mode=Mode.INFERENCE, batch_size=1, engine=engine)
    note = f" ({len(command.ignored)} flags not modelled: {', '.join(command.ignored[:8])})"
    return spec, slug + (note if command.ignored else "")


@dataclass(frozen=True, slots=True)
class Evaluated:
    """A review's answer tail, the digest of the data it saw, and whether it named a stored
    workload whose stored decision was missing or stale (the refresher should run)."""

    tail: bytes
    digest: Digest
    read_at: float
    refresh: bool = False


def _evaluation(
    session: Session, asked: Question, token: CancelToken | None
) -> tuple[Evaluation, str, bool]:
    """The evaluation a review applies, its label, and whether a stored one was missing."""
    notes = asked.notes
    if asked.engine is not None and "workload" not in notes:
        return _engine_evaluation(session, asked, token), _engine_label(asked), False
    if "workload" in notes:
        label = notes["workload"]
        found = DecisionRepository(session).lookup(label, asked.gpu, EVALUATOR)
        if found is None:
            workload_row(session, label)  # 404 naming the workload when it is the one missing
            raise ReviewError(
                f"capacity-planner.io/gpu '{asked.gpu}' is not a known hardware profile"
            )
        if found.fresh and found.decision is not None:
            stored = found.decision
            if stored.outcome != ESTIMATED:
                raise ReviewError(stored.detail or f"workload '{label}' cannot be evaluated")
            return stored_evaluation(stored, asked.gpu), label, False
        spec = workload_spec(session, label)  # missing or stale: the bounded path
        missing = True
    else:
        spec = _inline_spec(notes)
        label = spec.model or "inline"
        missing = False
    hardware = HardwareRepository(session).get(asked.gpu)
    if hardware is None:
        raise ReviewError(f"capacity-planner.io/gpu '{asked.gpu}' is not a known hardware profile")
    if spec.engine is not None:  # closed form: no graph estimate, no work budget
        with bound(token):
            graph = model_graph(session, spec.model, spec.architecture)
            return engine_evaluation(graph, spec, label=label, hardware=hardware), label, missing
    work = work_of(session, spec)
    if work.units > REVIEW_MAX_WORK_UNITS and missing:
        raise DecisionPending(
            f"workload '{label}': its decision on '{asked.gpu}' is not stored yet and its "
            f"estimate is {work.units:,} work units ({work.describe()}), more than a review "
            f"estimates within its deadline ({REVIEW_MAX_WORK_UNITS:,}); it is being computed "
            "in the background: retry later"
        )
    if work.units > REVIEW_MAX_WORK_UNITS:
        raise ReviewError(
            f"model '{spec.model}': its estimate is {work.units:,} work units "
            f"({work.describe()}); a review estimates at most {REVIEW_MAX_WORK_UNITS:,} within "
            "its deadline: name a stored workload (its decision is computed when it is written)"
        )
    with bound(token):
        evaluation, _ = evaluation_of(session, spec=spec, label=label, hardware=hardware)
    return evaluation, label, missing


def _engine_label(asked: Question) -> str:
    assert asked.engine is not None
    return asked.notes.get("model") or served_slug(asked.engine.model) or "vllm"


def _engine_evaluation(session: Session, asked: Question, token: CancelToken | None) -> Evaluation:
    """An engine pod's evaluation: its stored model served by vLLM with the pod's flags on the
    annotated GPU (closed form per resource; ``EngineDenied`` for options vLLM refuses)."""
    spec, label = _engine_spec(asked)
    assert spec.model is not None
    if ModelRepository(session).get(spec.model) is None:
        raise ReviewError(
            f"model '{spec.model}' (served by vLLM) is not stored; annotate "
            "capacity-planner.io/model with a stored model's slug (GET /v1/models)"
        )
    hardware = HardwareRepository(session).get(asked.gpu)
    if hardware is None:
        raise ReviewError(f"capacity-planner.io/gpu '{asked.gpu}' is not a known hardware profile")
    try:
        with bound(token):
            graph = model_graph(session, spec.model, spec.architecture)
            return engine_evaluation(graph, spec, label=label, hardware=hardware)
    except InvalidInput as exc:
        pointer = exc.pointer or ""
        if pointer.startswith("/engine/quantization_config"):  # the annotation, not a flag
            hint = ""
            if QUANTIZATION_CONFIG_NOTE not in asked.notes:
                hint = (
                    f"; annotate capacity-planner.io/{QUANTIZATION_CONFIG_NOTE} with the "
                    "checkpoint's quantization_config (JSON from its config.json)"
                )
            raise ReviewError(
                f"capacity-planner.io/{QUANTIZATION_CONFIG_NOTE}"
                f"{pointer.removeprefix('/engine/quantization_config')}: {exc.detail}{hint}"
            ) from exc
        if pointer.startswith("/engine/"):
            option = pointer.removeprefix("/engine/")
            assert asked.engine is not None
            flag = asked.engine.flags.get(option, _FLAG_OF.get(option, option))
            raise EngineDenied(f"vLLM would refuse {flag}: {exc.detail}") from exc
        raise ReviewError(exc.detail) from exc


@dataclass(frozen=True, slots=True)
class Stored:
    """A stored workload's fresh decision on one GPU: its evaluation, or why there is none."""

    evaluation: Evaluation | None
    failure: str | None = None


@dataclass(frozen=True, slots=True)
class DecisionTable:
    """A GPU's fresh stored decisions by workload slug, and the digest they were read with."""

    decisions: dict[str, Stored]
    digest: Digest
    read_at: float


def decision_table(session: Session, gpu: str) -> DecisionTable:
    """Every stored workload's fresh decision on ``gpu`` (one query after the digest; a
    missing or stale one is absent and takes the review's bounded path)."""
    digest, read_at = timed_digest(session)
    decisions = {}
    for slug, row in DecisionRepository(session).fresh_on(gpu, EVALUATOR):
        if row.outcome == ESTIMATED:
            decisions[slug] = Stored(stored_evaluation(row, gpu))
        else:
            decisions[slug] = Stored(None, row.detail or f"workload '{slug}' cannot be evaluated")
    return DecisionTable(decisions, digest, read_at)


def stored_tail(stored: Stored, asked: Question) -> bytes:
    """The answer tail of a review from its workload's stored decision (no database, no
    estimate: string formatting). Raises ``ReviewError`` for a stored failure."""
    if stored.evaluation is None:
        raise ReviewError(stored.failure or "the workload cannot be evaluated")
    return answer_tail(*decide(stored.evaluation, asked, asked.notes["workload"]))


def decide(
    evaluation: Evaluation, asked: Question, label: str
) -> tuple[bool, str, list[str], dict[str, str] | None]:
    """Allowed, message and warnings for a pod's GPU requests (each distinct resource and
    count judged once: the requests are bounded by app.domain.admission.MAX_GPU_REQUESTS)."""
    judged: dict[tuple[str, int], Verdict] = {}
    verdicts = []
    for request in asked.requests:
        key = (request.resource, request.count)
        if key not in judged:
            judged[key] = _verdict(
                evaluation, resource=request.resource, count=request.count, label=label
            )
        verdicts.append((request, judged[key]))
    warnings = [w for _, v in verdicts for w in v.warnings]
    denied = [(r, v) for r, v in verdicts if not v.allowed]
    if denied:
        request, decision = denied[0]
        kind = "init container" if request.init_container else "container"
        return False, f"{kind} '{request.container}': {decision.message}", warnings, None
    suffix = f" ({len(verdicts)} GPU requests checked)" if len(verdicts) > 1 else ""
    if asked.engine is not None and asked.engine.ignored:
        warnings.append(
            f"{label}: flags not modelled, ignored: {', '.join(asked.engine.ignored[:6])}"
        )
    notes = verdicts[0][1].annotations
    return True, verdicts[0][1].message + suffix, warnings, None if notes is None else dict(notes)


def evaluate_with_digest(
    session: Session, asked: Question, *, deadline: float | None = None
) -> Evaluated:
    """The review's answer rendered as a tail, with the digest of the data it saw (read first,
    in the same session, so the answer is at least as new as the digest).

    A stored workload's decision is read (one query, nothing estimated). A missing or stale
    one, and inline annotations, are estimated here under a cancel token with ``deadline``
    (``time.monotonic()`` instant, the review's): past it the estimate stops at its next
    checkpoint with ``WorkCancelled``, so nothing computes after the review's answer."""
    digest, read_at = timed_digest(session)
    token = None
    if deadline is not None:
        token = CancelToken(deadline, max(0.0, deadline - time.monotonic()))
    if asked.denial is not None:
        return Evaluated(answer_tail(False, asked.denial, []), digest, read_at)
    try:
        evaluation, label, missing = _evaluation(session, asked, token)
    except EngineDenied as exc:
        return Evaluated(answer_tail(False, str(exc), []), digest, read_at)
    return Evaluated(answer_tail(*decide(evaluation, asked, label)), digest, read_at, missing)


def answer_tail(
    allowed: bool,
    message: str,
    warnings: list[str],
    annotations: dict[str, str] | None = None,
) -> bytes:
    """The AdmissionResponse after its uid, rendered once (cached answers are bytes);
    ``annotations``: its auditAnnotations (an engine's expected KV tokens and concurrency)."""
    response: dict[str, Any] = {
        "allowed": allowed,
        "status": {"code": 200 if allowed else 403, "message": message},
    }
    if warnings:
        response["warnings"] = [warning_text(w) for w in warnings]
    if annotations:
        response["auditAnnotations"] = annotations
    return json.dumps(response, separators=(",", ":")).encode()[1:]


_ALLOWED = b'"allowed":true,'


def is_allowed(tail: bytes) -> bool:
    """Whether an ``answer_tail`` allows the pod (its first member is ``allowed``)."""
    return tail.startswith(_ALLOWED)


_HEAD = b'{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","response":{"uid":'


def render(uid: str, tail: bytes) -> bytes:
    """The AdmissionReview answer: ``uid`` echoed, then a tail from ``answer_tail``."""
    return b"".join((_HEAD, json.dumps(uid).encode(), b",", tail, b"}"))


def on_failure(policy: str, reason: str) -> bytes:
    """The answer tail when a review cannot be evaluated: deny, or allow with a warning."""
    if policy == "allow":
        return answer_tail(True, f"not checked: {reason}", [f"capacity-planner: {reason}"])
    return answer_tail(False, f"denied: {reason}", [])


def failure_reason(exc: BaseException) -> str:
    """The reason an ``on_failure`` answer gives for a review error."""
    if isinstance(exc, ServiceError):
        return exc.detail
    return str(exc)


NO_GPU = answer_tail(True, "no GPU requested", [])
