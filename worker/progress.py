"""Progress reports from running handlers, written at most once a second per job while it runs.

`ctx.progress(fraction, message)` only records the latest value in memory (from the event loop or
from a sync handler's thread); a loop writes what changed since its last write in one statement
for all jobs, fenced by each job's lease token like a settle. So a handler may report in a tight
loop: the database sees one write per second for it, never more.

When a run ends, the worker takes its latest report (`take`) and the settle stores it in the same
statement, fenced by the same lease token (store/leases.py): a finished job shows the last thing its
handler reported, successful or not, even when that came less than a second after the previous
write. A job that never reported costs no write and no round trip.
"""

from __future__ import annotations

import asyncio
import threading
import time

import psycopg
from dygo.store import leases
from dygo.store.leases import ClaimedJob, Progress
from dygo.worker.database import WorkerConnections

INTERVAL = 1.0


class ProgressWriter:
    name = "progress"

    def __init__(self, database: WorkerConnections, leased: dict[str, ClaimedJob]) -> None:
        self.database = database  # its outage log: a failed write during an outage is not logged once per second
        self.leased = leased  # the worker's claimed-and-not-settled jobs: their lease tokens fence the write
        # The latest report of each run, by lease token like the worker's leases, kept after it is written
        # until the run ends (take) so its settle can store it; `changed`: not written yet.
        self.latest: dict[str, Progress] = {}
        self.changed: set[str] = set()
        self.pending = False  # a report is waiting for the next write (ready is set or about to be)
        self.lock = threading.Lock()  # sync handlers report from their own threads
        self.ready = asyncio.Event()
        self.loop: asyncio.AbstractEventLoop | None = None
        self.last_write = 0.0

    def start(self) -> asyncio.Task[None]:
        self.loop = asyncio.get_running_loop()
        return asyncio.create_task(self.run(), name=self.name)

    def report(self, lease_token: str, fraction: float, message: str | None) -> None:
        """Record the latest progress of a job's current run; callable from any thread."""
        with self.lock:
            self.latest[lease_token] = (fraction, message)
            self.changed.add(lease_token)
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

    def take(self, lease_token: str) -> Progress | None:
        """The latest report of a run that has ended, for its settle to store; None if it never reported.
        The run is forgotten here; only a sync handler abandoned at its timeout can report after this, and
        such a report is written, if at all, by the loop while the settle is still pending."""
        if not self.latest:  # the usual case, without the lock: no handler is reporting at all
            return None
        with self.lock:
            self.changed.discard(lease_token)
            return self.latest.pop(lease_token, None)

    async def run(self) -> None:
        self.loop = asyncio.get_running_loop()
        while True:
            await self.ready.wait()
            await asyncio.sleep(max(0.0, self.last_write + INTERVAL - time.monotonic()))
            self.ready.clear()
            with self.lock:
                changed, self.changed, self.pending = self.changed, set(), False
                # A run no longer leased has been settled (or taken): a report after that (a sync handler
                # abandoned at its timeout keeps running) is dropped, not kept forever.
                for token in [t for t in self.latest if t not in self.leased]:
                    del self.latest[token]
                jobs = [(self.leased[token], self.latest[token]) for token in changed if token in self.latest]
            if not jobs:
                continue
            try:
                async with self.database.connection() as conn:
                    await leases.report_progress(conn, jobs)
                await self.database.back()
            except (psycopg.Error, OSError) as exc:
                # Progress is advisory: after an outage the next report carries the then-latest value anyway.
                await self.database.failed(f"writing the progress of {len(jobs)} job(s)", exc)
            finally:
                # Counted from the write's end, not its start: a write that waited for the shared connection
                # must not leave the next one less than a second after it in the database's time.
                self.last_write = time.monotonic()
