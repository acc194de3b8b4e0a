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
from dygo.store.config import (
    LIMIT_KEYS,
    Limit,
    parse_concurrency_limit,
    parse_limit_key,
    parse_rate,
    parse_rate_burst,
)
from dygo.store.errors import ConfigError
from dygo.store.leases import ClaimedJob
from dygo.store.registry import Registry
from dygo.store.sql import limits as sql
from dygo.store.sql.leases import NOTIFY_QUEUES

# How long a process trusts the limits it read: a change made through the API reaches every claim
# within this (plus the claim that follows it).
CACHE_TTL = 0.25
# A rate limit of N per window spaces its starts (window + START_SLACK) / N apart: a handler that starts up to
# this much later than its start time (a busy event loop, a job claimed ahead waiting for a slot) still leaves
# at most N starts in any interval of the window's length.
START_SLACK = 0.03


@dataclass(frozen=True, slots=True)
class LimitRow:
    """A limit in force (dygo_limits)."""

    scope: str
    name: str
    key: str | None  # meta field name, or None: one limit for all jobs of the queue or kind
    concurrency_limit: int | None
    rate_count: int | None
    rate_window: float | None
    rate_burst: int | None = None  # starts that may come at once after an idle spell (None: 1)

    @property
    def spacing(self) -> float | None:
        """Seconds between two starts of the rate limit (None: not rated)."""
        if self.rate_count is None or self.rate_window is None:
            return None
        return (self.rate_window + START_SLACK) / self.rate_count

    @property
    def tolerance(self) -> float | None:
        """How far ahead of its spacing a start may come: (burst - 1) spacings (GCRA's tolerance)."""
        spacing = self.spacing
        return None if spacing is None else ((self.rate_burst or 1) - 1) * spacing

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
    await conn.execute(sql.TRIM_PACE)


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
        "bursts": [lim.rate_burst for lim in limits],
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
    rate_burst: int | None = None

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
            "rate_burst": self.rate_burst if self.rate_limit else None,
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
    scope, name, key, concurrency, count, window, burst, active, started, ready = row
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
        burst,
    )


def limits_in_use(conn: psycopg.Connection) -> list[LimitUse]:
    return [_use(row) for row in conn.execute(sql.USE_ALL).fetchall()]


async def alimits_in_use(conn: psycopg.AsyncConnection) -> list[LimitUse]:
    return [_use(row) for row in await (await conn.execute(sql.USE_ALL)).fetchall()]


class LimitChangeError(ValueError):
    """A limit change refused, naming the field (`field`) and the rule broken; nothing was changed."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


def change_limit(
    conn: psycopg.Connection, scope: str, name: str, changes: Mapping[str, Any], queues: Sequence[str]
) -> bool:
    """Change a queue's or a kind's limit now and wake `queues`' workers to claim under it; returns whether a
    limit remains. `changes` holds the fields to change (LIMIT_KEYS, with the file's rules: no strings for
    counts, no booleans, `meta.<field>` keys of bounded length); a field left out keeps its value, and a limit
    is removed only by an explicit None. A key, or a burst, with no limit to apply to is refused, as in
    config/queues.yml. Raises LimitChangeError naming the field; nothing is changed then. Kept over restarts
    until config/queues.yml's value for it changes (sync)."""
    if scope not in ("queue", "kind"):
        raise LimitChangeError("scope", f"scope {scope!r} must be queue or kind")
    unknown = sorted(set(changes) - set(LIMIT_KEYS))
    if unknown:
        raise LimitChangeError(unknown[0], f"unknown field {unknown[0]!r}; the fields are: {', '.join(LIMIT_KEYS)}")
    with conn.transaction():
        found = conn.execute(sql.LIMIT_FOR_CHANGE, {"scope": scope, "name": name}).fetchone()
        key, concurrency, count, window, burst = found or (None, None, None, None, None)
        if "concurrency_limit" in changes:
            concurrency = _checked("concurrency_limit", parse_concurrency_limit, changes["concurrency_limit"])
        if "rate_limit" in changes:
            count, window = _checked("rate_limit", parse_rate, changes["rate_limit"]) or (None, None)
            if "rate_burst" not in changes and burst is not None and (count is None or burst > count):
                burst = None  # the old rate's burst does not outlive it, nor exceed the new rate
        if "rate_burst" in changes:
            burst = _checked("rate_burst", lambda value: parse_rate_burst(value, count), changes["rate_burst"])
        if "key" in changes:
            key = _checked("key", parse_limit_key, changes["key"])
        stated = "concurrency_limit" in changes or "rate_limit" in changes
        if changes.get("key") is not None and (not stated or (concurrency is None and count is None)):
            # As in config/queues.yml: a key comes with the limit it applies to, in the same change.
            raise LimitChangeError("key", "key needs a concurrency_limit or a rate_limit in the same change")
        if concurrency is None and count is None:
            key = burst = None
        params = {
            "scope": scope,
            "name": name,
            "key": key,
            "concurrency": concurrency,
            "count": count,
            "window": window,
            "burst": burst,
        }
        conn.execute(sql.SET_LIMIT, params)
        conn.execute(NOTIFY_QUEUES, {"queues": list(queues)})
    return concurrency is not None or count is not None


def _checked(field: str, parse: Any, value: Any) -> Any:
    """`parse(value)`, None for None; a ValueError becomes a LimitChangeError naming `field`."""
    if value is None:
        return None
    try:
        return parse(value)
    except ValueError as exc:
        raise LimitChangeError(field, str(exc)) from None


def set_limit(
    conn: psycopg.Connection,
    scope: str,
    name: str,
    concurrency_limit: int | None,
    rate_limit: str | None,
    key: str | None,
    queues: Sequence[str],
) -> None:
    """Put a limit in force now, every field given (None for both limits: no limit): change_limit's rules."""
    changes = {"concurrency_limit": concurrency_limit, "rate_limit": rate_limit, "rate_burst": None}
    change_limit(conn, scope, name, {**changes, "key": key}, queues)
