"""dygo through a real PgBouncer 1.18 in transaction pooling mode (tests/pgbouncer.py): no server-side
prepared statements, no session state across transactions, LISTEN on DATABASE_DIRECT_URL or none."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from dygo.store import enqueue, enqueue_many

from tests.conftest import TEST_CONFIG, dygo_env, wait_until
from tests.pgbouncer import PgBouncer

FINAL = ("succeeded", "dead")


@pytest.fixture
def pooled(pgbouncer: PgBouncer, db_url: str) -> Iterator[psycopg.Connection]:
    """A connection to this test's database through PgBouncer, as an application would open it."""
    with psycopg.connect(pgbouncer.url(db_url), autocommit=True, prepare_threshold=None) as conn:
        yield conn


def through(pgbouncer: PgBouncer, db_url: str, direct: bool = True, **extra: str) -> dict[str, str]:
    """A dygo process's environment: DATABASE_URL through PgBouncer, the direct URL beside it or not."""
    if direct:
        extra["DATABASE_DIRECT_URL"] = db_url
    else:
        extra["DYGO_POOL_MODE"] = "transaction"
    return dygo_env(pgbouncer.url(db_url), **extra)


def states(conn: psycopg.Connection, ids: list[int]) -> dict[str, int]:
    rows = conn.execute("SELECT state, count(*) FROM dygo_jobs WHERE id = ANY(%s) GROUP BY state", (ids,))
    return dict(rows.fetchall())


def all_final(conn: psycopg.Connection, ids: list[int]) -> bool:
    return sum(n for state, n in states(conn, ids).items() if state in FINAL) == len(ids)


def assert_no_pooler_trouble(stderr: str) -> None:
    assert "DuplicatePreparedStatement" not in stderr and "prepared statement" not in stderr
    assert "connection lost" not in stderr, stderr[-3000:]


def test_jobs_and_retries_run_through_pgbouncer_with_listen_on_the_direct_url(pgbouncer, db_url, pooled, spawn):
    worker = spawn("worker", "--poll-interval", "60s", env=through(pgbouncer, db_url))
    assert "; listening, poll every 60s" in worker.wait_for_line("started")
    # Enough jobs that every statement runs far more than psycopg's 5 executions before it would prepare.
    ids = [j.id for j in enqueue_many(pooled, [{"kind": "test.record"}] * 200)]
    recovered = enqueue(pooled, "test.fail", {"times": 2}).id
    dead = enqueue(pooled, "test.fail", {"times": 10}).id
    for _ in range(20):
        ids.append(enqueue(pooled, "test.noop", {}).id)
    wait_until(lambda: all_final(pooled, [*ids, recovered, dead]), timeout=60, message="every job to finish")
    assert states(pooled, ids) == {"succeeded": len(ids)}
    assert pooled.execute("SELECT state, attempt FROM dygo_jobs WHERE id = %s", (recovered,)).fetchone() == (
        "succeeded", 3)
    assert pooled.execute("SELECT state, attempt FROM dygo_jobs WHERE id = %s", (dead,)).fetchone() == ("dead", 3)
    assert_no_pooler_trouble(worker.stderr())


def test_worker_behind_a_pooler_without_a_direct_url_polls_and_says_so(pgbouncer, db_url, pooled, spawn):
    worker = spawn("worker", "--poll-interval", "300ms", env=through(pgbouncer, db_url, direct=False))
    started = worker.wait_for_line("started")
    assert "polling only (DATABASE_URL goes through a transaction pooler and DATABASE_DIRECT_URL is not set" in started
    ids = [j.id for j in enqueue_many(pooled, [{"kind": "test.record"}] * 30)]
    wait_until(lambda: all_final(pooled, ids), timeout=30, message="the jobs to be found by polling")
    assert states(pooled, ids) == {"succeeded": 30}
    listeners = pooled.execute("SELECT count(*) FROM pg_stat_activity WHERE application_name LIKE "
                               "'dygo-worker-listen%'").fetchone()[0]
    assert listeners == 0
    assert_no_pooler_trouble(worker.stderr())


def test_leases_are_renewed_through_pgbouncer(pgbouncer, db_url, pooled, spawn):
    spawn("worker", env=through(pgbouncer, db_url)).wait_for_line("started")
    job = enqueue(pooled, "test.record", {"seconds": 3.5})  # lease_ttl is 2s in tests/config
    wait_until(lambda: all_final(pooled, [job.id]), timeout=20, message="the long job to finish")
    assert pooled.execute("SELECT state, attempt, reap_count FROM dygo_jobs WHERE id = %s",
                          (job.id,)).fetchone() == ("succeeded", 1, 0)


def test_cron_fires_through_pgbouncer(pgbouncer, db_url, pooled, spawn, tmp_path: Path):
    for name in ("queues.yml", "dygo.yml"):
        (tmp_path / name).write_text((TEST_CONFIG / name).read_text())
    (tmp_path / "schedules.yml").write_text("schedules:\n  - {name: yearly, cron: '@yearly', kind: test.mark}\n")
    env = through(pgbouncer, db_url, DYGO_CONFIG_DIR=str(tmp_path))
    worker = spawn("worker", env=env)
    worker.wait_for_line("started")
    pooled.execute("UPDATE dygo_schedules SET next_run_at = now() + interval '1 second' WHERE name = 'yearly'")
    wait_until(lambda: pooled.execute("SELECT count(*) FROM dygo_jobs WHERE meta->>'schedule' = 'yearly' "
                                      "AND state = 'succeeded'").fetchone()[0] == 1, timeout=15,
               message="the occurrence to fire and run")
    assert_no_pooler_trouble(worker.stderr())


def test_pgbouncer_restart_mid_run_loses_nothing(pgbouncer, db_url, pooled, spawn):
    worker = spawn("worker", "--poll-interval", "1s", env=through(pgbouncer, db_url))
    worker.wait_for_line("started")
    ids = [j.id for j in enqueue_many(pooled, [{"kind": "test.record", "args": {"seconds": 0.02}}] * 400)]
    wait_until(lambda: states(pooled, ids).get("succeeded", 0) >= 50, timeout=30, message="the run to get going")
    pgbouncer.stop()  # every pooled connection of the worker (and of this test) is cut
    time.sleep(1.0)
    pgbouncer.start()
    with psycopg.connect(db_url, autocommit=True) as direct:
        wait_until(lambda: all_final(direct, ids), timeout=90, message="every job to finish after the restart")
        assert states(direct, ids) == {"succeeded": 400}
        ran, distinct = direct.execute("SELECT count(*), count(DISTINCT job_id) FROM test_runs").fetchone()
        assert distinct == 400 and ran <= 400 + 8 * 2  # at most the in-flight jobs ran twice
    stderr = worker.stderr()
    assert stderr.count("connection lost") == stderr.count("connection back") >= 1
