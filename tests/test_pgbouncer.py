"""dygo through a real PgBouncer 1.18 in transaction pooling mode (tests/pgbouncer.py): no server-side
prepared statements, no session state across transactions, LISTEN on DATABASE_DIRECT_URL or none."""

from __future__ import annotations

import asyncio
import collections
import re
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import psycopg
import pytest
from dygo.app.throttle import LOGIN_ATTEMPTS
from dygo.store import enqueue, enqueue_many

from tests.conftest import ADMIN_TOKEN, READ_TOKEN, TEST_CONFIG, Api, dygo_env, start_serve, wait_until
from tests.pgbouncer import PgBouncer

FINAL = ("succeeded", "dead")
CLIENTS = 150  # concurrent requests through the pooler (its max_client_conn is 500)


@pytest.fixture
def pooled(pgbouncer: PgBouncer, db_url: str) -> Iterator[psycopg.Connection]:
    """A connection to this test's database through PgBouncer, as an application would open it."""
    with psycopg.connect(pgbouncer.url(db_url), autocommit=True, prepare_threshold=None) as conn:
        yield conn


def through(pgbouncer: PgBouncer, db_url: str, direct: bool = True, **extra: str) -> dict[str, str]:
    """A dygo process's environment: DATABASE_URL through PgBouncer, the direct URL beside it or not."""
    if direct:
        extra["DATABASE_DIRECT_URL"] = db_url
    else:
        extra["DYGO_POOL_MODE"] = "transaction"
    return dygo_env(pgbouncer.url(db_url), **extra)


def states(conn: psycopg.Connection, ids: list[int]) -> dict[str, int]:
    rows = conn.execute("SELECT state, count(*) FROM dygo_jobs WHERE id = ANY(%s) GROUP BY state", (ids,))
    return dict(rows.fetchall())


def all_final(conn: psycopg.Connection, ids: list[int]) -> bool:
    return sum(n for state, n in states(conn, ids).items() if state in FINAL) == len(ids)


def assert_no_pooler_trouble(stderr: str) -> None:
    assert "DuplicatePreparedStatement" not in stderr and "prepared statement" not in stderr
    assert "connection lost" not in stderr, stderr[-3000:]


def test_jobs_and_retries_run_through_pgbouncer_with_listen_on_the_direct_url(pgbouncer, db_url, pooled, spawn):
    worker = spawn("worker", "--poll-interval", "60s", env=through(pgbouncer, db_url))
    started = worker.wait_for_line("started")
    assert "; listening, poll every 60s" in started
    assert "its jobs come back in seconds (presence lock on its own session)" in started  # on the direct URL
    # Enough jobs that every statement runs far more than psycopg's 5 executions before it would prepare.
    ids = [j.id for j in enqueue_many(pooled, [{"kind": "test.record"}] * 200)]
    recovered = enqueue(pooled, "test.fail", {"times": 2}).id
    dead = enqueue(pooled, "test.fail", {"times": 10}).id
    for _ in range(20):
        ids.append(enqueue(pooled, "test.noop", {}).id)
    wait_until(lambda: all_final(pooled, [*ids, recovered, dead]), timeout=60, message="every job to finish")
    assert states(pooled, ids) == {"succeeded": len(ids)}
    assert pooled.execute("SELECT state, attempt FROM dygo_jobs WHERE id = %s", (recovered,)).fetchone() == (
        "succeeded",
        3,
    )
    assert pooled.execute("SELECT state, attempt FROM dygo_jobs WHERE id = %s", (dead,)).fetchone() == ("dead", 3)
    assert_no_pooler_trouble(worker.stderr())


def test_worker_behind_a_pooler_without_a_direct_url_polls_and_says_so(pgbouncer, db_url, pooled, spawn):
    worker = spawn("worker", "--poll-interval", "300ms", env=through(pgbouncer, db_url, direct=False))
    started = worker.wait_for_line("started")
    assert "polling only (DATABASE_URL goes through a transaction pooler and DATABASE_DIRECT_URL is not set" in started
    assert "its jobs come back when their lease runs out (no session of its own" in started
    ids = [j.id for j in enqueue_many(pooled, [{"kind": "test.record"}] * 30)]
    wait_until(lambda: all_final(pooled, ids), timeout=30, message="the jobs to be found by polling")
    assert states(pooled, ids) == {"succeeded": 30}
    listeners = pooled.execute(
        "SELECT count(*) FROM pg_stat_activity WHERE application_name LIKE 'dygo-worker-listen%' "
        "AND datname = current_database()"
    ).fetchone()[0]
    assert listeners == 0
    assert_no_pooler_trouble(worker.stderr())


