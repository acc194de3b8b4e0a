"""The worker's side of the store: claim a batch, renew leases, settle outcomes, recover expired leases.

Each function is one statement for a whole batch, so the hot path costs a few round trips per
batch rather than per job.
"""

from __future__ import annotations

import contextlib
import json
import weakref
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import psycopg
from dygo.store import queries
from dygo.store.db import through_transaction_pooler
from dygo.store.migrate import check_version
from dygo.store.registry import Registry, registry


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
    lease_token: str  # a UUID's text: loaded and hashed several times faster than a UUID (issue 12, item 7)
    waited: float = 0.0  # seconds from due to claim (store/timings.py: latency)


def claimed_job(row: Sequence[Any]) -> ClaimedJob:
    """A claimed job from the first columns of a claim's row (queries.CLAIMED_JOB_COLUMNS)."""
    return ClaimedJob(row[0], row[1], row[2], row[3], row[4] or {}, row[5], row[6], row[7], row[8], row[9])


Progress = tuple[float, str | None]  # (fraction, message) of a `ctx.progress` report


@dataclass(slots=True)
class Succeeded:
    job: ClaimedJob
    result: str | None  # JSON text
    progress: Progress | None = None  # the run's latest report, stored by the settle (None: column unchanged)


@dataclass(slots=True)
class Unsuccessful:
    """Back to pending after `delay` (retry, snooze, hand-back), or dead."""

    job: ClaimedJob
    state: str  # 'pending' or 'dead'
    delay: float = 0.0
    refund_attempt: bool = False  # snooze and hand-back do not spend an attempt
    error: str | None = None
    traceback: str | None = None
    progress: Progress | None = None  # the run's latest report, stored by the settle (None: column unchanged)


Outcome = Succeeded | Unsuccessful


@dataclass(slots=True)
class Claim:
    jobs: list[ClaimedJob]  # in claim order
    due_in: dict[str, float]  # queue -> seconds until its next scheduled job, for queues that came back short
    clock: datetime | None = None  # the database's now() for the claim (None: nothing was claimed for)
    # Queues a cluster-wide limit held back (store/limits.py): seconds until worth claiming again (0: at once,
    # there may be jobs of other keys or kinds ready).
    held: dict[str, float] = field(default_factory=dict)
    # Queue -> run_at of the last job claimed for it (in claim order): where a backlog's next walk may start.
    reached: dict[str, datetime] = field(default_factory=dict)
    limited: bool = False  # a cluster-wide limit concerned the claim (it counts claimed jobs as running)


def array(values: Iterable[object]) -> str:
    """A PostgreSQL array literal of `values` (None: NULL), for a parameter the statement casts to its array
    type (`%(ids)s::bigint[]`). Sent as text of unknown type: psycopg's list dumping (finding each list's
    element type, then a dumper for it) cost ~85 us per list in the worker's claim and settle, about 10 lists
    a round; this costs a few (issue 12, item 7). Every element is quoted, with backslash and double quote
    escaped: what any element type's input reads."""
    return (
        "{"
        + ",".join(
            "NULL" if v is None else '"' + str(v).replace("\\", "\\\\").replace('"', '\\"') + '"' for v in values
        )
        + "}"
    )


def plain_array(texts: Iterable[str]) -> str:
    """An array literal of elements whose text needs no quoting: integers, and uuids. The settle sends three
    such arrays per batch; `array`'s quoting cost it ~3 us a job."""
    return "{" + ",".join(texts) + "}"


async def check_schema(conn: psycopg.AsyncConnection) -> None:
    exists = (await (await conn.execute(queries.HAS_MIGRATIONS_TABLE)).fetchone())[0]
    version = (await (await conn.execute(queries.SCHEMA_VERSION)).fetchone())[0] if exists else None
    check_version(version)


async def listen(conn: psycopg.AsyncConnection) -> None:
    """Subscribe `conn` to the queue names of jobs that become pending."""
    await conn.execute(queries.LISTEN_FOR_JOBS)


