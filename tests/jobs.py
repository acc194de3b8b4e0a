"""Job kinds the tests run in real worker processes. Each run is recorded in `test_runs`."""

from __future__ import annotations

import asyncio
import os
import threading
import time

import psycopg
from dygo.store import Abort, JobContext, Reportable, RetryAfter, Snooze, job
from dygo.store.db import connect_kwargs
from psycopg_pool import ConnectionPool
from pydantic import BaseModel

_local = threading.local()


def record(ctx: JobContext, note: str = "") -> int:
    """Insert one row per execution and return how many runs this job has had so far."""
    conn = getattr(_local, "conn", None)
    if conn is None or conn.closed:
        # connect_kwargs(): DATABASE_URL may be PgBouncer in transaction mode (tests/test_pgbouncer.py).
        conn = _local.conn = psycopg.connect(os.environ["DATABASE_URL"], autocommit=True, **connect_kwargs())
    conn.execute(
        "INSERT INTO test_runs (job_id, attempt, pid, note) VALUES (%s, %s, %s, %s)",
        (ctx.id, ctx.attempt, os.getpid(), note),
    )
    return conn.execute("SELECT count(*) FROM test_runs WHERE job_id = %s", (ctx.id,)).fetchone()[0]


class Sleep(BaseModel):
    seconds: float = 0.0


@job("test.record")
async def record_async(ctx: JobContext, args: Sleep) -> dict:
    await asyncio.to_thread(record, ctx)
    if args.seconds:
        await asyncio.sleep(args.seconds)
    return {"attempt": ctx.attempt, "retry": ctx.is_retry}


@job("test.record_sync", queue="other")
def record_sync(ctx: JobContext, args: Sleep) -> dict:
    record(ctx)
    time.sleep(args.seconds)
    return {"thread": threading.current_thread().name}


@job("test.noop")
async def noop(ctx: JobContext, args: dict) -> None:
    return None


class Fail(BaseModel):
    times: int = 1


@job("test.fail", max_attempts=3, retry_backoff="50ms")
def fail(ctx: JobContext, args: Fail) -> str:
    record(ctx)
    if ctx.attempt <= args.times:
        raise ValueError(f"failure number {ctx.attempt}")
    return "recovered"


@job("test.abort")
async def abort(ctx: JobContext, args: dict) -> None:
    raise Abort("bad input, never retry")


@job("test.abort_with")
async def abort_with(ctx: JobContext, args: dict) -> None:
    raise Abort(str(args.get("message", "")))


@job("test.retry_after", max_attempts=2)
async def retry_after(ctx: JobContext, args: dict) -> None:
    raise RetryAfter("come back later", delay=30)


@job("test.reportable", max_attempts=1)
async def reportable(ctx: JobContext, args: dict) -> None:
    raise Reportable("the payment provider refused")


@job("test.snooze", max_attempts=1, retry_backoff="50ms")
def snooze(ctx: JobContext, args: dict) -> str:
    runs = record(ctx)
    if runs <= 2:
        raise Snooze(0.05)
    return f"ran after {runs - 1} snoozes"


@job("test.hang", timeout="200ms", max_attempts=1)
async def hang(ctx: JobContext, args: dict) -> None:
    await asyncio.sleep(60)


@job("test.hang_sync", timeout="200ms", max_attempts=1)
def hang_sync(ctx: JobContext, args: dict) -> None:
    time.sleep(5)


@job("test.unserialisable", max_attempts=1)
async def unserialisable(ctx: JobContext, args: dict) -> object:
    return object()


@job("test.exit", max_attempts=1)
def exits(ctx: JobContext, args: dict) -> None:
    raise SystemExit(3)


class Context(BaseModel):
    pass


@job("test.context", queue="other", priority=5)
async def context(ctx: JobContext, args: Context) -> dict:
    return {
        "id": ctx.id,
        "kind": ctx.kind,
        "queue": ctx.queue,
        "attempt": ctx.attempt,
        "max_attempts": ctx.max_attempts,
        "meta": dict(ctx.meta),
        "is_retry": ctx.is_retry,
        "has_deadline": ctx.deadline is not None,
        "enqueued_at": ctx.enqueued_at.isoformat(),
    }


