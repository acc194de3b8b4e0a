"""Worker options and their rules: timers in a poll-only worker, the poll interval's
floor, recovery before the first claim, cron off, readiness."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import httpx
from dygo.store import enqueue

from tests.conftest import REPO, TEST_CONFIG, dygo_env, free_port, wait_until


def final_state(conn, job_id: int, timeout: float) -> str:
    def done():
        state = conn.execute("SELECT state FROM dygo_jobs WHERE id = %s", (job_id,)).fetchone()[0]
        return state if state in ("succeeded", "dead") else None

    return wait_until(done, timeout, message=f"job {job_id} to finish")


def test_poll_only_worker_runs_a_retry_it_scheduled_when_due_not_at_the_next_poll(conn, spawn):
    job = enqueue(conn, "test.fail", {"times": 1})  # attempt 1 fails; the retry is due ~50 ms later
    worker = spawn("worker", "--poll-only", "--poll-interval", "30s")
    worker.wait_for_line("started")
    assert final_state(conn, job.id, timeout=5) == "succeeded"
    first, second = [
        row[0] for row in conn.execute("SELECT at FROM test_runs WHERE job_id = %s ORDER BY at", (job.id,))
    ]
    assert (second - first).total_seconds() < 2


def test_poll_interval_of_zero_is_refused_with_a_clear_error(db_url):
    done = subprocess.run(
        [sys.executable, "-m", "dygo", "worker", "--poll-interval", "0"],
        cwd=REPO,
        env=dygo_env(db_url),
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 2
    assert "--poll-interval: must be a duration greater than 0 such as 500ms or 60s, got '0'" in done.stderr


def test_first_claim_after_start_follows_a_recovery_pass(conn, spawn):
    # A job whose worker died an hour ago, lease long expired, queued before everything else.
    orphan = conn.execute(
        "INSERT INTO dygo_jobs (kind, queue, state, attempt, run_at, started_at, lease_owner, lease_token, "
        "lease_deadline) VALUES ('test.record', 'default', 'active', 1, now() - interval '1 hour', "
        "now() - interval '1 hour', 'gone:1:abcdef', gen_random_uuid(), now() - interval '59 minutes') "
        "RETURNING id"
    ).fetchone()[0]
    fresh = enqueue(conn, "test.record", {})
    worker = spawn("worker", "--queue", "default", "--concurrency", "1")
    worker.wait_for_line("started")
    wait_until(lambda: conn.execute("SELECT count(*) FROM test_runs").fetchone()[0] == 2, message="both runs")
    order = [row[0] for row in conn.execute("SELECT job_id FROM test_runs ORDER BY at")]
    assert order == [orphan, fresh.id]  # recovered first, so claimed first: it had waited longest


def yearly_config(tmp_path: Path, extra: str = "") -> Path:
    tmp_path.mkdir()
    (tmp_path / "queues.yml").write_text((TEST_CONFIG / "queues.yml").read_text())
    (tmp_path / "dygo.yml").write_text((TEST_CONFIG / "dygo.yml").read_text() + extra)
    (tmp_path / "schedules.yml").write_text("schedules:\n  - {name: yearly, cron: '@yearly', kind: test.mark}\n")
    return tmp_path


def fired(conn) -> int:
    return conn.execute("SELECT count(*) FROM dygo_jobs WHERE meta->>'schedule' = 'yearly'").fetchone()[0]


def test_no_cron_flag_and_cron_false_setting_leave_schedules_to_other_workers(conn, db_url, spawn, tmp_path):
    flagged = spawn("worker", "--no-cron", env=dygo_env(db_url, DYGO_CONFIG_DIR=str(yearly_config(tmp_path / "a"))))
    assert "; cron off" in flagged.wait_for_line("started")
    configured = spawn(
        "worker", env=dygo_env(db_url, DYGO_CONFIG_DIR=str(yearly_config(tmp_path / "b", "cron: false\n")))
    )
    assert "; cron off" in configured.wait_for_line("started")
    # Neither synced the schedule: a cron-off worker does not touch schedules at all.
    assert conn.execute("SELECT count(*) FROM dygo_schedules").fetchone()[0] == 0
    firing = spawn("worker", env=dygo_env(db_url, DYGO_CONFIG_DIR=str(yearly_config(tmp_path / "c"))))
    firing.wait_for_line("started")
    conn.execute("UPDATE dygo_schedules SET next_run_at = now() WHERE name = 'yearly'")
    wait_until(lambda: fired(conn) == 1, timeout=10, message="the cron worker to fire")
    time.sleep(0.5)
    assert fired(conn) == 1
    assert "schedule yearly" in firing.stderr()
    assert "schedule yearly" not in flagged.stderr() + configured.stderr()


def test_worker_says_it_is_ready_on_stdout_by_file_and_on_its_metrics_port(db_url, spawn, tmp_path):
    ready_file = tmp_path / "ready"
    port = free_port()
    worker = spawn("worker", "--ready-file", str(ready_file), "--metrics-port", str(port))
    worker.wait_for_line("started")
    line = worker.wait_for_line(" ready")
    assert ready_file.read_text().strip() in line  # the worker id
    assert httpx.get(f"http://127.0.0.1:{port}/readyz").status_code == 200
    assert "dygo_worker_busy_slots" in httpx.get(f"http://127.0.0.1:{port}/metrics").text
    worker.signal(15)
    assert worker.wait() == 0
    assert not ready_file.exists()