# A claim's and a settle's transactions, each sent in one pipeline: one round trip where BEGIN, the
# statements and COMMIT each took one. A settle of two data statements is explicit, not the pipeline's
# implicit transaction: a statement that fails in the client (a value psycopg cannot send) ends the
# pipeline early, and its sync would commit what went before.
BEGIN = "BEGIN"
COMMIT = "COMMIT"
# A claim's own transaction, in one statement: sequential scans priced out (queries.INDEX_SCANS_ONLY), a commit
# that does not wait for the WAL flush, and one generic plan for the prepared claim
# rather than a custom plan per call (what the server would otherwise pick for it: a plan per call is the
# planning the prepare is there to save). All three end with the transaction.
CLAIM_SETTINGS = (
    "SELECT set_config('enable_seqscan', 'off', true), set_config('synchronous_commit', 'off', true), "
    "set_config('plan_cache_mode', 'force_generic_plan', true)"
)
# A settle's: sequential scans priced out, and one generic plan for each prepared settle statement. Left to
# itself, the server planned the settle afresh at every call (the generic plan's estimate for arrays of unknown
# length lost to the custom plans' for a few ids): a third of a 4-job settle's CPU, 525 -> 340 us per settle
# (issue 12, item 7). Both end with the transaction.
SETTLE_SETTINGS = (
    "SELECT set_config('enable_seqscan', 'off', true), set_config('plan_cache_mode', 'force_generic_plan', true)"
)


# The same three settings for a whole session: the worker's own claim connection, when it goes straight to
# PostgreSQL (through a transaction pooler a session is not the worker's, and nothing is prepared there). Its
# claims are then one statement each, with no pipeline around them (~0.2 ms of the worker's CPU per claim).
# Every claim on it commits without waiting for the flush, a limited claim too (store/limits.py): what a
# server crash loses is the whole claim, its start-log rows with it, so its jobs are pending again.
CLAIM_SESSION = (
    "SELECT set_config('enable_seqscan', 'off', false), set_config('synchronous_commit', 'off', false), "
    "set_config('plan_cache_mode', 'force_generic_plan', false)"
)
_claim_sessions: weakref.WeakSet[psycopg.AsyncConnection] = weakref.WeakSet()


# psycopg hands json.loads the bytes of a json or jsonb value, and json.loads first works out their encoding: a
# third of a claimed job's load time (issue 12, item 7). The server sends UTF-8 text (the connection's
# client_encoding, as json.loads assumes of bytes too), without whitespace around the value.
_decode_json = json.JSONDecoder().raw_decode


def _load_json(data: bytes) -> Any:
    return _decode_json(data.decode())[0]


async def claim_session(conn: psycopg.AsyncConnection) -> None:
    """Make `conn` (a connection of its own, kept for claims) a claim session: the jobs' arguments load faster
    and, unless it goes through a transaction pooler, claims on it skip the per-transaction settings."""
    psycopg.types.json.set_json_loads(_load_json, conn)
    if through_transaction_pooler():
        return
    await conn.execute(CLAIM_SESSION)
    _claim_sessions.add(conn)


async def roll_back(conn: psycopg.AsyncConnection) -> None:
    """After a pipelined transaction failed: roll back what it left open (nothing of it stays)."""
    if not conn.closed and not conn.broken:
        with contextlib.suppress(psycopg.Error, OSError):  # the error that got us here is the one to raise
            await conn.rollback()


async def claim(
    conn: psycopg.AsyncConnection, queue: str, limit: int, owner: str, ttl: float, jobs: Registry | None = None
) -> list[ClaimedJob]:
    """Claim up to `limit` ready jobs of one queue (claim_queues for one queue)."""
    return await claim_queues(conn, {queue: limit}, owner, ttl, jobs)


async def claim_queues(
    conn: psycopg.AsyncConnection,
    limits: Mapping[str, int],
    owner: str,
    ttl: float,
    jobs: Registry | None = None,
    kind_free: Mapping[str, int] | None = None,
) -> list[ClaimedJob]:
    """Claim up to limits[queue] ready jobs of each queue in one statement, in claim order (claim_with_next_due)."""
    return (await claim_with_next_due(conn, limits, owner, ttl, jobs, kind_free=kind_free)).jobs


