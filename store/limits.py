"""Cluster-wide flow control: `concurrency_limit` and `rate_limit` per queue and per kind, optionally
per key (`key: meta.tenant`), enforced where jobs are claimed, in the claim's transaction.

A claim for queues that no limit concerns is CLAIM_JOBS as before: one statement, no lock. Under a
limit the claim is one transaction in one round trip (pipelined):
1. an advisory lock per limit concerned (sorted, so two claims never wait on each other in a cycle),
   taken by its own statement before anything is counted: READ COMMITTED gives the next statement a
   snapshot that includes every claim committed while this one waited for the lock;
2. CLAIM_LIMITED, one statement: the use of each limit (active jobs: the active set is small, one walk
   of dygo_jobs_leases; the starts logged in each rate window), the ready rows skipping every queue,
   kind and key already at its limit (so one tenant's backlog does not hide another tenant's jobs),
   locked FOR UPDATE SKIP LOCKED, of those the ones each limit still admits, claimed like CLAIM_JOBS
   claims (queries._CLAIMED), and one start-log row per rate limit and key with its count (insert-only,
   no shared row per job).

Rate windows are sliding: at most N starts in any interval of the window's length, on the database
clock at the claim (clock_timestamp(), read after the lock, so the log's times follow lock order).
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psycopg
from dygo.store import leases, queries
from dygo.store.config import Limit, parse_concurrency_limit, parse_limit_key, parse_rate
from dygo.store.errors import ConfigError
from dygo.store.leases import Claim, ClaimedJob, claim_with_next_due, claimed_job
from dygo.store.registry import Registry, registry

# How long a process trusts the limits it read: a change made through the API reaches every claim
# within this (plus the claim that follows it).
CACHE_TTL = 0.25
# A queue held back by a full concurrency limit claims again after this at the latest; a settle of a
# limited job NOTIFYs its queue (freed_queues, at the settle's commit), so normally sooner.
CONCURRENCY_RECHECK = 0.5

LIMITS = """
SELECT scope, name, key, concurrency_limit, rate_count, rate_window FROM dygo_limits
WHERE concurrency_limit IS NOT NULL OR rate_count IS NOT NULL"""

# Advisory lock keys from 64-bit hashes of "dygo.limit:<scope>:<name>", in ascending order.
LOCK_LIMITS = """
SELECT count(pg_advisory_xact_lock(k)) FROM unnest(%(keys)s::bigint[]) WITH ORDINALITY AS l(k, i)"""

# The limited claim, after the lock: every step in one statement, so the whole claim is one round trip
# (BEGIN, the lock, this, COMMIT, pipelined) whatever the limits. Each (scope, name, field, concurrency,
# rate count, rate window) of the limits concerned is a row of `lim`; `use` has the active jobs and the
# starts in the window per limit and key ('' for an unkeyed limit, and for jobs without the key's field),
# with `wait`: NULL if it admits another start now, else the seconds until it may (CONCURRENCY_RECHECK
# for a full concurrency limit, a settle's NOTIFY may come first).
# The walk is CLAIM_JOBS's, skipping every (limit, key) at its limit (so one tenant's backlog does not
# hide another tenant's jobs); an unkeyed queue limit caps the walk itself (no point locking rows it
# cannot admit). Of the candidates, a job is kept while every limit that applies still admits it: its
# rank among the candidates of that limit and key, in claim order, plus the use, is within the limit.
# Ranks count candidates another limit refused: the claim may take fewer than it could (the queue is
# then claimed again at once: a `held` row with wait 0), never more. The kept rows are claimed as
# CLAIM_JOBS claims (queries._CLAIMED), and each rate limit and key gets one start-log row with its count
# (insert-only: no shared row per job). The rows returned: the claimed jobs in claim order, then one row
# per queue that came back short with its next scheduled job (due_in), and one per queue a limit held
# back (wait).
CLAIM_LIMITED = f"""
WITH lim AS MATERIALIZED (
    SELECT * FROM unnest(%(scopes)s::text[], %(names)s::text[], %(fields)s::text[], %(concurrency)s::integer[],
                         %(rate_counts)s::integer[], %(rate_windows)s::float8[])
        WITH ORDINALITY AS l(scope, name, field, conc, rcount, rwin, li)
), active AS (
    SELECT l.li, coalesce(j.meta ->> l.field, '') AS key, count(*)::integer AS n
    FROM lim l JOIN dygo_jobs j ON j.state = 'active'
                               AND l.name = CASE l.scope WHEN 'queue' THEN j.queue ELSE j.kind END
    WHERE l.conc IS NOT NULL
    GROUP BY 1, 2
), started AS (
    SELECT l.li, s.key, sum(s.n)::integer AS n,
           extract(epoch FROM min(s.at) + make_interval(secs => l.rwin) - clock_timestamp())::float8 AS frees_in
    FROM lim l JOIN dygo_limit_starts s ON s.scope = l.scope AND s.name = l.name
                                       AND s.at > clock_timestamp() - make_interval(secs => l.rwin)
    WHERE l.rcount IS NOT NULL
    GROUP BY l.li, s.key, l.rwin
), use AS MATERIALIZED (
    SELECT l.li, l.scope, l.name, l.field, coalesce(a.key, s.key) AS key,
           coalesce(a.n, 0) AS active, coalesce(s.n, 0) AS started,
           greatest(CASE WHEN a.n >= l.conc THEN %(recheck)s::float8 END,
                    CASE WHEN s.n >= l.rcount THEN greatest(s.frees_in, 0) + 0.005 END) AS wait
    FROM active a FULL JOIN started s ON s.li = a.li AND s.key = a.key
    JOIN lim l ON l.li = coalesce(a.li, s.li)
), w AS (
    SELECT w.queue, greatest(least(w.slots, (
        SELECT min(least(l.conc - coalesce(u.active, 0), l.rcount - coalesce(u.started, 0)))
        FROM lim l LEFT JOIN use u ON u.li = l.li AND u.key = ''
        WHERE l.scope = 'queue' AND l.field IS NULL AND l.name = w.queue)), 0) AS slots
    FROM unnest(%(queues)s::text[], %(limits)s::integer[]) AS w(queue, slots)
), cand AS MATERIALIZED (
    SELECT p.* FROM w CROSS JOIN LATERAL (
        SELECT id, kind, queue, meta, priority, run_at FROM dygo_jobs j
        WHERE state = 'pending' AND queue = w.queue AND run_at <= now()
          AND kind <> ALL(%(full_kinds)s::text[])
          AND NOT EXISTS (SELECT 1 FROM dygo_queues q WHERE q.name = w.queue AND q.paused)
          AND NOT EXISTS (SELECT 1 FROM use u WHERE u.wait IS NOT NULL
                            AND u.name = CASE u.scope WHEN 'queue' THEN j.queue ELSE j.kind END
                            AND coalesce(j.meta ->> u.field, '') = u.key)
        ORDER BY priority DESC, run_at, id
        LIMIT w.slots
        FOR UPDATE SKIP LOCKED
    ) AS p
    WHERE w.slots > 0
), ranked AS (
    SELECT c.id, l.li, coalesce(c.meta ->> l.field, '') AS key,
           row_number() OVER (PARTITION BY l.li, coalesce(c.meta ->> l.field, '')
                              ORDER BY c.priority DESC, c.run_at, c.id) AS rn
    FROM cand c JOIN lim l ON l.name = CASE l.scope WHEN 'queue' THEN c.queue ELSE c.kind END
), refused AS (
    SELECT DISTINCT r.id FROM ranked r JOIN lim l ON l.li = r.li LEFT JOIN use u ON u.li = r.li AND u.key = r.key
    WHERE r.rn + coalesce(u.active, 0) > l.conc OR r.rn + coalesce(u.started, 0) > l.rcount
), kept AS (
    -- This worker's per-kind caps (worker/capacity.py): no more of a kind than its free slots.
    SELECT r.id FROM (
        SELECT c.id, c.kind, row_number() OVER (PARTITION BY c.kind ORDER BY c.priority DESC, c.run_at, c.id) AS n
        FROM cand c WHERE c.id NOT IN (SELECT id FROM refused)
    ) AS r LEFT JOIN unnest(%(cap_kinds)s::text[], %(cap_free)s::integer[]) AS k(kind, free) ON k.kind = r.kind
    WHERE k.free IS NULL OR r.n <= k.free
), {queries._CLAIMED.format(rows="kept")}, logged AS (
    INSERT INTO dygo_limit_starts (scope, name, key, at, n)
    SELECT l.scope, l.name, coalesce(c.meta ->> l.field, ''), clock_timestamp(), count(*)
    FROM claimed c JOIN lim l ON l.rcount IS NOT NULL
                             AND l.name = CASE l.scope WHEN 'queue' THEN c.queue ELSE c.kind END
    GROUP BY l.scope, l.name, 3
), next_due AS (
    SELECT w.queue, extract(epoch FROM n.run_at - now())::float8 AS due_in
    FROM unnest(%(queues)s::text[], %(limits)s::integer[]) AS w(queue, slots)
    CROSS JOIN LATERAL ({queries._NEXT_RUN_AT}) AS n
    WHERE n.run_at IS NOT NULL AND w.slots > (SELECT count(*) FROM claimed c WHERE c.queue = w.queue)
), held AS (
    SELECT w.queue, min(u.wait) AS wait FROM unnest(%(queues)s::text[]) AS w(queue)
    JOIN use u ON u.wait IS NOT NULL AND (u.scope = 'kind' OR u.name = w.queue)
    GROUP BY 1
    UNION ALL
    SELECT DISTINCT c.queue, 0::float8 FROM cand c JOIN refused r ON r.id = c.id
)
SELECT {queries.CLAIMED_JOB_COLUMNS},
       NULL::float8 AS due_in, NULL::float8 AS wait, priority, run_at
