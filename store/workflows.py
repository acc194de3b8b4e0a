"""Workflows: graphs of ordinary jobs, and batches with callbacks.

A workflow is named **nodes** joined by **edges**. A node is one job (`add`) or a group of any number of
jobs that counts as one node (`map`); an edge (`after=`) makes a node wait until the nodes before it have
ended. Every node is made of ordinary jobs: queues, priorities, retries, timeouts, limits, results and
progress all apply. The whole graph is written in one transaction, the caller's own if it has one open.

How it moves, all in the database, in the transaction that ends each job (migration 0017):
* A job of a node that waits is `waiting`: never claimable, outside the ready index.
* When a job of a workflow ends (succeeded, dead, cancelled, skipped: a settle, the lease recovery's dead,
  an operator's cancel, a purge) the statement's trigger counts it on its node's row. Only rows the
  statement really changed count, so a worker that lost its lease changes nothing: its settle matches no
  row. The node row is locked for the update, so of two transactions ending the last two jobs of a node,
  the second sees the first's count: exactly one sees the node end.
* A node ends when its jobs all have: succeeded (for a group: at most `allow_failures` not succeeded),
  failed, cancelled or skipped. Each edge out of it then settles by its policy, and the node after it
  counts the edge on its own row (locked: exactly one transaction sees the last edge settle). It is
  released (its jobs become pending, and workers hear of it as of any new job) once nothing is open,
  cancelled or skipped with all its jobs by a `cancel` or `skip` edge, or held by a `hold` edge.
* Nothing depends on finished jobs being kept: retention may delete a succeeded job of a running workflow.
  A single job's result is copied onto its node when it succeeds.

Policies, for when the node before an edge ends other than succeeded (the workflow's `on_failure`, or the
edge's own):
* `cancel` (default): the node after is cancelled, and so on down the graph.
* `continue`: the node after runs anyway; `ctx.deps[name].state` tells it how the one before ended.
* `skip`: the node after is skipped (a terminal state of its own), and so on down.
* `hold`: the node after waits until the one before is retried and succeeds, or an operator skips or
  cancels it.
A skipped node skips the nodes after it whatever the policy (except `continue`): skipping is never a
failure. `fail_fast=True` makes the first failed node cancel every node of the workflow not yet ended.
Retrying a failed node (its dead jobs) re-arms what it had cancelled, skipped or held.

A batch is a workflow of one group node (`jobs`) and its callbacks: `on_success` (runs if the group
succeeded, else skipped), `on_complete` (runs whatever happened) and `on_failure` (runs if it failed, else
skipped). An open batch takes more jobs (`add_to_batch`, from anywhere, a job of the batch included) and
cannot end before it is sealed (`seal_batch`), so its callbacks cannot fire before the last job is added.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import psycopg
from dygo.store import results, tracing
from dygo.store.connections import (
    Connectable,
    ajoined_transaction,
    async_connection,
    joined_transaction,
    sync_connection,
)
from dygo.store.db import one
from dygo.store.enqueue import JobRequest, copy_row, prepare
from dygo.store.errors import Conflict, EnqueueError, NotFound
from dygo.store.sql import enqueue as enqueue_sql
from dygo.store.sql import workflows as sql
from psycopg.rows import dict_row

POLICIES = ("cancel", "continue", "skip", "hold")
NODE_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.\-]{0,99}$")
MAX_NAME_LENGTH = 200  # a workflow's name
# A batch's nodes: its jobs, and its callbacks with the edge policy that gives each its meaning.
BATCH_JOBS = "jobs"
CALLBACKS = {"on_success": "skip", "on_complete": "continue", "on_failure": "on_failure"}
ENDED_NODE_STATES = frozenset({"succeeded", "failed", "cancelled", "skipped"})
FINAL_WORKFLOW_STATES = frozenset({"succeeded", "failed", "cancelled"})


class WorkflowError(EnqueueError):
    """A workflow that cannot be built: an unknown or repeated node name, a cycle, a bad option (422)."""

    http_status = 422


@dataclass
class Node:
    name: str
    jobs: list[JobRequest]
    is_group: bool
    after: dict[str, str | None]  # upstream name -> the edge's own policy (None: the workflow's)
    allow_failures: float = 0.0
    sealed: bool = True


@dataclass(frozen=True)
class WorkflowHandle:
    """What `enqueue_workflow` wrote: the workflow's id, each node's id, each single-job node's job id."""

    id: int
    nodes: Mapping[str, int]
    jobs: Mapping[str, int]
    deduplicated: bool = False


