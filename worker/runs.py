"""The jobs this worker has claimed and not settled yet, and the handlers running them.

`leased` is written by the producer (a claim adds) and the settler (a settle removes), and read by
the lease keeper (what to renew), the progress writer (the lease tokens that fence its writes) and
the drain at shutdown. It is keyed by lease token, not job id: a job whose lease ran out while this
worker was cut off (a database restart, a long pause) can be recovered and claimed by this same
worker again while its first run is still going; by id, the two runs overwrote each other's entries.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from dygo.store import tracing
from dygo.store.leases import ClaimedJob, Unsuccessful
from dygo.worker.executor import Executor
from dygo.worker.progress import ProgressWriter
from dygo.worker.settler import Settler
from dygo.worker.telemetry import WorkerStats, outcome_name

log = logging.getLogger("dygo.worker")


class Runs:
    def __init__(
        self,
        leased: dict[str, ClaimedJob],
        executor: Executor,
        settler: Settler,
        progress: ProgressWriter,
        stats: WorkerStats,
    ) -> None:
        self.leased = leased
        self.tasks: dict[str, asyncio.Task[None]] = {}  # handlers still running, by lease token
        # Jobs started, and their `finished`: their tasks are made on the loop's next turn (`start`).
        self.starting: list[tuple[list[ClaimedJob], Callable[[ClaimedJob, float], None]]] = []
        self.executor = executor
        self.settler = settler
        self.progress = progress
        self.stats = stats
        # Decided once: a TracerProvider is configured when the job modules are imported (or by
        # opentelemetry-instrument), before a worker exists; untraced, a job pays nothing for tracing.
        self.traced = tracing.active()

    def start(self, jobs: list[ClaimedJob], finished: Callable[[ClaimedJob, float], None]) -> None:
        """Run each claimed job's handler in a task; `finished` is called when one ends, whatever happened, with
        the seconds its slot spent on it. The tasks are made on the loop's next turn: the producer's next claim
        is on its way by then, and the server works on it while these jobs run."""
        self.stats.claimed_jobs(jobs)
        for job in jobs:
            self.leased[job.lease_token] = job
        if not self.starting:
            asyncio.get_running_loop().call_soon(self._launch)
        self.starting.append((jobs, finished))

    def _launch(self) -> None:
        """Make the tasks of the jobs `start` was given."""
        starting, self.starting = self.starting, []
        create_task = asyncio.get_running_loop().create_task
        for jobs, finished in starting:
            for job in jobs:
                self.tasks[job.lease_token] = create_task(self._execute(job, finished))

    def hold(self, job: ClaimedJob) -> None:
        """A job claimed ahead, waiting for a slot (worker/ahead.py): leased, so its lease is renewed."""
        self.leased[job.lease_token] = job

    def hand_back(self, jobs: list[ClaimedJob], what: str, why: str = "") -> None:
        """Put claimed jobs that did not run (to the end) straight back in their queue, their attempt refunded."""
        log.warning(
            "handing back %d %s job(s)%s: %s",
            len(jobs),
            what,
            f" ({why})" if why else "",
            ", ".join(str(j.id) for j in jobs),
        )
        for job in jobs:
            self.settler.submit(
                Unsuccessful(job, "pending", refund_attempt=True, progress=self.progress.take(job.lease_token))
            )

    async def _execute(self, job: ClaimedJob, finished: Callable[[ClaimedJob, float], None]) -> None:
        if job.not_before is not None and not await self._at_start_time(job):
            del self.tasks[job.lease_token]
            finished(job, 0.0)
            return
        began = time.monotonic()
        try:
            if self.traced:
                with tracing.execution_span(job) as span:
                    outcome, elapsed = await self.executor.run(job)
                    tracing.record_outcome(span, outcome_name(outcome), getattr(outcome, "error", None))
            else:
                outcome, elapsed = await self.executor.run(job)
            outcome.progress = self.progress.take(job.lease_token)  # stored by the settle
            self.stats.executed(job.queue, job.kind, outcome_name(outcome), elapsed)
            self.settler.submit(outcome)
        finally:
            del self.tasks[job.lease_token]
            finished(job, time.monotonic() - began)

    async def _at_start_time(self, job: ClaimedJob) -> bool:
        """Wait for a rate-limited job's start time (its slot is taken meanwhile). False when this process woke
        after its `start_by` (CPU starved, its loop busy, under a limit in use): the job goes back to its queue
        for a start time of its own, rather than start where the limit's spacing no longer holds."""
        assert job.not_before is not None
        if (delay := job.not_before - time.monotonic()) > 0:
            await asyncio.sleep(delay)
        if job.start_by is None or time.monotonic() <= job.start_by:
            return True
        late = time.monotonic() - job.not_before
        self.hand_back([job], "rate-limited", f"woke {late * 1000:.0f} ms after its start time")
        return False

    async def wait(self) -> None:
        """Until every running handler has ended (--once)."""
        self._launch()
        await asyncio.gather(*self.tasks.values())

    async def drain(self, timeout: float) -> None:
        """Let running jobs finish within `timeout`, then hand the rest straight back to their queue."""
        self._launch()
        if self.tasks:
            await asyncio.wait(list(self.tasks.values()), timeout=timeout)
        unfinished = [self.leased[token] for token in self.tasks]
        running = list(self.tasks.values())
        for task in running:
            task.cancel()
        await asyncio.gather(*running, return_exceptions=True)
        if unfinished:
            self.hand_back(unfinished, "unfinished")
