"""The fault-injection suite in its short form: every scenario of chaos/runner.py but `presence` (whose
point tests/test_presence.py proves in less time) with a few hundred jobs and a couple of faults (the
failover and replica scenarios: a few seconds of jobs on a primary and its standby), through
`python -m chaos --short` (its own process: the chaos job kinds must not join this process's registry) on a
dedicated embedded server, which scenario 2 restarts. The books check is the same as in the full `make chaos`
run."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from dygo.store import JobRequest, embedded, enqueue, enqueue_many

from tests.conftest import wait_until

pytestmark = pytest.mark.alone

REPO = Path(__file__).resolve().parent.parent
DATA_DIR = REPO / ".dygo" / "chaos-test"


@pytest.fixture(scope="module")
def data_dir() -> Iterator[Path]:
    yield DATA_DIR
    embedded.stop(DATA_DIR)


def short(data_dir: Path, scenario: str, tmp_path: Path, least_jobs: int = 300) -> dict[str, Any]:
    out = tmp_path / "report.json"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "chaos",
            "--short",
            "--scenario",
            scenario,
            "--data-dir",
            str(data_dir),
            "--json",
            str(out),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=110,
    )
    assert out.exists(), done.stderr[-3000:]
    [report] = json.loads(out.read_text())
    assert report["problems"] == [], f"{report['problems']}; notes {report['notes']}; logs in {data_dir / 'logs'}"
    assert done.returncode == 0, done.stderr[-3000:]
    assert report["lost"] == report["stuck"] == report["over_run"] == report["stale_settles"] == 0
    assert report["jobs"] >= least_jobs
    return report


def test_killed_and_frozen_workers_lose_no_job_and_stale_settles_are_refused(data_dir, tmp_path):
    report = short(data_dir, "kill", tmp_path)
    assert report["notes"]["kills"] >= 1 and report["notes"]["freezes"] >= 1
    # Recovery waits for the lease TTL (3s) to run out, then for the next recovery pass.
    assert report["max_recovery"] is not None and report["max_recovery"] < 3.0 + 4.0, report["notes"]


def test_database_restart_is_survived_logged_once_and_serve_answers_503_meanwhile(data_dir, tmp_path):
    report = short(data_dir, "restart", tmp_path)
    assert report["faults"] == 1
    assert report["notes"]["serve_answers_while_down"] == ["503 database_unavailable"]
    assert all(lines == [1, 1] for lines in report["notes"]["log_lines_per_process"].values())
    assert report["max_recovery"] is not None and report["max_recovery"] < 10.0


def test_terminated_backends_and_listen_connection_miss_no_wake_up_beyond_the_poll_interval(data_dir, tmp_path):
    report = short(data_dir, "terminate", tmp_path)
    assert report["notes"]["backends_terminated"] >= 2
    assert report["max_recovery"] is not None and report["max_recovery"] <= report["notes"]["poll_interval"]


def test_sigterm_during_deploys_hands_long_jobs_back_and_a_new_worker_starts_them_at_once(data_dir, tmp_path):
    report = short(data_dir, "deploy", tmp_path)
    assert report["notes"]["handed_back"] >= 1
    assert report["max_recovery"] is not None and report["max_recovery"] < 1.0


def test_misbehaving_handlers_each_end_dead_with_their_error_and_the_worker_stays_up(data_dir, tmp_path):
    report = short(data_dir, "handlers", tmp_path)
    assert len(report["notes"]["misbehaving_by_kind"]) == 11  # every kind in chaos.jobs.MISBEHAVING


def test_a_failover_to_a_synchronous_standby_loses_no_acknowledged_job_and_workers_follow_it(data_dir, tmp_path):
    # A few seconds of jobs on a primary and its standby: fewer than the other scenarios' 300.
    report = short(data_dir, "failover", tmp_path, least_jobs=100)
    notes = report["notes"]
    assert notes["acknowledged_jobs_lost"] == 0 and notes["standby_worker_read_only_lines"] == 1
    # Every worker on the multi-host URL, and the one on the standby alone, claims on the new primary.
    assert len(notes["seconds_to_claim_after_promotion"]) == 3
    assert report["max_recovery"] is not None and report["max_recovery"] < notes["claim_limit"]


def test_with_a_streaming_replica_lists_counts_and_metrics_run_there_and_none_on_the_primary(data_dir, tmp_path):
    report = short(data_dir, "replica", tmp_path, least_jobs=21)
    notes = report["notes"]
    assert notes["job_reads_on_both"] == 0 and notes["job_reads_on_standby"] >= 4
    assert notes["ran_on_standby"] == {"queue counts": True, "metrics": True}
    assert float(notes["metrics_replica_lag"]) >= 0
    assert notes["dashboard_notice"].endswith("s behind the primary.")
    assert notes["enqueue_status"] == 201 and notes["read_by_id_at_once"] == 200
    assert notes["pause_answer_paused"] is True and notes["wait_answer_id"] is not None


def test_a_job_reclaimed_by_the_same_worker_during_its_first_run_leaves_the_worker_whole(conn, spawn):
    """A database outage longer than the lease TTL gets a running job recovered, and the worker that
    still runs it can claim it again: both runs must keep their own bookkeeping (slots, leases)."""
    worker = spawn("worker", "--queue", "default", "--concurrency", "2", "--poll-interval", "60s")
    worker.wait_for_line("started")
    job = enqueue(conn, "test.slow_first_briefly", {"seconds": 3})
    runs = "SELECT count(*) FROM test_runs WHERE job_id = %s"
    wait_until(lambda: conn.execute(runs, (job.id,)).fetchone()[0] == 1, message="the first run")
    # What lease recovery does to a job whose lease ran out (store/sql/leases.py RECOVER_EXPIRED_LEASES).
    conn.execute(
        "UPDATE dygo_jobs SET state = 'pending', lease_owner = NULL, lease_token = NULL, "
        "lease_deadline = NULL, attempt = attempt - 1, reap_count = reap_count + 1 WHERE id = %s",
        (job.id,),
    )
    wait_until(
        lambda: conn.execute("SELECT state = 'succeeded' FROM dygo_jobs WHERE id = %s", (job.id,)).fetchone()[0],
        message="the second run to succeed",
    )
    wait_until(lambda: "lease lost before settling" in worker.stderr(), message="the first run's refused settle")
    assert conn.execute("SELECT result FROM dygo_jobs WHERE id = %s", (job.id,)).fetchone()[0] == "run 2"
    assert "Traceback" not in worker.stderr()
    # Both slots are free again: two jobs run side by side.
    spans = enqueue_many(conn, [JobRequest("test.span", {"seconds": 0.5})] * 2)
    wait_until(
        lambda: (
            conn.execute(
                "SELECT count(*) FROM dygo_jobs WHERE id = ANY(%s) AND state = 'succeeded'", ([s.id for s in spans],)
            ).fetchone()[0]
            == 2
        ),
        message="the two spans",
    )
    notes = [
        n
        for (n,) in conn.execute(
            "SELECT note FROM test_runs WHERE job_id = ANY(%s) ORDER BY at", ([s.id for s in spans],)
        )
    ]
    assert notes == ["start", "start", "end", "end"]


def test_a_batch_callback_runs_once_soon_after_its_last_member_while_workers_are_killed(data_dir, tmp_path):
    """A batch of 2,000 members and one callback, two workers, a worker SIGKILLed once or twice while the members run:
    every member ran, the callback ran exactly once (a second run would break a unique index) and started
    within a second of the last member's settle, and the counters agree with the rows."""
    report = short(data_dir, "workflow", tmp_path)
    assert 1 <= report["notes"]["kills_per_run"][0] <= 2
    assert report["jobs"] == 2_001
    [lag] = report["notes"]["callback_lags"]
    assert lag <= report["notes"]["callback_lag_limit"], report["notes"]
    print(f"callback started {lag:.3f}s after the last member settled")
