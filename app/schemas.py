"""Request and response bodies of the API (they are also its OpenAPI document)."""

from __future__ import annotations

from collections.abc import Callable
from datetime import date, datetime
from typing import Annotated, Any, Literal

from dygo.store.config import MAX_CONCURRENCY_LIMIT, MAX_LIMIT_KEY_LENGTH, MAX_RATE_COUNT, RATE_PATTERN, parse_rate
from dygo.store.durations import MAX_SECONDS, duration_pattern
from dygo.store.enqueue import ATTEMPTS_RANGE, MAX_KEY_LENGTH, PRIORITY_RANGE
from dygo.store.registry import KIND_PATTERN, MAX_KIND_LENGTH
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

# store.admin.STATES: 'waiting' and 'skipped' are a workflow's (store/workflows.py).
JobState = Literal["scheduled", "pending", "active", "succeeded", "dead", "paused", "cancelled", "waiting", "skipped"]

# What the API takes as a duration in a string (a query parameter, delay, idempotency_ttl): config's own
# grammar (store/durations.py), at most a year. The document states it as the pattern the grammar writes of
# itself, and app.jobs.api_duration refuses anything else with 422 invalid_duration, so the two agree exactly.
DURATION_PATTERN = duration_pattern()
POSITIVE_DURATION_PATTERN = duration_pattern(positive=True)
# `?wait=`: at most 60 seconds, in units that hold 60 seconds a whole number of times.
WAIT_PATTERN = duration_pattern(most=60, units=("ms", "s", "m"))
MAX_DURATION_SECONDS = MAX_SECONDS

# --- enqueue ---------------------------------------------------------------------------------------
# Rules store.enqueue enforces (with its own error codes), written into the document only: the
# field's non-null alternative gets them. Pydantic does not check them, so the codes stay the store's.


def _non_null(schema: dict[str, Any]) -> list[dict[str, Any]]:
    return [branch for branch in schema.get("anyOf", [schema]) if branch.get("type") != "null"]


def _documented_range(low: int, high: int) -> Callable[[dict[str, Any]], None]:
    def extra(schema: dict[str, Any]) -> None:
        for branch in _non_null(schema):
            branch.update(minimum=low, maximum=high)

    return extra


def _documented_length(low: int, high: int) -> Callable[[dict[str, Any]], None]:
    def extra(schema: dict[str, Any]) -> None:
        for branch in _non_null(schema):
            branch.update(minLength=low, maxLength=high)

    return extra


def _documented_duration(pattern: str, minimum: float | None) -> Callable[[dict[str, Any]], None]:
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


# Every kind, registered or not, is a dotted name: a metrics label, a log field and a dashboard heading.
JobKind = Annotated[
    str,
    Field(
        pattern=KIND_PATTERN.pattern,
        max_length=MAX_KIND_LENGTH,
        description="A job kind, a dotted name like 'email.send'. A kind not registered in this service needs an "
        "explicit queue",
    ),
]


class JobOptions(BaseModel):
    """Where, when and how a job runs: what an enqueue and a workflow's node may say besides the kind and args."""

    model_config = ConfigDict(extra="forbid")

    queue: str | None = Field(None, description="A configured queue; defaults to the kind's queue")
    # Strict: JSON true is not 1, and "5" is not a number.
    priority: WholeNumber | None = Field(
        None,
        description=f"Higher runs first; {PRIORITY_RANGE[0]} to {PRIORITY_RANGE[1]} (default: the kind's)",
        json_schema_extra=_documented_range(*PRIORITY_RANGE),
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
        json_schema_extra=_documented_range(*ATTEMPTS_RANGE),
        description=f"{ATTEMPTS_RANGE[0]} to {ATTEMPTS_RANGE[1]} (default: the kind's, else the configured one, "
        "resolved by the worker at the first lease)",
    )
    meta: dict[str, str] = Field(default_factory=dict, description="String map handed to the handler as ctx.meta")


class EnqueueOptions(JobOptions):
    """Everything an enqueue may say besides the kind and its args."""

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

    kind: JobKind
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


class SleepingOn(BaseModel):
    step: str = Field(description="The sleep's key (`ctx.sleep` name and occurrence, e.g. 'cool-off#1')")
    wake_at: datetime = Field(description="When the sleep ends; the job's run_at is then or later")


class Job(JobSummary):
    result: Any = Field(description="What the handler returned, once succeeded")
    progress: Progress | None = Field(None, description="The latest progress the handler reported, if any")
    errors: list[AttemptError] = Field(description="Every failed attempt, oldest first")
    failed_at: datetime | None = Field(None, description="When its latest failed attempt ended (null: none failed)")
    reap_count: int = Field(description="Times its lease expired and it was recovered")
    lease_owner: str | None
    lease_deadline: datetime | None
    idempotency_key: str | None
    node_id: int | None = Field(None, description="A workflow's job: its node (null for a job outside any workflow)")
    workflow_id: int | None = Field(None, description="A workflow's job: its workflow (GET /api/v1/workflows/{id})")
    node: str | None = Field(None, description="A workflow's job: its node's name")
    parent_id: int | None = Field(
        None, description="A child job (`ctx.call`, `ctx.map`): its parent job; null for any other job"
    )
    parent_step: str | None = Field(None, description="A child job: the parent's step that waits for it ('ship#1')")
    parent_index: int | None = Field(
        None, description="A child job: its place in that step's list (0 for a call; a map's input order)"
    )
    sleeping: SleepingOn | None = Field(
        None,
        description="A scheduled job whose latest step is a sleep not yet over (`ctx.sleep`); null otherwise, "
        "and always null in the answers of the actions",
    )


