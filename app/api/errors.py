"""Map every error to an RFC 9457 `application/problem+json` response."""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, NamedTuple

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import ValidationError
from sqlalchemy.exc import DataError
from starlette.exceptions import HTTPException as StarletteHTTPException

from app.api.compute import ComputeBusy, ComputeOverrun
from app.api.context import request_id_var
from app.api.database import DatabaseUnavailable, busy, unavailable
from app.config import Settings
from app.domain.budget import PEAK_LAYER_UNITS, WorkBudgetExceeded, WorkFactor, work_units
from app.domain.errors import DomainError
from app.schemas.problem import InvalidField, Problem
from app.services import errors as svc

PROBLEM_JSON = "application/problem+json"
_SURROGATE = re.compile("[\ud800-\udfff]")
logger = logging.getLogger("app.api")

# service error -> (status, type slug, title)
_SERVICE_ERRORS: dict[type[svc.ServiceError], tuple[int, str, str]] = {
    svc.NotFound: (404, "not-found", "Not found"),
    svc.AlreadyExists: (409, "already-exists", "Already exists"),
    svc.ReadOnly: (409, "read-only", "Read-only resource"),
    svc.InUse: (409, "in-use", "Resource in use"),
    svc.PreconditionFailed: (412, "stale-version", "Precondition failed"),
    svc.PreconditionRequired: (428, "if-match-required", "Precondition required"),
    svc.InvalidInput: (422, "invalid-input", "Invalid input"),
    svc.ImportFailed: (422, "invalid-import", "Import failed"),
}

_HTTP_TITLES = {
    400: ("bad-request", "Bad request"),
    401: ("unauthorized", "Authentication required"),
    403: ("forbidden", "Forbidden"),
    404: ("not-found", "Not found"),
    405: ("method-not-allowed", "Method not allowed"),
    406: ("not-acceptable", "Not acceptable"),
    413: ("payload-too-large", "Payload too large"),
    415: ("unsupported-media-type", "Unsupported media type"),
    503: ("unavailable", "Service unavailable"),
}


def problem_body(
    status: int,
    type_slug: str,
    title: str,
    detail: str,
    *,
    instance: str | None = None,
    errors: list[InvalidField] | None = None,
) -> dict[str, Any]:
    """A problem document as a plain dict."""
    problem = Problem(
        type=f"/problems/{type_slug}",
        title=title,
        status=status,
        detail=_printable(detail),
        instance=None if instance is None else _printable(instance),
        request_id=request_id_var.get(),
        errors=errors,
    )
    return problem.model_dump(exclude_none=True)


def problem_response(
    request: Request,
    status: int,
    type_slug: str,
    title: str,
    detail: str,
    *,
    errors: list[InvalidField] | None = None,
    headers: dict[str, str] | None = None,
) -> JSONResponse:
    """A problem+json response for ``request``."""
    body = problem_body(status, type_slug, title, detail, instance=request.url.path, errors=errors)
    return JSONResponse(body, status_code=status, media_type=PROBLEM_JSON, headers=headers)


def json_pointer(parts: Iterable[int | str]) -> str:
    """An RFC 6901 JSON pointer ("~" and "/" in a key escaped as "~0" and "~1")."""
    return "".join("/" + str(p).replace("~", "~0").replace("/", "~1") for p in parts) or "/"


def _pointer(loc: tuple[int | str, ...]) -> tuple[str, str]:
    if not loc:
        return "body", "/"
    location = str(loc[0])
    rest = loc[1:]
    if location in ("query", "path", "header", "cookie"):
        return location, ".".join(str(p) for p in rest)
    return "body", json_pointer(rest)


