"""The worker's own figures: what `--metrics-port` serves, and the timings it flushes to the database.

Everything is counted in memory on the event loop (a dictionary increment per job, no
prometheus_client object on the hot path); a custom collector turns the counts into metrics when
the port is scraped, from prometheus-client's HTTP server thread.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any
from wsgiref.simple_server import make_server

from dygo.store.errors import ConfigError
from dygo.store.leases import ClaimedJob, Outcome, Succeeded
from dygo.store.timings import Timings
from prometheus_client import CollectorRegistry, make_wsgi_app
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.exposition import ThreadingWSGIServer, _SilentHandler
from prometheus_client.registry import Collector

OUTCOMES = ("succeeded", "failed", "snoozed", "waiting", "dead")


def outcome_name(outcome: Outcome) -> str:
    """succeeded; failed (will be retried); snoozed (or handed back: attempt refunded); waiting (a durable
    wait); dead."""
    if isinstance(outcome, Succeeded):
        return "succeeded"
    if outcome.state in ("dead", "waiting"):
        return outcome.state
    return "snoozed" if outcome.refund_attempt else "failed"


class WorkerStats:
    """This process's counts since it started."""

    def __init__(self) -> None:
        self.timings = Timings()
        self.lock = self.timings.lock  # one lock for everything the scrape thread reads
        self.executions: Counter[tuple[str, str, str]] = Counter()  # (queue, kind, outcome)
        self.claimed: Counter[str] = Counter()  # queue
        self.settled: Counter[str] = Counter()  # outcome
        self.lease_lost = 0  # outcomes discarded: the lease was recovered by another worker first

    def claimed_jobs(self, jobs: Iterable[ClaimedJob]) -> None:
        """Each job's start latency and its queue's count: a claim's jobs under one lock."""
        observe, claimed = self.timings.observe_unlocked, self.claimed
        with self.lock:
            for job in jobs:
                observe(job.queue, job.kind, "latency", job.waited)
                claimed[job.queue] += 1

    def executed(self, queue: str, kind: str, outcome: str, seconds: float) -> None:
        with self.lock:
            self.timings.observe_unlocked(queue, kind, "duration", seconds)
            self.executions[(queue, kind, outcome)] += 1

    def settled_batch(self, outcomes: Mapping[str, int], lost: int) -> None:
        with self.lock:
            self.settled.update(outcomes)
            self.lease_lost += lost


class WorkerCollector(Collector):
    """Reads WorkerStats and the live slot counts on each scrape."""

    def __init__(self, stats: WorkerStats, slots: Callable[[], Mapping[str, tuple[int, int, int]]]) -> None:
        self.stats = stats
        self.slots = slots  # queue -> (running, concurrency, claimed ahead and waiting for a slot)

    def collect(self) -> Iterator[Metric]:
        stats = self.stats
        with stats.lock:
            executions, claimed = dict(stats.executions), dict(stats.claimed)
            settled, lost = dict(stats.settled), stats.lease_lost
        counter = CounterMetricFamily(
            "dygo_worker_executions",
            "Handler runs finished in this process, by outcome "
            "(succeeded, failed = will be retried, snoozed, waiting, dead)",
            labels=["queue", "kind", "outcome"],
        )
        for (queue, kind, outcome), n in sorted(executions.items()):
            counter.add_metric([queue, kind, outcome], n)
        yield counter
        counter = CounterMetricFamily("dygo_worker_claimed_jobs", "Jobs this process claimed", labels=["queue"])
        for queue, n in sorted(claimed.items()):
            counter.add_metric([queue], n)
        yield counter
        counter = CounterMetricFamily(
            "dygo_worker_settled_jobs",
            "Outcomes this process recorded in the database (including hand-backs at shutdown)",
            labels=["outcome"],
        )
        for outcome, n in sorted(settled.items()):
            counter.add_metric([outcome], n)
        yield counter
        yield CounterMetricFamily(
            "dygo_worker_lease_lost",
            "Outcomes discarded at settle because the lease had been recovered by another worker",
            value=lost,
        )
        busy = GaugeMetricFamily("dygo_worker_busy_slots", "Jobs running now in this process", labels=["queue"])
        concurrency = GaugeMetricFamily(
            "dygo_worker_concurrency", "Jobs this process may run at once", labels=["queue"]
        )
        ahead = GaugeMetricFamily(
            "dygo_worker_claimed_ahead",
            "Jobs claimed ahead of a free slot, waiting in this process for one (worker/ahead.py)",
            labels=["queue"],
        )
        for queue, (running, most, waiting) in sorted(self.slots().items()):
            busy.add_metric([queue], running)
            concurrency.add_metric([queue], most)
            ahead.add_metric([queue], waiting)
        yield from (busy, concurrency, ahead)
        histograms = {
            "latency": HistogramMetricFamily(
                "dygo_worker_start_latency_seconds",
                "Seconds from when a job became due (run_at, or its enqueue "
                "time if later) to its claim by this process",
                labels=["queue", "kind"],
            ),
            "duration": HistogramMetricFamily(
                "dygo_worker_execution_duration_seconds",
                "Seconds a handler ran in this process, whatever its outcome",
                labels=["queue", "kind"],
            ),
        }
        for (queue, kind, measure), histogram in sorted(stats.timings.snapshot().items()):
            histograms[measure].add_metric([queue, kind], histogram.cumulative(), sum_value=histogram.sum)
        yield from histograms.values()


def serve_metrics(host: str, port: int, collector: Collector, ready: Callable[[], bool] = lambda: True) -> int:
    """Serve /metrics (prometheus-client, on a registry of our own) and /readyz (200 when `ready()`, else
    503: a readiness probe) from a daemon thread; returns the port."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    metrics = make_wsgi_app(registry)

    def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        if environ.get("PATH_INFO") == "/readyz":
            status = "200 OK" if ready() else "503 Service Unavailable"
            start_response(status, [("Content-Type", "text/plain; charset=utf-8")])
            return [b"ready\n" if status.startswith("200") else b"not ready\n"]
        served: Iterable[bytes] = metrics(environ, start_response)
        return served

    server = make_server(host, port, app, ThreadingWSGIServer, handler_class=_SilentHandler)
    threading.Thread(target=server.serve_forever, name="metrics", daemon=True).start()
    return server.server_port


def serve_worker_metrics(
    host: str,
    port: int,
    stats: WorkerStats,
    slots: Callable[[], Mapping[str, tuple[int, int, int]]],
    ready: Callable[[], bool],
) -> int:
    """serve_metrics for a worker's figures; a port that cannot be bound is a configuration error."""
    try:
        return serve_metrics(host, port, WorkerCollector(stats, slots), ready)
    except OSError as exc:
        raise ConfigError(
            "--metrics-port",
            str(port),
            f"cannot listen on {host}:{port} ({exc.strerror or exc}); choose a free port, or another --metrics-host",
        ) from None
