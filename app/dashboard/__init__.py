"""The dashboard: server-rendered pages under /dashboard over the same store functions as the API.

Who may do what follows app.auth: with no token configured (development only) the dashboard is
open with admin rights; otherwise a visitor logs in with an API token, and a `read` token sees
every page but no action buttons, and is refused if it posts anyway. Every form carries a CSRF
token; every action redirects back with a flash message saying what changed.

One module per page area, as the JSON API has one router per area: login (sign-in, sign-out),
overview, jobs (list, one job, bulk actions, dead letters), workflows (list, graph, node actions),
queues (limits, purge, vacuum), schedules and events (emit); visitor (session, role, CSRF), rendering (pages,
redirects, error pages) and filters (the templates' filters) serve them all. This module wires them into the app.
"""

from __future__ import annotations

from urllib.parse import urlencode

from dygo.app.auth import Tokens
from dygo.app.dashboard import events, jobs, login, overview, queues, schedules, workflows
from dygo.app.dashboard.rendering import TEMPLATES, error_page
from dygo.app.dashboard.visitor import PREFIX, LoginRequired, Refused, dashboard_prefix
from dygo.app.paths import route_path
from dygo.app.session import Signer, secret_key
from dygo.app.throttle import AuthThrottle
from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import FileResponse, RedirectResponse, Response
from fastapi.staticfiles import StaticFiles

__all__ = ["PREFIX", "LoginRequired", "Refused", "error_page", "install_dashboard", "is_dashboard", "router"]

router = APIRouter(prefix=PREFIX, include_in_schema=False)
for area in (login, overview, jobs, workflows, queues, schedules, events):
    router.include_router(area.router)


def install_dashboard(app: FastAPI) -> None:
    tokens = app.state.settings.api_tokens
    key = secret_key(tokens)
    app.state.dashboard_tokens = Tokens(tokens, key)
    app.state.dashboard_signer = Signer(key)
    settings = app.state.settings
    app.state.auth_throttle = AuthThrottle(
        app.state,
        settings.failed_token_limit,  # shared with app.auth.BearerAuth
        settings.failed_token_window,
        settings.failed_token_global_limit,
    )
    app.mount(PREFIX + "/static", StaticFiles(directory=str(TEMPLATES / "static")), name="dashboard-static")
    app.include_router(router)

    @app.get("/", include_in_schema=False)
    def home(request: Request) -> Response:
        return RedirectResponse(dashboard_prefix(request.scope) + "/", status_code=307)

    # Browsers ask for /favicon.ico on a first visit whatever the page links, so it answers with the
    # pages' own <link rel=icon> (SVG, which every current browser shows) rather than a 404.
    @app.get("/favicon.ico", include_in_schema=False)
    def favicon() -> Response:
        return FileResponse(
            TEMPLATES / "static" / "favicon.svg",
            media_type="image/svg+xml",
            headers={"Cache-Control": "public, max-age=86400"},
        )

    @app.exception_handler(LoginRequired)
    async def login_required(request: Request, _: LoginRequired) -> Response:
        target = request.url.path + ("?" + request.url.query if request.url.query else "")
        return RedirectResponse(
            f"{dashboard_prefix(request.scope)}/login?" + urlencode({"next": target}), status_code=303
        )

    @app.exception_handler(Refused)
    async def refused(request: Request, exc: Refused) -> Response:
        return error_page(request, exc.status, exc.title, exc.message)


def is_dashboard(request: Request) -> bool:
    path = route_path(request.scope)  # below the app's mount point
    return path == PREFIX or path.startswith(PREFIX + "/")
