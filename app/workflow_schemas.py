"""Request and response bodies of /api/v1/workflows and /api/v1/batches (they are also their OpenAPI document).

What a workflow is and how it moves: store/workflows.py. The document states each field's shape; the rules
between fields (a node named in `after` exists, no cycle, a name used once, a whole count of allowed
failures from 1 up) are the store's, refused with 422 `invalid_workflow` naming the node.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from dygo.app.schemas import JobKind, JobOptions
from dygo.store.enqueue import MAX_KEY_LENGTH
from dygo.store.workflows import MAX_NAME_LENGTH, NODE_NAME
from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictFloat, StrictInt

# store.workflows.POLICIES; an edge of its own may also be `on_failure` (the node after runs only when the
# one before did not succeed, and is skipped when it did).
Policy = Literal["cancel", "continue", "skip", "hold"]
EdgePolicy = Literal["cancel", "continue", "skip", "hold", "on_failure"]
WorkflowState = Literal["running", "succeeded", "failed", "cancelled"]
NodeState = Literal["waiting", "running", "succeeded", "failed", "cancelled", "skipped"]
EdgeState = Literal["open", "met", "cancel", "skip", "held"]

NodeName = Annotated[
    str,
    Field(
        pattern=NODE_NAME.pattern,
        description="1 to 100 letters, digits, '_', '.' or '-', not starting with '.' or '-'",
    ),
]
WorkflowName = Annotated[str, Field(min_length=1, max_length=MAX_NAME_LENGTH)]
# A group's failures it may have and still succeed: a whole count from 1 up, or a fraction of its jobs below 1.
AllowFailures = Annotated[StrictInt, Field(ge=0)] | Annotated[StrictFloat, Field(ge=0)]
IdempotencyKey = Annotated[str, Field(min_length=1, max_length=MAX_KEY_LENGTH)]
KEY_DESCRIPTION = (
    "While a workflow holds this key, creating another with it returns that one instead (200, deduplicated); "
    "the same as the Idempotency-Key header"
)


class WorkflowNodeRequest(JobOptions):
    """One node: a job of `kind` with `args`, or with `map` a group of one job per element, all of them
    released together and ended together. The job options apply to each of its jobs."""

    name: NodeName
    kind: JobKind
    args: dict[str, Any] | None = Field(None, description="The job's args (not with map); validated like an enqueue's")
    map: list[dict[str, Any]] | None = Field(
        None, description="A group node: one job per element, each element that job's args (not with args)"
    )
    after: list[NodeName] | dict[str, EdgePolicy | None] | None = Field(
        None,
        description="The nodes it waits for: a list of names, or {name: policy} to give an edge its own policy "
        "(null: the node's on_failure). Absent: none, or with the workflow's `chain` the node before it",
    )
    on_failure: Policy | None = Field(
        None,
        description="What this node does when a node before it ends other than succeeded (default: the workflow's)",
    )
    allow_failures: AllowFailures | None = Field(
        None,
        description="A map node succeeds with at most this many jobs not succeeded: a whole count from 1 up, or "
        "a fraction of its jobs below 1 (default 0)",
    )


class WorkflowRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: WorkflowName
    on_failure: Policy = Field(
        "cancel",
        description="When a node ends other than succeeded, what the nodes after it do: cancel (and so on down), "
        "continue (run anyway), skip (and so on down) or hold (wait for a retry, a skip or a cancel)",
    )
    fail_fast: StrictBool = Field(False, description="The first failed node cancels every node not yet ended")
    chain: StrictBool = Field(False, description="Each node without `after` runs after the node listed before it")
    nodes: list[WorkflowNodeRequest] = Field(min_length=1, description="Written all or nothing, with their jobs")
    idempotency_key: IdempotencyKey | None = Field(None, description=KEY_DESCRIPTION)


class Callback(BaseModel):
    model_config = ConfigDict(extra="forbid")

    kind: JobKind
    args: dict[str, Any] = Field(default_factory=dict)


class WorkflowBatchRequest(JobOptions):
    """A batch: one job of `kind` per element of `args` (the job options apply to each), and callbacks, each
    one job fired once when the batch's jobs have all ended."""

    name: WorkflowName
    kind: JobKind
    args: list[dict[str, Any]] = Field(default_factory=list, description="One job per element: its args")
    on_success: Callback | None = Field(None, description="Runs if the batch succeeded; else skipped")
    on_complete: Callback | None = Field(None, description="Runs whatever happened")
    on_failure: Callback | None = Field(None, description="Runs if the batch failed; else skipped")
    allow_failures: AllowFailures | None = Field(
        None,
        description="The batch succeeds with at most this many jobs not succeeded: a whole count from 1 up, or "
        "a fraction of its jobs below 1 (default 0)",
    )
    open: StrictBool = Field(
        False,
        description="Takes more jobs (POST /api/v1/batches/{id}/jobs) until sealed (POST .../seal); it cannot "
        "end, nor fire a callback, before",
    )
    idempotency_key: IdempotencyKey | None = Field(None, description=KEY_DESCRIPTION)


