"""Durable steps: a handler's `ctx.step` and `ctx.step_tx` calls, each run once per job across its attempts.

A step is known by its name and occurrence in a run: the first `ctx.step("charge", ...)` of a run is
`charge#1`, the second `charge#2`. The key is taken when the call is made, in call order, so steps started
together (`asyncio.gather`) get the same keys on every run whatever order they finish in.

When a step's function returns, its JSON result is written (one short transaction on the worker's shared
connection), fenced by the run's lease token: a run that lost its lease records nothing and gets LeaseLost.
A later run of the job reads every recorded step once, at its first step call (a job that calls no step
reads and writes nothing more; in a worker, the runs whose first steps come together are read in one query,
StepReader), and returns a recorded step's result without running it again.

`ctx.sleep` records a sleep the same way (fenced, with its wake time by the database's clock) and ends the run
with Sleeping, a Snooze: the job is settled pending until the wake time without spending an attempt, and holds
no slot and no connection meanwhile. The run after it replays the recorded steps; the sleep returns at once if
its wake time has passed, and sleeps again for what is left if the job was run early (an operator's run-now):
a sleep is never cut short.

`ctx.step` is at least once: a worker killed after the function's effect and before its write runs it
again. `ctx.step_tx` hands the function the connection of the transaction that writes the step and checks
the lease, so a database effect made through it commits exactly once, with the step.

Each run also checks its calls against the order they were recorded in (`seq`): a step called at another
position than it was recorded at, or a new step where the recorded run called another, is logged as a
warning naming the step, or raises StepOrderError with `strict_steps`.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import logging
import threading
import time
from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager, AbstractContextManager
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import psycopg
from dygo.store import admin
from dygo.store.db import one
from dygo.store.durations import parse_duration
from dygo.store.errors import Conflict, LeaseLost, NotFound, Sleeping, StepError, StepOrderError
from dygo.store.sql import admin_jobs
from dygo.store.sql import steps as sql
from psycopg.rows import dict_row

log = logging.getLogger("dygo.worker")

MAX_NAME = 200  # characters of a step's name

Connect = Callable[[], AbstractAsyncContextManager[psycopg.AsyncConnection[Any]]]
SyncConnect = Callable[[], AbstractContextManager[psycopg.Connection[Any]]]


@dataclass(frozen=True, slots=True)
class StoredStep:
    seq: int  # its call's position in the run that recorded it
    result: str | None  # JSON text
    left: float | None = None  # a sleep's seconds left when read (0 once its wake time passed); None: no sleep
    state: str | None = None  # a wait's: 'waiting', 'done', 'failed' or 'timed_out'; None for a step or sleep


@dataclass(frozen=True, slots=True)
class StepLease:
    """Who may record a step: the job and the run's lease token and attempt."""

    job_id: int
    lease_token: str
    attempt: int


@dataclass(frozen=True, slots=True)
class StepWrite:
    key: str
    op: str  # 'step' or 'step_tx'
    seq: int
    duration: float  # seconds
    result: str | None  # JSON text


# --- statements -------------------------------------------------------------------------------------


async def load_steps(conn: psycopg.AsyncConnection[Any], job_id: int) -> dict[str, StoredStep]:
    """Every step the job recorded, by key."""
    cursor = await conn.execute(sql.STEPS_OF_JOB, {"job_id": job_id})
    return {key: StoredStep(seq, result, left, state) for key, seq, result, left, state in await cursor.fetchall()}


async def load_steps_of_jobs(
    conn: psycopg.AsyncConnection[Any], job_ids: list[int]
) -> dict[int, dict[str, StoredStep]]:
    """Every step each of the jobs recorded, by job and key (a job that recorded none is absent)."""
    cursor = await conn.execute(sql.STEPS_OF_JOBS, {"job_ids": job_ids})
    stored: dict[int, dict[str, StoredStep]] = {}
    for job_id, key, seq, result, left, state in await cursor.fetchall():
        stored.setdefault(job_id, {})[key] = StoredStep(seq, result, left, state)
    return stored


