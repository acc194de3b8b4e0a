"""Who is asking and what they may do: the session cookie, the role, the CSRF check, and the dependencies
every page (`Page`) and every action (`Action`) of the dashboard declares."""

from __future__ import annotations

import hmac
from typing import Annotated
from urllib.parse import parse_qsl

import psycopg
from dygo.app.auth import Tokens
from dygo.app.session import SESSION_COOKIE, SESSION_SECONDS, Session, Signer
from dygo.store import auth_state
from fastapi import Depends, Request
from fastapi.responses import Response
from starlette.types import Scope

# Every dashboard URL starts here, below the app's own mount point, and its cookies are scoped to it.
PREFIX = "/dashboard"
# Where create_app(authenticate=...) leaves the role the application's own authentication gave a request.
ROLE_KEY = "dygo.role"


def dashboard_prefix(scope: Scope) -> str:
    """The dashboard's path as the browser sees it: PREFIX below the path the app is mounted at (an ASGI
    root_path: `app.mount("/jobs", ...)` or a proxy's `--root-path`), so every link, form action, redirect
    and cookie path is right wherever the app is mounted."""
    root: str = scope.get("root_path", "")
    return root.rstrip("/") + PREFIX


class Refused(Exception):
    """Rendered as a friendly HTML page with this status, never a stack trace."""

    def __init__(self, status: int, title: str, message: str) -> None:
        self.status, self.title, self.message = status, title, message
        super().__init__(message)


class LoginRequired(Exception):
    """A page asked for while signed out: answered with a redirect to the login page."""


class Visitor:
    """Who is asking, from the session cookie. `verify` (every page and action, through the `visitor`
    dependency) checks a signed-in session against the database and the configured tokens; error pages
    skip it (they show nothing)."""

    def __init__(self, request: Request) -> None:
        state = request.app.state
        self.state = state
        self.tokens: Tokens = state.dashboard_tokens
        self.signer: Signer = state.dashboard_signer
        found = Session.read(self.signer, request.cookies.get(SESSION_COOKIE))
        self.session = found or Session.new()
        self.fresh = found is None
        self.secure = request.url.scheme == "https"
        self.prefix = dashboard_prefix(request.scope)
        # The application's own authentication (create_app(authenticate=...)) in place of tokens and sign-in.
        self.external = state.authenticate is not None
        self.external_role: str | None = request.scope.get(ROLE_KEY)

    async def verify(self) -> None:
        """Signed out, or its token rotated out: a fresh, anonymous session. On the event loop, with the
        hot async pool: a page's thread never waits for a connection (app/db.py)."""
        session = self.session
        if session.role is None or not self.tokens.enabled or self.external:
            return
        if self.tokens.role_of_fingerprint(session.token) == session.role:
            async with self.state.db.connection() as conn:
                if await auth_state.asession_role(conn, session.sid) == session.role:
                    return
        self.session, self.fresh = Session.new(), True

    @property
    def role(self) -> str | None:
        if self.external:
            return self.external_role
        return self.session.role if self.tokens.enabled else "admin"

    @property
    def signs_in(self) -> bool:
        """Whether the dashboard has its own sign-in (tokens configured, no application authentication)."""
        return self.tokens.enabled and not self.external

    @property
    def can_act(self) -> bool:
        return self.role == "admin"

    @property
    def csrf(self) -> str:
        return self.signer.csrf_token(self.session.sid)

    def start(self, conn: psycopg.Connection, role: str, token: str) -> None:
        """A new session id at login, so a session id planted before it is worthless after; recorded in
        the database, where signing out deletes it."""
        self.session, self.fresh = Session.new(role, self.tokens.fingerprint(token)), True
        auth_state.start_session(conn, self.session.sid, role, self.session.expires)

    def end(self, conn: psycopg.Connection) -> None:
        if self.session.role is not None and self.tokens.enabled:
            auth_state.end_session(conn, self.session.sid)
        self.session, self.fresh = Session.new(), True

    def keep(self, response: Response) -> Response:
        if self.fresh:
            response.set_cookie(
                SESSION_COOKIE,
                self.session.dump(self.signer),
                max_age=SESSION_SECONDS,
                path=self.prefix,
                httponly=True,
                samesite="lax",
                secure=self.secure,
            )
        return response


async def any_visitor(request: Request) -> Visitor:
    """The visitor of a page anyone may see (the login page): signed in or not."""
    visitor = Visitor(request)
    await visitor.verify()
    return visitor


async def signed_in(request: Request) -> Visitor:
    """The visitor of a page: logged in, or sent to the login page."""
    visitor = await any_visitor(request)
    if visitor.role is None:
        raise LoginRequired()
    return visitor


async def form_fields(request: Request) -> dict[str, str]:
    """An application/x-www-form-urlencoded body (every dashboard form is one)."""
    body = (await request.body()).decode("utf-8", "replace")
    return dict(parse_qsl(body, keep_blank_values=True))


def checked_form(fields: dict[str, str], visitor: Visitor) -> dict[str, str]:
    presented = fields.get("csrf", "").encode("utf-8", "surrogateescape")
    if visitor.fresh or not hmac.compare_digest(presented, visitor.csrf.encode()):
        raise Refused(
            403,
            "This form has expired",
            "The form was not sent from this dashboard session (missing or stale CSRF token). "
            "Go back, reload the page and try again.",
        )
    return fields


def acting(
    fields: Annotated[dict[str, str], Depends(form_fields)], visitor: Annotated[Visitor, Depends(signed_in)]
) -> Visitor:
    """The visitor of an action: a checked CSRF token and an admin role."""
    checked_form(fields, visitor)
    if not visitor.can_act:
        raise Refused(
            403,
            "Read-only access",
            "You are signed in with a read-only token; changing jobs, queues or schedules needs an admin token.",
        )
    return visitor


Anyone = Annotated[Visitor, Depends(any_visitor)]
Page = Annotated[Visitor, Depends(signed_in)]
Action = Annotated[Visitor, Depends(acting)]
Fields = Annotated[dict[str, str], Depends(form_fields)]
