"""Cron schedules: declarations, validation, the sync into `dygo_schedules`, firing, and admin.

Declare a schedule in code, `schedule("nightly-report", "30 2 * * *", "reports.build", {...})` or
`@job("reports.build", cron="30 2 * * *")`, or in `config/schedules.yml`. Every declaration is
validated when the jobs load (`load_jobs`), before any database work.

Exactly one job per occurrence, however many workers run: the firing worker locks the schedule row
(`FOR UPDATE SKIP LOCKED`), enqueues the job and advances `next_run_at`, all in one transaction, so a
worker that dies mid-fire leaves nothing behind and another fires the occurrence. The job also carries
a per-occurrence idempotency key with a time window, a second guard held by the database.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
from croniter import CroniterError
from dygo.store import cron, tracing
from dygo.store.config import Settings, _read_yaml
from dygo.store.db import one
from dygo.store.enqueue import PRIORITY_RANGE, Enqueued, aenqueue, enqueue
from dygo.store.errors import ConfigError, Conflict, EnqueueError, NotFound
from dygo.store.registry import KIND_PATTERN, Registry
from dygo.store.sql import schedules as sql
from psycopg.rows import dict_row

MISSED_POLICIES = ("once", "skip")
# Under `missed: skip`, an occurrence this late counts as missed rather than merely late: a worker
# restart or a busy minute still fires it, an outage of whole occurrences does not.
MISSED_GRACE = timedelta(minutes=1)
# How long an occurrence's key keeps a second job for it out. Firing is fenced by the row lock;
# the key guards against an occurrence being replayed (next_run_at moved back by hand).
OCCURRENCE_KEY_TTL = timedelta(days=1)
MAX_NAME_LENGTH = 100
FILE_NAME = "schedules.yml"
CHANNEL = "dygo_schedules"  # NOTIFY channel: a schedule may fall due sooner than planned
FILE_KEYS = ("name", "cron", "kind", "args", "timezone", "queue", "priority", "max_attempts", "missed")


@dataclass(frozen=True)
class Schedule:
    """A periodic job: enqueue `kind` with `args` at every occurrence of `cron` in `timezone`."""

    name: str
    cron: str
    kind: str
    args: Any = None
    queue: str | None = None  # None: the kind's queue
    priority: int | None = None  # None: the kind's
    max_attempts: int | None = None  # None: the kind's
    timezone: str = "UTC"
    missed: str = "once"  # after downtime: 'once' fires one catch-up job, 'skip' none
    # Where it was declared, for error messages: a module or file, and the entry in it.
    source: str = field(default="?", compare=False)
    entry: str = field(default="", compare=False)


# Schedules declared with `schedule(...)`; `load_schedules` adds the `@job(cron=...)` ones and the file's.
DECLARED: dict[str, Schedule] = {}


def schedule(
    name: str,
    cron: str,
    kind: str,
    args: Any = None,
    *,
    queue: str | None = None,
    priority: int | None = None,
    max_attempts: int | None = None,
    timezone: str = "UTC",
    missed: str = "once",
    declared: dict[str, Schedule] = DECLARED,
) -> Schedule:
    """Declare a schedule in code (at import time of a job module). Validated when the jobs load."""
    source = sys._getframe(1).f_globals.get("__name__", "?")
    declaration = Schedule(
        name,
        cron,
        kind,
        args,
        queue,
        priority,
        max_attempts,
        timezone,
        missed,
        source=source,
        entry=f"schedule {name!r}",
    )
    if name in declared:
        raise ConfigError(source, declaration.entry, f"name is already declared by {declared[name].source}")
    declared[name] = declaration
    return declaration


# --- loading and validation -------------------------------------------------------------------------


def load_schedules(settings: Settings, jobs: Registry, declared: dict[str, Schedule] = DECLARED) -> dict[str, Schedule]:
    """Every declared schedule, validated and resolved (queue and args filled in), by name."""
    found = [*_job_schedules(jobs), *declared.values(), *read_schedules_file(settings.config_dir / FILE_NAME)]
    schedules: dict[str, Schedule] = {}
    for declaration in found:
        if declaration.name in schedules:
            other = schedules[declaration.name]
            raise ConfigError(
                declaration.source,
                declaration.entry,
                f"name: {declaration.name!r} is already declared by {other.source} ({other.entry})",
            )
        schedules[declaration.name] = validate(declaration, settings, jobs)
    return schedules


def _job_schedules(jobs: Registry) -> list[Schedule]:
    return [
        Schedule(d.kind, d.cron, d.kind, timezone=d.cron_timezone, source=d.handler.__module__, entry=f"job {d.kind!r}")
        for d in jobs
        if d.cron is not None
    ]


def read_schedules_file(path: Path) -> list[Schedule]:
    """The declarations in `config/schedules.yml` (optional), checked for shape; values by `validate`."""
    source = str(path)
    if not path.exists():
        return []
    document = _read_yaml(path)
    if document is None:
        return []
    if not isinstance(document, dict) or set(document) != {"schedules"}:
        raise ConfigError(source, "top level", "must be a mapping with exactly one key, `schedules`")
    entries = document["schedules"] or []
    if not isinstance(entries, list):
        raise ConfigError(source, "schedules", "must be a list of {name, cron, kind, ...} entries")
    return [_file_entry(source, index, entry) for index, entry in enumerate(entries)]


def _file_entry(source: str, index: int, entry: Any) -> Schedule:
    label = f"schedules[{index}]"
    if not isinstance(entry, dict):
        raise ConfigError(source, label, "must be a mapping with at least `name`, `cron` and `kind`")
    if isinstance(entry.get("name"), str):
        label = f"schedules[{index}] ({entry['name']})"
    unknown = sorted(set(entry) - set(FILE_KEYS), key=str)
    if unknown:
        raise ConfigError(source, label, f"unknown key {unknown[0]!r}; allowed keys: {', '.join(FILE_KEYS)}")
    for required in ("name", "cron", "kind"):
        if required not in entry:
            raise ConfigError(source, label, f"{required}: is required")
    return Schedule(**entry, source=source, entry=label)


def validate(declaration: Schedule, settings: Settings, jobs: Registry) -> Schedule:
    """`declaration` with its queue and args resolved, or ConfigError naming it and the bad field."""

    def fail(rule: str) -> ConfigError:
        return ConfigError(declaration.source, declaration.entry, rule)

    name = declaration.name
    if not isinstance(name, str) or not KIND_PATTERN.match(name) or len(name) > MAX_NAME_LENGTH:
        raise fail(
            f"name: {name!r} must be a name like 'nightly-report' or 'reports.daily' "
            f"(letters, digits, _ . -; at most {MAX_NAME_LENGTH} characters)"
        )
    try:
        cron.validate(declaration.cron)
    except ValueError as exc:
        raise fail(f"cron: {exc}") from None
    try:
        cron.zone(declaration.timezone)
    except ValueError as exc:
        raise fail(f"timezone: {exc}") from None
    if declaration.missed not in MISSED_POLICIES:
        raise fail(f"missed: must be 'once' or 'skip', got {declaration.missed!r}")
    definition = jobs.get(declaration.kind) if isinstance(declaration.kind, str) else None
    if definition is None:
        raise fail(f"kind: {declaration.kind!r} is not registered; known kinds: {', '.join(jobs.kinds()) or 'none'}")
    queue = declaration.queue if declaration.queue is not None else definition.queue_name
    if queue not in settings.queues:
        raise fail(f"queue: {queue!r} is not configured in queues.yml; queues: {', '.join(settings.queue_names)}")
    _check_int(fail, "priority", declaration.priority, *PRIORITY_RANGE)
    _check_int(fail, "max_attempts", declaration.max_attempts, 1, 1000)
    try:
        args = definition.validate_args(declaration.args)
    except EnqueueError as exc:
        raise fail(f"args: {exc}{_details(exc.details)}") from None
    return replace(declaration, queue=queue, args=args)


def _check_int(fail: Any, name: str, value: Any, low: int, high: int) -> None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high):
        raise fail(f"{name}: must be an integer from {low} to {high}, got {value!r}")


def _details(details: Any) -> str:
    if not isinstance(details, list):
        return ""
    return "; " + "; ".join(f"{'.'.join(map(str, d.get('loc', ())))}: {d.get('msg')}" for d in details)


# --- the worker's side: sync and fire (async) -------------------------------------------------------


@dataclass(frozen=True)
class SyncResult:
    added: list[str]
    updated: list[str]
    disabled: list[str]

    def __bool__(self) -> bool:
        return bool(self.added or self.updated or self.disabled)

    def __str__(self) -> str:
        parts = [
            f"{word} {', '.join(names)}"
            for word, names in (("added", self.added), ("updated", self.updated), ("disabled", self.disabled))
            if names
        ]
        return "; ".join(parts) or "unchanged"


async def sync(
    conn: psycopg.AsyncConnection, declared: Iterable[Schedule], *, now: datetime | None = None
) -> SyncResult:
    """Make the table match the declarations: add new ones, update changed ones, disable removed ones."""
    declared = list(declared)
    added: list[str] = []
    updated: list[str] = []
    async with conn.transaction():
        await conn.execute(sql.SCHEDULES_SYNC_LOCK)
        now = now or one(await (await conn.execute(sql.DATABASE_NOW)).fetchone())[0]
        stored = {row[0]: row[1:] for row in await (await conn.execute(sql.STORED_SCHEDULES)).fetchall()}
        for declaration in declared:
            params = _row(declaration, now)
            current = stored.get(declaration.name)
            if current is None:
                await conn.execute(sql.INSERT_SCHEDULE, params)
                added.append(declaration.name)
            elif current != _comparable(declaration):
                await conn.execute(sql.UPDATE_SCHEDULE_DEFINITION, params)
                updated.append(declaration.name)
        cursor = await conn.execute(sql.DISABLE_UNDECLARED_SCHEDULES, ([d.name for d in declared],))
        disabled = sorted(row[0] for row in await cursor.fetchall())
    return SyncResult(added, updated, disabled)


def _row(declaration: Schedule, now: datetime) -> dict[str, Any]:
    return {
        "name": declaration.name,
        "spec": declaration.cron,
        "timezone": declaration.timezone,
        "kind": declaration.kind,
        "args": json.dumps(declaration.args),
        "queue": declaration.queue,
        "priority": declaration.priority,
        "max_attempts": declaration.max_attempts,
        "missed": declaration.missed,
        "next_run_at": cron.next_fire(declaration.cron, declaration.timezone, now),
    }


def _comparable(declaration: Schedule) -> tuple[Any, ...]:
    """The stored columns a declaration sets, as STORED_SCHEDULES returns them (`scheduled` last)."""
    return (
        declaration.cron,
        declaration.timezone,
        declaration.kind,
        declaration.args,
        declaration.queue,
        declaration.priority,
        declaration.max_attempts,
        declaration.missed,
        True,
    )


@dataclass(frozen=True)
class Fired:
    """What firing one due occurrence did."""

    name: str
    occurrence: datetime
    job_id: int | None  # None: skipped as missed, or the job could not be enqueued
    deduplicated: bool = False  # the occurrence's key already named a job
    next_run_at: datetime | None = None
    skipped: bool = False  # missed by more than MISSED_GRACE under `missed: skip`
    error: str | None = None  # why no job could be enqueued


@dataclass(frozen=True)
class _Due:
    name: str
    spec: str
    timezone: str
    kind: str
    args: dict[str, Any]
    queue: str
    priority: int | None
    max_attempts: int | None
    missed: str
    occurrence: datetime
    now: datetime


async def fire_due(conn: psycopg.AsyncConnection, *, now: datetime | None = None, limit: int = 1000) -> list[Fired]:
    """Fire every schedule due at `now` (default: the database clock), one transaction each.

    A schedule that missed several occurrences fires once and moves to its next occurrence after
    now: no backfill burst. Rows another worker is firing are skipped, not waited for.
    """
    fired: list[Fired] = []
    for _ in range(limit):
        async with conn.transaction():
            row = await (await conn.execute(sql.LOCK_DUE_SCHEDULE, {"now": now})).fetchone()
            if row is None:
                break
            fired.append(await _fire(conn, _Due(*row)))
    return fired


async def _fire(conn: psycopg.AsyncConnection, due: _Due) -> Fired:
    # Traced, the fire is a span and the job's meta carries its trace (through the enqueue span inside
    # it); untraced, this costs nothing and the meta is unchanged.
    with tracing.schedule_fire_span(due.name, due.occurrence, due.kind) as span:
        fired = await _fire_occurrence(conn, due)
        if span is not None:
            outcome = (
                "error"
                if fired.error
                else "skipped"
                if fired.skipped
                else "deduplicated"
                if fired.deduplicated
                else "fired"
            )
            tracing.record_fire(span, outcome, fired.job_id, fired.error)
        return fired


async def _fire_occurrence(conn: psycopg.AsyncConnection, due: _Due) -> Fired:
    occurrence, now = due.occurrence.astimezone(UTC), due.now.astimezone(UTC)
    try:
        next_run_at: datetime | None = cron.next_fire(due.spec, due.timezone, max(now, occurrence))
    except (ValueError, CroniterError) as exc:
        # Validated at load, so only a row written by other code gets here: stop it rather than spin.
        return await _advance(conn, Fired(due.name, occurrence, None, error=f"cannot compute next fire: {exc}"), now)
    if due.missed == "skip" and now - occurrence > MISSED_GRACE:
        return await _advance(conn, Fired(due.name, occurrence, None, next_run_at=next_run_at, skipped=True), now)
    try:
        job = await aenqueue(
            conn, due.kind, due.args, **_job_options(due.name, due.queue, due.priority, due.max_attempts, occurrence)
        )
    except EnqueueError as exc:
        return await _advance(
            conn, Fired(due.name, occurrence, None, next_run_at=next_run_at, error=f"cannot enqueue: {exc}"), now
        )
    return await _advance(conn, Fired(due.name, occurrence, job.id, job.deduplicated, next_run_at), now)


async def _advance(conn: psycopg.AsyncConnection, fired: Fired, now: datetime) -> Fired:
    await conn.execute(
        sql.ADVANCE_SCHEDULE,
        {"name": fired.name, "next_run_at": fired.next_run_at, "job_id": fired.job_id, "fired_at": now},
    )
    return fired


def occurrence_key(name: str, occurrence: datetime) -> str:
    """The idempotency key of one occurrence, the same whatever time zone the session reads times in."""
    return f"schedule:{name}:{occurrence.astimezone(UTC).isoformat()}"


def _job_options(
    name: str, queue: str, priority: int | None, max_attempts: int | None, occurrence: datetime | None
) -> dict[str, Any]:
    options: dict[str, Any] = {"queue": queue, "priority": priority, "max_attempts": max_attempts}
    if occurrence is None:
        options["meta"] = {"schedule": name, "trigger": "manual"}
        return options
    options["meta"] = {"schedule": name, "occurrence": occurrence.astimezone(UTC).isoformat()}
    options["idempotency_key"] = occurrence_key(name, occurrence)
    options["idempotency_ttl"] = OCCURRENCE_KEY_TTL
    return options


async def seconds_to_next_fire(conn: psycopg.AsyncConnection) -> float | None:
    """How long until the next schedule falls due; None when none will."""
    row = await (await conn.execute(sql.SECONDS_TO_NEXT_FIRE)).fetchone()
    return row[0] if row else None


async def listen(conn: psycopg.AsyncConnection) -> None:
    """Subscribe `conn` to the names of schedules that may fall due sooner than planned."""
    await conn.execute(sql.LISTEN_FOR_SCHEDULES)


# --- the admin side (sync): inspect, pause, resume, trigger -----------------------------------------


def list_schedules(conn: psycopg.Connection) -> list[dict[str, Any]]:
    with conn.cursor(row_factory=dict_row) as cursor:
        return [view(row) for row in cursor.execute(sql.LIST_SCHEDULES)]


def get_schedule(conn: psycopg.Connection, name: str) -> dict[str, Any] | None:
    """The schedule's view, or None (the admin operations raise NotFound instead)."""
    with conn.cursor(row_factory=dict_row) as cursor:
        row = cursor.execute(sql.GET_SCHEDULE, (name,)).fetchone()
    return view(row) if row else None