async def claim_with_next_due(
    conn: psycopg.AsyncConnection,
    limits: Mapping[str, int],
    owner: str,
    ttl: float,
    jobs: Registry | None = None,
    since: Mapping[str, datetime | None] | None = None,
    kind_free: Mapping[str, int] | None = None,
) -> Claim:
    """Claim up to limits[queue] ready jobs of each queue in one statement, in claim order, and learn, in the
    same statement, when the next scheduled job of each queue that came back short is due. A job enqueued
    without max_attempts gets it here, durably: its kind's in `jobs` (default: the process's registry, the
    one `load_jobs` filled), else the default. A queue's walk starts at its run_at in `since`, if any
    (queries.CLAIM_JOBS: the producer's way past the entries of claimed jobs a held snapshot keeps).
    `kind_free`: the capped kinds' free slots in this worker; the claim takes no more of a kind than that,
    and skips a kind with none."""
    wanted = {queue: n for queue, n in limits.items() if n > 0}
    if not wanted:
        return Claim([], {})
    kind_attempts, default = (jobs or registry).max_attempts_at_claim()
    kind_free = kind_free or {}
    most = sum(wanted.values())  # a kind with this many free slots cannot be trimmed: leave it out
    trimmed = {kind: free for kind, free in kind_free.items() if 0 < free < most}
    params = {
        "queues": array(wanted),
        "limits": array(wanted.values()),
        "owner": owner,
        "ttl": ttl,
        "kind_attempts": kind_attempts,
        "max_attempts": default,
        "since": array((since or {}).get(queue) for queue in wanted),
        "full_kinds": array(kind for kind, free in kind_free.items() if free <= 0),
        "cap_kinds": array(trimmed),
        "cap_free": array(trimmed.values()),
    }
    statement = queries.CLAIM_JOBS_CAPPED if trimmed else queries.CLAIM_JOBS
    # In a transaction of its own (an idle autocommit connection: the worker's), the claim's commit does not
    # wait for the WAL flush: a slot's claim no longer waits on the disk (issue 12, item 7). A claim lost in a
    # server crash leaves its jobs pending, to run again: at-least-once, as a settle lost in a crash already
    # does (the first run's settle is then fenced off). A settle's commit still waits: what it records (and
    # notifies waiters of) must survive a crash. Inside a caller's transaction, its settings are left alone.
    own = conn.autocommit and conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
    if own and conn in _claim_sessions:
        rows = await (await conn.execute(statement, params)).fetchall()
    elif own:
        rows = await _claim_in_own_transaction(conn, statement, params)
    else:
        rows = await (await _on_indexes(conn, statement, params)).fetchall()
    reached = {row[2]: row[13] for row in rows if row[0] is not None}  # rows in claim order: the last one stays
    return Claim(
        [claimed_job(row) for row in rows if row[0] is not None],
        {row[2]: row[10] for row in rows if row[0] is None and row[10] is not None},
        _timestamp(rows[0][11]) if rows else None,
        reached={queue: _timestamp(run_at) for queue, run_at in reached.items()},
    )


def _timestamp(epoch: float) -> datetime:
    return datetime.fromtimestamp(epoch, UTC)


async def _claim_in_own_transaction(
    conn: psycopg.AsyncConnection, statement: str, params: Mapping[str, Any]
) -> list[tuple[Any, ...]]:
    """The claim and its settings in one pipeline: one round trip and one implicit transaction (its commit, at
    the pipeline's sync, does not wait for the WAL flush). Parameters are bound server-side, so psycopg
    prepares the claim like any statement it runs often (not through a transaction pooler: store/db.py), and
    the server plans it once, not on every call: planning was ~0.8 ms of a 4-job claim's ~1.3 ms of server
    time (issue 12, item 7). Its one generic plan is made under CLAIM_SETTINGS, with sequential scans priced
    out, so a plan made while the table was empty or small still walks the indexes (issue 12, item 5)."""
    async with conn.pipeline():
        await conn.execute(CLAIM_SETTINGS)
        cursor = await conn.execute(statement, params)
    return await cursor.fetchall()


async def _on_indexes(conn: psycopg.AsyncConnection, query: str, params: Mapping[str, Any]) -> psycopg.AsyncCursor:
    """Run `query` after queries.INDEX_SCANS_ONLY, in one string and one round trip: the parameters are bound
    client-side (a string of several statements cannot take server-side parameters), so the statement is
    planned on every call against the table as it is. Returns the cursor on the query's result."""
    cursor = psycopg.AsyncClientCursor(conn)
    await cursor.execute(";\n".join([queries.INDEX_SCANS_ONLY, query]), params, prepare=False)
    cursor.nextset()
    return cursor


async def renew(conn: psycopg.AsyncConnection, jobs: list[ClaimedJob], ttl: float) -> set[int]:
    """Extend the leases; returns the ids still held (a missing id was lost to the reaper)."""
    if not jobs:
        return set()
    params = {"ids": [j.id for j in jobs], "tokens": [j.lease_token for j in jobs], "ttl": ttl}
    return {row[0] for row in await (await _on_indexes(conn, queries.RENEW_LEASES, params)).fetchall()}


