"""/api/v1/workflows and /api/v1/batches: create one, list them, read one (and wait for its end), act on one
or on one of its nodes, add jobs to an open batch and seal it.

A workflow is a graph of ordinary jobs and a batch is a workflow of one group node and its callbacks
(store/workflows.py says how they move). Creating one is one transaction, on the hot pool like an enqueue;
the reads are too. The actions are the store's, in the sync pool, like a job's (app/db.py).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Annotated, Any

from dygo.app.db import Conn, database
from dygo.app.errors import ApiError, ErrorResponse, documented
from dygo.app.jobs import (
    CURSOR_PATTERN,
    MAX_JOB_ID,
    IdempotencyKeyHeader,
    api_duration,
    decode_cursor,
    encode_cursor,
    strict_args,
    wait_seconds,
)
from dygo.app.schemas import DURATION_PATTERN, WAIT_PATTERN, JobOptions
from dygo.app.workflow_schemas import (
    BatchJobsAdded,
    BatchJobsRequest,
    Workflow,
    WorkflowBatchRequest,
    WorkflowCreated,
    WorkflowNodeRequest,
    WorkflowPage,
    WorkflowRequest,
    WorkflowState,
)
from dygo.store import tracing
from dygo.store import workflows as store
from dygo.store.enqueue import JobRequest, prepare
from dygo.store.errors import EnqueueError
from dygo.store.registry import Registry
from dygo.store.workflows import WorkflowError, WorkflowHandle
from fastapi import APIRouter, Path, Query, Request, Response

router = APIRouter(prefix="/api/v1", tags=["workflows"], responses=documented(401, 403, 503))


def _errors(meaning: dict[int, str]) -> dict[int | str, dict[str, Any]]:
    """OpenAPI `responses` entries for this area's error statuses, each with what it means here."""
    return {status: {"model": ErrorResponse, "description": text} for status, text in meaning.items()}


INVALID = (
    "Invalid input: a node named in `after` that is not one, a cycle, a name used twice, a bad option "
    "(invalid_workflow, naming the node), or a job's (invalid_request, unknown_kind, unknown_queue, "
    "invalid_args, invalid_option, invalid_duration, invalid_timestamp, batch_too_large, invalid_value)"
)
NOT_FOUND = "No such workflow or node (workflow_not_found, node_not_found)"

WorkflowId = Annotated[int, Path(ge=1, le=MAX_JOB_ID, description="The workflow's id (a batch's too)")]
NodeName = Annotated[str, Path(max_length=100, description="The node's name")]


# --- creating ------------------------------------------------------------------------------------------------


def _idempotency_key(body_key: str | None, header: str | None) -> str | None:
    """The key of a create: the header's or the body's, which must agree (409, as for POST /api/v1/jobs)."""
    if header is not None and body_key not in (None, header):
        raise ApiError(
            409,
            "idempotency_key_mismatch",
            "the Idempotency-Key header and the body's idempotency_key differ; send one, or the same",
        )
    return header if header is not None else body_key


def _options(body: JobOptions) -> dict[str, Any]:
    """The job options a request set (null counts as not set), as the store takes them."""
    options = body.model_dump(include=set(JobOptions.model_fields), exclude_unset=True, exclude_none=True)
    if isinstance(options.get("delay"), str):
        api_duration(options["delay"], "delay", DURATION_PATTERN)
    return options


def _checked_args(registry: Registry, where: str, kind: str, args: Iterable[dict[str, Any]]) -> None:
    """Each job's args as the kind's model describes them (strict JSON, as POST /api/v1/jobs checks them);
    an error names the node and the job."""
    for index, each in enumerate(args):
        try:
            strict_args(registry, kind, each)
        except EnqueueError as exc:
            details = {"index": index, "errors": exc.details}
            raise WorkflowError(exc.code, f"{where} job {index}: {exc}", details) from None


# The kind an empty group's options are checked with: not registered, so no args are asked of it.
_PROBE_KIND = "dygo.options_check"


def _check_empty_group(registry: Registry, where: str, kind: str, options: dict[str, Any]) -> None:
    """A group with no job (an empty map, a batch opened empty) prepares none, so its kind and options are
    checked here, as its first job's would be: refused all the same, never kept for a later job."""
    definition = registry.get(kind)
    queue = options.get("queue") or (definition.queue_name if definition is not None else None)
    try:
        if queue is None:
            prepare(JobRequest(kind, {}), registry)  # unknown_kind, as for any job of it
        prepare(JobRequest(_PROBE_KIND, {}, **{**options, "queue": queue}), registry)
    except EnqueueError as exc:
        raise WorkflowError(exc.code, f"{where}: {exc}", exc.details) from None


def _built(registry: Registry, body: WorkflowRequest, key: str | None) -> store.Workflow:
    workflow = store.Workflow(body.name, on_failure=body.on_failure, fail_fast=body.fail_fast, idempotency_key=key)
    previous: str | None = None
    for node in body.nodes:
        _add_node(registry, workflow, node, previous if body.chain else None)
        previous = node.name
    return workflow


