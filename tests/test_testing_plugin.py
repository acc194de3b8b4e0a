"""dygo's pytest plugin (dygo/testing.py) as a project uses it: the example shop of docs/guides/testing.md
(tests/projects/shop), copied out and tested by its own pytest run, with `-p dygo.testing` from its
pyproject.toml, on this suite's PostgreSQL server; and a drain in this process."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest
from dygo.store import testing as testing_store
from dygo.store.config import load_settings
from dygo.store.registry import registry

from dygo import enqueue
from dygo.testing import DrainNeverEnds, drain_jobs
from tests.conftest import REPO, TEST_CONFIG

SHOP = REPO / "tests" / "projects" / "shop"


def test_the_example_projects_tests_pass_with_the_plugin(tmp_path: Path, server_url: str) -> None:
    project = tmp_path / "shop"
    shutil.copytree(SHOP, project)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DYGO_", "PYTHON", "PYTEST"))}
    env["DATABASE_URL"] = server_url
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-W", "error::pytest.PytestWarning"],
        cwd=project,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert "5 passed" in done.stdout
    # Every scratch database it made is gone again.
    with psycopg.connect(server_url, autocommit=True) as conn:
        left = conn.execute("SELECT datname FROM pg_database WHERE datname LIKE 'dygo_pytest%'").fetchall()
    assert left == []


def test_a_drain_still_finding_jobs_after_its_rounds_says_so(db_url: str, conn: psycopg.Connection) -> None:
    settings = load_settings(TEST_CONFIG)
    enqueue(conn, "test.snooze", {})  # snoozes twice, then succeeds
    with pytest.raises(DrainNeverEnds, match="still due after 2 rounds") as stopped:
        drain_jobs(db_url, settings=settings, jobs=registry, max_rounds=2)
    runs = stopped.value.runs + drain_jobs(db_url, settings=settings, jobs=registry)
    assert [(run.kind, run.outcome) for run in runs] == [("test.snooze", "snoozed")] * 2 + [
        ("test.snooze", "succeeded")
    ]
    assert runs[-1].result == "ran after 2 snoozes"


def test_a_snooze_falling_due_after_a_drain_round_looked_is_still_run(conn: psycopg.Connection) -> None:
    # A round claimed nothing at `since`; the snooze (its attempt refunded) fell due just after, before the
    # delayed runs were made due.
    job_id = enqueue(conn, "test.snooze", {}).id
    later = enqueue(conn, "test.snooze", {}, delay=60).id
    since = testing_store.database_now(conn)
    conn.execute(
        "UPDATE dygo_jobs SET started_at = %s, run_at = %s + interval '1 ms' WHERE id = %s", (since, since, job_id)
    )
    conn.execute("SELECT pg_sleep(0.01)")
    assert testing_store.run_delayed_runs_now(conn, since) == 1
    # The next round looks after it: nothing delayed since then. A job enqueued for later keeps its time.
    assert testing_store.run_delayed_runs_now(conn, testing_store.database_now(conn)) == 0
    assert [(job.id, job.state) for job in testing_store.enqueued_jobs(conn)] == [
        (job_id, "pending"),
        (later, "scheduled"),
    ]
