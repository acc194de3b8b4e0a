"""Queues over HTTP: counts, daily stats, retry-all-dead, purge, vacuum, and pause seen by a real worker."""

from __future__ import annotations

import asyncio
import time

import psycopg
import pytest
from dygo.store import admin, enqueue

from tests.conftest import wait_until
from tests.test_api_jobs import make_active


def job_state(conn, job_id: int) -> str:
    return conn.execute("SELECT state FROM dygo_jobs WHERE id = %s", (job_id,)).fetchone()[0]


def fill_default_queue(conn) -> dict[str, list[int]]:
    """Two pending, one scheduled, one active, one paused, one dead, one cancelled, in `default`."""
    ids = {state: [] for state in ("pending", "scheduled", "active", "paused", "dead", "cancelled")}
    ids["pending"] = [enqueue(conn, "test.noop", {}).id for _ in range(2)]
    ids["scheduled"] = [enqueue(conn, "test.noop", {}, delay="1h").id]
    for state in ("active", "paused", "dead", "cancelled"):
        job_id = enqueue(conn, "test.noop", {}).id
        if state == "active":
            make_active(conn, job_id)
        else:
            conn.execute("UPDATE dygo_jobs SET state = %s, finished_at = now() WHERE id = %s", (state, job_id))
        ids[state] = [job_id]
    return ids


def test_queues_list_their_counts_concurrency_and_pause(api, conn):
    fill_default_queue(conn)
    enqueue(conn, "test.record_sync", {})
    queues = {q["name"]: q for q in api.reader.get("/api/v1/queues").json()["queues"]}
    assert list(queues) == ["default", "other"]
    assert queues["default"]["counts"] == {
        "pending": 2,
        "scheduled": 1,
        "active": 1,
        "paused": 1,
        "dead": 1,
        "cancelled": 1,
        "waiting": 0,
        "skipped": 0,
    }
    assert (queues["default"]["concurrency"], queues["other"]["concurrency"]) == (8, 2)
    assert queues["other"]["counts"]["pending"] == 1 and not queues["other"]["paused"]
    one = api.reader.get("/api/v1/queues/default").json()
    assert one == queues["default"]


def test_stats_have_a_zero_filled_daily_window_and_totals(api, conn, spawn):
    conn.execute("""INSERT INTO dygo_daily_stats (day, queue, kind, enqueued, succeeded)
                    VALUES ((now() AT TIME ZONE 'UTC')::date - 2, 'default', 'test.noop', 5, 5)""")
    for _ in range(3):
        enqueue(conn, "test.noop", {})
    enqueue(conn, "test.abort", {})
    enqueue(conn, "test.fail", {"times": 10})
    enqueue(conn, "test.record_sync", {})
    stalled = enqueue(conn, "test.noop", {}).id
    make_active(conn, stalled)
    conn.execute("UPDATE dygo_jobs SET lease_deadline = now() - interval '1 second' WHERE id = %s", (stalled,))
    assert spawn("worker", "--once").wait() == 0

    stats = api.reader.get("/api/v1/queues/default/stats", params={"days": 3}).json()
    assert [day["enqueued"] for day in stats["daily"]] == [5, 0, 6]  # oldest first, yesterday zero-filled
    today = stats["daily"][-1]
    assert (today["succeeded"], today["failed"], today["dead"], today["reaped"]) == (4, 2, 1, 1)
    assert stats["totals"] == {"enqueued": 11, "succeeded": 9, "failed": 2, "dead": 1, "reaped": 1}
    assert stats["counts"]["dead"] == 1 and stats["counts"]["pending"] + stats["counts"]["scheduled"] == 1
    assert (stats["queue"], stats["days"]) == ("default", 3)

    everything = api.reader.get("/api/v1/stats", params={"days": 1}).json()
    assert everything["queue"] is None and len(everything["daily"]) == 1
    assert everything["totals"] == {"enqueued": 7, "succeeded": 5, "failed": 2, "dead": 1, "reaped": 1}
    # Reading folded the deltas into the rollups, and the numbers did not move.
    assert conn.execute("SELECT count(*) FROM dygo_stats_deltas").fetchone()[0] == 0
    assert api.reader.get("/api/v1/stats", params={"days": 1}).json()["totals"] == everything["totals"]
    assert api.reader.get("/api/v1/stats", params={"days": 0}).status_code == 422


