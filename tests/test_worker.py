"""`dygo worker` as a real process: outcomes, timeouts, crashes, shutdown, wake-ups, scale."""

from __future__ import annotations

import signal
import time

import psycopg
import pytest
from dygo.store import enqueue, enqueue_many

from tests.conftest import wait_until


def job_row(conn, job_id: int) -> dict:
    cursor = conn.cursor(row_factory=psycopg.rows.dict_row)
    return cursor.execute("SELECT * FROM dygo_jobs WHERE id = %s", (job_id,)).fetchone()


def wait_for_state(conn, job_id: int, *states: str, timeout: float = 20) -> dict:
    def reached():
        row = job_row(conn, job_id)
        return row if row["state"] in states else None

    return wait_until(reached, timeout, message=f"job {job_id} to be {states}")


@pytest.fixture
def worker(spawn):
    process = spawn("worker", "--poll-interval", "60s")
    process.wait_for_line("started")
    return process


def test_once_runs_one_batch_then_exits_0(conn, spawn):
    ids = [r.id for r in enqueue_many(conn, [{"kind": "test.record"}] * 3)]
    process = spawn("worker", "--once")
    assert process.wait() == 0
    assert "ran 3 job(s) once" in "".join(process.lines)
    states = conn.execute("SELECT array_agg(DISTINCT state) FROM dygo_jobs WHERE id = ANY(%s)", (ids,)).fetchone()[0]
    assert states == ["succeeded"]
    assert f"job {ids[0]} test.record attempt 1/20 succeeded" in process.stderr()


def test_stdout_has_lifecycle_lines_and_stderr_one_line_per_execution(conn, worker):
    job = enqueue(conn, "test.record", {})
    wait_for_state(conn, job.id, "succeeded")
    worker.signal(signal.SIGTERM)
    assert worker.wait() == 0
    stdout = "".join(worker.lines)
    assert "started: queues default(8), other(2); listening" in stdout
    assert "stopping" in stdout and "stopped" in stdout
    assert "test.record" not in stdout
    assert worker.stderr().count(f"job {job.id} test.record attempt 1/20 succeeded in") == 1


def test_handler_gets_its_context_and_result_is_stored(conn, worker):
    job = enqueue(conn, "test.context", {}, meta={"tenant": "acme"})
    result = wait_for_state(conn, job.id, "succeeded")["result"]
    assert result["id"] == job.id and result["kind"] == "test.context" and result["queue"] == "other"
    assert (result["attempt"], result["max_attempts"], result["is_retry"]) == (1, 20, False)
    assert result["meta"] == {"tenant": "acme"} and result["has_deadline"]


def test_failed_job_is_retried_with_backoff_until_it_succeeds(conn, worker):
    job = enqueue(conn, "test.fail", {"times": 2})
    row = wait_for_state(conn, job.id, "succeeded")
    assert row["attempt"] == 3 and row["result"] == "recovered"
    assert [e["attempt"] for e in row["errors"]] == [1, 2]
    assert row["errors"][1]["error"] == "ValueError: failure number 2"
    assert "raise ValueError" in row["errors"][1]["traceback"]
    runs = conn.execute("SELECT at FROM test_runs WHERE job_id = %s ORDER BY at", (job.id,)).fetchall()
    gaps = [(b[0] - a[0]).total_seconds() for a, b in zip(runs, runs[1:], strict=False)]
    assert gaps[0] >= 0.05 and gaps[1] >= 0.1  # 50 ms, then 100 ms: exponential


def test_job_out_of_attempts_is_dead_with_its_whole_history(conn, worker):
    job = enqueue(conn, "test.fail", {"times": 10})
    row = wait_for_state(conn, job.id, "dead")
    assert row["attempt"] == 3 and len(row["errors"]) == 3
    assert row["finished_at"] is not None and row["last_error"] == "ValueError: failure number 3"


def test_abort_kills_the_job_at_once(conn, worker):
    job = enqueue(conn, "test.abort", {})
    row = wait_for_state(conn, job.id, "dead")
    assert row["attempt"] == 1 and row["last_error"] == "Abort: bad input, never retry"


