"""The timings writer: every INTERVAL, appends the latency and duration histogram counts observed since
its last write (store/timings.py), for GET /metrics on `dygo serve`: one insert per interval, whatever
the throughput; a crash loses at most this much."""

from __future__ import annotations

import asyncio

import psycopg
from dygo.store import timings
from dygo.worker.database import WorkerConnections
from dygo.worker.telemetry import WorkerStats

INTERVAL = 5.0


class TimingsWriter:
    name = "timings"

    def __init__(self, database: WorkerConnections, stats: WorkerStats) -> None:
        self.database = database
        self.stats = stats

    async def run(self) -> None:
        while True:
            await asyncio.sleep(INTERVAL)
            await self.flush()

    async def flush(self) -> None:
        """Append what was observed since the last flush; on failure it stays unflushed for the next one."""
        deltas = self.stats.timings.unflushed()
        if not deltas:
            return
        try:
            async with self.database.connection() as conn:
                await timings.record(conn, deltas)
            await self.database.back()
        except (psycopg.Error, OSError) as exc:
            # An outage is logged like any other, once per outage, not once per flush; metrics are not worth
            # a worker's shutdown waiting for the database. Any other error is raised: the next flush would
            # fail the same way.
            await self.database.failed("recording timings (kept for the next flush)", exc)
            return
        self.stats.timings.mark_flushed(deltas)