class StepReader:
    """Reads the recorded steps of runs for the worker: the runs whose first step comes while a read is on
    the way are read together by the next one, in one query. Jobs resuming together (a sleep's wake time
    shared by many) then cost one round trip on the shared connection per batch, not one each."""

    def __init__(self, connect: Connect) -> None:
        self.connect = connect
        self.waiting: dict[int, list[asyncio.Future[tuple[dict[str, StoredStep], float]]]] = {}
        self.task: asyncio.Task[None] | None = None

    async def load(self, job_id: int) -> tuple[dict[str, StoredStep], float]:
        """The job's recorded steps, and the time.monotonic() just after they were read."""
        future: asyncio.Future[tuple[dict[str, StoredStep], float]] = asyncio.get_running_loop().create_future()
        self.waiting.setdefault(job_id, []).append(future)
        if self.task is None or self.task.done():
            self.task = asyncio.create_task(self._read(), name="dygo-step-reader")
        return await future

    async def _read(self) -> None:
        while self.waiting:
            batch, self.waiting = self.waiting, {}
            try:
                async with self.connect() as conn:
                    stored = await load_steps_of_jobs(conn, list(batch))
                read_at = time.monotonic()
            except BaseException as exc:  # every run waiting gets the error (a cancel: CancelledError)
                for futures in batch.values():
                    for future in futures:
                        if not future.done():
                            future.set_exception(exc if isinstance(exc, Exception) else asyncio.CancelledError())
                if not isinstance(exc, Exception):
                    raise
                continue
            for job_id, futures in batch.items():
                for future in futures:
                    if not future.done():
                        future.set_result((stored.get(job_id, {}), read_at))


async def record_step(conn: psycopg.AsyncConnection[Any], lease: StepLease, write: StepWrite) -> str | None:
    """Record one step unless the run lost its lease (LeaseLost). The result stored for the key: `write`'s, or
    the one recorded before it (the first write of a key wins)."""
    cursor = await conn.execute(sql.RECORD_STEP, _params(lease, write))
    leased, recorded = one(await cursor.fetchone())
    if not leased:
        raise LeaseLost(lease.job_id, write.key)
    if recorded:
        return write.result
    return await _stored_result(conn, lease.job_id, write.key)


async def record_sleep(
    conn: psycopg.AsyncConnection[Any], lease: StepLease, key: str, seq: int, seconds: float
) -> float:
    """Record a sleep of `seconds` from now unless the run lost its lease (LeaseLost). The seconds left of the
    sleep recorded for the key (this one, or the one recorded before it). StepError if the key is a step's."""
    params = {**_lease(lease), "key": key, "seq": seq, "attempt": lease.attempt, "seconds": seconds}
    cursor = await conn.execute(sql.RECORD_SLEEP, params)
    leased, left = one(await cursor.fetchone())
    if not leased:
        raise LeaseLost(lease.job_id, key)
    if left is None:
        raise StepError(key, "recorded as a step, not a sleep: a sleep and a step cannot share a name")
    return float(left)


class _AlreadyRecorded(Exception):
    """Rolls back a step_tx whose key another write recorded first: its effect must not commit twice."""


async def record_step_tx(
    conn: psycopg.AsyncConnection[Any],
    lease: StepLease,
    key: str,
    seq: int,
    run: Callable[[psycopg.AsyncConnection[Any]], Awaitable[str | None]],
) -> str | None:
    """Lock the lease, `run(conn)` (the step's function; it returns the JSON to store), and record the step, all
    in one transaction: the function's SQL commits with the step or not at all. LeaseLost before `run` when
    the lease is lost."""
    try:
        async with conn.transaction():
            if await (await conn.execute(sql.LOCK_LEASE, _lease(lease))).fetchone() is None:
                raise LeaseLost(lease.job_id, key)
            started = time.monotonic()
            result = await run(conn)
            write = StepWrite(key, "step_tx", seq, time.monotonic() - started, result)
            cursor = await conn.execute(sql.RECORD_STEP, _params(lease, write))
            if not one(await cursor.fetchone())[1]:
                raise _AlreadyRecorded
            return result
    except _AlreadyRecorded:
        return await _stored_result(conn, lease.job_id, key)


