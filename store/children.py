"""Child jobs: `ctx.call` runs one job and `ctx.map` one per element of a list, and the parent waits for them
without a slot, then goes on with their results.

A call or map is a durable step keyed `name#n` like `ctx.step` (store/steps.py). Its first run validates the
children (a bad job raises EnqueueError in the handler, as `enqueue` would) and ends with Suspended: the
settle that moves the parent to waiting (attempt refunded, no slot held) inserts the children and the step
row, in its own transaction and only for a run that still held its lease (store/sql/children.py). A child
therefore never exists before its parent's wait has committed, and a run that lost its lease enqueues
nothing. The step counts its children not yet ended; the transaction that ends the last one stores the
step's result, made once from the children's rows, and moves the parent back to pending (migration 0018,
dygo_children_ended). The run after it replays the steps before and returns the call's result, or the map's
results in input order, or raises ChildFailed when a child ended dead, cancelled or skipped, or was deleted
before it ended.

A replay that finds the step still waiting (an operator retried a parent cancelled while it waited)
suspends again and enqueues nothing. Once the parent was told, a child retried by an operator changes
nothing for it; while it still waits, a retried child counts again when it ends.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from dygo.store.enqueue import JobRequest, prepare, rows_json
from dygo.store.errors import ChildFailed, EnqueueError, StepError, Suspended
from dygo.store.job_handle import Job
from dygo.store.leases import Wait
from dygo.store.registry import Registry, registry
from dygo.store.sql import children as sql
from dygo.store.steps import Steps

MAX_CHILDREN = 100_000  # jobs one `ctx.map` may start
# Options a child cannot take: the step runs its children once, so an idempotency key has nothing to add.
REFUSED_OPTIONS = ("idempotency_key", "idempotency_ttl")


def kind_name(kind: str | Callable[..., Any], jobs: Registry = registry) -> str:
    """The kind to enqueue: `kind` itself, or the kind a @job handler is registered under (ValueError when it
    is not registered)."""
    if isinstance(kind, str):
        return kind
    if isinstance(kind, Job):
        return kind.kind
    for definition in jobs:
        if definition.handler is kind:
            return definition.kind
    name = getattr(kind, "__qualname__", repr(kind))
    raise ValueError(f"kind must be a kind's name or a @job handler; {name} is not registered as a job")


def prepared_children(kind: str, members: Sequence[Any], options: Mapping[str, Any]) -> str:
    """The children's rows as RECORD_CHILDREN takes them, each validated as `enqueue` validates a job:
    EnqueueError naming the bad field (and, for several children, the element's index)."""
    for option in REFUSED_OPTIONS:
        if options.get(option) is not None:
            raise EnqueueError("invalid_option", f"{option}: a child job takes none (its parent's step starts it once)")
    if len(members) > MAX_CHILDREN:
        raise EnqueueError("invalid_option", f"ctx.map starts at most {MAX_CHILDREN} child jobs, got {len(members)}")
    rows = []
    for index, member in enumerate(members):
        try:
            rows.append(prepare(JobRequest(kind, member, **options)))
        except EnqueueError as exc:
            if len(members) == 1:
                raise
            raise EnqueueError(exc.code, f"args[{index}]: {exc}", {"index": index, "errors": exc.details}) from None
    return rows_json(rows)


async def run_children(
    steps: Steps, op: str, name: str, kind: str | Callable[..., Any], members: Sequence[Any], options: dict[str, Any]
) -> Any:
    """`ctx.call` (op 'call', one member) and `ctx.map` (op 'map'): the recorded result, or ChildFailed, or
    Suspended to wait for the children."""
    key, seq = steps._next(name)
    kind = kind_name(kind)
    stored = await steps._stored()
    if key in stored:
        recorded = stored[key]
        steps._replayed(key, seq, stored)
        if recorded.state == "done":
            return None if recorded.result is None else json.loads(recorded.result)
        if recorded.state == "failed":
            told = json.loads(recorded.result or "{}")
            raise ChildFailed(key, told.get("failed") or [], told.get("results") or [])
        if recorded.state == "waiting":
            params = {"job": steps.lease.job_id, "key": key}
            reason = _reason(len(members))
            lock_key = f"step {steps.lease.job_id:020d} {key}"
            raise Suspended(key, reason, Wait(reason, sql.WAIT_AGAIN, params, sql.LOCK_STEP, lock_key))
        raise StepError(key, "recorded as another kind of step, not a child job's: they cannot share a name")
    steps._check_new(key, seq)
    if not members:
        return []
    rows = prepared_children(kind, members, options)
    params = {
        "job": steps.lease.job_id,
        "key": key,
        "op": op,
        "seq": seq,
        "attempt": steps.lease.attempt,
        "n": len(members),
        "rows": rows,
    }
    reason = _reason(len(members))
    raise Suspended(key, reason, Wait(reason, sql.RECORD_CHILDREN, params))


def _reason(n: int) -> str:
    return "1 child job" if n == 1 else f"{n} child jobs"


async def call(steps: Steps, name: str, kind: str | Callable[..., Any], args: Any, options: dict[str, Any]) -> Any:
    return await run_children(steps, "call", name, kind, [args], options)


async def map_jobs(
    steps: Steps, name: str, kind: str | Callable[..., Any], members: Sequence[Any], options: dict[str, Any]
) -> list[Any]:
    if isinstance(members, str | bytes | Mapping) or not isinstance(members, Sequence):
        raise TypeError(f"ctx.map: the args of its children must be a list, got {type(members).__name__}")
    results: list[Any] = await run_children(steps, "map", name, kind, list(members), options)
    return results


def call_sync(steps: Steps, name: str, kind: str | Callable[..., Any], args: Any, options: dict[str, Any]) -> Any:
    steps._not_on_loop("call_sync", "await ctx.call(...)")
    return steps._on_loop(call(steps, name, kind, args, options))


def map_sync(
    steps: Steps, name: str, kind: str | Callable[..., Any], members: Sequence[Any], options: dict[str, Any]
) -> list[Any]:
    steps._not_on_loop("map_sync", "await ctx.map(...)")
    results: list[Any] = steps._on_loop(map_jobs(steps, name, kind, members, options))
    return results