@job("test.slow_first")
async def slow_first(ctx: JobContext, args: dict) -> str:
    """Hangs on its first run (so a test can kill or stop the worker), quick on any later run."""
    runs = await asyncio.to_thread(record, ctx)
    if runs == 1:
        await asyncio.sleep(60)
    return f"run {runs}"


_marker: psycopg.AsyncConnection | None = None


@job("test.mark")
async def mark(ctx: JobContext, args: dict) -> None:
    """Records the execution on one async connection per process: cheap enough for 20,000 jobs."""
    global _marker
    if _marker is None or _marker.closed:
        _marker = await psycopg.AsyncConnection.connect(os.environ["DATABASE_URL"], autocommit=True, **connect_kwargs())
    await _marker.execute(
        "INSERT INTO test_runs (job_id, attempt, pid) VALUES (%s, %s, %s)", (ctx.id, ctx.attempt, os.getpid())
    )


@job("test.span")
def span(ctx: JobContext, args: Sleep) -> None:
    """Records when its handler starts and ends, so a test can measure real concurrency."""
    record(ctx, "start")
    time.sleep(args.seconds)
    record(ctx, "end")


@job("test.fail_first_runs", max_attempts=1)
def fail_first_runs(ctx: JobContext, args: Fail) -> str:
    """Fails its first `times` runs counted across retries (so an operator's retry can succeed)."""
    runs = record(ctx)
    if runs <= args.times:
        raise ValueError(f"run {runs} of job {ctx.id} failed")
    return "recovered"


@job("test.sleep")
async def sleep(ctx: JobContext, args: Sleep) -> None:
    """Only sleeps: its duration is known, for the timing histograms."""
    await asyncio.sleep(args.seconds)


@job("test.slow_first_briefly")
async def slow_first_briefly(ctx: JobContext, args: Sleep) -> str:
    """Sleeps `seconds` on its first run only, so a test can have it recovered and run again meanwhile."""
    runs = await asyncio.to_thread(record, ctx)
    if runs == 1:
        await asyncio.sleep(args.seconds)
    return f"run {runs}"


class Progress(BaseModel):
    seconds: float = 1.0  # how long to keep reporting


@job("test.progress")
async def progress(ctx: JobContext, args: Progress) -> str:
    """Reports progress as fast as it can (the worker must throttle the writes), then finishes."""
    started = time.monotonic()
    reports = 0
    while (elapsed := time.monotonic() - started) < args.seconds:
        ctx.progress(min(elapsed / args.seconds, 1.0), f"report {reports}")
        reports += 1
        await asyncio.sleep(0)
    return f"{reports} reports"


@job("test.progress_sync")
def progress_sync(ctx: JobContext, args: Progress) -> str:
    """The same from a sync handler, which runs in a thread of its own."""
    started = time.monotonic()
    reports = 0
    while (elapsed := time.monotonic() - started) < args.seconds:
        ctx.progress(min(elapsed / args.seconds, 1.0), f"report {reports}")
        reports += 1
        time.sleep(0.0005)
    return f"{reports} reports"


class ProgressFinal(BaseModel):
    fail: bool = False


@job("test.progress_final", max_attempts=1)
async def progress_final(ctx: JobContext, args: ProgressFinal) -> str:
    """A report written at once, then the last one well within the second after it, then the end."""
    ctx.progress(0.2, "started")
    await asyncio.sleep(0.3)
    ctx.progress(1.0, "failing" if args.fail else "done")
    if args.fail:
        raise ValueError("failed after its last report")
    return "finished"


@job("test.progress_final_sync", max_attempts=1)
def progress_final_sync(ctx: JobContext, args: ProgressFinal) -> str:
    """The same from a sync handler, which reports from a thread of its own."""
    ctx.progress(0.2, "started")
    time.sleep(0.3)
    ctx.progress(1.0, "failing" if args.fail else "done")
    if args.fail:
        raise ValueError("failed after its last report")
    return "finished"


class Size(BaseModel):
    chars: int


