"""Timing histograms on `dygo serve`'s /metrics, and a worker's own metrics on --metrics-port."""

from __future__ import annotations

import socket

import httpx
from dygo.store import admin, enqueue
from dygo.store.timings import BOUNDS
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import free_port, wait_until
from tests.test_metrics import scrape, value

LES = (*(f"{b:g}" for b in BOUNDS), "+Inf")


def histogram(samples, name: str, **labels: str) -> dict[str, float]:
    """le -> cumulative count of one histogram series, plus its _count."""
    wanted = set(labels.items())
    found = {dict(lbls)["le"]: v for (n, lbls), v in samples.items() if n == f"{name}_bucket" and wanted <= set(lbls)}
    found["count"] = samples[(f"{name}_count", tuple(sorted(labels.items())))]
    return found


def cumulative(**falls_in: int) -> dict[str, float]:
    """The expected series when `falls_in` observations land in each named bucket (by its `le`)."""
    counts, running = {}, 0
    for le in LES:
        running += falls_in.get(le, 0)
        counts[le] = running
    counts["count"] = running
    return counts


def due_ago(conn, ids: list[int], seconds: int) -> None:
    """Make jobs due (and enqueued) `seconds` ago, so their start latency is known within the bucket width."""
    conn.execute(
        "UPDATE dygo_jobs SET run_at = now() - make_interval(secs => %(s)s), "
        "enqueued_at = now() - make_interval(secs => %(s)s) WHERE id = ANY(%(ids)s)",
        {"s": seconds, "ids": ids},
    )


def test_latency_and_duration_histograms_by_queue_and_kind_are_exact_after_a_real_worker(api, conn, spawn):
    quick = [enqueue(conn, "test.sleep", {"seconds": 0.3}).id for _ in range(2)]
    slow = enqueue(conn, "test.sleep", {"seconds": 1.2}).id
    other = enqueue(conn, "test.sleep", {"seconds": 0.12}, queue="other").id
    due_ago(conn, [*quick, other], 45)  # latency in (30, 60] however slowly the worker starts
    due_ago(conn, [slow], 200)  # (120, 300]
    assert spawn("worker", "--once").wait() == 0

    samples = scrape(api.reader)
    default = {"queue": "default", "kind": "test.sleep"}
    assert histogram(samples, "dygo_job_duration_seconds", **default) == cumulative(**{"0.5": 2, "2.5": 1})
    assert histogram(samples, "dygo_job_start_latency_seconds", **default) == cumulative(**{"60": 2, "300": 1})
    assert 1.8 <= samples[("dygo_job_duration_seconds_sum", tuple(sorted(default.items())))] < 2.6
    elsewhere = {"queue": "other", "kind": "test.sleep"}
    assert histogram(samples, "dygo_job_duration_seconds", **elsewhere) == cumulative(**{"0.25": 1})
    assert histogram(samples, "dygo_job_start_latency_seconds", **elsewhere) == cumulative(**{"60": 1})

    # Folding moves the worker's deltas into the rollup rows without changing a number; a later
    # worker's deltas then add to the folded rows.
    assert admin.fold_stats(conn)
    assert conn.execute("SELECT count(*) FROM dygo_timing_deltas").fetchone()[0] == 0
    assert conn.execute("SELECT count(*) FROM dygo_timings").fetchone()[0] == 4  # 2 queues x 2 measures
    folded = scrape(api.reader)
    assert {k: v for k, v in folded.items() if "seconds" in k[0]} == {
        k: v for k, v in samples.items() if "seconds" in k[0]
    }
    due_ago(conn, [enqueue(conn, "test.sleep", {"seconds": 0.3}).id], 45)
    assert spawn("worker", "--once").wait() == 0
    again = scrape(api.reader)
    assert histogram(again, "dygo_job_duration_seconds", **default) == cumulative(**{"0.5": 3, "2.5": 1})
    assert histogram(again, "dygo_job_start_latency_seconds", **default) == cumulative(**{"60": 3, "300": 1})


def scrape_worker(port: int) -> dict:
    response = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5)
    assert response.status_code == 200
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(response.text)
        for s in family.samples
    }


def final(conn, ids: list[int]) -> bool:
    states = [row[0] for row in conn.execute("SELECT state FROM dygo_jobs WHERE id = ANY(%s)", (ids,))]
    return all(state in ("succeeded", "dead") for state in states)


