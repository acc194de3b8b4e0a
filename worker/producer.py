"""The producer: claims ready jobs for every queue this worker serves and starts them.

One loop and one connection for all queues: each claim is one statement that takes, for each queue
with free slots, at most that many jobs in the seed's order (store/queries.py CLAIM_JOBS). A queue
is claimed for while it is *armed*: something says it may have ready jobs (a NOTIFY for it, its
timer, a claim that came back full, the start). A claim that comes back short disarms it until a
NOTIFY or its timer: the next pending job's run_at (a retry this worker scheduled itself, a delayed
job) or the poll interval, whichever is first.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections import Counter

import psycopg
from dygo.store import leases
from dygo.store.leases import ClaimedJob
from dygo.worker.database import Database
from dygo.worker.maintainer import Recovery
from dygo.worker.runs import Runs
from dygo.worker.service import failure_backoff, wait_for_event

RECOVER_INTERVAL = 1.0  # at most this often after a claim, so recovery stays cheap under load


class QueueSlots:
    """One queue's capacity in this process, and whether the producer should claim for it."""

    def __init__(self, name: str, concurrency: int) -> None:
        self.name = name
        self.concurrency = concurrency
        self.running = 0
        self.armed = True  # it may have ready jobs: claim for it when it has free slots
        self.due_at = math.inf  # monotonic time its timer arms it (inf: armed already, no timer)

    @property
    def free(self) -> int:
        return self.concurrency - self.running

    def batch_threshold(self) -> int:
        # Claim in batches once saturated, not one job per freed slot.
        return max(1, self.concurrency // 4)


class Producer:
    name = "producer"

    def __init__(self, database: Database, slots: dict[str, QueueSlots], runs: Runs, recovery: Recovery,
                 worker_id: str, lease_ttl: float, batch_size: int, poll_interval: float) -> None:
        self.database = database
        self.slots = slots
        self.runs = runs
        self.recovery = recovery
        self.worker_id = worker_id
        self.lease_ttl = lease_ttl
        self.batch_size = batch_size
        self.poll_interval = poll_interval
        self.wake = asyncio.Event()  # a NOTIFY, a freed slot, or stop
        self.stopping = asyncio.Event()
        self.conn: psycopg.AsyncConnection | None = None  # the claim connection (worker/database.py)
        # The seed: a worker recovers expired leases before it claims. Its first claim after start and
        # after an outage follows a recovery pass; afterwards recovery follows claims, off the wake-up path.
        self.recover_first = True

    # --- signals, from the listener, finished jobs and the worker ---------------------------------

    def wake_queue(self, name: str) -> None:
        slots = self.slots.get(name)
        if slots is not None:
            slots.armed = True
            self.wake.set()

    def wake_all(self) -> None:
        for slots in self.slots.values():
            slots.armed = True
        self.wake.set()

    def finished(self, job: ClaimedJob) -> None:
        self.slots[job.queue].running -= 1
        self.wake.set()

    def requeued(self, name: str, delay: float) -> None:
        """This worker put a job of `name` back, due in `delay` seconds: claim for the queue then."""
        slots = self.slots.get(name)
        if slots is not None:
            slots.due_at = min(slots.due_at, time.monotonic() + max(delay, 0.0) + 0.005)
            self.wake.set()  # the idle wait takes the new timer into account

    def stop(self) -> None:
        self.stopping.set()
        self.wake.set()

    # --- the loop ------------------------------------------------------------------------------------

    async def run(self) -> None:
        try:
            await self._produce()
        finally:
            if self.conn is not None:
                await self.conn.close()
                self.conn = None

    async def _produce(self) -> None:
        failures = 0
        while not self.stopping.is_set():
            self.wake.clear()
            wanted = self._wanted()
            if not wanted:
                await wait_for_event(self.wake, self._until_next_timer())
                continue
            reused = self.conn is not None
            try:
                if self.conn is None:
                    self.conn = await self.database.connect()
                if self.recover_first or self.database.outage.down:
                    await self.recovery.run_once()
                    self.recover_first = False
                for name in wanted:  # a NOTIFY during the claim arms it again
                    self.slots[name].armed = False
                claimed = await self.claim(self.conn, wanted)
                failures = 0
                await self.database.back()
                # Recovery comes right after a claim rather than before it, to keep its round trip
                # off the path from a wake-up to a started job; what it recovers wakes us again.
                if time.monotonic() - self.recovery.last >= RECOVER_INTERVAL:
                    await self.recovery.run_once()
                counts = Counter(job.queue for job in claimed)
                short = [name for name, n in wanted.items() if counts[name] < n]
                for name, n in wanted.items():
                    if counts[name] == n:
                        self.slots[name].armed = True  # there may be more ready right now
                if short:
                    await self._set_timers(self.conn, short)
            except (psycopg.Error, OSError) as exc:
                self.recover_first = True
                for name in wanted:
                    self.slots[name].armed = True
                if self.conn is not None:
                    await self.conn.close()
                    self.conn = None
                if reused:
                    # A connection left idle through a database restart fails on its first use after
                    # it: a fresh one decides, at once, whether the database is really away.
                    continue
                failures += 1
                await self.database.lost(f"claim from queue(s) {', '.join(wanted)}", exc)
                await wait_for_event(self.stopping, failure_backoff(failures))

    def _wanted(self) -> dict[str, int]:
        """How many jobs to claim per queue now: armed queues with enough free slots."""
        now = time.monotonic()
        wanted = {}
        for slots in self.slots.values():
            if slots.due_at <= now:
                slots.armed, slots.due_at = True, math.inf
            if slots.armed and slots.free >= slots.batch_threshold():
                wanted[slots.name] = min(slots.free, self.batch_size)
        return wanted

    def _until_next_timer(self) -> float:
        due = min((s.due_at for s in self.slots.values()), default=math.inf)
        return self.poll_interval if due == math.inf else max(0.0, due - time.monotonic())

    async def _set_timers(self, conn: psycopg.AsyncConnection, queues: list[str]) -> None:
        """Arm each queue again when its next pending job is due, or after the poll interval."""
        due = await leases.seconds_to_next_run(conn, queues)
        now = time.monotonic()
        for name in queues:
            wait = self.poll_interval
            if name in due:
                wait = min(wait, max(due[name], 0.0) + 0.005)
            self.slots[name].due_at = now + wait

    async def claim(self, conn: psycopg.AsyncConnection, wanted: dict[str, int]) -> list[ClaimedJob]:
        """Claim up to wanted[queue] jobs per queue in one statement and start them."""
        claimed = await leases.claim_queues(conn, wanted, self.worker_id, self.lease_ttl)
        for job in claimed:
            self.slots[job.queue].running += 1
            self.runs.start(job, self.finished)
        return claimed
