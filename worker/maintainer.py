"""The maintainer: every HEARTBEAT_INTERVAL, the worker's heartbeat row, recovery of expired leases,
forgetting workers gone silent, and every `retention_interval` a retention pass (one worker of the
cluster at a time). Each is an object of its own with one pass callable alone (`run_once`).

No leader is elected: recovery takes rows with SKIP LOCKED and retention a transaction-level advisory
lock per batch, so any number of workers maintain at once without stepping on each other.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
from datetime import datetime, timedelta

import psycopg
from dygo.store import leases, limits, maintenance
from dygo.store.config import Settings
from dygo.worker.database import WorkerConnections

log = logging.getLogger("dygo.worker")

HEARTBEAT_INTERVAL = 5.0
STALE_AFTER = HEARTBEAT_INTERVAL * 12  # a worker silent this long is gone from the workers list


class Heartbeat:
    def __init__(self, database: WorkerConnections, worker_id: str, queues: dict[str, int]) -> None:
        self.database = database
        self.worker_id = worker_id
        self.queues = queues

    async def run_once(self) -> None:
        async with self.database.connection() as conn:
            await leases.heartbeat(conn, self.worker_id, socket.gethostname(), os.getpid(), self.queues)

    async def gone(self) -> None:
        """Remove the worker's row at its stop. In an outage it is left to age out of the list (STALE_AFTER)."""
        try:
            async with self.database.connection() as conn:
                await leases.worker_gone(conn, self.worker_id)
        except (psycopg.Error, OSError) as exc:
            await self.database.failed("removing the worker's row", exc)


# A pass looks at the deadlines from the database's clock when the previous one began, less this much: a
# lease renewed or claimed by a transaction that committed late, a row another pass had locked and let go.
# The clock is the database's, not this process's: a pass that waited for its connection (a stalled server,
# a busy shared connection) would otherwise leave a gap behind the one before it, found only by a whole pass.
RECOVERY_MARGIN = timedelta(seconds=5)
WHOLE_RECOVERY_INTERVAL = 60.0  # and a pass over every deadline this often, whatever a window missed


class Recovery:
    """Expired leases back to their queue (or dead as poison). The producer runs a pass before its first
    claim after start and after an outage, and at most every RECOVER_INTERVAL after a claim."""

    def __init__(self, database: WorkerConnections, max_reaps: int) -> None:
        self.database = database
        self.max_reaps = max_reaps
        self.last = 0.0  # monotonic time of the last pass
        self.covered: datetime | None = None  # the clock of the last pass that finished: deadlines before it are done
        self.last_whole = float("-inf")

    async def run_once(self) -> None:
        self.last = started = time.monotonic()
        whole = started - self.last_whole >= WHOLE_RECOVERY_INTERVAL or self.covered is None
        since = None if whole or self.covered is None else self.covered - RECOVERY_MARGIN
        async with self.database.connection() as conn:
            recovered = await leases.recover_expired(conn, self.max_reaps, since)
        # A full batch may have left expired leases behind: the next pass starts where this one did.
        if len(recovered.jobs) < leases.RECOVER_BATCH:
            self.covered = recovered.clock
            if whole:
                self.last_whole = started
        for job_id, state in recovered.jobs:
            log.warning(
                "job %s: lease expired, %s",
                job_id,
                "dead as poison (recovered too often)" if state == "dead" else "back to pending",
            )


class StaleWorkers:
    def __init__(self, database: WorkerConnections) -> None:
        self.database = database

    async def run_once(self) -> None:
        async with self.database.connection() as conn:
            await leases.forget_stale_workers(conn, STALE_AFTER)


class Retention:
    """A retention pass (store/maintenance.py) every `retention_interval`, with the periods of the settings;
    each batch takes the shared connection on its own."""

    def __init__(self, database: WorkerConnections, settings: Settings) -> None:
        self.database = database
        self.settings = settings
        self.next_pass = 0.0  # monotonic time of the next pass
        self.walk = maintenance.SucceededWalk()

    def due(self) -> bool:
        return time.monotonic() >= self.next_pass

    async def run_once(self) -> None:
        self.next_pass = time.monotonic() + self.settings.retention_interval
        periods = maintenance.RetentionPeriods.from_settings(self.settings)
        trimmed = await maintenance.trim(self.database.connection, periods, self.walk)
        async with self.database.connection() as conn:
            await limits.trim_starts(conn)  # the rate limits' start log: rows older than their window
        if trimmed is not None and trimmed.total():
            log.info("retention: trimmed %s", trimmed.summary())


class Maintainer:
    name = "maintainer"

    def __init__(self, heartbeat: Heartbeat, recovery: Recovery, stale: StaleWorkers, retention: Retention) -> None:
        self.heartbeat = heartbeat
        self.recovery = recovery
        self.stale = stale
        self.retention = retention
        self.database = heartbeat.database

    async def run(self) -> None:
        while True:
            await asyncio.sleep(HEARTBEAT_INTERVAL)
            await self.run_once()

    async def run_once(self) -> None:
        try:
            await self.heartbeat.run_once()
            await self.recovery.run_once()
            await self.stale.run_once()
            if self.retention.due():
                await self.retention.run_once()
            await self.database.back()
        except (psycopg.Error, OSError) as exc:
            await self.database.failed("maintenance", exc)