@dataclass
class Workflow:
    """A graph of jobs to enqueue at once. `add` a job node, `map` a group node; `after` names the nodes it
    waits for (a name, a list of names, or {name: policy} to give an edge its own policy)."""

    name: str
    on_failure: str = "cancel"
    fail_fast: bool = False
    idempotency_key: str | None = None
    nodes: dict[str, Node] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not 1 <= len(self.name) <= MAX_NAME_LENGTH:
            raise WorkflowError("invalid_workflow", f"name must be a string of 1 to {MAX_NAME_LENGTH} characters")
        _check_policy("on_failure", self.on_failure)

    def add(
        self, name: str, kind: str, args: Any = None, *, after: Any = (), on_failure: str | None = None, **options: Any
    ) -> str:
        """A node of one job; its name comes back, to use in a later node's `after`."""
        return self._node(name, [JobRequest(kind, args, **options)], False, after, on_failure)

    def map(
        self,
        name: str,
        kind: str,
        args: Sequence[Any],
        *,
        after: Any = (),
        on_failure: str | None = None,
        allow_failures: float = 0,
        **options: Any,
    ) -> str:
        """A group node: one job of `kind` per element of `args`, all released together, ended together.
        It succeeds with at most `allow_failures` jobs not succeeded (1 and up: a count; below 1: a fraction
        of its jobs)."""
        if isinstance(args, str | bytes | Mapping) or not isinstance(args, Sequence):
            raise WorkflowError("invalid_workflow", f"node {name!r}: map takes a list of args, one per job")
        jobs = [JobRequest(kind, member, **options) for member in args]
        return self._node(name, jobs, True, after, on_failure, allow_failures)

    def chain(self, *steps: tuple[str, str, Any]) -> str:
        """Nodes that run one after the other: each (name, kind, args) after the one before it; the first
        after nothing. The last one's name comes back."""
        previous: str | None = None
        for name, kind, args in steps:
            previous = self.add(name, kind, args, after=[] if previous is None else [previous])
        if previous is None:
            raise WorkflowError("invalid_workflow", "chain needs at least one step")
        return previous

    def _node(
        self,
        name: str,
        jobs: list[JobRequest],
        is_group: bool,
        after: Any,
        on_failure: str | None,
        allow_failures: float = 0,
        sealed: bool = True,
    ) -> str:
        if not isinstance(name, str) or not NODE_NAME.match(name):
            raise WorkflowError(
                "invalid_workflow",
                f"node name {name!r} must be 1 to 100 letters, digits, '_', '.' or '-', not starting with '.' or '-'",
            )
        if name in self.nodes:
            raise WorkflowError("invalid_workflow", f"node {name!r} is defined twice", {"node": name})
        if on_failure is not None:
            _check_policy(f"node {name!r}: on_failure", on_failure)
        if (
            isinstance(allow_failures, bool)
            or not isinstance(allow_failures, int | float)
            or allow_failures < 0
            or (allow_failures >= 1 and allow_failures != int(allow_failures))
        ):
            raise WorkflowError(
                "invalid_workflow",
                f"node {name!r}: allow_failures must be a whole count (1 and up) or a fraction from 0 to 1, "
                f"got {allow_failures!r}",
            )
        for request in jobs:
            if request.idempotency_key is not None:
                raise WorkflowError(
                    "invalid_workflow",
                    f"node {name!r}: a job of a workflow takes no idempotency_key (give one to the workflow)",
                )
        self.nodes[name] = Node(name, jobs, is_group, _edges(name, after, on_failure), float(allow_failures), sealed)
        return name

    def ordered(self) -> list[Node]:
        """The nodes upstream first, or WorkflowError naming an unknown node or a cycle."""
        for node in self.nodes.values():
            for upstream in node.after:
                if upstream not in self.nodes:
                    raise WorkflowError(
                        "invalid_workflow",
                        f"node {node.name!r} runs after {upstream!r}, which is not a node of this workflow",
                        {"node": node.name, "after": upstream},
                    )
        order: list[Node] = []
        state: dict[str, int] = {}  # 1: being visited, 2: done

        def visit(node: Node, path: list[str]) -> None:
            if state.get(node.name) == 2:
                return
            if state.get(node.name) == 1:
                cycle = path[path.index(node.name) :] + [node.name]
                raise WorkflowError(
                    "invalid_workflow", f"the nodes form a cycle: {' -> '.join(cycle)}", {"cycle": cycle}
                )
            state[node.name] = 1
            for upstream in node.after:
                visit(self.nodes[upstream], [*path, node.name])
            state[node.name] = 2
            order.append(node)

        for node in self.nodes.values():
            visit(node, [])
        return order


