"""/api/v1/events: emit an event (an admin token), or through a signed callback URL (no token: its signature
is the credential, app/auth.py lets the path through). store/events.py tells the rules."""

from __future__ import annotations

from typing import Annotated, Any

from dygo.app.db import Conn
from dygo.app.errors import documented
from dygo.store import events
from fastapi import APIRouter, Body, Path, Query
from pydantic import BaseModel, Field

router = APIRouter(prefix="/api/v1", tags=["events"], responses=documented(413, 503))

EventKey = Annotated[
    str,
    Path(
        max_length=events.MAX_KEY,
        # Documented, and checked by the store, whose refusal names the rule (invalid_event).
        json_schema_extra={"pattern": events.KEY_PATTERN},
        description="The event's key (e.g. order:42): at most 200 characters, no '/' and no control characters",
    ),
]
Payload = Annotated[
    Any,
    Body(description="The event's payload, any JSON (what the waits return); no body: null"),
]


class EventEmitted(BaseModel):
    woken: int = Field(description="Jobs moved from waiting to pending by this emit")
    duplicate: bool = Field(
        description="The key was emitted before: the first emit wins, so this one changed nothing and woke nobody"
    )


@router.post(
    "/events/{key}",
    response_model=EventEmitted,
    summary="Emit an event: wake the jobs waiting for its key (the first emit of a key wins)",
    responses=documented(401, 403, 422),
)
def emit_event(key: EventKey, conn: Conn, payload: Payload = None) -> dict[str, Any]:
    emitted = events.emit(conn, key, payload)
    return {"woken": emitted.woken, "duplicate": emitted.duplicate}


@router.post(
    "/events/{key}/callback",
    response_model=EventEmitted,
    summary="Emit an event through its callback URL (dygo.callback_url): no token, a signature of the key",
    description="The URL comes from `ctx.callback_url(key)` or `dygo.callback_url(key)`, signed with "
    "DYGO_SECRET_KEY. 403 `bad_signature` when `sig` is not the key's, 403 `callbacks_disabled` when this "
    "server has no DYGO_SECRET_KEY.",
    responses={
        403: {
            **documented(403)[403],
            "description": "The signature does not match the key (bad_signature), or this server has no "
            "DYGO_SECRET_KEY (callbacks_disabled)",
        },
        **documented(422),
    },
)
def emit_by_callback(
    key: EventKey,
    sig: Annotated[str, Query(max_length=100, description="The signature the callback URL carries")],
    conn: Conn,
    payload: Payload = None,
) -> dict[str, Any]:
    events.check_callback(key, sig)
    emitted = events.emit(conn, key, payload)
    return {"woken": emitted.woken, "duplicate": emitted.duplicate}
