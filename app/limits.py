"""/api/v1/limits: the cluster-wide concurrency and rate limits with their current use, and changing
them at runtime (every worker claims under the change within a second: store/limits.py)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from dygo.app.db import Conn, database
from dygo.app.errors import ApiError, documented
from dygo.app.schemas import FlowLimit, FlowLimitChange, FlowLimitList
from dygo.store import limits
from fastapi import APIRouter, Path, Request

router = APIRouter(prefix="/api/v1", tags=["queues"], responses=documented(401, 403, 503))

Scope = Annotated[Literal["queue", "kind"], Path(description="What the limit applies to: a queue or a job kind")]
Name = Annotated[str, Path(max_length=255, description="The queue's or the kind's name")]


async def limits_view(request: Request) -> list[dict[str, Any]]:
    async with database(request).connection() as conn:
        return [use.as_dict() for use in await limits.alimits_in_use(conn)]


@router.get("/limits", response_model=FlowLimitList, summary="Every cluster-wide limit with its current use")
async def list_limits(request: Request) -> dict[str, Any]:
    return {"limits": await limits_view(request)}


@router.put(
    "/limits/{scope}/{name}",
    response_model=FlowLimit,
    responses=documented(400, 404, 422),
    summary="Change a queue's or a kind's cluster-wide limits now (a field left out keeps its value, null removes)",
)
def set_limit(scope: Scope, name: Name, change: FlowLimitChange, request: Request, conn: Conn) -> dict[str, Any]:
    settings = request.app.state.settings
    if scope == "queue" and name not in settings.queues:
        raise ApiError(
            404, "queue_not_found", f"no queue named {name!r}; configured queues: {', '.join(settings.queues)}"
        )
    if scope == "kind" and request.app.state.jobs.get(name) is None:
        raise ApiError(404, "kind_not_found", f"no job kind named {name!r} is registered")
    try:
        limits.change_limit(conn, scope, name, change.changes(), list(settings.queues))
    except limits.LimitChangeError as exc:
        raise ApiError(422, "invalid_limit", str(exc), {"field": exc.field}) from None
    found = [use.as_dict() for use in limits.limits_in_use(conn) if (use.scope, use.name) == (scope, name)]
    empty = {
        "scope": scope,
        "name": name,
        "key": None,
        "concurrency_limit": None,
        "rate_limit": None,
        "rate_burst": None,
        "in_use": 0,
        "in_use_by_key": None,
        "started_in_window": 0,
        "waiting": 0,
    }
    return found[0] if found else empty
