"""Health, readiness, live workers, nuke (development only), and a lost database."""

from __future__ import annotations

import signal

import psycopg
from dygo.store import enqueue
from dygo.store.workflows import Workflow, enqueue_workflow
from psycopg.conninfo import conninfo_to_dict

from tests.conftest import wait_until


def test_health_is_open_and_readiness_checks_the_schema(api, conn):
    assert api.anon.get("/healthz").json() == {"status": "ok"}
    ready = api.anon.get("/readyz")
    assert ready.status_code == 200 and ready.json()["status"] == "ready"
    version = ready.json()["schema_version"]
    conn.execute("DELETE FROM dygo_migrations WHERE version = %s", (version,))
    not_ready = api.anon.get("/readyz")
    assert not_ready.status_code == 503
    error = not_ready.json()["error"]
    assert error["code"] == "not_ready" and "dygo migrate" in error["message"]
    assert error["details"] == {"check": "schema"}


def test_workers_lists_live_worker_processes(api, spawn):
    assert api.reader.get("/api/v1/workers").json() == {"workers": []}
    worker = spawn("worker", "--queue", "other", "--concurrency", "3")
    worker.wait_for_line("started")
    [listed] = api.reader.get("/api/v1/workers").json()["workers"]
    assert listed["queues"] == {"other": 3} and listed["pid"] == worker.process.pid
    assert listed["id"].startswith(f"{listed['hostname']}:{listed['pid']}:")
    worker.signal(signal.SIGTERM)
    assert worker.wait() == 0
    wait_until(lambda: api.reader.get("/api/v1/workers").json()["workers"] == [], message="the worker to leave")


def test_nuke_empties_everything_in_development(api, conn):
    for _ in range(3):
        enqueue(conn, "test.noop", {}, idempotency_key=None)
    enqueue(conn, "test.noop", {}, idempotency_key="k", idempotency_ttl="1h")
    wf = Workflow("nuked")  # a workflow with jobs not yet run: its nodes count them as they go
    wf.add("first", "test.noop", {})
    wf.add("second", "test.noop", {}, after="first")
    enqueue_workflow(conn, wf)
    api.admin.post("/api/v1/queues/default/pause")
    assert api.reader.post("/api/v1/nuke").status_code == 403  # read-only token
    report = api.admin.post("/api/v1/nuke").json()
    assert (report["jobs"], report["idempotency_keys"], report["queue_pauses"]) == (6, 1, 1)
    assert report["stats_rows"] >= 1
    assert conn.execute("SELECT count(*) FROM dygo_jobs").fetchone()[0] == 0
    assert conn.execute("SELECT count(*) FROM dygo_workflows").fetchone()[0] == 0
    assert not api.reader.get("/api/v1/queues/default").json()["paused"]


def test_nuke_is_refused_outside_development(serve, conn):
    production = serve("--env", "production")
    enqueue(conn, "test.noop", {})
    response = production.admin.post("/api/v1/nuke")
    assert response.status_code == 403 and response.json()["error"]["code"] == "development_only"
    assert conn.execute("SELECT count(*) FROM dygo_jobs").fetchone()[0] == 1


def test_a_lost_database_is_a_503_not_a_stack_trace(api, db_url, server_url):
    assert api.reader.get("/api/v1/queues").status_code == 200
    with psycopg.connect(server_url, autocommit=True) as admin:
        admin.execute(f"DROP DATABASE {conninfo_to_dict(db_url)['dbname']} WITH (FORCE)")
    response = api.reader.get("/api/v1/queues")
    assert response.status_code == 503
    assert response.json()["error"]["code"] == "database_unavailable" and "Traceback" not in response.text
