"""Cluster-wide flow control: `concurrency_limit` and `rate_limit` per queue and per kind, optionally
per key (`key: meta.tenant`), enforced where jobs are claimed, in the claim's transaction.

A claim for queues that no limit concerns is CLAIM_JOBS as before: one statement, no lock. Under a
limit the claim is one transaction:
1. an advisory lock per limit concerned (sorted, so two claims never wait on each other in a cycle),
   taken by its own statement before anything is counted: READ COMMITTED gives each later statement
   a snapshot that includes every claim committed while this one waited for the lock;
2. the use of each limit: active jobs (the active set is small: one walk of dygo_jobs_leases) and
   the starts logged in each rate window;
3. the ready rows, skipping every queue, kind and key already at its limit (so one tenant's backlog
   does not hide another tenant's jobs), locked FOR UPDATE SKIP LOCKED;
4. of those, the ones each limit still admits, claimed like CLAIM_JOBS claims (queries._CLAIM_PICKED);
5. one start-log row per rate limit and key with its count: insert-only, no shared row per job.

Rate windows are sliding: at most N starts in any interval of the window's length, on the database
clock at the claim (clock_timestamp(), read after the lock, so the log's times follow lock order).
"""

from __future__ import annotations

import hashlib
import time
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psycopg
from dygo.store import queries
from dygo.store.config import Limit, parse_concurrency_limit, parse_limit_key, parse_rate
from dygo.store.errors import ConfigError
from dygo.store.leases import Claim, ClaimedJob, claim_with_next_due
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

# Active jobs per limit and key value ('' for an unkeyed limit, and for jobs without the key's field).
ACTIVE_USE = """
SELECT l.scope, l.name, coalesce(j.meta ->> l.key, '') AS key, count(*)::integer
FROM unnest(%(scopes)s::text[], %(names)s::text[], %(keys)s::text[]) AS l(scope, name, key)
JOIN dygo_jobs j ON j.state = 'active' AND l.name = CASE l.scope WHEN 'queue' THEN j.queue ELSE j.kind END
GROUP BY 1, 2, 3"""

# Starts per rate limit and key in the window ending now, and seconds until its oldest start leaves it.
RATE_USE = """
SELECT s.scope, s.name, s.key, sum(s.n)::integer,
       extract(epoch FROM min(s.at) + make_interval(secs => l.win) - clock_timestamp())::float8
FROM unnest(%(scopes)s::text[], %(names)s::text[], %(windows)s::float8[]) AS l(scope, name, win)
JOIN dygo_limit_starts s ON s.scope = l.scope AND s.name = l.name
                        AND s.at > clock_timestamp() - make_interval(secs => l.win)
GROUP BY s.scope, s.name, s.key, l.win"""

# The ready rows of each queue in claim order, skipping those of any (scope, name[, meta field = value])
# at its limit. Same walk of dygo_jobs_ready as CLAIM_JOBS; the extra NOT EXISTS is over a short array.
PICK_LIMITED = """
SELECT p.id, p.kind, p.queue, p.meta FROM unnest(%(queues)s::text[], %(limits)s::integer[]) AS w(queue, slots)
CROSS JOIN LATERAL (
    SELECT id, kind, queue, meta FROM dygo_jobs j
    WHERE state = 'pending' AND queue = w.queue AND run_at <= now()
      AND kind <> ALL(%(full_kinds)s::text[])
      AND NOT EXISTS (SELECT 1 FROM dygo_queues q WHERE q.name = w.queue AND q.paused)
      AND NOT EXISTS (
          SELECT 1 FROM unnest(%(full_scopes)s::text[], %(full_names)s::text[], %(full_fields)s::text[],
                               %(full_values)s::text[]) AS f(scope, name, field, value)
          WHERE f.name = CASE f.scope WHEN 'queue' THEN j.queue ELSE j.kind END
            AND (f.field IS NULL OR coalesce(j.meta ->> f.field, '') = f.value))
    ORDER BY priority DESC, run_at, id
    LIMIT w.slots
    FOR UPDATE SKIP LOCKED
) AS p"""

# Seconds until the next scheduled job of each queue (the limited claim's version of CLAIM_JOBS's next_due
# rows).
NEXT_DUE = f"""
SELECT w.queue, extract(epoch FROM n.run_at - now())::float8 FROM unnest(%(queues)s::text[]) AS w(queue)
CROSS JOIN LATERAL ({queries._NEXT_RUN_AT}) AS n
WHERE n.run_at IS NOT NULL"""

CLAIM_PICKED = "WITH picked AS (SELECT unnest(%(ids)s::bigint[]) AS id), " + queries._CLAIM_PICKED

LOG_STARTS = """
INSERT INTO dygo_limit_starts (scope, name, key, at, n)
SELECT scope, name, key, clock_timestamp(), n
FROM unnest(%(scopes)s::text[], %(names)s::text[], %(keys)s::text[], %(counts)s::integer[]) AS s(scope, name, key, n)"""


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