# How pydantic names the member of a union it tried ("WorkloadSpec", "constrained-str",
# "function-after[_one_model(), function-after[...]]", "int"): never a field name of this API
# (those are snake_case). Only the bracketed validator form and class names are certain not to
# be a dict key a client sent; the others are taken for tags where the body shows no such key.
_UNION_TAG = re.compile(r"^(?:[A-Z]\w*|[a-z]+(?:-[a-z]+)+|[\w-]+\[.*\]|str|int|float|bool)$", re.S)
_CERTAIN_UNION_TAG = re.compile(r"^(?:[A-Z]\w*|[\w-]+\[.*\])$", re.S)
_ABSENT = object()


class _Located(NamedTuple):
    """An error's location with the union member names taken out, and where the last union
    member was tried (None: no union on the way)."""

    loc: tuple[int | str, ...]
    union_at: tuple[int | str, ...] | None


def _without_union_tags(
    loc: tuple[int | str, ...],
    body: Any,
    unions: frozenset[tuple[int | str, ...]] = frozenset(),
) -> tuple[tuple[int | str, ...], tuple[int | str, ...] | None]:
    """``loc`` without the union member names pydantic puts in it, which are not part of the
    body: a JSON pointer names keys and indices only (``/workload/architecture/layers/0/name``,
    not ``/workload/WorkloadSpec/architecture/...``). Also returns where the last union member
    was tried (the kept location before its tag), or None. ``body`` is the request body, or
    ``_ABSENT`` when it is not known: then only the forms no key can take are removed, and the
    others (``constrained-str``) only at ``unions``, the raw locations where such a form shows
    that pydantic tried a union's members."""
    kept: list[int | str] = []
    union_at: tuple[int | str, ...] | None = None
    node = body
    for index, part in enumerate(loc):
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and isinstance(part, int) and 0 <= part < len(node):
            node = node[part]
        elif (
            isinstance(part, str)
            and part != "[key]"
            and _is_union_tag(part, body, loc[:index] in unions)
        ):
            union_at = tuple(kept)
            continue
        else:
            node = _ABSENT  # a missing field or a dict key's "[key]": kept, nothing below
        kept.append(part)
    return tuple(kept), union_at


def _is_union_tag(part: str, body: Any, at_union: bool) -> bool:
    pattern = _UNION_TAG if body is not _ABSENT or at_union else _CERTAIN_UNION_TAG
    return bool(pattern.match(part))


def _union_locations(locs: Iterable[tuple[int | str, ...]]) -> frozenset[tuple[int | str, ...]]:
    """The raw locations at which pydantic certainly tried the members of a union."""
    return frozenset(
        loc[:index]
        for loc in locs
        for index, part in enumerate(loc)
        if isinstance(part, str) and _CERTAIN_UNION_TAG.match(part)
    )


def _wrong_union_members(located: Sequence[tuple[Mapping[str, Any], _Located]]) -> set[int]:
    """Errors that only say the input is not of a union member's type (``/workload``: "Input
    should be a valid string" for an object sent where a workload slug or an inline workload
    may go), where another member of the same union took the input and says what is wrong
    with it: those are noise, and are dropped (indices into ``located``)."""
    dropped: set[int] = set()
    at_union: dict[tuple[int | str, ...], list[int]] = {}
    for index, (_, where) in enumerate(located):
        if where.union_at is not None:
            at_union.setdefault(where.union_at, []).append(index)
    for union_at, indices in at_union.items():
        mismatches = [
            i
            for i in indices
            if located[i][1].loc == union_at
            and str(located[i][0].get("type", "")).endswith("_type")
        ]
        if len(mismatches) < len(indices):
            dropped.update(mismatches)
    return dropped


def _printable(text: str) -> str:
    """Lone surrogates (UTF-8 cannot encode them, so no JSON response could carry them) shown
    as ``\\udXXX`` text; everything else, NUL included, is kept (JSON escapes it)."""
    return _SURROGATE.sub(lambda m: f"\\u{ord(m.group()):04x}", text)