def view(row: dict[str, Any]) -> dict[str, Any]:
    """A schedule as the API and CLI show it: the spec in words, its status, next and last fire, last job."""
    status = "removed" if not row["enabled"] else "paused" if row["paused"] else "active"
    last_job = {"id": row["last_job_id"], "state": row["last_job_state"]} if row["last_job_id"] else None
    return {
        "name": row["name"],
        "spec": row["spec"],
        "description": cron.describe(row["spec"]),
        "timezone": row["timezone"],
        "kind": row["kind"],
        "args": row["args"],
        "queue": row["queue"],
        "priority": row["priority"],
        "max_attempts": row["max_attempts"],
        "missed": row["missed"],
        "status": status,
        "enabled": row["enabled"],
        "paused": row["paused"],
        # Only an active schedule has a next fire; a paused one restarts from now when resumed.
        "next_run_at": row["next_run_at"] if status == "active" else None,
        "last_run_at": row["last_run_at"],
        "last_job": last_job,
    }


def pause(conn: psycopg.Connection, name: str) -> dict[str, Any]:
    """Hold the schedule: no occurrence fires until it is resumed. Survives deploys and syncs."""
    conn.execute(sql.PAUSE_SCHEDULE, (name,))
    return existing(conn, name)


def resume(conn: psycopg.Connection, name: str) -> dict[str, Any]:
    """Fire again from the next occurrence after now; occurrences while paused are not made up."""
    with conn.transaction():
        row = conn.execute(sql.LOCK_SCHEDULE, (name,)).fetchone()
        if row is not None and row[9]:  # paused
            next_run_at = cron.next_fire(row[1], row[2], row[10])
            conn.execute(sql.RESUME_SCHEDULE, {"name": name, "next_run_at": next_run_at})
    return existing(conn, name)


def trigger(conn: psycopg.Connection, name: str) -> tuple[Enqueued, dict[str, Any]]:
    """Enqueue the schedule's job now, outside its spec; its occurrences are not affected.

    Works on a paused schedule too (an operator asked for it); not on a removed one."""
    with conn.transaction():
        row = conn.execute(sql.LOCK_SCHEDULE, (name,)).fetchone()
        if row is None:
            raise NotFound("schedule_not_found", f"no schedule named {name!r}")
        _, _, _, kind, args, queue, priority, max_attempts, enabled, _, _ = row
        if not enabled:
            raise Conflict("schedule_removed", f"schedule {name!r} is no longer declared; it cannot fire")
        job = enqueue(conn, kind, args, **_job_options(name, queue, priority, max_attempts, None))
        conn.execute(sql.RECORD_MANUAL_FIRE, {"name": name, "job_id": job.id})
    return job, existing(conn, name)


def existing(conn: psycopg.Connection, name: str) -> dict[str, Any]:
    """The schedule's view, or NotFound."""
    found = get_schedule(conn, name)
    if found is None:
        raise NotFound("schedule_not_found", f"no schedule named {name!r}")
    return found
