"""Claiming ahead (worker/ahead.py): while a queue's jobs are short, a worker claims beyond
its free slots and starts the extra jobs as slots free; jobs that wait too long, or that a stopping worker
never started, go back to their queue. Real worker processes on a real database."""

from __future__ import annotations

import re
import signal
from pathlib import Path

import pytest
from dygo.store import enqueue_many

from tests.conftest import TEST_CONFIG, dygo_env, free_port, wait_until
from tests.test_telemetry import scrape_worker


def config(tmp_path: Path, claim_ahead: str) -> Path:
    (tmp_path / "queues.yml").write_text((TEST_CONFIG / "queues.yml").read_text())
    (tmp_path / "dygo.yml").write_text((TEST_CONFIG / "dygo.yml").read_text() + f"claim_ahead: {claim_ahead}\n")
    return tmp_path


def count(conn, where: str) -> int:
    return conn.execute(f"SELECT count(*) FROM dygo_jobs WHERE {where}").fetchone()[0]


def learn_the_pace(conn) -> None:
    """Short jobs through the worker, so it knows its queue's jobs end quickly."""
    enqueue_many(conn, [{"kind": "test.noop"} for _ in range(300)])
    wait_until(lambda: count(conn, "state = 'succeeded'") == 300, timeout=30, message="300 no-op jobs")


def largest_claim(conn) -> int:
    # One claim's jobs share its transaction's now() as started_at.
    return conn.execute("SELECT max(n) FROM (SELECT count(*) AS n FROM dygo_jobs GROUP BY started_at) c").fetchone()[0]


@pytest.mark.parametrize(("claim_ahead", "claims_ahead"), [("50ms", True), ("0", False)])
def test_short_jobs_are_claimed_beyond_the_free_slots_only_while_claim_ahead_is_on(
    conn, db_url, spawn, tmp_path, claim_ahead, claims_ahead
):
    env = dygo_env(db_url, DYGO_CONFIG_DIR=str(config(tmp_path, claim_ahead)))
    worker = spawn("worker", "--queue", "default", "--concurrency", "2", env=env)
    worker.wait_for_line("started")
    learn_the_pace(conn)
    enqueue_many(conn, [{"kind": "test.noop"} for _ in range(2000)])
    wait_until(lambda: count(conn, "state = 'succeeded'") == 2300, timeout=60, message="2,300 jobs to succeed")
    assert count(conn, "attempt = 1") == 2300  # each ran once: none was handed back
    if claims_ahead:
        assert largest_claim(conn) > 2
    else:
        assert largest_claim(conn) <= 2


def test_jobs_claimed_ahead_go_back_to_the_queue_when_a_slow_job_holds_the_slots(conn, db_url, spawn, tmp_path):
    # 50ms ahead: the waiting jobs go back after 1 s (the floor) with the slot held. The slow job takes 6 s; another
    # worker runs the others meanwhile.
    env = dygo_env(db_url, DYGO_CONFIG_DIR=str(config(tmp_path, "50ms")))
    first = spawn("worker", "--queue", "default", "--concurrency", "1", env=env)
    first.wait_for_line("started")
    learn_the_pace(conn)
    enqueue_many(conn, [{"kind": "test.record", "args": {"seconds": 6}}] + [{"kind": "test.noop"} for _ in range(10)])
    wait_until(
        lambda: count(conn, "state = 'active' AND kind = 'test.noop'") > 0,
        timeout=10,
        message="no-op jobs claimed ahead behind the slow one",
    )
    wait_until(
        lambda: "claimed-ahead job(s) (no slot of queue default freed for 1s)" in first.stderr(),
        timeout=10,
        message="the waiting jobs to be handed back",
    )
    second = spawn("worker", "--queue", "default", "--concurrency", "1", env=env)
    second.wait_for_line("started")
    wait_until(lambda: count(conn, "state = 'succeeded'") == 310, timeout=20, message="the 10 no-op jobs to succeed")
    assert count(conn, "kind = 'test.record' AND state = 'active'") == 1  # the slow one runs still
    assert count(conn, "kind = 'test.noop' AND attempt = 1") == 310  # handed back with the attempt refunded


def test_a_stopping_worker_hands_back_the_jobs_it_claimed_ahead_before_draining(conn, db_url, spawn, tmp_path):
    # 1s ahead: the slot is not stuck long enough (10 s) for the waiting jobs to be handed back before the stop.
    env = dygo_env(db_url, DYGO_CONFIG_DIR=str(config(tmp_path, "1s")))
    port = free_port()
    worker = spawn("worker", "--queue", "default", "--concurrency", "1", "--metrics-port", str(port), env=env)
    worker.wait_for_line("started")
    learn_the_pace(conn)
    enqueue_many(conn, [{"kind": "test.record", "args": {"seconds": 2}}] + [{"kind": "test.noop"} for _ in range(10)])
    wait_until(
        lambda: count(conn, "state = 'active' AND kind = 'test.noop'") > 0,
        timeout=10,
        message="no-op jobs claimed ahead behind the slow one",
    )
    waiting = wait_until(
        lambda: scrape_worker(port).get(("dygo_worker_claimed_ahead", (("queue", "default"),))),
        message="the worker's gauge of jobs claimed ahead",
    )
    assert waiting == count(conn, "state = 'active' AND kind = 'test.noop'")
    worker.signal(signal.SIGTERM)
    assert worker.wait() == 0
    found = re.search(r"handing back (\d+) claimed-ahead job\(s\) \(not started before the stop\)", worker.stderr())
    assert found, worker.stderr()
    assert count(conn, "kind = 'test.record' AND state = 'succeeded'") == 1  # the running one was drained
    assert (
        count(conn, "kind = 'test.noop' AND state = 'pending' AND attempt = 0 AND lease_owner IS NULL")
        == int(found.group(1))
        == waiting
    )
    assert count(conn, "state = 'active'") == 0


def test_a_capped_kind_claimed_ahead_never_runs_over_its_cap(conn, db_url, spawn, tmp_path):
    from tests.test_flow_caps import ended, max_overlap

    # Short jobs and a wide claim_ahead: the worker holds many jobs, the capped kind's among them. A held job
    # of the kind counts against its cap, so the kind never runs two at once, however its jobs are held.
    env = dygo_env(db_url, DYGO_CONFIG_DIR=str(config(tmp_path, "200ms")))
    worker = spawn("worker", "--queue", "default", "--concurrency", "8", "--poll-interval", "60s", env=env)
    worker.wait_for_line("started")
    learn_the_pace(conn)
    enqueue_many(
        conn, [{"kind": kind, "args": {"seconds": 0.002}} for _ in range(60) for kind in ("test.capped", "test.span")]
    )
    wait_until(lambda: ended(conn, 120), timeout=30, message="all 120 jobs to end")
    assert max_overlap(conn, ("test.capped",)) == 1
    assert max_overlap(conn, ("test.span",)) > 1
    assert largest_claim(conn) > 8  # it did claim ahead of its 8 slots