def record_step_tx_sync(
    conn: psycopg.Connection[Any],
    lease: StepLease,
    key: str,
    seq: int,
    run: Callable[[psycopg.Connection[Any]], str | None],
) -> str | None:
    """`record_step_tx` on a sync connection, for sync handlers."""
    try:
        with conn.transaction():
            if conn.execute(sql.LOCK_LEASE, _lease(lease)).fetchone() is None:
                raise LeaseLost(lease.job_id, key)
            started = time.monotonic()
            result = run(conn)
            write = StepWrite(key, "step_tx", seq, time.monotonic() - started, result)
            if not one(conn.execute(sql.RECORD_STEP, _params(lease, write)).fetchone())[1]:
                raise _AlreadyRecorded
            return result
    except _AlreadyRecorded:
        stored: str | None = one(conn.execute(sql.STEP_RESULT, {"job_id": lease.job_id, "key": key}).fetchone())[0]
        return stored


async def _stored_result(conn: psycopg.AsyncConnection[Any], job_id: int, key: str) -> str | None:
    cursor = await conn.execute(sql.STEP_RESULT, {"job_id": job_id, "key": key})
    result: str | None = one(await cursor.fetchone())[0]
    return result


def _lease(lease: StepLease) -> dict[str, Any]:
    return {"job_id": lease.job_id, "lease_token": lease.lease_token}


def _params(lease: StepLease, write: StepWrite) -> dict[str, Any]:
    return {
        **_lease(lease),
        "key": write.key,
        "op": write.op,
        "seq": write.seq,
        "attempt": lease.attempt,
        "duration": write.duration,
        "result": write.result,
    }


# --- one run's steps -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class StepRules:
    max_result_bytes: int  # max_step_result_bytes
    strict: bool  # strict_steps: a replay out of order raises instead of warning


