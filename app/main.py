"""The admin service: a FastAPI app over the store. It never runs jobs.

create_app wires the pieces: the pool, the stats folder, the result waiters (`?wait=`), the error
handlers (every error is `{"error": {"code", "message", "details"}}`, never a stack trace), the
body-size limit, bearer auth, one router per area, `/metrics`, the dashboard, and the OpenAPI
document with each kind's args.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Any

import psycopg
from dygo.app.auth import BearerAuth, Tokens, check_protection
from dygo.app.body_limit import BodyLimit
from dygo.app.dashboard import error_page, install_dashboard, is_dashboard
from dygo.app.db import ReplicaDown, ServePools, down
from dygo.app.docs import install_docs
from dygo.app.errors import coded_response, error_response
from dygo.app.events import router as events_router
from dygo.app.guard import HostRule, Perimeter
from dygo.app.jobs import add_enqueue_routes
from dygo.app.jobs import router as jobs_router
from dygo.app.limits import router as limits_router
from dygo.app.listening import ServeListener, Subscriber
from dygo.app.metrics import install_metrics
from dygo.app.mounting import ApplicationAuth, Authenticate
from dygo.app.openapi import install_openapi
from dygo.app.paths import route_path
from dygo.app.queues import router as queues_router
from dygo.app.schedules import router as schedules_router
from dygo.app.system import router as system_router
from dygo.app.waiting import ResultWaiters
from dygo.app.workflows import router as workflows_router
from dygo.store import admin
from dygo.store.config import Settings, load_settings
from dygo.store.db import database_url as configured_url
from dygo.store.db import direct_url, read_url, through_transaction_pooler
from dygo.store.errors import CodedError, DatabaseUnavailable
from dygo.store.loading import load_jobs
from dygo.store.outage import OutageLog, describe, is_outage
from dygo.store.registry import Registry
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.middleware import Middleware
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import compile_path

from dygo.logs import hidden_tokens

log = logging.getLogger("dygo.serve")

# How often serve folds the stats and timing deltas into their rollups (stats reads fold too).
FOLD_INTERVAL = 30.0


def create_app(
    settings: Settings | None = None,
    jobs: Registry | None = None,
    database_url: str | None = None,
    host: str = "127.0.0.1",
    *,
    authenticate: Authenticate | None = None,
) -> FastAPI:
    """The service; `host` is the address it is bound to, which (with allowed_hosts) decides the Host
    headers it answers (app/guard.py). Without settings, jobs or a database URL, they are read as `dygo serve`
    reads them (config/, its jobs, DATABASE_URL or the embedded server). `authenticate`: the application's
    own sign-in in place of tokens, for an app mounted in another (app/mounting.py)."""
    settings = settings if settings is not None else load_settings()
    jobs = jobs if jobs is not None else load_jobs(settings)
    database_url = database_url if database_url is not None else configured_url(settings)
    if authenticate is None:  # otherwise the application's sign-in protects it
        check_protection(settings, host=None)
    hidden_tokens(token for _, token in settings.api_tokens)  # no token reaches the access log, wherever it is sent

    @asynccontextmanager
    async def lifespan(_: Any) -> AsyncIterator[None]:
        # The service's own state, whichever app runs the lifespan (a parent's, when mounted: app/mounting.py).
        # The pools of this process (app/db.py): settings.serve_pool_size connections at most.
        app.state.db = db = ServePools(database_url, settings.serve_pool_size, app.state.outage, read_url())
        await db.open()
        folder = StatsFolder(db.pool, app.state.outage)
        folder.start()
        # LISTEN needs a session: the direct URL when one is given. Through a transaction pooler
        # without one, notifications cannot be relied on: waiting requests re-read their job every
        # second instead of being woken, and every bearer token is checked in the failed-token table.
        listen_url = direct_url() or database_url
        unreliable = through_transaction_pooler() and direct_url() is None
        app.state.waiters = ResultWaiters(poll=1.0 if unreliable else None)
        # The throttle first: the waiters' LISTEN is then the connection's last statement (what
        # pg_stat_activity shows), once the throttle has caught up.
        subscribers: list[Subscriber] = (
            [app.state.waiters] if unreliable else [app.state.auth_throttle, app.state.waiters]
        )
        listener = ServeListener(listen_url, app.state.outage, subscribers)
        listener.start()
        try:
            yield
        finally:
            await listener.stop()
            folder.stop()
            await db.close()

    auth = (
        Middleware(ApplicationAuth, authenticate=authenticate)
        if authenticate is not None
        else Middleware(BearerAuth, tokens=Tokens(settings.api_tokens))
    )
    app = FastAPI(
        title="dygo",
        version="1",
        lifespan=lifespan,
        docs_url=None,
        redoc_url=None,
        description="Durable background jobs on PostgreSQL: the admin API. "
        'Errors are `{"error": {"code", "message", "details"}}`. No string, anywhere in a body or a parameter '
        "(args and meta included), may hold a NUL character or an unpaired surrogate: PostgreSQL cannot store "
        "them, so they are refused (422 invalid_value).",
        # Outermost first: the perimeter (Host, Origin, headers), bearer auth, then the body limit.
        middleware=[
            Middleware(Perimeter, hosts=HostRule(host, settings.allowed_hosts)),
            auth,
            Middleware(BodyLimit, max_bytes=settings.max_payload_bytes),
        ],
    )
    app.state.settings = settings
    app.state.authenticate = authenticate
    app.state.jobs = jobs
    app.state.outage = OutageLog(log)
    install_error_handlers(app)
    add_enqueue_routes(app)  # first: the busiest routes
    app.include_router(jobs_router)
    app.include_router(queues_router)
    app.include_router(limits_router)
    app.include_router(schedules_router)
    app.include_router(workflows_router)
    app.include_router(events_router)
    app.include_router(system_router)
    install_metrics(app)

    install_dashboard(app)
    install_openapi(app, jobs)
    install_docs(app)
    return app


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(CodedError)
    async def coded_error(_: Request, exc: CodedError) -> JSONResponse:
        # The API's own refusals and the store's (EnqueueError, NotFound, Conflict): each carries its status.
        return coded_response(exc)

    @app.exception_handler(RequestValidationError)
    async def invalid_request(request: Request, exc: RequestValidationError) -> Response:
        if is_dashboard(request):
            return invalid_page(request, exc.errors())
        return validation_error(exc.errors())

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> Response:
        if is_dashboard(request):
            title = "Page not found" if exc.status_code == 404 else "Request refused"
            return error_page(request, exc.status_code, title, str(exc.detail))
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http_error")
        headers = getattr(exc, "headers", None)
        if exc.status_code == 405:  # every method of the path, not only the first route's that matched it
            headers = {**(headers or {}), "Allow": allowed_methods(request)}
        return error_response(exc.status_code, code, str(exc.detail), headers=headers)

    @app.exception_handler(DatabaseUnavailable)
    async def database_unavailable(request: Request, exc: DatabaseUnavailable) -> Response:
        if exc.reason == "down":
            outage = request.app.state.db.read_outage if isinstance(exc, ReplicaDown) else request.app.state.outage
            outage.lost(f"{request.method} {request.url.path}", exc.cause or exc)
        if is_dashboard(request):
            page = (
                error_page(request, 503, "Database unavailable", "The database is not reachable; try again shortly.")
                if exc.reason == "down"
                else error_page(request, 503, "Server busy", "Too many requests at once; try again shortly.")
            )
            page.headers.update(exc.headers or {})
            return page
        return coded_response(exc)

    @app.exception_handler(psycopg.Error)
    async def database_error(request: Request, exc: psycopg.Error) -> Response:
        # An outage is a 503 (store/outage.py); any other database error is this code's or this deployment's
        # (a privilege, the schema): a 500, logged with what the database said.
        if is_outage(exc):
            return await database_unavailable(request, down(exc))
        log.error("%s %s: a database statement failed: %s", request.method, request.url.path, describe(exc))
        return internal_error(request)

    @app.exception_handler(psycopg.DataError)
    async def value_rejected(request: Request, exc: psycopg.DataError) -> Response:
        # A value PostgreSQL cannot store (a NUL character, a number out of range): bad input.
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        if is_dashboard(request):
            return error_page(
                request,
                422,
                "Value refused",
                f"A value in this request cannot be stored or searched by the database: {reason}. "
                "Remove it (a NUL character, say) and try again.",
            )
        return error_response(422, "invalid_value", f"a value was rejected by the database: {reason}")

    @app.exception_handler(Exception)
    async def unexpected(request: Request, exc: Exception) -> Response:
        log.error("unexpected error", exc_info=exc)
        return internal_error(request)


def internal_error(request: Request) -> Response:
    """A 500 that says nothing of the error to the client (the server log has it)."""
    if is_dashboard(request):
        return error_page(
            request, 500, "Something went wrong", "An unexpected error occurred; the server log has the details."
        )
    return error_response(500, "internal_error", "an unexpected error occurred; see the server log")


def invalid_page(request: Request, errors: Sequence[Any]) -> Response:
    """The dashboard's error page for a request whose values do not fit: a path that is no page (a job id that
    is not a number) is a 404, anything else a 422 naming each field."""
    if any(e["loc"][:1] == ("path",) for e in errors):
        return error_page(
            request, 404, "Page not found", "There is no such page: the address is not one of the dashboard's."
        )
    fields = "; ".join(f"{e['loc'][-1]}: {e['msg']}" for e in errors)
    return error_page(request, 422, "Value refused", f"A value in this request is not valid: {fields}.")


def allowed_methods(request: Request) -> str:
    """The methods the OpenAPI document gives every path that matches the request's (for a 405's Allow
    header): the document lists each route's, whether the route is the app's own or an included router's."""
    methods: set[str] = set()
    for path, operations in request.app.openapi()["paths"].items():
        if compile_path(path)[0].match(route_path(request.scope)):
            methods |= {method.upper() for method in operations}
    return ", ".join(sorted(methods))