@job("test.sized_result")
async def sized_result(ctx: JobContext, args: Size) -> str:
    return "x" * args.chars


class Breakage(BaseModel):
    module: str = "dygo.store.leases"
    function: str = "renew"


@job("test.break_service")
async def break_service(ctx: JobContext, args: Breakage) -> str:
    """Inject a defect into the worker running this job: the store function a service calls next raises
    an error that is not a database error (tests/test_worker_services.py)."""
    import importlib

    def broken(*_args: object, **_kwargs: object) -> None:
        raise RuntimeError(f"injected: {args.module}.{args.function} is broken")

    setattr(importlib.import_module(args.module), args.function, broken)
    return "broken"


if os.environ.get("DYGO_TEST_SPANS_FILE"):  # tests/test_tracing.py: this process writes its spans there
    from tests.span_file import install_file_exporter

    install_file_exporter(os.environ["DYGO_TEST_SPANS_FILE"])


@job("test.capped", concurrency=1)
async def capped(ctx: JobContext, args: Sleep) -> None:
    """Like test.span, async, capped at one at a time per worker (tests/test_flow_caps.py)."""
    await asyncio.to_thread(record, ctx, "start")
    await asyncio.sleep(args.seconds)
    await asyncio.to_thread(record, ctx, "end")


_marks_pool: ConnectionPool | None = None
_marks_lock = threading.Lock()


def _marks() -> ConnectionPool:
    """One pool per worker process for the marks: a sync handler runs in a thread of its own, so a
    connection per thread would be a new connection per job, its few milliseconds inside the span."""
    global _marks_pool
    with _marks_lock:
        if _marks_pool is None:
            _marks_pool = ConnectionPool(
                os.environ["DATABASE_URL"],
                min_size=1,
                max_size=4,
                open=True,
                kwargs={"autocommit": True, **connect_kwargs()},
            )
        return _marks_pool


def _mark(ctx: JobContext, note: str) -> None:
    at = time.time()
    with _marks().connection() as conn:
        conn.execute(
            "INSERT INTO test_runs (job_id, attempt, pid, note, at) VALUES (%s, %s, %s, %s, to_timestamp(%s))",
            (ctx.id, ctx.attempt, os.getpid(), note, at),
        )


@job("test.limited")
def limited(ctx: JobContext, args: Sleep) -> None:
    """Under a cluster-wide limit (tests/test_limits.py): a 'start' row when the handler starts and an
    'end' row as it returns, each timed from inside the handler."""
    _mark(ctx, "start")
    time.sleep(args.seconds)
    _mark(ctx, "end")


@job("test.limited_other")
def limited_other(ctx: JobContext, args: Sleep) -> None:
    _mark(ctx, "start")
    time.sleep(args.seconds)
    _mark(ctx, "end")


@job("test.workflow_step")
async def workflow_step(ctx: JobContext, args: dict) -> dict:
    """A workflow node's job: adds `add` jobs of its kind to its own open batch, and answers what its
    upstream nodes gave it (their state, result and counts)."""
    await asyncio.to_thread(record, ctx, ctx.workflow.name if ctx.workflow else "")
    if args.get("add"):
        ctx.add_to_batch("test.workflow_step", [{} for _ in range(args["add"])])
    return {
        "node": ctx.workflow.name if ctx.workflow else None,
        "deps": {
            name: {"state": dep.state, "result": dep.result, "counts": dict(dep.counts)}
            for name, dep in ctx.deps.items()
        },
    }


@job("test.until_trimmed", queue="other")
def until_trimmed(ctx: JobContext, args: dict) -> dict:
    """Runs until retention has deleted every job of the node before it (tests/test_workflow_concurrency.py),
    at most 30 s; returns what ctx.deps says of that node, which needs none of its rows."""
    record(ctx)
    [before] = ctx.deps.values()
    deadline = time.monotonic() + 30
    while _local.conn.execute("SELECT count(*) FROM dygo_jobs WHERE node_id = %s", (before.node_id,)).fetchone()[0]:
        if time.monotonic() > deadline:
            raise TimeoutError("retention left the jobs of the node before")
        time.sleep(0.1)
    return {"state": before.state, **before.counts}


