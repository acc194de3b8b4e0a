"""DATABASE_READ_URL: serve's heavy reads (the jobs lists of the API and the dashboard, the dashboard's counts
and charts) go to it; writes and the reads that must see them (a job by id, just enqueued) stay on the
primary. Here the "replica" is a second database of the same server holding other jobs, so a list shows
which of the two it read; the dashboard says it reads from a replica, and that its lag is unknown (the
server is not in recovery). A real streaming replica is chaos/failover.py's."""

from __future__ import annotations

from collections.abc import Iterator

import psycopg
import pytest
from dygo.store import enqueue
from psycopg.conninfo import make_conninfo

from tests.conftest import start_serve


@pytest.fixture
def replica_url(server_url: str, fresh_databases) -> Iterator[str]:
    name = fresh_databases.take()
    yield make_conninfo(server_url, dbname=name)
    fresh_databases.give_back(name)


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