def test_leases_are_renewed_through_pgbouncer(pgbouncer, db_url, pooled, spawn):
    spawn("worker", env=through(pgbouncer, db_url)).wait_for_line("started")
    job = enqueue(pooled, "test.record", {"seconds": 3.5})  # lease_ttl is 2s in tests/config
    wait_until(lambda: all_final(pooled, [job.id]), timeout=20, message="the long job to finish")
    assert pooled.execute("SELECT state, attempt, reap_count FROM dygo_jobs WHERE id = %s", (job.id,)).fetchone() == (
        "succeeded",
        1,
        0,
    )


def test_cron_fires_through_pgbouncer(pgbouncer, db_url, pooled, spawn, tmp_path: Path):
    for name in ("queues.yml", "dygo.yml"):
        (tmp_path / name).write_text((TEST_CONFIG / name).read_text())
    (tmp_path / "schedules.yml").write_text("schedules:\n  - {name: yearly, cron: '@yearly', kind: test.mark}\n")
    env = through(pgbouncer, db_url, DYGO_CONFIG_DIR=str(tmp_path))
    worker = spawn("worker", env=env)
    worker.wait_for_line("started")
    pooled.execute("UPDATE dygo_schedules SET next_run_at = now() + interval '1 second' WHERE name = 'yearly'")
    wait_until(
        lambda: (
            pooled.execute(
                "SELECT count(*) FROM dygo_jobs WHERE meta->>'schedule' = 'yearly' AND state = 'succeeded'"
            ).fetchone()[0]
            == 1
        ),
        timeout=15,
        message="the occurrence to fire and run",
    )
    assert_no_pooler_trouble(worker.stderr())


def test_pgbouncer_restart_mid_run_loses_nothing(pgbouncer, db_url, pooled, spawn):
    worker = spawn("worker", "--poll-interval", "1s", env=through(pgbouncer, db_url))
    worker.wait_for_line("started")
    ids = [j.id for j in enqueue_many(pooled, [{"kind": "test.record", "args": {"seconds": 0.02}}] * 400)]
    wait_until(lambda: states(pooled, ids).get("succeeded", 0) >= 50, timeout=30, message="the run to get going")
    pgbouncer.stop()  # every pooled connection of the worker (and of this test) is cut
    time.sleep(1.0)
    pgbouncer.start()
    with psycopg.connect(db_url, autocommit=True) as direct:

        def all_final_retrying_at_once() -> bool:
            # The jobs the cut failed are retried now rather than after their 15 s backoff: the retry is
            # what this test needs, not its wait.
            direct.execute(
                "UPDATE dygo_jobs SET run_at = now() WHERE id = ANY(%s) AND state = 'pending' AND run_at > now()",
                (ids,),
            )
            return all_final(direct, ids)

        wait_until(
            all_final_retrying_at_once, timeout=90, interval=0.2, message="every job to finish after the restart"
        )
        assert states(direct, ids) == {"succeeded": 400}
        ran, distinct = direct.execute("SELECT count(*), count(DISTINCT job_id) FROM test_runs").fetchone()
        assert distinct == 400 and ran <= 400 + 8 * 2  # at most the in-flight jobs ran twice
    stderr = worker.stderr()
    assert stderr.count("connection lost") == stderr.count("connection back") >= 1


# --- dygo serve through the pooler ---------------------------------------------------------------


def serve_through(pgbouncer: PgBouncer, db_url: str, spawn, direct: bool = True, **extra: str) -> Api:
    """`dygo serve` with DATABASE_URL through PgBouncer (and DATABASE_DIRECT_URL for its LISTEN, or none)."""
    pooler = {"DATABASE_DIRECT_URL": db_url} if direct else {"DYGO_POOL_MODE": "transaction"}
    return start_serve(db_url, spawn, DATABASE_URL=pgbouncer.url(db_url), **pooler, **extra)


def signed_in(api: Api) -> httpx.Client:
    client = httpx.Client(base_url=api.url, follow_redirects=False, timeout=10)
    csrf = re.search(r'name="csrf" value="([^"]+)"', client.get("/dashboard/login").text).group(1)
    assert client.post("/dashboard/login", data={"csrf": csrf, "token": ADMIN_TOKEN}).status_code == 303
    return client