async def settle(conn: psycopg.AsyncConnection, outcomes: list[Outcome], notify: list[str] | None = None) -> set[int]:
    """Record outcomes, fenced by lease token; returns the ids that were settled. One transaction and
    one round trip (an autocommit connection): all of the batch is settled, or none of it. `notify`: queues
    whose workers to wake at its commit (limits.freed_queues)."""
    successes = [o for o in outcomes if isinstance(o, Succeeded)]
    others = [o for o in outcomes if isinstance(o, Unsuccessful)]
    cursors = []
    # The first statement locks every row of the batch, in id order (queries._LOCKED): the second's rows
    # are then held already, and this transaction never holds one row while waiting for a lower one.
    batch = [o.job.id for o in outcomes]
    # One data statement (the usual batch: successes only) needs no BEGIN and COMMIT: the pipeline's implicit
    # transaction holds it, and a statement psycopg cannot send leaves nothing of the batch. Two need them.
    explicit = bool(successes) and bool(others)
    try:
        async with conn.pipeline():
            if explicit:
                await conn.execute(BEGIN)
            # Its own statement, not _on_indexes: a settle's arrays grow with the batch, and binding them
            # client-side cost the worker ~20% more CPU per job (bench/run.py).
            await conn.execute(SETTLE_SETTINGS)
            if successes:
                ids = plain_array([str(o.job.id) for o in successes])
                params = {
                    "lock": plain_array(map(str, batch)) if others else ids,
                    "ids": ids,
                    "tokens": plain_array([o.job.lease_token for o in successes]),
                    "results": array(o.result for o in successes),
                    **_progress_params(successes),
                }
                cursors.append(await conn.execute(queries.SETTLE_SUCCEEDED, params))
            if others:
                ids = plain_array([str(o.job.id) for o in others])
                params = {
                    "lock": ids,  # the whole batch when it has no successes
                    "ids": ids,
                    "tokens": plain_array([o.job.lease_token for o in others]),
                    "states": array(o.state for o in others),
                    "delays": array(float(o.delay) for o in others),
                    "refunds": array(o.refund_attempt for o in others),
                    "errors": array(o.error for o in others),
                    "tracebacks": array(o.traceback for o in others),
                    **_progress_params(others),
                }
                cursors.append(await conn.execute(queries.SETTLE_UNSUCCESSFUL, params))
            if notify:
                await conn.execute(queries.NOTIFY_QUEUES, {"queues": notify})
            if explicit:
                await conn.execute(COMMIT)
    except BaseException:
        await roll_back(conn)
        raise
    return {row[0] for cursor in cursors for row in await cursor.fetchall()}


def _progress_params(outcomes: list[Succeeded] | list[Unsuccessful]) -> dict[str, list[Any] | None]:
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
    cursor = await _on_indexes(
        conn, queries.RECOVER_EXPIRED_LEASES, {"max_reaps": max_reaps, "since": since, "batch": RECOVER_BATCH}
    )
    clock, ids, states = await cursor.fetchone()
    return Recovered(list(zip(ids, states, strict=True)), clock)


async def heartbeat(
    conn: psycopg.AsyncConnection, worker_id: str, hostname: str, pid: int, queues: dict[str, int]
) -> None:
    params = {"id": worker_id, "hostname": hostname, "pid": pid, "queues": json.dumps(queues)}
    await conn.execute(queries.WORKER_HEARTBEAT, params)


async def forget_stale_workers(conn: psycopg.AsyncConnection, older_than: float) -> None:
    await conn.execute(queries.FORGET_STALE_WORKERS, (older_than,))


async def worker_gone(conn: psycopg.AsyncConnection, worker_id: str) -> None:
    await conn.execute(queries.WORKER_GONE, (worker_id,))


async def report_progress(conn: psycopg.AsyncConnection, reports: list[tuple[ClaimedJob, Progress]]) -> set[int]:
    """Write the latest progress of running jobs, fenced by lease token; returns the ids written."""
    params = {
        "ids": [job.id for job, _ in reports],
        "tokens": [job.lease_token for job, _ in reports],
        "fractions": [fraction for _, (fraction, _) in reports],
        "messages": [message for _, (_, message) in reports],
    }
    return {row[0] for row in await (await _on_indexes(conn, queries.REPORT_PROGRESS, params)).fetchall()}