def _add_node(registry: Registry, workflow: store.Workflow, node: WorkflowNodeRequest, previous: str | None) -> None:
    where = f"node {node.name!r}"
    options = _options(node)
    after: Any = node.after if node.after is not None else ([previous] if previous is not None else [])
    if node.map is not None:
        if node.args is not None:
            raise WorkflowError(
                "invalid_workflow", f"{where}: give args (one job) or map (one job per element), not both"
            )
        _checked_args(registry, where, node.kind, node.map)
        if not node.map:
            _check_empty_group(registry, where, node.kind, options)
        workflow.map(
            node.name,
            node.kind,
            node.map,
            after=after,
            on_failure=node.on_failure,
            allow_failures=node.allow_failures or 0,
            **options,
        )
        return
    if node.allow_failures is not None:
        raise WorkflowError("invalid_workflow", f"{where}: allow_failures applies to a map node only")
    args = node.args if node.args is not None else {}
    _checked_args(registry, where, node.kind, [args])
    workflow.add(node.name, node.kind, args, after=after, on_failure=node.on_failure, **options)


def _check_size(request: Request, jobs: int) -> None:
    """One request writes at most max_batch_size jobs, as a batch of POST /api/v1/jobs/batch does; an
    open batch takes more in later requests."""
    most = request.app.state.settings.max_batch_size
    if jobs > most:
        raise ApiError(
            422,
            "batch_too_large",
            f"one request enqueues at most {most} jobs (max_batch_size), got {jobs}",
            {"max": most, "got": jobs},
        )


async def _create(request: Request, response: Response, workflow: store.Workflow) -> dict[str, Any]:
    _check_size(request, sum(len(node.jobs) for node in workflow.nodes.values()))
    async with database(request).connection() as conn:
        handle = await store.aenqueue_workflow(conn, workflow)
        if handle.deduplicated:
            handle = _handle(await store.aget_workflow(conn, handle.id))
            response.status_code = 200
    return {"id": handle.id, "deduplicated": handle.deduplicated, "nodes": handle.nodes, "jobs": handle.jobs}


def _handle(workflow: dict[str, Any]) -> WorkflowHandle:
    """What the create of the workflow a key already names answers: its ids, as its own create did."""
    nodes = workflow["nodes"]
    jobs = {node["name"]: node["job_id"] for node in nodes if not node["is_group"] and node["job_id"] is not None}
    return WorkflowHandle(workflow["id"], {node["name"]: node["id"] for node in nodes}, jobs, deduplicated=True)


CREATED_RESPONSES = {
    200: {"model": WorkflowCreated, "description": "Deduplicated: a workflow already holds the idempotency key"},
    **documented(400, 413),
    **_errors({409: "The Idempotency-Key header and the body's idempotency_key differ", 422: INVALID}),
}


@router.post(
    "/workflows",
    status_code=201,
    response_model=WorkflowCreated,
    summary="Create a workflow: its nodes, edges and jobs, all or nothing",
    responses=CREATED_RESPONSES,
)
async def create_workflow(
    body: WorkflowRequest, request: Request, response: Response, idempotency_header: IdempotencyKeyHeader = None
) -> dict[str, Any]:
    with tracing.incoming(request.headers):
        key = _idempotency_key(body.idempotency_key, idempotency_header)
        return await _create(request, response, _built(request.app.state.jobs, body, key))


@router.post(
    "/batches",
    status_code=201,
    response_model=WorkflowCreated,
    summary="Create a batch: one job per args element, and callbacks fired once when they have all ended",
    responses=CREATED_RESPONSES,
)
async def create_batch(
    body: WorkflowBatchRequest,
    request: Request,
    response: Response,
    idempotency_header: IdempotencyKeyHeader = None,
) -> dict[str, Any]:
    registry = request.app.state.jobs
    with tracing.incoming(request.headers):
        key = _idempotency_key(body.idempotency_key, idempotency_header)
        options = _options(body)
        _checked_args(registry, f"node {store.BATCH_JOBS!r}", body.kind, body.args)
        if not body.args:
            _check_empty_group(registry, f"node {store.BATCH_JOBS!r}", body.kind, options)
        callbacks: dict[str, tuple[str, dict[str, Any]] | None] = {}
        for name in store.CALLBACKS:
            given = getattr(body, name)
            if given is not None:
                _checked_args(registry, f"node {name!r}", given.kind, [given.args])
            callbacks[name] = None if given is None else (given.kind, given.args)
        workflow = store.batch(
            body.name,
            body.kind,
            body.args,
            on_success=callbacks["on_success"],
            on_complete=callbacks["on_complete"],
            on_failure=callbacks["on_failure"],
            allow_failures=body.allow_failures or 0,
            open=body.open,
            idempotency_key=key,
            **options,
        )
        return await _create(request, response, workflow)


# --- reading ---------------------------------------------------------------------------------------------------


