"""The worker's side of the store once jobs are claimed (store/claim.py claims them): renew leases, settle
outcomes, recover expired leases.

Each function is one statement for a whole batch, so the hot path costs a few round trips per
batch rather than per job.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import psycopg
from dygo.store.codecs import array, plain_array
from dygo.store.db import aroll_back, one
from dygo.store.migrate import check_version
from dygo.store.sql import leases as sql
from dygo.store.sql import schema, workers
from dygo.store.sql import workflows as workflow_sql
from psycopg.rows import AsyncRowFactory, tuple_row

log = logging.getLogger("dygo.worker")


@dataclass(slots=True)
class ClaimedJob:
    id: int
    kind: str
    queue: str
    args: dict[str, Any]
    meta: dict[str, str]
    attempt: int
    max_attempts: int
    enqueued_at: datetime
    lease_token: str  # a UUID's text: loaded and hashed several times faster than a UUID
    waited: float = 0.0  # seconds from due to claim (store/timings.py: latency)
    node_id: int | None = None  # its workflow node (store/workflows.py)
    workflow: Any = None  # its node (workflows.NodeOf), read at the claim
    deps: Mapping[str, Any] | None = None  # its node's upstream nodes by name (workflows.Dep), read at the claim
    # A rate limit's start time for it (store/claim.py), on this process's time.monotonic(): its handler does
    # not start before. None: at once.
    not_before: float | None = None
    # The latest time (the same clock) its handler may start, when a rate limit held its claim back (the limit
    # is in use): a later start would crowd the starts after it. None: no such bound.
    start_by: float | None = None


Progress = tuple[float, str | None]  # (fraction, message) of a `ctx.progress` report


@dataclass(frozen=True, slots=True)
class BatchAppend:
    """Jobs a run adds to an open batch (`ctx.add_to_batch`), written by the settle that records its success."""

    workflow_id: int
    rows: str  # the prepared job rows, as store.enqueue.rows_json gives them
    count: int


@dataclass(frozen=True, slots=True)
class Wait:
    """What a suspended run waits for (`ctx.wait_for_event`, `ctx.call`, `ctx.map`: errors.Suspended), written
    in the transaction of the settle that moves its job to waiting. `record` runs after the settle and must
    write only for a job that transaction settled (its row's xmin is pg_current_xact_id(), as APPEND_TO_BATCH
    checks): a run that lost its lease records no wait. `lock`, when given, runs before the settle takes any
    job row, for the rows the wait shares with whoever ends it (an event's row), in `lock_key` order across
    the batch: the one who ends the wait takes them in that order too, so the two queue instead of deadlock."""

    reason: str  # what it waits for, in words: "event 'order:42'", "1 child job"
    record: str  # a store/sql statement
    params: Mapping[str, Any]
    lock: str | None = None
    lock_key: str = ""


@dataclass(slots=True)
class Succeeded:
    job: ClaimedJob
    result: str | None  # JSON text
    progress: Progress | None = None  # the run's latest report, stored by the settle (None: column unchanged)
    appends: list[BatchAppend] | None = None  # jobs the run added to an open batch


@dataclass(slots=True)
class Unsuccessful:
    """Back to pending after `delay` (retry, snooze, hand-back), waiting (a durable wait), or dead."""

    job: ClaimedJob
    state: str  # 'pending', 'waiting' or 'dead'
    delay: float = 0.0
    refund_attempt: bool = False  # snooze and hand-back do not spend an attempt
    # A sleep's: the time.monotonic() `delay` counts from. The settle takes off the time since, so the job's
    # run_at is its wake time however long the settle waited, with no clock of this host involved.
    delay_since: float | None = None
    error: str | None = None
    traceback: str | None = None
    progress: Progress | None = None  # the run's latest report, stored by the settle (None: column unchanged)
    wait: Wait | None = None  # a waiting job's: what it waits for


Outcome = Succeeded | Unsuccessful


async def check_schema(conn: psycopg.AsyncConnection) -> None:
    exists = one(await (await conn.execute(schema.HAS_MIGRATIONS_TABLE)).fetchone())[0]
    version = one(await (await conn.execute(schema.SCHEMA_VERSION)).fetchone())[0] if exists else None
    check_version(version)


async def listen(conn: psycopg.AsyncConnection) -> None:
    """Subscribe `conn` to the queues of jobs that become pending (`jobs_pending` reads each payload)."""
    await conn.execute(sql.LISTEN_FOR_JOBS)


def jobs_pending(payload: str) -> tuple[str, datetime | None]:
    """A dygo_jobs notification's queue and the earliest run_at of the jobs it tells of: the trigger's
    payload is the queue, a space and that run_at in epoch seconds. A payload with the queue alone (a limit's
    freed slot) gives None: it says nothing of where in line its jobs are."""
    queue, _, at = payload.partition(" ")
    return queue, datetime.fromtimestamp(float(at), UTC) if at else None


# A claim's and a settle's transactions, each sent in one pipeline: one round trip where BEGIN, the
# statements and COMMIT each took one. A settle of two data statements is explicit, not the pipeline's
# implicit transaction: a statement that fails in the client (a value psycopg cannot send) ends the
# pipeline early, and its sync would commit what went before.
BEGIN = "BEGIN"
COMMIT = "COMMIT"
# A settle's: sequential scans priced out, and one generic plan for each prepared settle statement. Left to
# itself, the server plans the settle afresh at every call (the generic plan's estimate for arrays of unknown
# length loses to the custom plans' for a few ids), and that planning is a large share of a small settle's
# server CPU. Both end with the transaction.
SETTLE_SETTINGS = (
    "SELECT set_config('enable_seqscan', 'off', true), set_config('plan_cache_mode', 'force_generic_plan', true)"
)


async def on_indexes(
    conn: psycopg.AsyncConnection[Any],
    query: str,
    params: Mapping[str, Any],
    row_factory: AsyncRowFactory[Any] = tuple_row,
) -> psycopg.AsyncCursor[Any]:
    """Run `query` after sql.INDEX_SCANS_ONLY, in one string and one round trip: the parameters are bound
    client-side (a string of several statements cannot take server-side parameters), so the statement is
    planned on every call against the table as it is. Returns the cursor on the query's result, its rows made
    by `row_factory`."""
    cursor = psycopg.AsyncClientCursor(conn, row_factory=row_factory)
    await cursor.execute(";\n".join([sql.INDEX_SCANS_ONLY, query]), params, prepare=False)
    cursor.nextset()
    return cursor


async def renew(conn: psycopg.AsyncConnection, jobs: list[ClaimedJob], ttl: float) -> set[int]:
    """Extend the leases; returns the ids still held (a missing id was lost to the reaper)."""
    if not jobs:
        return set()
    params = {"ids": [j.id for j in jobs], "tokens": [j.lease_token for j in jobs], "ttl": ttl}
    return {row[0] for row in await (await on_indexes(conn, sql.RENEW_LEASES, params)).fetchall()}


async def settle(conn: psycopg.AsyncConnection, outcomes: list[Outcome], notify: list[str] | None = None) -> set[int]:
    """Record outcomes, fenced by lease token; returns the ids that were settled. One transaction and
    one round trip (an autocommit connection): all of the batch is settled, or none of it. `notify`: queues
    whose workers to wake at its commit (limits.freed_queues)."""
    successes = [o for o in outcomes if isinstance(o, Succeeded)]
    others = [o for o in outcomes if isinstance(o, Unsuccessful)]
    cursors = []
    # The first statement locks every row of the batch, in id order (its `locked` CTE): the second's rows
    # are then held already, and this transaction never holds one row while waiting for a lower one.
    batch = [o.job.id for o in outcomes]
    appends = [(o, append) for o in successes for append in o.appends or ()]
    waits = [o.wait for o in others if o.wait is not None]
    # One data statement (the usual batch: successes only) needs no BEGIN and COMMIT: the pipeline's implicit
    # transaction holds it, and a statement psycopg cannot send leaves nothing of the batch. Two need them.
    explicit = (bool(successes) and bool(others)) or bool(appends) or bool(waits)
    added: list[tuple[Succeeded, BatchAppend, psycopg.AsyncCursor[Any]]] = []
    try:
        async with conn.pipeline():
            if explicit:
                await conn.execute(BEGIN)
            # Its own statement, not on_indexes: a settle's arrays grow with the batch, and binding them
            # client-side costs the worker more CPU per job than binding them server-side.
            await conn.execute(SETTLE_SETTINGS)
            for wait in sorted((w for w in waits if w.lock is not None), key=lambda w: w.lock_key):
                assert wait.lock is not None
                await conn.execute(wait.lock, wait.params)
            if explicit and any(o.job.node_id is not None for o in outcomes):
                await conn.execute(sql.LOCK_SETTLE_WORKFLOWS, {"lock": plain_array(map(str, batch))})
            if successes:
                ids = plain_array([str(o.job.id) for o in successes])
                params = {
                    "lock": plain_array(map(str, batch)) if others else ids,
                    "ids": ids,
                    "tokens": plain_array([o.job.lease_token for o in successes]),
                    "results": array(o.result for o in successes),
                    **_progress_params(successes),
                }
                cursors.append(await conn.execute(sql.SETTLE_SUCCEEDED, params))
            if others:
                ids = plain_array([str(o.job.id) for o in others])
                params = {
                    "lock": ids,  # the whole batch when it has no successes
                    "ids": ids,
                    "tokens": plain_array([o.job.lease_token for o in others]),
                    "states": array(o.state for o in others),
                    "delays": array(settle_delay(o) for o in others),
                    "refunds": array(o.refund_attempt for o in others),
                    "errors": array(o.error for o in others),
                    "tracebacks": array(o.traceback for o in others),
                    **_progress_params(others),
                }
                cursors.append(await conn.execute(sql.SETTLE_UNSUCCESSFUL, params))
            # After the settle, in its transaction: only a run this transaction settled records its wait or
            # adds its jobs.
            for wait in waits:
                await conn.execute(wait.record, wait.params)
            for outcome, append in appends:
                grow = {"job": outcome.job.id, "workflow": append.workflow_id, "rows": append.rows, "n": append.count}
                added.append((outcome, append, await conn.execute(workflow_sql.APPEND_TO_BATCH, grow)))
            if notify:
                await conn.execute(sql.NOTIFY_QUEUES, {"queues": notify})
            if explicit:
                await conn.execute(COMMIT)
    except BaseException:
        await aroll_back(conn)
        raise
    settled = {row[0] for cursor in cursors for row in await cursor.fetchall()}
    for outcome, append, cursor in added:
        if outcome.job.id in settled and len(await cursor.fetchall()) < append.count:
            log.warning(
                "job %s: %d jobs not added to batch %s: it was sealed before the job finished",
                outcome.job.id,
                append.count,
                append.workflow_id,
            )
    return settled


def _progress_params(outcomes: list[Succeeded] | list[Unsuccessful]) -> dict[str, str | None]:
    """The settle's progress columns: NULL arrays (nothing to store, nothing sent per job) unless a job
    of the batch has a report; then one fraction and message per job, None where it has none."""
    if all(o.progress is None for o in outcomes):
        return {"fractions": None, "messages": None}
    return {
        "fractions": array(o.progress[0] if o.progress else None for o in outcomes),
        "messages": array(o.progress[1] if o.progress else None for o in outcomes),
    }


RECOVER_BATCH = 1000  # leases recovered per pass at most


@dataclass(slots=True)
class Recovered:
    jobs: list[tuple[int, str]]  # (id, new state): pending again, or dead as poison
    clock: datetime  # the database's now() for the pass: deadlines before it that it could see are done


async def recover_expired(conn: psycopg.AsyncConnection, max_reaps: int, since: datetime | None = None) -> Recovered:
    """Put back (or kill as poison) the jobs whose lease expired at `since` or later (None: whenever), at most
    RECOVER_BATCH of them."""
    cursor = await on_indexes(
        conn, sql.RECOVER_EXPIRED_LEASES, {"max_reaps": max_reaps, "since": since, "batch": RECOVER_BATCH}
    )
    clock, ids, states = one(await cursor.fetchone())
    return Recovered(list(zip(ids, states, strict=True)), clock)


async def hold_presence(conn: psycopg.AsyncConnection, worker_id: str) -> bool:
    """Take the worker's presence lock on `conn`, a session of its own straight to PostgreSQL; False when
    another session holds that key (worker/presence.py)."""
    return bool(one(await (await conn.execute(sql.HOLD_PRESENCE, {"worker": worker_id})).fetchone())[0])


@dataclass(slots=True)
class Presence:
    server_started: datetime  # the server's start time: another one means a restart or a failover
    held: dict[str, bool]  # registered worker id -> whether its presence lock is held now


async def worker_presence(conn: psycopg.AsyncConnection) -> Presence:
    started, workers, held = one(await (await conn.execute(sql.WORKER_PRESENCE)).fetchone())
    return Presence(started, dict(zip(workers, held, strict=True)))


async def recover_absent(conn: psycopg.AsyncConnection, owners: list[str], max_reaps: int) -> Recovered:
    """Put back (or kill as poison) the active jobs of the workers `owners`, found gone, whose presence lock
    is still free; at most RECOVER_BATCH of them."""
    params = {"owners": owners, "max_reaps": max_reaps, "batch": RECOVER_BATCH}
    clock, ids, states = one(await (await on_indexes(conn, sql.RECOVER_ABSENT_WORKERS, params)).fetchone())
    return Recovered(list(zip(ids, states, strict=True)), clock)


async def heartbeat(
    conn: psycopg.AsyncConnection, worker_id: str, hostname: str, pid: int, queues: dict[str, int]
) -> None:
    params = {"id": worker_id, "hostname": hostname, "pid": pid, "queues": json.dumps(queues)}
    await conn.execute(workers.WORKER_HEARTBEAT, params)


async def forget_stale_workers(conn: psycopg.AsyncConnection, older_than: float) -> None:
    await conn.execute(workers.FORGET_STALE_WORKERS, (older_than,))


async def worker_gone(conn: psycopg.AsyncConnection, worker_id: str) -> None:
    await conn.execute(workers.WORKER_GONE, (worker_id,))


async def report_progress(conn: psycopg.AsyncConnection, reports: list[tuple[ClaimedJob, Progress]]) -> set[int]:
    """Write the latest progress of running jobs, fenced by lease token; returns the ids written."""
    params = {
        "ids": [job.id for job, _ in reports],
        "tokens": [job.lease_token for job, _ in reports],
        "fractions": [fraction for _, (fraction, _) in reports],
        "messages": [message for _, (_, message) in reports],
    }
    return {row[0] for row in await (await on_indexes(conn, sql.REPORT_PROGRESS, params)).fetchall()}


def settle_delay(outcome: Unsuccessful) -> float:
    """Seconds from now to the run_at of a job settled back to pending (a sleep's: to its wake time)."""
    if outcome.delay_since is None:
        return float(outcome.delay)
    return max(outcome.delay - (time.monotonic() - outcome.delay_since), 0.0)
