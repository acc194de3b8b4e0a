"""Signing in with an API token and signing out; failed sign-ins count against the address in the same
throttle as failed bearer tokens (app/throttle.py)."""

from __future__ import annotations

import math
import time
from datetime import UTC, datetime

from dygo.app.dashboard.rendering import redirect, render
from dygo.app.dashboard.visitor import Anyone, Fields, Visitor, checked_form
from dygo.app.db import Conn
from dygo.app.throttle import AuthThrottle
from fastapi import APIRouter, Request
from fastapi.responses import RedirectResponse, Response

router = APIRouter()


def _next_page(visitor: Visitor, value: str | None) -> str:
    home = visitor.prefix + "/"
    return value if value and value.startswith(home) and "//" not in value else home


@router.get("/login")
def login_page(request: Request, visitor: Anyone, next: str | None = None) -> Response:
    if not visitor.signs_in:
        return RedirectResponse(visitor.prefix + "/", status_code=303)
    return render(request, visitor, "login.html", next=_next_page(visitor, next))


def _in_words(seconds: float) -> str:
    """'45 seconds', '1 minute', '5 minutes' (rounded up: never sooner than said)."""
    if seconds < 60:
        count, unit = max(1, math.ceil(seconds)), "second"
    else:
        count, unit = math.ceil(seconds / 60), "minute"
    return f"{count} {unit}{'s' * (count != 1)}"


def _locked_out(request: Request, visitor: Visitor, until: float) -> Response:
    wait = max(1, math.ceil(until - time.time()))
    at = datetime.fromtimestamp(until, UTC).strftime("%H:%M:%S UTC")
    throttle: AuthThrottle = request.app.state.auth_throttle
    response = render(
        request,
        visitor,
        "error.html",
        status=429,
        title="Too many failed sign-ins",
        message=f"There were too many failed sign-ins within {_in_words(throttle.window)}, from your address "
        f"({throttle.attempts}) or from all addresses together ({throttle.global_attempts}), so signing in "
        "from it is paused. Try again in "
        f"{_in_words(wait)} (at {at}); check that you paste the whole API token.",
    )
    response.headers["Retry-After"] = str(wait)
    return response


@router.post("/login")
def login(request: Request, fields: Fields, visitor: Anyone, conn: Conn) -> Response:
    if visitor.external:  # the application signs its users in
        return RedirectResponse(visitor.prefix + "/", status_code=303)
    throttle: AuthThrottle = request.app.state.auth_throttle
    address = request.client.host if request.client else "unknown"
    if visitor.tokens.enabled and (until := throttle.locked_until_on(conn, address)) is not None:
        return _locked_out(request, visitor, until)  # even a right token: guessing must not pay off
    checked_form(fields, visitor)
    token = fields.get("token", "").strip()
    role = visitor.tokens.role_of(token) if visitor.tokens.enabled else "admin"
    if role is None:
        if (until := throttle.failed_on(conn, address)) is not None:
            return _locked_out(request, visitor, until)
        return render(
            request,
            visitor,
            "login.html",
            status=401,
            next=_next_page(visitor, fields.get("next")),
            error="That token is not valid.",
        )
    if visitor.tokens.enabled:
        throttle.succeeded_on(conn, address)
        visitor.start(conn, role, token)
    return redirect(visitor, _next_page(visitor, fields.get("next")), f"Signed in ({role}).")


@router.post("/logout")
def logout(fields: Fields, visitor: Anyone, conn: Conn) -> Response:
    checked_form(fields, visitor)
    visitor.end(conn)
    return redirect(visitor, visitor.prefix + "/login", "Signed out.")
