"""Swagger UI and ReDoc served by the service itself: no CDN, no web font, no external host.

FastAPI's built-in `/docs` and `/redoc` pages load their JavaScript, CSS and favicon from
jsDelivr and ReDoc's fonts from Google Fonts, so they are blank pages on an air-gapped cluster.
The same pages are served here with the assets of the ``fastapi-offline`` package (Swagger UI's
``swagger-ui-dist`` and ReDoc's standalone bundle, MIT), mounted under ``STATIC_URL``.

Like FastAPI's own pages these are plain Starlette routes: they carry no auth guard, so they stay
open (as `/openapi.json` does) when ``CAPPLAN_REQUIRE_AUTH_FOR_READS`` closes the API's reads.
"""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path

from fastapi import FastAPI
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html
from fastapi.staticfiles import StaticFiles
from starlette.requests import Request
from starlette.responses import HTMLResponse

DOCS_URL = "/docs"
REDOC_URL = "/redoc"
STATIC_URL = "/static/docs"
ASSETS_DIR = Path(str(files("fastapi_offline") / "static"))
ASSETS = ("swagger-ui-bundle.js", "swagger-ui.css", "redoc.standalone.js", "favicon.png")

# Swagger UI otherwise sends the document to validator.swagger.io for its "valid" badge.
SWAGGER_UI_PARAMETERS = {"validatorUrl": None}


def _check_assets() -> None:
    missing = [name for name in ASSETS if not (ASSETS_DIR / name).is_file()]
    if missing:
        raise RuntimeError(f"offline API docs: {missing} missing from {ASSETS_DIR}")


def install_docs(app: FastAPI) -> None:
    """Serve `/docs` (Swagger UI) and `/redoc` (ReDoc) with local assets; ``app`` must be built
    with ``docs_url=None, redoc_url=None`` (FastAPI's pages would load them from CDNs)."""
    if app.docs_url is not None or app.redoc_url is not None:
        raise ValueError("build the app with docs_url=None and redoc_url=None")
    if app.openapi_url is None:
        raise ValueError("the doc pages need the app's OpenAPI schema (openapi_url)")
    _check_assets()
    openapi_url = app.openapi_url
    app.mount(STATIC_URL, StaticFiles(directory=ASSETS_DIR), name="docs-assets")

    async def swagger_ui(request: Request) -> HTMLResponse:
        root = request.scope.get("root_path", "")
        return get_swagger_ui_html(
            openapi_url=f"{root}{openapi_url}",
            title=f"{app.title} - Swagger UI",
            swagger_js_url=f"{root}{STATIC_URL}/swagger-ui-bundle.js",
            swagger_css_url=f"{root}{STATIC_URL}/swagger-ui.css",
            swagger_favicon_url=f"{root}{STATIC_URL}/favicon.png",
            oauth2_redirect_url=None,  # the API has no OAuth2 flow
            swagger_ui_parameters=SWAGGER_UI_PARAMETERS,
        )

    async def redoc(request: Request) -> HTMLResponse:
        root = request.scope.get("root_path", "")
        return get_redoc_html(
            openapi_url=f"{root}{openapi_url}",
            title=f"{app.title} - ReDoc",
            redoc_js_url=f"{root}{STATIC_URL}/redoc.standalone.js",
            redoc_favicon_url=f"{root}{STATIC_URL}/favicon.png",
            with_google_fonts=False,
        )

    app.add_route(DOCS_URL, swagger_ui, include_in_schema=False)
    app.add_route(REDOC_URL, redoc, include_in_schema=False)
