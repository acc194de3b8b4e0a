"""Only jobs somebody waits for are notified: registration, its race with settles, expiry."""

from __future__ import annotations

import asyncio
import threading
from datetime import datetime

import psycopg
import pytest
from dygo.store import enqueue, results
from dygo.store.results import CHANNEL, await_for_result, finished_ids, register, unregister, wait_for_result

from tests.claiming import claim
from tests.conftest import wait_until
from tests.test_retention import copy_test_config
from tests.twins import SIDES, Twins

pytestmark = pytest.mark.alone


def _waiter_rows(conn: psycopg.Connection) -> list[tuple[int, int]]:
    return conn.execute("SELECT id, job_id FROM dygo_result_waiters ORDER BY id").fetchall()


def _states(conn: psycopg.Connection, ids: list[int]) -> set[str]:
    return {row[0] for row in conn.execute("SELECT state FROM dygo_jobs WHERE id = ANY(%s)", (ids,))}


def test_a_settle_nobody_waits_for_sends_no_notification(conn, db_url, spawn):
    with psycopg.connect(db_url, autocommit=True) as listener:
        listener.execute(f"LISTEN {CHANNEL}")
        unwatched = [enqueue(conn, "test.noop", {}).id for _ in range(20)]
        cancelled = enqueue(conn, "test.record", {}, delay="1h").id
        spawn("worker").wait_for_line("started")
        wait_until(lambda: _states(conn, unwatched) == {"succeeded"}, message="the worker to settle them")
        conn.execute("UPDATE dygo_jobs SET state = 'cancelled', finished_at = now() WHERE id = %s", (cancelled,))
        assert [n.payload for n in listener.notifies(timeout=1.0)] == []

        # Somebody waits: that job's id, and only it, is notified; the waiter's row is gone afterwards.
        watched, other = enqueue(conn, "test.record", {"seconds": 0.3}), enqueue(conn, "test.noop", {})
        assert wait_for_result(watched.id, "10s", db=db_url)["state"] == "succeeded"
        payloads = [n.payload for n in listener.notifies(timeout=0.5)]
    assert payloads == [str(watched.id)] and _states(conn, [other.id]) == {"succeeded"}
    assert _waiter_rows(conn) == []


def test_a_waiting_request_is_woken_and_deletes_its_row_when_answered(conn, api, spawn):
    job = enqueue(conn, "test.record", {"seconds": 0.5})
    answer: dict = {}
    thread = threading.Thread(
        target=lambda: answer.update(api.admin.get(f"/api/v1/jobs/{job.id}", params={"wait": "10s"}).json())
    )
    thread.start()
    wait_until(lambda: [row[1] for row in _waiter_rows(conn)] == [job.id], message="the request to register")
    spawn("worker").wait_for_line("started")
    thread.join(10)
    assert answer["state"] == "succeeded"
    assert _waiter_rows(conn) == []


def test_a_waiter_registered_while_settles_run_never_misses_its_job(conn, db_url, spawn):
    # Two workers settle each job within milliseconds of its enqueue, while a waiter for that job
    # connects, LISTENs, reads and registers: every order of the two happens many times over.
    for _ in range(2):
        spawn("worker", "--concurrency", "8").wait_for_line("started")
    jobs, seconds = 600, 8.0

    async def race() -> list[tuple[str, float, bool]]:
        gate = asyncio.Semaphore(16)
        loop = asyncio.get_running_loop()

        async def one(job_id: int) -> tuple[str, float, bool]:
            async with gate:
                started, wall = loop.time(), datetime.now().astimezone()
                job = await await_for_result(job_id, timeout=seconds, db=db_url)
                # Finished after this waiter began: its wait overlapped the job's settle.
                return job["state"], loop.time() - started, job["finished_at"] > wall

        tasks = []
        for _ in range(jobs):
            tasks.append(asyncio.create_task(one(enqueue(conn, "test.noop", {}).id)))
            await asyncio.sleep(0.002)
        return await asyncio.gather(*tasks)

    outcomes = asyncio.run(race())
    states = [state for state, _, _ in outcomes]
    assert states == ["succeeded"] * jobs
    # A missed settle shows as a wait that ends at its timeout (8 s: the re-read then finds the job
    # done). Without the registration's lock this fails (checked: 8.03 s).
    slowest = max(waited for _, waited, _ in outcomes)
    assert slowest < 4.0, slowest
    raced = sum(1 for _, _, pending in outcomes if pending)
    assert raced >= 50, raced  # the waits did overlap the settles (not all found their job done)
    assert _waiter_rows(conn) == []  # each waiter deleted its row