def _invalid_fields(
    errors: Sequence[Mapping[str, Any]],
    *,
    prefix: tuple[int | str, ...] = (),
    body: Any = _ABSENT,
) -> list[InvalidField]:
    located: list[tuple[Mapping[str, Any], _Located]] = []
    unions = _union_locations((*prefix, *tuple(error.get("loc", ())))[1:] for error in errors)
    for error in errors:
        loc = (*prefix, *tuple(error.get("loc", ())))
        union_at = None
        if loc[:1] == ("body",):
            rest, union_in_body = _without_union_tags(loc[1:], body, unions)
            loc = ("body", *rest)
            union_at = None if union_in_body is None else ("body", *union_in_body)
        located.append((error, _Located(loc, union_at)))
    dropped = _wrong_union_members(located)
    fields = []
    for index, (error, where) in enumerate(located):
        if index in dropped:
            continue
        loc = where.loc
        location, pointer = _pointer(loc)
        pointer = _printable(pointer)
        kind = str(error.get("type", "invalid"))
        message = _printable(str(error.get("msg", "invalid value")))
        if kind == "json_invalid":
            position = loc_tail[0] if (loc_tail := tuple(error.get("loc", ()))[1:]) else "?"
            pointer = "/"
            message = f"{error.get('ctx', {}).get('error', message)} at character {position}"
        elif kind == "extra_forbidden":
            message = "unknown field; remove it (see the schema in /docs for allowed fields)"
        elif kind == "missing":
            message = "field required"
        fields.append(InvalidField(pointer=pointer, location=location, message=message, type=kind))
    return fields


