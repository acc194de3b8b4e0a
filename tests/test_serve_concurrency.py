"""`dygo serve` under hundreds of concurrent clients, and its 503 rule (docs/operations/scaling-web.md).

Real `dygo serve` processes and real concurrent HTTP clients on 127.0.0.1; no figure is timed here
(bench/http_bench.py measures).
"""

from __future__ import annotations

import asyncio
import collections
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict

from tests.conftest import ADMIN_TOKEN, READ_TOKEN, dygo_env, wait_until

pytestmark = pytest.mark.alone

CLIENTS = 500
BATCH = 20


async def _mixed_clients(url: str, job_id: int) -> tuple[collections.Counter[int], list[str], int, int]:
    """CLIENTS clients, all released at once, each sending one request of the mix then a second one:
    reads (queue list, a job, a page of jobs, workers), single enqueues, batch enqueues."""
    # A connection per request: a pooled keep-alive connection idle for uvicorn's 5 s keep-alive timeout
    # can be closed by the server just as the client sends on it (a ReadError no server answered).
    limits = httpx.Limits(max_connections=CLIENTS, max_keepalive_connections=0)
    statuses: collections.Counter[int] = collections.Counter()
    problems: list[str] = []
    in_flight = peak = 0
    go = asyncio.Event()
    read = {"Authorization": f"Bearer {READ_TOKEN}"}
    admin = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    batch = {"jobs": [{"kind": "test.noop", "args": {"n": n}} for n in range(BATCH)]}

    async with httpx.AsyncClient(base_url=url, timeout=60, limits=limits) as client:

        async def request(kind: int, n: int) -> None:
            nonlocal in_flight, peak
            in_flight += 1
            peak = max(peak, in_flight)
            try:
                if kind == 0:
                    reply = await client.get("/api/v1/queues", headers=read)
                elif kind == 1:
                    reply = await client.post(
                        "/api/v1/jobs", json={"kind": "test.noop", "args": {"n": n}}, headers=admin
                    )
                elif kind == 2:
                    reply = await client.post("/api/v1/jobs/batch", json=batch, headers=admin)
                elif kind == 3:
                    reply = await client.get(f"/api/v1/jobs/{job_id}", headers=read)
                elif kind == 4:
                    reply = await client.get("/api/v1/jobs", params={"limit": 5}, headers=read)
                else:
                    reply = await client.get("/api/v1/workers", headers=read)
            except httpx.TransportError as exc:
                statuses[0] += 1
                problems.append(f"no answer: {type(exc).__name__}: {exc}")
                return
            finally:
                in_flight -= 1
            statuses[reply.status_code] += 1
            if reply.status_code >= 300:
                problems.append(f"{reply.status_code} {reply.headers.get('retry-after')} {reply.text[:200]}")

        async def one_client(n: int) -> None:
            await go.wait()
            await request(n % 6, n)
            await request((n + 3) % 6, n)

        tasks = [asyncio.create_task(one_client(n)) for n in range(CLIENTS)]
        await asyncio.sleep(0.2)
        go.set()
        await asyncio.gather(*tasks)
    return statuses, problems, peak, 2 * CLIENTS


def test_five_hundred_concurrent_clients_get_no_503(api, conn):
    job_id = api.admin.post("/api/v1/jobs", json={"kind": "test.noop"}).json()["id"]
    statuses, problems, peak, sent = asyncio.run(_mixed_clients(api.url, job_id))
    assert sum(statuses.values()) == sent
    assert peak >= CLIENTS * 0.9, f"only {peak} requests were in flight at once"
    assert problems == [], f"{statuses}: {problems[:5]}"
    assert set(statuses) <= {200, 201}
    # Every enqueue went through: the first job, the single ones and the batches of both rounds.
    singles = sum(1 for n in range(CLIENTS) for kind in (n % 6, (n + 3) % 6) if kind == 1)
    batches = sum(1 for n in range(CLIENTS) for kind in (n % 6, (n + 3) % 6) if kind == 2)
    assert conn.execute("SELECT count(*) FROM dygo_jobs").fetchone()[0] == 1 + singles + batches * BATCH
    assert "database connection lost" not in api.process.stderr()
    # Bounded: at most serve_pool_size (default 10) connections for requests, +1 LISTEN for ?wait=.
    held = conn.execute(
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
        "AND application_name LIKE 'dygo-serve%'"
    ).fetchone()[0]
    assert held <= 11


def _refuse_connections(server_url: str, dbname: str, refuse: bool) -> None:
    with psycopg.connect(server_url, autocommit=True) as admin:
        admin.execute(f"ALTER DATABASE {dbname} ALLOW_CONNECTIONS {'false' if refuse else 'true'}")
        if refuse:
            admin.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE datname = %s AND application_name LIKE 'dygo-serve%%'",
                (dbname,),
            )


