"""Connections an application already holds, as the psycopg connection enqueue writes through.

`enqueue(conn, ...)` takes a psycopg 3 connection, a Django database connection (its psycopg 3
backend), or a SQLAlchemy 2 `Session`, `Connection`, `AsyncSession` or `AsyncConnection` on the
psycopg driver. Each is turned into the psycopg connection underneath, in the transaction its owner
has open (a SQLAlchemy session or connection begins one here, as its own first statement would), so
the job commits only with the application's writes. Anything else raises `UnsupportedConnection`,
which says what to change. Django and SQLAlchemy are optional: imported only when such an object
is passed, and recognised by the module that defines its class, so neither is imported to rule it out.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager, AbstractContextManager
from typing import Any, TypeVar

import psycopg
from dygo.store.errors import DygoError
from dygo.store.sql import enqueue as sql
from psycopg.pq import TransactionStatus

# What enqueue accepts: a psycopg connection, or one of the objects listed in the docstring.
Connectable = Any
C = TypeVar("C", psycopg.Connection[Any], psycopg.AsyncConnection[Any])


class UnsupportedConnection(DygoError, TypeError):
    """`enqueue` was given a connection it cannot write through; the message names what to use instead."""


def sync_connection(conn: Connectable) -> psycopg.Connection[Any]:
    """The psycopg connection under `conn`, in `conn`'s current transaction."""
    if isinstance(conn, psycopg.Connection):
        return conn
    adapter = _SYNC.get(_library(conn))
    if adapter is None:
        raise _unsupported(conn)
    return adapter(conn)


async def async_connection(conn: Connectable) -> psycopg.AsyncConnection[Any]:
    """The psycopg async connection under `conn`, in `conn`'s current transaction."""
    if isinstance(conn, psycopg.AsyncConnection):
        return conn
    adapter = _ASYNC.get(_library(conn))
    if adapter is None:
        raise _unsupported(conn, asynchronous=True)
    return await adapter(conn)


def joined_transaction(conn: psycopg.Connection[Any]) -> AbstractContextManager[psycopg.Transaction]:
    """All-or-nothing for several statements, inside the caller's transaction: a transaction of their own on
    an autocommit connection, else a savepoint in the caller's (a failed batch leaves it usable). A
    connection out of autocommit with no transaction open yet has it opened first: there
    `conn.transaction()` would open and commit one of its own, which would outlive the caller's rollback."""
    if not conn.autocommit and conn.info.transaction_status == TransactionStatus.IDLE:
        conn.execute(sql.OPEN_TRANSACTION)
    return conn.transaction()


async def ajoined_transaction(
    conn: psycopg.AsyncConnection[Any],
) -> AbstractAsyncContextManager[psycopg.AsyncTransaction]:
    """`joined_transaction` for an AsyncConnection: `async with await ajoined_transaction(conn):`."""
    if not conn.autocommit and conn.info.transaction_status == TransactionStatus.IDLE:
        await conn.execute(sql.OPEN_TRANSACTION)
    return conn.transaction()


def _library(conn: Connectable) -> str:
    """The top-level package that defines `conn`'s class or, for a subclass of one of the project's own
    (a Flask-SQLAlchemy session), the nearest base's: 'psycopg', 'django', 'sqlalchemy', ..."""
    for cls in type(conn).__mro__:
        library = cls.__module__.partition(".")[0]
        if library in _KNOWN:
            return library
    return type(conn).__module__.partition(".")[0]


def _unsupported(conn: Connectable, asynchronous: bool = False) -> UnsupportedConnection:
    name = f"{type(conn).__module__}.{type(conn).__qualname__}"
    if asynchronous and isinstance(conn, psycopg.Connection):
        return UnsupportedConnection(
            f"aenqueue needs an async connection, got {name}: use enqueue with it, or a psycopg.AsyncConnection"
        )
    if not asynchronous and (isinstance(conn, psycopg.AsyncConnection) or "Async" in type(conn).__name__):
        return UnsupportedConnection(f"enqueue needs a sync connection, got {name}: use `await aenqueue(...)` with it")
    if asynchronous and _library(conn) in _ASYNC:
        return UnsupportedConnection(f"aenqueue needs an async connection or session, got {name}: use enqueue with it")
    return UnsupportedConnection(
        f"cannot enqueue through {name}: pass a psycopg 3 connection, a Django connection "
        "(django.db.connection), or a SQLAlchemy Session, Connection, AsyncSession or AsyncConnection "
        "on the psycopg driver"
    )


