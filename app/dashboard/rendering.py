"""Pages, redirects and error pages: every dashboard response is one of these three, so each carries the
session cookie it needs and shows (then clears) the flash message of the action before it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from dygo.app.dashboard.filters import FILTERS
from dygo.app.dashboard.visitor import Visitor
from dygo.app.session import FLASH_COOKIE
from dygo.store import admin
from fastapi import Request
from fastapi.responses import RedirectResponse, Response
from fastapi.templating import Jinja2Templates

# The repository's templates/ folder; installed, the package dygo.templates beside dygo.app.
TEMPLATES = Path(__file__).resolve().parent.parent.parent / "templates"

templates = Jinja2Templates(directory=str(TEMPLATES))
templates.env.filters.update(FILTERS)


def render(request: Request, visitor: Visitor, template: str, status: int = 200, **context: Any) -> Response:
    flash = visitor.signer.loads(request.cookies.get(FLASH_COOKIE))
    response = templates.TemplateResponse(
        request,
        template,
        {
            "visitor": visitor,
            "csrf": visitor.csrf,
            "flash": flash,
            "prefix": visitor.prefix,
            "replica": replica(request),
            **context,
        },
        status_code=status,
    )
    if flash is not None:
        response.delete_cookie(FLASH_COOKIE, path=visitor.prefix)
    return visitor.keep(response)


def replica(request: Request) -> dict[str, float | None] | None:
    """When the page read from DATABASE_READ_URL: how far that server is behind its primary (None: unknown,
    it is not a replica in recovery)."""
    conn = getattr(request.state, "replica", None)
    return None if conn is None else {"lag": admin.replica_lag(conn)}


def redirect(visitor: Visitor, to: str, message: str, level: str = "ok") -> Response:
    response = RedirectResponse(to, status_code=303)
    response.set_cookie(
        FLASH_COOKIE,
        visitor.signer.dumps({"message": message, "level": level}),
        max_age=60,
        path=visitor.prefix,
        httponly=True,
        samesite="lax",
        secure=visitor.secure,
    )
    return visitor.keep(response)


def error_page(request: Request, status: int, title: str, message: str) -> Response:
    visitor = Visitor(request)  # unverified: from exception handlers, maybe with the database down
    return templates.TemplateResponse(
        request,
        "error.html",
        {
            "visitor": visitor,
            "csrf": visitor.csrf,
            "flash": None,
            "prefix": visitor.prefix,
            "title": title,
            "message": message,
        },
        status_code=status,
    )
