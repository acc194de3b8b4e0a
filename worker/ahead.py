"""Claiming ahead: a queue whose recent jobs were short claims beyond its free slots, and the extra jobs wait
here, leased to this worker, until a slot frees (issue 12, item 7).

A job of a millisecond costs a claim and a settle round trip and the statements behind them; claimed one
free slot at a time, those cost more than the job. Claimed ahead, a freed slot starts the next job at once
and a claim takes many jobs per statement. What a queue holds ahead is about `window` seconds of its
recent throughput (the interval between its jobs' ends, smoothed): for jobs of a millisecond, tens of jobs;
for jobs of a second, none. So a job waits here about `window` at most while its slots keep going, and a
queue of slow jobs never hoards work another worker could run.

When the slots stop freeing (a slow job among quick ones), the jobs waiting here longer than
`hand_back_after` go back to their queue (their attempt refunded, like a hand-back at shutdown), and the
queue claims nothing ahead until its jobs end quickly again. A job waiting here shows as active, its
started_at the time of its claim. A waiting job of a capped kind counts against its kind's cap (the
producer's claim gives the kind its free slots less its waiting jobs). No claiming ahead under the process
cap, nor for a queue a cluster-wide limit concerns (it would count a waiting job as running).
"""

from __future__ import annotations

import math
import time
from collections import deque

from dygo.store.leases import ClaimedJob

SMOOTHING = 0.2  # weight of the newest interval between two jobs' ends
FASTEST = 1e-5  # an interval shorter than this counts as this (no-op jobs ending in the same loop pass)


class Ahead:
    """One queue's jobs claimed ahead, and how many it may hold."""

    def __init__(self, window: float, most: int) -> None:
        self.window = window  # seconds of recent throughput to hold ahead (0: off)
        self.most = most  # never more than one claim takes
        self.hand_back_after = max(10 * window, 0.1)
        self.waiting: deque[tuple[float, ClaimedJob]] = deque()  # (monotonic time claimed, job), claim order
        self.interval = math.inf  # smoothed seconds between two jobs' ends (inf: nothing known yet)
        self.last_end: float | None = None
        self.allowed = True  # False while a cap or a limit concerns the queue

    def __len__(self) -> int:
        return len(self.waiting)

    def count(self) -> int:
        """How many jobs the queue may hold beyond its free slots now."""
        if not self.allowed or self.window <= 0 or self.interval == math.inf:
            return 0
        return min(self.most, int(self.window / max(self.interval, FASTEST)))

    def ended(self) -> None:
        """A job of the queue ended: learn the pace."""
        now = time.monotonic()
        if self.last_end is not None:
            gap = now - self.last_end
            self.interval = gap if self.interval == math.inf else self.interval + SMOOTHING * (gap - self.interval)
        self.last_end = now

    def hold(self, job: ClaimedJob) -> None:
        self.waiting.append((time.monotonic(), job))

    def next(self) -> ClaimedJob | None:
        return self.waiting.popleft()[1] if self.waiting else None

    def stale(self) -> list[ClaimedJob]:
        """Take out the jobs that waited longer than hand_back_after (the slots stopped freeing): they go back
        to the queue, and the queue holds nothing ahead until its pace is learnt again."""
        if not self.waiting or time.monotonic() - self.waiting[0][0] < self.hand_back_after:
            return []
        return self.release()

    def release(self) -> list[ClaimedJob]:
        """Take out every waiting job, and forget the pace."""
        jobs = [job for _, job in self.waiting]
        self.waiting.clear()
        self.interval, self.last_end = math.inf, None
        return jobs

    def due_in(self) -> float:
        """Seconds until the oldest waiting job is stale (inf: none waiting)."""
        if not self.waiting:
            return math.inf
        return max(0.0, self.waiting[0][0] + self.hand_back_after - time.monotonic())
