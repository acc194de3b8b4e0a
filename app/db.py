"""How a request reaches the database: two bounded pools, a bounded wait, and the 503 rule.

A request never holds a thread while it waits for a connection, nor a connection while it waits for a
thread. A sync `yield` dependency breaks that rule: FastAPI enters it in one threadpool thread and runs
the endpoint in another, both from the same 40-thread anyio limit, so under load every thread can sit
waiting for a connection held by a request that waits for a thread (a deadlock broken only by the
pool's timeout, as a false 503 and a false "database connection lost"). So:

* the hot paths (enqueue one and many, read a job, list the queues) are `async` endpoints on a
  psycopg `AsyncConnectionPool`: no thread at all, and a waiting request is an entry in the pool's
  queue, not a thread;
* every other endpoint (sync, run in the threadpool) gets its connection through `Conn`, an async
  dependency that first takes a slot of an asyncio gate sized to the sync pool, then the
  connection. A thread therefore never waits for a connection: one is free for every slot.
* with DATABASE_READ_URL, the heavy reads (lists, counts, charts, /metrics) go to a third pool, the
  replica's, behind a gate of its own: `ReadConn` for a sync endpoint, `read` for an async one (the
  connection first, then a thread, the same order).

The 503 rule (docs/operations/scaling-web.md): a request answers 503 `database_unavailable` with
`Retry-After` when the database is down (a connection or a statement fails, or the pool cannot open
connections), or when this process is saturated past its documented limits: more than MAX_WAITING
requests already waiting for a connection, or a wait longer than POOL_TIMEOUT with every connection
of the pool open and busy. A saturated process does not log a lost database.
"""

from __future__ import annotations

import asyncio
import logging
import select
import time
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Annotated, TypeVar

import anyio
import anyio.to_thread
import psycopg
from dygo.app.errors import coded_response
from dygo.store.db import connect_kwargs
from dygo.store.errors import DatabaseUnavailable
from dygo.store.outage import OutageLog, is_outage
from fastapi import Depends, Request, Response
from psycopg_pool import AsyncConnectionPool, ConnectionPool, PoolTimeout, TooManyRequests

log = logging.getLogger("dygo.serve")

POOL_TIMEOUT = 10.0  # longest a request waits for a connection while every one is busy (then 503)
MAX_WAITING = 1000  # requests of one process that may wait for a connection of one pool at once (then 503)
OUTAGE_WAIT = 1.0  # seconds a request waits for a connection while the database is known to be down
RETRY_AFTER_DOWN = 5  # Retry-After (seconds) of a 503 while the database is down
RETRY_AFTER_SATURATED = 1  # Retry-After of a 503 when this process is saturated
SATURATION_LOG_INTERVAL = 60.0  # a saturated process says so at most this often
APPLICATION_NAME = "dygo-serve"
READ_APPLICATION_NAME = "dygo-serve-read"
T = TypeVar("T")  # what a read run in a thread returns (ServePools.read)