@router.get(
    "/workflows",
    response_model=WorkflowPage,
    summary="List workflows (batches too), newest first",
    responses=documented(400, 422),
)
async def list_workflows(
    request: Request,
    state: WorkflowState | None = None,
    name: Annotated[str | None, Query(min_length=1, max_length=store.MAX_NAME_LENGTH)] = None,
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
    before: Annotated[
        str | None,
        Query(
            json_schema_extra={"pattern": CURSOR_PATTERN},
            description="next_cursor of the previous page: the workflows older than it",
        ),
    ] = None,
) -> dict[str, Any]:
    position = decode_cursor(before, "newest") if before is not None else None
    pools = database(request)
    # One more than asked: tells whether a next page exists. A list may lag: DATABASE_READ_URL's when set.
    if pools.reads_replica:
        rows = await pools.read(
            lambda conn: store.list_workflows(conn, state=state, name=name, before=position, limit=limit + 1)
        )
    else:
        async with pools.connection() as conn:
            rows = await store.alist_workflows(conn, state=state, name=name, before=position, limit=limit + 1)
    more = len(rows) > limit
    return {
        "workflows": rows[:limit],
        "next_cursor": encode_cursor("newest", rows[limit - 1]["id"]) if more else None,
    }


@router.get(
    "/workflows/{workflow_id}",
    response_model=Workflow,
    summary="A workflow: its counters, nodes (state, counts, why one waits), edges and result",
    responses=_errors({404: NOT_FOUND, 422: "A wait that is not a duration, or longer than 60s (invalid_duration)"}),
)
async def get_workflow(
    workflow_id: WorkflowId,
    request: Request,
    wait: Annotated[
        str | None,
        Query(
            max_length=32,
            json_schema_extra={"pattern": WAIT_PATTERN},
            description=(
                "Wait up to this long (e.g. '30s', '500ms', at most 60s) for the workflow to be succeeded, failed "
                "or cancelled; the answer comes as soon as it is, or at the end of the wait with the workflow as "
                "it is then"
            ),
        ),
    ] = None,
) -> dict[str, Any]:
    db = database(request)
    seconds = wait_seconds(wait)
    if seconds:
        found: dict[str, Any] | None = await request.app.state.waiters.wait_for_workflow(
            workflow_id, seconds, db.connection
        )
        if found is None:
            raise ApiError(404, "workflow_not_found", f"no workflow {workflow_id}")
        return found
    async with db.connection() as conn:
        return await store.aget_workflow(conn, workflow_id)


# --- acting ----------------------------------------------------------------------------------------------------

ACTION_ERRORS = _errors(
    {
        404: NOT_FOUND,
        409: "The workflow or node is not in a state that allows it "
        "(workflow_not_running, node_state, node_not_retryable)",
    }
)


@router.post(
    "/workflows/{workflow_id}/cancel",
    response_model=Workflow,
    summary="Cancel every node not yet ended (a job already running ends as it will)",
    responses=documented(422) | ACTION_ERRORS,
)
def cancel_workflow(workflow_id: WorkflowId, conn: Conn) -> dict[str, Any]:
    return store.cancel_workflow(conn, workflow_id)


NODE_ACTIONS = {
    "retry": "Retry a node's dead and cancelled jobs, re-arming the nodes its failure cancelled, skipped or held",
    "skip": "Skip a node's jobs not yet started; the nodes after it follow their policies",
    "cancel": "Cancel a node's jobs not yet started; the nodes after it follow their policies",
}


def _add_node_action(action: str, summary: str) -> None:
    def act(workflow_id: WorkflowId, node: NodeName, conn: Conn) -> dict[str, Any]:
        return store.act_on_node(conn, workflow_id, node, action)

    name = f"{action}_node"
    act.__name__ = name
    router.add_api_route(
        f"/workflows/{{workflow_id}}/nodes/{{node}}/{action}",
        act,
        methods=["POST"],
        response_model=Workflow,
        summary=summary,
        name=name,
        responses=documented(422) | ACTION_ERRORS,
    )


for _action, _summary in NODE_ACTIONS.items():
    _add_node_action(_action, _summary)


@router.post(
    "/batches/{workflow_id}/jobs",
    status_code=201,
    response_model=BatchJobsAdded,
    summary="Add jobs to an open batch, all or nothing",
    responses=documented(400, 413) | _errors({404: NOT_FOUND, 409: "The batch is sealed (batch_sealed)", 422: INVALID}),
)
def add_batch_jobs(workflow_id: WorkflowId, body: BatchJobsRequest, request: Request, conn: Conn) -> dict[str, Any]:
    _check_size(request, len(body.args))
    _checked_args(request.app.state.jobs, f"node {store.BATCH_JOBS!r}", body.kind, body.args)
    with tracing.incoming(request.headers):
        ids = store.add_to_batch(conn, workflow_id, body.kind, body.args, **_options(body))
    return {"batch": workflow_id, "jobs": ids}


@router.post(
    "/batches/{workflow_id}/seal",
    response_model=Workflow,
    summary="Seal an open batch: it takes no more jobs, and ends (firing its callbacks) once its jobs have",
    responses=documented(422) | _errors({404: NOT_FOUND, 409: "The batch is already sealed (batch_sealed)"}),
)
def seal_batch(workflow_id: WorkflowId, conn: Conn) -> dict[str, Any]:
    return store.seal_batch(conn, workflow_id)
