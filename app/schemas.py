"""Request and response bodies of the API (they are also its OpenAPI document)."""

from __future__ import annotations

import re
from datetime import date, datetime
from typing import Annotated, Any, Literal

from dygo.store.config import parse_rate
from dygo.store.enqueue import MAX_KEY_LENGTH
from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StrictFloat,
    StrictInt,
    StrictStr,
    WithJsonSchema,
)
from pydantic_core import PydanticCustomError

JobState = Literal["scheduled", "pending", "active", "succeeded", "dead", "paused", "cancelled"]

# What the API takes as a duration in a string (a query parameter, delay, idempotency_ttl): a whole number
# and a unit, at most a year (the limit of each unit's digits keeps it there). The document says so, and
# app.jobs.api_duration refuses anything else with 422 invalid_duration, so the two agree exactly.
_AMOUNT = (
    "(?:[1-9][0-9]{0,9}ms|[1-9][0-9]{0,6}s?|[1-9][0-9]{0,4}m|[1-9][0-9]{0,2}h"
    "|(?:[1-9][0-9]?|[12][0-9]{2}|3[0-5][0-9]|36[0-6])d)"
)
DURATION_PATTERN = f"^(?:0(?:ms|s|m|h|d)?|{_AMOUNT})$"
POSITIVE_DURATION_PATTERN = f"^{_AMOUNT}$"
# `?wait=`: at most 60 seconds.
WAIT_PATTERN = "^(?:0(?:ms|s|m)?|[1-9][0-9]{0,3}ms|[1-5][0-9]{4}ms|60000ms|[1-9]s?|[1-5][0-9]s?|60s?|1m)$"
MAX_DURATION_SECONDS = 366 * 86400

# --- enqueue ---------------------------------------------------------------------------------------
# Rules store.enqueue enforces (with its own error codes), written into the document only: the
# field's non-null alternative gets them. Pydantic does not check them, so the codes stay the store's.


def _non_null(schema: dict[str, Any]) -> list[dict[str, Any]]:
    return [branch for branch in schema.get("anyOf", [schema]) if branch.get("type") != "null"]


def _documented_range(low: int, high: int):
    def extra(schema: dict[str, Any]) -> None:
        for branch in _non_null(schema):
            branch.update(minimum=low, maximum=high)

    return extra


def _documented_length(low: int, high: int):
    def extra(schema: dict[str, Any]) -> None:
        for branch in _non_null(schema):
            branch.update(minLength=low, maxLength=high)

    return extra


def _documented_duration(pattern: str, minimum: float | None):
    def extra(schema: dict[str, Any]) -> None:
        for branch in _non_null(schema):
            if branch.get("type") == "string":
                branch["pattern"] = pattern
            else:
                branch.update(maximum=MAX_DURATION_SECONDS)
                if minimum is None:
                    branch["exclusiveMinimum"] = 0
                else:
                    branch["minimum"] = minimum

    return extra


