"""Events: the job page's "Emit event" form for a job waiting in ctx.wait_for_event (store/events.py)."""

from __future__ import annotations

import json

from dygo.app.dashboard.jobs import _back
from dygo.app.dashboard.rendering import redirect
from dygo.app.dashboard.visitor import Action, Fields
from dygo.app.db import Conn
from dygo.store import events
from dygo.store.errors import EventError
from fastapi import APIRouter
from fastapi.responses import Response

router = APIRouter()


@router.post("/events/emit")
def emit_event(fields: Fields, visitor: Action, conn: Conn) -> Response:
    """Emit `key` with `payload` (JSON text; empty: null), as POST /api/v1/events/{key} does, then back."""
    back = _back(visitor, fields, "/jobs")
    key, text = fields.get("key", ""), fields.get("payload", "").strip()
    try:
        payload = json.loads(text) if text else None
    except ValueError as exc:
        return redirect(visitor, back, f"Event {key!r} not emitted: the payload is not JSON ({exc}).", "error")
    try:
        emitted = events.emit(conn, key, payload)
    except EventError as exc:
        return redirect(visitor, back, f"Event not emitted: {exc}.", "error")
    if emitted.duplicate:
        return redirect(
            visitor,
            back,
            f"Event {key!r} was emitted before: the first emit wins, so nothing changed and no job woke.",
            "error",
        )
    return redirect(visitor, back, f"Event {key!r} emitted: {emitted.woken} waiting job(s) woken.")