def chain(name: str, *steps: tuple[str, str, Any], on_failure: str = "cancel") -> Workflow:
    """A workflow of nodes that run one after the other: each (name, kind, args) after the one before."""
    workflow = Workflow(name, on_failure=on_failure)
    workflow.chain(*steps)
    return workflow


def batch(
    name: str,
    kind: str,
    args: Sequence[Any] = (),
    *,
    on_success: tuple[str, Any] | None = None,
    on_complete: tuple[str, Any] | None = None,
    on_failure: tuple[str, Any] | None = None,
    allow_failures: float = 0,
    open: bool = False,
    idempotency_key: str | None = None,
    **options: Any,
) -> Workflow:
    """A batch of jobs of `kind` (one per element of `args`) with callbacks, each (kind, args), fired once
    when the batch's jobs have all ended. `open=True`: more jobs may be added (`add_to_batch`) until it is
    sealed (`seal_batch`); it cannot end before."""
    workflow = Workflow(name, idempotency_key=idempotency_key)
    workflow.map(BATCH_JOBS, kind, list(args), allow_failures=allow_failures, **options)
    workflow.nodes[BATCH_JOBS].sealed = not open
    for callback, given in (("on_success", on_success), ("on_complete", on_complete), ("on_failure", on_failure)):
        if given is None:
            continue
        if not isinstance(given, tuple | list) or len(given) != 2:
            raise WorkflowError("invalid_workflow", f"{callback} must be (kind, args)")
        workflow.add(callback, given[0], given[1], after={BATCH_JOBS: CALLBACKS[callback]})
    return workflow


def _check_policy(where: str, policy: Any) -> None:
    if policy not in POLICIES:
        raise WorkflowError("invalid_workflow", f"{where} must be one of {', '.join(POLICIES)}, got {policy!r}")


def _edges(name: str, after: Any, on_failure: str | None) -> dict[str, str | None]:
    if isinstance(after, str):
        return {after: on_failure}
    if isinstance(after, Mapping):
        edges: dict[str, str | None] = {}
        for upstream, policy in after.items():
            if policy not in (*POLICIES, "on_failure", None):
                raise WorkflowError(
                    "invalid_workflow",
                    f"node {name!r}: the policy after {upstream!r} must be one of {', '.join(POLICIES)}, "
                    f"got {policy!r}",
                )
            edges[str(upstream)] = policy if policy is not None else on_failure
        return edges
    if isinstance(after, Sequence):
        return {str(upstream): on_failure for upstream in after}
    raise WorkflowError("invalid_workflow", f"node {name!r}: after must be a node name, a list of them or a mapping")


# --- Writing a workflow: shared by the blocking and the async twins --------------------------------------


