"""Operational endpoints: liveness, readiness, metrics."""

from __future__ import annotations

import logging

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
from app.db.migrations import current_revisions
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


_HEALTHY = b'{"status":"ok"}'


@router.get("/healthz", response_model=Health, summary="Liveness")
async def healthz() -> Response:
    """The process is alive: answered on the event loop, touching neither the database nor the
    worker threads, so it stays fast while the database is down or every slot is busy."""
    return Response(_HEALTHY, media_type="application/json")


def _revisions(session: Session) -> set[str]:
    session.execute(text("SELECT 1"))
    return current_revisions(session.connection())


@router.get(
    "/readyz",
    response_model=Readiness,
    responses=problem_responses(503),
    summary="Readiness",
)
async def readyz(request: Request, db: DatabaseDep) -> Readiness | JSONResponse:
    """The database answers (within CAPPLAN_DB_QUEUE_TIMEOUT_S, queueing like any request) and
    its schema is at the migration head the code expects."""
    engine = request.app.state.engine
    try:
        current = await db.run(_revisions, timeout_s=db.queue_timeout_s)
    except (DatabaseUnavailable, SQLAlchemyError) as exc:
        logger.warning("readiness: database unreachable: %s", type(exc).__name__)
        return problem_response(
            request, 503, "not-ready", "Not ready", "the database is not reachable"
        )
    expected: set[str] = request.app.state.head_revisions
    if current != expected:
        return problem_response(
            request,
            503,
            "not-ready",
            "Not ready",
            f"database schema is at {sorted(current) or 'no revision'}, code expects "
            f"{sorted(expected)}; run `capplan-server migrate`",
        )
    return Readiness(status="ready", database=engine.dialect.name, migration=sorted(current))


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
