"""The admin side of the store: job lists, actions on a job or a queue, daily stats, workers.

Sync psycopg (the admin service runs its endpoints in a thread pool); what the event loop or the worker
also runs has an async twin beside it (`a` prefix) sharing its statement and the reading of its rows.
Every statement lives in store/sql/, by area; this module picks them, runs them, and turns "no row came
back" into the right error: an unknown id (NotFound) or a job whose state does not allow the action
(Conflict).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal, NoReturn

import psycopg
from dygo.store import results
from dygo.store.db import one
from dygo.store.errors import Conflict, NotFound
from dygo.store.migrate import check_version, schema_version
from dygo.store.sql import admin_jobs, admin_queues, bulk, dead_jobs, job_lists, stats, timings, workers
from psycopg import sql
from psycopg.rows import dict_row

# What a list can filter on; 'scheduled' is a pending job whose run_at is still ahead. A job of a workflow
# is 'waiting' while its node waits for the nodes before it, and 'skipped' when its workflow skipped it.
STATES = ("scheduled", "pending", "active", "succeeded", "dead", "paused", "cancelled", "waiting", "skipped")
# What the queue counts report. Succeeded jobs are history, counted by the daily stats instead.
COUNTED_STATES = ("pending", "scheduled", "active", "paused", "dead", "cancelled", "waiting", "skipped")
Order = Literal["newest", "oldest"]

# A list no index serves in id order (text search; a queue or kind among all or succeeded jobs)
# looks at no more than this many ids per page, so a rare match never means a scan of the whole
# history. Ids come from one sequence, so a range of N ids holds at most N rows.
SCAN_WINDOW = 50_000
# Text search matches each row's args as JSON and its last error: the costliest filter per row, so a
# smaller window keeps its pages under 200 ms on a 1M-job table (bench/dashboard_pages.py).
TEXT_SCAN_WINDOW = 20_000

# Which states each action starts from (the same rule is the WHERE of its statement).
ACTIONS: dict[str, tuple[str, tuple[str, ...]]] = {
    "retry": (admin_jobs.RETRY_JOB, ("dead", "cancelled")),
    "cancel": (admin_jobs.CANCEL_JOB, ("pending", "scheduled", "paused", "waiting")),
    "pause": (admin_jobs.PAUSE_JOB, ("pending", "scheduled")),
    "resume": (admin_jobs.RESUME_JOB, ("paused",)),
    "run-now": (admin_jobs.RUN_JOB_NOW, ("scheduled",)),
    "archive": (admin_jobs.ARCHIVE_JOB, ("pending", "scheduled")),
}
DELETABLE = tuple(state for state in STATES if state != "active")
# Ready (not yet running) jobs have their own index, dygo_jobs_ready.
READY_STATES = frozenset({"pending", "scheduled"})


# --- job lists ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class JobFilter:
    queue: str | None = None
    kind: str | None = None
    state: str | None = None
    text: str | None = None  # a substring of the args (as JSON) or of the last error
    parent_id: int | None = None  # a parent's child jobs (`ctx.call`, `ctx.map`), found by their own index

    def scans(self) -> bool:
        """True when no index finds these jobs in id order, so each page bounds its scan."""
        if self.text:
            return True
        return bool(self.queue or self.kind) and self.state in (None, "succeeded")


@dataclass(frozen=True)
class JobListPage:
    """One page of `list_jobs`: its jobs and where the next page starts."""

    jobs: list[dict[str, Any]]
    # Where the next page starts (an exclusive id bound), or None at the end. A page of a scanning
    # filter can hold fewer jobs than asked for and still have a next page.
    next_position: int | None


def list_jobs(
    conn: psycopg.Connection, where: JobFilter, *, order: Order = "newest", limit: int = 50, position: int | None = None
) -> JobListPage:
    """One page of jobs, newest or oldest first, starting after `position` (keyset on id)."""
    newest = order == "newest"
    fragments, params = _filters(where, newest, position)
    params["limit"] = limit + 1  # one more than asked: tells whether a next page exists
    if where.parent_id is not None:  # a parent's children through their index, sorted: never a walk of all ids
        return _page(_fetch(conn, fragments, params, newest, key="sorted"), limit, None)
    if where.scans():
        size = min(SCAN_WINDOW, TEXT_SCAN_WINDOW) if where.text else SCAN_WINDOW
        window = _scan_window(conn, newest, position, size)
        if window is None:
            return JobListPage([], None)
        bound, edge, end_of_window = window
        rows = _fetch(conn, [*fragments, job_lists.JOB_FILTERS[bound]], {**params, bound: edge}, newest)
        return _page(rows, limit, end_of_window)
    if where.state in READY_STATES:
        return _ready_page(conn, fragments, params, newest, position, limit)
    return _page(_fetch(conn, fragments, params, newest), limit, None)


def _filters(where: JobFilter, newest: bool, position: int | None) -> tuple[list[str], dict[str, Any]]:
    params: dict[str, Any] = {"queue": where.queue, "kind": where.kind}
    fragments = [job_lists.JOB_FILTERS[name] for name in ("queue", "kind") if params[name] is not None]
    if where.state is not None:
        fragments.append(job_lists.JOB_STATE_FILTERS[where.state])
    if where.text:
        params["pattern"] = f"%{_escape_like(where.text)}%"
        fragments.append(job_lists.JOB_FILTERS["text"])
    if where.parent_id is not None:
        params["parent_id"] = where.parent_id
        fragments.append(job_lists.JOB_FILTERS["parent"])
    if position is not None:
        bound = "below" if newest else "above"
        params[bound] = position
        fragments.append(job_lists.JOB_FILTERS[bound])
    return fragments, params


def _fetch(
    conn: psycopg.Connection, fragments: list[str], params: dict[str, Any], newest: bool, key: str = "by_primary_key"
) -> list[dict[str, Any]]:
    statement = sql.SQL(job_lists.LIST_JOBS).format(
        columns=sql.SQL(job_lists.JOB_SUMMARY_COLUMNS),
        filters=sql.SQL(" AND ").join(sql.SQL(f) for f in fragments or [job_lists.JOB_FILTERS["everything"]]),
        key=sql.SQL(job_lists.JOB_ORDER_KEYS[key]),
        direction=sql.SQL("DESC" if newest else "ASC"),
    )
    with conn.cursor(row_factory=dict_row) as cursor:
        return cursor.execute(statement, params).fetchall()


def _page(rows: list[dict[str, Any]], limit: int, otherwise: int | None) -> JobListPage:
    if len(rows) > limit:
        return JobListPage(rows[:limit], rows[limit - 1]["id"])
    return JobListPage(rows, otherwise)


def _ready_page(
    conn: psycopg.Connection,
    fragments: list[str],
    params: dict[str, Any],
    newest: bool,
    position: int | None,
    limit: int,
) -> JobListPage:
    """Pending or scheduled jobs: usually the newest rows, so first a bounded walk of the primary
    key from the start; when they are too sparse there (a backlog of old jobs, or few far-future
    ones), their own index, sorted: the cost is then bounded by how many are waiting."""
    window = _scan_window(conn, newest, position)
    if window is None:
        return JobListPage([], None)
    bound, edge, _ = window
    rows = _fetch(conn, [*fragments, job_lists.JOB_FILTERS[bound]], {**params, bound: edge}, newest)
    if len(rows) <= limit:
        rows = _fetch(conn, fragments, params, newest, key="sorted")
    return _page(rows, limit, None)


def _scan_window(
    conn: psycopg.Connection, newest: bool, position: int | None, size: int | None = None
) -> tuple[str, int, int | None] | None:
    """The id bound that limits this page's scan (`size` ids, SCAN_WINDOW by default), and where the
    next page starts if it runs dry."""
    size = SCAN_WINDOW if size is None else size
    low, high = one(conn.execute(job_lists.JOB_ID_RANGE).fetchone())
    if low is None:
        return None
    if newest:
        start = high if position is None else min(position - 1, high)
        floor = start - size + 1
        return "floor", floor, (floor if floor > low else None)
    start = low if position is None else max(position + 1, low)
    ceiling = start + size - 1
    return "ceiling", ceiling, (ceiling if ceiling < high else None)


def _escape_like(text: str) -> str:
    return text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")


# --- one job -----------------------------------------------------------------------------------


def act_on_job(conn: psycopg.Connection, action: str, job_id: int) -> dict[str, Any]:
    """Run one of ACTIONS on a job; return the job as it is now."""
    statement, allowed = ACTIONS[action]
    try:
        with conn.transaction(), conn.cursor(row_factory=dict_row) as cursor:
            cursor.execute(admin_jobs.LOCK_JOB_WORKFLOW, {"id": job_id})
            job = cursor.execute(statement, {"id": job_id}).fetchone()
    except psycopg.errors.UniqueViolation:
        # Only a retry brings a job back to a live state, where its idempotency key must be unique.
        raise key_held(job_id, action) from None
    if job is None:
        _refuse(conn, job_id, action, allowed)
    return job


def key_held(job_id: int, action: str) -> Conflict:
    """The refusal of a retry whose job's idempotency key a live job holds (the key's unique index said so)."""
    return Conflict(
        "idempotency_conflict",
        f"job {job_id} cannot be retried: a live job holds its idempotency key",
        {"action": action},
    )


def delete_job(conn: psycopg.Connection, job_id: int, state: str | None = None) -> None:
    """Delete a job that is not active; with `state`, only while it is in that state (else Conflict)."""
    with conn.transaction():
        conn.execute(admin_jobs.LOCK_JOB_WORKFLOW, {"id": job_id})
        deleted = conn.execute(admin_jobs.DELETE_JOB, {"id": job_id, "state": state}).fetchone()
    if deleted is None:
        _refuse(conn, job_id, "delete", DELETABLE if state is None else (state,))
    # Anyone waiting for its result stops waiting now rather than at their timeout.
    results.notify_deleted(conn, [job_id])


def _refuse(conn: psycopg.Connection, job_id: int, action: str, allowed: tuple[str, ...]) -> NoReturn:
    row = conn.execute(admin_jobs.JOB_STATE, (job_id,)).fetchone()
    if row is None:
        raise NotFound("job_not_found", f"no job with id {job_id}")
    state = row[0]
    raise Conflict(
        "invalid_transition",
        f"job {job_id} is {state}; {action} applies to a job that is {' or '.join(allowed)}",
        {"state": state, "action": action, "allowed_from": list(allowed)},
    )


# --- queues ------------------------------------------------------------------------------------


def list_queues(conn: psycopg.Connection, configured: Mapping[str, int]) -> list[dict[str, Any]]:
    """Every configured queue (and any other queue that still has jobs), with its counts by state."""
    return _queue_list(configured, conn.execute(admin_queues.QUEUE_LIST).fetchall())


async def alist_queues(conn: psycopg.AsyncConnection, configured: Mapping[str, int]) -> list[dict[str, Any]]:
    """`list_queues` for an AsyncConnection (the admin service's hot read)."""
    return _queue_list(configured, await (await conn.execute(admin_queues.QUEUE_LIST)).fetchall())


def _queue_list(configured: Mapping[str, int], rows: list[Any]) -> list[dict[str, Any]]:
    counts: dict[str, dict[str, int]] = {}
    paused: dict[str, Any] = {}
    succeeded: dict[str, int] = {}
    for part, queue, state, number, paused_at in rows:
        if part == "count":
            counts.setdefault(queue, dict.fromkeys(COUNTED_STATES, 0))[state] = number
        elif part == "paused":
            paused[queue] = paused_at
        else:
            succeeded[queue] = number
    names = list(configured) + sorted((set(counts) | set(paused)) - set(configured))
    return [
        {
            "name": name,
            "concurrency": configured.get(name),
            "paused": name in paused,
            "paused_at": paused.get(name),
            "counts": counts.get(name, dict.fromkeys(COUNTED_STATES, 0)),
            "succeeded_today": succeeded.get(name, 0),
        }
        for name in names
    ]


def find_queue(conn: psycopg.Connection, configured: Mapping[str, int], name: str) -> dict[str, Any] | None:
    """One queue as list_queues shows it; None unless it is configured or still has jobs (a queue since removed)."""
    return next((queue for queue in list_queues(conn, configured) if queue["name"] == name), None)


def pause_queue(conn: psycopg.Connection, queue: str) -> datetime:
    """Workers stop claiming from the queue (jobs already running finish). Returns when it was paused."""
    paused: datetime = one(conn.execute(admin_queues.PAUSE_QUEUE, (queue,)).fetchone())[0]
    return paused


def resume_queue(conn: psycopg.Connection, queue: str) -> None:
    conn.execute(admin_queues.RESUME_QUEUE, (queue,))


def _lock_workflows_of(conn: psycopg.Connection, jobs: sql.Composable, params: Mapping[str, Any]) -> None:
    """First in a transaction that moves many jobs: lock the workflows of those `jobs` selects. The job
    triggers lock a workflow's row before its jobs' rows, and so must a statement that takes the job rows
    first, or it and a settle of the same workflow could each hold what the other waits for."""
    conn.execute(sql.SQL(admin_jobs.LOCK_JOBS_WORKFLOWS).format(jobs=jobs), params)


def retry_dead(conn: psycopg.Connection, queue: str | None) -> int:
    """Every dead job of the queue (None: of every queue) back to pending now; returns how many."""
    which, statement = (
        (dead_jobs.DEAD_ANYWHERE, dead_jobs.RETRY_ALL_DEAD_JOBS)
        if queue is None
        else (dead_jobs.DEAD_IN_QUEUE, dead_jobs.RETRY_DEAD_JOBS)
    )
    params = {"queue": queue}
    with conn.transaction():
        _lock_workflows_of(conn, sql.SQL(which), params)
        return len(conn.execute(statement, params).fetchall())


def purge_queue(conn: psycopg.Connection, queue: str) -> dict[str, int]:
    """Delete the queue's pending, scheduled and dead jobs; report them and the jobs left alone."""
    with conn.transaction():
        _lock_workflows_of(conn, sql.SQL(admin_queues.PURGED), {"queue": queue})
        pending, scheduled, dead, active, paused = one(
            conn.execute(admin_queues.PURGE_QUEUE, {"queue": queue}).fetchone()
        )
        if pending + scheduled + dead:
            results.notify_recheck(conn)  # their waiters answer 404 now, not at their timeout
    return {"pending": pending, "scheduled": scheduled, "dead": dead, "active_left": active, "paused_left": paused}


def vacuum_dead(conn: psycopg.Connection, queue: str, older_than: float) -> int:
    """Delete the queue's jobs dead for longer than `older_than` seconds; returns how many."""
    # No waiter to wake (unlike purge_queue): a request waiting for a job returns as soon as it reads it dead.
    return conn.execute(dead_jobs.VACUUM_DEAD, {"queue": queue, "older_than": older_than}).rowcount


def count_vacuum_dead(conn: psycopg.Connection, queue: str, older_than: float) -> int:
    """How many jobs vacuum_dead would delete now."""
    count: int = one(conn.execute(dead_jobs.COUNT_VACUUM_DEAD, {"queue": queue, "older_than": older_than}).fetchone())[
        0
    ]
    return count


# --- daily stats -------------------------------------------------------------------------------


# Folded in one transaction under FOLD_STATS_LOCK, which another process folding holds.
_FOLDS = (stats.FOLD_STATS, timings.FOLD_TIMINGS)


def _may_fold(lock: tuple[Any, ...] | None) -> bool:
    return bool(lock and lock[0])


def fold_stats(conn: psycopg.Connection) -> bool:
    """Fold the stats deltas into the daily and minute rollups, and the timing deltas into dygo_timings;
    False when another process is folding. `dygo serve` folds before it reads them."""
    with conn.transaction():
        if not _may_fold(conn.execute(stats.FOLD_STATS_LOCK).fetchone()):
            return False
        for statement in _FOLDS:
            conn.execute(statement)
    return True


async def afold_stats(conn: psycopg.AsyncConnection) -> bool:
    """`fold_stats` on an AsyncConnection: the worker's retention pass folds too, so the deltas stay small
    without `dygo serve`."""
    async with conn.transaction():
        if not _may_fold(await (await conn.execute(stats.FOLD_STATS_LOCK)).fetchone()):
            return False
        for statement in _FOLDS:
            await conn.execute(statement)
    return True


STAT_FIELDS = ("enqueued", "succeeded", "failed", "dead", "reaped")


def daily_stats(conn: psycopg.Connection, queue: str | None, days: int) -> dict[str, Any]:
    """The last `days` UTC days for one queue (None: all), oldest first, zero-filled, and their totals."""
    rows = conn.execute(stats.DAILY_STATS, {"queue": queue, "days": days}).fetchall()
    daily = [{"day": row[0], **dict(zip(STAT_FIELDS, row[1:], strict=True))} for row in rows]
    totals = {name: sum(day[name] for day in daily) for name in STAT_FIELDS}
    return {"days": days, "totals": totals, "daily": daily}


def minute_stats(conn: psycopg.Connection, minutes: int = 60) -> list[dict[str, Any]]:
    """The last `minutes` UTC minutes over all queues, oldest first, zero-filled (the current one included)."""
    rows = conn.execute(stats.MINUTE_STATS, {"minutes": minutes}).fetchall()
    return [{"minute": row[0], **dict(zip(STAT_FIELDS, row[1:], strict=True))} for row in rows]


# --- workers, health, development ----------------------------------------------------------------


def replica_lag(conn: psycopg.Connection) -> float | None:
    """Seconds the server of `conn` is behind its primary; None when it is not a replica in recovery."""
    row = conn.execute(stats.REPLICA_LAG).fetchone()
    return None if row is None else row[0]


def live_workers(conn: psycopg.Connection, seen_within: float) -> list[dict[str, Any]]:
    with conn.cursor(row_factory=dict_row) as cursor:
        return cursor.execute(workers.LIVE_WORKERS, (seen_within,)).fetchall()


def check_ready(conn: psycopg.Connection) -> int:
    """The schema version, after checking it is the one this code needs (SchemaError if not)."""
    version = schema_version(conn)
    check_version(version)
    return version or 0


def nuke(conn: psycopg.Connection) -> dict[str, int]:
    """Delete every job, workflow, step, event, idempotency key, stat and queue pause. Development only (the
    caller checks)."""
    with conn.transaction():
        jobs = one(conn.execute(admin_jobs.NUKE_JOBS).fetchone())[0]
        keys, stats, queues = one(conn.execute(admin_jobs.NUKE).fetchone())
        stats += one(conn.execute(timings.NUKE_TIMINGS).fetchone())[0]
        if jobs:
            results.notify_recheck(conn)
    return {"jobs": jobs, "idempotency_keys": keys, "stats_rows": stats, "queue_pauses": queues}


# --- dead letters (the dashboard) -----------------------------------------------------------------


def dead_letter_groups(conn: psycopg.Connection, limit: int = 100) -> list[dict[str, Any]]:
    """Dead jobs grouped by kind and error fingerprint, biggest first, each with a sample."""
    with conn.cursor(row_factory=dict_row) as cursor:
        return cursor.execute(dead_jobs.DEAD_LETTER_GROUPS, {"limit": limit}).fetchall()


def retry_dead_group(conn: psycopg.Connection, kind: str, fingerprint: str) -> int:
    """Every dead job of one group back to pending now; returns how many."""
    params = {"kind": kind, "fingerprint": fingerprint}
    with conn.transaction():
        _lock_workflows_of(conn, sql.SQL(dead_jobs.DEAD_IN_GROUP), params)
        return len(conn.execute(dead_jobs.RETRY_DEAD_GROUP, params).fetchall())


# --- bulk actions and the overview's extras (the dashboard) -----------------------------------------

# A bulk action by filter touches at most this many jobs (oldest ids first); run it again for more.
BULK_LIMIT = 10_000
BULK_ACTIONS = {
    "retry": bulk.BULK_RETRY,
    "cancel": bulk.BULK_CANCEL,
    "archive": bulk.BULK_ARCHIVE,
    "delete": bulk.BULK_DELETE,
}


@dataclass(frozen=True)
class BulkReport:
    matched: int
    changed: int

    @property
    def skipped(self) -> int:
        return self.matched - self.changed


def _bulk_filters(where: JobFilter | None, ids: list[int] | None) -> tuple[sql.Composable, dict[str, Any]]:
    """The WHERE of a bulk statement: the ticked ids, or the same composition as list_jobs."""
    if ids is not None:
        return sql.SQL(bulk.BULK_SELECTED), {"ids": ids}
    fragments, params = _filters(where or JobFilter(), True, None)
    return sql.SQL(" AND ").join(sql.SQL(f) for f in fragments or [job_lists.JOB_FILTERS["everything"]]), params


def count_matching(conn: psycopg.Connection, action: str, where: JobFilter) -> tuple[int, int, bool]:
    """How many jobs the filter matches (looking at no more than BULK_LIMIT + 1), how many of those the
    action would change, and whether there are more than BULK_LIMIT (a run then takes the oldest)."""
    filters, params = _bulk_filters(where, None)
    statement = sql.SQL(bulk.BULK_COUNT).format(filters=filters, allowed=sql.SQL(bulk.BULK_ALLOWED[action]))
    matched, allowed = one(conn.execute(statement, {**params, "cap": BULK_LIMIT + 1, "limit": BULK_LIMIT}).fetchone())
    return min(matched, BULK_LIMIT), allowed, matched > BULK_LIMIT


def bulk_act(
    conn: psycopg.Connection, action: str, *, where: JobFilter | None = None, ids: list[int] | None = None
) -> BulkReport:
    """Run a bulk action (BULK_ACTIONS) on the ticked `ids`, or on the jobs `where` matches
    (at most BULK_LIMIT, oldest first), in one statement; report matched and changed rows."""
    filters, params = _bulk_filters(where, ids)
    statement = sql.SQL(BULK_ACTIONS[action]).format(filters=filters)
    try:
        with conn.transaction():
            _lock_workflows_of(
                conn, sql.SQL(bulk.BULK_MATCHED_IDS).format(filters=filters), {**params, "cap": BULK_LIMIT}
            )
            matched, changed = one(conn.execute(statement, {**params, "cap": BULK_LIMIT}).fetchone())
            if action == "delete" and changed:
                results.notify_recheck(conn)  # cancel and archive are seen by the trigger
    except psycopg.errors.UniqueViolation:
        # A live job took one of the keys between the check and the update: nothing changed.
        raise Conflict(
            "idempotency_conflict",
            "a live job took the idempotency key of one of these jobs meanwhile; nothing was retried, try again",
            {"action": action},
        ) from None
    return BulkReport(matched, changed)


def queue_lag(conn: psycopg.Connection) -> dict[str, float]:
    """Per queue, seconds since the oldest due, unclaimed job became due (queues with none left out)."""
    return dict(conn.execute(admin_queues.QUEUE_LAG).fetchall())


def failing_kinds(conn: psycopg.Connection, limit: int = 5) -> list[dict[str, Any]]:
    """The kinds with the most dead jobs and failed attempts today and yesterday (UTC)."""
    with conn.cursor(row_factory=dict_row) as cursor:
        return cursor.execute(stats.FAILING_KINDS, {"limit": limit}).fetchall()
