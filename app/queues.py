"""/api/v1/queues and /api/v1/stats: counts, daily throughput, and whole-queue operations."""

from __future__ import annotations

from typing import Annotated, Any

import psycopg
from dygo.app.db import Conn, ReadConn, database
from dygo.app.errors import ApiError, documented
from dygo.app.jobs import api_duration
from dygo.app.schemas import DURATION_PATTERN, PurgeReport, Queue, QueueList, QueueStats, RetryDeadReport, VacuumReport
from dygo.store import admin, limits
from dygo.store.durations import parse_duration
from fastapi import APIRouter, Path, Query, Request

router = APIRouter(prefix="/api/v1", tags=["queues"], responses=documented(401, 403, 503))

QueueName = Annotated[str, Path(max_length=255, description="A queue from queues.yml")]
Days = Annotated[int, Query(ge=1, le=90, description="UTC days in the window, today included")]


def _configured(request: Request) -> dict[str, int]:
    concurrency: dict[str, int] = request.app.state.settings.concurrency
    return concurrency


def _queue(request: Request, conn: psycopg.Connection, name: str) -> dict[str, Any]:
    """The queue's view; 404 unless it is configured or still has jobs (a queue since removed)."""
    queue = admin.find_queue(conn, _configured(request), name)
    if queue is None:
        raise ApiError(
            404, "queue_not_found", f"no queue named {name!r}; configured queues: {', '.join(_configured(request))}"
        )
    return queue


def _stats(
    request: Request, conn: psycopg.Connection, queue: str | None, days: int, counts: dict[str, int]
) -> dict[str, Any]:
    if not database(request).reads_replica:
        # Fresh numbers; skipped harmlessly while another process folds. A replica cannot fold: there the
        # figures are what serve's own fold on the primary has replicated.
        admin.fold_stats(conn)
    return {"queue": queue, "counts": counts, **admin.daily_stats(conn, queue, days)}


def _queues_and_limits(conn: psycopg.Connection, configured: dict[str, int]) -> dict[str, Any]:
    in_use = [use.as_dict() for use in limits.limits_in_use(conn)]
    return {"queues": admin.list_queues(conn, configured), "limits": in_use}


# The reads below are counts, which may lag behind the primary: DATABASE_READ_URL's when set. The actions'
# own reads (the queue as a pause or resume left it) stay on the primary.
@router.get("/queues", response_model=QueueList, summary="Every queue with its counts by state")
async def list_queues(request: Request) -> dict[str, Any]:
    pools, configured = database(request), _configured(request)
    if pools.reads_replica:
        return await pools.read(lambda conn: _queues_and_limits(conn, configured))
    async with pools.connection() as conn:
        queues = await admin.alist_queues(conn, configured)
        in_use = [use.as_dict() for use in await limits.alimits_in_use(conn)]
    return {"queues": queues, "limits": in_use}


@router.get(
    "/queues/{name}", response_model=Queue, summary="One queue with its counts by state", responses=documented(404)
)
def get_queue(name: QueueName, request: Request, conn: ReadConn) -> dict[str, Any]:
    return _queue(request, conn, name)


@router.get(
    "/queues/{name}/stats",
    response_model=QueueStats,
    summary="Counts and daily throughput of one queue",
    responses=documented(404, 422),
)
def queue_stats(name: QueueName, request: Request, conn: ReadConn, days: Days = 7) -> dict[str, Any]:
    counts = _queue(request, conn, name)["counts"]
    return _stats(request, conn, name, days, counts)


@router.get(
    "/stats",
    response_model=QueueStats,
    summary="Counts and daily throughput of all queues together",
    responses=documented(422),
)
def all_stats(request: Request, conn: ReadConn, days: Days = 7) -> dict[str, Any]:
    queues = admin.list_queues(conn, _configured(request))
    counts = {state: sum(q["counts"][state] for q in queues) for state in admin.COUNTED_STATES}
    return _stats(request, conn, None, days, counts)


@router.post(
    "/queues/{name}/pause",
    response_model=Queue,
    summary="Stop workers claiming from the queue",
    responses=documented(404),
)
def pause_queue(name: QueueName, request: Request, conn: Conn) -> dict[str, Any]:
    _queue(request, conn, name)
    admin.pause_queue(conn, name)
    return _queue(request, conn, name)


@router.post(
    "/queues/{name}/resume",
    response_model=Queue,
    summary="Let workers claim from the queue again",
    responses=documented(404),
)
def resume_queue(name: QueueName, request: Request, conn: Conn) -> dict[str, Any]:
    _queue(request, conn, name)
    admin.resume_queue(conn, name)
    return _queue(request, conn, name)


@router.post(
    "/queues/{name}/retry-dead",
    response_model=RetryDeadReport,
    summary="Retry every dead job of the queue now",
    responses=documented(404),
)
def retry_dead(name: QueueName, request: Request, conn: Conn) -> dict[str, Any]:
    _queue(request, conn, name)
    return {"queue": name, "retried": admin.retry_dead(conn, name)}


@router.post("/retry-dead", response_model=RetryDeadReport, summary="Retry every dead job of every queue now")
def retry_all_dead(conn: Conn) -> dict[str, Any]:
    return {"queue": None, "retried": admin.retry_dead(conn, None)}


@router.post(
    "/queues/{name}/purge",
    response_model=PurgeReport,
    summary="Delete pending, scheduled and dead jobs (active and paused stay)",
    responses=documented(404),
)
def purge_queue(name: QueueName, request: Request, conn: Conn) -> dict[str, Any]:
    _queue(request, conn, name)
    return {"queue": name, **admin.purge_queue(conn, name)}


@router.post(
    "/queues/{name}/vacuum-dead",
    response_model=VacuumReport,
    summary="Delete the queue's jobs dead for longer than a duration",
    responses=documented(404, 422),
)
def vacuum_dead(
    name: QueueName,
    request: Request,
    conn: Conn,
    older_than: Annotated[
        str,
        Query(
            max_length=32,
            json_schema_extra={"pattern": DURATION_PATTERN},
            description="e.g. '7d', '12h', '30m' or seconds",
        ),
    ],
) -> dict[str, Any]:
    try:
        seconds = parse_duration(api_duration(older_than, "older_than"), field="older_than")
    except ValueError as exc:
        raise ApiError(422, "invalid_duration", str(exc)) from None
    _queue(request, conn, name)
    return {"queue": name, "deleted": admin.vacuum_dead(conn, name, seconds), "older_than_seconds": seconds}
