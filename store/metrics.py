"""What GET /metrics reports, read from the database on each scrape (no counters kept in memory).

Every read is cheap: counts and lag come from the partial indexes of unfinished jobs, throughput
from the daily stats rollups (plus deltas not folded yet), workers from their heartbeat rows.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import psycopg
from dygo.store import admin, limits, timings
from dygo.store.sql.stats import METRICS_STAT_TOTALS
from dygo.store.sql.steps import WAITING_BY_REASON
from dygo.store.sql.workers import METRICS_BUSY_SLOTS


@dataclass
class Snapshot:
    queues: list[dict[str, Any]] = field(default_factory=list)  # admin.list_queues: counts, paused
    lag: dict[str, float] = field(default_factory=dict)  # queue -> seconds; 0 when nothing is ready
    totals: list[dict[str, Any]] = field(default_factory=list)  # queue, kind and admin.STAT_FIELDS
    workers: list[dict[str, Any]] = field(default_factory=list)  # admin.live_workers rows
    timings: dict[timings.Key, timings.Histogram] = field(default_factory=dict)  # (queue, kind, measure)
    busy: dict[tuple[str, str], int] = field(default_factory=dict)  # (worker id, queue) -> jobs running now
    limits: list[limits.LimitUse] = field(default_factory=list)  # cluster-wide limits with their use
    waiting: dict[tuple[str, str], int] = field(default_factory=dict)  # (queue, reason) -> jobs waiting


def stat_totals(conn: psycopg.Connection) -> list[dict[str, Any]]:
    """Totals per queue and kind over every day the stats still keep (rollups plus unfolded deltas)."""
    return [
        {"queue": row[0], "kind": row[1], **dict(zip(admin.STAT_FIELDS, row[2:], strict=True))}
        for row in conn.execute(METRICS_STAT_TOTALS)
    ]


def busy_slots(conn: psycopg.Connection) -> dict[tuple[str, str], int]:
    """Jobs running now per worker id and queue (from the active rows' lease owners)."""
    return {(worker, queue): n for worker, queue, n in conn.execute(METRICS_BUSY_SLOTS)}


def waiting_by_reason(conn: psycopg.Connection) -> dict[tuple[str, str], int]:
    """Jobs that wait per queue and reason: event, child, workflow, or sleep (a `ctx.sleep` not over)."""
    return {(queue, reason): n for queue, reason, n in conn.execute(WAITING_BY_REASON)}


def snapshot(conn: psycopg.Connection, configured: Mapping[str, int], seen_within: float) -> Snapshot:
    """Everything one scrape reports, on one connection."""
    queues = admin.list_queues(conn, configured)
    lag = admin.queue_lag(conn)  # never negative: only jobs with run_at <= now() count
    return Snapshot(
        queues=queues,
        lag=dict.fromkeys((q["name"] for q in queues), 0.0) | lag,
        totals=stat_totals(conn),
        workers=admin.live_workers(conn, seen_within),
        timings=timings.totals(conn),
        busy=busy_slots(conn),
        limits=limits.limits_in_use(conn),
        waiting=waiting_by_reason(conn),
    )