# --- durable steps (tests/test_steps.py): each effect is a test_runs row whose note names it ----------------


def effect(ctx: JobContext, note: str) -> int:
    """A step's side effect: one test_runs row noted `note`; returns how many rows with that note the job has."""
    record(ctx, note)
    return _local.conn.execute(
        "SELECT count(*) FROM test_runs WHERE job_id = %s AND note = %s", (ctx.id, note)
    ).fetchone()[0]


@job("test.steps_three", max_attempts=3, retry_backoff="50ms")
async def steps_three(ctx: JobContext, args: dict) -> list:
    """Three steps; after the second is recorded, its first run hangs (so a test can kill its worker)."""
    one = await ctx.step("one", effect, ctx, "one")
    two = await ctx.step("two", effect, ctx, "two")
    if await asyncio.to_thread(effect, ctx, "pause") == 1:
        await asyncio.sleep(60)
    three = await ctx.step("three", effect, ctx, "three")
    return [one, two, three]


@job("test.step_hangs_before_record", max_attempts=3, retry_backoff="50ms")
async def step_hangs_before_record(ctx: JobContext, args: dict) -> int:
    """A step whose first run makes its effect, then hangs before the step can be recorded."""

    async def charge() -> int:
        runs = await asyncio.to_thread(effect, ctx, "charge")
        if runs == 1:
            await asyncio.sleep(60)
        return runs

    return await ctx.step("charge", charge)


@job("test.step_tx_hangs_before_commit", max_attempts=3, retry_backoff="50ms")
async def step_tx_hangs_before_commit(ctx: JobContext, args: dict) -> int:
    """A step_tx whose first run writes its effect in the step's transaction, then hangs before it commits.
    `tried` rows (outside the transaction) count the runs of the function."""

    async def reserve(conn: psycopg.AsyncConnection) -> int:
        await conn.execute(
            "INSERT INTO test_runs (job_id, attempt, pid, note) VALUES (%s, %s, %s, 'reserve')",
            (ctx.id, ctx.attempt, os.getpid()),
        )
        tried = await asyncio.to_thread(effect, ctx, "tried")
        if tried == 1:
            await asyncio.sleep(60)
        return tried

    return await ctx.step_tx("reserve", reserve)


@job("test.steps_gather", max_attempts=3, retry_backoff="50ms")
async def steps_gather(ctx: JobContext, args: dict) -> list:
    """Three steps at once, finishing in the reverse of their call order; the first attempt then fails."""

    async def slow(note: str, seconds: float) -> str:
        await asyncio.sleep(seconds)
        await asyncio.to_thread(effect, ctx, note)
        return note

    results = await asyncio.gather(
        ctx.step("x", slow, "x first", 0.4), ctx.step("y", slow, "y", 0.2), ctx.step("x", slow, "x second", 0.0)
    )
    if ctx.attempt == 1:
        raise RuntimeError("failing once after the steps")
    return results


@job("test.steps_reorder", max_attempts=2, retry_backoff="50ms")
async def steps_reorder(ctx: JobContext, args: dict) -> list:
    """Steps a then b on the first attempt (which then fails), b then a on the next."""
    names = ["a", "b"] if ctx.attempt == 1 else ["b", "a"]
    results = [await ctx.step(name, effect, ctx, name) for name in names]
    if ctx.attempt == 1:
        raise RuntimeError("failing once after the steps")
    return results


@job("test.step_too_big", max_attempts=1)
async def step_too_big(ctx: JobContext, args: dict) -> None:
    await ctx.step("small", effect, ctx, "small")
    await ctx.step("big", lambda: "x" * (args.get("bytes", 1024 * 1024)))


@job("test.steps_sync", max_attempts=3, retry_backoff="50ms")
def steps_sync(ctx: JobContext, args: dict) -> list:
    """A sync handler's steps: a plain one twice and a transactional one; the first attempt then fails."""

    def reserve(conn: psycopg.Connection) -> str:
        conn.execute(
            "INSERT INTO test_runs (job_id, attempt, pid, note) VALUES (%s, %s, %s, 'reserve')",
            (ctx.id, ctx.attempt, os.getpid()),
        )
        return "reserved"

    results = [ctx.step_sync("a", effect, ctx, "a#1"), ctx.step_sync("a", effect, ctx, "a#2")]
    results.append(ctx.step_tx_sync("reserve", reserve))
    if ctx.attempt == 1:
        raise RuntimeError("failing once after the steps")
    return results