@dataclass
class _WorkflowPlan:
    """A validated workflow, its job rows prepared: what the twins write."""

    workflow: Workflow
    nodes: list[Node]
    rows: list[list[dict[str, Any]]]  # per node, its jobs' rows

    @classmethod
    def of(cls, workflow: Workflow) -> _WorkflowPlan:
        nodes = workflow.ordered()
        trace = tracing.carrier()
        rows = [[_prepare_member(node, i, request, trace) for i, request in enumerate(node.jobs)] for node in nodes]
        return cls(workflow, nodes, rows)

    @property
    def job_count(self) -> int:
        return sum(len(rows) for rows in self.rows)

    def node_params(self, workflow_id: int, job_ids: list[int]) -> dict[str, Any]:
        first = self._first_ids(job_ids)
        return {
            "workflow": workflow_id,
            "names": [node.name for node in self.nodes],
            "groups": [node.is_group for node in self.nodes],
            "sealed": [node.sealed for node in self.nodes],
            "allow": [node.allow_failures for node in self.nodes],
            "jobs": [len(rows) for rows in self.rows],
            "deps": [len(node.after) for node in self.nodes],
            "job_ids": [None if node.is_group else first[i] for i, node in enumerate(self.nodes)],
        }

    def edge_params(self, workflow_id: int, node_ids: dict[str, int]) -> dict[str, Any]:
        upstream, downstream, policies = [], [], []
        for node in self.nodes:
            for name, policy in node.after.items():
                upstream.append(node_ids[name])
                downstream.append(node_ids[node.name])
                policies.append(policy or self.workflow.on_failure)
        return {"workflow": workflow_id, "upstream": upstream, "downstream": downstream, "policies": policies}

    def copy_rows(self, job_ids: list[int], node_ids: dict[str, int], db_now: datetime) -> Iterator[tuple[Any, ...]]:
        ids = iter(job_ids)
        for node, rows in zip(self.nodes, self.rows, strict=True):
            state = "waiting" if node.after else "pending"
            for row in rows:
                yield (*copy_row(next(ids), row, db_now), state, node_ids[node.name])

    def empty_starts(self, node_ids: dict[str, int]) -> list[int]:
        """Nodes that start running without a job: they end at once."""
        return [
            node_ids[node.name] for node, rows in zip(self.nodes, self.rows, strict=True) if not node.after and not rows
        ]

    def handle(self, workflow_id: int, node_ids: dict[str, int], job_ids: list[int]) -> WorkflowHandle:
        first = self._first_ids(job_ids)
        jobs = {
            node.name: job_id
            for node, job_id in zip(self.nodes, first, strict=True)
            if job_id is not None and not node.is_group
        }
        return WorkflowHandle(workflow_id, node_ids, jobs)

    def _first_ids(self, job_ids: list[int]) -> list[int | None]:
        first: list[int | None] = []
        position = 0
        for rows in self.rows:
            first.append(job_ids[position] if rows else None)
            position += len(rows)
        return first

    def insert_params(self) -> dict[str, Any]:
        return {
            "name": self.workflow.name,
            "fail_fast": self.workflow.fail_fast,
            "nodes": len(self.nodes),
            "key": self.workflow.idempotency_key,
        }


def _prepare_member(node: Node, index: int, request: JobRequest, trace: Mapping[str, str]) -> dict[str, Any]:
    try:
        return prepare(request, trace=trace)
    except EnqueueError as exc:
        where = f"node {node.name!r}" + (f" job {index}" if node.is_group else "")
        raise WorkflowError(
            exc.code, f"{where}: {exc}", {"node": node.name, "index": index, "errors": exc.details}
        ) from None


