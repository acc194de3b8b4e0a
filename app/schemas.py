"""Request and response bodies of the API (they are also its OpenAPI document)."""

from __future__ import annotations

from datetime import date, datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictFloat, StrictInt, StrictStr

JobState = Literal["scheduled", "pending", "active", "succeeded", "dead", "paused", "cancelled"]

# --- enqueue ---------------------------------------------------------------------------------------


class EnqueueOptions(BaseModel):
    """Everything an enqueue may say besides the kind and its args."""

    model_config = ConfigDict(extra="forbid")

    queue: str | None = Field(None, description="A configured queue; defaults to the kind's queue")
    # Strict: JSON true is not 1, and "5" is not a number.
    priority: StrictInt | None = Field(None, description="Higher runs first; -1000 to 1000 (default: the kind's)")
    run_at: datetime | None = Field(None, description="When to run: an ISO 8601 timestamp with a timezone")
    delay: StrictStr | StrictInt | StrictFloat | None = Field(
        None, description="Run after this long on the database clock: '30s', '5m', '2h', '1d' or seconds. "
        "Not with run_at")
    max_attempts: StrictInt | None = Field(None, description="1 to 1000 (default: the kind's, else the configured one, "
                                           "resolved by the worker at the first lease)")
    meta: dict[str, str] = Field(default_factory=dict, description="String map handed to the handler as ctx.meta")
    idempotency_key: str | None = Field(None, description="While a live job (pending, scheduled, active, paused) "
                                        "holds this key, the enqueue returns that job instead (200, deduplicated)")
    idempotency_ttl: StrictStr | StrictInt | StrictFloat | None = Field(
        None, description="Hold the key this long even after the job finished, e.g. '1h' (needs idempotency_key)")


class EnqueueRequest(EnqueueOptions):
    """One job. The per-kind variants in this document show each registered kind's args."""

    kind: str = Field(description="A job kind, e.g. 'email.send'. A kind not registered in this service "
                      "needs an explicit queue")
    args: dict[str, Any] = Field(default_factory=dict, description="Validated against the kind's args model")


class BatchRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    jobs: list[EnqueueRequest] = Field(description="Enqueued all or nothing, at most max_batch_size")


class Enqueued(BaseModel):
    id: int
    deduplicated: bool = Field(description="True when an idempotency key matched an existing job, whose id this is")
    run_at: datetime | None = Field(description="When the job is due (absent for a deduplicated batch entry)")


class BatchEnqueued(BaseModel):
    jobs: list[Enqueued] = Field(description="In the order of the request")


# --- jobs ------------------------------------------------------------------------------------------


class JobSummary(BaseModel):
    id: int
    kind: str
    queue: str
    args: dict[str, Any]
    meta: dict[str, str]
    state: JobState
    priority: int
    run_at: datetime
    attempt: int = Field(description="Attempts started so far (the running one included)")
    max_attempts: int | None = Field(description="null until the first lease, when a job enqueued without one "
                                     "gets its kind's max_attempts, else default_max_attempts")
    enqueued_at: datetime
    started_at: datetime | None = Field(description="When the latest attempt was claimed")
    finished_at: datetime | None
    last_error: str | None


class AttemptError(BaseModel):
    attempt: int
    at: datetime
    started_at: datetime | None = None
    worker: str | None = None
    error: str
    traceback: str | None = None


class Progress(BaseModel):
    fraction: float = Field(description="0 to 1, as the handler last reported it (ctx.progress)")
    message: str | None
    attempt: int = Field(description="The attempt that reported it")
    at: datetime = Field(description="When the worker wrote it (at most once a second per job)")


class Job(JobSummary):
    result: Any = Field(description="What the handler returned, once succeeded")
    progress: Progress | None = Field(None, description="The latest progress the handler reported, if any")
    errors: list[AttemptError] = Field(description="Every failed attempt, oldest first")
    failed_at: datetime | None = Field(None, description="When its latest failed attempt ended (null: none failed)")
    reap_count: int = Field(description="Times its lease expired and it was recovered")
    lease_owner: str | None
    lease_deadline: datetime | None
    idempotency_key: str | None


class JobPage(BaseModel):
    jobs: list[JobSummary]
    next_cursor: str | None = Field(description="Pass as ?cursor= for the next page; null at the end. A page can "
                                    "hold fewer jobs than the limit and still have a next page "
                                    "(see the manual, docs/reference/http-api.md)")


# --- queues and stats ------------------------------------------------------------------------------


class QueueCounts(BaseModel):
    pending: int
    scheduled: int
    active: int
    paused: int
    dead: int
    cancelled: int


class Queue(BaseModel):
    name: str
    concurrency: int | None = Field(description="Per worker process, from queues.yml (null: no longer configured)")
    paused: bool = Field(description="Workers do not claim from a paused queue")
    paused_at: datetime | None
    counts: QueueCounts
    succeeded_today: int = Field(description="Jobs of the queue that succeeded today (UTC), from the stats rollups: "
                                 "succeeded rows are history, not counted among the states")


class QueueList(BaseModel):
    queues: list[Queue]


class DailyCount(BaseModel):
    day: date
    enqueued: int
    succeeded: int
    failed: int = Field(description="Failed attempts (retried or not)")
    dead: int
    reaped: int = Field(description="Expired leases recovered")


class StatTotals(BaseModel):
    enqueued: int
    succeeded: int
    failed: int
    dead: int
    reaped: int


class QueueStats(BaseModel):
    queue: str | None = Field(description="null: every queue")
    counts: QueueCounts
    days: int
    totals: StatTotals = Field(description="Sums over the window")
    daily: list[DailyCount] = Field(description="One entry per UTC day, oldest first, zero-filled")


class RetryDeadReport(BaseModel):
    queue: str | None = Field(description="null: every queue (POST /api/v1/retry-dead)")
    retried: int


class PurgeReport(BaseModel):
    queue: str
    pending: int
    scheduled: int
    dead: int
    active_left: int = Field(description="Running jobs, left to their workers")
    paused_left: int = Field(description="Paused jobs, left where the operator parked them")


class VacuumReport(BaseModel):
    queue: str
    deleted: int
    older_than_seconds: float


# --- system ----------------------------------------------------------------------------------------


class Worker(BaseModel):
    id: str = Field(description="<hostname>:<pid>:<random>")
    hostname: str
    pid: int
    queues: dict[str, int] = Field(description="Queue name -> concurrency in that process")
    started_at: datetime
    last_seen_at: datetime


class WorkerList(BaseModel):
    workers: list[Worker]


class Health(BaseModel):
    status: Literal["ok"]


class Ready(BaseModel):
    status: Literal["ready"]
    schema_version: int


class NukeReport(BaseModel):
    jobs: int
    idempotency_keys: int
    stats_rows: int
    queue_pauses: int
