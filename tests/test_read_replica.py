"""DATABASE_READ_URL: serve's heavy reads (the lists of the API and the dashboard, the queues' counts and
stats, /metrics, the dashboard's counts and charts) go to it; writes and the reads that must see them (a job
by id, just enqueued, `?wait=`, an action's own reads) stay on the primary. Here the "replica" is a second
database of the same server holding other jobs, so an answer shows which of the two it read; the dashboard
says it reads from a replica, and that its lag is unknown (the server is not in recovery). A real streaming
replica is chaos/failover.py's."""

from __future__ import annotations

import psycopg
from dygo.store import admin, enqueue
from dygo.store.workflows import chain, enqueue_workflow
from psycopg.conninfo import make_conninfo

from tests.conftest import start_serve
from tests.test_metrics import heartbeat, scrape, value


def test_lists_and_dashboard_read_the_replica_while_enqueue_and_job_reads_stay_on_the_primary(
    conn, db_url, replica_url, spawn
):
    with psycopg.connect(replica_url, autocommit=True) as replica:
        on_replica = enqueue(replica, "test.noop", {"where": "replica"}).id + 1_000_000
        replica.execute("UPDATE dygo_jobs SET id = id + 1000000")  # ids the primary never hands out
    on_primary = enqueue(conn, "test.noop", {"where": "primary"}).id
    api = start_serve(db_url, spawn, tokens=False, DATABASE_READ_URL=replica_url)

    listed = [job["id"] for job in api.anon.get("/api/v1/jobs").json()["jobs"]]
    assert listed == [on_replica]
    enqueued = api.anon.post("/api/v1/jobs", json={"kind": "test.noop", "args": {}})
    assert enqueued.status_code == 201, enqueued.text
    new = enqueued.json()["id"]
    assert api.anon.get(f"/api/v1/jobs/{new}").status_code == 200  # just enqueued: read on the primary
    assert api.anon.get(f"/api/v1/jobs/{on_primary}").json()["args"] == {"where": "primary"}
    assert api.anon.post(f"/api/v1/jobs/{on_primary}/cancel").status_code == 200  # an action: the primary's row

    page = api.anon.get("/dashboard/jobs")
    assert page.status_code == 200
    assert f"/dashboard/jobs/{on_replica}" in page.text and f"/dashboard/jobs/{new}" not in page.text
    assert "Read from a replica (DATABASE_READ_URL): its lag is unknown" in page.text
    overview = api.anon.get("/dashboard/")
    assert overview.status_code == 200 and "Read from a replica" in overview.text
    assert "Read from a replica" not in api.anon.get(f"/dashboard/jobs/{new}").text  # a job's page: the primary
    api.close()


def test_queue_counts_stats_metrics_and_lists_read_the_replica_while_actions_and_waits_read_the_primary(
    conn, db_url, replica_url, spawn
):
    with psycopg.connect(replica_url, autocommit=True) as replica:
        for _ in range(3):
            enqueue(replica, "test.noop", {"where": "replica"})
        enqueue(replica, "test.noop", {}, queue="other")
        admin.pause_queue(replica, "other")
        heartbeat(replica, "worker-on-replica", {"default": 8})
        on_replica = enqueue_workflow(replica, chain("on-replica", ("a", "test.noop", {}))).id
    on_primary = enqueue(conn, "test.noop", {"where": "primary"}).id
    enqueue_workflow(conn, chain("on-primary", ("a", "test.noop", {})))
    api = start_serve(db_url, spawn, tokens=False, DATABASE_READ_URL=replica_url)
    client = api.anon

    queues = {q["name"]: q for q in client.get("/api/v1/queues").json()["queues"]}
    assert queues["default"]["counts"]["pending"] == 4  # three jobs and the workflow's first node
    assert queues["other"]["counts"]["pending"] == 1 and queues["other"]["paused"]
    assert client.get("/api/v1/queues/default").json()["counts"]["pending"] == 4
    assert client.get("/api/v1/queues/default/stats").json()["counts"]["pending"] == 4
    assert client.get("/api/v1/stats").json()["counts"]["pending"] == 5
    samples = scrape(client)
    assert value(samples, "dygo_jobs", queue="default", state="pending") == 4
    assert value(samples, "dygo_queue_paused", queue="other") == 1
    assert value(samples, "dygo_workers_live") == 1
    # No value: the stand-in replica is not in recovery, so its lag is unknown (a real one's: chaos scenario 9).
    assert not [key for key in samples if key[0] == "dygo_read_replica_lag_seconds"]
    assert [w["id"] for w in client.get("/api/v1/workers").json()["workers"]] == ["worker-on-replica"]
    assert [w["id"] for w in client.get("/api/v1/workflows").json()["workflows"]] == [on_replica]

    # An action and its own read are the primary's: the pause shows at once in its answer, while the
    # replica (which, standing in, never receives it) still shows the queue running.
    paused = client.post("/api/v1/queues/default/pause")
    assert paused.status_code == 200 and paused.json()["paused"]
    assert paused.json()["counts"]["pending"] == 2  # the primary's job and its workflow's first node
    assert not client.get("/api/v1/queues/default").json()["paused"]
    waited = client.get(f"/api/v1/jobs/{on_primary}", params={"wait": "100ms"})
    assert waited.status_code == 200 and waited.json()["args"] == {"where": "primary"}
    api.close()


def test_without_a_replica_the_replica_lag_gauge_has_no_sample(api):
    text = api.reader.get("/metrics").text
    assert "# TYPE dygo_read_replica_lag_seconds gauge" in text
    assert "\ndygo_read_replica_lag_seconds " not in text


def test_a_replica_that_is_down_is_logged_as_the_replica_and_the_primary_keeps_answering(db_url, spawn, tmp_path):
    (tmp_path / "gone").mkdir()  # a socket directory where no server listens
    gone = make_conninfo(db_url, host=str(tmp_path / "gone"))
    api = start_serve(db_url, spawn, tokens=False, DATABASE_READ_URL=gone)
    listed = api.anon.get("/api/v1/jobs")
    assert listed.status_code == 503 and listed.json()["error"]["details"] == {"reason": "down"}
    assert api.anon.get("/api/v1/queues").status_code == 503
    assert api.anon.get("/metrics").status_code == 503
    enqueued = api.anon.post("/api/v1/jobs", json={"kind": "test.noop", "args": {}})
    assert enqueued.status_code == 201, enqueued.text
    assert api.anon.get(f"/api/v1/jobs/{enqueued.json()['id']}").status_code == 200
    api.close()
    log = api.process.stderr()
    assert log.count("replica database connection lost") == 1, log
    assert "WARNING dygo.serve: database connection" not in log, log  # the primary was never lost
