"""Start latency and execution duration histograms, counted in the worker and summed in the database.

A worker counts every observation in memory into fixed buckets (BOUNDS) per queue, kind and
measure, and every few seconds appends what is new since its last flush to dygo_timing_deltas: one
row per queue, kind and measure, never a write per job and never a shared hot row. The stats folder
adds the deltas into dygo_timings; GET /metrics reads both (rollups, never job rows).

Measures:
* latency  - from when the job became due (its run_at, or its enqueue time if run_at was earlier)
             to its claim, on the database clock: the time a ready job waited for a free worker
* duration - the handler's run time in the worker (monotonic clock), whatever its outcome
"""

from __future__ import annotations

import threading
from bisect import bisect_left
from dataclasses import dataclass, field

import psycopg
from dygo.store.sql import timings as sql

# Upper bounds in seconds (Prometheus `le`); an observation equal to a bound counts in that bucket.
BOUNDS: tuple[float, ...] = (
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
    120.0,
    300.0,
    600.0,
    1800.0,
    3600.0,
)
MEASURES = ("latency", "duration")

Key = tuple[str, str, str]  # queue, kind, measure


@dataclass
class Histogram:
    """Observations per bucket (not cumulative; the last one is above every bound), their sum and count."""

    buckets: list[int] = field(default_factory=lambda: [0] * (len(BOUNDS) + 1))
    sum: float = 0.0
    count: int = 0

    def minus(self, earlier: Histogram) -> Histogram:
        return Histogram(
            [a - b for a, b in zip(self.buckets, earlier.buckets, strict=True)],
            self.sum - earlier.sum,
            self.count - earlier.count,
        )

    def copy(self) -> Histogram:
        return Histogram(list(self.buckets), self.sum, self.count)

    def cumulative(self) -> list[tuple[str, int]]:
        """(le, observations at or below it) pairs as Prometheus wants them, ending with +Inf."""
        pairs, running = [], 0
        for bound, n in zip((*(f"{b:g}" for b in BOUNDS), "+Inf"), self.buckets, strict=True):
            running += n
            pairs.append((bound, running))
        return pairs


class Timings:
    """Histograms since the process started, per queue, kind and measure; and what is not flushed yet.

    Observed on the event loop, read by the metrics HTTP thread, hence the lock (never contended
    for long: every method is a few dictionary operations).
    """

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.totals: dict[Key, Histogram] = {}
        self.flushed: dict[Key, Histogram] = {}

    def observe(self, queue: str, kind: str, measure: str, seconds: float) -> None:
        with self.lock:
            self.observe_unlocked(queue, kind, measure, seconds)

    def observe_unlocked(self, queue: str, kind: str, measure: str, seconds: float) -> None:
        """`observe` for a caller already holding `lock`."""
        histogram = self.totals.get((queue, kind, measure))
        if histogram is None:
            histogram = self.totals[(queue, kind, measure)] = Histogram()
        # Counted here, not in a Histogram method: a worker observes twice per job, so one call fewer each time.
        if seconds < 0.0:
            seconds = 0.0
        histogram.buckets[bisect_left(BOUNDS, seconds)] += 1
        histogram.sum += seconds
        histogram.count += 1

    def snapshot(self) -> dict[Key, Histogram]:
        with self.lock:
            return {key: histogram.copy() for key, histogram in self.totals.items()}

    def unflushed(self) -> dict[Key, Histogram]:
        """What was observed since the last `mark_flushed`, per key with any observation."""
        with self.lock:
            return {
                key: histogram.minus(self.flushed[key]) if key in self.flushed else histogram.copy()
                for key, histogram in self.totals.items()
                if histogram.count != (self.flushed[key].count if key in self.flushed else 0)
            }

    def mark_flushed(self, deltas: dict[Key, Histogram]) -> None:
        """Count `deltas` (from `unflushed`) as written; anything observed since stays unflushed."""
        with self.lock:
            for key, delta in deltas.items():
                before = self.flushed.get(key)
                self.flushed[key] = (
                    delta.copy()
                    if before is None
                    else Histogram(
                        [a + b for a, b in zip(before.buckets, delta.buckets, strict=True)],
                        before.sum + delta.sum,
                        before.count + delta.count,
                    )
                )


async def record(conn: psycopg.AsyncConnection, deltas: dict[Key, Histogram]) -> None:
    """Append one delta row per queue, kind and measure: one statement."""
    if not deltas:
        return
    keys = list(deltas)
    await conn.execute(
        sql.RECORD_TIMINGS,
        {
            "queues": [k[0] for k in keys],
            "kinds": [k[1] for k in keys],
            "measures": [k[2] for k in keys],
            "buckets": ["{" + ",".join(map(str, deltas[k].buckets)) + "}" for k in keys],
            "sums": [deltas[k].sum for k in keys],
            "counts": [deltas[k].count for k in keys],
        },
    )


def totals(conn: psycopg.Connection) -> dict[Key, Histogram]:
    """Every histogram kept: folded rows plus deltas not folded yet."""
    result = {}
    for queue, kind, measure, buckets, total, count in conn.execute(sql.METRICS_TIMINGS):
        if len(buckets) == len(BOUNDS) + 1:  # rows written with other bounds cannot be merged; skipped
            result[(queue, kind, measure)] = Histogram(list(buckets), total, count)
    return result