def enqueue_workflow(conn: Connectable, workflow: Workflow) -> WorkflowHandle:
    """Write the workflow, its nodes, edges and jobs in one transaction (nested in the caller's, if open).
    With an idempotency key another workflow already took, nothing is written and that one comes back.
    `conn`: as `enqueue` takes it (store/connections.py)."""
    plan = _WorkflowPlan.of(workflow)
    conn = sync_connection(conn)
    with joined_transaction(conn):
        inserted = conn.execute(sql.INSERT_WORKFLOW, plan.insert_params()).fetchone()
        if inserted is None:
            return _existing(one(conn.execute(sql.WORKFLOW_BY_KEY, (workflow.idempotency_key,)).fetchone())[0])
        workflow_id = inserted[0]
        db_now, job_ids = one(conn.execute(enqueue_sql.RESERVE_JOB_IDS, (plan.job_count,)).fetchone())
        cursor = conn.execute(sql.INSERT_NODES, plan.node_params(workflow_id, job_ids))
        node_ids = {name: node_id for node_id, name in cursor.fetchall()}
        conn.execute(sql.INSERT_EDGES, plan.edge_params(workflow_id, node_ids))
        with conn.cursor().copy(sql.COPY_NODE_JOBS) as copy:
            for values in plan.copy_rows(job_ids, node_ids, db_now):
                copy.write_row(values)
        if empty := plan.empty_starts(node_ids):
            conn.execute(sql.ADVANCE, (empty,))
    return plan.handle(workflow_id, node_ids, job_ids)


async def aenqueue_workflow(conn: Connectable, workflow: Workflow) -> WorkflowHandle:
    """`enqueue_workflow` on an AsyncConnection."""
    plan = _WorkflowPlan.of(workflow)
    conn = await async_connection(conn)
    async with await ajoined_transaction(conn):
        inserted = await (await conn.execute(sql.INSERT_WORKFLOW, plan.insert_params())).fetchone()
        if inserted is None:
            cursor = await conn.execute(sql.WORKFLOW_BY_KEY, (workflow.idempotency_key,))
            return _existing(one(await cursor.fetchone())[0])
        workflow_id = inserted[0]
        cursor = await conn.execute(enqueue_sql.RESERVE_JOB_IDS, (plan.job_count,))
        db_now, job_ids = one(await cursor.fetchone())
        cursor = await conn.execute(sql.INSERT_NODES, plan.node_params(workflow_id, job_ids))
        node_ids = {name: node_id for node_id, name in await cursor.fetchall()}
        await conn.execute(sql.INSERT_EDGES, plan.edge_params(workflow_id, node_ids))
        async with conn.cursor().copy(sql.COPY_NODE_JOBS) as copy:
            for values in plan.copy_rows(job_ids, node_ids, db_now):
                await copy.write_row(values)
        if empty := plan.empty_starts(node_ids):
            await conn.execute(sql.ADVANCE, (empty,))
    return plan.handle(workflow_id, node_ids, job_ids)


def _existing(workflow_id: int) -> WorkflowHandle:
    return WorkflowHandle(workflow_id, {}, {}, deduplicated=True)


# --- What a workflow job is told: its upstream nodes ------------------------------------------------------


@dataclass(frozen=True)
class Dep:
    """A node upstream of the running job's node, as it ended: `ctx.deps[name]`."""

    name: str
    node_id: int
    is_group: bool
    state: str  # succeeded, failed, cancelled, skipped (a `continue` edge runs the job after any of them)
    result: Any  # a single job's result (None for a group: iterate `results`)
    counts: Mapping[str, int]  # jobs, succeeded, dead, cancelled, skipped
    job_id: int | None

    async def results(self, conn: psycopg.AsyncConnection, page: int = 1000) -> AsyncIterator[tuple[int, str, Any]]:
        """Each job of the node as (job id, state, result), in job order, a page at a time. Jobs retention
        has deleted are missing."""
        after = 0
        while True:
            cursor = await conn.execute(sql.GROUP_RESULTS, {"node": self.node_id, "after": after, "limit": page})
            rows = await cursor.fetchall()
            for row in rows:
                yield row[0], row[1], row[2]
            if len(rows) < page:
                return
            after = rows[-1][0]


@dataclass(frozen=True)
class NodeOf:
    """The node a running job belongs to: `ctx.workflow`."""

    workflow_id: int
    node_id: int
    name: str


