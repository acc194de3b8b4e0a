"""Retention: the worker's trimming of old history, one worker of the cluster at a time.

A pass deletes succeeded, dead and cancelled jobs (skipped ones with the cancelled) older than their
retention, events and waits' placeholders older than theirs (store/events.py), the recorded steps of jobs
deleted since (store/steps.py), expired idempotency keys, the expired rows of result waiters that died
waiting (store/results.py) and old daily and minute stats, in batches that each commit on their own (no long
row locks, no long transaction holding back vacuum), and a bounded number of batches per kind so one pass
never runs long. What is left over is taken by the next pass. Every statement lives in
store/sql/retention.py, but for the events' (store/sql/events.py).

Each batch takes the cluster-wide retention lock in its own transaction (a transaction-level advisory
lock, so it works through PgBouncer in transaction mode, where a session lock would stay with a server
connection other clients then use) and gives the connection back after it: a worker's one connection
for settles and maintenance settles between two batches, and the pass needs no second connection. A
pass that finds the lock taken at its first batch leaves the work to the worker holding it; one that
loses it between two batches stops there.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass, field, fields

import psycopg
from dygo.store import admin
from dygo.store.config import Settings
from dygo.store.db import one
from dygo.store.sql import events as events_sql
from dygo.store.sql import retention as sql
from dygo.store.sql.leases import INDEX_SCANS_ONLY

BATCH = 1000  # rows per delete statement
MAX_BATCHES = 100  # per kind and pass: at most 100k rows of each kind a pass
WALK_WINDOW = 1000  # ids per step of the walk over succeeded jobs
MAX_WALK_STEPS = 500  # per pass: the walk resumes where it stopped on the next pass
# The overview charts the last hour by minute; two hours leave room for a pass that comes late.
MINUTE_STATS_KEEP = 2 * 3600.0


@dataclass(frozen=True)
class RetentionPeriods:
    """How long each kind of history is kept, in seconds; 0 keeps it forever."""

    succeeded: float
    dead: float
    cancelled: float
    daily_stats: float
    workflows: float = 0.0
    events: float = 0.0

    @classmethod
    def from_settings(cls, settings: Settings) -> RetentionPeriods:
        return cls(
            settings.completed_retention,
            settings.dead_retention,
            settings.cancelled_retention,
            settings.stats_retention,
            settings.workflow_retention,
            settings.event_retention,
        )


@dataclass
class Trimmed:
    """Rows one pass deleted, by kind."""

    succeeded: int = 0
    dead: int = 0
    cancelled: int = 0
    skipped: int = 0  # kept as long as cancelled jobs (cancelled_retention)
    workflows: int = 0
    events: int = 0  # emitted events and waits' placeholders (store/events.py)
    steps: int = 0  # of jobs deleted since the last pass
    idempotency_keys: int = 0
    result_waiters: int = 0
    daily_stats: int = 0
    minute_stats: int = 0
    batches: int = field(default=0, compare=False, repr=False)  # statements run under the lock

    def total(self) -> int:
        return sum(getattr(self, f.name) for f in fields(self) if f.name != "batches")

    def summary(self) -> str:
        return ", ".join(
            f"{getattr(self, f.name)} {f.name.replace('_', ' ')}" for f in fields(self) if f.name != "batches"
        )


@dataclass
class SucceededWalk:
    """Where the walk over succeeded jobs stopped, so a long backlog is trimmed over several passes."""

    after: int = 0  # the next step starts at the first job with a greater id


# Where a pass gets a connection for each batch: a pool's `connection`, or one connection held throughout.
Connections = Callable[[], AbstractAsyncContextManager[psycopg.AsyncConnection]]


class LockTaken(Exception):
    """Another worker holds the retention lock."""


@asynccontextmanager
async def retention_lock(conn: psycopg.AsyncConnection) -> AsyncIterator[bool]:
    """Hold the cluster-wide retention lock for the block; yields False when another worker holds it.

    A transaction-level lock, so it is released by the commit at the end of the block, or by the
    connection closing if this process dies.
    """
    async with conn.transaction():
        yield one(await (await conn.execute(sql.RETENTION_LOCK)).fetchone())[0]


async def trim(connections: Connections, periods: RetentionPeriods, walk: SucceededWalk) -> Trimmed | None:
    """One retention pass, each batch in a transaction holding the retention lock; None if another
    worker held it at the first batch."""
    trimmed = Trimmed()
    try:
        if periods.succeeded:
            await _trim_succeeded(connections, periods.succeeded, walk, trimmed)
        if periods.dead:
            trimmed.dead = await _repeat(connections, sql.TRIM_DEAD, periods.dead, trimmed)
        if periods.cancelled:
            trimmed.cancelled = await _repeat(connections, sql.TRIM_CANCELLED, periods.cancelled, trimmed)
            trimmed.skipped = await _repeat(connections, sql.TRIM_SKIPPED, periods.cancelled, trimmed)
        if periods.workflows:
            trimmed.workflows = await _repeat(connections, sql.TRIM_WORKFLOWS, periods.workflows, trimmed)
        if periods.events:
            trimmed.events = await _repeat(connections, events_sql.TRIM_EVENTS, periods.events, trimmed)
        trimmed.steps = await _repeat(connections, sql.TRIM_ORPHAN_STEPS, 0.0, trimmed)
        trimmed.idempotency_keys = await _repeat(connections, sql.TRIM_EXPIRED_KEYS, 0.0, trimmed)
        trimmed.result_waiters = await _repeat(connections, sql.TRIM_EXPIRED_WAITERS, 0.0, trimmed)
        async with connections() as conn:
            await admin.afold_stats(conn)  # before trimming, so old deltas land in rows the trim then sees
        if periods.daily_stats:
            trimmed.daily_stats = await _repeat(connections, sql.TRIM_DAILY_STATS, periods.daily_stats, trimmed)
        trimmed.minute_stats = await _repeat(connections, sql.TRIM_MINUTE_STATS, MINUTE_STATS_KEEP, trimmed)
    except LockTaken:
        return trimmed if trimmed.batches else None
    return trimmed


async def _locked_batch(
    connections: Connections, statement: str, params: Mapping[str, object], trimmed: Trimmed
) -> tuple[int, int | None]:
    """One batch under the retention lock, committed on its own; raises LockTaken when another has it."""
    async with connections() as conn, conn.transaction():
        if not one(await (await conn.execute(sql.RETENTION_LOCK)).fetchone())[0]:
            raise LockTaken
        # A trim deletes by id: on a small table the planner would read it whole (INDEX_SCANS_ONLY).
        await conn.execute(INDEX_SCANS_ONLY)
        row = one(await (await conn.execute(statement, params)).fetchone())
    trimmed.batches += 1
    return row[0], (row[1] if len(row) > 1 else None)


async def _repeat(connections: Connections, statement: str, keep: float, trimmed: Trimmed) -> int:
    """Run a batch delete while its batches come back full, up to MAX_BATCHES; the rows deleted."""
    total = 0
    for _ in range(MAX_BATCHES):
        deleted, _next = await _locked_batch(connections, statement, {"keep": keep, "batch": BATCH}, trimmed)
        total += deleted
        if deleted < BATCH:
            break
    return total


async def _trim_succeeded(connections: Connections, keep: float, walk: SucceededWalk, trimmed: Trimmed) -> None:
    for _ in range(MAX_WALK_STEPS):
        params = {"keep": keep, "after": walk.after, "window": WALK_WINDOW}
        deleted, next_after = await _locked_batch(connections, sql.TRIM_SUCCEEDED_RANGE, params, trimmed)
        trimmed.succeeded += deleted
        if next_after is None:
            walk.after = 0  # reached recent jobs: the next pass starts again from the oldest
            break
        walk.after = next_after
