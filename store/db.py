"""Where the database is: DATABASE_URL when set, else the embedded server."""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
from collections.abc import AsyncIterator
from typing import Any, TypeVar
from urllib.parse import unquote

import psycopg
from dygo.store.config import Settings
from dygo.store.errors import ConfigError, DatabaseUnavailable
from dygo.store.outage import NotPrimary
from dygo.store.sql import schema as schema_sql
from psycopg.conninfo import conninfo_to_dict

Row = TypeVar("Row")


def database_url(settings: Settings) -> str:
    """DATABASE_URL when set (checked to parse, so a malformed one fails here with the password hidden)."""
    url = os.environ.get("DATABASE_URL")
    if url:
        try:
            conninfo_to_dict(url)
        except psycopg.Error as exc:
            # libpq quotes the part it could not parse, which can be the password itself.
            raise DatabaseUnavailable(
                f"DATABASE_URL is not a valid connection string: {scrub(str(exc), url)}; "
                "expected postgresql://user:password@host:port/database",
                "invalid_url",
            ) from None
        return url
    from dygo.store import embedded

    return embedded.ensure_running(settings.data_dir)


async def notifications(conn: psycopg.AsyncConnection) -> AsyncIterator[psycopg.Notify]:
    """The notifications a LISTENing connection receives, for as long as it lives; raises what reading
    raises (a lost connection). psycopg's own `notifies()` wakes every 0.1 s while it waits (its interval
    for noticing Ctrl-C), ten loop rounds a second for every idle LISTEN connection: 64 idle workers spent
    a third of a core on it. This waits on the socket instead, and reads only when it is readable."""
    loop = asyncio.get_running_loop()
    readable = asyncio.Event()
    while True:
        async for notify in conn.notifies(timeout=0):  # what has arrived, without waiting for more
            yield notify
        readable.clear()
        loop.add_reader(conn.fileno(), readable.set)  # level-triggered: data already there wakes it at once
        try:
            await readable.wait()
        finally:
            loop.remove_reader(conn.fileno())


async def check_primary(conn: psycopg.AsyncConnection) -> None:
    """Raise NotPrimary (an outage) when `conn` cannot write: a worker there could read but never settle.
    A multi-host URL with target_session_attrs=read-write never leads there; one without it, or a URL naming
    a standby alone, can."""
    if one(await (await conn.execute(schema_sql.READ_ONLY_SESSION)).fetchone())[0]:
        raise NotPrimary("the server is read-only (a standby, or transactions read-only by default)")


def redact(url: str) -> str:
    """The URL with any password replaced, for logs and messages."""
    return scrub(re.sub(r"(://[^:/@]*:)[^@]*@", r"\1***@", url), url)


def scrub(text: str, url: str) -> str:
    """`text` (an error message about `url`) with every spelling of the URL's password replaced by ***."""
    for secret in sorted(_passwords(url), key=len, reverse=True):
        text = text.replace(secret, "***")
    return text.strip()


def _passwords(url: str) -> set[str]:
    found: list[str] = []
    userinfo = re.search(r"://([^@/?#]*)@", url)  # URI form: user:password@
    if userinfo and ":" in userinfo.group(1):
        found.append(userinfo.group(1).split(":", 1)[1])
    found += re.findall(r"[?&]password=([^&#]*)", url)  # URI form: ?password=
    for quoted, bare in re.findall(r"password\s*=\s*(?:'((?:[^'\\]|\\.)*)'?|([^\s']\S*))", url):  # key=value form
        found.append(quoted or bare)
    return {spelling for raw in found for spelling in (raw, unquote(raw)) if spelling}


# --- connection poolers ---------------------------------------------------------------------------
# Behind PgBouncer in transaction pooling mode (Debian's 1.18 has no prepared-statement support), a
# connection is a different server session from one transaction to the next: psycopg's automatic
# server-side prepares fail ("prepared statement _pg3_0 already exists") and LISTEN cannot be relied
# on. DATABASE_DIRECT_URL names a session-capable URL for what needs a session (LISTEN, migrations);
# setting it says DATABASE_URL goes through such a pooler. DYGO_POOL_MODE=transaction says the same
# without a direct URL (the worker then polls).


def read_url() -> str | None:
    """DATABASE_READ_URL when set: a replica for serve's heavy reads (app/db.py ServePools.read_connection)."""
    url = os.environ.get("DATABASE_READ_URL") or None
    if url is not None:
        try:
            conninfo_to_dict(url)
        except psycopg.Error as exc:
            raise DatabaseUnavailable(
                f"DATABASE_READ_URL is not a valid connection string: {scrub(str(exc), url)}", "invalid_url"
            ) from None
    return url


def direct_url() -> str | None:
    """DATABASE_DIRECT_URL when set: a connection straight to PostgreSQL, for LISTEN and migrations."""
    return os.environ.get("DATABASE_DIRECT_URL") or None


def through_transaction_pooler() -> bool:
    """Whether connections to DATABASE_URL may change server session between transactions."""
    mode = os.environ.get("DYGO_POOL_MODE", "").strip().lower()
    if mode:
        if mode not in ("session", "transaction"):
            raise ConfigError("DYGO_POOL_MODE", "environment", f"must be 'session' or 'transaction', not {mode!r}")
        return mode == "transaction"
    return direct_url() is not None


def connect_kwargs() -> dict[str, Any]:
    """Keyword arguments for every psycopg connection (or pool `kwargs`) made to DATABASE_URL."""
    return {"prepare_threshold": None} if through_transaction_pooler() else {}


def usable(conn: psycopg.Connection | psycopg.AsyncConnection) -> bool:
    """Whether `conn` can still run a statement: a clean-up on a closed or broken connection only fails again."""
    return not conn.closed and not conn.broken


def roll_back(conn: psycopg.Connection) -> None:
    """After a pipelined transaction failed: roll back what it left open (nothing of it stays)."""
    if usable(conn):
        with contextlib.suppress(psycopg.Error, OSError):  # the error that got us here is the one to raise
            conn.rollback()


async def aroll_back(conn: psycopg.AsyncConnection) -> None:
    """`roll_back` on an AsyncConnection."""
    if usable(conn):
        with contextlib.suppress(psycopg.Error, OSError):
            await conn.rollback()


def one(row: Row | None) -> Row:
    """The row of a statement that always returns one (an aggregate, a lock function, a RETURNING of the row
    it wrote); None there means the statement is not the one the caller thinks it runs."""
    if row is None:
        raise RuntimeError("a statement that always returns a row returned none")
    return row
