"""GET /metrics: Prometheus text format, built from the database on every scrape.

A custom collector reads store.metrics.snapshot per scrape; the web process keeps no counters, so
every `dygo serve` replica reports the same numbers. Auth: like /api/, /metrics needs a token (a
read token is enough) once tokens are configured (see app/auth.py).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from typing import Any

from dygo.app.db import ReadSlot, ServePools
from dygo.app.system import WORKER_SEEN_WITHIN
from dygo.store import admin
from dygo.store.metrics import Snapshot, snapshot
from dygo.store.registry import registry
from dygo.store.timings import Histogram
from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from dygo.logs import escape_controls

router = APIRouter(tags=["system"])

COUNTERS = {
    "enqueued": "Jobs enqueued",
    "succeeded": "Jobs that succeeded",
    "failed": "Failed attempts, retried or not",
    "dead": "Jobs that died (attempts or reaps exhausted)",
    "reaped": "Expired leases recovered from vanished workers",
}

HISTOGRAMS = {
    "latency": (
        "dygo_job_start_latency_seconds",
        "Seconds from when a job became due (run_at, or its enqueue "
        "time if later) to its start, per execution (from the timing rollups)",
    ),
    "duration": (
        "dygo_job_duration_seconds",
        "Seconds a handler ran, per execution whatever its outcome (from the timing rollups)",
    ),
}


# Kinds reported per scrape at most: every kind has a series per counter and histogram bucket, kept for the
# stats' whole retention, so a flood of distinct kinds would make each scrape huge. The registered kinds
# come first, then the others by jobs enqueued; the rest are summed under OTHER_KINDS.
MAX_METRIC_KINDS = 200
OTHER_KINDS = "(other)"  # not a kind: no kind can have parentheses


def fold_kinds(snap: Snapshot, limit: int = MAX_METRIC_KINDS) -> None:
    """Keep at most `limit` kinds in the snapshot's per-kind figures; sum the rest under OTHER_KINDS."""
    enqueued = Counter[str]()
    for row in snap.totals:
        enqueued[row["kind"]] += row["enqueued"]
    for _queue, kind, _measure in snap.timings:
        enqueued[kind] += 0
    if len(enqueued) <= limit:
        return
    ranked = sorted(enqueued, key=lambda kind: (registry.get(kind) is None, -enqueued[kind], kind))
    kept = set(ranked[: limit - 1])
    totals: dict[tuple[str, str], dict[str, Any]] = {}
    for row in snap.totals:
        kind = row["kind"] if row["kind"] in kept else OTHER_KINDS
        into = totals.setdefault((row["queue"], kind), {"queue": row["queue"], "kind": kind})
        for field in COUNTERS:
            into[field] = into.get(field, 0) + row[field]
    snap.totals = list(totals.values())
    timings: dict[Any, Histogram] = {}
    for (queue, kind, measure), observed in snap.timings.items():
        key = (queue, kind if kind in kept else OTHER_KINDS, measure)
        into_histogram = timings.setdefault(key, Histogram())
        into_histogram.buckets = [a + b for a, b in zip(into_histogram.buckets, observed.buckets, strict=True)]
        into_histogram.sum += observed.sum
        into_histogram.count += observed.count
    snap.timings = timings


def labels(values: list[str]) -> list[str]:
    """Label values the Prometheus text parser reads back whole: every control character escaped (the
    client library escapes only the backslash, the double quote and the line feed)."""
    return [escape_controls(value) for value in values]