async def aread_deps(
    conn: psycopg.AsyncConnection, node_ids: Sequence[int]
) -> dict[int, tuple[NodeOf, dict[str, Dep]]]:
    """For each node, itself and its upstream nodes by name: two statements for a whole claim."""
    wanted = sorted(set(node_ids))
    found: dict[int, tuple[NodeOf, dict[str, Dep]]] = {}
    for node_id, workflow_id, name in await (await conn.execute(sql.NODES_OF_JOBS, (wanted,))).fetchall():
        found[node_id] = (NodeOf(workflow_id, node_id, name), {})
    for row in await (await conn.execute(sql.DEPS_OF_NODES, (wanted,))).fetchall():
        downstream, node_id, name, is_group, state, result, jobs, succeeded, dead, cancelled, skipped, job_id = row
        counts = {"jobs": jobs, "succeeded": succeeded, "dead": dead, "cancelled": cancelled, "skipped": skipped}
        if downstream in found:
            found[downstream][1][name] = Dep(name, node_id, is_group, state, result, counts, job_id)
    return found


# --- Reading and acting on workflows -------------------------------------------------------------------------


def get_workflow(conn: psycopg.Connection, workflow_id: int) -> dict[str, Any]:
    """The workflow with its nodes (counters, never a count of members) and edges; NotFound if none."""
    with conn.cursor(row_factory=dict_row) as cursor:
        workflow = cursor.execute(sql.GET_WORKFLOW, (workflow_id,)).fetchone()
        if workflow is None:
            raise NotFound("workflow_not_found", f"no workflow {workflow_id}")
        nodes = cursor.execute(sql.WORKFLOW_NODES, (workflow_id,)).fetchall()
        edges = cursor.execute(sql.WORKFLOW_EDGES, (workflow_id,)).fetchall()
    return _shown(workflow, nodes, edges)


async def aget_workflow(conn: psycopg.AsyncConnection, workflow_id: int) -> dict[str, Any]:
    async with conn.cursor(row_factory=dict_row) as cursor:
        workflow = await (await cursor.execute(sql.GET_WORKFLOW, (workflow_id,))).fetchone()
        if workflow is None:
            raise NotFound("workflow_not_found", f"no workflow {workflow_id}")
        nodes = await (await cursor.execute(sql.WORKFLOW_NODES, (workflow_id,))).fetchall()
        edges = await (await cursor.execute(sql.WORKFLOW_EDGES, (workflow_id,))).fetchall()
    return _shown(workflow, nodes, edges)


def _shown(workflow: dict[str, Any], nodes: list[dict[str, Any]], edges: list[dict[str, Any]]) -> dict[str, Any]:
    waiting_on: dict[str, list[str]] = {}
    blocked_by: dict[str, list[str]] = {}
    upstream_states = {node["name"]: node["state"] for node in nodes}
    for edge in edges:
        if edge["state"] == "open":
            waiting_on.setdefault(edge["downstream"], []).append(edge["upstream"])
        elif edge["state"] == "held":
            blocked_by.setdefault(edge["downstream"], []).append(edge["upstream"])
    shown_nodes = []
    for node in nodes:
        node = dict(node)
        node.pop("workflow_id")
        node["waiting_on"] = waiting_on.get(node["name"], [])
        node["blocked_by"] = blocked_by.get(node["name"], [])
        node["wait"] = _wait_reason(node, upstream_states)
        shown_nodes.append(node)
    workflow = dict(workflow)
    workflow["nodes"] = shown_nodes
    workflow["edges"] = edges
    workflow["result"] = workflow_result(workflow)
    return workflow


def _wait_reason(node: dict[str, Any], states: Mapping[str, str]) -> str | None:
    """What a waiting node waits for, in words: 'waiting on 1 of 2: charge', 'blocked by failed charge'."""
    if node["state"] != "waiting":
        return None
    if node["blocked_by"]:
        return "blocked by " + ", ".join(f"{states.get(name, 'failed')} {name}" for name in node["blocked_by"])
    if not node["sealed"] and node["deps_left"] == 0:
        return "open batch: waiting to be sealed"
    return f"waiting on {node['deps_left']} of {node['deps']}: " + ", ".join(node["waiting_on"])


