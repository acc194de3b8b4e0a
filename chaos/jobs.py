"""Job kinds of the fault-injection suite. Every execution is recorded in `chaos_runs` first.

The row holds the execution's own lease token (`ctx.lease_token`), and a succeeding handler
returns that token as its result, so a succeeded row names the lease whose settle wrote it. The
books check compares it with the lease the row actually had at that settle (chaos/runner.py).
"""

from __future__ import annotations

import _thread
import asyncio
import os
import sys
import time
from datetime import UTC, datetime
from uuid import uuid4

import psycopg
from dygo.store import JobContext, job
from dygo.store.db import connect_kwargs
from pydantic import BaseModel

# An execution is recorded once however often its insert is tried: when the primary dies while its standby
# confirms a synchronous commit, the client sees an error for a row the standby has, and tries it again.
RECORD = """
INSERT INTO chaos_runs (job_id, attempt, pid, lease_token, execution, started)
VALUES (%(id)s, %(attempt)s, %(pid)s, %(token)s, %(execution)s, %(started)s) ON CONFLICT (execution) DO NOTHING"""

_conn: psycopg.AsyncConnection | None = None
RECORD_PATIENCE = 120.0  # the database may be restarting (scenario 2): keep trying this long


async def record(ctx: JobContext) -> str:
    """Insert this execution into chaos_runs on the process's own connection; returns the lease token."""
    await execute(RECORD, params(ctx))
    return str(ctx.lease_token)


async def execute(statement: str, values: dict[str, object]) -> None:
    """Run `statement` on the process's own connection, reconnecting while the database restarts."""
    global _conn
    deadline = time.monotonic() + RECORD_PATIENCE
    while True:
        try:
            if _conn is None or _conn.closed:
                _conn = await psycopg.AsyncConnection.connect(
                    os.environ["DATABASE_URL"], autocommit=True, **connect_kwargs()
                )
            await _conn.execute(statement, values)
            return
        except psycopg.OperationalError:
            if _conn is not None:
                await _conn.close()
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.2)


def record_sync(ctx: JobContext) -> str:
    with psycopg.connect(os.environ["DATABASE_URL"], autocommit=True, **connect_kwargs()) as conn:
        conn.execute(RECORD, params(ctx))
    return str(ctx.lease_token)


def params(ctx: JobContext) -> dict[str, object]:
    """One execution's row: `execution` names it, so that trying its insert again records nothing more, and
    `started` is when it began, whenever the insert gets through."""
    return {
        "id": ctx.id,
        "attempt": ctx.attempt,
        "pid": os.getpid(),
        "token": ctx.lease_token,
        "execution": uuid4(),
        "started": datetime.now(UTC),
    }


class Work(BaseModel):
    seconds: float = 0.0


@job("chaos.work", max_attempts=25, retry_backoff="100ms")
async def work(ctx: JobContext, args: Work) -> dict:
    token = await record(ctx)
    if args.seconds:
        await asyncio.sleep(args.seconds)
    return {"token": token}


@job("chaos.probe", queue="probe", max_attempts=25, retry_backoff="100ms")
async def probe(ctx: JobContext, args: dict) -> dict:
    return {"token": await record(ctx)}


# --- Scenario 6: a batch's callback. Its run is recorded under a unique index on its job id as well, so a
# second run fails there (and shows as an error on the job); it also records the counts it was given.

CALLBACK_RECORD = (
    "INSERT INTO chaos_callbacks (job_id, lease_token, members_succeeded) VALUES (%(id)s, %(token)s, %(succeeded)s)"
)


@job("chaos.callback", max_attempts=25, retry_backoff="100ms")
async def callback(ctx: JobContext, args: dict) -> dict:
    token = await record(ctx)
    members = ctx.deps.get("jobs")
    succeeded = members.counts["succeeded"] if members is not None else None
    await execute(CALLBACK_RECORD, {"id": ctx.id, "token": ctx.lease_token, "succeeded": succeeded})
    return {"token": token}


# --- Scenario 5: handlers that misbehave. Each runs once (max_attempts=1) and must end dead with a
# recorded error while the worker stays up.


@job("chaos.hang_async", timeout="300ms", max_attempts=1)
async def hang_async(ctx: JobContext, args: dict) -> None:
    await record(ctx)
    await asyncio.sleep(30)


@job("chaos.hang_sync", timeout="300ms", max_attempts=1)
def hang_sync(ctx: JobContext, args: dict) -> None:
    record_sync(ctx)
    time.sleep(2)


@job("chaos.raise", max_attempts=1)
def raises(ctx: JobContext, args: dict) -> None:
    record_sync(ctx)
    raise ValueError("handler raised on purpose")


@job("chaos.sys_exit", max_attempts=1)
def sys_exit(ctx: JobContext, args: dict) -> None:
    record_sync(ctx)
    sys.exit(4)


@job("chaos.keyboard_interrupt", max_attempts=1)
def keyboard_interrupt(ctx: JobContext, args: dict) -> None:
    record_sync(ctx)
    raise KeyboardInterrupt


@job("chaos.thread_exit", max_attempts=1)
def thread_exit(ctx: JobContext, args: dict) -> None:
    record_sync(ctx)
    _thread.exit()


@job("chaos.async_system_exit", max_attempts=1)
async def async_system_exit(ctx: JobContext, args: dict) -> None:
    await record(ctx)
    raise SystemExit(5)


@job("chaos.unserialisable", max_attempts=1)
async def unserialisable(ctx: JobContext, args: dict) -> object:
    await record(ctx)
    return {"value": object()}


@job("chaos.nan", max_attempts=1)
async def nan(ctx: JobContext, args: dict) -> dict:
    await record(ctx)
    return {"value": float("nan")}


@job("chaos.nul_result", max_attempts=1)
async def nul_result(ctx: JobContext, args: dict) -> str:
    await record(ctx)
    return "before\x00after"


@job("chaos.nul_error", max_attempts=1)
async def nul_error(ctx: JobContext, args: dict) -> None:
    await record(ctx)
    raise RuntimeError("an error message with a \x00 NUL in it")


# kind -> a fragment of the last_error the job must end with
MISBEHAVING = {
    "chaos.hang_async": "timed out after 300ms",
    "chaos.hang_sync": "timed out after 300ms",
    "chaos.raise": "ValueError: handler raised on purpose",
    "chaos.sys_exit": "SystemExit: 4",
    "chaos.keyboard_interrupt": "KeyboardInterrupt",
    "chaos.thread_exit": "SystemExit",
    "chaos.async_system_exit": "SystemExit: 5",
    "chaos.unserialisable": "result is not JSON-serialisable",
    "chaos.nan": "result is not JSON-serialisable",
    "chaos.nul_result": "NUL character",
    "chaos.nul_error": "RuntimeError: an error message with a \\x00 NUL",
}