class DygoCollector(Collector):
    """Reads the database on each collect(); nothing is cached between scrapes."""

    def __init__(self, state: Any) -> None:
        self.state = state  # app.state: the pool exists only once the lifespan has started

    def collect(self) -> Iterator[Metric]:
        # Every figure is a count or a total that may lag a little: DATABASE_READ_URL's replica when set.
        pools: ServePools = self.state.db
        with pools.reads_pool.connection(timeout=pools.reads_wait()) as conn:
            snap = snapshot(conn, self.state.settings.concurrency, WORKER_SEEN_WITHIN)
            replica_lag = admin.replica_lag(conn) if pools.reads_replica else None
        yield replica_lag_gauge(replica_lag)
        fold_kinds(snap)
        jobs = GaugeMetricFamily(
            "dygo_jobs",
            "Jobs now in each state (succeeded jobs are counted by dygo_jobs_succeeded_total)",
            labels=["queue", "state"],
        )
        paused = GaugeMetricFamily("dygo_queue_paused", "1 when the queue is paused", labels=["queue"])
        for queue in snap.queues:
            for state in admin.COUNTED_STATES:
                jobs.add_metric(labels([queue["name"], state]), queue["counts"][state])
            paused.add_metric(labels([queue["name"]]), 1.0 if queue["paused"] else 0.0)
        lag = GaugeMetricFamily(
            "dygo_queue_lag_seconds",
            "Seconds since the oldest ready job fell due (0 when none is ready)",
            labels=["queue"],
        )
        for name, seconds in snap.lag.items():
            lag.add_metric(labels([name]), seconds)
        yield from (jobs, lag, paused)
        waits = GaugeMetricFamily(
            "dygo_jobs_waiting",
            "Jobs that wait without a slot, by what for: event (ctx.wait_for_event), child (ctx.call, ctx.map), "
            "workflow (the nodes before its own) or sleep (a ctx.sleep not over; these count as scheduled)",
            labels=["queue", "reason"],
        )
        for (queue_name, reason), n in sorted(snap.waiting.items()):
            waits.add_metric(labels([queue_name, reason]), n)
        yield waits
        for field, help_text in COUNTERS.items():
            counter = CounterMetricFamily(
                f"dygo_jobs_{field}",
                f"{help_text}, since stats retention began (from the daily stats rollups)",
                labels=["queue", "kind"],
            )
            for row in snap.totals:
                counter.add_metric(labels([row["queue"], row["kind"]]), row[field])
            yield counter
        yield GaugeMetricFamily(
            "dygo_workers_live", f"Worker processes seen in the last {WORKER_SEEN_WITHIN:g}s", value=len(snap.workers)
        )
        slots = GaugeMetricFamily(
            "dygo_worker_slots", "Configured concurrency of each live worker per queue", labels=["worker", "queue"]
        )
        busy = GaugeMetricFamily(
            "dygo_worker_slots_busy",
            "Jobs each live worker is running now per queue (its active jobs)",
            labels=["worker", "queue"],
        )
        for worker in snap.workers:
            for queue, concurrency in sorted((worker["queues"] or {}).items()):
                slots.add_metric(labels([worker["id"], queue]), concurrency)
                busy.add_metric(labels([worker["id"], queue]), snap.busy.get((worker["id"], queue), 0))
        yield slots
        yield busy
        limit = GaugeMetricFamily(
            "dygo_limit",
            "Each cluster-wide limit in force (per key for a per-key limit)",
            labels=["queue", "kind", "limit"],
        )
        in_use = GaugeMetricFamily(
            "dygo_limit_in_use",
            "Use of each cluster-wide limit: active jobs (limit="
            "concurrency) or starts in the window ending now (limit=rate), all keys together",
            labels=["queue", "kind", "limit"],
        )
        waiting = GaugeMetricFamily(
            "dygo_limit_waiting",
            "Ready jobs held back because their cluster-wide limit is full (waiting on a limit, not stuck)",
            labels=["queue", "kind"],
        )
        for use in snap.limits:
            # A queue's limit has kind="", a kind's limit queue="".
            target = [use.name, ""] if use.scope == "queue" else ["", use.name]
            if use.concurrency_limit is not None:
                limit.add_metric(labels([*target, "concurrency"]), use.concurrency_limit)
                in_use.add_metric(labels([*target, "concurrency"]), sum(use.in_use.values()))
            if use.rate_count is not None:
                limit.add_metric(labels([*target, "rate"]), use.rate_count)
                in_use.add_metric(labels([*target, "rate"]), sum(use.started.values()))
            waiting.add_metric(labels(target), use.waiting)
        yield from (limit, in_use, waiting)
        for measure, (name, help_text) in HISTOGRAMS.items():
            histogram = HistogramMetricFamily(name, help_text, labels=["queue", "kind"])
            for (queue_name, kind, of), observed in snap.timings.items():
                if of == measure:
                    histogram.add_metric(labels([queue_name, kind]), observed.cumulative(), sum_value=observed.sum)
            yield histogram


def replica_lag_gauge(seconds: float | None) -> Metric:
    """How far behind its primary the replica these figures came from is. No sample without DATABASE_READ_URL
    or when its lag is unknown (the server is not in recovery), so an alert on it never fires on a made-up value."""
    gauge = GaugeMetricFamily(
        "dygo_read_replica_lag_seconds",
        "Seconds the replica of DATABASE_READ_URL, which these figures were read from, is behind its primary",
    )
    if seconds is not None:
        gauge.add_metric([], seconds)
    return gauge


def install_metrics(app: FastAPI) -> None:
    """A registry per app (never the global one) holding the database collector, and the route."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(DygoCollector(app.state))
    app.state.metrics_registry = registry
    app.include_router(router)


@router.get(
    "/metrics",
    summary="Prometheus metrics, read from the database on each scrape",
    response_class=Response,
    responses={200: {"content": {CONTENT_TYPE_LATEST: {}}}},
)
def metrics(request: Request, _: ReadSlot) -> Response:
    return Response(generate_latest(request.app.state.metrics_registry), media_type=CONTENT_TYPE_LATEST)