def test_the_api_and_the_dashboard_run_through_pgbouncer(pgbouncer, db_url, pooled, spawn):
    api = serve_through(pgbouncer, db_url, spawn)
    # Past psycopg's 5 executions of each statement, where it would prepare it on the server.
    single = [api.admin.post("/api/v1/jobs", json={"kind": "test.noop", "args": {"n": n}}) for n in range(12)]
    assert {reply.status_code for reply in single} == {201}
    keyed = [api.admin.post("/api/v1/jobs", json={"kind": "test.noop", "idempotency_key": "once"}) for _ in range(7)]
    assert [reply.status_code for reply in keyed] == [201] + [200] * 6
    for _ in range(7):
        batch = api.admin.post("/api/v1/jobs/batch", json={"jobs": [{"kind": "test.noop"}] * 50})
        assert batch.status_code == 201 and len(batch.json()["jobs"]) == 50
    job_id = single[0].json()["id"]
    for _ in range(7):
        assert api.reader.get(f"/api/v1/jobs/{job_id}").json()["state"] == "pending"
        queues = {q["name"]: q for q in api.reader.get("/api/v1/queues").json()["queues"]}
        assert queues["default"]["counts"]["pending"] == 12 + 1 + 7 * 50
        assert api.reader.get("/api/v1/jobs", params={"limit": 5}).status_code == 200
    dead = enqueue(pooled, "test.noop", {}).id
    pooled.execute("UPDATE dygo_jobs SET state = 'dead', finished_at = now() WHERE id = %s", (dead,))
    retried = api.admin.post(f"/api/v1/jobs/{dead}/retry")
    assert retried.status_code == 200 and retried.json()["state"] == "pending"
    page = signed_in(api).get("/dashboard/queues")
    assert page.status_code == 200 and "default" in page.text
    # ?wait= is woken through the direct URL's LISTEN while a worker runs the job through the pooler.
    spawn("worker", env=through(pgbouncer, db_url)).wait_for_line("started")
    waited = api.reader.get(f"/api/v1/jobs/{job_id}", params={"wait": "30s"}, timeout=40)
    assert waited.json()["state"] == "succeeded"
    assert_no_pooler_trouble(api.process.stderr())


def test_hundreds_of_concurrent_requests_through_pgbouncer_get_no_5xx(pgbouncer, db_url, spawn):
    api = serve_through(pgbouncer, db_url, spawn)
    read = {"Authorization": f"Bearer {READ_TOKEN}"}
    admin_token = {"Authorization": f"Bearer {ADMIN_TOKEN}"}

    async def run() -> collections.Counter[int]:
        statuses: collections.Counter[int] = collections.Counter()
        limits = httpx.Limits(max_connections=CLIENTS, max_keepalive_connections=0)
        go = asyncio.Event()
        async with httpx.AsyncClient(base_url=api.url, timeout=60, limits=limits) as client:

            async def one(n: int) -> None:
                await go.wait()
                if n % 3 == 0:
                    reply = await client.get("/api/v1/queues", headers=read)
                elif n % 3 == 1:
                    reply = await client.post("/api/v1/jobs", json={"kind": "test.noop"}, headers=admin_token)
                else:
                    reply = await client.post(
                        "/api/v1/jobs/batch", json={"jobs": [{"kind": "test.noop"}] * 10}, headers=admin_token
                    )
                statuses[reply.status_code] += 1

            tasks = [asyncio.create_task(one(n)) for n in range(CLIENTS)]
            await asyncio.sleep(0.2)
            go.set()
            await asyncio.gather(*tasks)
        return statuses

    statuses = asyncio.run(run())
    assert sum(statuses.values()) == CLIENTS
    assert set(statuses) <= {200, 201}, statuses
    with psycopg.connect(db_url, autocommit=True) as direct:
        enqueued = direct.execute("SELECT count(*) FROM dygo_jobs").fetchone()[0]
    singles, batches = len(range(1, CLIENTS, 3)), len(range(2, CLIENTS, 3))
    assert enqueued == singles + 10 * batches
    assert_no_pooler_trouble(api.process.stderr())


def test_serve_behind_a_pooler_without_a_direct_url_still_locks_out_a_guesser(pgbouncer, db_url, spawn):
    # No session to LISTEN on: the failed-token throttle reads its count for every token (app/throttle.py).
    first, second = (
        serve_through(pgbouncer, db_url, spawn, direct=False),
        serve_through(pgbouncer, db_url, spawn, direct=False),
    )
    guesser = {"X-Forwarded-For": "203.0.113.77"}
    for n in range(LOGIN_ATTEMPTS):
        reply = first.anon.get("/api/v1/queues", headers={**guesser, "Authorization": f"Bearer wrong-{n:020d}"})
        assert reply.status_code == (401 if n < LOGIN_ATTEMPTS - 1 else 429)
    reply = second.anon.post(
        "/api/v1/jobs", json={"kind": "test.noop"}, headers={**guesser, "Authorization": f"Bearer {ADMIN_TOKEN}"}
    )
    assert reply.status_code == 429, reply.text
    assert second.admin.post("/api/v1/jobs", json={"kind": "test.noop"}).status_code == 201
    for api in (first, second):
        assert_no_pooler_trouble(api.process.stderr())