@job("test.steps_then_fail", max_attempts=1)
async def steps_then_fail(ctx: JobContext, args: dict) -> int:
    """One step, then dead on every run until `test_runs` holds a 'fixed' row for the job."""
    charged = await ctx.step("charge", effect, ctx, "charge")
    if await asyncio.to_thread(effect, ctx, "check") == 1:
        raise RuntimeError("dies after its step")
    return charged


@job("test.steps_sleep", max_attempts=3)
async def steps_sleep(ctx: JobContext, args: dict) -> list:
    """A step, a sleep of `seconds` (2 by default), another step; returns their results and the attempt."""
    one = await ctx.step("one", effect, ctx, "one")
    await asyncio.to_thread(record, ctx, "run")
    await ctx.sleep("cool-off", args.get("seconds", 2))
    two = await ctx.step("two", effect, ctx, "two")
    return [one, two, ctx.attempt]


@job("test.steps_sleep_sync", max_attempts=3)
def steps_sleep_sync(ctx: JobContext, args: dict) -> list:
    """`steps_sleep` as a sync handler."""
    one = ctx.step_sync("one", effect, ctx, "one")
    ctx.sleep_sync("cool-off", "1s")
    two = ctx.step_sync("two", effect, ctx, "two")
    return [one, two, ctx.attempt]


@job("test.steps_abc", max_attempts=1)
async def steps_abc(ctx: JobContext, args: dict) -> list:
    """Steps a, b and c, then dead on its first run only (an operator retries it from a step)."""
    results = [await ctx.step(name, effect, ctx, name) for name in ("a", "b", "c")]
    if await asyncio.to_thread(effect, ctx, "check") == 1:
        raise RuntimeError("dies after its steps")
    return results


# --- events (tests/test_steps_events.py): ctx.wait_for_event, each effect a test_runs row naming it ----------


@job("test.wait_event", max_attempts=3, retry_backoff="50ms")
async def wait_event(ctx: JobContext, args: dict) -> dict:
    """A step, a wait for the event `key` (with `timeout`; `catch`: a timeout is caught), another step. `pause`:
    seconds the run number `pause_at` (default 1) sleeps before the wait; `fail_once`: the run after the event
    fails once, so its retry replays the wait."""
    from dygo.store.errors import EventTimeout

    await ctx.step("before", effect, ctx, "before")
    runs = await asyncio.to_thread(effect, ctx, "run")
    if args.get("pause") and runs == args.get("pause_at", 1):  # one run only: a test acts meanwhile
        await asyncio.sleep(args["pause"])
    try:
        payload = await ctx.wait_for_event("approval", key=args["key"], timeout=args.get("timeout"))
    except EventTimeout as exc:
        if not args.get("catch"):
            raise
        await asyncio.to_thread(record, ctx, "timed out")
        return {"timed_out": str(exc), "attempt": ctx.attempt}
    await ctx.step("after", effect, ctx, "after")
    if args.get("fail_once") and await asyncio.to_thread(effect, ctx, "fail") == 1:
        raise RuntimeError("failing once after the event")
    return {"payload": payload, "attempt": ctx.attempt}


@job("test.wait_event_sync", max_attempts=3)
def wait_event_sync(ctx: JobContext, args: dict) -> dict:
    """`wait_event` as a sync handler, without the options."""
    ctx.step_sync("before", effect, ctx, "before")
    payload = ctx.wait_for_event_sync("approval", key=args["key"])
    ctx.step_sync("after", effect, ctx, "after")
    return {"payload": payload, "attempt": ctx.attempt}


@job("test.callback_url", max_attempts=1)
async def callback_url(ctx: JobContext, args: dict) -> str:
    """The callback URL of the event `key`, as a worker makes it."""
    return ctx.callback_url(args["key"])
