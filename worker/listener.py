"""The listener: the worker's own session. It holds the worker's presence lock (worker/presence.py) and
LISTENs for jobs that become pending and schedules that change, waking the producer (for the queue named in
the payload, with the jobs' earliest run_at) or the scheduler. On a lost connection it reconnects with
backoff while the producer and scheduler go on polling; its reconnect takes the presence lock again and
wakes both, to catch up on anything sent while it was away.

It needs a session of its own: DATABASE_DIRECT_URL when DATABASE_URL goes through a transaction
pooler (worker/database.py); without one the worker runs poll-only and has no listener, and its jobs
come back by lease expiry alone if it dies. With --poll-only it holds the presence lock and LISTENs to
nothing.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from datetime import datetime

import psycopg
from dygo.store import leases, schedules
from dygo.store.db import notifications
from dygo.worker.database import WorkerConnections

log = logging.getLogger("dygo.worker")

RETRY_MAX = 5.0  # capped low: its reconnect is what wakes every producer once the database is back


class Listener:
    def __init__(
        self,
        database: WorkerConnections,
        wake_queue: Callable[[str, datetime | None], None],
        wake_all: Callable[[], None],
        schedules_changed: asyncio.Event,
        poll_interval: float,
        worker_id: str,
        listen: bool = True,
    ) -> None:
        self.database = database
        self.worker_id = worker_id
        self.listen = listen  # False: --poll-only, the session holds the presence lock alone
        self.name = "listener" if listen else "presence"
        self.presence_refused = False  # another session holds this worker's key: said once
        self.wake_queue = wake_queue
        self.wake_all = wake_all
        self.schedules_changed = schedules_changed
        self.poll_interval = poll_interval
        self.listening = asyncio.Event()  # set while LISTEN is in place (the worker's readiness waits for it)

    async def run(self) -> None:
        delay = 0.5
        while True:
            try:
                async with await self.database.connect_listen() as conn:
                    await self.hold_presence(conn)
                    if self.listen:
                        await leases.listen(conn)
                        await schedules.listen(conn)
                    delay = 0.5
                    self.listening.set()
                    if self.database.listen_url == self.database.url:
                        # On DATABASE_DIRECT_URL, being back says nothing of the pooled DATABASE_URL
                        # (PgBouncer refuses logins for server_login_retry after an outage): the
                        # services that use it say when it is back.
                        await self.database.back()
                    self.wake_all()  # catch up on anything sent while not listening
                    self.schedules_changed.set()
                    async for notify in notifications(conn):
                        if notify.channel == schedules.CHANNEL:
                            self.schedules_changed.set()
                        else:
                            self.wake_queue(*leases.jobs_pending(notify.payload))
            except (psycopg.Error, OSError) as exc:
                self.listening.clear()
                what = "LISTEN connection" if self.listen else "presence session"
                await self.database.failed(f"{what} (polling every {self.poll_interval:g}s until it is back)", exc)
                await asyncio.sleep(delay)
                delay = min(delay * 2, RETRY_MAX)

    async def hold_presence(self, conn: psycopg.AsyncConnection) -> None:
        if await leases.hold_presence(conn, self.worker_id):
            return
        if not self.presence_refused:
            self.presence_refused = True
            log.warning(
                "worker %s: another session holds this worker's presence lock (a hash collision of worker ids); "
                "if this worker dies, its jobs come back when their lease runs out",
                self.worker_id,
            )
