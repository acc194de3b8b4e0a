"""`GET /api/v1/jobs/{id}?wait=`: requests waiting for a job to finish, woken by LISTEN/NOTIFY.

One LISTEN connection per serve process fans the `dygo_finished` notifications out to the
waiting requests (a future per request, keyed by job id), so a thousand waiting clients cost one
connection and no polling. A bulk delete's empty payload wakes every waiter of the process to re-read
its job once (store.results.notify_recheck). A request subscribes before it reads the job, so a job that finishes
in between is seen by the read. When the LISTEN connection drops, every waiter re-reads its job
and the connection is re-established with backoff; on reconnect every waiter re-reads again, which
covers anything that finished while nobody listened.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from typing import Any

import psycopg
from dygo.store import results
from dygo.store.db import connect_kwargs
from dygo.store.outage import OutageLog

# Named for pg_stat_activity, like the worker's `dygo-worker-listen <id>`.
LISTEN_APPLICATION_NAME = "dygo-serve-listen"
LISTEN_RETRY_MAX = 5.0


class ResultWaiters:
    def __init__(self, database_url: str, outage: OutageLog, poll: float | None = None) -> None:
        self.database_url = database_url
        # Set when notifications cannot be relied on (LISTEN through a transaction pooler): each waiter
        # re-reads its job this often.
        self.poll = poll
        self.outage = outage  # serve's one outage log: a lost LISTEN is logged like any other lost connection
        self.waiting: dict[int, set[asyncio.Future[None]]] = {}
        self.task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self.task = asyncio.create_task(self._listen(), name="dygo-result-waiters")

    async def stop(self) -> None:
        if self.task is not None:
            self.task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.task
        self._wake_all()

    async def wait(self, job_id: int, seconds: float,
                   read: Callable[[], Awaitable[dict[str, Any] | None]]) -> dict[str, Any] | None:
        """The job once it is final, or as it is when `seconds` run out; None if it does not exist.
        `read` reads the job (taking a pooled connection only while it reads)."""
        deadline = time.monotonic() + seconds
        while True:
            woken = asyncio.get_running_loop().create_future()
            self.waiting.setdefault(job_id, set()).add(woken)
            try:
                job = await read()
                remaining = deadline - time.monotonic()
                if job is None or job["state"] in results.FINAL_STATES or remaining <= 0:
                    return job
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(woken, remaining if self.poll is None else min(remaining, self.poll))
            finally:
                self._forget(job_id, woken)

    def _forget(self, job_id: int, woken: asyncio.Future[None]) -> None:
        futures = self.waiting.get(job_id)
        if futures is not None:
            futures.discard(woken)
            if not futures:
                del self.waiting[job_id]

    def _wake(self, job_id: int) -> None:
        for woken in self.waiting.get(job_id, ()):
            if not woken.done():
                woken.set_result(None)

    def _wake_all(self) -> None:
        for job_id in list(self.waiting):
            self._wake(job_id)

    async def _listen(self) -> None:
        delay = 0.5
        while True:
            try:
                conn = await psycopg.AsyncConnection.connect(self.database_url, autocommit=True,
                                                             application_name=LISTEN_APPLICATION_NAME,
                                                             **connect_kwargs())
                async with conn:
                    await results.listen(conn)
                    delay = 0.5
                    self.outage.back()
                    self._wake_all()  # re-read: a job may have finished while nobody listened
                    async for notify in conn.notifies():
                        if results.recheck_all(notify.payload):
                            self._wake_all()  # a bulk delete: each waiter re-reads once (404 if gone)
                            continue
                        for job_id in results.finished_ids(notify.payload):
                            self._wake(job_id)
            except (psycopg.Error, OSError) as exc:
                self.outage.lost("result LISTEN connection; waiting requests re-read their job", exc)
                self._wake_all()
                await asyncio.sleep(delay)
                # Capped low, like the worker's LISTEN: a job that finishes before the reconnect is only
                # seen at its waiter's deadline.
                delay = min(delay * 2, LISTEN_RETRY_MAX)
