"""The admin app inside another application: mounted under a path, behind that application's own sign-in.

`create_app(authenticate=...)` takes a callable given each request (a Starlette `Request`), sync or async,
which answers with the request's role: "admin" (or True) may do everything, "read" may look (GET and HEAD on
the API, the dashboard without its action buttons), None (or False) is refused. It may also answer with a
Response of its own (a redirect to the application's sign-in page, say), sent as it is, or raise an
HTTPException, answered with its status. The callable then replaces dygo's bearer tokens and the dashboard's
sign-in; every path of the app goes through it, assets and the OpenAPI document included, except the signed
callback URLs of events, whose signature is their credential (app/events.py).

Starlette runs the lifespan of the outermost application only, so a mounted app's pools would never open:
`mount(parent, "/jobs", admin)` mounts it and runs its start-up and shut-down inside the parent's; `running(admin)`
is the same as an async context manager, for a parent whose lifespan the caller writes.
"""

from __future__ import annotations

import inspect
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import asynccontextmanager
from typing import Any, Literal

from dygo.app.auth import READ_METHODS, _protected, signed
from dygo.app.dashboard import error_page, is_dashboard
from dygo.app.dashboard.visitor import ROLE_KEY
from dygo.app.errors import error_response
from dygo.app.paths import route_path
from fastapi import FastAPI
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send

Role = Literal["admin", "read"]
Verdict = Role | bool | Response | None
Authenticate = Callable[[Request], Verdict | Awaitable[Verdict]]


class ApplicationAuth:
    """Pure ASGI middleware asking the application's `authenticate` about every request (in place of
    app.auth.BearerAuth); the role it gives is left in the scope for the dashboard (app/dashboard/visitor.py)."""

    def __init__(self, app: ASGIApp, authenticate: Authenticate) -> None:
        self.app, self.authenticate = app, authenticate

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or signed(route_path(scope)):
            await self.app(scope, receive, send)
            return
        request = Request(scope, receive)
        try:
            verdict = self.authenticate(request)
            if inspect.isawaitable(verdict):
                verdict = await verdict
        except HTTPException as exc:
            await _refusal(request, exc.status_code, str(exc.detail), exc.headers)(scope, receive, send)
            return
        if isinstance(verdict, Response):
            await verdict(scope, receive, send)
            return
        role = _role(verdict)
        if role is None:
            await _refusal(request, 401, "this application's sign-in did not let this request in")(scope, receive, send)
            return
        if role == "read" and scope["method"] not in READ_METHODS and _protected(route_path(scope)):
            message = "this sign-in is read-only; this operation needs the admin role"
            await _refusal(request, 403, message)(scope, receive, send)
            return
        scope[ROLE_KEY] = role
        await self.app(scope, receive, send)


def _role(verdict: Any) -> Role | None:
    if verdict is True or verdict == "admin":
        return "admin"
    if verdict == "read":
        return "read"
    if verdict is None or verdict is False:
        return None
    raise TypeError(
        f"authenticate returned {verdict!r}: it must return 'admin', 'read', True, False, None or a Response"
    )


def _refusal(request: Request, status: int, message: str, headers: Mapping[str, str] | None = None) -> Response:
    if is_dashboard(request):
        title = "Sign-in required" if status == 401 else "Request refused"
        page = error_page(request, status, title, message[:1].upper() + message[1:] + ".")
        page.headers.update(headers or {})
        return page
    code = {401: "unauthorized", 403: "forbidden"}.get(status, "refused")
    return error_response(status, code, message, headers=dict(headers) if headers else None)


@asynccontextmanager
async def running(admin: FastAPI) -> AsyncIterator[None]:
    """The admin app's start-up and shut-down (its database pools, listener, stats folder), for an app that is
    mounted: the parent's lifespan enters this around its own."""
    async with admin.router.lifespan_context(admin):
        yield


def mount(parent: Starlette, path: str, admin: FastAPI) -> None:
    """`parent.mount(path, admin)`, with the admin app's start-up and shut-down run inside the parent's."""
    parent.mount(path, admin)
    own = parent.router.lifespan_context

    @asynccontextmanager
    async def lifespan(app: Any) -> AsyncIterator[Any]:
        async with running(admin), own(app) as state:
            yield state

    parent.router.lifespan_context = lifespan
