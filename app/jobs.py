"""/api/v1/jobs: enqueue one or a batch, read one, list with keyset pagination, act on one."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from functools import partial
from typing import Annotated, Any, Literal, NotRequired

from dygo.app.db import Conn, ReadConn, database
from dygo.app.errors import ApiError, documented
from dygo.app.quick_route import quick_body, quick_route
from dygo.app.schemas import (
    DURATION_PATTERN,
    POSITIVE_DURATION_PATTERN,
    WAIT_PATTERN,
    BatchEnqueued,
    BatchRequest,
    Enqueued,
    EnqueueRequest,
    Job,
    JobPage,
    JobState,
    JobSteps,
    StepsForgotten,
)
from dygo.store import admin, job_reads, steps, tracing
from dygo.store.durations import parse_duration
from dygo.store.enqueue import MAX_KEY_LENGTH, JobRequest, aenqueue, aenqueue_many
from dygo.store.enqueue import Enqueued as EnqueueResult
from dygo.store.errors import EnqueueError
from dygo.store.registry import Registry
from fastapi import APIRouter, FastAPI, Header, Path, Query, Request, Response
from pydantic import ConfigDict, TypeAdapter, ValidationError, with_config
from typing_extensions import TypedDict  # typing.TypedDict only from Python 3.12 for pydantic

router = APIRouter(prefix="/api/v1", tags=["jobs"], responses=documented(401, 403, 413, 503))

# A cursor is the id to continue after (keyset pagination on the job id): its digits, so the document's
# pattern says exactly which cursors the server takes. An id past the largest job is past every page.
CURSOR_PATTERN = "^[1-9][0-9]{0,17}$"
MAX_JOB_ID = 2**63 - 1
JobId = Annotated[int, Path(ge=1, le=MAX_JOB_ID, description="The job's id")]
IDEMPOTENCY_HEADER = "Idempotency-Key"


def api_duration(value: str, field: str, pattern: str = DURATION_PATTERN) -> str:
    """A duration as the API takes it (what the OpenAPI document says: a whole number and a unit), or 422."""
    if not re.fullmatch(pattern, value):
        raise ApiError(
            422,
            "invalid_duration",
            f"{field}: {value!r} is not a duration this API takes: a "
            "number with a unit, ms, s, m, h or d, at most a year (e.g. '30s', '1.5h', '7d')"
            + (" and more than 0" if pattern == POSITIVE_DURATION_PATTERN else ""),
            {"field": field},
        )
    return value


def strict_args(jobs: Registry, kind: str, args: dict[str, Any]) -> None:
    """A registered kind's args as its model's JSON schema (in the OpenAPI document) describes them: strict
    JSON, so `false` is not a number and "5" not an integer (the store's lax check would convert both)."""
    definition = jobs.get(kind)
    if definition is None or definition.args_model is None:
        return
    try:
        definition.args_model.model_validate_json(json.dumps(args), strict=True)
    except ValidationError as exc:
        details = exc.errors(include_url=False, include_context=False, include_input=False)
        raise EnqueueError("invalid_args", f"args for kind {kind!r} are invalid", details) from None


_NO_OPTIONS: set[str] = {"kind", "args"}


def _options(body: EnqueueRequest) -> dict[str, Any]:
    """The options the request set (null counts as not set), as the store's enqueue takes them. A request
    that set none (the usual batch entry: pydantic knows which fields the JSON had) needs no dump."""
    if body.model_fields_set <= _NO_OPTIONS:
        return {}
    options = body.model_dump(exclude=_NO_OPTIONS, exclude_unset=True, exclude_none=True)
    for field, pattern in (("delay", DURATION_PATTERN), ("idempotency_ttl", POSITIVE_DURATION_PATTERN)):
        if isinstance(options.get(field), str):
            api_duration(options[field], field, pattern)
    return options


@dataclass(frozen=True, slots=True)
class _BatchResult:
    jobs: list[EnqueueResult]


# The answers are the store's results as pydantic writes them: their fields and types are those of the
# response models (Enqueued, BatchEnqueued), which the document shows. Serialising the results directly
# spares validating what the store made into a model per job.
_ENQUEUED = TypeAdapter(EnqueueResult)
_BATCH_ENQUEUED = TypeAdapter(_BatchResult)


def enqueued_body(result: EnqueueResult) -> bytes:
    """The Enqueued answer's JSON (the bytes of Enqueued.model_dump_json)."""
    return _ENQUEUED.dump_json(result)


def batch_enqueued_body(results: list[EnqueueResult]) -> bytes:
    """The BatchEnqueued answer's JSON (the bytes of BatchEnqueued.model_dump_json)."""
    return _BATCH_ENQUEUED.dump_json(_BatchResult(results))


def _json(content: bytes, status: int) -> Response:
    return Response(content, status_code=status, media_type="application/json")


IdempotencyKeyHeader = Annotated[
    str | None,
    Header(
        alias=IDEMPOTENCY_HEADER,
        min_length=1,
        max_length=MAX_KEY_LENGTH,
        description=f"Same as the body's idempotency_key (1 to {MAX_KEY_LENGTH} characters)",
    ),
]


async def quick_enqueue_job(request: Request) -> Response | None:
    """POST /jobs for a well-formed request (app/quick_route.py): its body and header read as FastAPI would."""
    body = await quick_body(request, _ENQUEUE_REQUEST)
    key = request.headers.get(IDEMPOTENCY_HEADER)
    if body is None or (key is not None and not 1 <= len(key) <= MAX_KEY_LENGTH):  # IdempotencyKeyHeader's rule
        return None
    return await enqueue_job(body, request, key)


async def enqueue_job(
    body: EnqueueRequest, request: Request, idempotency_header: IdempotencyKeyHeader = None
) -> Response:
    state = request.app.state
    # The caller's traceparent, if any, parents the enqueue span.
    with tracing.incoming(request.headers):
        strict_args(state.jobs, body.kind, body.args)
        options = _options(body)
        if idempotency_header is not None:
            if options.get("idempotency_key", idempotency_header) != idempotency_header:
                # 409, not 422: each is well formed on its own (the document cannot relate a header to a body field).
                raise ApiError(
                    409,
                    "idempotency_key_mismatch",
                    "the Idempotency-Key header and the body's idempotency_key differ; send one, or the same",
                )
            options["idempotency_key"] = idempotency_header
        # Async on the hot pool (app/db.py): no thread hop, and a waiting request holds no thread.
        async with state.db.connection() as conn:
            result = await aenqueue(conn, body.kind, body.args, **options)
    return _json(enqueued_body(result), 200 if result.deduplicated else 201)


@with_config(ConfigDict(extra="forbid"))
class _PlainEntry(TypedDict):
    """A batch entry that sets no option: EnqueueRequest's `kind` and `args` only."""

    kind: str
    args: NotRequired[dict[str, Any]]


@with_config(ConfigDict(extra="forbid"))
class _PlainBatch(TypedDict):
    """A BatchRequest of plain entries."""

    jobs: list[_PlainEntry]


# What the quick handlers validate a body with. A batch of plain entries (the usual batch) is read into
# dicts, not a ten-field model per entry: those models, alive together for a whole batch, are enough
# allocations to run the garbage collector on most batches. A body it refuses is read as a BatchRequest.
_ENQUEUE_REQUEST = TypeAdapter(EnqueueRequest)
_BATCH_REQUEST = TypeAdapter(BatchRequest)
_PLAIN_BATCH = TypeAdapter(_PlainBatch)


async def quick_enqueue_batch(request: Request) -> Response | None:
    """POST /jobs/batch for a well-formed request (app/quick_route.py): its body read as FastAPI would."""
    plain = await quick_body(request, _PLAIN_BATCH)
    if plain is None:
        body = await quick_body(request, _BATCH_REQUEST)
        return None if body is None else await enqueue_batch(body, request)
    _check_batch_size(request, len(plain["jobs"]))
    registry = request.app.state.jobs
    requests = [
        _job_request(registry, index, entry["kind"], entry.get("args", {}), None)
        for index, entry in enumerate(plain["jobs"])
    ]
    return await _enqueue_many(request, requests)


async def enqueue_batch(body: BatchRequest, request: Request) -> Response:
    _check_batch_size(request, len(body.jobs))
    registry = request.app.state.jobs
    requests = [_job_request(registry, index, job.kind, job.args, job) for index, job in enumerate(body.jobs)]
    return await _enqueue_many(request, requests)


def _check_batch_size(request: Request, size: int) -> None:
    most = request.app.state.settings.max_batch_size
    if size > most:
        raise ApiError(
            422,
            "batch_too_large",
            f"a batch holds at most {most} jobs (max_batch_size), got {size}",
            {"max": most, "got": size},
        )


def _job_request(
    registry: Registry, index: int, kind: str, args: dict[str, Any], options: EnqueueRequest | None
) -> JobRequest:
    """Entry `index` of a batch as the store takes it (`options`: its request model, None for a plain entry);
    an error names the entry."""
    try:
        strict_args(registry, kind, args)
        return JobRequest(kind, args) if options is None else JobRequest(kind, args, **_options(options))
    except (EnqueueError, ApiError) as exc:
        message = str(exc) if isinstance(exc, EnqueueError) else exc.message
        raise EnqueueError(exc.code, f"jobs[{index}]: {message}", {"index": index, "errors": exc.details}) from None


async def _enqueue_many(request: Request, requests: list[JobRequest]) -> Response:
    with tracing.incoming(request.headers):
        async with request.app.state.db.connection() as conn:
            results = await aenqueue_many(conn, requests)
    return _json(batch_enqueued_body(results), 201)


def add_enqueue_routes(app: FastAPI) -> None:
    """POST /jobs and /jobs/batch, on the app's own router: create_app adds them ahead of the included
    routers, so the API's busiest routes are matched first, by one pattern each, and not through an
    included router (which matches a request once to choose it and again to run it). They have this
    router's prefix, tags and error responses, as its own routes do."""
    post = partial(app.router.add_api_route, methods=["POST"], status_code=201, tags=router.tags)
    post(
        router.prefix + "/jobs",
        enqueue_job,
        route_class_override=quick_route(quick_enqueue_job),
        response_model=Enqueued,
        summary="Enqueue a job",
        responses={
            **router.responses,
            200: {"model": Enqueued, "description": "Deduplicated: a live job already holds the key"},
            **documented(400, 409, 422),
        },
    )
    post(
        router.prefix + "/jobs/batch",
        enqueue_batch,
        route_class_override=quick_route(quick_enqueue_batch),
        response_model=BatchEnqueued,
        summary="Enqueue many jobs, all or nothing",
        responses={**router.responses, **documented(400, 409, 422)},
    )


@router.get(
    "/jobs", response_model=JobPage, summary="List jobs, newest or oldest first", responses=documented(400, 422)
)
def list_jobs(
    conn: ReadConn,
    queue: Annotated[str | None, Query(max_length=255)] = None,
    kind: Annotated[str | None, Query(max_length=255)] = None,
    state: JobState | None = None,
    q: Annotated[
        str | None, Query(min_length=1, max_length=255, description="Text in the args (as JSON) or the last error")
    ] = None,
    order: Literal["newest", "oldest"] = "newest",
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
    cursor: Annotated[
        str | None,
        Query(
            json_schema_extra={"pattern": CURSOR_PATTERN},
            description=("next_cursor of the previous page: a position in the list, for either order"),
        ),
    ] = None,
    parent_id: Annotated[
        int | None,
        Query(ge=1, le=2**63 - 1, description="Only the child jobs of this parent (`ctx.call`, `ctx.map`)"),
    ] = None,
) -> dict[str, Any]:
    position = decode_cursor(cursor, order) if cursor is not None else None
    where = admin.JobFilter(queue=queue, kind=kind, state=state, text=q, parent_id=parent_id)
    page = admin.list_jobs(conn, where, order=order, limit=limit, position=position)
    return {
        "jobs": page.jobs,
        "next_cursor": None if page.next_position is None else encode_cursor(order, page.next_position),
    }


def encode_cursor(order: str, position: int) -> str:
    return str(position)


def decode_cursor(cursor: str, order: str) -> int:
    """The position in a cursor; 400 for anything encode_cursor did not make."""
    if re.fullmatch(CURSOR_PATTERN, cursor):
        return int(cursor)
    raise ApiError(400, "invalid_cursor", "the cursor is not one this list returned; start again without a cursor")


@router.api_route("/jobs/batch", methods=["GET", "HEAD", "PUT", "PATCH", "DELETE", "OPTIONS"], include_in_schema=False)
def batch_other_methods() -> None:
    """/jobs/batch takes POST only: 405, where /jobs/{job_id} would have said 422 ('batch' is not an id)."""
    raise ApiError(405, "method_not_allowed", "Method Not Allowed", headers={"Allow": "POST"})


# Longest `?wait=`: long enough to cover most jobs, short enough for proxies' idle timeouts.
MAX_WAIT = 60.0


@router.get(
    "/jobs/{job_id}",
    response_model=Job,
    summary="A job with its result and attempt history",
    responses=documented(404, 422),
)
async def get_job(
    job_id: JobId,
    request: Request,
    wait: Annotated[
        str | None,
        Query(
            max_length=32,
            json_schema_extra={"pattern": WAIT_PATTERN},
            description=(
                "Wait up to this long (e.g. '30s', '500ms', at most 60s) for the job to be succeeded, dead or "
                "cancelled; the answer comes as soon as it is, or at the end of the wait with the job as it is then"
            ),
        ),
    ] = None,
) -> dict[str, Any]:
    db = database(request)
    seconds = wait_seconds(wait)
    if seconds:
        job = await request.app.state.waiters.wait(job_id, seconds, db.connection)
    else:
        async with db.connection() as conn:
            job = await job_reads.aget_job(conn, job_id)
    if job is None:
        raise ApiError(404, "job_not_found", f"no job with id {job_id}")
    found: dict[str, Any] = job
    return found


def wait_seconds(wait: str | None) -> float:
    if wait is None:
        return 0.0
    if not re.fullmatch(WAIT_PATTERN, wait):
        raise ApiError(
            422,
            "invalid_duration",
            f"wait: {wait!r} is not a wait this API takes: a number with "
            "a unit, ms, s or m, at most 60s (e.g. '30s', '500ms')",
            {"field": "wait", "max_seconds": MAX_WAIT},
        )
    try:
        seconds = parse_duration(wait, field="wait")
    except ValueError as exc:
        raise ApiError(422, "invalid_duration", str(exc), {"field": "wait"}) from None
    if seconds > MAX_WAIT:
        raise ApiError(
            422,
            "invalid_duration",
            f"wait: at most {MAX_WAIT:g}s, got {wait!r}",
            {"field": "wait", "max_seconds": MAX_WAIT},
        )
    return seconds


@router.delete(
    "/jobs/{job_id}",
    status_code=204,
    summary="Delete a job (not while it is active)",
    responses=documented(404, 409, 422),
)
def delete_job(
    job_id: JobId,
    conn: Conn,
    state: Annotated[
        JobState | None,
        Query(
            description="Delete only while the job is in this state (else 409), "
            "so a job retried since you looked at it stays"
        ),
    ] = None,
) -> Response:
    admin.delete_job(conn, job_id, state)
    return Response(status_code=204)


@router.get(
    "/jobs/{job_id}/steps",
    response_model=JobSteps,
    summary="A job's recorded steps (ctx.step, ctx.step_tx, ctx.sleep) in call order",
    responses=documented(404, 422),
)
def list_job_steps(job_id: JobId, conn: Conn) -> dict[str, Any]:
    return {"job_id": job_id, "steps": steps.job_steps(conn, job_id)}


StepKey = Annotated[
    str,
    Path(
        max_length=steps.MAX_NAME + 12,
        description="The step's key, name#occurrence, with '#' written %23 (e.g. charge%231)",
    ),
]


@router.post(
    "/jobs/{job_id}/steps/{key}/retry",
    response_model=StepsForgotten,
    summary="Retry from this step: forget it and the later steps; retry the job if dead or cancelled",
    responses=documented(404, 409, 422),
)
def retry_from_step(job_id: JobId, key: StepKey, conn: Conn) -> dict[str, Any]:
    forgotten = steps.forget_steps(conn, job_id, key)
    return {"job": forgotten.job, "forgotten": forgotten.keys}


ACTION_SUMMARIES = {
    "retry": "Retry a dead or cancelled job now, with a fresh attempt budget",
    "cancel": "Cancel a pending, scheduled or paused job",
    "pause": "Hold a pending or scheduled job",
    "resume": "Release a paused job",
    "run-now": "Run a scheduled job now (409 unless it is scheduled)",
    "archive": "Move a pending or scheduled job to dead without running it",
}


def _add_action(action: str, summary: str) -> None:
    def act(job_id: JobId, conn: Conn) -> dict[str, Any]:
        return admin.act_on_job(conn, action, job_id)

    name = action.replace("-", "_") + "_job"
    act.__name__ = name
    router.add_api_route(
        f"/jobs/{{job_id}}/{action}",
        act,
        methods=["POST"],
        response_model=Job,
        summary=summary,
        name=name,
        responses=documented(404, 409, 422),
    )


for _action, _summary in ACTION_SUMMARIES.items():
    _add_action(_action, _summary)
