"""Retention: the worker's trimming of old history, one worker of the cluster at a time.

A pass deletes succeeded, dead and cancelled jobs older than their retention, expired idempotency
keys and old daily and minute stats, in batches that each commit on their own (no long row locks, no long
transaction holding back vacuum), and a bounded number of batches per kind so one pass never runs
long. What is left over is taken by the next pass. Every statement lives in store/queries.py.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, fields

import psycopg

from store import queries
from store.config import Settings

BATCH = 1000  # rows per delete statement
MAX_BATCHES = 100  # per kind and pass: at most 100k rows of each kind a pass
WALK_WINDOW = 1000  # ids per step of the walk over succeeded jobs
MAX_WALK_STEPS = 500  # per pass: the walk resumes where it stopped on the next pass
# The overview charts the last hour by minute; two hours leave room for a pass that comes late.
MINUTE_STATS_KEEP = 2 * 3600.0


@dataclass(frozen=True)
class Retention:
    """How long each kind of history is kept, in seconds; 0 keeps it forever."""

    succeeded: float
    dead: float
    cancelled: float
    daily_stats: float

    @classmethod
    def from_settings(cls, settings: Settings) -> Retention:
        return cls(settings.completed_retention, settings.dead_retention, settings.cancelled_retention,
                   settings.stats_retention)


@dataclass
class Trimmed:
    """Rows one pass deleted, by kind."""

    succeeded: int = 0
    dead: int = 0
    cancelled: int = 0
    idempotency_keys: int = 0
    daily_stats: int = 0
    minute_stats: int = 0

    def total(self) -> int:
        return sum(getattr(self, f.name) for f in fields(self))

    def summary(self) -> str:
        return ", ".join(f"{getattr(self, f.name)} {f.name.replace('_', ' ')}" for f in fields(self))


@dataclass
class SucceededWalk:
    """Where the walk over succeeded jobs stopped, so a long backlog is trimmed over several passes."""

    after: int = 0  # the next step starts at the first job with a greater id


@asynccontextmanager
async def retention_lock(conn: psycopg.AsyncConnection) -> AsyncIterator[bool]:
    """Hold the cluster-wide retention lock for the block; yields False when another worker holds it.

    A transaction-level lock, so it is released by the commit at the end of the block, or by the
    connection closing if this process dies; `conn` must be kept for the lock alone meanwhile.
    """
    async with conn.transaction():
        yield (await (await conn.execute(queries.RETENTION_LOCK)).fetchone())[0]


async def trim(guard: psycopg.AsyncConnection, conn: psycopg.AsyncConnection, retention: Retention,
               walk: SucceededWalk) -> Trimmed | None:
    """One retention pass on `conn` (autocommit) under the lock taken on `guard`; None if another worker has it."""
    async with retention_lock(guard) as held:
        if not held:
            return None
        trimmed = Trimmed()
        if retention.succeeded:
            trimmed.succeeded = await _trim_succeeded(conn, retention.succeeded, walk)
        if retention.dead:
            trimmed.dead = await _repeat(conn, queries.TRIM_DEAD, retention.dead)
        if retention.cancelled:
            trimmed.cancelled = await _repeat(conn, queries.TRIM_CANCELLED, retention.cancelled)
        trimmed.idempotency_keys = await _repeat(conn, queries.TRIM_EXPIRED_KEYS, 0.0)
        await fold_stats(conn)  # before trimming, so old deltas land in rows the trim then sees
        if retention.daily_stats:
            trimmed.daily_stats = await _repeat(conn, queries.TRIM_DAILY_STATS, retention.daily_stats)
        trimmed.minute_stats = await _repeat(conn, queries.TRIM_MINUTE_STATS, MINUTE_STATS_KEEP)
        return trimmed


async def fold_stats(conn: psycopg.AsyncConnection) -> bool:
    """Fold the stats and timing deltas into their rollups (as `dygo serve` does), so they stay small without it."""
    async with conn.transaction():
        if not (await (await conn.execute(queries.FOLD_STATS_LOCK)).fetchone())[0]:
            return False
        await conn.execute(queries.FOLD_STATS)
        await conn.execute(queries.FOLD_TIMINGS)
    return True


async def _repeat(conn: psycopg.AsyncConnection, statement: str, keep: float) -> int:
    """Run a batch delete while its batches come back full, up to MAX_BATCHES; the rows deleted."""
    total = 0
    for _ in range(MAX_BATCHES):
        deleted = (await (await conn.execute(statement, {"keep": keep, "batch": BATCH})).fetchone())[0]
        total += deleted
        if deleted < BATCH:
            break
    return total


async def _trim_succeeded(conn: psycopg.AsyncConnection, keep: float, walk: SucceededWalk) -> int:
    total = 0
    for _ in range(MAX_WALK_STEPS):
        params = {"keep": keep, "after": walk.after, "window": WALK_WINDOW}
        deleted, next_after = await (await conn.execute(queries.TRIM_SUCCEEDED_RANGE, params)).fetchone()
        total += deleted
        if next_after is None:
            walk.after = 0  # reached recent jobs: the next pass starts again from the oldest
            break
        walk.after = next_after
    return total
