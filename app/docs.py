"""/docs (Swagger UI) and /redoc, from pinned copies of their bundles served by this service.

FastAPI's defaults load floating versions (`swagger-ui-dist@5`, `redoc@2`) from a CDN into pages on the
dashboard's origin. The `fastapi-offline` package ships the bundles (its version, pinned in
pyproject.toml, pins theirs); they are served under /docs/static, and the pages' Content-Security-Policy
(app/guard.py) lets scripts come from this origin only.
"""

from __future__ import annotations

from pathlib import Path

import fastapi_offline
from fastapi import FastAPI, Request
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html
from fastapi.responses import HTMLResponse
from fastapi.staticfiles import StaticFiles

ASSETS = Path(fastapi_offline.__file__).resolve().parent / "static"
ASSETS_URL = "/docs/static"


def install_docs(app: FastAPI) -> None:
    """Call with FastAPI(docs_url=None, redoc_url=None)."""
    app.mount(ASSETS_URL, StaticFiles(directory=str(ASSETS)), name="docs-static")
    openapi_url = app.openapi_url or "/openapi.json"

    # The pages' URLs start at the app's mount point (root_path), as FastAPI's own /docs does; the document
    # itself names that point as its server, so "Try it out" calls the mounted API.
    @app.get("/docs", include_in_schema=False)
    def swagger_ui(request: Request) -> HTMLResponse:
        root = request.scope.get("root_path", "").rstrip("/")
        return get_swagger_ui_html(
            openapi_url=root + openapi_url,
            title=f"{app.title} API",
            swagger_js_url=f"{root}{ASSETS_URL}/swagger-ui-bundle.js",
            swagger_css_url=f"{root}{ASSETS_URL}/swagger-ui.css",
            swagger_favicon_url=f"{root}{ASSETS_URL}/favicon.png",
        )

    @app.get("/redoc", include_in_schema=False)
    def redoc(request: Request) -> HTMLResponse:
        root = request.scope.get("root_path", "").rstrip("/")
        return get_redoc_html(
            openapi_url=root + openapi_url,
            title=f"{app.title} API",
            redoc_js_url=f"{root}{ASSETS_URL}/redoc.standalone.js",
            redoc_favicon_url=f"{root}{ASSETS_URL}/favicon.png",
            with_google_fonts=False,
        )
