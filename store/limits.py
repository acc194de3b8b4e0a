"""Cluster-wide flow control: `concurrency_limit` and `rate_limit` per queue and per kind, optionally
per key (`key: meta.tenant`): the limits in force (dygo_limits, read by every claim through `current`),
their sync from config/queues.yml, their use for the API, and the queues a settle frees.

The claim enforces them, in its own transaction (store/claim.py): a claim for queues that no limit
concerns takes no lock; under a limit it locks each limit concerned (LimitRow.lock_key) and counts its
use before it admits a job, and logs each start of a rate-limited job (dygo_limit_starts, trimmed here).
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import psycopg
from dygo.store import queries
from dygo.store.config import Limit, parse_concurrency_limit, parse_limit_key, parse_rate
from dygo.store.errors import ConfigError
from dygo.store.leases import ClaimedJob
from dygo.store.registry import Registry

# How long a process trusts the limits it read: a change made through the API reaches every claim
# within this (plus the claim that follows it).
CACHE_TTL = 0.25

LIMITS = """
SELECT scope, name, key, concurrency_limit, rate_count, rate_window FROM dygo_limits
WHERE concurrency_limit IS NOT NULL OR rate_count IS NOT NULL"""

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
        """The claim's advisory lock for this limit: a 64-bit hash of "dygo.limit:<scope>:<name>"."""
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
