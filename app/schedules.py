"""The schedules API: list and inspect cron schedules, pause, resume, and trigger one now."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any

from dygo.app.db import Conn, ReadConn
from dygo.app.errors import ErrorResponse, documented
from dygo.store import schedules
from fastapi import APIRouter, Path
from pydantic import BaseModel, Field

router = APIRouter(prefix="/api/v1/schedules", tags=["schedules"], responses=documented(401, 403, 503))

ScheduleName = Annotated[str, Path(max_length=255, description="The schedule's name, e.g. 'nightly-report'")]
NOT_FOUND: dict[int | str, dict[str, Any]] = {
    404: {"model": ErrorResponse, "description": "No such schedule (schedule_not_found)"},
}


class LastJob(BaseModel):
    id: int
    state: str | None = Field(description="The job's state now; null when it was deleted")


class Schedule(BaseModel):
    name: str
    spec: str = Field(description="5-field cron or a descriptor such as @hourly")
    description: str = Field(description="The spec in words, e.g. 'every day at 02:30'")
    timezone: str = Field(description="IANA time zone the spec reads in")
    kind: str
    args: dict[str, Any]
    queue: str
    priority: int | None = Field(description="null: the kind's priority")
    max_attempts: int | None = Field(description="null: the kind's max_attempts")
    missed: str = Field(description="After downtime: 'once' fires one catch-up job, 'skip' none")
    status: str = Field(description="active, paused (an operator's hold) or removed (no longer declared)")
    enabled: bool = Field(description="Still declared in code or config/schedules.yml")
    paused: bool
    next_run_at: datetime | None = Field(description="The next occurrence; null unless active")
    last_run_at: datetime | None = Field(description="When it last fired, on schedule or triggered")
    last_job: LastJob | None


class ScheduleList(BaseModel):
    schedules: list[Schedule]


class TriggeredJob(BaseModel):
    id: int
    run_at: datetime | None


class Triggered(BaseModel):
    job: TriggeredJob
    schedule: Schedule


# store.errors.NotFound / Conflict and EnqueueError become 404 / 409 / 422 in app.main's handlers.


@router.get("", response_model=ScheduleList, summary="Every schedule: spec in words, next and last fire, last job")
def list_schedules(conn: ReadConn) -> dict[str, Any]:
    return {"schedules": schedules.list_schedules(conn)}


@router.get("/{name}", response_model=Schedule, responses=NOT_FOUND, summary="One schedule")
def get_schedule(name: ScheduleName, conn: Conn) -> dict[str, Any]:
    return schedules.existing(conn, name)


@router.post(
    "/{name}/pause",
    response_model=Schedule,
    responses=NOT_FOUND,
    summary="Hold the schedule: nothing fires until it is resumed (survives deploys)",
)
def pause_schedule(name: ScheduleName, conn: Conn) -> dict[str, Any]:
    return schedules.pause(conn, name)


@router.post(
    "/{name}/resume",
    response_model=Schedule,
    responses=NOT_FOUND,
    summary="Fire again from the next occurrence after now (paused occurrences are not made up)",
)
def resume_schedule(name: ScheduleName, conn: Conn) -> dict[str, Any]:
    return schedules.resume(conn, name)


@router.post(
    "/{name}/trigger",
    status_code=201,
    response_model=Triggered,
    summary="Enqueue the schedule's job now; its occurrences are unaffected",
    responses={
        **NOT_FOUND,
        409: {"model": ErrorResponse, "description": "No longer declared (schedule_removed)"},
        422: {"model": ErrorResponse, "description": "The job cannot be enqueued (unknown_queue, invalid_args, ...)"},
    },
)
def trigger_schedule(name: ScheduleName, conn: Conn) -> dict[str, Any]:
    job, schedule = schedules.trigger(conn, name)
    return {"job": {"id": job.id, "run_at": job.run_at}, "schedule": schedule}