async def claim(conn: psycopg.AsyncConnection, wanted: Mapping[str, int], owner: str, ttl: float,
                jobs: Registry | None = None, since: Mapping[str, datetime | None] | None = None,
                kind_free: Mapping[str, int] | None = None) -> Claim:
    """Claim up to wanted[queue] ready jobs of each queue without exceeding any limit in force, nor this
    worker's per-kind caps (`kind_free`, leases.claim_with_next_due). Without a limit concerned, the walks
    start at `since`; under one, from the head."""
    wanted = {queue: n for queue, n in wanted.items() if n > 0}
    if not wanted:
        return Claim([], {})
    concerned = [r for r in await current(conn) if r.scope == "kind" or r.name in wanted]
    if not concerned:
        return await claim_with_next_due(conn, wanted, owner, ttl, jobs, since=since, kind_free=kind_free)
    # Pipelined: the lock and the counts go in one round trip, the pick in a second, the claim, the
    # start log and the commit in a third (each statement still runs after the one before it).
    async with conn.pipeline(), conn.transaction():
        return await _claim_limited(conn, wanted, owner, ttl, jobs or registry, concerned, dict(kind_free or {}))


async def _claim_limited(conn: psycopg.AsyncConnection, wanted: dict[str, int], owner: str, ttl: float,
                         jobs: Registry, concerned: list[LimitRow], kind_free: dict[str, int]) -> Claim:
    await conn.execute(LOCK_LIMITS, {"keys": sorted(r.lock_key for r in concerned)})
    await conn.execute(queries.INDEX_SCANS_ONLY)  # the claim's UPDATE by id, on a table of a few pages
    next_due = await conn.execute(NEXT_DUE, {"queues": list(wanted)})
    # Use per (scope, name, key): active jobs and starts in the window; a key not listed has none.
    counting = [r for r in concerned if r.concurrency_limit is not None]
    rated = [r for r in concerned if r.rate_count is not None]
    active_rows = rate_rows = None
    if counting:
        params = {"scopes": [r.scope for r in counting], "names": [r.name for r in counting],
                  "keys": [r.key for r in counting]}
        active_rows = await conn.execute(ACTIVE_USE, params)
    if rated:
        params = {"scopes": [r.scope for r in rated], "names": [r.name for r in rated],
                  "windows": [r.rate_window for r in rated]}
        rate_rows = await conn.execute(RATE_USE, params)
    active: dict[tuple[str, str, str], int] = {}
    started: dict[tuple[str, str, str], int] = {}
    frees_in: dict[tuple[str, str, str], float] = {}
    for scope, name, key, n in await active_rows.fetchall() if active_rows else ():
        active[(scope, name, key)] = n
    for scope, name, key, n, due in await rate_rows.fetchall() if rate_rows else ():
        started[(scope, name, key)] = n
        frees_in[(scope, name, key)] = max(due, 0.0)

    held: dict[str, float] = {}

    def hold(queue: str, wait: float) -> None:
        held[queue] = min(held.get(queue, wait), wait)

    def full_wait(r: LimitRow, key: str) -> float | None:
        """None if (r, key) admits another start now, else how long until it may."""
        waits = []
        if r.concurrency_limit is not None and active.get((r.scope, r.name, key), 0) >= r.concurrency_limit:
            waits.append(CONCURRENCY_RECHECK)
        if r.rate_count is not None and started.get((r.scope, r.name, key), 0) >= r.rate_count:
            waits.append(frees_in.get((r.scope, r.name, key), 0.0) + 0.005)
        return max(waits) if waits else None

    # What is at its limit already is left out of the walk. An unkeyed queue limit drops its queue.
    excluded: list[tuple[str, str, str | None, str | None]] = []
    for r in concerned:
        keys = {k[2] for k in (*active, *started) if k[:2] == (r.scope, r.name)} if r.key else {""}
        for key in keys:
            wait = full_wait(r, key)
            if wait is None:
                continue
            excluded.append((r.scope, r.name, r.key, key if r.key else None))
            for queue in wanted:
                if r.scope == "kind" or r.name == queue:
                    hold(queue, wait)
    walk = {q: n for q, n in wanted.items()
            if not any(s == "queue" and name == q and field is None for s, name, field, _ in excluded)}
    for r in concerned:
        # An unkeyed queue limit caps the walk itself: no point locking rows it cannot admit.
        if r.scope == "queue" and r.key is None and r.name in walk:
            if r.concurrency_limit is not None:
                walk[r.name] = min(walk[r.name], r.concurrency_limit - active.get((r.scope, r.name, ""), 0))
            if r.rate_count is not None:
                walk[r.name] = min(walk[r.name], r.rate_count - started.get((r.scope, r.name, ""), 0))
    walk = {q: n for q, n in walk.items() if n > 0}
    if not walk:
        return Claim([], await _due(next_due), held=held)
    params = {"queues": list(walk), "limits": list(walk.values()),
              "full_kinds": [kind for kind, free in kind_free.items() if free <= 0],
              "full_scopes": [e[0] for e in excluded], "full_names": [e[1] for e in excluded],
              "full_fields": [e[2] for e in excluded], "full_values": [e[3] for e in excluded]}
    candidates = await (await conn.execute(PICK_LIMITED, params, prepare=False)).fetchall()

    chosen: list[int] = []
    starts: Counter[tuple[str, str, str]] = Counter()
    for job_id, kind, queue, meta in candidates:
        applying = [(r, r.key_of(meta)) for r in concerned if r.applies(queue, kind)]
        if any(full_wait(r, key) is not None for r, key in applying):
            hold(queue, 0.0)  # its limit filled within this batch: other ready rows may be admitted
            continue
        if kind_free.get(kind, 1) <= 0:
            continue  # this worker's cap on the kind (worker/capacity.py) filled within this batch
        if kind in kind_free:
            kind_free[kind] -= 1
        chosen.append(job_id)
        for r, key in applying:
            if r.concurrency_limit is not None:
                active[(r.scope, r.name, key)] = active.get((r.scope, r.name, key), 0) + 1
            if r.rate_count is not None:
                started[(r.scope, r.name, key)] = started.get((r.scope, r.name, key), 0) + 1
                starts[(r.scope, r.name, key)] += 1
    if not chosen:
        return Claim([], await _due(next_due), held=held)
    kind_attempts, default = jobs.max_attempts_at_claim()
    params = {"ids": chosen, "owner": owner, "ttl": ttl, "kind_attempts": kind_attempts, "max_attempts": default}
    claiming = await conn.execute(CLAIM_PICKED, params, prepare=False)
    if starts:
        params = {"scopes": [k[0] for k in starts], "names": [k[1] for k in starts],
                  "keys": [k[2] for k in starts], "counts": list(starts.values())}
        await conn.execute(LOG_STARTS, params)
    return Claim([ClaimedJob(*row) for row in await claiming.fetchall()], await _due(next_due), held=held)