def test_purge_deletes_pending_scheduled_and_dead_and_leaves_active_and_paused(api, conn):
    ids = fill_default_queue(conn)
    elsewhere = enqueue(conn, "test.record_sync", {}).id
    report = api.admin.post("/api/v1/queues/default/purge").json()
    assert report == {"queue": "default", "pending": 2, "scheduled": 1, "dead": 1, "active_left": 1, "paused_left": 1}
    left = dict(conn.execute("SELECT id, state FROM dygo_jobs").fetchall())
    assert left == {
        ids["active"][0]: "active",
        ids["paused"][0]: "paused",
        ids["cancelled"][0]: "cancelled",
        elsewhere: "pending",
    }


def test_retry_dead_revives_every_dead_job_of_the_queue_it_can(api, conn):
    dead = [enqueue(conn, "test.noop", {}).id for _ in range(2)]
    keyed = enqueue(conn, "test.noop", {}, idempotency_key="k").id
    other = enqueue(conn, "test.record_sync", {}).id
    conn.execute("UPDATE dygo_jobs SET state = 'dead', attempt = 20, finished_at = now()")
    holder = enqueue(conn, "test.noop", {}, idempotency_key="k").id  # a live job now holds the key
    assert api.admin.post("/api/v1/queues/default/retry-dead").json() == {"queue": "default", "retried": 2}
    states = dict(conn.execute("SELECT id, state FROM dygo_jobs").fetchall())
    assert [states[i] for i in dead] == ["pending", "pending"]
    assert (states[keyed], states[other], states[holder]) == ("dead", "dead", "pending")
    assert conn.execute("SELECT attempt FROM dygo_jobs WHERE id = %s", (dead[0],)).fetchone()[0] == 0


def test_vacuum_deletes_jobs_dead_longer_than_asked(api, conn):
    old, recent = (enqueue(conn, "test.noop", {}).id for _ in range(2))
    conn.execute("UPDATE dygo_jobs SET state = 'dead', finished_at = now() - interval '2 days' WHERE id = %s", (old,))
    conn.execute("UPDATE dygo_jobs SET state = 'dead', finished_at = now() WHERE id = %s", (recent,))
    response = api.admin.post("/api/v1/queues/default/vacuum-dead", params={"older_than": "1d"})
    assert response.json() == {"queue": "default", "deleted": 1, "older_than_seconds": 86400.0}
    assert [row[0] for row in conn.execute("SELECT id FROM dygo_jobs")] == [recent]
    bad = api.admin.post("/api/v1/queues/default/vacuum-dead", params={"older_than": "a while"})
    assert bad.status_code == 422 and bad.json()["error"]["code"] == "invalid_duration"
    missing = api.admin.post("/api/v1/queues/default/vacuum-dead")
    assert missing.status_code == 422 and missing.json()["error"]["code"] == "invalid_request"


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("get", "/api/v1/queues/nope"),
        ("get", "/api/v1/queues/nope/stats"),
        ("post", "/api/v1/queues/nope/pause"),
        ("post", "/api/v1/queues/nope/resume"),
        ("post", "/api/v1/queues/nope/purge"),
        ("post", "/api/v1/queues/nope/retry-dead"),
        ("post", "/api/v1/queues/nope/vacuum-dead?older_than=1d"),
    ],
)
def test_an_unknown_queue_is_a_404(module_api, method, path):
    response = getattr(module_api.admin, method)(path)
    assert response.status_code == 404 and response.json()["error"]["code"] == "queue_not_found"


