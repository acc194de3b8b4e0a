"""Cluster-wide flow control: `concurrency_limit` and `rate_limit` per queue and per kind, optionally
per key (`key: meta.tenant`): the limits in force (dygo_limits, read by every claim through `current`),
their sync from config/queues.yml, their use for the API, and the queues a settle frees.

The claim enforces them, in its own transaction (store/claim.py): a claim for queues that no limit
concerns takes no lock; under a limit it locks each limit concerned (LimitRow.lock_key) and counts its
use before it admits a job, and logs each start of a rate-limited job (dygo_limit_starts, trimmed here).
The statements this module runs are in store/sql/limits.py.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import psycopg
from dygo.store.config import Limit, parse_concurrency_limit, parse_limit_key, parse_rate
from dygo.store.errors import ConfigError
from dygo.store.leases import ClaimedJob
from dygo.store.registry import Registry
from dygo.store.sql import limits as sql
from dygo.store.sql.leases import NOTIFY_QUEUES

# How long a process trusts the limits it read: a change made through the API reaches every claim
# within this (plus the claim that follows it).
CACHE_TTL = 0.25


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
    rows = [LimitRow(*row) for row in await (await conn.execute(sql.LIMITS)).fetchall()]
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
    await conn.execute(sql.TRIM_STARTS)


# --- config/queues.yml -> dygo_limits ------------------------------------------------------------


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
    await conn.execute(sql.SYNC_LIMITS, params)
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
    return [_use(row) for row in conn.execute(sql.USE_ALL).fetchall()]


async def alimits_in_use(conn: psycopg.AsyncConnection) -> list[LimitUse]:
    return [_use(row) for row in await (await conn.execute(sql.USE_ALL)).fetchall()]


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
        conn.execute(sql.SET_LIMIT, params)
        conn.execute(NOTIFY_QUEUES, {"queues": list(queues)})
