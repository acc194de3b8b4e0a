"""What `dygo serve` remembers about authentication, in the database so every process agrees.

Dashboard sessions that are signed in (signing out deletes one: a copied cookie dies with it), and
failed tokens per client address (a lock-out shared by the API and the dashboard's sign-in, across
processes and restarts). Statements in store/sql/auth.py.

Each recorded failure is also sent on the `dygo_auth_failures` channel with its address (at commit), so
a serve process that listens knows the addresses with failures on record without reading the table for
each request (app/throttle.py). An address longer than MAX_NOTIFIED_ADDRESS is not sent (a NOTIFY payload
is limited): a listener must read the table for such an address every time.

The dashboard's sign-in is a sync endpoint and the API's bearer check runs on the event loop, so the
throttle's operations come in twins, side by side: the blocking one, then the async one (`a` prefix).
Their statements, parameters and the reading of their rows are written once, in the helpers each
twin calls; a twin only runs them.
"""

from __future__ import annotations

from typing import Any

import psycopg
from dygo.store.sql import auth as sql

AUTH_FAILURE_CHANNEL = "dygo_auth_failures"
MAX_NOTIFIED_ADDRESS = 255  # characters; an address is an IP (or what a trusted proxy says it is)


def notified(address: str) -> bool:
    """Whether a recorded failure of `address` is sent on AUTH_FAILURE_CHANNEL."""
    return len(address) <= MAX_NOTIFIED_ADDRESS


# --- dashboard sessions ----------------------------------------------------------------------------


def start_session(conn: psycopg.Connection, sid: str, role: str, expires: float) -> None:
    """Record a signed-in session (expires: epoch seconds), forgetting the expired ones."""
    with conn.transaction():
        conn.execute(sql.TRIM_DASHBOARD_SESSIONS)
        conn.execute(sql.INSERT_DASHBOARD_SESSION, (sid, role, expires))


async def asession_role(conn: psycopg.AsyncConnection, sid: str) -> str | None:
    """The role of a signed-in, unexpired session; None once it was ended (or never started). Async only:
    the dashboard checks its session on the event loop."""
    row = await (await conn.execute(sql.DASHBOARD_SESSION_ROLE, (sid,))).fetchone()
    return row[0] if row else None


def end_session(conn: psycopg.Connection, sid: str) -> None:
    conn.execute(sql.END_DASHBOARD_SESSION, (sid,))


# --- failed tokens: shared by the twins below ---------------------------------------------------------


def _window(address: str, attempts: int, window: float) -> dict[str, Any]:
    return {"address": address, "attempts": attempts, "window": window}


def _after_failure(address: str) -> tuple[str, ...]:
    """What runs after a failure is recorded, in its transaction: forget the addresses gone quiet, and
    name this one on AUTH_FAILURE_CHANNEL when it fits a notification."""
    if notified(address):
        return (sql.TRIM_AUTH_FAILURES, sql.NOTIFY_AUTH_FAILURE)
    return (sql.TRIM_AUTH_FAILURES,)


def _until(recorded: tuple[Any, ...] | None) -> float | None:
    assert recorded is not None, "RECORD_AUTH_FAILURE returns the row it writes"
    until: float | None = recorded[0]
    return until


def _lock(row: tuple[Any, ...] | None) -> tuple[bool, float | None]:
    """AUTH_LOCKED_UNTIL's row: one when the address has failures on record, holding when it may try again."""
    return (row is not None, row[0] if row else None)


# --- failed tokens ----------------------------------------------------------------------------------


def failed_attempt(conn: psycopg.Connection, address: str, attempts: int, window: float) -> float | None:
    """Count a wrong token from this address; when it may try again (epoch seconds) if it is now locked out."""
    params = _window(address, attempts, window)
    with conn.transaction():
        recorded = conn.execute(sql.RECORD_AUTH_FAILURE, params).fetchone()
        for statement in _after_failure(address):
            conn.execute(statement, params)
    return _until(recorded)


async def afailed_attempt(conn: psycopg.AsyncConnection, address: str, attempts: int, window: float) -> float | None:
    """`failed_attempt` on an AsyncConnection."""
    params = _window(address, attempts, window)
    async with conn.transaction():
        recorded = await (await conn.execute(sql.RECORD_AUTH_FAILURE, params)).fetchone()
        for statement in _after_failure(address):
            await conn.execute(statement, params)
    return _until(recorded)


def locked_until(conn: psycopg.Connection, address: str, attempts: int, window: float) -> tuple[bool, float | None]:
    """(whether the address has failures on record, when it may try again if it is locked out now)."""
    return _lock(conn.execute(sql.AUTH_LOCKED_UNTIL, _window(address, attempts, window)).fetchone())


async def alocked_until(
    conn: psycopg.AsyncConnection, address: str, attempts: int, window: float
) -> tuple[bool, float | None]:
    """`locked_until` on an AsyncConnection."""
    return _lock(await (await conn.execute(sql.AUTH_LOCKED_UNTIL, _window(address, attempts, window))).fetchone())


def clear_failures(conn: psycopg.Connection, address: str) -> None:
    conn.execute(sql.CLEAR_AUTH_FAILURES, (address,))


async def aclear_failures(conn: psycopg.AsyncConnection, address: str) -> None:
    await conn.execute(sql.CLEAR_AUTH_FAILURES, (address,))


async def alisten_for_failures(conn: psycopg.AsyncConnection) -> list[str]:
    """Subscribe `conn` (autocommit) to AUTH_FAILURE_CHANNEL, then return the addresses with failures on
    record: in that order, so a failure is either in the list or notified (or both), never missed."""
    await conn.execute(sql.LISTEN_FOR_AUTH_FAILURES)
    return [address for (address,) in await (await conn.execute(sql.AUTH_FAILURE_ADDRESSES)).fetchall()]
