"""Waiting for a job's result: LISTEN for the ids of jobs that reach a final state, no polling.

The dygo_notify_finished trigger (store/migrations/0016_baseline.sql) sends those ids on the `dygo_finished` channel
when the settling transaction commits, but only the ids that a waiter registered for in
dygo_result_waiters: a settle nobody waits for sends nothing (a notifying commit is serialised with
every other one cluster-wide, which capped a fleet's settles). Deleting one job sends its id, and an
admin statement that deletes jobs in bulk sends an empty payload, which asks every waiter to re-read its
job once; both whether anyone waits or not.

A waiter LISTENs, then registers in a transaction of its own that takes the waiters' lock exclusive,
inserts its row and reads the job (`aregister`; docs/development/decisions.md says why no settle can slip
between the read and the row, and why the job's row is not locked instead), and deletes its row when done. A
crashed waiter's row expires WAITER_GRACE after its wait (at most WAITER_LIFETIME: a longer wait moves
its expiry on) and the maintainer deletes it.

    job = await result(job_id, timeout="30s")    # the job as GET /api/v1/jobs/{id} shows it
    job["state"], job["result"]                  # 'succeeded', 'dead' or 'cancelled'

Both raise `WaitTimeout` (its `.job` is the job as it was last read) when the job is still not final
at the timeout, and `NotFound` for an unknown (or deleted) job.
"""

from __future__ import annotations

import contextlib
import time
from typing import Any

import psycopg
from dygo.store import queries
from dygo.store.durations import parse_duration
from dygo.store.errors import NotFound, WaitTimeout
from dygo.store.job_reads import get_job
from dygo.store.leases import BEGIN, COMMIT, roll_back
from psycopg.rows import dict_row

CHANNEL = "dygo_finished"
FINAL_STATES = frozenset({"succeeded", "dead", "cancelled"})
# Ids per notification: 390 ids of at most 20 bytes each stay under NOTIFY's 8000-byte payload limit. The
# trigger dygo_notify_finished chunks by the same number (tests/test_migrations.py checks they agree).
NOTIFY_IDS_MAX = 390
# A registration lives at most this long past its last refresh (the longest `?wait=` of the API is 60 s);
# a longer Python wait refreshes its row this often.
WAITER_LIFETIME = 60.0
# A row outlives its wait by this much before the maintainer may delete it: room for a refresh that
# comes late, and for clock skew between the waiter's process and the database (expiry is on the latter).
WAITER_GRACE = 30.0


def finished_ids(payload: str) -> set[int]:
    """The job ids of one `dygo_finished` notification."""
    return {int(part) for part in payload.split(",") if part}


def recheck_all(payload: str) -> bool:
    """Whether a `dygo_finished` notification asks every waiter to re-read its job (a bulk delete)."""
    return payload == ""


def wakes(payload: str, job_id: int) -> bool:
    """Whether a `dygo_finished` notification concerns the job `job_id`'s waiter."""
    return recheck_all(payload) or job_id in finished_ids(payload)


async def listen(conn: psycopg.AsyncConnection) -> None:
    """Subscribe `conn` (autocommit) to the ids of jobs that reach a final state."""
    await conn.execute(queries.LISTEN_FOR_FINISHED)


async def aget_job(conn: psycopg.AsyncConnection, job_id: int) -> dict[str, Any] | None:
    async with conn.cursor(row_factory=dict_row) as cursor:
        await cursor.execute(queries.GET_JOB, (job_id,))
        return await cursor.fetchone()


def _registration(job_id: int, seconds: float) -> dict[str, Any]:
    return {"job_id": job_id, "seconds": min(seconds, WAITER_LIFETIME) + WAITER_GRACE}


async def aregister(conn: psycopg.AsyncConnection, job_id: int, seconds: float) -> tuple[int, dict[str, Any] | None]:
    """Register a waiter for `job_id` for `seconds` (at most WAITER_LIFETIME) and read the job after it:
    (the waiter's id, the job or None). `conn` is autocommit and idle: the registration must commit on
    its own, before the settles that then wait for it. Settles that finish the job after this read
    notify it; delete the row with `aunregister` when done. One round trip: the statements are pipelined."""
    try:
        async with conn.pipeline():
            # Explicit: the pipeline's implicit transaction would commit what went before a statement
            # psycopg failed to send.
            await conn.execute(BEGIN)
            await conn.execute(queries.WAITER_TRANSACTION)
            await conn.execute(queries.RESULT_WAITERS_LOCK)
            inserted = await conn.execute(queries.REGISTER_WAITER, _registration(job_id, seconds))
            read = conn.cursor(row_factory=dict_row)
            await read.execute(queries.GET_JOB, (job_id,))  # its own statement: a snapshot after the lock
            await conn.execute(COMMIT)
    except BaseException:
        await roll_back(conn)
        raise
    return (await inserted.fetchone())[0], await read.fetchone()


def register(conn: psycopg.Connection, job_id: int, seconds: float) -> tuple[int, dict[str, Any] | None]:
    """The blocking twin of `aregister`."""
    try:
        with conn.pipeline():
            conn.execute(BEGIN)
            conn.execute(queries.WAITER_TRANSACTION)
            conn.execute(queries.RESULT_WAITERS_LOCK)
            inserted = conn.execute(queries.REGISTER_WAITER, _registration(job_id, seconds))
            read = conn.cursor(row_factory=dict_row)
            read.execute(queries.GET_JOB, (job_id,))
            conn.execute(COMMIT)
    except BaseException:
        if not conn.closed and not conn.broken:
            with contextlib.suppress(psycopg.Error, OSError):  # the error that got us here is the one to raise
                conn.rollback()
        raise
    return inserted.fetchone()[0], read.fetchone()


