"""Waiting for a job's result: LISTEN for the ids of jobs that reach a final state, no polling.

The dygo_jobs_updated trigger (store/migrations/0017_workflows.sql) sends those ids on the `dygo_finished` channel
when the settling transaction commits, but only the ids that a waiter registered for in
dygo_result_waiters: a settle nobody waits for sends nothing (a notifying commit is serialised with
every other one cluster-wide, which capped a fleet's settles). Deleting one job sends its id, and an
admin statement that deletes jobs in bulk sends an empty payload, which asks every waiter to re-read its
job once; both whether anyone waits or not.

A waiter LISTENs, then registers in a transaction of its own that takes the waiters' lock exclusive,
inserts its row and reads the job (`register`; docs/development/decisions.md says why no settle can slip
between the read and the row, and why the job's row is not locked instead), and deletes its row when done. A
crashed waiter's row expires WAITER_GRACE after its wait (at most WAITER_LIFETIME: a longer wait moves
its expiry on) and the maintainer deletes it.

    job = await await_for_result(job_id, timeout="30s")  # the job as GET /api/v1/jobs/{id} shows it
    job = wait_for_result(job_id, timeout="30s")         # the same without an event loop
    job["state"], job["result"]                          # 'succeeded', 'dead' or 'cancelled'

Both raise `WaitTimeout` (its `.job` is the job as it was last read) when the job is still not final
at the timeout, and `NotFound` for an unknown (or deleted) job.

Each operation has a blocking twin and an async one (`a` prefix) side by side. What they share, the
statements, their parameters and what a wait decides, is written once here; a twin only runs it.
"""

from __future__ import annotations

import contextlib
import math
import time
import warnings
from collections.abc import Coroutine
from typing import Any

import psycopg
from dygo.store.config import load_settings
from dygo.store.db import aroll_back, database_url, direct_url, roll_back, usable
from dygo.store.durations import parse_duration
from dygo.store.errors import NotFound, WaitTimeout
from dygo.store.job_reads import aget_job, get_job
from dygo.store.leases import BEGIN, COMMIT
from dygo.store.sql import results as sql
from dygo.store.sql.job_reads import GET_JOB
from psycopg.rows import dict_row

CHANNEL = "dygo_finished"
FINAL_STATES = frozenset({"succeeded", "dead", "cancelled", "skipped"})
# Ids per notification: 390 ids of at most 20 bytes each stay under NOTIFY's 8000-byte payload limit. The
# trigger dygo_jobs_updated chunks by the same number (tests/test_migrations.py checks they agree).
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


def listen(conn: psycopg.Connection) -> None:
    """Subscribe `conn` (autocommit) to the ids of jobs that reach a final state."""
    conn.execute(sql.LISTEN_FOR_FINISHED)


async def alisten(conn: psycopg.AsyncConnection) -> None:
    """`listen` on an AsyncConnection."""
    await conn.execute(sql.LISTEN_FOR_FINISHED)


# --- a waiter's registration ------------------------------------------------------------------------

# What opens a registration's transaction, pipelined with the rest. BEGIN is explicit: the pipeline's
# implicit transaction would commit what went before a statement psycopg failed to send.
_REGISTRATION_OPENS = (BEGIN, sql.WAITER_TRANSACTION, sql.RESULT_WAITERS_LOCK)


def _expiry(job_id: int, seconds: float) -> dict[str, Any]:
    return {"job_id": job_id, "seconds": min(seconds, WAITER_LIFETIME) + WAITER_GRACE}


def _renewal(waiter: int, seconds: float) -> dict[str, Any]:
    return {"id": waiter, **_expiry(0, seconds)}


def _registered(inserted: tuple[Any, ...] | None, job: dict[str, Any] | None) -> tuple[int, dict[str, Any] | None]:
    """A registration's answer: (the waiter's id, the job as read after the lock, None if there is none)."""
    assert inserted is not None, "REGISTER_WAITER returns the row it inserts"
    return inserted[0], job