def workflow_result(workflow: Mapping[str, Any]) -> dict[str, Any] | None:
    """A finished workflow's result: the result of each single-job node nothing runs after, by name."""
    if workflow["state"] not in FINAL_WORKFLOW_STATES:
        return None
    upstream = {edge["upstream"] for edge in workflow["edges"]}
    return {
        node["name"]: node["result"]
        for node in workflow["nodes"]
        if node["name"] not in upstream and not node["is_group"]
    }


def list_workflows(
    conn: psycopg.Connection,
    *,
    state: str | None = None,
    name: str | None = None,
    before: int | None = None,
    limit: int = 50,
) -> list[dict[str, Any]]:
    """Newest first; the next page starts before the last id of this one."""
    params = {"state": state, "name": name, "before": before, "limit": limit}
    with conn.cursor(row_factory=dict_row) as cursor:
        return cursor.execute(sql.LIST_WORKFLOWS, params).fetchall()


async def alist_workflows(
    conn: psycopg.AsyncConnection,
    *,
    state: str | None = None,
    name: str | None = None,
    before: int | None = None,
    limit: int = 50,
) -> list[dict[str, Any]]:
    params = {"state": state, "name": name, "before": before, "limit": limit}
    async with conn.cursor(row_factory=dict_row) as cursor:
        return await (await cursor.execute(sql.LIST_WORKFLOWS, params)).fetchall()


def cancel_workflow(conn: psycopg.Connection, workflow_id: int) -> dict[str, Any]:
    """Cancel every node not yet ended (a job already running ends as it will); Conflict if it has ended."""
    with conn.transaction():
        _, marked = one(conn.execute(sql.CANCEL_WORKFLOW, {"workflow": workflow_id}).fetchone())
        if not marked:
            workflow = get_workflow(conn, workflow_id)
            raise Conflict("workflow_not_running", f"workflow {workflow_id} is {workflow['state']}: nothing to cancel")
    return get_workflow(conn, workflow_id)


def act_on_node(conn: psycopg.Connection, workflow_id: int, node_name: str, action: str) -> dict[str, Any]:
    """retry (its dead and cancelled jobs, re-arming what its failure stopped), skip or cancel (its jobs not
    started) one node; the workflow as it is after. NotFound, or Conflict when nothing of it could move."""
    statement = {"retry": sql.RETRY_NODE_JOBS, "skip": sql.SKIP_NODE_JOBS, "cancel": sql.CANCEL_NODE_JOBS}[action]
    with conn.transaction():
        conn.execute(sql.LOCK_WORKFLOW, (workflow_id,))
        node = _node(conn, workflow_id, node_name)
        if action == "retry" and (node["cancels"] or node["skips"]):
            raise Conflict(
                "node_not_retryable",
                f"node {node_name!r} did not run: a node before it failed or was skipped; retry that node instead",
            )
        moved = conn.execute(statement, {"node": node["id"]}).fetchall()
        if not moved:
            raise Conflict("node_state", f"node {node_name!r} is {node['state']}: no job of it can be {_past(action)}")
    return get_workflow(conn, workflow_id)


def _past(action: str) -> str:
    return {"retry": "retried", "skip": "skipped", "cancel": "cancelled"}[action]


def _node(conn: psycopg.Connection, workflow_id: int, name: str) -> dict[str, Any]:
    with conn.cursor(row_factory=dict_row) as cursor:
        node = cursor.execute(sql.NODE_BY_NAME, {"workflow": workflow_id, "node": name}).fetchone()
    if node is None:
        if conn.execute(sql.GET_WORKFLOW, (workflow_id,)).fetchone() is None:
            raise NotFound("workflow_not_found", f"no workflow {workflow_id}")
        raise NotFound("node_not_found", f"workflow {workflow_id} has no node {name!r}")
    return node