async def arefresh(conn: psycopg.AsyncConnection, waiter: int, seconds: float) -> bool:
    """Move a registration's expiry on (a wait longer than WAITER_LIFETIME); False if it is gone."""
    cursor = await conn.execute(queries.REFRESH_WAITER, {"id": waiter, **_registration(0, seconds)})
    return cursor.rowcount == 1


def refresh(conn: psycopg.Connection, waiter: int, seconds: float) -> bool:
    return conn.execute(queries.REFRESH_WAITER, {"id": waiter, **_registration(0, seconds)}).rowcount == 1


async def aunregister(conn: psycopg.AsyncConnection, waiter: int) -> None:
    await conn.execute(queries.UNREGISTER_WAITER, (waiter,))


def unregister(conn: psycopg.Connection, waiter: int) -> None:
    conn.execute(queries.UNREGISTER_WAITER, (waiter,))


def notify_deleted(conn: psycopg.Connection, job_ids: list[int]) -> None:
    """Wake the waiters of deleted jobs (the trigger only sees updates); they then find the job gone."""
    for start in range(0, len(job_ids), NOTIFY_IDS_MAX):
        chunk = job_ids[start : start + NOTIFY_IDS_MAX]
        conn.execute(queries.NOTIFY_FINISHED, (",".join(str(i) for i in chunk),))


def notify_recheck(conn: psycopg.Connection) -> None:
    """Wake every waiter to re-read its job once: after a statement that deleted jobs in bulk, whose ids
    are not worth sending (a purge may delete millions). Delivered when `conn`'s transaction commits."""
    conn.execute(queries.NOTIFY_RECHECK)


def _seconds(timeout: str | float) -> float:
    return parse_duration(timeout, field="timeout")


def _conninfo(db: str | None) -> str:
    if db:
        return db
    from dygo.store.config import load_settings
    from dygo.store.db import database_url, direct_url

    # The wait LISTENs: through a transaction pooler it needs the direct URL (store/db.py).
    return direct_url() or database_url(load_settings())


def _final_or_raise(job_id: int, job: dict[str, Any] | None) -> bool:
    if job is None:
        raise NotFound("job_not_found", f"no job with id {job_id}")
    return job["state"] in FINAL_STATES


async def result(job_id: int, timeout: str | float = 30.0, *, db: str | None = None) -> dict[str, Any]:
    """Wait until the job is succeeded, dead or cancelled and return it (result, errors, progress...).

    `timeout` is seconds or a duration like "30s". `db` is a conninfo (default: DATABASE_DIRECT_URL, else
    DATABASE_URL, else the embedded server); the wait holds one connection of its own for its LISTEN."""
    seconds = _seconds(timeout)
    deadline = time.monotonic() + seconds
    async with await psycopg.AsyncConnection.connect(_conninfo(db), autocommit=True) as conn:
        await listen(conn)
        job = await aget_job(conn, job_id)
        if _final_or_raise(job_id, job):
            return job  # finished already: no registration
        waiter, job = await aregister(conn, job_id, seconds)
        refresh_at = time.monotonic() + WAITER_LIFETIME
        try:
            while not _final_or_raise(job_id, job):
                now = time.monotonic()
                if now >= deadline:
                    raise WaitTimeout(job_id, seconds, job)
                if now >= refresh_at:
                    refresh_at = now + WAITER_LIFETIME
                    if not await arefresh(conn, waiter, deadline - now):
                        # Deleted as expired (this process stalled past the grace): register again.
                        waiter, job = await aregister(conn, job_id, deadline - now)
                        continue
                async for notify in conn.notifies(timeout=min(deadline, refresh_at) - now):
                    if wakes(notify.payload, job_id):
                        break
                job = await aget_job(conn, job_id)
            return job
        finally:
            if not conn.closed and not conn.broken:
                with contextlib.suppress(psycopg.Error, OSError):  # else the row expires
                    await aunregister(conn, waiter)


def wait_for_result(job_id: int, timeout: str | float = 30.0, *, db: str | None = None) -> dict[str, Any]:
    """The blocking twin of `result`, for code without an event loop."""
    seconds = _seconds(timeout)
    deadline = time.monotonic() + seconds
    with psycopg.connect(_conninfo(db), autocommit=True) as conn:
        conn.execute(queries.LISTEN_FOR_FINISHED)
        job = get_job(conn, job_id)
        if _final_or_raise(job_id, job):
            return job
        waiter, job = register(conn, job_id, seconds)
        refresh_at = time.monotonic() + WAITER_LIFETIME
        try:
            while not _final_or_raise(job_id, job):
                now = time.monotonic()
                if now >= deadline:
                    raise WaitTimeout(job_id, seconds, job)
                if now >= refresh_at:
                    refresh_at = now + WAITER_LIFETIME
                    if not refresh(conn, waiter, deadline - now):
                        waiter, job = register(conn, job_id, deadline - now)
                        continue
                for notify in conn.notifies(timeout=min(deadline, refresh_at) - now):
                    if wakes(notify.payload, job_id):
                        break
                job = get_job(conn, job_id)
            return job
        finally:
            if not conn.closed and not conn.broken:
                with contextlib.suppress(psycopg.Error, OSError):
                    unregister(conn, waiter)