class BatchJobsRequest(JobOptions):
    """More jobs for an open batch: one job of `kind` per element of `args`."""

    kind: JobKind
    args: list[dict[str, Any]] = Field(min_length=1, description="One job per element: its args")


class WorkflowCreated(BaseModel):
    id: int = Field(description="The workflow's id (a batch is a workflow)")
    deduplicated: bool = Field(description="True when an idempotency key matched an existing workflow, whose this is")
    nodes: dict[str, int] = Field(description="Each node's id, by name")
    jobs: dict[str, int] = Field(description="Each single-job node's job id, by name (a group has many)")


class BatchJobsAdded(BaseModel):
    batch: int = Field(description="The batch's (workflow's) id")
    jobs: list[int] = Field(description="The new jobs' ids, in the order of args")


class WorkflowNode(BaseModel):
    id: int
    name: str
    is_group: bool = Field(description="A map node (a batch's jobs): any number of jobs counted as one node")
    state: NodeState
    sealed: bool = Field(description="False for an open batch: it takes more jobs and cannot end until sealed")
    allow_failures: float
    jobs: int = Field(description="Its jobs; the counts below are of them")
    jobs_left: int = Field(description="Not yet ended")
    succeeded: int
    dead: int
    cancelled: int
    skipped: int
    deps: int = Field(description="Edges into it")
    deps_left: int = Field(description="Of those, still open (the node before has not ended)")
    held: int = Field(description="Of those, holding it (a failed node before it, under `hold`)")
    cancels: int = Field(description="Of those, cancelling it")
    skips: int = Field(description="Of those, skipping it")
    job_id: int | None = Field(description="A single-job node's job")
    result: Any = Field(description="A single-job node's result, once it succeeded (kept after retention)")
    finished_at: datetime | None
    waiting_on: list[str] = Field(description="The nodes before it that have not ended")
    blocked_by: list[str] = Field(description="The failed nodes before it holding it")
    wait: str | None = Field(
        description="Why a waiting node waits, in words: 'waiting on 1 of 2: charge', 'blocked by failed charge', "
        "'open batch: waiting to be sealed'; null unless waiting"
    )


class WorkflowEdge(BaseModel):
    upstream: str
    downstream: str
    policy: EdgePolicy
    state: EdgeState = Field(
        description="open until the node before ends; then met, cancel, skip or held by the policy"
    )


class WorkflowCounters(BaseModel):
    id: int
    name: str
    state: WorkflowState
    fail_fast: bool
    nodes_left: int = Field(description="Nodes not yet ended")
    nodes_failed: int = Field(description="Nodes that ended failed or cancelled")
    idempotency_key: str | None
    created_at: datetime
    finished_at: datetime | None


class WorkflowSummary(WorkflowCounters):
    nodes: int = Field(description="How many nodes it has")


class Workflow(WorkflowCounters):
    nodes: list[WorkflowNode] = Field(description="Upstream first")
    edges: list[WorkflowEdge]
    result: dict[str, Any] | None = Field(
        description="Once ended: the result of each single-job node nothing runs after, by name"
    )


class WorkflowPage(BaseModel):
    workflows: list[WorkflowSummary]
    next_cursor: str | None = Field(description="Pass as ?before= for the next page; null at the end")
