"""The scheduler: fires due cron schedules, sleeping until the next fire time, a NOTIFY that a schedule
changed (`changed`, set by the listener), or the poll interval.

Firing is safe on any number of workers: each due schedule is fired in a transaction that locks its
row with SKIP LOCKED (store/schedules.py), so every occurrence enqueues one job.
"""

from __future__ import annotations

import asyncio
import logging

import psycopg
from dygo.store import schedules
from dygo.store.registry import Registry
from dygo.worker.database import WorkerConnections
from dygo.worker.service import failure_backoff, wait_for_event

log = logging.getLogger("dygo.worker")

LOCKED_RETRY = 0.25  # a due schedule another worker is firing: its fire takes milliseconds


class Scheduler:
    name = "scheduler"

    def __init__(self, database: WorkerConnections, jobs: Registry, poll_interval: float) -> None:
        self.database = database
        self.jobs = jobs
        self.poll_interval = poll_interval
        self.changed = asyncio.Event()  # a NOTIFY: some schedule may be due sooner

    async def sync(self) -> None:
        """Bring the schedules table in line with this process's declarations (at start)."""
        async with self.database.connection() as conn:
            changes = await schedules.sync(conn, self.jobs.schedules.values())
        if changes:
            log.info("schedules synced: %s", changes)

    async def fire_due(self) -> None:
        async with self.database.connection() as conn:
            fired = await schedules.fire_due(conn)
        for f in fired:
            when = f"occurrence {f.occurrence.isoformat()}"
            if f.error:
                log.error("schedule %s %s: %s", f.name, when, f.error)
            elif f.skipped:
                log.warning("schedule %s %s missed, skipped (missed: skip)", f.name, when)
            else:
                log.info(
                    "schedule %s %s fired: job %s%s",
                    f.name,
                    when,
                    f.job_id,
                    " (already enqueued)" if f.deduplicated else "",
                )

    async def run(self) -> None:
        failures = 0
        while True:
            self.changed.clear()
            try:
                await self.fire_due()
                async with self.database.connection() as conn:
                    due_in = await schedules.seconds_to_next_fire(conn)
                failures = 0
                await self.database.back()
                wait = self.poll_interval
                if due_in is not None:
                    # Due yet not fired: another worker holds it this instant; look again shortly.
                    wait = min(wait, due_in + 0.005 if due_in > 0 else LOCKED_RETRY)
            except (psycopg.Error, OSError) as exc:
                # A schedule that cannot fire (its args, its spec) is recorded on it by fire_due; what ends up
                # here is the database's: an outage is retried, anything else stops the worker.
                failures += 1
                wait = failure_backoff(failures)
                await self.database.failed("firing schedules", exc)
            await wait_for_event(self.changed, wait)
