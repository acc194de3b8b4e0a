"""What `dygo serve` remembers about authentication, in the database so every process agrees.

Dashboard sessions that are signed in (signing out deletes one: a copied cookie dies with it), and
failed tokens per client address (a lock-out shared by the API and the dashboard's sign-in, across
processes and restarts). Statements in store/queries.py.

Each recorded failure is also sent on the `dygo_auth_failures` channel with its address (at commit), so
a serve process that listens knows the addresses with failures on record without reading the table for
each request (app/throttle.py). An address longer than MAX_NOTIFIED_ADDRESS is not sent (a NOTIFY payload
is limited): a listener must read the table for such an address every time.
"""

from __future__ import annotations

import psycopg
from dygo.store import queries

AUTH_FAILURE_CHANNEL = "dygo_auth_failures"
MAX_NOTIFIED_ADDRESS = 255  # characters; an address is an IP (or what a trusted proxy says it is)


def notified(address: str) -> bool:
    """Whether a recorded failure of `address` is sent on AUTH_FAILURE_CHANNEL."""
    return len(address) <= MAX_NOTIFIED_ADDRESS


def start_session(conn: psycopg.Connection, sid: str, role: str, expires: float) -> None:
    """Record a signed-in session (expires: epoch seconds), forgetting the expired ones."""
    with conn.transaction():
        conn.execute(queries.TRIM_DASHBOARD_SESSIONS)
        conn.execute(queries.INSERT_DASHBOARD_SESSION, (sid, role, expires))


def session_role(conn: psycopg.Connection, sid: str) -> str | None:
    """The role of a signed-in, unexpired session; None once it was ended (or never started)."""
    row = conn.execute(queries.DASHBOARD_SESSION_ROLE, (sid,)).fetchone()
    return row[0] if row else None


def end_session(conn: psycopg.Connection, sid: str) -> None:
    conn.execute(queries.END_DASHBOARD_SESSION, (sid,))


def failed_attempt(conn: psycopg.Connection, address: str, attempts: int, window: float) -> float | None:
    """Count a wrong token from this address; when it may try again (epoch seconds) if it is now locked out."""
    params = {"address": address, "attempts": attempts, "window": window}
    with conn.transaction():
        until = conn.execute(queries.RECORD_AUTH_FAILURE, params).fetchone()[0]
        conn.execute(queries.TRIM_AUTH_FAILURES, params)
        if notified(address):
            conn.execute(queries.NOTIFY_AUTH_FAILURE, params)
    return until


def locked_until(conn: psycopg.Connection, address: str, attempts: int, window: float) -> tuple[bool, float | None]:
    """(whether the address has failures on record, when it may try again if it is locked out now)."""
    row = conn.execute(
        queries.AUTH_LOCKED_UNTIL, {"address": address, "attempts": attempts, "window": window}
    ).fetchone()
    return (row is not None, row[0] if row else None)


def clear_failures(conn: psycopg.Connection, address: str) -> None:
    conn.execute(queries.CLEAR_AUTH_FAILURES, (address,))


# --- async: the API's bearer check and the dashboard's session check run on the event loop -----------


async def asession_role(conn: psycopg.AsyncConnection, sid: str) -> str | None:
    """`session_role` on an AsyncConnection."""
    row = await (await conn.execute(queries.DASHBOARD_SESSION_ROLE, (sid,))).fetchone()
    return row[0] if row else None


async def afailed_attempt(conn: psycopg.AsyncConnection, address: str, attempts: int, window: float) -> float | None:
    """`failed_attempt` on an AsyncConnection."""
    params = {"address": address, "attempts": attempts, "window": window}
    async with conn.transaction():
        until = (await (await conn.execute(queries.RECORD_AUTH_FAILURE, params)).fetchone())[0]
        await conn.execute(queries.TRIM_AUTH_FAILURES, params)
        if notified(address):
            await conn.execute(queries.NOTIFY_AUTH_FAILURE, params)
    return until


async def alocked_until(
    conn: psycopg.AsyncConnection, address: str, attempts: int, window: float
) -> tuple[bool, float | None]:
    """`locked_until` on an AsyncConnection."""
    row = await (
        await conn.execute(queries.AUTH_LOCKED_UNTIL, {"address": address, "attempts": attempts, "window": window})
    ).fetchone()
    return (row is not None, row[0] if row else None)


async def aclear_failures(conn: psycopg.AsyncConnection, address: str) -> None:
    await conn.execute(queries.CLEAR_AUTH_FAILURES, (address,))


async def alisten_for_failures(conn: psycopg.AsyncConnection) -> list[str]:
    """Subscribe `conn` (autocommit) to AUTH_FAILURE_CHANNEL, then return the addresses with failures on
    record: in that order, so a failure is either in the list or notified (or both), never missed."""
    await conn.execute(queries.LISTEN_FOR_AUTH_FAILURES)
    return [address for (address,) in await (await conn.execute(queries.AUTH_FAILURE_ADDRESSES)).fetchall()]
