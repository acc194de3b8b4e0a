"""Failover, the short forms: a multi-host URL (`host=a,b target_session_attrs=read-write`) taken by
`dygo migrate`, `dygo worker` and `dygo serve`, which find the primary among the hosts; a worker on a read-only
server waits for it to become writable, saying so once. The promotion of a real standby after its primary's
crash is chaos scenario 8 (chaos/failover.py, `make chaos`): building the pair takes longer than a test may."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import psycopg
from dygo.store import enqueue
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from tests.conftest import REPO, dygo_env, start_serve, wait_until


def multi_host(db_url: str, tmp_path: Path) -> str:
    """`db_url` behind a first host where no server listens (an empty socket directory): the primary is the second."""
    params = conninfo_to_dict(db_url)
    (tmp_path / "gone").mkdir()
    return make_conninfo(
        db_url,
        host=f"{tmp_path / 'gone'},{params['host']}",
        port=f"{params.get('port') or 5432},{params.get('port') or 5432}",
        target_session_attrs="read-write",
    )


def succeeded(conn: psycopg.Connection, job_id: int) -> bool:
    return conn.execute("SELECT state = 'succeeded' FROM dygo_jobs WHERE id = %s", (job_id,)).fetchone()[0]


def test_migrate_worker_and_serve_take_a_multi_host_url_and_find_the_primary(conn, db_url, spawn, tmp_path):
    url = multi_host(db_url, tmp_path)
    # The three start side by side: a process's start-up is most of this test's time.
    migrate = subprocess.Popen(
        [sys.executable, "-m", "dygo", "migrate"], cwd=REPO, env=dygo_env(url), stderr=subprocess.PIPE, text=True
    )
    worker = spawn("worker", "--poll-interval", "60s", env=dygo_env(url, DATABASE_DIRECT_URL=url))
    api = start_serve(url, spawn)
    assert migrate.wait(30) == 0, migrate.communicate()[1]
    worker.wait_for_line("ready")
    reply = api.admin.post("/api/v1/jobs", json={"kind": "test.record", "args": {}})
    assert reply.status_code == 201, reply.text
    wait_until(lambda: succeeded(conn, reply.json()["id"]), message="the job enqueued through serve to succeed")
    assert "connection lost" not in worker.stderr()
    api.close()


def test_a_worker_on_a_read_only_server_waits_says_so_once_and_starts_when_it_can_write(conn, db_url, spawn):
    database = conninfo_to_dict(db_url)["dbname"]
    conn.execute(f"ALTER DATABASE {database} SET default_transaction_read_only = on")
    job = enqueue(conn, "test.record", {})
    worker = spawn("worker", "--poll-interval", "60s")
    wait_until(lambda: "not the primary" in worker.stderr(), message="the worker to say the server is read-only")
    conn.execute(f"ALTER DATABASE {database} RESET default_transaction_read_only")  # as a promotion would
    worker.wait_for_line("ready", timeout=15)
    wait_until(lambda: succeeded(conn, job.id), message="the job to run once the server can write")
    assert worker.stderr().count("not the primary") == 1
    assert worker.process.poll() is None
