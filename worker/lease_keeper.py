"""The lease keeper: extends the leases of everything claimed and not yet settled, at half the TTL.

If it stopped, leases would run out under running jobs and other workers would run them again: a
lease keeper that dies on anything but an outage stops the worker (worker/runtime.py).
"""

from __future__ import annotations

import asyncio
import logging

import psycopg
from dygo.store import leases
from dygo.store.leases import ClaimedJob
from dygo.worker.database import WorkerConnections

log = logging.getLogger("dygo.worker")


class LeaseKeeper:
    name = "lease-keeper"

    def __init__(self, database: WorkerConnections, leased: dict[str, ClaimedJob], ttl: float) -> None:
        self.database = database
        self.leased = leased  # read only: worker/runs.py
        self.ttl = ttl

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self.ttl / 2)
            await self.renew_once()

    async def renew_once(self) -> None:
        jobs = list(self.leased.values())
        if not jobs:
            # Nothing to renew, so no round trip: a pool checkout alone proves nothing, and counted as a
            # success it logged a false "connection back" while PostgreSQL was still restarting.
            return
        try:
            async with self.database.connection() as conn:
                held = await leases.renew(conn, jobs, self.ttl)
            await self.database.back()
        except (psycopg.Error, OSError) as exc:
            await self.database.failed(f"renewing {len(jobs)} lease(s)", exc)
            return
        for job in jobs:
            if job.id not in held and job.lease_token in self.leased:
                log.warning("job %s: lease lost (recovered by another worker); its outcome will be discarded", job.id)
