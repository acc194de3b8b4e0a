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