async def _validation_handler(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    fields = _invalid_fields(exc.errors(), body=exc.body)
    if any(f.type == "json_invalid" for f in fields):
        return problem_response(
            request,
            400,
            "malformed-json",
            "Malformed JSON",
            "the request body is not valid JSON: " + "; ".join(f.message for f in fields),
            errors=fields,
        )
    return problem_response(
        request, 422, "validation-error", "Invalid request", _summary(fields), errors=fields
    )


def _summary(fields: Sequence[InvalidField]) -> str:
    summary = "; ".join(f"{f.pointer or f.location}: {f.message}" for f in fields[:5])
    more = f" (and {len(fields) - 5} more)" if len(fields) > 5 else ""
    return f"{len(fields)} invalid field(s): {summary}{more}"


async def _pydantic_handler(request: Request, exc: Exception) -> JSONResponse:
    """A pydantic ValidationError that escaped a service (a model it builds from the request):
    422 listing every error with a JSON pointer relative to the body, logged for the developers
    (the service should have raised InvalidInput naming the request field)."""
    assert isinstance(exc, ValidationError)
    logger.warning("validation error escaped a service: %s", exc.title, exc_info=exc)
    fields = _invalid_fields(exc.errors(include_input=False, include_url=False), prefix=("body",))
    return problem_response(
        request, 422, "invalid-input", "Invalid input", _summary(fields), errors=fields
    )


async def _recursion_handler(request: Request, exc: Exception) -> JSONResponse:
    """Input nested deeper than the code walking it can follow."""
    logger.warning("recursion limit reached handling a request", exc_info=exc)
    return problem_response(
        request,
        422,
        "invalid-input",
        "Invalid input",
        "the request is nested too deeply to be processed; flatten it",
    )


async def _data_error_handler(request: Request, exc: Exception) -> JSONResponse:
    """Safety net: a value the database refused (out of range, unencodable text) is the client's
    input, not a server fault; validation should have caught it first, so it is logged."""
    logger.error("database refused a value (DataError); add a schema check", exc_info=exc)
    return problem_response(
        request,
        422,
        "invalid-input",
        "Invalid input",
        "a value in the request cannot be stored (out of range or an unsupported character); "
        "nothing was written",
    )


async def _service_handler(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, svc.ServiceError)
    status, slug, title = _SERVICE_ERRORS.get(type(exc), (400, "bad-request", "Bad request"))
    errors = None
    if isinstance(exc, svc.ImportFailed):
        slug = exc.kind
        causes = exc.problems or ((exc.pointer or "/", exc.detail),)
        errors = [
            InvalidField(pointer=pointer, location="body", message=message, type=slug)
            for pointer, message in causes
        ]
    elif isinstance(exc, svc.InvalidInput) and exc.pointer is not None:
        errors = [InvalidField(pointer=exc.pointer, location="body", message=exc.detail, type=slug)]
    return problem_response(request, status, slug, title, exc.detail, errors=errors)


async def _database_handler(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, DatabaseUnavailable)
    title = "Database busy" if exc.type_slug == "database-busy" else "Database unavailable"
    return problem_response(
        request,
        503,
        exc.type_slug,
        title,
        exc.detail,
        headers={"Retry-After": str(exc.retry_after_s)},
    )


TOO_EXPENSIVE = ("too-expensive", "Too expensive")


def budget_errors(exc: WorkBudgetExceeded) -> list[InvalidField]:
    """One entry per request field that sets a factor of the work, largest factor first."""
    units, limit = exc.estimate.units, exc.limit_units
    return [
        InvalidField(
            pointer=factor.field,
            location="body" if factor.field.startswith("/") else "query",
            message=f"{factor.name}: {factor.value:,}, a factor of the {units:,} work units "
            f"(limit {limit:,})",
            type=TOO_EXPENSIVE[0],
        )
        for factor in sorted(exc.estimate.factors, key=lambda f: -f.value)
        if factor.value > 1
    ]


async def _budget_handler(request: Request, exc: Exception) -> JSONResponse:
    """Over the work budget, found before computing: 422 naming the fields to reduce."""
    assert isinstance(exc, WorkBudgetExceeded)
    slug, title = TOO_EXPENSIVE
    return problem_response(request, 422, slug, title, str(exc), errors=budget_errors(exc) or None)


async def _overrun_handler(request: Request, exc: Exception) -> JSONResponse:
    """Stopped at its deadline: 422, no Retry-After (the same request would overrun again)."""
    assert isinstance(exc, ComputeOverrun)
    slug, title = TOO_EXPENSIVE
    return problem_response(request, 422, slug, title, exc.detail)


async def _compute_busy_handler(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, ComputeBusy)
    return problem_response(
        request,
        503,
        "compute-busy",
        "Compute busy",
        exc.detail,
        headers={"Retry-After": str(exc.retry_after_s)},
    )


async def _domain_handler(request: Request, exc: Exception) -> JSONResponse:
    return problem_response(request, 422, "invalid-input", "Invalid input", str(exc))


async def _http_handler(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, StarletteHTTPException)
    slug, title = _HTTP_TITLES.get(exc.status_code, ("error", "Error"))
    detail = exc.detail if isinstance(exc.detail, str) else title
    if exc.status_code == 404 and detail == "Not Found":
        detail = f"no endpoint at {request.url.path}; see /docs for the API"
    return problem_response(
        request, exc.status_code, slug, title, detail, headers=getattr(exc, "headers", None)
    )


INTERNAL_ERROR_DETAIL = (
    "the server failed to handle this request; it has been logged - quote the request_id "
    "when reporting it"
)


def internal_error_body(path: str) -> dict[str, Any]:
    """The 500 problem: no exception text, stack trace or SQL, just the request id."""
    return problem_body(
        500, "internal-error", "Internal server error", INTERNAL_ERROR_DETAIL, instance=path
    )


async def _unhandled_handler(request: Request, exc: Exception) -> JSONResponse:
    # Fallback only: RequestContextMiddleware turns errors into 500s with the request id.
    logger.error("unhandled error", exc_info=exc)
    return JSONResponse(
        internal_error_body(request.url.path), status_code=500, media_type=PROBLEM_JSON
    )


def install_error_handlers(app: FastAPI) -> None:
    """Register the handlers that turn every error into problem+json."""
    app.add_exception_handler(RequestValidationError, _validation_handler)
    app.add_exception_handler(svc.ServiceError, _service_handler)
    app.add_exception_handler(DatabaseUnavailable, _database_handler)
    app.add_exception_handler(WorkBudgetExceeded, _budget_handler)
    app.add_exception_handler(ComputeOverrun, _overrun_handler)
    app.add_exception_handler(ComputeBusy, _compute_busy_handler)
    app.add_exception_handler(DomainError, _domain_handler)
    app.add_exception_handler(ValidationError, _pydantic_handler)
    app.add_exception_handler(RecursionError, _recursion_handler)
    app.add_exception_handler(DataError, _data_error_handler)
    app.add_exception_handler(StarletteHTTPException, _http_handler)
    app.add_exception_handler(Exception, _unhandled_handler)


def too_large_detail(limit_bytes: int, setting: str) -> str:
    """The detail of a 413."""
    return f"request body exceeds the limit of {limit_bytes} bytes (setting {setting})"


def overloaded_detail(limit: int, queue_timeout_s: float) -> str:
    """The detail of a 503 for a request that waited too long for an in-flight slot."""
    return (
        f"{limit} requests are in progress (setting CAPPLAN_MAX_IN_FLIGHT) and none finished "
        f"within {queue_timeout_s:g} s; retry shortly"
    )


EXAMPLE_REQUEST_ID = "5f0c6c0a9d8e4b0f9a3c2d1e0f9a8b7c"


def _example(
    summary: str,
    status: int,
    type_slug: str,
    title: str,
    detail: str,
    instance: str,
    errors: list[dict[str, str]] | None = None,
) -> dict[str, Any]:
    body: dict[str, Any] = {
        "type": f"/problems/{type_slug}",
        "title": title,
        "status": status,
        "detail": detail,
        "instance": instance,
        "request_id": EXAMPLE_REQUEST_ID,
    }
    if errors is not None:
        body["errors"] = errors
    return {"summary": summary, "value": body}


def _default(setting: str) -> Any:
    return Settings.model_fields[setting].default


# What the service answers for each status it documents, one example per kind of problem:
# the bodies are the service's own (tests/api/test_problem_examples.py provokes each one and
# compares), so Swagger UI and ReDoc no longer show the 404 example under every status.
PROBLEM_EXAMPLES: dict[int, dict[str, dict[str, Any]]] = {
    400: {
        "malformed-json": _example(
            "The body is not valid JSON",
            400,
            "malformed-json",
            "Malformed JSON",
            "the request body is not valid JSON: Expecting property name enclosed in double "
            "quotes at character 20",
            "/v1/models",
            [
                {
                    "pointer": "/",
                    "location": "body",
                    "message": "Expecting property name enclosed in double quotes at character 20",
                    "type": "json_invalid",
                }
            ],
        )
    },
    401: {
        "unauthorized": _example(
            "No API key sent",
            401,
            "unauthorized",
            "Authentication required",
            "this endpoint needs an API key: send 'Authorization: Bearer <key>' or "
            "'X-API-Key: <key>'",
            "/v1/models",
        )
    },
    403: {
        "forbidden": _example(
            "The API key is not one of CAPPLAN_API_KEYS",
            403,
            "forbidden",
            "Forbidden",
            "the API key is not accepted",
            "/v1/models",
        )
    },
    404: {
        "not-found": _example(
            "No stored entry has this slug",
            404,
            "not-found",
            "Not found",
            "model 'no-such-model' does not exist; GET /v1/models lists the slugs",
            "/v1/models/no-such-model",
        )
    },
    409: {
        "already-exists": _example(
            "The slug is taken",
            409,
            "already-exists",
            "Already exists",
            "a model with slug 'tiny-cnn' exists already; pick another slug or PUT to "
            "/v1/models/{slug} to replace yours",
            "/v1/models",
        ),
        "read-only": _example(
            "A built-in (zoo or catalog) entry cannot be changed",
            409,
            "read-only",
            "Read-only resource",
            "model 'resnet-50' is a built-in zoo model and is read-only; POST a copy under a "
            "new slug to change it",
            "/v1/models/resnet-50",
        ),
        "in-use": _example(
            "Saved workloads still name it",
            409,
            "in-use",
            "Resource in use",
            "model 'tiny-cnn' is used by saved workloads; delete those first",
            "/v1/models/tiny-cnn",
        ),
    },
    412: {
        "stale-version": _example(
            "Someone changed it since you read it",
            412,
            "stale-version",
            "Precondition failed",
            "model 'tiny-cnn' changed since you read it: If-Match \"7\" does not match the "
            'current ETag "1"; GET it again and re-apply your change',
            "/v1/models/tiny-cnn",
        )
    },
    413: {
        "payload-too-large": _example(
            "The body is over CAPPLAN_MAX_REQUEST_BYTES",
            413,
            "payload-too-large",
            "Payload too large",
            too_large_detail(_default("max_request_bytes"), "CAPPLAN_MAX_REQUEST_BYTES"),
            "/v1/models",
        )
    },
    422: {
        "validation-error": _example(
            "A field breaks the schema (every invalid field is listed)",
            422,
            "validation-error",
            "Invalid request",
            "1 invalid field(s): /batch_size: Input should be greater than or equal to 1",
            "/v1/estimates/memory",
            [
                {
                    "pointer": "/batch_size",
                    "location": "body",
                    "message": "Input should be greater than or equal to 1",
                    "type": "greater_than_equal",
                }
            ],
        ),
        "invalid-input": _example(
            "Valid fields that do not go together",
            422,
            "invalid-input",
            "Invalid input",
            "tokens_mean needs a model with a sequence axis (`seq`)",
            "/v1/recommendations/inference",
            [
                {
                    "pointer": "/tokens_mean",
                    "location": "body",
                    "message": "tokens_mean needs a model with a sequence axis (`seq`)",
                    "type": "invalid-input",
                }
            ],
        ),
    },
    428: {
        "if-match-required": _example(
            "A change without If-Match",
            428,
            "if-match-required",
            "Precondition required",
            "model 'tiny-cnn' can only be changed with an If-Match header; GET it and send its "
            'ETag (currently "1") to prove you are editing the latest version',
            "/v1/models/tiny-cnn",
        )
    },
    503: {
        "overloaded": _example(
            "Too many requests in progress (Retry-After: 1)",
            503,
            "overloaded",
            "Overloaded",
            overloaded_detail(_default("max_in_flight"), _default("db_queue_timeout_s")),
            "/v1/estimates/memory",
        ),
        "database-busy": _example(
            "No database slot freed up in time (Retry-After: 1)",
            503,
            "database-busy",
            "Database busy",
            busy(_default("db_queue_timeout_s")).detail,
            "/v1/estimates/memory",
        ),
        "database-unavailable": _example(
            "The database does not answer (Retry-After: 5)",
            503,
            "database-unavailable",
            "Database unavailable",
            unavailable(f"no answer within {_default('db_call_timeout_s'):g} s").detail,
            "/v1/models/llama-2-7b",
        ),
    },
}


# The ONNX upload has its own size limit (CAPPLAN_MAX_IMPORT_BYTES).
IMPORT_TOO_LARGE_EXAMPLES = {
    "import-payload-too-large": _example(
        "The upload is over CAPPLAN_MAX_IMPORT_BYTES",
        413,
        "payload-too-large",
        "Payload too large",
        too_large_detail(_default("max_import_bytes"), "CAPPLAN_MAX_IMPORT_BYTES"),
        "/v1/models/import/onnx",
    )
}


def _budget_example() -> dict[str, Any]:
    # What POST /v1/recommendations/inference answers for an inline graph of 10,000 distinct
    # layers with the default options (every device and MIG slice of the shipped catalog).
    layers, executed = "/architecture/layers", "executed layers"
    precisions = WorkFactor(name="precisions", value=4, field="/precisions")
    batches = WorkFactor(name="batch sizes", value=9, field="/max_batch_size")
    exc = WorkBudgetExceeded(
        work_units(
            WorkFactor(name="graph layers", value=10_000, field=layers),
            WorkFactor(name="devices", value=144, field="/devices"),
            precisions,
            batches,
        )
        + work_units(
            WorkFactor(name=executed, value=10_000, field=layers),
            precisions,
            batches,
            weight=PEAK_LAYER_UNITS,
        ),
        _default("max_work_units"),
        "CAPPLAN_MAX_WORK_UNITS",
    )
    slug, title = TOO_EXPENSIVE
    return _example(
        "More work than CAPPLAN_MAX_WORK_UNITS allows (checked before computing)",
        422,
        slug,
        title,
        str(exc),
        "/v1/recommendations/inference",
        [error.model_dump() for error in budget_errors(exc)],
    )


# The CPU-heavy endpoints (app.api.compute): their own 422 and 503 problems.
COMPUTE_EXAMPLES: dict[int, dict[str, dict[str, Any]]] = {
    422: {
        **PROBLEM_EXAMPLES[422],
        "too-expensive": _budget_example(),
        "too-expensive-deadline": _example(
            "Stopped at CAPPLAN_COMPUTE_TIMEOUT_S (no Retry-After)",
            422,
            TOO_EXPENSIVE[0],
            TOO_EXPENSIVE[1],
            ComputeOverrun("deadline", _default("compute_timeout_s")).detail,
            "/v1/recommendations/inference",
        ),
    },
    503: {
        **PROBLEM_EXAMPLES[503],
        "compute-busy": _example(
            "No compute slot freed up in time (Retry-After: 1)",
            503,
            "compute-busy",
            "Compute busy",
            ComputeBusy(_default("compute_slots"), _default("compute_queue_timeout_s")).detail,
            "/v1/recommendations/inference",
        ),
    },
}


EXAMPLES_REF = "#/components/examples/"


def problem_example_components() -> dict[str, dict[str, Any]]:
    """Every problem example by its name, for the document's components/examples (main.py)."""
    named = [*PROBLEM_EXAMPLES.values(), IMPORT_TOO_LARGE_EXAMPLES, *COMPUTE_EXAMPLES.values()]
    return {name: example for examples in named for name, example in examples.items()}


def problem_responses(
    *statuses: int, examples: Mapping[int, dict[str, dict[str, Any]]] | None = None
) -> dict[int | str, dict[str, Any]]:
    """OpenAPI `responses=` entries declaring problem+json bodies, each with the examples of
    what the service answers with that status (``examples`` replaces some of them)."""
    chosen = {**PROBLEM_EXAMPLES, **(examples or {})}
    known = problem_example_components()
    for status in statuses:
        for name, example in chosen[status].items():
            if known.get(name) is not example:
                raise ValueError(f"problem example {name!r} is not in problem_example_components")
    descriptions = {
        400: "Malformed JSON",
        401: "API key missing",
        403: "API key not accepted",
        404: "Not found",
        409: "Conflict: duplicate slug, read-only entry, or in use",
        412: "If-Match does not match the current ETag",
        413: "Request body over the size limit",
        422: "Invalid input; `errors` lists every invalid field (CPU-heavy endpoints: or "
        "`/problems/too-expensive`, over the work budget or stopped at the compute deadline)",
        428: "If-Match header required",
        503: "Overloaded, the database or the compute slots busy, or the database unavailable "
        "(`Retry-After` says when to retry)",
    }
    # main.py moves these bodies from application/json to application/problem+json.
    return {
        status: {
            "model": Problem,
            "description": descriptions.get(status, "Error"),
            # By reference: one copy of each example in the document (components/examples).
            "content": {
                "application/json": {
                    "examples": {name: {"$ref": f"{EXAMPLES_REF}{name}"} for name in chosen[status]}
                }
            },
        }
        for status in statuses
    }