def add_to_batch(
    conn: psycopg.Connection, workflow_id: int, kind: str, args: Sequence[Any], **options: Any
) -> list[int]:
    """Add jobs to an open batch (its `jobs` node), in one transaction: counted before they exist, so the
    batch cannot end between. Conflict once it is sealed."""
    requests = [JobRequest(kind, member, **options) for member in args]
    with conn.transaction():
        node = _node(conn, workflow_id, BATCH_JOBS)
        target = Node(BATCH_JOBS, requests, True, {})
        trace = tracing.carrier()
        rows = [_prepare_member(target, i, request, trace) for i, request in enumerate(requests)]
        grown = conn.execute(sql.GROW_NODE, {"node": node["id"], "n": len(rows)}).fetchone()
        if grown is None:
            raise Conflict("batch_sealed", f"batch {workflow_id} is sealed: it takes no more jobs")
        state = "pending" if grown[0] == "running" else "waiting"
        db_now, job_ids = one(conn.execute(enqueue_sql.RESERVE_JOB_IDS, (len(rows),)).fetchone())
        with conn.cursor().copy(sql.COPY_NODE_JOBS) as copy:
            for job_id, row in zip(job_ids, rows, strict=True):
                copy.write_row((*copy_row(job_id, row, db_now), state, node["id"]))
    return list(job_ids)


def seal_batch(conn: psycopg.Connection, workflow_id: int) -> dict[str, Any]:
    """Seal an open batch: it takes no more jobs and ends when its jobs have (at once if they all have)."""
    with conn.transaction():
        conn.execute(sql.LOCK_WORKFLOW, (workflow_id,))
        node = _node(conn, workflow_id, BATCH_JOBS)
        _, sealed = one(conn.execute(sql.SEAL_NODE, {"node": node["id"]}).fetchone())
        if not sealed:
            raise Conflict("batch_sealed", f"batch {workflow_id} is already sealed")
    return get_workflow(conn, workflow_id)


# --- Dashboard ---------------------------------------------------------------------------------------------


def node_of_job(conn: psycopg.Connection, job_id: int) -> dict[str, Any] | None:
    """The workflow and node a job belongs to (workflow_id, workflow, workflow_state, node, is_group, state),
    or None for a job outside any workflow (or no such job)."""
    with conn.cursor(row_factory=dict_row) as cursor:
        return cursor.execute(sql.NODE_OF_JOB, (job_id,)).fetchone()


# --- Waiting for a workflow to end (serve's GET /api/v1/workflows/{id}?wait=) ---------------------------------


def waiter_key(workflow_id: int) -> int:
    """The id a workflow's waiter registers as in dygo_result_waiters and hears on `dygo_finished` when the
    workflow ends (migration 0017, dygo_notify_workflow_ended): minus the workflow's id, never a job's."""
    return -workflow_id


async def aregister_waiter(conn: psycopg.AsyncConnection, workflow_id: int, seconds: float) -> int:
    """Register a waiter for the workflow's end, for `seconds` (at most results.WAITER_LIFETIME): the
    waiter's id. A job's registration (store/results.py), under the same lock: a read of the workflow
    after it returns sees every end committed before, and an end after it notifies. `conn` is autocommit
    and idle; delete the row with results.aunregister when done."""
    waiter, _ = await results.aregister(conn, waiter_key(workflow_id), seconds)
    return waiter


# What a workflow's state may be (dygo_workflows.state): running until every node has ended.
WORKFLOW_STATES = ("running", "succeeded", "failed", "cancelled")


# --- Proofs: the counters checked against the rows -----------------------------------------------------------


def check_invariants(conn: psycopg.Connection, workflow_ids: Sequence[int] | None = None) -> list[str]:
    """Every way the counters of the workflows (all, or those given) disagree with their rows, one line each
    ('workflow 12 node resize: jobs_left 3, but 2 job rows not ended'); none when the engine kept its books.
    Exact while nothing moves: run it on a quiet database, or expect a transaction's worth of lag."""
    params = {"workflows": None if workflow_ids is None else list(workflow_ids)}
    return [
        f"workflow {workflow_id}" + (f" node {node}" if node is not None else "") + f": {violation}"
        for workflow_id, node, violation in conn.execute(sql.CHECK_INVARIANTS, params).fetchall()
    ]
