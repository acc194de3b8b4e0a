"""Waiting for a job's result: LISTEN for the ids of jobs that reach a final state, no polling.

The dygo_notify_finished trigger (migration 0006) sends those ids on the `dygo_finished` channel
when the settling transaction commits; deleting one job sends its id, and an admin statement that
deletes jobs in bulk sends an empty payload, which asks every waiter to re-read its job once.
A waiter subscribes first and reads the job second, so a job that finishes between the two is seen
by the read, and one that finishes after it by a notification.

    job = await result(job_id, timeout="30s")    # the job as GET /api/v1/jobs/{id} shows it
    job["state"], job["result"]                  # 'succeeded', 'dead' or 'cancelled'

Both raise `WaitTimeout` (its `.job` is the job as it was last read) when the job is still not final
at the timeout, and `NotFound` for an unknown (or deleted) job.
"""

from __future__ import annotations

import time
from typing import Any

import psycopg
from dygo.store import queries
from dygo.store.durations import parse_duration
from dygo.store.errors import NotFound, WaitTimeout
from dygo.store.inspect import get_job
from psycopg.rows import dict_row

CHANNEL = "dygo_finished"
FINAL_STATES = frozenset({"succeeded", "dead", "cancelled"})


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


def notify_deleted(conn: psycopg.Connection, job_ids: list[int]) -> None:
    """Wake the waiters of deleted jobs (the trigger only sees updates); they then find the job gone."""
    for start in range(0, len(job_ids), 390):
        conn.execute(queries.NOTIFY_FINISHED, (",".join(str(i) for i in job_ids[start:start + 390]),))


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
        while not _final_or_raise(job_id, job):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise WaitTimeout(job_id, seconds, job)
            async for notify in conn.notifies(timeout=remaining):
                if wakes(notify.payload, job_id):
                    break
            job = await aget_job(conn, job_id)
        return job


def wait_for_result(job_id: int, timeout: str | float = 30.0, *, db: str | None = None) -> dict[str, Any]:
    """The blocking twin of `result`, for code without an event loop."""
    seconds = _seconds(timeout)
    deadline = time.monotonic() + seconds
    with psycopg.connect(_conninfo(db), autocommit=True) as conn:
        conn.execute(queries.LISTEN_FOR_FINISHED)
        job = get_job(conn, job_id)
        while not _final_or_raise(job_id, job):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise WaitTimeout(job_id, seconds, job)
            for notify in conn.notifies(timeout=remaining):
                if wakes(notify.payload, job_id):
                    break
            job = get_job(conn, job_id)
        return job