def test_retry_after_schedules_the_next_attempt_after_its_delay(conn, worker):
    job = enqueue(conn, "test.retry_after", {})
    wait_until(lambda: job_row(conn, job.id)["attempt"] == 1 and job_row(conn, job.id)["state"] == "pending")
    assert conn.execute(
        "SELECT run_at - now() BETWEEN interval '25 s' AND interval '30 s' FROM dygo_jobs WHERE id = %s", (job.id,)
    ).fetchone()[0]


def test_reportable_failure_is_logged_loudly_when_retries_run_out(conn, worker):
    job = enqueue(conn, "test.reportable", {})
    wait_for_state(conn, job.id, "dead")
    wait_until(lambda: "REPORTABLE" in worker.stderr())
    assert "the payment provider refused" in worker.stderr()


def test_snooze_runs_again_later_without_spending_an_attempt(conn, worker):
    job = enqueue(conn, "test.snooze", {})
    row = wait_for_state(conn, job.id, "succeeded")
    assert (row["attempt"], row["result"], row["errors"]) == (1, "ran after 2 snoozes", [])


@pytest.mark.parametrize("kind", ["test.hang", "test.hang_sync"])
def test_timeout_is_a_failed_attempt_and_the_worker_carries_on(conn, worker, kind):
    job = enqueue(conn, kind, {})
    row = wait_for_state(conn, job.id, "dead")
    assert row["last_error"] == "timed out after 200ms"
    after = enqueue(conn, "test.record", {})
    wait_for_state(conn, after.id, "succeeded")


@pytest.mark.parametrize(
    ("kind", "error"),
    [
        ("test.unserialisable", "result is not JSON-serialisable"),
        ("test.exit", "SystemExit: 3"),
    ],
)
def test_bad_handler_behaviour_is_a_recorded_failure(conn, worker, kind, error):
    job = enqueue(conn, kind, {})
    assert wait_for_state(conn, job.id, "dead")["last_error"].startswith(error)
    assert worker.process.poll() is None


def test_kind_without_a_handler_dies_without_retry(conn, worker):
    job = enqueue(conn, "gone.kind", {}, queue="default")
    row = wait_for_state(conn, job.id, "dead")
    assert row["attempt"] == 1 and row["max_attempts"] == 20
    assert "no handler for kind 'gone.kind'" in row["last_error"]


def test_notify_wakes_an_idle_worker_well_under_the_poll_interval(conn, worker):
    time.sleep(0.5)  # let it go idle
    job = enqueue(conn, "test.noop", {})
    row = wait_for_state(conn, job.id, "succeeded", timeout=5)
    assert (row["started_at"] - row["enqueued_at"]).total_seconds() < 0.5


def test_scheduled_job_starts_when_due_without_a_notification(conn, worker):
    time.sleep(0.3)
    job = enqueue(conn, "test.noop", {}, delay="1s")
    row = wait_for_state(conn, job.id, "succeeded", timeout=10)
    late = (row["started_at"] - row["run_at"]).total_seconds()
    assert 0 <= late < 0.5


def test_a_job_put_in_line_before_where_claims_start_is_claimed_at_the_next_walk_from_the_head(conn, worker):
    # After a claim that came back short, the worker's claims start at that claim's time, past the
    # entries of jobs claimed before it (worker/producer.py). A job whose run_at is earlier, as a hand-back,
    # a recovered lease or a back-dated enqueue has, is found by the walk from the head that follows
    # within a second; the poll interval is 60 s, so nothing else would find it in time.
    first = enqueue(conn, "test.noop", {})
    wait_for_state(conn, first.id, "succeeded", timeout=10)
    time.sleep(0.2)
    job_id = conn.execute(
        "INSERT INTO dygo_jobs (kind, queue, run_at) VALUES ('test.noop', 'default', "
        "now() - interval '1 hour') RETURNING id"
    ).fetchone()[0]
    row = wait_for_state(conn, job_id, "succeeded", timeout=10)
    assert (row["started_at"] - row["enqueued_at"]).total_seconds() < 2.5


