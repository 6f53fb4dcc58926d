"""Operational endpoints: liveness, readiness, metrics."""

from __future__ import annotations

import logging
from typing import Literal

import anyio.to_thread
from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse
from prometheus_client import CONTENT_TYPE_LATEST
from pydantic import Field
from sqlalchemy import text
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session

from app.api.database import DatabaseUnavailable
from app.api.deps import DatabaseDep
from app.api.errors import problem_response, problem_responses
from app.db.migrations import schema_check
from app.db.schema_compat import SchemaCheck
from app.schemas.base import Schema

router = APIRouter(tags=["operations"])
logger = logging.getLogger("app.ops")


class Health(Schema):
    """Liveness answer."""

    status: str = Field(description="`ok` while the process serves requests.", examples=["ok"])


class Readiness(Schema):
    """Readiness answer."""

    status: str = Field(description="`ready` when the service can do its work.", examples=["ready"])
    database: str = Field(description="Database backend in use.", examples=["sqlite"])
    migration: list[str] = Field(
        description="Alembic revision(s) the database is at.", examples=[["0001"]]
    )
    code_revision: list[str] = Field(
        description="The migration head(s) this code ships. The database may be newer during "
        "a rolling upgrade or after a rollback: migrations are expand-only within a release, so "
        "this code serves any schema that still has every table and column it uses.",
        examples=[["0006"]],
    )
    schema_status: Literal["current", "newer"] = Field(
        description="`current`: the database is at this code's head. `newer`: a later release "
        "migrated it and this code can still use it (rolling upgrade or rollback).",
        examples=["current"],
    )


_HEALTHY = b'{"status":"ok"}'


@router.get("/healthz", response_model=Health, summary="Liveness")
async def healthz() -> Response:
    """The process is alive: answered on the event loop, touching neither the database nor the
    worker threads, so it stays fast while the database is down or every slot is busy."""
    return Response(_HEALTHY, media_type="application/json")


def _schema_check(session: Session) -> SchemaCheck:
    session.execute(text("SELECT 1"))
    return schema_check(session.connection())


@router.get(
    "/readyz",
    response_model=Readiness,
    responses=problem_responses(503),
    summary="Readiness",
)
async def readyz(request: Request, db: DatabaseDep) -> Readiness | JSONResponse:
    """The database answers (within CAPPLAN_DB_QUEUE_TIMEOUT_S, queueing like any request) and
    this code can use its schema: at this code's migration head, or at a later release's
    revision that still has every table and column this code maps (expand-then-contract, so
    old pods stay ready through a rolling upgrade and after `kubectl rollout undo`). A schema
    behind the code, unmigrated or missing something the code needs is a 503 saying which."""
    engine = request.app.state.engine
    try:
        check = await db.run(_schema_check, timeout_s=db.queue_timeout_s)
    except (DatabaseUnavailable, SQLAlchemyError) as exc:
        logger.warning("readiness: database unreachable: %s", type(exc).__name__)
        return problem_response(
            request, 503, "not-ready", "Not ready", "the database is not reachable"
        )
    if not check.ready:
        return problem_response(request, 503, "not-ready", "Not ready", check.describe())
    return Readiness(
        status="ready",
        database=engine.dialect.name,
        migration=list(check.database_revisions),
        code_revision=list(check.code_revisions),
        schema_status="current" if check.status == "current" else "newer",
    )


@router.get(
    "/metrics",
    summary="Prometheus metrics",
    response_class=Response,
    responses={200: {"content": {CONTENT_TYPE_LATEST: {}}, "description": "Metrics."}},
)
async def metrics(request: Request) -> Response:
    """Prometheus text format: requests and latency per route, admission decisions by outcome
    and reason, cache lookups (hit or miss), database slots, pool and failures, and process
    metrics labelled by `pid`. With several worker processes every counter is the total over
    all workers and every gauge the sum over the live ones, whichever worker answers."""
    payload = await anyio.to_thread.run_sync(request.app.state.metrics.render)
    return Response(content=payload, media_type=CONTENT_TYPE_LATEST)