class Step(BaseModel):
    key: str = Field(description="The step's name and occurrence in a run: 'charge#1', 'charge#2'")
    name: str
    occurrence: int = Field(description="1 for the first call of its name in a run, 2 for the second...")
    op: Literal["step", "step_tx", "sleep", "event", "call", "map"] = Field(
        description="ctx.step, ctx.step_tx, ctx.sleep, or a durable wait: ctx.wait_for_event, ctx.call, ctx.map"
    )
    seq: int = Field(description="Its call's position in the run that recorded it (the order of the list)")
    attempt: int = Field(description="The job's attempt that recorded it")
    recorded_at: datetime
    duration: float = Field(
        description="Seconds its function ran; for a sleep, the seconds it sleeps; for an event wait that ended, "
        "the seconds it waited"
    )
    result: Any = Field(
        description="The JSON its function returned (null for None and for a sleep); an event wait's: the payload"
    )
    wake_at: datetime | None = Field(description="A sleep's end; an event wait's timeout; null otherwise")
    state: Literal["waiting", "done", "failed", "timed_out"] | None = Field(
        None,
        description="A wait's: waiting, then done (its result stored), failed (a child ended dead or cancelled) "
        "or timed_out; null for a step or a sleep",
    )
    waits_for: str | None = Field(None, description="An event wait's event key; null otherwise")
    children: int | None = Field(
        None, description="A call's or map's child jobs (GET /api/v1/jobs?parent_id=); null for the other ops"
    )
    children_left: int | None = Field(None, description="A call's or map's child jobs not yet ended")


class JobSteps(BaseModel):
    job_id: int
    steps: list[Step] = Field(description="In call order")


class StepsForgotten(BaseModel):
    job: Job = Field(description="The job as it is now: retried if it was dead or cancelled")
    forgotten: list[str] = Field(description="The keys of the steps forgotten, in call order")


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
    waiting: int = Field(description="Jobs of workflows whose node waits for the nodes before it (never claimed)")
    skipped: int = Field(description="Jobs of workflows skipped without running (kept like cancelled ones)")


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
    rate_limit: str | None = Field(
        description="N/s, N/m or N/h: starts spread evenly through the window, at most N in any interval of "
        "its length (with rate_burst 1)"
    )
    rate_burst: int | None = Field(
        None, description="Starts that may come at once after an idle spell (null: 1, evenly spaced)"
    )
    in_use: int = Field(description="Jobs active now under the limit (all keys)")
    in_use_by_key: dict[str, int] | None = Field(description="Active jobs per key value, for a per-key limit")
    started_in_window: int = Field(description="Starts in the rate window ending now (all keys)")
    waiting: int = Field(description="Ready jobs held back because their limit is full (waiting on a limit)")


class FlowLimitList(BaseModel):
    limits: list[FlowLimit]


# A rate limit the API takes: config's rate grammar (store/config.py parse_rate), N/s, N/m or N/h with N from 1
# to MAX_RATE_COUNT. The schema states it as RATE_PATTERN, the same language; a refusal is the config file's
# message for the rule broken, naming the field (a `pattern=` constraint would answer "String should match
# pattern ..." instead).
def _rate_limit(value: str) -> str:
    try:
        parse_rate(value)
    except ValueError as exc:
        raise PydanticCustomError("rate_limit_invalid", str(exc)) from None
    return value


RateLimit = Annotated[
    str,
    Field(max_length=32),
    AfterValidator(_rate_limit),
    WithJsonSchema({"type": "string", "maxLength": 32, "pattern": RATE_PATTERN}),
]


def _count_not_text(value: Any) -> Any:
    """A count is a JSON number: "5" and true are refused (lax integers would take them), 5.0 is 5."""
    if isinstance(value, bool | str):
        raise PydanticCustomError("int_type", "Input should be an integer, not a string or a boolean")
    return value


ConcurrencyLimit = Annotated[int, Field(ge=1, le=MAX_CONCURRENCY_LIMIT), BeforeValidator(_count_not_text)]
RateBurst = Annotated[int, Field(ge=1, le=MAX_RATE_COUNT), BeforeValidator(_count_not_text)]


class FlowLimitChange(BaseModel):
    """A change to a limit: a field left out keeps its value, null removes it. The rules are config/queues.yml's
    (store/config.py): counts are JSON integers, not strings or booleans; a key comes with a limit."""

    model_config = ConfigDict(extra="forbid")
    concurrency_limit: ConcurrencyLimit | None = Field(
        None, description="null: no concurrency limit; left out: unchanged"
    )
    rate_limit: RateLimit | None = Field(
        None,
        description=f"N/s, N/m or N/h, N from 1 to {MAX_RATE_COUNT:,}: starts spread evenly through the window; "
        "null: no rate limit; left out: unchanged",
    )
    rate_burst: RateBurst | None = Field(
        None,
        description="starts that may come at once after an idle spell, at most the rate's count; null: 1 "
        "(evenly spaced); left out: unchanged (dropped with its rate)",
    )
    key: str | None = Field(
        None,
        pattern=r"^meta\.[A-Za-z0-9_.-]+$",
        max_length=MAX_LIMIT_KEY_LENGTH,
        description="meta.<field>: a limit per value of that field, stated with a limit in the same change; "
        "null: one limit; left out: unchanged",
    )

    def changes(self) -> dict[str, Any]:
        """The fields the request gave, null included: what to change."""
        return {name: getattr(self, name) for name in self.model_fields_set}


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
