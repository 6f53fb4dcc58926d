"""Application factory: routers, error handlers, middleware, lifespan."""

from __future__ import annotations

import gc
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import Depends, FastAPI
from fastapi.middleware.cors import CORSMiddleware

from app.api.auth_gate import AuthGateMiddleware
from app.api.compute import Compute, register_compute_metrics
from app.api.database import Database, register_database_metrics
from app.api.docs import install_docs
from app.api.errors import PROBLEM_JSON, install_error_handlers, problem_example_components
from app.api.inflight import InFlightLimitMiddleware
from app.api.metrics import Metrics, register_pool_metrics
from app.api.middleware import (
    BodySizeLimitMiddleware,
    ImportGateMiddleware,
    RequestContextMiddleware,
)
from app.api.query_guard import reject_unknown_query
from app.api.routes import (
    admission,
    engines,
    estimates,
    hardware,
    imports,
    mig,
    models,
    ops,
    recommendations,
    workloads,
)
from app.config import Settings, get_settings
from app.db.migrations import head_revisions
from app.db.session import PoolOptions, make_engine, make_session_factory

logger = logging.getLogger("app")

DESCRIPTION = """
Capacity Planner answers the questions a platform team asks before a deep-learning job lands
on its hardware: how much memory a model needs to train or serve, whether it fits a GPU or a
MIG slice, and whether inference belongs on a CPU or a GPU. Every error is
`application/problem+json` (RFC 9457). Writes need an API key when keys are configured
(`Authorization: Bearer <key>` or `X-API-Key`) and an `If-Match` ETag when they change an
existing resource.
"""


def _problem_media_types(schema: dict[str, Any]) -> dict[str, Any]:
    """Error responses are problem+json, not application/json; the problem examples they
    refer to are in components/examples."""
    schema.setdefault("components", {})["examples"] = problem_example_components()
    for path in schema.get("paths", {}).values():
        for operation in path.values():
            for code, response in operation.get("responses", {}).items():
                content = response.get("content", {})
                if code[0] in "45" and "application/json" in content:
                    content[PROBLEM_JSON] = content.pop("application/json")
    return schema


def create_app(settings: Settings | None = None) -> FastAPI:
    """Build the ASGI app for ``settings`` (default: the environment's)."""
    settings = settings or get_settings()
    engine = make_engine(
        settings.resolved_database_url,
        PoolOptions(
            pool_size=settings.db_pool_size,
            checkout_timeout_s=settings.db_queue_timeout_s,
            connect_timeout_s=settings.db_connect_timeout_s,
            statement_timeout_s=settings.db_statement_timeout_s,
        ),
    )

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        if not settings.api_key_list:
            logger.warning(
                "OPEN DEV MODE: no API keys configured (CAPPLAN_API_KEYS); writes are open"
            )
        else:
            logger.info("API keys configured: %d; writes need a key", len(settings.api_key_list))
        # Everything imported and built so far (FastAPI, pydantic, SQLAlchemy, the model zoo:
        # ~150,000 objects) lives as long as the process. Moving it out of the collector's
        # generations keeps full collections from scanning it: they took ~75 ms each and were
        # the admission webhook's p99 (benchmarks/admission_load.py).
        gc.collect()
        gc.freeze()
        yield
        engine.dispose()
        app.state.metrics.shutdown()

    app = FastAPI(
        title="Capacity Planner",
        version="0.1.0",
        description=DESCRIPTION,
        lifespan=lifespan,
        # Served by install_docs with local assets (FastAPI's pages load them from CDNs).
        docs_url=None,
        redoc_url=None,
        dependencies=[Depends(reject_unknown_query)],
    )
    app.state.settings = settings
    app.state.engine = engine
    app.state.session_factory = make_session_factory(engine)
    app.state.database = Database(
        app.state.session_factory,
        slots=settings.db_pool_size,
        queue_timeout_s=settings.db_queue_timeout_s,
        call_timeout_s=settings.db_call_timeout_s,
    )
    app.state.head_revisions = head_revisions()
    app.state.metrics = Metrics()
    register_database_metrics(app.state.metrics.registry, app.state.database)
    app.state.compute = Compute(
        slots=settings.compute_slots,
        queue_timeout_s=settings.compute_queue_timeout_s,
        timeout_s=settings.compute_timeout_s,
        budget_units=settings.max_work_units,
    )
    register_compute_metrics(app.state.metrics.registry, app.state.compute)
    register_pool_metrics(app.state.metrics.registry, engine)

    install_error_handlers(app)
    install_docs(app)
    # Routers are matched in order: the admission webhook and MIG fits, the hot paths of a
    # cluster, come first (each router passed costs a match attempt per request).
    app.include_router(ops.router)
    app.include_router(admission.router)
    app.include_router(mig.router)
    app.include_router(hardware.router)
    app.include_router(imports.router)
    app.include_router(models.router)
    app.include_router(estimates.router)
    app.include_router(engines.router)
    app.include_router(workloads.router)
    app.include_router(recommendations.router)
    # Inside the size limit: an ONNX upload waits for its share of the import memory before a
    # byte of it is read.
    app.add_middleware(
        ImportGateMiddleware,
        path=imports.ONNX_PATH,
        max_concurrent=settings.max_concurrent_imports,
        memory_bytes=settings.import_memory_bytes,
        max_body_bytes=settings.max_import_bytes,
        queue_timeout_s=settings.import_queue_timeout_s,
    )
    # Added last = outermost: ids and metrics cover every request, including 413s.
    app.add_middleware(
        BodySizeLimitMiddleware,
        max_bytes=settings.max_request_bytes,
        path_limits={imports.ONNX_PATH: (settings.max_import_bytes, "CAPPLAN_MAX_IMPORT_BYTES")},
    )
    # Outside the size limit: 401/403 come before 413 and before any body byte is received.
    app.add_middleware(AuthGateMiddleware, router=app.router, settings=settings)
    # Inside the request context (shed requests are logged and counted), outside everything else.
    app.add_middleware(
        InFlightLimitMiddleware,
        limit=settings.max_in_flight,
        queue_timeout_s=settings.db_queue_timeout_s,
    )
    if settings.cors_origin_list:
        # Outside the auth gate and the in-flight limit: a browser's preflight carries no API
        # key and must not wait; inside the request context, so preflights are logged too.
        app.add_middleware(
            CORSMiddleware,
            allow_origins=list(settings.cors_origin_list),
            allow_methods=["GET", "POST", "PUT", "DELETE"],
            allow_headers=["Authorization", "X-API-Key", "Content-Type", "If-Match",
                           "X-Request-ID"],
            expose_headers=["ETag", "Location", "Retry-After", "X-Request-ID"],
            allow_credentials=False,  # API keys travel in headers, never in cookies
            max_age=600,
        )  # fmt: skip
    app.add_middleware(RequestContextMiddleware, metrics=app.state.metrics)

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            app.openapi_schema = _problem_media_types(FastAPI.openapi(app))
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
    return app
