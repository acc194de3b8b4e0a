"""Presence: a dead worker's jobs come back in seconds, not after its lease TTL.

Each worker holds a session-level advisory lock keyed by its id (store/leases.py hold_presence) on a session
of its own straight to PostgreSQL: the listener's connection (worker/listener.py), on DATABASE_DIRECT_URL
behind a transaction pooler. The server releases the lock when that session ends, which it sees at once when
the worker's process dies on a live host (the kernel closes its sockets). Every worker's watch looks each
PRESENCE_INTERVAL at whose locks are held; a worker it saw holding its lock, whose lock has been free for
ABSENCE_GRACE since, is gone, and its active jobs go back to their queue with the fencing of an expired lease
(store/sql/leases.py RECOVER_ABSENT_WORKERS): a settle from it, should it be alive after all, changes nothing.

* The grace covers a worker whose session alone was cut (a terminated backend, a pooler's restart): it takes
  its lock again as soon as its session is back.
* The watch forgets what it saw at every outage of its own worker and whenever the server's start time
  changes (a restart, a failover to another server): afterwards only a lock seen held again counts, so a
  worker still reconnecting after a restart is never taken for dead. A worker that died meanwhile is left
  to its lease.
* The lease stays the rule of last resort: for a worker that never held a lock (behind a transaction pooler
  without DATABASE_DIRECT_URL), a worker alive but cut off whose sessions the server has not seen end, and a
  host that vanished without closing its connections (the server notices only when its TCP keepalives give
  up: tcp_keepalives_idle and friends).
* A worker paused (SIGSTOP) keeps its session open, and so its lock and its jobs, until its lease runs out.
"""

from __future__ import annotations

import asyncio
import logging
import time
from datetime import datetime

import psycopg
from dygo.store import leases
from dygo.worker.database import WorkerConnections

log = logging.getLogger("dygo.worker")

PRESENCE_INTERVAL = 1.0  # seconds between two looks at the presence locks
ABSENCE_GRACE = 1.5  # how long a lock seen held must stay free before its worker counts as gone


class PresenceWatch:
    """Finds workers gone (their presence lock free for ABSENCE_GRACE) and recovers their active jobs."""

    name = "presence-watch"

    def __init__(self, database: WorkerConnections, worker_id: str, max_reaps: int) -> None:
        self.database = database
        self.worker_id = worker_id  # this worker: alive by definition, whatever its lock says
        self.max_reaps = max_reaps
        self.server_started: datetime | None = None
        self.outages = database.outage.outages
        self.seen: set[str] = set()  # workers seen holding their lock since the last forget
        self.free_since: dict[str, float] = {}  # of those, when each was first found free (monotonic)

    async def run(self) -> None:
        while True:
            await self.run_once()
            await asyncio.sleep(PRESENCE_INTERVAL)

    async def run_once(self) -> None:
        try:
            gone = await self.look()
            if gone:
                async with self.database.connection() as conn:
                    recovered = await leases.recover_absent(conn, gone, self.max_reaps)
                for job_id, state in recovered.jobs:
                    log.warning(
                        "job %s: its worker is gone (its session to the database ended), %s",
                        job_id,
                        "dead as poison (recovered too often)" if state == "dead" else "back to pending",
                    )
            await self.database.back()
        except (psycopg.Error, OSError) as exc:
            self.forget()
            await self.database.failed("watching for workers gone", exc)

    async def look(self) -> list[str]:
        """One look at the presence locks; the workers gone (free for ABSENCE_GRACE after being seen held)."""
        async with self.database.connection() as conn:
            presence = await leases.worker_presence(conn)
        if presence.server_started != self.server_started or self.database.outage.outages != self.outages:
            self.forget()
            self.server_started = presence.server_started
            self.outages = self.database.outage.outages
        now = time.monotonic()
        for worker in self.seen - presence.held.keys():  # its row is gone: stopped, or forgotten as stale
            self.seen.discard(worker)
            self.free_since.pop(worker, None)
        for worker, held in presence.held.items():
            if held:
                self.seen.add(worker)
                self.free_since.pop(worker, None)
            elif worker in self.seen and worker != self.worker_id:
                self.free_since.setdefault(worker, now)
        return sorted(w for w, since in self.free_since.items() if now - since >= ABSENCE_GRACE)

    def forget(self) -> None:
        self.seen.clear()
        self.free_since.clear()
