"""Claiming ahead: a queue whose recent jobs were short claims beyond its free slots, and the extra jobs wait
here, leased to this worker, until a slot frees.

A job of a millisecond costs a claim and a settle round trip and the statements behind them; claimed one
free slot at a time, those cost more than the job. Claimed ahead, a freed slot starts the next job at once
and a claim takes many jobs per statement. A queue holds ahead what its slots would run in `window`
seconds at the pace of its recent jobs (the time a slot spent on each, smoothed): for jobs of a
millisecond at concurrency 4, tens of jobs; for jobs of 10 ms, two; for jobs of 50 ms or more, none. So
a queue of slow jobs never hoards work another worker could run.

When the slots stop freeing (slow jobs among quick ones hold every slot) and jobs wait here, the waiting
jobs go back to their queue after `hand_back_after` without a slot freed (their attempt refunded, like a
hand-back at shutdown), and the queue claims nothing ahead until its jobs end quickly again. A job
waiting here shows as active, its started_at the time of its claim. A waiting job of a capped kind counts
against its kind's cap (the producer's claim gives the kind its free slots less its waiting jobs). No
claiming ahead under the process cap. Under a cluster-wide limit, a waiting job counts as running, and the
claim admits one only while the limit is at most half used (store/claim.py CLAIM_LIMITED), so a worker never
holds back work that other workers' free slots could run under the limit.
"""

from __future__ import annotations

import math
import time
from collections import Counter, deque

from dygo.store.leases import ClaimedJob

SMOOTHING = 0.2  # weight of the newest job in the smoothed time per job
# A slot spends about this much on a job besides its handler (the task, the log line, the settle's share):
# the pace of no-op jobs, however quick their handlers.
LEAST_PER_JOB = 0.0002


class ClaimAhead:
    """One queue's jobs claimed ahead, and how many it may hold (`may_hold`)."""

    def __init__(self, concurrency: int, window: float, most: int) -> None:
        self.concurrency = concurrency
        self.window = window  # seconds of the slots' work to hold ahead (0: off)
        self.most = most  # never more than one claim takes
        # At least a second: in a fleet that shares few cores, a busy process can go a tenth of a second without
        # running, and a shorter wait would hand back jobs its slots were about to take.
        self.hand_back_after = max(10 * window, 1.0)
        self.waiting: deque[tuple[float, ClaimedJob]] = deque()  # (monotonic time claimed, job), claim order
        self.kinds: Counter[str] = Counter()  # the waiting jobs by kind, for the per-kind caps (worker/producer.py)
        self.per_job = math.inf  # smoothed seconds a slot spent on a job (inf: none ended yet)
        self.last_end = -math.inf  # monotonic time a job of the queue last ended
        self.allowed = True  # False while the process cap or a limit concerns the queue

    def __len__(self) -> int:
        return len(self.waiting)

    def may_hold(self) -> int:
        """How many jobs the queue may hold beyond its free slots now."""
        if not self.allowed or self.window <= 0 or self.per_job == math.inf:
            return 0
        return min(self.most, int(self.concurrency * self.window / max(self.per_job, LEAST_PER_JOB)))

    def ended(self, took: float) -> None:
        """A job of the queue ended after `took` seconds in its slot: learn the pace."""
        self.last_end = time.monotonic()
        self.per_job = took if self.per_job == math.inf else self.per_job + SMOOTHING * (took - self.per_job)

    def hold(self, job: ClaimedJob) -> None:
        self.waiting.append((time.monotonic(), job))
        self.kinds[job.kind] += 1

    def next(self) -> ClaimedJob | None:
        if not self.waiting:
            return None
        job = self.waiting.popleft()[1]
        self.kinds[job.kind] -= 1
        return job

    def stale(self) -> list[ClaimedJob]:
        """Take out the waiting jobs when no slot freed for hand_back_after while they waited: they go back to
        the queue, and the queue holds nothing ahead until its pace is learnt again."""
        if not self.waiting or self.due_in() > 0:
            return []
        return self.release()

    def release(self) -> list[ClaimedJob]:
        """Take out every waiting job, and forget the pace."""
        jobs = [job for _, job in self.waiting]
        self.waiting.clear()
        self.kinds.clear()
        self.per_job = math.inf
        return jobs

    def due_in(self) -> float:
        """Seconds until the waiting jobs are stale unless a slot frees first (inf: none waiting)."""
        if not self.waiting:
            return math.inf
        since = max(self.last_end, self.waiting[0][0])
        return max(0.0, since + self.hand_back_after - time.monotonic())