def split_pool(size: int) -> tuple[int, int]:
    """(hot, other): the async pool of the hot paths gets four fifths, the sync pool the rest (at least 1)."""
    other = max(1, size // 5)
    return size - other, other


DOWN_MESSAGE = "the database is not reachable; try again shortly"
SATURATED_MESSAGE = "the server is saturated: too many requests wait for a database connection; try again shortly"


class Saturated(Exception):
    """This process has more requests waiting for a connection than its limits allow."""


def down(cause: BaseException) -> DatabaseUnavailable:
    """A request's 503 while the database is down (an outage: store/outage.py)."""
    return DatabaseUnavailable(DOWN_MESSAGE, "down", cause, RETRY_AFTER_DOWN)


class ReplicaDown(DatabaseUnavailable):
    """A request's 503 while the replica of DATABASE_READ_URL is down: logged as the replica's outage, never
    as the primary's, which may be answering all along."""


def replica_down(cause: BaseException) -> ReplicaDown:
    return ReplicaDown(DOWN_MESSAGE, "down", cause, RETRY_AFTER_DOWN)


def saturated(cause: BaseException) -> DatabaseUnavailable:
    """A request's 503 while this process is saturated: the database is fine, and no outage is logged."""
    return DatabaseUnavailable(SATURATED_MESSAGE, "saturated", cause, RETRY_AFTER_SATURATED)


def _idle_socket_has_news(conn: psycopg.Connection | psycopg.AsyncConnection) -> bool:
    """True when the server sent something to an idle connection: its goodbye (a restart, a terminated
    backend) or a closed socket. A free check, where a round trip per request would cost as much as the
    enqueue itself."""
    if conn.closed:
        return True
    try:
        readable, _, _ = select.select([conn.pgconn.socket], [], [], 0)
    except (OSError, ValueError, psycopg.OperationalError):
        return True
    return bool(readable)


async def _acheck(conn: psycopg.AsyncConnection) -> None:
    if _idle_socket_has_news(conn):
        await AsyncConnectionPool.check_connection(conn)  # raises, so the pool replaces the connection


def _check(conn: psycopg.Connection) -> None:
    if _idle_socket_has_news(conn):
        ConnectionPool.check_connection(conn)


class PoolHealth:
    """When the database last answered this process (monotonic seconds)."""

    def __init__(self) -> None:
        self.answered_at = 0.0

    def answered(self) -> None:
        self.answered_at = time.monotonic()


def _reporting(base: type, outage: OutageLog, health: PoolHealth) -> type:
    """`base` (psycopg's Connection or AsyncConnection) whose failed connects start a logged outage at
    once, so requests arriving meanwhile wait OUTAGE_WAIT for their 503 rather than POOL_TIMEOUT. An
    attempt that began before the database last answered is old news (a pool's retry in flight while
    the outage ended) and starts nothing."""

    def lost(exc: psycopg.Error, began: float) -> None:
        if began > health.answered_at and is_outage(exc):
            outage.lost("opening a database connection", exc)

    if issubclass(base, psycopg.AsyncConnection):

        class AsyncReporting(base):  # type: ignore[misc]
            @classmethod
            async def connect(cls, *args, **kwargs):  # type: ignore[no-untyped-def]
                began = time.monotonic()
                try:
                    return await super().connect(*args, **kwargs)
                except psycopg.Error as exc:
                    lost(exc, began)
                    raise

        return AsyncReporting

    class Reporting(base):  # type: ignore[misc]
        @classmethod
        def connect(cls, *args, **kwargs):  # type: ignore[no-untyped-def]
            began = time.monotonic()
            try:
                return super().connect(*args, **kwargs)
            except psycopg.Error as exc:
                lost(exc, began)
                raise

    return Reporting


class Gate:
    """At most `size` holders at once; others wait in FIFO order, at most `max_waiting` of them, each for
    at most `timeout` seconds. An asyncio object: waiting costs a future, not a thread."""

    def __init__(self, size: int, max_waiting: int, timeout: float) -> None:
        self.size, self.max_waiting, self.timeout = size, max_waiting, timeout
        self.semaphore = asyncio.Semaphore(size)
        self.waiting = 0

    @asynccontextmanager
    async def slot(self, timeout: float | None = None) -> AsyncIterator[None]:
        if self.semaphore.locked() and self.waiting >= self.max_waiting:
            raise Saturated(f"{self.waiting} requests already wait for a connection (at most {self.max_waiting})")
        self.waiting += 1
        try:
            async with asyncio.timeout(self.timeout if timeout is None else timeout):
                await self.semaphore.acquire()
        except TimeoutError:
            raise Saturated(f"no connection free within {self.timeout if timeout is None else timeout:g}s") from None
        finally:
            self.waiting -= 1
        try:
            yield
        finally:
            self.semaphore.release()


class ServePools:
    """The pools of one `dygo serve` process: `apool` (async, hot paths), `pool` (sync, the rest) and, with
    DATABASE_READ_URL, `read_pool` (sync, the heavy reads that may lag: lists, counts, charts)."""

    def __init__(self, url: str, size: int, outage: OutageLog, read_url: str | None = None) -> None:
        hot, other = split_pool(size)
        self.size, self.outage = size, outage
        self.health = PoolHealth()
        kwargs = {"autocommit": True, "application_name": APPLICATION_NAME, **connect_kwargs()}
        self.read_pool: ConnectionPool | None = None
        # The replica's outages are its own: reads that go through say nothing of the primary.
        self.read_outage = OutageLog(log, "replica database")
        self.read_health = PoolHealth()
        if read_url is not None:
            # Its own pool and gate, the size of the sync pool's: a read never waits behind the primary's work.
            self.read_pool = ConnectionPool(
                read_url,
                min_size=1,
                max_size=other,
                timeout=POOL_TIMEOUT,
                check=_check,
                kwargs={**kwargs, "application_name": READ_APPLICATION_NAME},
                open=False,
                connection_class=_reporting(psycopg.Connection, self.read_outage, self.read_health),
            )
            self.read_gate = Gate(other, MAX_WAITING, POOL_TIMEOUT)
        self.apool = AsyncConnectionPool(
            url,
            min_size=1,
            max_size=hot,
            timeout=POOL_TIMEOUT,
            max_waiting=MAX_WAITING,
            check=_acheck,
            kwargs=kwargs,
            open=False,
            connection_class=_reporting(psycopg.AsyncConnection, outage, self.health),
        )
        self.pool = ConnectionPool(
            url,
            min_size=1,
            max_size=other,
            timeout=POOL_TIMEOUT,
            check=_check,
            kwargs=kwargs,
            open=False,
            connection_class=_reporting(psycopg.Connection, outage, self.health),
        )
        self.gate = Gate(other, MAX_WAITING, POOL_TIMEOUT)
        # Connection hand-outs and returns of the sync pool run here, never in the endpoints' threads.
        self.handoff = anyio.CapacityLimiter(other + 1)
        self.lent = 0  # connections of apool now held by requests
        self.saturation_logged_at = 0.0

    async def open(self) -> None:
        # Not waiting for the first connections: serve starts (and /healthz answers) while the
        # database is still down; requests then get their 503 until it is back.
        await self.apool.open(wait=False)
        self.pool.open(wait=False)
        if self.read_pool is not None:
            self.read_pool.open(wait=False)

    async def close(self) -> None:
        await self.apool.close()
        await anyio.to_thread.run_sync(self.pool.close)
        if self.read_pool is not None:
            await anyio.to_thread.run_sync(self.read_pool.close)

    def _wait(self) -> float | None:
        # During a known outage a request waits briefly, so callers get their 503 at once rather than
        # after the full timeout; the pools keep reconnecting in the background meanwhile.
        return OUTAGE_WAIT if self.outage.down else None

    @asynccontextmanager
    async def connection(self) -> AsyncIterator[psycopg.AsyncConnection]:
        """An autocommit AsyncConnection of the hot pool."""
        try:
            conn = await self.apool.getconn(timeout=self._wait())
        except (PoolTimeout, TooManyRequests) as exc:
            raise self.unavailable(exc, busy=self.lent >= self.apool.max_size) from None
        self.lent += 1
        try:
            yield conn
        finally:
            self.lent -= 1
            await self.apool.putconn(conn)
        self._answered()  # reached only when the request's database work went through

    def sync_connection(self) -> AbstractAsyncContextManager[psycopg.Connection]:
        """An autocommit sync Connection, for work done in a thread: the gate first, so that getting it
        never makes a thread wait for another request."""
        return self._lend(self.pool, self.gate, self.outage, self.health)

    def read_connection(self) -> AbstractAsyncContextManager[psycopg.Connection]:
        """An autocommit sync Connection for a heavy read that may lag behind the primary: DATABASE_READ_URL's
        when set, else the sync pool's."""
        if self.read_pool is None:
            return self.sync_connection()
        return self._lend(self.read_pool, self.read_gate, self.read_outage, self.read_health)

    @property
    def reads_replica(self) -> bool:
        """DATABASE_READ_URL is set: the heavy reads go to a replica that may lag behind the primary."""
        return self.read_pool is not None

    @property
    def reads_pool(self) -> ConnectionPool:
        """The sync pool of the heavy reads: DATABASE_READ_URL's when set, else the primary's."""
        return self.read_pool if self.read_pool is not None else self.pool

    async def read(self, work: Callable[[psycopg.Connection], T]) -> T:
        """`work` run in a thread on a read connection (see read_connection), for an async endpoint whose
        read goes to the replica: the connection is held before the thread is taken, as for a sync endpoint."""
        async with self.read_connection() as conn:
            return await anyio.to_thread.run_sync(work, conn)

    def reads_wait(self) -> float | None:
        """How long a heavy read waits for a connection of `reads_pool` (see _wait): briefly while its server
        is known to be down."""
        outage = self.read_outage if self.read_pool is not None else self.outage
        return OUTAGE_WAIT if outage.down else None

    @asynccontextmanager
    async def read_slot(self) -> AsyncIterator[None]:
        """A slot of the read pool's gate (the sync pool's without DATABASE_READ_URL), for code that takes its
        connection from `reads_pool` itself (metrics)."""
        gate = self.read_gate if self.read_pool is not None else self.gate
        try:
            async with gate.slot(self.reads_wait()):
                try:
                    yield
                except psycopg.Error as exc:
                    if self.read_pool is not None and is_outage(exc):
                        raise replica_down(exc) from exc
                    raise
        except Saturated as exc:
            raise self.unavailable(exc, busy=True) from None

    @asynccontextmanager
    async def _lend(
        self, pool: ConnectionPool, gate: Gate, outage: OutageLog, health: PoolHealth
    ) -> AsyncIterator[psycopg.Connection]:
        # During a known outage a request waits briefly (see _wait).
        wait = OUTAGE_WAIT if outage.down else None
        replica = pool is self.read_pool
        try:
            async with gate.slot(wait):
                try:
                    conn = await anyio.to_thread.run_sync(pool.getconn, wait, limiter=self.handoff)
                except PoolTimeout as exc:
                    # Past the gate a connection is free or being opened: not getting one means the
                    # database does not accept connections.
                    raise (replica_down(exc) if replica else self.unavailable(exc, busy=False)) from None
                try:
                    yield conn
                except psycopg.Error as exc:
                    # The replica's outage is told apart here, where it is known which server failed.
                    if replica and is_outage(exc):
                        raise replica_down(exc) from exc
                    raise
                finally:
                    with anyio.CancelScope(shield=True):
                        await anyio.to_thread.run_sync(pool.putconn, conn, limiter=self.handoff)
        except Saturated as exc:
            raise self.unavailable(exc, busy=True) from None
        health.answered()
        outage.back()

    def _answered(self) -> None:
        self.health.answered()
        self.outage.back()

    @asynccontextmanager
    async def sync_slot(self) -> AsyncIterator[None]:
        """A slot of the sync pool for code that takes its connection itself (metrics, readiness)."""
        try:
            async with self.gate.slot(self._wait()):
                yield
        except Saturated as exc:
            raise self.unavailable(exc, busy=True) from None

    def unavailable(self, exc: BaseException, busy: bool) -> DatabaseUnavailable:
        """Down or saturated? Saturated when every connection was held by a request of this process (or
        too many requests already waited); else the pool could not open connections: the database is down."""
        if isinstance(exc, TooManyRequests) or busy:
            now = time.monotonic()
            if now - self.saturation_logged_at >= SATURATION_LOG_INTERVAL:
                self.saturation_logged_at = now
                log.warning(
                    "serve is saturated: requests wait longer than %gs or more than %d wait for a "
                    "connection (%s); answering 503 with Retry-After: %ds. Raise serve_pool_size or "
                    "WEB_CONCURRENCY if the database has room",
                    POOL_TIMEOUT,
                    MAX_WAITING,
                    exc,
                    RETRY_AFTER_SATURATED,
                )
            return saturated(exc)
        return down(exc)


async def _connection(request: Request) -> AsyncIterator[psycopg.Connection]:
    async with request.app.state.db.sync_connection() as conn:
        yield conn


async def _read_connection(request: Request) -> AsyncIterator[psycopg.Connection]:
    pools: ServePools = request.app.state.db
    async with pools.read_connection() as conn:
        if pools.read_pool is not None:
            request.state.replica = conn  # the dashboard says it reads from a replica, and how far behind
        yield conn


async def _slot(request: Request) -> AsyncIterator[None]:
    async with request.app.state.db.sync_slot():
        yield


async def _read_slot(request: Request) -> AsyncIterator[None]:
    async with request.app.state.db.read_slot():
        yield


# An autocommit connection: each statement commits on its own unless wrapped in conn.transaction().
# For sync endpoints (run in the threadpool); the hot paths use `database(request).connection()`.
Conn = Annotated[psycopg.Connection, Depends(_connection)]
# The same for a heavy read that may lag behind the primary (lists, counts, charts): DATABASE_READ_URL's
# connection when set. Never for a write, nor for a read that must see a write just made.
ReadConn = Annotated[psycopg.Connection, Depends(_read_connection)]
# A slot of the sync pool, for a sync endpoint that takes its connection from app.state.db.pool itself.
SyncSlot = Annotated[None, Depends(_slot)]
# A slot of the read pool's gate (see ReadConn), for a sync endpoint that takes its connection from reads_pool.
ReadSlot = Annotated[None, Depends(_read_slot)]


def database(request: Request) -> ServePools:
    """The process's pools (app.state.db)."""
    pools: ServePools = request.app.state.db
    return pools


def unavailable_response(exc: DatabaseUnavailable) -> Response:
    """The API's 503 for `exc`: `details.reason` down or saturated, and a Retry-After."""
    return coded_response(exc)