def test_a_paused_queue_is_skipped_by_a_real_worker_until_resumed(api, conn, spawn):
    worker = spawn("worker", "--poll-interval", "60s")
    worker.wait_for_line("started")
    paused = api.admin.post("/api/v1/queues/default/pause").json()
    assert paused["paused"] is True and paused["paused_at"]
    held = enqueue(conn, "test.record", {}).id
    runs = enqueue(conn, "test.record_sync", {}).id  # queue `other` keeps running
    wait_until(lambda: job_state(conn, runs) == "succeeded", message="the other queue's job to run")
    time.sleep(1.0)
    assert job_state(conn, held) == "pending"
    listed = {q["name"]: q for q in api.reader.get("/api/v1/queues").json()["queues"]}
    assert listed["default"]["paused"] and not listed["other"]["paused"]
    assert listed["default"]["counts"]["pending"] == 1

    resumed = api.admin.post("/api/v1/queues/default/resume").json()
    assert resumed["paused"] is False and resumed["paused_at"] is None
    started = time.monotonic()
    wait_until(lambda: job_state(conn, held) == "succeeded", timeout=10, message="the held job to run")
    assert time.monotonic() - started < 5  # woken by the resume, not by the 60 s poll


def test_retry_dead_across_every_queue_in_one_call(api, conn):
    # The seed's RetryAll with an empty queue: every queue's dead jobs, by the per-queue rule for keys.
    dead = [enqueue(conn, "test.noop", {}).id, enqueue(conn, "test.record_sync", {}).id]  # default, other
    keyed = enqueue(conn, "test.noop", {}, idempotency_key="k").id
    conn.execute("UPDATE dygo_jobs SET state = 'dead', attempt = 20, finished_at = now()")
    enqueue(conn, "test.noop", {}, idempotency_key="k")  # a live job holds the key: `keyed` stays dead
    assert api.reader.post("/api/v1/retry-dead").status_code == 403
    assert api.admin.post("/api/v1/retry-dead").json() == {"queue": None, "retried": 2}
    assert [job_state(conn, i) for i in dead] == ["pending", "pending"] and job_state(conn, keyed) == "dead"


def test_queues_list_their_succeeded_count_of_today(api, conn):
    done = [enqueue(conn, "test.noop", {}).id for _ in range(3)]
    enqueue(conn, "test.record_sync", {})
    conn.execute("UPDATE dygo_jobs SET state = 'succeeded', finished_at = now() WHERE id = ANY(%s)", (done,))
    conn.execute(
        "INSERT INTO dygo_stats_deltas (day, queue, kind, succeeded) "
        "VALUES ((now() AT TIME ZONE 'UTC')::date, 'default', 'test.noop', 3)"
    )  # what the settle writes
    queues = {q["name"]: q for q in api.reader.get("/api/v1/queues").json()["queues"]}
    assert (queues["default"]["succeeded_today"], queues["other"]["succeeded_today"]) == (3, 0)
    assert api.reader.get("/api/v1/queues/default").json()["succeeded_today"] == 3


class CountingConnection(psycopg.Connection):
    """A real connection that counts the statements run through it."""

    statements = 0

    def execute(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        self.statements += 1
        return super().execute(*args, **kwargs)


class CountingAsyncConnection(psycopg.AsyncConnection):
    statements = 0

    async def execute(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        self.statements += 1
        return await super().execute(*args, **kwargs)


def test_the_queue_list_is_one_statement(conn, db_url):
    fill_default_queue(conn)
    admin.pause_queue(conn, "other")
    configured = {"default": 8, "other": 2}
    with CountingConnection.connect(db_url, autocommit=True) as counted:
        queues = admin.list_queues(counted, configured)
        assert counted.statements == 1

    async def read_counted() -> tuple[list[dict], int]:
        async with await CountingAsyncConnection.connect(db_url, autocommit=True) as aconn:
            listed = await admin.alist_queues(aconn, configured)
            return listed, aconn.statements

    listed, statements = asyncio.run(read_counted())
    assert statements == 1 and listed == queues
    by_name = {q["name"]: q for q in queues}
    assert by_name["default"]["counts"]["pending"] == 2 and not by_name["default"]["paused"]
    assert by_name["other"]["paused"] and by_name["other"]["paused_at"] is not None
