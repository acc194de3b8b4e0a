"""dygo's pytest plugin (dygo/testing.py) as a project uses it: the example shop of docs/guides/testing.md
(tests/projects/shop), copied out and tested by its own pytest run, with `-p dygo.testing` from its
pyproject.toml, on this suite's PostgreSQL server."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import psycopg

from tests.conftest import REPO

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


def test_a_drain_that_never_ends_says_so(tmp_path: Path, server_url: str) -> None:
    project = tmp_path / "loop"
    shutil.copytree(SHOP, project, ignore=shutil.ignore_patterns("test_*.py"))
    (project / "shop_jobs.py").write_text(
        (SHOP / "shop_jobs.py").read_text()
        + '\n\n@job("loop.again")\ndef again(ctx: JobContext, args: dict) -> None:\n'
        '    with psycopg.connect(os.environ["DATABASE_URL"], autocommit=True) as conn:\n'
        '        enqueue(conn, "loop.again", {})\n'
    )
    (project / "test_loop.py").write_text(
        "import pytest\nfrom dygo import enqueue\nfrom dygo.testing import DrainNeverEnds\n\n\n"
        "def test_loop(dygo_conn, drain):\n"
        '    enqueue(dygo_conn, "loop.again", {})\n'
        "    with pytest.raises(DrainNeverEnds, match='still due after 3 rounds'):\n"
        "        drain(max_rounds=3)\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DYGO_", "PYTHON", "PYTEST"))}
    env["DATABASE_URL"] = server_url
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"],
        cwd=project,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