def test_poll_only_worker_finds_jobs_by_polling(conn, spawn):
    process = spawn("worker", "--poll-only", "--poll-interval", "500ms")
    assert "polling only" in process.wait_for_line("started")
    job = enqueue(conn, "test.noop", {})
    wait_for_state(conn, job.id, "succeeded", timeout=5)


def test_concurrency_flag_overrides_the_configured_concurrency(conn, spawn):
    process = spawn("worker", "--concurrency", "3")
    process.wait_for_line("started: queues default(3), other(3)")
    assert conn.execute("SELECT queues FROM dygo_workers").fetchone()[0] == {"default": 3, "other": 3}
    enqueue_many(conn, [{"kind": "test.span", "args": {"seconds": 0.3}}] * 7)
    wait_until(lambda: conn.execute("SELECT count(*) FROM test_runs WHERE note = 'end'").fetchone()[0] == 7)
    # Handlers running at once, from their own start and end marks (a finished job may still
    # count as active in the table until its batch is settled).
    running = peak = 0
    for (note,) in conn.execute("SELECT note FROM test_runs ORDER BY at, note"):
        running += 1 if note == "start" else -1
        peak = max(peak, running)
    assert peak == 3


def test_heartbeat_row_lives_while_the_worker_runs(conn, worker):
    worker_id, queues = conn.execute("SELECT id, queues FROM dygo_workers").fetchone()
    assert worker_id.count(":") == 2 and queues == {"default": 8, "other": 2}
    worker.signal(signal.SIGINT)
    assert worker.wait() == 0
    assert conn.execute("SELECT count(*) FROM dygo_workers").fetchone()[0] == 0


def test_worker_killed_mid_job_is_recovered_and_finished_by_another(conn, spawn):
    job = enqueue(conn, "test.slow_first", {})
    first = spawn("worker")
    first.wait_for_line("started")
    wait_until(lambda: conn.execute("SELECT count(*) FROM test_runs").fetchone()[0] == 1)
    first.signal(signal.SIGKILL)
    first.wait()
    second = spawn("worker")
    second.wait_for_line("started")
    row = wait_for_state(conn, job.id, "succeeded", timeout=15)  # lease TTL is 2 s in tests
    assert row["result"] == "run 2" and row["reap_count"] == 1 and row["attempt"] == 1
    assert "stopped renewing" in row["errors"][0]["error"]
    pids = [r[0] for r in conn.execute("SELECT pid FROM test_runs ORDER BY at")]
    assert pids == [first.process.pid, second.process.pid]


def test_sigterm_lets_short_jobs_finish_and_hands_long_ones_straight_back(conn, spawn):
    worker = spawn("worker", "--shutdown-timeout", "1s")
    worker.wait_for_line("started")
    short = enqueue(conn, "test.record", {"seconds": 0.3})
    long = enqueue(conn, "test.slow_first", {})
    wait_until(lambda: conn.execute("SELECT count(*) FROM test_runs").fetchone()[0] == 2)
    began = time.monotonic()
    worker.signal(signal.SIGTERM)
    assert worker.wait() == 0
    assert time.monotonic() - began < 5
    assert job_row(conn, short.id)["state"] == "succeeded"
    handed_back = job_row(conn, long.id)
    assert (handed_back["state"], handed_back["attempt"], handed_back["lease_owner"]) == ("pending", 0, None)
    assert "handing back 1 unfinished job" in worker.stderr()

    successor = spawn("worker")
    successor.wait_for_line("started")
    assert wait_for_state(conn, long.id, "succeeded", timeout=5)["result"] == "run 2"


def test_four_workers_drain_5000_jobs_exactly_once(conn, spawn):
    # 5,000 jobs are dozens of claims by each of the four workers (50 slots each), racing for the same rows:
    # a job claimed twice, or never, shows in that many as it would in more.
    enqueue_many(conn, [{"kind": "test.mark"}] * 5_000)
    workers = [spawn("worker", "--queue", "default", "--concurrency", "50") for _ in range(4)]
    for process in workers:
        process.wait_for_line("started")
    wait_until(
        lambda: conn.execute("SELECT count(*) FROM dygo_jobs WHERE state = 'succeeded'").fetchone()[0] == 5_000,
        timeout=120,
        interval=0.25,
        message="5,000 jobs to succeed",
    )
    runs, distinct, pids = conn.execute(
        "SELECT count(*), count(DISTINCT job_id), count(DISTINCT pid) FROM test_runs"
    ).fetchone()
    assert (runs, distinct) == (5_000, 5_000)
    assert pids == 4