def _psycopg_only(driver_connection: Any, expected: type[C], owner: str, fix: str) -> C:
    """`driver_connection` when it is psycopg's (`expected`), else UnsupportedConnection naming `fix`."""
    if isinstance(driver_connection, expected):
        return driver_connection
    driver = f"{type(driver_connection).__module__}.{type(driver_connection).__qualname__}"
    raise UnsupportedConnection(f"{owner} runs on {driver}, not psycopg 3, which dygo writes through: {fix}")


# --- Django -------------------------------------------------------------------------------------


def _django(conn: Any) -> psycopg.Connection[Any]:
    """Django's connection (or `django.db.connection`, its proxy): inside `transaction.atomic()` its
    connection is out of autocommit and the insert joins the block's transaction; outside, it commits
    on its own, as a Django write does."""
    if getattr(conn, "vendor", None) != "postgresql":
        raise UnsupportedConnection(
            f"Django database {getattr(conn, 'alias', '?')!r} is {getattr(conn, 'vendor', '?')}: dygo needs "
            "PostgreSQL (ENGINE 'django.db.backends.postgresql')"
        )
    conn.ensure_connection()
    return _psycopg_only(
        conn.connection,
        psycopg.Connection,
        f"Django database {conn.alias!r}",
        "use Django 4.2 or newer with psycopg 3 installed (pip install 'psycopg[binary]'; Django then picks it "
        "over psycopg2)",
    )


async def _django_async(conn: Any) -> psycopg.AsyncConnection[Any]:
    raise UnsupportedConnection(
        "Django's database connections are synchronous: call enqueue, not aenqueue (from async code, "
        "through asgiref's sync_to_async, in the thread Django's connection belongs to)"
    )


# --- SQLAlchemy ----------------------------------------------------------------------------------

SQLALCHEMY_FIX = (
    "create the engine with the psycopg driver, 'postgresql+psycopg://...' (create_async_engine takes the same "
    "URL), and dygo joins its transaction"
)


def _sqlalchemy(conn: Any) -> psycopg.Connection[Any]:
    """A Session (its connection in the session's transaction, begun if none is) or a Connection (a
    transaction begun if none is, as its own next statement would)."""
    from sqlalchemy.engine import Connection
    from sqlalchemy.orm import Session

    if isinstance(conn, Session):
        conn = conn.connection()
    if not isinstance(conn, Connection):
        raise _unsupported(conn)
    if not conn.in_transaction():
        conn.begin()
    engine = f"the SQLAlchemy engine ({conn.dialect.name}+{conn.dialect.driver})"
    return _psycopg_only(conn.connection.driver_connection, psycopg.Connection, engine, SQLALCHEMY_FIX)


async def _sqlalchemy_async(conn: Any) -> psycopg.AsyncConnection[Any]:
    """`_sqlalchemy` for an AsyncSession or AsyncConnection."""
    from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession

    if isinstance(conn, AsyncSession):
        conn = await conn.connection()
    if not isinstance(conn, AsyncConnection):
        raise _unsupported(conn, asynchronous=True)
    if not conn.in_transaction():
        await conn.begin()
    engine = f"the SQLAlchemy engine ({conn.dialect.name}+{conn.dialect.driver})"
    driver = (await conn.get_raw_connection()).driver_connection
    return _psycopg_only(driver, psycopg.AsyncConnection, engine, SQLALCHEMY_FIX)


_SYNC: dict[str, Callable[[Any], psycopg.Connection[Any]]] = {"django": _django, "sqlalchemy": _sqlalchemy}
_ASYNC: dict[str, Callable[[Any], Awaitable[psycopg.AsyncConnection[Any]]]] = {
    "django": _django_async,
    "sqlalchemy": _sqlalchemy_async,
}
_KNOWN = {"psycopg", *_SYNC}