class Steps:
    """The steps of one run of a job: their keys, the recorded steps (read at the first call) and the order
    check. Built by the worker for every run; it costs nothing until a step is called. Its async methods run
    on the worker's event loop; the `_sync` ones in a sync handler's thread, which hands each database write
    to the loop (the shared connection) and runs the step's function itself."""

    def __init__(
        self,
        lease: StepLease,
        kind: str,
        rules: StepRules,
        connect: Connect,
        connect_sync: SyncConnect | None = None,
        reader: StepReader | None = None,
    ) -> None:
        self.lease = lease
        self.kind = kind
        self.rules = rules
        self.connect = connect
        self.connect_sync = connect_sync  # a sync connection for step_tx in sync handlers
        self.reader = reader  # the worker's batched read of recorded steps (None: read on `connect`)
        self.loop = asyncio.get_running_loop()
        self.stored: dict[str, StoredStep] | None = None
        self.recorded_at: dict[int, str] = {}  # seq -> key of the recorded steps
        self.loaded_at = 0.0  # time.monotonic() when the recorded steps were read (their sleeps' `left`)
        self.loading = asyncio.Lock()
        self.calls = 0
        self.occurrences: dict[str, int] = {}
        self.keys_lock = threading.Lock()  # a sync handler's thread takes keys too

    # -- async handlers

    async def step(self, name: str, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        key, seq = self._next(name)
        stored = await self._stored()
        if key in stored:
            return self._replayed(key, seq, stored)
        self._check_new(key, seq)
        started = time.monotonic()
        if inspect.iscoroutinefunction(fn):
            value = await fn(*args, **kwargs)
        else:  # a plain function may block: it runs in a thread, as a sync handler does
            value = await asyncio.to_thread(fn, *args, **kwargs)
            if inspect.isawaitable(value):
                value = await value
        return await self._record(StepWrite(key, "step", seq, time.monotonic() - started, self._encode(key, value)))

    async def step_tx(self, name: str, fn: Callable[[psycopg.AsyncConnection[Any]], Any]) -> Any:
        key, seq = self._next(name)
        stored = await self._stored()
        if key in stored:
            return self._replayed(key, seq, stored)
        self._check_new(key, seq)

        async def run(conn: psycopg.AsyncConnection[Any]) -> str | None:
            value = fn(conn)
            if inspect.isawaitable(value):
                value = await value
            return self._encode(key, value)

        async with self.connect() as conn:
            return _decode(await record_step_tx(conn, self.lease, key, seq, run))

    async def sleep(self, name: str, duration: Any) -> None:
        key, seq = self._next(name)
        seconds = _sleep_seconds(key, duration)
        stored = await self._stored()
        if key in stored:
            self._replayed(key, seq, stored)
            left, since = stored[key].left, self.loaded_at
            if left is None or stored[key].state is not None:
                raise StepError(key, "recorded as another kind of step, not a sleep: they cannot share a name")
        else:
            self._check_new(key, seq)
            async with self.connect() as conn:
                left = await record_sleep(conn, self.lease, key, seq, seconds)
            since = time.monotonic()
        if left > 0:
            raise Sleeping(key, left, since)

    # -- sync handlers (in their own thread)

    def step_sync(self, name: str, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        self._not_on_loop("step_sync", "await ctx.step(...)")
        key, seq = self._next(name)
        stored = self._on_loop(self._stored())
        if key in stored:
            return self._replayed(key, seq, stored)
        self._check_new(key, seq)
        started = time.monotonic()
        value = fn(*args, **kwargs)
        write = StepWrite(key, "step", seq, time.monotonic() - started, self._encode(key, value))
        return self._on_loop(self._record(write))

    def step_tx_sync(self, name: str, fn: Callable[[psycopg.Connection[Any]], Any]) -> Any:
        self._not_on_loop("step_tx_sync", "await ctx.step_tx(...)")
        if self.connect_sync is None:
            raise RuntimeError("ctx.step_tx_sync: this context has no sync connection")
        key, seq = self._next(name)
        stored = self._on_loop(self._stored())
        if key in stored:
            return self._replayed(key, seq, stored)
        self._check_new(key, seq)
        with self.connect_sync() as conn:
            return _decode(record_step_tx_sync(conn, self.lease, key, seq, lambda c: self._encode(key, fn(c))))

    def sleep_sync(self, name: str, duration: Any) -> None:
        self._not_on_loop("sleep_sync", "await ctx.sleep(...)")
        self._on_loop(self.sleep(name, duration))

    # -- the parts

    def _next(self, name: str) -> tuple[str, int]:
        """The call's key and position, taken when the call is made (before any await)."""
        if not isinstance(name, str) or not name or "#" in name or len(name) > MAX_NAME:
            raise StepError(
                repr(name), f"a step's name must be a non-empty string of at most {MAX_NAME} characters without '#'"
            )
        with self.keys_lock:
            self.calls += 1
            n = self.occurrences[name] = self.occurrences.get(name, 0) + 1
            return f"{name}#{n}", self.calls

    async def _stored(self) -> dict[str, StoredStep]:
        """The job's recorded steps, read once per run (concurrent first calls wait for the one read)."""
        if self.stored is None:
            async with self.loading:
                if self.stored is None:
                    if self.reader is not None:
                        stored, self.loaded_at = await self.reader.load(self.lease.job_id)
                    else:
                        async with self.connect() as conn:
                            stored = await load_steps(conn, self.lease.job_id)
                        self.loaded_at = time.monotonic()
                    self.recorded_at = {step.seq: key for key, step in stored.items()}
                    self.stored = stored
        return self.stored

    async def _record(self, write: StepWrite) -> Any:
        async with self.connect() as conn:
            return _decode(await record_step(conn, self.lease, write))

    def _replayed(self, key: str, seq: int, stored: dict[str, StoredStep]) -> Any:
        recorded = stored[key]
        if recorded.seq != seq:
            self._out_of_order(key, f"it is call {seq} of this run but was call {recorded.seq} when recorded")
        return _decode(recorded.result)

    def _check_new(self, key: str, seq: int) -> None:
        other = self.recorded_at.get(seq)
        if other is not None and other != key:
            self._out_of_order(key, f"it is call {seq} of this run, where the recorded run called {other!r}")

    def _out_of_order(self, key: str, why: str) -> None:
        rule = (
            f"steps replayed out of the recorded order ({why}); recorded steps are matched by name and "
            "occurrence, so a step whose occurrence changed gets another's result"
        )
        if self.rules.strict:
            raise StepOrderError(key, rule)
        log.warning(
            "job %s %s: step %r: %s",
            self.lease.job_id,
            self.kind,
            key,
            rule,
            extra={"fields": {"job_id": self.lease.job_id, "kind": self.kind, "step": key}},
        )

    def _encode(self, key: str, value: Any) -> str | None:
        if value is None:
            return None
        try:
            text = json.dumps(value, allow_nan=False)  # NaN is no JSON: jsonb refuses it
        except (TypeError, ValueError) as exc:
            raise StepError(key, f"result is not JSON-serialisable: {exc}") from None
        if "\\u0000" in text:
            raise StepError(key, "result contains a NUL character (\\u0000), which PostgreSQL jsonb cannot store")
        if len(text) > self.rules.max_result_bytes:  # json.dumps escapes non-ASCII: characters are bytes
            raise StepError(
                key,
                f"result of {len(text)} bytes of JSON is larger than max_step_result_bytes "
                f"({self.rules.max_result_bytes}); store it elsewhere and return a reference",
            )
        return text

    def _on_loop(self, coroutine: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result()

    def _not_on_loop(self, method: str, instead: str) -> None:
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            return
        if running is self.loop:
            raise RuntimeError(f"ctx.{method} is for sync handlers; an async handler calls {instead}")


def _sleep_seconds(key: str, duration: Any) -> float:
    """A sleep's length in seconds: a duration in dygo's grammar ("30s", "1d"), a number of seconds or a
    timedelta; StepError naming the step otherwise."""
    if isinstance(duration, timedelta):
        duration = duration.total_seconds()
    try:
        return parse_duration(duration, field="duration")
    except ValueError as exc:
        raise StepError(key, str(exc)) from None


def _decode(text: str | None) -> Any:
    """A step's result as every run sees it: the JSON stored, decoded (so a first run and a replay agree)."""
    return None if text is None else json.loads(text)


# --- an operator's view and actions (GET /api/v1/jobs/{id}/steps, "retry from this step") ---------------

# Whose steps an operator may forget: a job no run holds. A dead or cancelled one is retried as well.
FORGETTABLE = ("pending", "scheduled", "paused", "dead", "cancelled")
RETRIED = ("dead", "cancelled")


def job_steps(conn: psycopg.Connection[Any], job_id: int) -> list[dict[str, Any]]:
    """The job's recorded steps in call order; NotFound for an unknown job."""
    with conn.cursor(row_factory=dict_row) as cursor:
        rows = cursor.execute(sql.JOB_STEPS, {"job_id": job_id}).fetchall()
    if not rows and not one(conn.execute(sql.JOB_EXISTS, {"job_id": job_id}).fetchone())[0]:
        raise NotFound("job_not_found", f"no job with id {job_id}")
    return rows


@dataclass(frozen=True, slots=True)
class Forgotten:
    job: dict[str, Any]  # the job as it is now (JOB_COLUMNS)
    keys: list[str]  # the steps forgotten, in call order


def forget_steps(conn: psycopg.Connection[Any], job_id: int, key: str) -> Forgotten:
    """Retry from a step: forget the step `key` and every step recorded after it, so the job's next run runs
    them again, and retry the job if it is dead or cancelled. NotFound for an unknown job or step; Conflict
    naming the state for a job a run holds (active) or that is over (succeeded)."""
    with conn.transaction():
        conn.execute(admin_jobs.LOCK_JOB_WORKFLOW, {"id": job_id})
        row = conn.execute(sql.LOCK_JOB_STATE, {"job_id": job_id}).fetchone()
        if row is None:
            raise NotFound("job_not_found", f"no job with id {job_id}")
        state = row[0]
        if state not in FORGETTABLE:
            raise Conflict(
                "invalid_transition",
                f"job {job_id} is {state}; retry from a step applies to a job that is {' or '.join(FORGETTABLE)}",
                {"state": state, "action": "retry-from-step", "allowed_from": list(FORGETTABLE)},
            )
        forgotten = conn.execute(sql.FORGET_STEPS_FROM, {"job_id": job_id, "key": key}).fetchall()
        if not forgotten:
            raise NotFound("step_not_found", f"job {job_id} has no recorded step {key!r}")
        statement = admin_jobs.RETRY_JOB if state in RETRIED else sql.JOB_AFTER_FORGET
        try:
            with conn.cursor(row_factory=dict_row) as cursor:
                job = cursor.execute(statement, {"id": job_id}).fetchone()
        except psycopg.errors.UniqueViolation:
            raise admin.key_held(job_id, "retry-from-step") from None
    if job is None:  # a job of a workflow that may not be revived
        raise Conflict(
            "invalid_transition",
            f"job {job_id} cannot be retried: its workflow does not allow it",
            {"state": state, "action": "retry-from-step"},
        )
    return Forgotten(job, [k for k, _ in sorted(forgotten, key=lambda r: r[1])])
