"""GET /metrics on a real `dygo serve`: gauges, lag and counters read from the database per scrape."""

from __future__ import annotations

import json

from dygo.store import admin, enqueue
from dygo.store.sql.workers import WORKER_HEARTBEAT
from prometheus_client.parser import text_string_to_metric_families

from tests.test_api_queues import fill_default_queue


def scrape(client) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of one scrape, keyed by (sample name, sorted labels)."""
    response = client.get("/metrics")
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/plain")
    samples = {}
    for family in text_string_to_metric_families(response.text):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


def value(samples, name: str, **labels: str) -> float:
    return samples[(name, tuple(sorted(labels.items())))]


def heartbeat(conn, worker_id: str, queues: dict[str, int], seconds_ago: float = 0) -> None:
    conn.execute(WORKER_HEARTBEAT, {"id": worker_id, "hostname": "box", "pid": 1, "queues": json.dumps(queues)})
    conn.execute(
        "UPDATE dygo_workers SET last_seen_at = now() - make_interval(secs => %s) WHERE id = %s",
        (seconds_ago, worker_id),
    )


def test_job_gauges_lag_pause_and_workers_are_exact(api, conn):
    ids = fill_default_queue(conn)  # default: 2 pending, 1 scheduled, 1 active, paused, dead, cancelled
    conn.execute("UPDATE dygo_jobs SET run_at = now() - interval '100 seconds' WHERE id = %s", (ids["pending"][0],))
    admin.pause_queue(conn, "other")
    heartbeat(conn, "box:1:aaa", {"default": 8, "other": 2})
    heartbeat(conn, "box:2:bbb", {"other": 3})
    heartbeat(conn, "box:3:gone", {"default": 1}, seconds_ago=3600)  # not live

    samples = scrape(api.reader)
    for state, number in {"pending": 2, "scheduled": 1, "active": 1, "paused": 1, "dead": 1, "cancelled": 1}.items():
        assert value(samples, "dygo_jobs", queue="default", state=state) == number
        assert value(samples, "dygo_jobs", queue="other", state=state) == 0
    assert 100 <= value(samples, "dygo_queue_lag_seconds", queue="default") < 160
    assert value(samples, "dygo_queue_lag_seconds", queue="other") == 0  # nothing ready: 0, not absent
    assert value(samples, "dygo_queue_paused", queue="other") == 1
    assert value(samples, "dygo_queue_paused", queue="default") == 0
    assert value(samples, "dygo_workers_live") == 2
    slots = {labels: v for (name, labels), v in samples.items() if name == "dygo_worker_slots"}
    assert slots == {
        (("queue", "default"), ("worker", "box:1:aaa")): 8,
        (("queue", "other"), ("worker", "box:1:aaa")): 2,
        (("queue", "other"), ("worker", "box:2:bbb")): 3,
    }

    # Read per scrape, nothing cached: a change in the database shows on the next scrape.
    conn.execute("DELETE FROM dygo_jobs WHERE state = 'pending'")
    admin.resume_queue(conn, "other")
    again = scrape(api.reader)
    assert value(again, "dygo_jobs", queue="default", state="pending") == 0
    assert value(again, "dygo_queue_lag_seconds", queue="default") == 0
    assert value(again, "dygo_queue_paused", queue="other") == 0


def test_counters_add_rollups_and_unfolded_deltas_after_a_real_worker(api, conn, spawn):
    conn.execute("""INSERT INTO dygo_daily_stats (day, queue, kind, enqueued, succeeded, failed, dead, reaped)
                    VALUES ((now() AT TIME ZONE 'UTC')::date - 3, 'default', 'test.noop', 5, 4, 0, 1, 2)""")
    for _ in range(2):
        enqueue(conn, "test.noop", {})
    enqueue(conn, "test.fail", {"times": 10})
    assert spawn("worker", "--once").wait() == 0  # noop x2 succeed; fail's first attempt fails (retried)

    samples = scrape(api.reader)
    noop = {"queue": "default", "kind": "test.noop"}
    failing = {"queue": "default", "kind": "test.fail"}
    assert value(samples, "dygo_jobs_enqueued_total", **noop) == 7
    assert value(samples, "dygo_jobs_succeeded_total", **noop) == 6
    assert value(samples, "dygo_jobs_dead_total", **noop) == 1
    assert value(samples, "dygo_jobs_reaped_total", **noop) == 2
    assert value(samples, "dygo_jobs_failed_total", **noop) == 0
    assert value(samples, "dygo_jobs_enqueued_total", **failing) == 1
    assert value(samples, "dygo_jobs_failed_total", **failing) == 1
    assert value(samples, "dygo_jobs_succeeded_total", **failing) == 0

    # Folding the deltas into the rollups does not move the counters.
    assert admin.fold_stats(conn)
    assert conn.execute("SELECT count(*) FROM dygo_stats_deltas").fetchone()[0] == 0
    folded = scrape(api.reader)
    counters = {k: v for k, v in samples.items() if k[0].endswith("_total")}
    assert counters == {k: v for k, v in folded.items() if k[0].endswith("_total")}


def test_metrics_need_a_read_token_once_tokens_are_configured(api, serve):
    refused = api.anon.get("/metrics")
    assert refused.status_code == 401
    assert refused.headers["www-authenticate"] == 'Bearer realm="dygo"'
    assert api.anon.get("/metrics", headers={"Authorization": "Bearer wrong"}).status_code == 401
    assert api.reader.get("/metrics").status_code == 200
    assert api.admin.get("/metrics").status_code == 200
    open_api = serve(tokens=False)  # development on localhost without tokens: everything open
    assert "dygo_workers_live 0.0" in open_api.anon.get("/metrics").text


def test_status_prints_queues_by_state_lag_pause_and_workers(conn, spawn):
    ids = fill_default_queue(conn)
    conn.execute("UPDATE dygo_jobs SET run_at = now() - interval '100 seconds' WHERE id = %s", (ids["pending"][0],))
    admin.pause_queue(conn, "other")
    heartbeat(conn, "box:1:aaa", {"default": 8, "other": 2})

    cli = spawn("status")
    assert cli.wait() == 0, cli.stderr()
    lines = [line.rstrip("\n") for line in cli.lines]
    assert lines[0].split() == [
        "QUEUE",
        "PENDING",
        "SCHEDULED",
        "ACTIVE",
        "PAUSED",
        "DEAD",
        "CANCELLED",
        "WAITING",
        "SKIPPED",
        "LAG",
        "STATUS",
    ]
    default, other = lines[1].split(), lines[2].split()
    assert default[:9] == ["default", "2", "1", "1", "1", "1", "1", "0", "0"] and default[10] == "active"
    assert 100 <= float(default[9].rstrip("s")) < 160
    assert other == ["other", "0", "0", "0", "0", "0", "0", "0", "0", "0.0s", "paused"]
    assert lines[3] == "" and lines[4] == "workers: 1 live"
    assert lines[5].split()[:2] == ["WORKER", "QUEUES"]
    assert lines[6].startswith("box:1:aaa ") and "default=8, other=2" in lines[6]
    assert lines[-1] == "failing kinds: none today or yesterday"


def test_status_says_when_no_worker_is_live(conn, spawn):
    cli = spawn("status")
    assert cli.wait() == 0, cli.stderr()
    assert "workers: none seen in the last 30s\n" in cli.lines
    assert cli.lines[1].split() == ["default", "0", "0", "0", "0", "0", "0", "0", "0", "0.0s", "active"]


def test_status_lists_failing_kinds_worst_first(conn, spawn):
    enqueue(conn, "test.abort", {})
    enqueue(conn, "test.abort", {})
    enqueue(conn, "test.fail", {"times": 1})  # fails once: a failed attempt, retried later
    worker = spawn("worker", "--once", "--queue", "default")
    assert worker.wait() == 0, worker.stderr()

    cli = spawn("status")
    assert cli.wait() == 0, cli.stderr()
    lines = [line.rstrip("\n") for line in cli.lines]
    at = lines.index("failing kinds (today and yesterday, UTC):")
    assert lines[at + 1].split() == ["KIND", "DEAD", "FAILED", "ATTEMPTS"]
    assert lines[at + 2].split() == ["test.abort", "2", "2"]  # the attempt that died is a failed attempt too
    assert lines[at + 3].split() == ["test.fail", "0", "1"]


def test_waiting_jobs_are_counted_by_what_they_wait_for(api, conn):
    def job(state: str, queue: str = "default") -> int:
        row = conn.execute(
            "INSERT INTO dygo_jobs (kind, queue, args, state, run_at) VALUES ('test.wait', %s, '{}', %s, now()) "
            "RETURNING id",
            (queue, state),
        ).fetchone()
        return row[0]

    def step(job_id: int, key: str, op: str, state: str | None = None, wake_in: float | None = None) -> None:
        conn.execute(
            "INSERT INTO dygo_steps (job_id, key, op, seq, attempt, duration, state, wake_at) "
            "VALUES (%s, %s, %s, 1, 1, 0, %s, now() + make_interval(secs => %s))",
            (job_id, key, op, state, wake_in),
        )

    for _ in range(2):
        step(job("waiting"), "approval#1", "event", "waiting")
    step(job("waiting", "other"), "ship#1", "call", "waiting")
    step(job("waiting"), "thumbs#1", "map", "waiting")
    job("waiting")  # a workflow's job: it waits for its node, with no waiting step
    step(job("pending"), "nap#1", "sleep", wake_in=3600)
    over = job("pending")
    step(over, "nap#1", "sleep", wake_in=-1)  # its sleep is over: due, not waiting
    done = job("pending")
    step(done, "approval#1", "event", "done")  # its event came: due, not waiting

    samples = scrape(api.reader)
    waiting = {labels: v for (name, labels), v in samples.items() if name == "dygo_jobs_waiting"}
    assert waiting == {
        (("queue", "default"), ("reason", "event")): 2,
        (("queue", "default"), ("reason", "child")): 1,
        (("queue", "other"), ("reason", "child")): 1,
        (("queue", "default"), ("reason", "workflow")): 1,
        (("queue", "default"), ("reason", "sleep")): 1,
    }


def test_a_flood_of_kinds_is_folded_so_a_scrape_stays_small(api, conn):
    # Rows an older version let in (any kind was accepted with an explicit queue): 300 kinds, and one
    # registered kind with fewer jobs than any of them, which is kept all the same.
    conn.execute(
        "INSERT INTO dygo_daily_stats (day, queue, kind, enqueued, succeeded, failed, dead, reaped) "
        "SELECT (now() AT TIME ZONE 'UTC')::date - 1, 'default', 'flood.k' || i, 10 + i, 1, 0, 0, 0 "
        "FROM generate_series(1, 300) AS i"
    )
    conn.execute(
        "INSERT INTO dygo_daily_stats (day, queue, kind, enqueued, succeeded, failed, dead, reaped) "
        "VALUES ((now() AT TIME ZONE 'UTC')::date - 1, 'default', 'test.noop', 1, 1, 0, 0, 0)"
    )
    samples = scrape(api.reader)
    enqueued = {dict(labels)["kind"]: v for (name, labels), v in samples.items() if name == "dygo_jobs_enqueued_total"}
    assert len(enqueued) == 200
    assert enqueued["test.noop"] == 1
    assert enqueued["flood.k300"] == 310  # the busiest kinds are kept
    assert "flood.k1" not in enqueued
    assert sum(enqueued.values()) == 1 + sum(10 + i for i in range(1, 301))  # nothing lost: the rest is (other)
    assert enqueued["(other)"] == sum(10 + i for i in range(1, 300 - 198 + 1))


def test_label_values_with_control_characters_parse_back_whole(api, conn):
    hostile = "evil\r\x1b[2J\x85\u2028kind"  # stats of a kind an older version accepted
    conn.execute(
        "INSERT INTO dygo_daily_stats (day, queue, kind, enqueued, succeeded, failed, dead, reaped) "
        "VALUES ((now() AT TIME ZONE 'UTC')::date - 1, 'default', %s, 7, 0, 0, 0, 0)",
        (hostile,),
    )
    samples = scrape(api.reader)  # the parser reads every line, and the value comes back escaped
    escaped = "evil\\r\\x1b[2J\\x85\\u2028kind"
    assert value(samples, "dygo_jobs_enqueued_total", queue="default", kind=escaped) == 7


def test_a_kind_must_be_a_short_dotted_name_whether_registered_or_not(api, conn):
    import pytest
    from dygo.store import EnqueueError

    long_kind = "k" * 100_000
    for bad in (long_kind, "has space", "a\x1bb", "dots..twice", "x" * 201):
        response = api.admin.post("/api/v1/jobs", json={"kind": bad, "queue": "default", "args": {}})
        assert response.status_code == 422, response.text
        error = response.json()["error"]
        assert error["code"] == "invalid_request" and error["details"][0]["loc"] == ["body", "kind"]
        with pytest.raises(EnqueueError) as refused:
            enqueue(conn, bad, {}, queue="default")
        assert refused.value.code == "invalid_kind" and "dotted name" in str(refused.value)
        assert len(str(refused.value)) < 400  # a huge kind is not echoed whole
    assert api.admin.post("/api/v1/jobs", json={"kind": "x" * 200, "queue": "default"}).status_code == 201
