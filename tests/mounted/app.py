"""A user's FastAPI application with dygo's admin mounted under /jobs, behind the application's own sign-in
(docs/guides/mounting.md includes it). Run: `uvicorn tests.mounted.app:app` with DATABASE_URL and
DYGO_CONFIG_DIR set."""

from __future__ import annotations

from dygo.app import create_app, mount
from fastapi import FastAPI, Request
from fastapi.responses import RedirectResponse, Response

# --8<-- [start:mount]
SESSIONS = {"staff-session": "admin", "viewer-session": "read"}  # the application's own sign-in


def staff_only(request: Request) -> str | None:
    """The role of the signed-in user: "admin", "read", or None (refused)."""
    return SESSIONS.get(request.cookies.get("session", ""))


app = FastAPI()
mount(app, "/jobs", create_app(authenticate=staff_only))  # mounts it and runs its start-up in app's
# --8<-- [end:mount]


@app.get("/login/{who}")
def log_in(who: str) -> Response:
    """Stands for the application's real sign-in page."""
    response = RedirectResponse("/jobs/", status_code=303)
    response.set_cookie("session", f"{who}-session", httponly=True, samesite="lax")
    return response


@app.get("/")
def home() -> dict[str, str]:
    return {"app": "the user's own"}