def register(conn: psycopg.Connection, job_id: int, seconds: float) -> tuple[int, dict[str, Any] | None]:
    """Register a waiter for `job_id` for `seconds` (at most WAITER_LIFETIME) and read the job after it:
    (the waiter's id, the job or None). `conn` is autocommit and idle: the registration must commit on
    its own, before the settles that then wait for it. Settles that finish the job after this read
    notify it; delete the row with `unregister` when done. One round trip: the statements are pipelined."""
    try:
        with conn.pipeline():
            for statement in _REGISTRATION_OPENS:
                conn.execute(statement)
            inserted = conn.execute(sql.REGISTER_WAITER, _expiry(job_id, seconds))
            read = conn.cursor(row_factory=dict_row)
            read.execute(GET_JOB, (job_id,))  # its own statement: a snapshot after the lock
            conn.execute(COMMIT)
    except BaseException:
        roll_back(conn)
        raise
    return _registered(inserted.fetchone(), read.fetchone())


async def aregister(conn: psycopg.AsyncConnection, job_id: int, seconds: float) -> tuple[int, dict[str, Any] | None]:
    """`register` on an AsyncConnection."""
    try:
        async with conn.pipeline():
            for statement in _REGISTRATION_OPENS:
                await conn.execute(statement)
            inserted = await conn.execute(sql.REGISTER_WAITER, _expiry(job_id, seconds))
            read = conn.cursor(row_factory=dict_row)
            await read.execute(GET_JOB, (job_id,))
            await conn.execute(COMMIT)
    except BaseException:
        await aroll_back(conn)
        raise
    return _registered(await inserted.fetchone(), await read.fetchone())


def refresh(conn: psycopg.Connection, waiter: int, seconds: float) -> bool:
    """Move a registration's expiry on (a wait longer than WAITER_LIFETIME); False if it is gone."""
    return conn.execute(sql.REFRESH_WAITER, _renewal(waiter, seconds)).rowcount == 1


async def arefresh(conn: psycopg.AsyncConnection, waiter: int, seconds: float) -> bool:
    """`refresh` on an AsyncConnection."""
    return (await conn.execute(sql.REFRESH_WAITER, _renewal(waiter, seconds))).rowcount == 1


def unregister(conn: psycopg.Connection, waiter: int) -> None:
    conn.execute(sql.UNREGISTER_WAITER, (waiter,))


async def aunregister(conn: psycopg.AsyncConnection, waiter: int) -> None:
    await conn.execute(sql.UNREGISTER_WAITER, (waiter,))


# --- waking waiters of deleted jobs (the admin's statements run in its sync transactions) -------------


def notify_deleted(conn: psycopg.Connection, job_ids: list[int]) -> None:
    """Wake the waiters of deleted jobs (the trigger only sees updates); they then find the job gone."""
    for start in range(0, len(job_ids), NOTIFY_IDS_MAX):
        chunk = job_ids[start : start + NOTIFY_IDS_MAX]
        conn.execute(sql.NOTIFY_FINISHED, (",".join(str(i) for i in chunk),))


def notify_recheck(conn: psycopg.Connection) -> None:
    """Wake every waiter to re-read its job once: after a statement that deleted jobs in bulk, whose ids
    are not worth sending (a purge may delete millions). Delivered when `conn`'s transaction commits."""
    conn.execute(sql.NOTIFY_RECHECK)


# --- waiting from Python ----------------------------------------------------------------------------


def _conninfo(db: str | None) -> str:
    # The wait LISTENs: through a transaction pooler it needs the direct URL (store/db.py).
    return db or direct_url() or database_url(load_settings())


