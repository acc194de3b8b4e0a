"""The worker's connections to PostgreSQL: at most three, whatever the number of queues it serves.

* claim   - the producer's own connection (worker/producer.py): one statement claims for every queue,
            so no wake-up waits for a pool checkout
* LISTEN  - the listener's session (worker/listener.py), on DATABASE_DIRECT_URL when one is given:
            through a transaction pooler a session's notifications cannot be relied on. It also holds
            the worker's presence lock (worker/presence.py), a session-level advisory lock, even with
            --poll-only (then it LISTENs to nothing)
* shared  - a pool of one for everything else, one statement or short transaction at a time: settles,
            lease renewals, progress, timings, heartbeat, recovery, schedules, retention, durable steps
            (each batch commits on its own, so a pass never holds it long)

A fourth, sync connection is opened only when a sync handler first calls `ctx.step_tx_sync` (its function
takes a sync connection, which the shared async one is not), and kept for the next ones.

Nothing on the claim and shared connections keeps session state across transactions (no session advisory
lock, no SET, no server-side prepared statement behind a transaction pooler: store.db.connect_kwargs), so
every DATABASE_URL connection works through PgBouncer in transaction pooling mode; only the LISTEN session
does, and it never goes through a transaction pooler.

One lost/back line pair per outage for all services (store/outage.py). A transaction the server rolled back
as a deadlock's victim is logged and run again by its caller. Any other database error that is not an
outage (store/outage.py is_outage) is raised as a StatementError by `failed`: the service that hit it dies,
and the worker stops (worker/runtime.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from typing import Any

import psycopg
from dygo.store.db import check_primary, connect_kwargs, direct_url, through_transaction_pooler
from dygo.store.errors import StatementError
from dygo.store.outage import OutageLog, describe, is_outage, is_read_only, is_rolled_back
from dygo.worker.service import failure_backoff
from psycopg.conninfo import conninfo_to_dict
from psycopg_pool import AsyncConnectionPool, ConnectionPool

log = logging.getLogger("dygo.worker")

MAX_CONNECTIONS = 3
# At start, a database that cannot be reached (or a standby that is not the primary yet) is tried again this
# often at most: a standby promoted, or a primary back, is found within these seconds.
START_RETRY_MAX = 5.0


# TCP keepalives on the LISTEN session, which can sit idle for hours: a NAT or firewall that forgets an idle
# connection would cut it silently, and the server, once its own keepalives noticed, would release the
# worker's presence lock while the worker still ran its jobs. Unless the URL sets its own; libpq ignores them
# on a Unix socket.
SESSION_KEEPALIVES = {"keepalives": 1, "keepalives_idle": 30, "keepalives_interval": 10, "keepalives_count": 3}


def session_keepalives(url: str | None) -> dict[str, int]:
    if url is None or any(key.startswith("keepalives") for key in conninfo_to_dict(url)):
        return {}
    return dict(SESSION_KEEPALIVES)


class WorkerConnections:
    """The worker's connections (the module docstring lists the three) and its one outage log."""

    def __init__(self, url: str, worker_id: str) -> None:
        self.url = url
        # application_name lets an operator (and the chaos suite) find this worker's backends.
        self.options: dict[str, Any] = {
            "autocommit": True,
            "application_name": f"dygo-worker {worker_id}",
            **connect_kwargs(),
        }
        # Where LISTEN goes: the direct URL when given; DATABASE_URL unless it goes through a
        # transaction pooler; else nowhere (the worker polls, and says so when it starts).
        self.listen_url = direct_url() or (None if through_transaction_pooler() else url)
        self.listen_options: dict[str, Any] = {
            "autocommit": True,
            "application_name": f"dygo-worker-listen {worker_id}",
            **session_keepalives(self.listen_url),
        }
        self.pool = AsyncConnectionPool(url, min_size=1, max_size=1, kwargs=self.options, open=False)
        self.sync_pool: ConnectionPool | None = None  # opened at the first ctx.step_tx_sync (sync_connection)
        self.sync_pool_lock = threading.Lock()
        self.outage = OutageLog(log)

    async def wait_until_reachable(self) -> None:
        """At start, an unreachable database, or a server that is not the primary (a standby), is retried with
        backoff and said once, as in an outage later on: under a process manager the worker then starts working
        as soon as it is back, or promoted."""
        failures = 0
        while True:
            try:
                async with await self.connect() as conn:
                    await check_primary(conn)
            except (psycopg.Error, OSError) as exc:
                if not is_outage(exc):
                    raise StatementError("start-up: connecting to the database", exc) from exc
                failures += 1
                self.outage.lost(
                    "start-up: looking for the primary" if is_read_only(exc) else "start-up: cannot reach the database",
                    exc,
                )
                await asyncio.sleep(min(failure_backoff(failures), START_RETRY_MAX))
                continue
            self.outage.back()
            return

    def connection(self) -> contextlib.AbstractAsyncContextManager[psycopg.AsyncConnection]:
        """The shared connection, for one statement or one short transaction."""
        return self.pool.connection()

    def sync_connection(self) -> contextlib.AbstractContextManager[psycopg.Connection]:
        """A sync connection of its own, for sync handlers' step transactions (from their threads)."""
        with self.sync_pool_lock:
            if self.sync_pool is None:
                self.sync_pool = ConnectionPool(self.url, min_size=0, max_size=1, kwargs=self.options, open=True)
            return self.sync_pool.connection()

    async def close(self) -> None:
        await self.pool.close()
        with self.sync_pool_lock:
            sync_pool, self.sync_pool = self.sync_pool, None
        if sync_pool is not None:
            await asyncio.to_thread(sync_pool.close)

    async def connect(self) -> psycopg.AsyncConnection:
        """A connection of its own to DATABASE_URL (the producer's)."""
        return await psycopg.AsyncConnection.connect(self.url, **self.options)

    async def connect_listen(self) -> psycopg.AsyncConnection:
        assert self.listen_url is not None
        return await psycopg.AsyncConnection.connect(self.listen_url, **self.listen_options)

    async def failed(self, where: str, exc: psycopg.Error | OSError) -> None:
        """A statement of `where` failed. An outage is logged (once per outage) and the caller retries; so is a
        deadlock's victim (each time), which an operator's action on a workflow's jobs can make of a settle
        or a recovery pass. Any other error cannot be cured by retrying, and is raised as a StatementError
        naming `where`."""
        if is_rolled_back(exc):
            log.warning("%s: %s; running it again", where, describe(exc))
            return
        if not is_outage(exc):
            raise StatementError(where, exc) from exc
        if self.outage.lost(where, exc):
            # The pool's idle connection died with the server; dropped now, it would fail once more
            # after the database is back, and be logged as a second outage.
            await self._check_pool()

    async def back(self) -> None:
        """A statement ran. It ends an outage under way only once a new connection proves it: the statement may
        have run on a connection whose backend had not yet been told to stop, in a server shutting down (which
        refuses new connections), and logged a false "back" before a second "lost"."""
        if not self.outage.down:
            return
        try:
            async with await self.connect() as conn:
                await check_primary(conn)
        except (psycopg.Error, OSError):
            return
        if self.outage.back():
            # Again at the end: a connection whose backend was still shutting down passed the first
            # check, and died after it.
            await self._check_pool()

    async def _check_pool(self) -> None:
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self.pool.check(), 5.0)