async def _due(cursor: psycopg.AsyncCursor) -> dict[str, float]:
    return {queue: due_in for queue, due_in in await cursor.fetchall()}


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
    params = {"scopes": [lim.scope for lim in limits], "names": [lim.name for lim in limits],
              "keys": [lim.key for lim in limits], "concurrency": [lim.concurrency_limit for lim in limits],
              "rates": [lim.rate_limit for lim in limits], "counts": [r[0] if r else None for r in rates],
              "windows": [r[1] if r else None for r in rates]}
    await conn.execute(SYNC_LIMITS, params)
    forget_cache()


def check_kinds(limits: Sequence[Limit], jobs: Registry, source: str) -> None:
    """A kind limit must name a kind this process loaded (ConfigError naming the entry otherwise)."""
    known = set(jobs.kinds())
    for limit in limits:
        if limit.scope == "kind" and limit.name not in known:
            raise ConfigError(source, f"kinds ({limit.name})",
                              f"unknown kind {limit.name!r}; the loaded kinds are: {', '.join(sorted(known))}")


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
        return ((self.concurrency_limit is not None and self.in_use.get(key, 0) >= self.concurrency_limit)
                or (self.rate_count is not None and self.started.get(key, 0) >= self.rate_count))

    @property
    def waiting(self) -> int:
        """Ready jobs held back because their limit (for their key) is full: waiting on a limit, not stuck."""
        return sum(n for key, n in self.ready.items() if self.full(key))

    def as_dict(self) -> dict[str, Any]:
        return {"scope": self.scope, "name": self.name, "key": f"meta.{self.key}" if self.key else None,
                "concurrency_limit": self.concurrency_limit, "rate_limit": self.rate_limit,
                "in_use": sum(self.in_use.values()), "in_use_by_key": self.in_use if self.key else None,
                "started_in_window": sum(self.started.values()), "waiting": self.waiting}


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
    return LimitUse(scope, name, key, concurrency, format_rate(count, window),
                    {k: int(v) for k, v in active.items()}, {k: int(v) for k, v in started.items()},
                    {k: int(v) for k, v in ready.items()}, count)


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


def set_limit(conn: psycopg.Connection, scope: str, name: str, concurrency_limit: int | None,
              rate_limit: str | None, key: str | None, queues: Sequence[str]) -> None:
    """Put a limit in force now (None for both: no limit), and wake `queues`' workers to claim under it.
    Raises ValueError naming the field and the rule. Kept over restarts until config/queues.yml's
    value for it changes (sync)."""
    if scope not in ("queue", "kind"):
        raise ValueError(f"scope {scope!r} must be queue or kind")
    if concurrency_limit is not None:
        parse_concurrency_limit(concurrency_limit)
    count, window = parse_rate(rate_limit) if rate_limit is not None else (None, None)
    field_name = parse_limit_key(key) if key is not None else None
    params = {"scope": scope, "name": name, "key": field_name, "concurrency": concurrency_limit,
              "count": count, "window": window}
    with conn.transaction():
        conn.execute(SET_LIMIT, params)
        conn.execute(queries.NOTIFY_QUEUES, {"queues": list(queues)})