def test_a_database_that_refuses_connections_gets_503_with_retry_after_then_200_again(api, db_url, server_url):
    dbname = conninfo_to_dict(db_url)["dbname"]
    assert api.reader.get("/api/v1/queues").status_code == 200
    assert api.reader.get("/api/v1/jobs").status_code == 200
    _refuse_connections(server_url, dbname, refuse=True)
    try:
        for client, method, path, body in (
            (api.reader, "GET", "/api/v1/queues", None),
            (api.admin, "POST", "/api/v1/jobs", {"kind": "test.noop"}),
            (api.reader, "GET", "/api/v1/jobs", None),
        ):
            reply = client.request(method, path, json=body, timeout=30)
            assert reply.status_code == 503, (path, reply.text)
            error = reply.json()["error"]
            assert (error["code"], error["details"]) == ("database_unavailable", {"reason": "down"}), path
            assert int(reply.headers["Retry-After"]) > 0
    finally:
        _refuse_connections(server_url, dbname, refuse=False)
    wait_until(
        lambda: api.reader.get("/api/v1/queues").status_code == 200,
        timeout=30,
        message="serve to answer again once the database accepts connections",
    )
    assert api.admin.post("/api/v1/jobs", json={"kind": "test.noop"}).status_code == 201
    assert api.reader.get("/api/v1/jobs").status_code == 200
    outage_lines = [line for line in api.process.stderr().splitlines() if "database connection" in line]
    assert len(outage_lines) == 2, outage_lines  # one "lost", one "back": the outage is logged once
    assert "database connection lost" in outage_lines[0] and "database connection back" in outage_lines[1]


def test_serve_holds_no_more_connections_than_its_pool_size(serve, conn):
    api = serve("--pool-size", "3")
    assert "up to 3 database connections each" in api.process.wait_for_line("database connections each")

    async def burst() -> list[int]:
        async with httpx.AsyncClient(
            base_url=api.url, timeout=60, headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}
        ) as client:
            replies = await asyncio.gather(
                *(client.post("/api/v1/jobs", json={"kind": "test.noop"}) for _ in range(200))
            )
        return [reply.status_code for reply in replies]

    assert set(asyncio.run(burst())) == {201}
    held = conn.execute(
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND application_name = 'dygo-serve'"
    ).fetchone()[0]
    assert 1 <= held <= 3


def _children(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rpartition(")")[2].split()[1]) == pid:
                found.append(int(entry.name))
    return found


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="counts web processes through /proc (Linux)")
def test_web_concurrency_starts_that_many_web_processes_sharing_the_port(serve, conn):
    api = serve(WEB_CONCURRENCY="2", DYGO_SERVE_POOL_SIZE="2")
    assert "2 web processes, up to 2 database connections each" in api.process.wait_for_line("web process")

    # uvicorn's supervisor starts the web processes (and multiprocessing's resource tracker).
    def web_processes() -> list[int]:
        return [
            pid
            for pid in _children(api.process.process.pid)
            if "spawn_main" in Path(f"/proc/{pid}/cmdline").read_text()
        ]

    wait_until(lambda: len(web_processes()) >= 2, message="two web processes")
    web = web_processes()
    assert len(web) == 2
    replies = [api.admin.post("/api/v1/jobs", json={"kind": "test.noop"}) for _ in range(20)]
    assert {reply.status_code for reply in replies} == {201}
    clients: set[Any] = set()

    def both_connected() -> bool:
        clients.update(
            row[0]
            for row in conn.execute(
                "SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND application_name = "
                "'dygo-serve-listen'"
            )
        )
        return len(clients) >= 2

    wait_until(both_connected, message="each web process to hold its own LISTEN connection")
    # A supervisor killed outright leaves no orphan serving the port.
    api.process.stop()
    wait_until(lambda: not any(Path(f"/proc/{pid}").exists() for pid in web), message="the web processes to end")


def test_a_bad_pool_size_or_web_concurrency_is_refused_before_starting(spawn, db_url):
    for env, fragment in (
        ({"DYGO_SERVE_POOL_SIZE": "1"}, "DYGO_SERVE_POOL_SIZE"),
        ({"WEB_CONCURRENCY": "many"}, "WEB_CONCURRENCY"),
    ):
        process = spawn("serve", "--port", "0", env=dygo_env(db_url, **env))
        assert process.wait() == 2
        assert fragment in process.stderr()


def test_a_process_saturated_past_its_wait_limit_answers_503_saturated_and_logs_no_outage(serve, conn):
    import concurrent.futures

    from dygo.app.db import POOL_TIMEOUT

    api = serve("--pool-size", "2")  # the hot paths get one connection
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        with conn.transaction():
            # The first enqueue holds the only hot connection, waiting for this lock; the second waits for
            # that connection longer than POOL_TIMEOUT with the database healthy.
            conn.execute("LOCK TABLE dygo_jobs IN ACCESS EXCLUSIVE MODE")
            first = pool.submit(api.admin.post, "/api/v1/jobs", json={"kind": "test.noop"}, timeout=60)
            wait_until(
                lambda: (
                    conn.execute(
                        "SELECT count(*) FROM pg_locks WHERE relation = 'dygo_jobs'::regclass AND NOT granted "
                        "AND database = (SELECT oid FROM pg_database WHERE datname = current_database())"
                    ).fetchone()[0]
                    == 1
                ),
                message="the first to wait",
            )
            second = pool.submit(api.admin.post, "/api/v1/jobs", json={"kind": "test.noop"}, timeout=60)
            saturated = second.result(timeout=POOL_TIMEOUT + 30)
        assert first.result(timeout=30).status_code == 201
    assert saturated.status_code == 503
    assert saturated.json()["error"]["code"] == "database_unavailable"
    assert saturated.json()["error"]["details"] == {"reason": "saturated"}
    assert saturated.headers["Retry-After"] == "1"
    log = api.process.stderr()
    assert "serve is saturated" in log and "database connection lost" not in log
    assert api.admin.post("/api/v1/jobs", json={"kind": "test.noop"}).status_code == 201
