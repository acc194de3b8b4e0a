"""The schedules: their list, and pausing, resuming or triggering one now."""

from __future__ import annotations

from dygo.app.dashboard.rendering import redirect, render
from dygo.app.dashboard.visitor import Action, Page
from dygo.app.db import Conn, ReadConn
from dygo.store import schedules
from dygo.store.errors import Conflict, EnqueueError, NotFound
from fastapi import APIRouter, Request
from fastapi.responses import Response

router = APIRouter()


@router.get("/schedules")
def schedules_page(request: Request, visitor: Page, conn: ReadConn) -> Response:
    return render(request, visitor, "schedules.html", schedules=schedules.list_schedules(conn))


@router.post("/schedules/{name}/{action}")
def act_on_schedule(name: str, action: str, visitor: Action, conn: Conn) -> Response:
    back = visitor.prefix + "/schedules"
    try:
        if action == "pause":
            schedules.pause(conn, name)
            return redirect(visitor, back, f"Schedule {name} paused.")
        if action == "resume":
            schedules.resume(conn, name)
            return redirect(visitor, back, f"Schedule {name} resumed from its next occurrence.")
        if action == "trigger":
            job, _ = schedules.trigger(conn, name)
            return redirect(visitor, back, f"Schedule {name} triggered: job {job.id} enqueued.")
    except (NotFound, Conflict, EnqueueError) as exc:
        return redirect(visitor, back, f"Schedule {name}: {exc}", "error")
    return redirect(visitor, back, f"Unknown action {action!r}.", "error")
