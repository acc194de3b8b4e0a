"""Progress reports from running handlers, written at most once a second per job.

`ctx.progress(fraction, message)` only records the latest value in memory (from the event loop or
from a sync handler's thread); a loop writes what changed since its last write in one statement
for all jobs, fenced by each job's lease token like a settle. So a handler may report in a tight
loop: the database sees one write per second for it, never more. No final flush: once a job
settles, its last written progress stays, and a report that had not been written yet is dropped.
"""

from __future__ import annotations

import asyncio
import threading
import time
from uuid import UUID

import psycopg
from psycopg_pool import AsyncConnectionPool

from store import leases
from store.leases import ClaimedJob
from store.outage import OutageLog

INTERVAL = 1.0


class ProgressWriter:
    def __init__(self, pool: AsyncConnectionPool, leased: dict[UUID, ClaimedJob], outage: OutageLog) -> None:
        self.pool = pool
        self.outage = outage  # the worker's: a failed write during an outage is not logged once per second
        self.leased = leased  # the worker's claimed-and-not-settled jobs: their lease tokens fence the write
        self.latest: dict[UUID, tuple[float, str | None]] = {}  # by lease token, like the worker's leases
        self.pending = False  # a report is waiting for the next write (ready is set or about to be)
        self.lock = threading.Lock()  # sync handlers report from their own threads
        self.ready = asyncio.Event()
        self.loop: asyncio.AbstractEventLoop | None = None
        self.last_write = 0.0

    def start(self) -> asyncio.Task[None]:
        self.loop = asyncio.get_running_loop()
        return asyncio.create_task(self._run(), name="progress")

    def report(self, lease_token: UUID, fraction: float, message: str | None) -> None:
        """Record the latest progress of a job's current run; callable from any thread."""
        with self.lock:
            self.latest[lease_token] = (fraction, message)
            wake, self.pending = not self.pending, True
        if not wake or self.loop is None:
            return
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is self.loop:
            self.ready.set()
        else:
            self.loop.call_soon_threadsafe(self.ready.set)

    async def _run(self) -> None:
        while True:
            await self.ready.wait()
            await asyncio.sleep(max(0.0, self.last_write + INTERVAL - time.monotonic()))
            self.ready.clear()
            with self.lock:
                latest, self.latest, self.pending = self.latest, {}, False
            jobs = [(self.leased[token], value) for token, value in latest.items() if token in self.leased]
            self.last_write = time.monotonic()
            if not jobs:
                continue
            try:
                async with self.pool.connection() as conn:
                    await leases.report_progress(conn, jobs)
                self.outage.back()
            except (psycopg.Error, OSError) as exc:
                # Progress is advisory: the next report carries the then-latest value anyway.
                self.outage.lost(f"writing the progress of {len(jobs)} job(s)", exc)