def test_a_claim_never_passes_over_a_job_because_somebody_is_registering_to_wait_for_it(conn, db_url):
    # Claims skip locked rows, and a worker told of a new job claims once, then sleeps until its poll
    # interval: a waiter that locked its pending job while registering would hide it for that long.
    # Three threads register for the newest job without pause while each job is claimed.
    newest: list[int] = []
    stop = threading.Event()

    def keep_registering() -> None:
        with psycopg.connect(db_url, autocommit=True) as own:
            while not stop.is_set():
                if newest:
                    waiter, _ = register(own, newest[-1], 5.0)
                    unregister(own, waiter)

    async def claim_each(count: int) -> int:
        passed_over = 0
        async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as claimer:
            for _ in range(count):
                newest.append(enqueue(conn, "test.noop", {}).id)
                await asyncio.sleep(0.002)  # the registrations are under way
                if not await claim(claimer, "default", 1, "w1", 30.0):
                    passed_over += 1
                    await claim(claimer, "default", 1, "w1", 30.0)  # once it is free again (or fail below)
        return passed_over

    threads = [threading.Thread(target=keep_registering) for _ in range(3)]
    for thread in threads:
        thread.start()
    try:
        passed_over = asyncio.run(claim_each(200))
    finally:
        stop.set()
        for thread in threads:
            thread.join()
    assert passed_over == 0
    assert _states(conn, newest) == {"active"}


def test_an_expired_waiter_row_is_removed_by_the_maintainer(conn, db_url, spawn, tmp_path):
    from tests.conftest import dygo_env

    live, expired = enqueue(conn, "test.record", {}, delay="1h"), enqueue(conn, "test.record", {}, delay="1h")
    with psycopg.connect(db_url, autocommit=True) as waiter_conn:
        kept, _ = register(waiter_conn, live.id, 60)
        gone, _ = register(waiter_conn, expired.id, 60)
    # A waiter that died: its row's expiry (its wait plus the grace) has passed.
    conn.execute("UPDATE dygo_result_waiters SET expires_at = now() - interval '1 second' WHERE id = %s", (gone,))
    config = copy_test_config(tmp_path, "retention_interval: 1s\n")
    worker = spawn("worker", env=dygo_env(db_url, DYGO_CONFIG_DIR=str(config)))
    worker.wait_for_line("started")
    wait_until(
        lambda: [row[0] for row in _waiter_rows(conn)] == [kept],
        timeout=15,
        message="the expired waiter row to be deleted",
    )
    wait_until(lambda: "1 result waiters" in worker.stderr(), timeout=5, message="the retention log line")
    # The live row still gets its notification.
    with psycopg.connect(db_url, autocommit=True) as listener:
        listener.execute(f"LISTEN {CHANNEL}")
        conn.execute(
            "UPDATE dygo_jobs SET state = 'cancelled', finished_at = now() WHERE id = ANY(%s)", ([live.id, expired.id],)
        )
        notified = set().union(*(finished_ids(n.payload) for n in listener.notifies(timeout=0.5)))
    assert notified == {live.id}


@pytest.fixture(params=SIDES)
def waiters(request, db_url):
    twins = Twins(results, db_url, request.param)
    yield twins
    twins.close()


def _expires_in(conn: psycopg.Connection, waiter: int) -> float:
    return conn.execute(
        "SELECT extract(epoch FROM expires_at - now())::float8 FROM dygo_result_waiters WHERE id = %s", (waiter,)
    ).fetchone()[0]


def test_a_registration_reads_the_job_after_it_and_expires_its_wait_plus_the_grace(conn, waiters):
    job = enqueue(conn, "test.record", {})
    waiter, read = waiters.register(job.id, 5.0)
    assert read["id"] == job.id and read["state"] == "pending"
    assert _waiter_rows(conn) == [(waiter, job.id)]
    assert abs(_expires_in(conn, waiter) - (5.0 + results.WAITER_GRACE)) < 2
    longer, _ = waiters.register(job.id, 3600.0)  # a row lives at most WAITER_LIFETIME past its last refresh
    assert abs(_expires_in(conn, longer) - (results.WAITER_LIFETIME + results.WAITER_GRACE)) < 2
    assert waiters.register(999999, 5.0)[1] is None  # no such job: registered, and the read says so

    assert waiters.refresh(waiter, 3600.0) is True
    assert abs(_expires_in(conn, waiter) - (results.WAITER_LIFETIME + results.WAITER_GRACE)) < 2
    waiters.unregister(waiter)
    assert waiter not in [row[0] for row in _waiter_rows(conn)]
    assert waiters.refresh(waiter, 5.0) is False  # gone: the caller registers again


def test_a_registration_that_fails_rolls_back_and_leaves_the_connection_usable(conn, waiters):
    job = enqueue(conn, "test.record", {})
    with pytest.raises(psycopg.errors.NumericValueOutOfRange):
        waiters.register(2**63, 5.0)  # no bigint: the insert fails inside the pipelined transaction
    assert waiters.idle()
    assert _waiter_rows(conn) == []
    waiter, read = waiters.register(job.id, 5.0)
    assert read["state"] == "pending" and _waiter_rows(conn) == [(waiter, job.id)]