@pytest.fixture
def schemaless_url(server_url):
    """A database with no dygo schema yet: a fresh deploy before its release phase ran."""
    from psycopg.conninfo import make_conninfo

    with psycopg.connect(server_url, autocommit=True) as admin:
        admin.execute("DROP DATABASE IF EXISTS dygo_empty WITH (FORCE)")
        admin.execute("CREATE DATABASE dygo_empty")
    yield make_conninfo(server_url, dbname="dygo_empty")
    with psycopg.connect(server_url, autocommit=True) as admin:
        admin.execute("DROP DATABASE IF EXISTS dygo_empty WITH (FORCE)")


def test_worker_and_serve_give_up_waiting_for_the_schema_after_the_bound(schemaless_url, spawn):
    from tests.conftest import dygo_env

    env = dygo_env(schemaless_url, DYGO_SCHEMA_WAIT="1s")
    for command in ("worker", "serve"):
        process = spawn(command, env=env)
        assert process.wait() == 1
        assert "waiting up to 1s" in process.stderr()
        assert "run `dygo migrate`" in process.stderr().splitlines()[-1]


def test_worker_and_serve_started_before_migrate_wait_for_the_schema(schemaless_url, spawn):
    # A process manager starts everything at once (honcho start with the Procfile, compose, systemd):
    # web and worker must not lose the race against the release phase.
    from tests.conftest import dygo_env, free_port

    env = dygo_env(schemaless_url)
    worker = spawn("worker", env=env)
    port = free_port()
    serve = spawn("serve", "--port", str(port), env=env)
    for process in (worker, serve):
        wait_until(lambda process=process: "has no dygo schema yet" in process.stderr(), message="the waiting line")
    time.sleep(1.0)
    assert worker.process.poll() is None and serve.process.poll() is None  # still waiting, not failed
    assert spawn("migrate", env=env).wait() == 0
    worker.wait_for_line("started")
    serve.wait_for_line("dygo serve: http://")
    for process in (worker, serve):
        assert process.stderr().count("has no dygo schema yet") == 1  # one line, not one per poll
        process.signal(signal.SIGTERM)
        assert process.wait() == 0


def test_lease_is_renewed_while_a_long_job_runs(conn, spawn):
    job = enqueue(conn, "test.record", {"seconds": 5})  # lease TTL is 2 s in tests
    runner = spawn("worker", "--queue", "default")
    runner.wait_for_line("started")
    wait_until(lambda: job_row(conn, job.id)["state"] == "active")
    rival = spawn("worker", "--queue", "default")  # would recover the job if its lease lapsed
    rival.wait_for_line("started")
    row = wait_for_state(conn, job.id, "succeeded", timeout=15)
    assert (row["reap_count"], row["attempt"], row["errors"]) == (0, 1, [])
    assert conn.execute("SELECT count(*) FROM test_runs").fetchone()[0] == 1


def test_kind_max_attempts_applies_to_a_job_whose_producer_never_imported_the_kind(conn, db_url, spawn, tmp_path):
    import subprocess
    import sys

    from tests.conftest import REPO, TEST_CONFIG

    producer = (
        "import sys, psycopg\nfrom dygo import enqueue\n"
        "with psycopg.connect(sys.argv[1], autocommit=True) as conn:\n"
        "    print(enqueue(conn, 'test.fail', {}, queue='default').id)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", producer, db_url],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO), "DYGO_CONFIG_DIR": str(TEST_CONFIG)},
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    job_id = int(done.stdout)
    assert spawn("worker", "--once").wait() == 0
    row = job_row(conn, job_id)
    assert (row["attempt"], row["max_attempts"]) == (1, 3)  # test.fail is declared with max_attempts=3
