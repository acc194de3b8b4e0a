"""GET /metrics: Prometheus text format, built from the database on every scrape.

A custom collector reads store.metrics.snapshot per scrape; the web process keeps no counters, so
every `dygo serve` replica reports the same numbers. Auth: like /api/, /metrics needs a token (a
read token is enough) once tokens are configured (see app/auth.py).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from dygo.app.db import SyncSlot
from dygo.app.system import WORKER_SEEN_WITHIN
from dygo.store import admin
from dygo.store.metrics import snapshot
from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

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


class DygoCollector(Collector):
    """Reads the database on each collect(); nothing is cached between scrapes."""

    def __init__(self, state: Any) -> None:
        self.state = state  # app.state: the pool exists only once the lifespan has started

    def collect(self) -> Iterator[Metric]:
        with self.state.db.pool.connection() as conn:
            snap = snapshot(conn, self.state.settings.concurrency, WORKER_SEEN_WITHIN)
        jobs = GaugeMetricFamily(
            "dygo_jobs",
            "Jobs now in each state (succeeded jobs are counted by dygo_jobs_succeeded_total)",
            labels=["queue", "state"],
        )
        paused = GaugeMetricFamily("dygo_queue_paused", "1 when the queue is paused", labels=["queue"])
        for queue in snap.queues:
            for state in admin.COUNTED_STATES:
                jobs.add_metric([queue["name"], state], queue["counts"][state])
            paused.add_metric([queue["name"]], 1.0 if queue["paused"] else 0.0)
        lag = GaugeMetricFamily(
            "dygo_queue_lag_seconds",
            "Seconds since the oldest ready job fell due (0 when none is ready)",
            labels=["queue"],
        )
        for name, seconds in snap.lag.items():
            lag.add_metric([name], seconds)
        yield from (jobs, lag, paused)
        waits = GaugeMetricFamily(
            "dygo_jobs_waiting",
            "Jobs that wait without a slot, by what for: event (ctx.wait_for_event), child (ctx.call, ctx.map), "
            "workflow (the nodes before its own) or sleep (a ctx.sleep not over; these count as scheduled)",
            labels=["queue", "reason"],
        )
        for (queue_name, reason), n in sorted(snap.waiting.items()):
            waits.add_metric([queue_name, reason], n)
        yield waits
        for field, help_text in COUNTERS.items():
            counter = CounterMetricFamily(
                f"dygo_jobs_{field}",
                f"{help_text}, since stats retention began (from the daily stats rollups)",
                labels=["queue", "kind"],
            )
            for row in snap.totals:
                counter.add_metric([row["queue"], row["kind"]], row[field])
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
                slots.add_metric([worker["id"], queue], concurrency)
                busy.add_metric([worker["id"], queue], snap.busy.get((worker["id"], queue), 0))
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
                limit.add_metric([*target, "concurrency"], use.concurrency_limit)
                in_use.add_metric([*target, "concurrency"], sum(use.in_use.values()))
            if use.rate_count is not None:
                limit.add_metric([*target, "rate"], use.rate_count)
                in_use.add_metric([*target, "rate"], sum(use.started.values()))
            waiting.add_metric(target, use.waiting)
        yield from (limit, in_use, waiting)
        for measure, (name, help_text) in HISTOGRAMS.items():
            histogram = HistogramMetricFamily(name, help_text, labels=["queue", "kind"])
            for (queue_name, kind, of), observed in snap.timings.items():
                if of == measure:
                    histogram.add_metric([queue_name, kind], observed.cumulative(), sum_value=observed.sum)
            yield histogram


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
def metrics(request: Request, _: SyncSlot) -> Response:
    return Response(generate_latest(request.app.state.metrics_registry), media_type=CONTENT_TYPE_LATEST)
