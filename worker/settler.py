"""The settler: records finished jobs, a whole batch per statement, fenced by lease token.

Handlers put their outcomes in the outbox (`submit`); the settler's loop settles everything waiting
in one round trip, so at high throughput a batch per round trip, not a round trip per job.

When the producer is about to claim (slots were freed: the jobs that just finished freed them), it
carries the outbox with its claim, one round trip and one transaction for both (worker/producer.py,
store.leases.settle_and_claim), and the settler leaves the batch to it. At concurrency 4 that halves
the round trips per job, and the backends woken for them (issue 12, item 7). The settler settles what
no claim carries: the producer is idle or stopping, its carry failed, or it took longer than
CARRY_WAIT to come by.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Callable
from uuid import UUID

import psycopg
from dygo.store import leases
from dygo.store.leases import ClaimedJob, Outcome, Unsuccessful
from dygo.worker.database import Database
from dygo.worker.service import wait_for_event
from dygo.worker.telemetry import WorkerStats, outcome_name

log = logging.getLogger("dygo.worker")

SETTLE_BATCH = 1000
# How long outcomes wait for the producer's claim to carry them before the settler sends them itself:
# a bound on what carrying can add to a settle, whatever the producer is doing.
CARRY_WAIT = 0.05


class Settler:
    name = "settler"

    def __init__(self, database: Database, leased: dict[UUID, ClaimedJob], stats: WorkerStats,
                 requeued: Callable[[str, float], None] = lambda queue, delay: None,
                 carrier: Callable[[], bool] = lambda: False) -> None:
        self.database = database
        # Whether the producer claims next, and so carries the outbox with its claim (Producer.claims_next).
        self.carrier = carrier
        self.carrying = True  # False from a failed carry until the settler's own settle succeeds
        # Told of each job this worker put back in its queue (retry, snooze): (queue, seconds until due).
        # The producer keeps a timer for it; a poll-only worker gets no NOTIFY for it (issue 14.3).
        self.requeued = requeued
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
            if self.outbox and self.carrying and self.carrier():
                # The producer sets `ready` once it has carried the outbox or failed to: look again then.
                await wait_for_event(self.ready, CARRY_WAIT)
                if self.ready.is_set():
                    continue
            if not self.outbox:
                continue
            # Shielded: cancelled at shutdown between the commit and its reply, a settled batch would
            # stay in the outbox, be sent again by the final flush, be refused, and be reported as lost.
            await asyncio.shield(self.flush())

    async def flush(self) -> None:
        """Settle everything in the outbox; on a database error keep it and retry (leases cover it)."""
        async with self.flushing:
            await self._flush_outbox()

    def to_carry(self) -> list[Outcome]:
        """The batch a claim may carry now (call with `flushing` held; `carried` or `not_carried` after)."""
        return self.outbox[:SETTLE_BATCH] if self.carrying else []

    def carried(self, batch: list[Outcome], settled: set[int]) -> None:
        """A claim settled `batch` (the outbox's head): the ids in `settled` were settled, fenced by token."""
        del self.outbox[:len(batch)]
        self._record(batch, settled)
        self.ready.set()

    def not_carried(self) -> None:
        """A claim carrying the outbox failed: settle it alone, and carry nothing until that works."""
        self.carrying = False
        self.ready.set()

    async def _flush_outbox(self) -> None:
        delay = 0.1
        while self.outbox:
            # Removed from the outbox only once settled, so a cancelled flush loses nothing.
            batch = self.outbox[:SETTLE_BATCH]
            try:
                async with self.database.connection() as conn:
                    settled = await leases.settle(conn, batch)
                del self.outbox[:len(batch)]
                self.carrying = True
                await self.database.back()
            except (psycopg.Error, OSError) as exc:
                await self.database.lost(f"settling {len(batch)} job(s)", exc)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 10.0)
                continue
            self._record(batch, settled)

    def _record(self, batch: list[Outcome], settled: set[int]) -> None:
        for outcome in batch:
            self.leased.pop(outcome.job.lease_token, None)
            if outcome.job.id not in settled:
                log.warning("job %s: lease lost before settling; its outcome was discarded", outcome.job.id)
            elif isinstance(outcome, Unsuccessful) and outcome.state == "pending":
                self.requeued(outcome.job.queue, outcome.delay)
        outcomes = Counter(outcome_name(o) for o in batch if o.job.id in settled)
        self.stats.settled_batch(outcomes, len(batch) - outcomes.total())