class _Wait:
    """What one wait decides, without its I/O: whether a read ends it, when it times out, when its
    registration's expiry must move on and how long to listen next. Both twins drive one."""

    def __init__(self, job_id: int, timeout: str | float) -> None:
        self.job_id = job_id
        self.seconds = parse_duration(timeout, field="timeout")
        self.deadline = time.monotonic() + self.seconds
        self.refresh_at = math.inf  # once registered: when the registration's expiry moves on
        self.job: dict[str, Any] = {}  # as last read

    def ends(self, job: dict[str, Any] | None) -> bool:
        """Whether the job as just read ends the wait (it is final, and then `self.job`); NotFound once
        it is gone."""
        if job is None:
            raise NotFound("job_not_found", f"no job with id {self.job_id}")
        self.job = job
        return job["state"] in FINAL_STATES

    def registered(self) -> None:
        self.refresh_at = time.monotonic() + WAITER_LIFETIME

    def next_listen(self) -> tuple[float | None, float]:
        """Before listening again: the seconds left to refresh the registration for (None: no refresh
        due), and how long to listen. WaitTimeout, with the job as last read, once the deadline passed."""
        now = time.monotonic()
        if now >= self.deadline:
            raise WaitTimeout(self.job_id, self.seconds, self.job)
        renew = None
        if now >= self.refresh_at:
            self.refresh_at = now + WAITER_LIFETIME
            renew = self.deadline - now
        return renew, min(self.deadline, self.refresh_at) - now


def wait_for_result(job_id: int, timeout: str | float = 30.0, *, db: str | None = None) -> dict[str, Any]:
    """Wait until the job is succeeded, dead or cancelled and return it (result, errors, progress...).

    `timeout` is seconds or a duration like "30s". `db` is a conninfo (default: DATABASE_DIRECT_URL, else
    DATABASE_URL, else the embedded server); the wait holds one connection of its own for its LISTEN.
    `await_for_result` is the same for code on an event loop."""
    wait = _Wait(job_id, timeout)
    with psycopg.connect(_conninfo(db), autocommit=True) as conn:
        listen(conn)
        if wait.ends(get_job(conn, job_id)):
            return wait.job  # finished already: no registration
        waiter, job = register(conn, job_id, wait.seconds)
        wait.registered()
        try:
            while not wait.ends(job):
                renew, listen_for = wait.next_listen()
                if renew is not None and not refresh(conn, waiter, renew):
                    # Deleted as expired (this process stalled past the grace): register again.
                    waiter, job = register(conn, job_id, renew)
                    continue
                for notify in conn.notifies(timeout=listen_for):
                    if wakes(notify.payload, job_id):
                        break
                job = get_job(conn, job_id)
            return wait.job
        finally:
            if usable(conn):
                with contextlib.suppress(psycopg.Error, OSError):  # else the row expires
                    unregister(conn, waiter)


async def await_for_result(job_id: int, timeout: str | float = 30.0, *, db: str | None = None) -> dict[str, Any]:
    """`wait_for_result` on the event loop."""
    wait = _Wait(job_id, timeout)
    async with await psycopg.AsyncConnection.connect(_conninfo(db), autocommit=True) as conn:
        await alisten(conn)
        if wait.ends(await aget_job(conn, job_id)):
            return wait.job
        waiter, job = await aregister(conn, job_id, wait.seconds)
        wait.registered()
        try:
            while not wait.ends(job):
                renew, listen_for = wait.next_listen()
                if renew is not None and not await arefresh(conn, waiter, renew):
                    waiter, job = await aregister(conn, job_id, renew)
                    continue
                async for notify in conn.notifies(timeout=listen_for):
                    if wakes(notify.payload, job_id):
                        break
                job = await aget_job(conn, job_id)
            return wait.job
        finally:
            if usable(conn):
                with contextlib.suppress(psycopg.Error, OSError):
                    await aunregister(conn, waiter)


def result(job_id: int, timeout: str | float = 30.0, *, db: str | None = None) -> Coroutine[Any, Any, dict[str, Any]]:
    """Deprecated, for one release: the old name of `await_for_result`."""
    warnings.warn(
        "dygo.result() is deprecated and will be removed in the next release: use dygo.await_for_result()",
        DeprecationWarning,
        stacklevel=2,
    )
    return await_for_result(job_id, timeout, db=db)
