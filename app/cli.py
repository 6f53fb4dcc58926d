"""Command line: serve, migrate, catalog sync/validate, OpenAPI export."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from app.config import Settings, get_settings
from app.logs import configure_logging

if TYPE_CHECKING:
    from fastapi import FastAPI


def _migrate(settings: Settings) -> int:
    from app.db.migrations import upgrade_to_head

    try:
        check = upgrade_to_head(settings.resolved_database_url)
    except RuntimeError as exc:
        print(f"migrate: {exc} ({_safe_url(settings)})", file=sys.stderr)
        return 1
    if not check.ready:
        print(f"migrate: {check.describe()} ({_safe_url(settings)})", file=sys.stderr)
        return 1
    print(f"{check.describe()} ({_safe_url(settings)})")
    return 0


def _safe_url(settings: Settings) -> str:
    from sqlalchemy.engine import make_url

    return make_url(settings.resolved_database_url).render_as_string(hide_password=True)


def _catalog_sync(settings: Settings) -> int:
    from app.db.migrations import schema_check
    from app.db.session import make_engine, make_session_factory
    from app.services.catalog import CatalogError, load_catalog, sync_catalog
    from app.services.zoo import sync_zoo

    try:
        entries = load_catalog(settings.catalog_dir)
    except CatalogError as exc:
        print(f"catalog invalid: {exc}", file=sys.stderr)
        return 1
    engine = make_engine(settings.resolved_database_url)
    try:
        with engine.connect() as connection:
            check = schema_check(connection)
        if not check.ready:
            print(f"catalog sync: {check.describe()}", file=sys.stderr)
            return 1
        with make_session_factory(engine)() as session:
            report = sync_catalog(session, entries)
            zoo_report = sync_zoo(session)
    finally:
        engine.dispose()
    print(f"catalog sync: {report.summary()}")
    print(f"model zoo sync: {zoo_report.summary()}")
    for slug in report.skipped_user_owned:
        print(f"  kept user-owned profile '{slug}' (catalog entry with that slug not loaded)")
    for line in report.repaired:
        print(f"  repaired from the catalog file (emptied by a downgrade?): {line}")
    for line in report.not_repaired:
        print(f"  user-owned, not repaired (restate with PUT /v1/hardware/{{slug}}): {line}")
    return 0


def _catalog_validate(settings: Settings) -> int:
    from app.services.catalog import CatalogError, load_catalog

    try:
        entries = load_catalog(settings.catalog_dir)
    except CatalogError as exc:
        print(f"catalog invalid: {exc}", file=sys.stderr)
        return 1
    print(f"catalog valid: {len(entries)} devices")
    return 0


def catalog_schema_document() -> str:
    """JSON Schema of a `hardware_catalog/*.yaml` file (what `schema.json` must contain)."""
    from app.schemas.hardware import CatalogFile

    return json.dumps(CatalogFile.model_json_schema(), indent=2, sort_keys=True) + "\n"


def _write_or_print(document: str, output: str | None) -> int:
    if output:
        Path(output).write_text(document, encoding="utf-8")
        print(f"wrote {output}")
    else:
        sys.stdout.write(document)
    return 0


def openapi_document(settings: Settings | None = None) -> str:
    """The app's OpenAPI schema as YAML (what `openapi.yaml` must contain)."""
    from app.main import create_app

    app = create_app(settings or Settings(database_url="sqlite://"))
    schema = json.loads(json.dumps(app.openapi()))
    return yaml.safe_dump(schema, sort_keys=False, allow_unicode=True, width=100)


def worker_app() -> FastAPI:
    """The app of one ``serve`` worker process (uvicorn imports this factory in each worker;
    settings come from the environment, and the worker logs JSON like the parent)."""
    from app.main import create_app

    settings = get_settings()
    configure_logging(settings.log_level)
    return create_app(settings)


def _serve(settings: Settings, host: str | None, port: int | None, workers: int | None) -> int:
    configure_logging(settings.log_level)
    count = workers or settings.workers
    # Before the workers start (they read it when they import prometheus_client): with several
    # workers each writes its metrics to PROMETHEUS_MULTIPROC_DIR and /metrics adds them up
    # (app.api.metrics). The directory is emptied first and a temporary one removed at exit.
    from app.api.metrics import prepare_multiprocess_dir

    cleanup = prepare_multiprocess_dir(count)
    try:
        import uvicorn

        from app.api.http_server import HTTP_PROTOCOL
        from app.main import create_app

        def run(target: Any, **extra: Any) -> None:
            uvicorn.run(
                target,
                host=host or settings.host,
                port=port or settings.port,
                log_config=None,
                proxy_headers=True,
                # Requests the HTTP parser rejects get problem+json 400s; the request head is
                # bounded before it is parsed (414/431, 408 after CAPPLAN_HEADER_TIMEOUT_S).
                http=HTTP_PROTOCOL,
                ssl_certfile=str(settings.ssl_certfile) if settings.ssl_certfile else None,
                ssl_keyfile=str(settings.ssl_keyfile) if settings.ssl_keyfile else None,
                **extra,
            )

        if count > 1:
            # Worker processes import the app themselves; settings come from the environment.
            run("app.cli:worker_app", factory=True, workers=count)
        else:
            run(create_app(settings))
    finally:
        cleanup()
    return 0


def main(argv: list[str] | None = None) -> int:
    """Entry point of `capplan-server`."""
    parser = argparse.ArgumentParser(prog="capplan-server", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="run the API with uvicorn")
    serve.add_argument("--host", help="bind address (default CAPPLAN_HOST or 127.0.0.1)")
    serve.add_argument("--port", type=int, help="port (default CAPPLAN_PORT or 8000)")
    serve.add_argument(
        "--workers", type=int, help="worker processes (default CAPPLAN_WORKERS or 1)"
    )
    sub.add_parser("migrate", help="apply Alembic migrations up to head")
    sub.add_parser(
        "catalog-sync",
        help="load hardware_catalog/ and the built-in model zoo into the database (idempotent)",
    )
    sub.add_parser("catalog-validate", help="validate hardware_catalog/ without a database")
    export = sub.add_parser("openapi", help="print the OpenAPI schema as YAML")
    export.add_argument("--output", "-o", help="write to this file instead of stdout")
    schema = sub.add_parser("catalog-schema", help="print the catalog file JSON Schema")
    schema.add_argument("--output", "-o", help="write to this file instead of stdout")
    args = parser.parse_args(argv)

    settings = get_settings()
    if args.command == "serve":
        return _serve(settings, args.host, args.port, args.workers)
    if args.command == "migrate":
        return _migrate(settings)
    if args.command == "catalog-sync":
        return _catalog_sync(settings)
    if args.command == "catalog-validate":
        return _catalog_validate(settings)
    if args.command == "catalog-schema":
        return _write_or_print(catalog_schema_document(), args.output)
    return _write_or_print(openapi_document(), args.output)


if __name__ == "__main__":
    raise SystemExit(main())
