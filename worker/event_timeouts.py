"""The event waits' timeout sweep: every SWEEP_INTERVAL, the waits (`ctx.wait_for_event`) whose deadline has
passed are timed out and their jobs moved to pending, where the wait raises EventTimeout (store/events.py).

Every worker sweeps: the statement takes its rows with SKIP LOCKED, so sweeps never wait on each other, and a
pass that finds nothing costs one probe of a partial index holding only the waits. A deadline is thus met
within SWEEP_INTERVAL (plus the claim's own wake-up) while any worker runs.
"""

from __future__ import annotations

import asyncio
import logging

import psycopg
from dygo.store import events
from dygo.worker.database import WorkerConnections

log = logging.getLogger("dygo.worker")

SWEEP_INTERVAL = 1.0  # seconds between passes


class EventTimeouts:
    name = "event-timeouts"

    def __init__(self, database: WorkerConnections) -> None:
        self.database = database

    async def run(self) -> None:
        while True:
            await asyncio.sleep(SWEEP_INTERVAL)
            try:
                await self.run_once()
                await self.database.back()
            except (psycopg.Error, OSError) as exc:
                await self.database.failed("timing out event waits", exc)

    async def run_once(self) -> int:
        """One pass: batches until one comes back short. The waits timed out."""
        total = 0
        while True:
            async with self.database.connection() as conn:
                timed_out = await events.time_out_waits(conn)
            total += timed_out.waits
            if timed_out.waits:
                log.info("event waits: %d timed out, %d jobs pending again", timed_out.waits, timed_out.woken)
            if timed_out.waits < events.SWEEP_BATCH:
                return total