def _whole_number(value: Any) -> Any:
    """JSON Schema's integer: 38.0 is one, as the document says (true and "5" are not)."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


def _timestamp_text(value: Any) -> Any:
    """run_at is an ISO 8601 string, as the document says: not a number of seconds since 1970."""
    if value is not None and not isinstance(value, str | datetime):
        raise PydanticCustomError("datetime_type", "run_at must be an ISO 8601 timestamp string")
    return value


WholeNumber = Annotated[StrictInt, BeforeValidator(_whole_number)]
Timestamp = Annotated[datetime, BeforeValidator(_timestamp_text)]


class EnqueueOptions(BaseModel):
    """Everything an enqueue may say besides the kind and its args."""

    model_config = ConfigDict(extra="forbid")

    queue: str | None = Field(None, description="A configured queue; defaults to the kind's queue")
    # Strict: JSON true is not 1, and "5" is not a number.
    priority: WholeNumber | None = Field(
        None,
        description="Higher runs first; -1000 to 1000 (default: the kind's)",
        json_schema_extra=_documented_range(-1000, 1000),
    )
    run_at: Timestamp | None = Field(None, description="When to run: an ISO 8601 timestamp with a timezone")
    delay: StrictStr | StrictInt | StrictFloat | None = Field(
        None,
        description="Run after this long on the database clock: '30s', '5m', '2h', '1d' or seconds, at most "
        "a year. Not with run_at",
        json_schema_extra=_documented_duration(DURATION_PATTERN, 0),
    )
    max_attempts: WholeNumber | None = Field(
        None,
        json_schema_extra=_documented_range(1, 1000),
        description="1 to 1000 (default: the kind's, else the configured one, "
        "resolved by the worker at the first lease)",
    )
    meta: dict[str, str] = Field(default_factory=dict, description="String map handed to the handler as ctx.meta")
    idempotency_key: str | None = Field(
        None,
        description="While a live job (pending, scheduled, active, paused) "
        "holds this key, the enqueue returns that job instead (200, deduplicated). "
        f"1 to {MAX_KEY_LENGTH} characters",
        json_schema_extra=_documented_length(1, MAX_KEY_LENGTH),
    )
    idempotency_ttl: StrictStr | StrictInt | StrictFloat | None = Field(
        None,
        description="Hold the key this long even after the job finished, e.g. '1h' (needs idempotency_key)",
        json_schema_extra=_documented_duration(POSITIVE_DURATION_PATTERN, None),
    )


class EnqueueRequest(EnqueueOptions):
    """One job. The per-kind variants in this document show each registered kind's args."""

    kind: str = Field(
        description="A job kind, e.g. 'email.send'. A kind not registered in this service needs an explicit queue"
    )
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
    max_attempts: int | None = Field(
        description="null until the first lease, when a job enqueued without one "
        "gets its kind's max_attempts, else default_max_attempts"
    )
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
    next_cursor: str | None = Field(
        description="Pass as ?cursor= for the next page; null at the end. A page can "
        "hold fewer jobs than the limit and still have a next page "
        "(see the manual, docs/reference/http-api.md)"
    )


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
    succeeded_today: int = Field(
        description="Jobs of the queue that succeeded today (UTC), from the stats rollups: "
        "succeeded rows are history, not counted among the states"
    )


class FlowLimit(BaseModel):
    scope: Literal["queue", "kind"]
    name: str
    key: str | None = Field(description="meta.<field> for a limit per value of that field, else null")
    concurrency_limit: int | None = Field(description="At most this many jobs active at once across all workers")
    rate_limit: str | None = Field(description="At most N starts in any interval of the window: N/s, N/m or N/h")
    in_use: int = Field(description="Jobs active now under the limit (all keys)")
    in_use_by_key: dict[str, int] | None = Field(description="Active jobs per key value, for a per-key limit")
    started_in_window: int = Field(description="Starts in the rate window ending now (all keys)")
    waiting: int = Field(description="Ready jobs held back because their limit is full (waiting on a limit)")


class FlowLimitList(BaseModel):
    limits: list[FlowLimit]


# A rate limit the API takes: N/s, N/m or N/h with N from 1 to config.MAX_RATE_COUNT (10^9), ASCII only. The
# schema states it as this pattern; the validator checks the same pattern and, when it fails, answers with
# the config file's message for the rule broken (store/config.py parse_rate), naming the field. A `pattern=`
# constraint would answer "String should match pattern ..." instead.
RATE_LIMIT_PATTERN = r"^ *0*([1-9][0-9]{0,8}|1000000000) */ *[smh] *$"


def _rate_limit(value: Any) -> Any:
    if isinstance(value, str) and not re.fullmatch(RATE_LIMIT_PATTERN, value):
        try:
            parse_rate(value)
        except ValueError as exc:
            raise PydanticCustomError("rate_limit_invalid", str(exc)) from None
        raise PydanticCustomError(
            "rate_limit_invalid",
            f'rate_limit {value!r} must be a count per unit: "100/s", "600/m" or "10000/h" (ASCII digits and spaces)',
        )
    return value


RateLimit = Annotated[
    str,
    Field(max_length=32),
    AfterValidator(_rate_limit),
    WithJsonSchema({"type": "string", "maxLength": 32, "pattern": RATE_LIMIT_PATTERN}),
]


class FlowLimitChange(BaseModel):
    model_config = ConfigDict(extra="forbid")
    concurrency_limit: int | None = Field(None, ge=1, le=1_000_000, description="null: no concurrency limit")
    rate_limit: RateLimit | None = Field(
        None, description="N/s, N/m or N/h, N from 1 to 1,000,000,000; null: no rate limit"
    )
    key: str | None = Field(
        None,
        pattern=r"^meta\.[A-Za-z0-9_.-]+$",
        max_length=255,
        description="meta.<field>: a limit per value of that field; null: one limit",
    )


class QueueList(BaseModel):
    queues: list[Queue]
    limits: list[FlowLimit] = Field(
        default_factory=list, description="The cluster-wide limits with their use (as GET /api/v1/limits)"
    )


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