def validation_error(errors: Sequence[Any]) -> JSONResponse:
    """400 for a body that is not JSON at all; 422 for JSON that does not fit, naming each field."""
    details = [{"loc": list(e["loc"]), "msg": e["msg"], "type": e["type"]} for e in errors]
    types = {e["type"] for e in errors}
    if "json_invalid" in types:
        return error_response(400, "invalid_json", "the request body is not valid JSON", details)
    if all(t.startswith(("datetime", "timezone")) for t in types):
        return error_response(
            422,
            "invalid_timestamp",
            "a timestamp is invalid; use ISO 8601 with a timezone, e.g. 2030-01-02T03:04:05Z",
            details,
        )
    return error_response(422, "invalid_request", "the request body or parameters are invalid", details)


class StatsFolder:
    """Folds the stats and timing deltas into their rollups every FOLD_INTERVAL, in a daemon thread."""

    def __init__(self, pool: Any, outage: OutageLog) -> None:
        self.pool = pool
        self.outage = outage
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._run, name="dygo-stats-folder", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        self.stopping.set()
        self.thread.join(timeout=5)

    def _run(self) -> None:
        while not self.stopping.wait(FOLD_INTERVAL):
            try:
                with self.pool.connection() as conn:
                    admin.fold_stats(conn)
                self.outage.back()
            except (psycopg.Error, OSError) as exc:
                # Serve answers requests whatever the stats thread meets; an error that is not an outage is
                # said at each pass, naming it, as the next pass meets it again unless someone fixes it.
                if is_outage(exc):
                    self.outage.lost("folding stats", exc)
                else:
                    log.error("folding stats failed (retrying in %gs): %s", FOLD_INTERVAL, describe(exc))