def test_worker_metrics_port_counts_this_process_executions_claims_settles_and_busy_slots(conn, spawn):
    ids = [enqueue(conn, "test.noop", {}).id for _ in range(2)]
    ids.append(enqueue(conn, "test.fail", {"times": 10}).id)  # fails twice (retried), dies on the third attempt
    ids.append(enqueue(conn, "test.abort", {}).id)  # dead at once
    ids.append(enqueue(conn, "test.snooze", {}).id)  # snoozes twice, then succeeds
    port = free_port()
    worker = spawn("worker", "--metrics-port", str(port))
    worker.wait_for_line(f"dygo worker metrics: http://127.0.0.1:{port}/metrics")
    wait_until(lambda: final(conn, ids), message="the five jobs to finish")
    enqueue(conn, "test.sleep", {"seconds": 30})  # holds one slot while we look
    samples = wait_until(
        lambda: (s := scrape_worker(port)).get(("dygo_worker_busy_slots", (("queue", "default"),))) == 1 and s,
        message="a busy slot",
    )

    executions = {labels: v for (name, labels), v in samples.items() if name == "dygo_worker_executions_total"}
    assert executions == {
        (("kind", "test.noop"), ("outcome", "succeeded"), ("queue", "default")): 2,
        (("kind", "test.fail"), ("outcome", "failed"), ("queue", "default")): 2,
        (("kind", "test.fail"), ("outcome", "dead"), ("queue", "default")): 1,
        (("kind", "test.abort"), ("outcome", "dead"), ("queue", "default")): 1,
        (("kind", "test.snooze"), ("outcome", "snoozed"), ("queue", "default")): 2,
        (("kind", "test.snooze"), ("outcome", "succeeded"), ("queue", "default")): 1,
    }
    assert samples[("dygo_worker_claimed_jobs_total", (("queue", "default"),))] == 10  # 9 runs and the sleeper
    settled = {
        dict(labels)["outcome"]: v for (name, labels), v in samples.items() if name == "dygo_worker_settled_jobs_total"
    }
    assert settled == {"succeeded": 3, "failed": 2, "snoozed": 2, "dead": 2}
    assert samples[("dygo_worker_lease_lost_total", ())] == 0
    assert samples[("dygo_worker_busy_slots", (("queue", "other"),))] == 0
    assert samples[("dygo_worker_concurrency", (("queue", "default"),))] == 8
    assert samples[("dygo_worker_concurrency", (("queue", "other"),))] == 2
    durations = {
        dict(labels)["kind"]: v
        for (name, labels), v in samples.items()
        if name == "dygo_worker_execution_duration_seconds_count"
    }
    assert durations == {"test.noop": 2, "test.fail": 3, "test.abort": 1, "test.snooze": 3}
    latencies = {
        dict(labels)["kind"]: v
        for (name, labels), v in samples.items()
        if name == "dygo_worker_start_latency_seconds_count"
    }
    assert latencies == {"test.noop": 2, "test.fail": 3, "test.abort": 1, "test.snooze": 3, "test.sleep": 1}


def test_worker_refuses_a_metrics_port_in_use_with_exit_2(conn, spawn):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        worker = spawn("worker", "--once", "--metrics-port", str(port))
        assert worker.wait() == 2
    assert f"--metrics-port: {port}: cannot listen on 127.0.0.1:{port}" in worker.stderr()


def test_serve_reports_each_live_workers_busy_slots(api, conn, spawn):
    worker = spawn("worker")
    worker_id = worker.wait_for_line("started").split()[2]
    for _ in range(2):
        enqueue(conn, "test.sleep", {"seconds": 30})
    enqueue(conn, "test.sleep", {"seconds": 30}, queue="other")

    def busy() -> dict:
        return {
            dict(labels)["queue"]: v
            for (name, labels), v in scrape(api.reader).items()
            if name == "dygo_worker_slots_busy" and dict(labels)["worker"] == worker_id
        }

    assert wait_until(lambda: (b := busy()) == {"default": 2, "other": 1} and b, message="3 busy slots")
    assert value(scrape(api.reader), "dygo_worker_slots", worker=worker_id, queue="default") == 8
