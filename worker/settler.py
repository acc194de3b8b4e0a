"""The settler: records finished jobs, a whole batch per statement, fenced by lease token.

Handlers put their outcomes in the outbox (`submit`); the settler's loop settles everything waiting
in one round trip, so at high throughput a batch per round trip, not a round trip per job.

What a settle means for claiming goes to the worker's producer through `QueueWakeups`: a job put back in
its queue (a retry or snooze, due later), and slots freed under a cluster-wide limit.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from typing import Protocol

import psycopg
from dygo.store import events, leases, limits
from dygo.store.leases import ClaimedJob, Outcome, Succeeded, Unsuccessful, settle_delay
from dygo.worker.database import WorkerConnections
from dygo.worker.telemetry import WorkerStats, outcome_name

log = logging.getLogger("dygo.worker")

SETTLE_BATCH = 1000


class QueueWakeups(Protocol):
    """What the settler tells the claiming side (worker/producer.py Producer) about the queues it settled."""

    def requeued(self, queue: str, delay: float) -> None:
        """A job of `queue` was put back in line, due in `delay` seconds (a retry, a snooze): claim for the
        queue then (a poll-only worker gets no NOTIFY for it)."""

    def limit_in_use(self, queue: str) -> bool:
        """Whether a limit held back a claim of `queue` in this worker lately: only then may a slot freed there
        be awaited, here or in another worker (a limit never reached holds nobody back, and its settles wake
        nobody; a worker held back meanwhile claims again at its recheck timer)."""

    def claims_freed_slots(self, queue: str) -> bool:
        """Whether this worker claims at once for `queue` when a settle frees slots of a limit there; if not,
        the settle wakes every worker (a NOTIFY)."""

    def limit_slots_freed(self, queues: list[str]) -> None:
        """A settle freed slots of a limit in `queues` (committed), each of which `claims_freed_slots`."""


class NoWakeups:
    """The wake-ups of a settler not wired to a producer: nothing is claimed again, every worker is woken."""

    def requeued(self, queue: str, delay: float) -> None:
        pass

    def limit_in_use(self, queue: str) -> bool:
        return True

    def claims_freed_slots(self, queue: str) -> bool:
        return False

    def limit_slots_freed(self, queues: list[str]) -> None:
        pass


class Settler:
    name = "settler"

    def __init__(self, database: WorkerConnections, leased: dict[str, ClaimedJob], stats: WorkerStats) -> None:
        self.database = database
        # Set to the worker's producer by worker/runtime.py once it exists (the producer needs the runs, and
        # the runs need this settler).
        self.wakeups: QueueWakeups = NoWakeups()
        self.leased = leased  # the worker's claimed-and-not-settled jobs (worker/runs.py): settled ones leave it
        self.stats = stats
        self.outbox: list[Outcome] = []  # finished, waiting to be settled; written by handlers and the drain
        self.ready = asyncio.Event()
        self.flushing = asyncio.Lock()  # one settle at a time: the loop's and shutdown's final one

    def submit(self, outcome: Outcome) -> None:
        self.outbox.append(outcome)
        self.ready.set()

    async def run(self) -> None:
        while True:
            await self.ready.wait()
            self.ready.clear()
            # Shielded: cancelled at shutdown between the commit and its reply, a settled batch would
            # stay in the outbox, be sent again by the final flush, be refused, and be reported as lost.
            await asyncio.shield(self.flush())

    async def flush(self) -> None:
        """Settle everything in the outbox; in an outage keep it and retry (leases cover it). A batch the server
        rolled back as a deadlock's victim is settled again at once, once. Any other database error (or that one
        twice running) is raised (WorkerConnections.failed): the batch stays in the outbox, its leases run out,
        and another worker recovers its jobs."""
        async with self.flushing:
            await self._flush_outbox()

    async def _flush_outbox(self) -> None:
        delay = 0.1
        while self.outbox:
            # Removed from the outbox only once settled, so a cancelled flush loses nothing.
            batch = self.outbox[:SETTLE_BATCH]
            try:
                async with self.database.connection() as conn:
                    freed = [
                        queue
                        for queue in await limits.freed_queues(conn, [o.job for o in batch])
                        if self.wakeups.limit_in_use(queue)
                    ]
                    claimed_here = [queue for queue in freed if self.wakeups.claims_freed_slots(queue)]
                    to_notify = [queue for queue in freed if queue not in claimed_here]  # wakes every worker
                    settled = await leases.settle(conn, batch, to_notify)
                del self.outbox[: len(batch)]
                if claimed_here:
                    self.wakeups.limit_slots_freed(claimed_here)
                await self.database.back()
            except (psycopg.Error, OSError) as exc:
                # An event wait that met an emit in flight (store/events.py recheck): its job checks again soon.
                again = events.recheck(batch) if isinstance(exc, psycopg.errors.LockNotAvailable) else None
                if again is not None:
                    self.outbox[: len(batch)] = again
                    continue
                await self.database.failed(f"settling {len(batch)} job(s)", exc)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 10.0)
                continue
            succeeded, outcomes = 0, Counter[str]()  # successes counted apart: the usual batch has nothing else
            for outcome in batch:
                job = outcome.job
                self.leased.pop(job.lease_token, None)
                if job.id not in settled:
                    log.warning("job %s: lease lost before settling; its outcome was discarded", job.id)
                elif type(outcome) is Succeeded:
                    succeeded += 1
                elif isinstance(outcome, Unsuccessful):
                    outcomes[outcome_name(outcome)] += 1
                    if outcome.state == "pending":
                        self.wakeups.requeued(job.queue, settle_delay(outcome))
            if succeeded:
                outcomes["succeeded"] = succeeded
            self.stats.settled_batch(outcomes, len(batch) - outcomes.total())