FROM claimed
UNION ALL
SELECT NULL, NULL, queue, NULL, NULL, NULL, NULL, NULL, NULL, NULL, due_in, NULL, NULL, NULL FROM next_due
UNION ALL
SELECT NULL, NULL, queue, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, wait, NULL, NULL FROM held
ORDER BY priority DESC NULLS LAST, run_at, id"""


TRIM_STARTS = """
DELETE FROM dygo_limit_starts s
WHERE s.at < now() - make_interval(secs => coalesce(
    (SELECT max(rate_window) FROM dygo_limits l WHERE l.scope = s.scope AND l.name = s.name), 0))"""


@dataclass(frozen=True, slots=True)
class LimitRow:
    """A limit in force (dygo_limits)."""

    scope: str
    name: str
    key: str | None  # meta field name, or None: one limit for all jobs of the queue or kind
    concurrency_limit: int | None
    rate_count: int | None
    rate_window: float | None

    def applies(self, queue: str, kind: str) -> bool:
        return self.name == (queue if self.scope == "queue" else kind)

    def key_of(self, meta: Mapping[str, Any] | None) -> str:
        if self.key is None:
            return ""
        value = (meta or {}).get(self.key)
        return "" if value is None else str(value)

    @property
    def lock_key(self) -> int:
        digest = hashlib.blake2b(f"dygo.limit:{self.scope}:{self.name}".encode(), digest_size=8).digest()
        return int.from_bytes(digest, "big", signed=True)


_cache: dict[str, tuple[float, list[LimitRow]]] = {}


def _cache_key(conn: psycopg.AsyncConnection | psycopg.Connection) -> str:
    info = conn.info
    return f"{info.host}:{info.port}/{info.dbname}"


async def current(conn: psycopg.AsyncConnection) -> list[LimitRow]:
    """The limits in force, read at most every CACHE_TTL seconds per database."""
    key = _cache_key(conn)
    cached = _cache.get(key)
    if cached is not None and time.monotonic() - cached[0] < CACHE_TTL:
        return cached[1]
    rows = [LimitRow(*row) for row in await (await conn.execute(LIMITS)).fetchall()]
    _cache[key] = (time.monotonic(), rows)
    return rows


def forget_cache() -> None:
    _cache.clear()


async def claim(
    conn: psycopg.AsyncConnection,
    wanted: Mapping[str, int],
    owner: str,
    ttl: float,
    jobs: Registry | None = None,
    since: Mapping[str, datetime | None] | None = None,
    kind_free: Mapping[str, int] | None = None,
) -> Claim:
    """Claim up to wanted[queue] ready jobs of each queue without exceeding any limit in force, nor this
    worker's per-kind caps (`kind_free`, leases.claim_with_next_due). Without a limit concerned, the walks
    start at `since`; under one, from the head."""
    wanted = {queue: n for queue, n in wanted.items() if n > 0}
    if not wanted:
        return Claim([], {})
    concerned = [r for r in await current(conn) if r.scope == "kind" or r.name in wanted]
    if not concerned:
        return await claim_with_next_due(conn, wanted, owner, ttl, jobs, since=since, kind_free=kind_free)
    return await _claim_limited(conn, wanted, owner, ttl, jobs or registry, concerned, dict(kind_free or {}))


async def _claim_limited(
    conn: psycopg.AsyncConnection,
    wanted: dict[str, int],
    owner: str,
    ttl: float,
    jobs: Registry,
    concerned: list[LimitRow],
    kind_free: dict[str, int],
) -> Claim:
    kind_attempts, default = jobs.max_attempts_at_claim()
    params = {
        "queues": list(wanted),
        "limits": list(wanted.values()),
        "owner": owner,
        "ttl": ttl,
        "kind_attempts": kind_attempts,
        "max_attempts": default,
        "recheck": CONCURRENCY_RECHECK,
        "scopes": [r.scope for r in concerned],
        "names": [r.name for r in concerned],
        "fields": [r.key for r in concerned],
        "concurrency": [r.concurrency_limit for r in concerned],
        "rate_counts": [r.rate_count for r in concerned],
        "rate_windows": [r.rate_window for r in concerned],
        "full_kinds": [kind for kind, free in kind_free.items() if free <= 0],
        "cap_kinds": [kind for kind, free in kind_free.items() if free > 0],
        "cap_free": [free for free in kind_free.values() if free > 0],
    }
    # One pipeline, one round trip: the lock is a statement of its own, so that CLAIM_LIMITED, a later
    # statement, takes its READ COMMITTED snapshot after the lock was granted and counts every claim
    # committed while this one waited for it. The commit need not wait for the WAL flush, as
    # leases.claim_with_next_due's (a claim lost in a crash leaves its jobs pending).
    try:
        async with conn.pipeline():
            await conn.execute(leases.BEGIN)
            # Index scans only (the claim's UPDATE by id, on a table of a few pages), no wait for the flush.
            await conn.execute(leases.CLAIM_SETTINGS)
            await conn.execute(LOCK_LIMITS, {"keys": sorted(r.lock_key for r in concerned)})
            cursor = await conn.execute(CLAIM_LIMITED, params)
            await conn.execute(leases.COMMIT)
        rows = await cursor.fetchall()
    except BaseException:
        await leases.roll_back(conn)
        raise
    held: dict[str, float] = {}
    due: dict[str, float] = {}
    for row in rows:
        if row[0] is not None:
            continue
        if row[10] is not None:
            due[row[2]] = row[10]
        if row[11] is not None:
            held[row[2]] = min(held.get(row[2], row[11]), row[11])
    return Claim([claimed_job(row) for row in rows if row[0] is not None], due, held=held, limited=True)


async def freed_queues(conn: psycopg.AsyncConnection, jobs: Iterable[ClaimedJob]) -> list[str]:
    """The queues to wake when `jobs` settle (leases.settle's `notify`): those whose jobs a concurrency limit
    counts, so the workers holding jobs back on it claim again at once rather than at their recheck timer."""
    rows = [r for r in await current(conn) if r.concurrency_limit is not None]
    return sorted({job.queue for job in jobs if any(r.applies(job.queue, job.kind) for r in rows)}) if rows else []


async def trim_starts(conn: psycopg.AsyncConnection) -> None:
    """Delete start-log rows older than their limit's window (all rows of a limit no longer rated)."""
    await conn.execute(TRIM_STARTS)


# --- config/queues.yml -> dygo_limits ------------------------------------------------------------

# One statement per sync, safe when many workers start at once. For each declared limit: a new row,
# or, when the file's value differs from the one stored at the last sync, the file's value; otherwise
# the limit in force stays (a change made through the API survives restarts). A limit the file no
# longer declares is removed if it came from the file.
SYNC_LIMITS = """
WITH declared AS (
    SELECT * FROM unnest(%(scopes)s::text[], %(names)s::text[], %(keys)s::text[], %(concurrency)s::integer[],
                         %(rates)s::text[], %(counts)s::integer[], %(windows)s::float8[])
        AS d(scope, name, key, concurrency, rate, count, win)
), upserted AS (
    INSERT INTO dygo_limits AS l (scope, name, key, concurrency_limit, rate_count, rate_window,
                                  in_file, file_concurrency, file_rate, file_key)
    SELECT scope, name, key, concurrency, count, win, true, concurrency, rate, key FROM declared
    ON CONFLICT (scope, name) DO UPDATE SET
        concurrency_limit = CASE WHEN l.file_concurrency IS DISTINCT FROM excluded.file_concurrency
                                   OR NOT l.in_file THEN excluded.concurrency_limit ELSE l.concurrency_limit END,
        rate_count = CASE WHEN l.file_rate IS DISTINCT FROM excluded.file_rate OR NOT l.in_file
                          THEN excluded.rate_count ELSE l.rate_count END,
        rate_window = CASE WHEN l.file_rate IS DISTINCT FROM excluded.file_rate OR NOT l.in_file
                           THEN excluded.rate_window ELSE l.rate_window END,
        key = CASE WHEN l.file_key IS DISTINCT FROM excluded.file_key OR NOT l.in_file
                   THEN excluded.key ELSE l.key END,
        in_file = true, file_concurrency = excluded.file_concurrency, file_rate = excluded.file_rate,
        file_key = excluded.file_key,
        updated_at = CASE WHEN (l.file_concurrency, l.file_rate, l.file_key, l.in_file)
                               IS DISTINCT FROM (excluded.file_concurrency, excluded.file_rate, excluded.file_key, true)
                          THEN now() ELSE l.updated_at END
    RETURNING l.scope, l.name
)
DELETE FROM dygo_limits l
WHERE l.in_file AND NOT EXISTS (SELECT 1 FROM declared d WHERE d.scope = l.scope AND d.name = l.name)"""


async def sync(conn: psycopg.AsyncConnection, limits: Sequence[Limit]) -> None:
    """Bring dygo_limits in line with config/queues.yml (at worker start)."""
    rates = [limit.rate for limit in limits]
    params = {
        "scopes": [lim.scope for lim in limits],
        "names": [lim.name for lim in limits],
        "keys": [lim.key for lim in limits],
        "concurrency": [lim.concurrency_limit for lim in limits],
        "rates": [lim.rate_limit for lim in limits],
        "counts": [r[0] if r else None for r in rates],
        "windows": [r[1] if r else None for r in rates],
    }
    await conn.execute(SYNC_LIMITS, params)
    forget_cache()


def check_kinds(limits: Sequence[Limit], jobs: Registry, source: str) -> None:
    """A kind limit must name a kind this process loaded (ConfigError naming the entry otherwise)."""
    known = set(jobs.kinds())
    for limit in limits:
        if limit.scope == "kind" and limit.name not in known:
            raise ConfigError(
                source,
                f"kinds ({limit.name})",
                f"unknown kind {limit.name!r}; the loaded kinds are: {', '.join(sorted(known))}",
            )


# --- reading and changing limits (API, dashboard, dygo status, metrics) ----------------------------


@dataclass(frozen=True)
class LimitUse:
    scope: str
    name: str
    key: str | None  # meta field, for a per-key limit
    concurrency_limit: int | None
    rate_limit: str | None  # e.g. "50/s"
    in_use: dict[str, int]  # active jobs per key value ('' for an unkeyed limit)
    started: dict[str, int]  # starts in the current window per key value
    ready: dict[str, int]  # ready pending jobs per key value
    rate_count: int | None = None

    def full(self, key: str) -> bool:
        return (self.concurrency_limit is not None and self.in_use.get(key, 0) >= self.concurrency_limit) or (
            self.rate_count is not None and self.started.get(key, 0) >= self.rate_count
        )

    @property
    def waiting(self) -> int:
        """Ready jobs held back because their limit (for their key) is full: waiting on a limit, not stuck."""
        return sum(n for key, n in self.ready.items() if self.full(key))

    def as_dict(self) -> dict[str, Any]:
        return {
            "scope": self.scope,
            "name": self.name,
            "key": f"meta.{self.key}" if self.key else None,
            "concurrency_limit": self.concurrency_limit,
            "rate_limit": self.rate_limit,
            "in_use": sum(self.in_use.values()),
            "in_use_by_key": self.in_use if self.key else None,
            "started_in_window": sum(self.started.values()),
            "waiting": self.waiting,
        }


def format_rate(count: int | None, window: float | None) -> str | None:
    if count is None or window is None:
        return None
    unit = {1.0: "s", 60.0: "m", 3600.0: "h"}.get(window)
    return f"{count}/{unit}" if unit else f"{count}/{window:g}s"


# Each limit in force with its use per key: active jobs, starts in the window, ready pending jobs.
# For the API, the dashboard, /metrics and `dygo status` (not the claim: it counts under its lock).
USE_ALL = """
WITH l AS (
    SELECT scope, name, key, concurrency_limit, rate_count, rate_window FROM dygo_limits
    WHERE concurrency_limit IS NOT NULL OR rate_count IS NOT NULL
)
SELECT l.scope, l.name, l.key, l.concurrency_limit, l.rate_count, l.rate_window,
       coalesce((SELECT jsonb_object_agg(k, n) FROM (
           SELECT coalesce(j.meta ->> l.key, '') AS k, count(*) AS n FROM dygo_jobs j
           WHERE j.state = 'active' AND l.name = CASE l.scope WHEN 'queue' THEN j.queue ELSE j.kind END
           GROUP BY 1) a), '{}'::jsonb),
       coalesce((SELECT jsonb_object_agg(k, n) FROM (
           SELECT s.key AS k, sum(s.n) AS n FROM dygo_limit_starts s
           WHERE s.scope = l.scope AND s.name = l.name AND l.rate_window IS NOT NULL
             AND s.at > clock_timestamp() - make_interval(secs => l.rate_window)
           GROUP BY 1) r), '{}'::jsonb),
       coalesce((SELECT jsonb_object_agg(k, n) FROM (
           SELECT coalesce(j.meta ->> l.key, '') AS k, count(*) AS n FROM dygo_jobs j
           WHERE j.state = 'pending' AND j.run_at <= now()
             AND l.name = CASE l.scope WHEN 'queue' THEN j.queue ELSE j.kind END
           GROUP BY 1) p), '{}'::jsonb)
FROM l ORDER BY l.scope DESC, l.name"""


def _use(row: tuple[Any, ...]) -> LimitUse:
    scope, name, key, concurrency, count, window, active, started, ready = row
    return LimitUse(
        scope,
        name,
        key,
        concurrency,
        format_rate(count, window),
        {k: int(v) for k, v in active.items()},
        {k: int(v) for k, v in started.items()},
        {k: int(v) for k, v in ready.items()},
        count,
    )


def limits_in_use(conn: psycopg.Connection) -> list[LimitUse]:
    return [_use(row) for row in conn.execute(USE_ALL).fetchall()]


async def alimits_in_use(conn: psycopg.AsyncConnection) -> list[LimitUse]:
    return [_use(row) for row in await (await conn.execute(USE_ALL)).fetchall()]


SET_LIMIT = """
INSERT INTO dygo_limits AS l (scope, name, key, concurrency_limit, rate_count, rate_window)
VALUES (%(scope)s, %(name)s, %(key)s, %(concurrency)s, %(count)s, %(window)s)
ON CONFLICT (scope, name) DO UPDATE SET
    concurrency_limit = excluded.concurrency_limit, rate_count = excluded.rate_count,
    rate_window = excluded.rate_window, key = excluded.key, updated_at = now()"""


def set_limit(
    conn: psycopg.Connection,
    scope: str,
    name: str,
    concurrency_limit: int | None,
    rate_limit: str | None,
    key: str | None,
    queues: Sequence[str],
) -> None:
    """Put a limit in force now (None for both: no limit), and wake `queues`' workers to claim under it.
    Raises ValueError naming the field and the rule. Kept over restarts until config/queues.yml's
    value for it changes (sync)."""
    if scope not in ("queue", "kind"):
        raise ValueError(f"scope {scope!r} must be queue or kind")
    if concurrency_limit is not None:
        parse_concurrency_limit(concurrency_limit)
    count, window = parse_rate(rate_limit) if rate_limit is not None else (None, None)
    field_name = parse_limit_key(key) if key is not None else None
    params = {
        "scope": scope,
        "name": name,
        "key": field_name,
        "concurrency": concurrency_limit,
        "count": count,
        "window": window,
    }
    with conn.transaction():
        conn.execute(SET_LIMIT, params)
        conn.execute(queries.NOTIFY_QUEUES, {"queues": list(queues)})
