"""Results and progress: waiting for a job to finish (HTTP and Python), progress reports mid-job."""

from __future__ import annotations

import asyncio
import threading
import time
from datetime import datetime

import pytest
from dygo.store import enqueue, make_context, results
from dygo.store.errors import NotFound, WaitTimeout
from dygo.store.results import await_for_result, wait_for_result

from tests.conftest import wait_until


def await_in_a_loop(job_id: int, timeout: str | float, *, db: str) -> dict:
    return asyncio.run(await_for_result(job_id, timeout, db=db))


# The two twins of a Python wait, each run so that it blocks its caller until it answers.
PYTHON_WAITS = pytest.mark.parametrize("wait_for", [wait_for_result, await_in_a_loop], ids=["sync", "async"])


@pytest.fixture
def worker(spawn):
    process = spawn("worker", "--poll-interval", "60s")
    process.wait_for_line("started")
    return process


def epoch(timestamp: str) -> float:
    return datetime.fromisoformat(timestamp).timestamp()


def test_waiting_request_is_woken_by_the_job_finishing(conn, api, worker):
    lags = []
    for _ in range(3):
        job = enqueue(conn, "test.record", {"seconds": 0.4})
        asked = time.monotonic()
        response = api.admin.get(f"/api/v1/jobs/{job.id}", params={"wait": "10s"})
        received = time.time()
        assert response.status_code == 200, response.text
        body = response.json()
        assert body["state"] == "succeeded" and body["result"] == {"attempt": 1, "retry": False}
        assert time.monotonic() - asked >= 0.3  # it did wait for the handler
        lags.append(received - epoch(body["finished_at"]))
    # finished_at is the settle transaction's start on the database clock (same machine). Serve does not
    # poll and the wait is 10 s, so an answer within a second of it came from the settle's NOTIFY; how soon
    # exactly is a figure for bench/, not a bound a loaded CI machine keeps every time.
    assert all(0 <= lag < 1.0 for lag in lags), lags


@pytest.mark.shared_database  # the module's one database and server: it reads only its own jobs
def test_wait_on_a_job_that_never_finishes_returns_it_as_it_is_at_the_timeout(conn, api):
    job = enqueue(conn, "test.record", {})  # no worker runs it
    asked = time.monotonic()
    response = api.admin.get(f"/api/v1/jobs/{job.id}", params={"wait": "300ms"})
    waited = time.monotonic() - asked
    assert response.status_code == 200 and response.json()["state"] == "pending"
    assert 0.3 <= waited < 1.0, waited


@pytest.mark.shared_database  # the module's one database and server: it reads only its own jobs
def test_wait_longer_than_60s_or_not_a_duration_is_refused_naming_the_field(conn, api):
    job = enqueue(conn, "test.record", {})
    for wait in ("61s", "soon"):
        response = api.admin.get(f"/api/v1/jobs/{job.id}", params={"wait": wait})
        assert response.status_code == 422, response.text
        error = response.json()["error"]
        assert error["code"] == "invalid_duration" and error["details"]["field"] == "wait"
        assert "wait" in error["message"]
    assert api.admin.get("/api/v1/jobs/999999", params={"wait": "5s"}).status_code == 404


def _wait_in_background(api, job_id: int, wait: str = "10s") -> tuple[threading.Thread, dict]:
    answer: dict = {}

    def call() -> None:
        response = api.admin.get(f"/api/v1/jobs/{job_id}", params={"wait": wait})
        answer.update(status=response.status_code, body=response.json(), at=time.monotonic())

    thread = threading.Thread(target=call)
    thread.start()
    time.sleep(0.3)  # the request is now waiting
    return thread, answer


@pytest.mark.shared_database  # the module's one database and server: it reads only its own jobs
def test_cancelling_or_deleting_a_job_wakes_its_waiters_at_once(conn, api):
    cancelled = enqueue(conn, "test.record", {})
    thread, answer = _wait_in_background(api, cancelled.id)
    assert not answer
    acted = time.monotonic()
    assert api.admin.post(f"/api/v1/jobs/{cancelled.id}/cancel").status_code == 200
    thread.join(5)
    assert answer["status"] == 200 and answer["body"]["state"] == "cancelled"
    assert answer["at"] - acted < 0.5

    deleted = enqueue(conn, "test.record", {})
    thread, answer = _wait_in_background(api, deleted.id)
    acted = time.monotonic()
    assert api.admin.delete(f"/api/v1/jobs/{deleted.id}").status_code == 204
    thread.join(5)
    assert answer["status"] == 404 and answer["body"]["error"]["code"] == "job_not_found"
    assert answer["at"] - acted < 0.5


def test_a_purge_or_bulk_delete_answers_the_waiters_of_the_deleted_jobs_with_404_at_once(conn, api):
    purged = enqueue(conn, "test.record", {}, delay="1h")  # scheduled: a purge deletes it
    thread, answer = _wait_in_background(api, purged.id, wait="30s")
    acted = time.monotonic()
    report = api.admin.post("/api/v1/queues/default/purge").json()
    assert report["scheduled"] == 1, report
    thread.join(10)
    assert answer["status"] == 404 and answer["body"]["error"]["code"] == "job_not_found"
    assert answer["at"] - acted < 1.5

    from dygo.store.admin import JobFilter, bulk_act

    deleted, kept = enqueue(conn, "test.record", {}, queue="other"), enqueue(conn, "test.record", {})
    thread, answer = _wait_in_background(api, deleted.id, wait="30s")
    kept_thread, kept_answer = _wait_in_background(api, kept.id, wait="2s")
    acted = time.monotonic()
    assert bulk_act(conn, "delete", where=JobFilter(queue="other")).changed == 1  # the dashboard's bulk delete
    thread.join(10)
    assert answer["status"] == 404 and answer["at"] - acted < 1.5
    kept_thread.join(10)  # woken too, it re-read its job, found it pending and went on waiting
    assert kept_answer["status"] == 200 and kept_answer["body"]["state"] == "pending"
    assert kept_answer["at"] - acted >= 1.0


@PYTHON_WAITS
def test_python_wait_raises_not_found_at_once_when_a_purge_deletes_the_job(conn, db_url, wait_for):
    from dygo.store.admin import purge_queue

    job = enqueue(conn, "test.record", {})
    raised: dict = {}

    def wait() -> None:
        try:
            wait_for(job.id, "30s", db=db_url)
        except NotFound as exc:
            raised.update(error=exc, at=time.monotonic())

    thread = threading.Thread(target=wait)
    thread.start()
    wait_until(lambda: _waiter_rows(conn), message="the wait to register")  # it is listening now
    acted = time.monotonic()
    assert purge_queue(conn, "default")["pending"] == 1
    thread.join(10)
    assert isinstance(raised.get("error"), NotFound) and raised["at"] - acted < 1.5


@PYTHON_WAITS
def test_python_wait_returns_the_finished_job_and_raises_wait_timeout_otherwise(conn, db_url, spawn, wait_for):
    job = enqueue(conn, "test.record", {"seconds": 0.2})
    with pytest.raises(WaitTimeout) as timeout:
        wait_for(job.id, "200ms", db=db_url)
    assert timeout.value.job["state"] == "pending" and timeout.value.job_id == job.id
    assert "still pending" in str(timeout.value)

    spawn("worker").wait_for_line("started")
    finished = wait_for(job.id, 10, db=db_url)
    assert finished["state"] == "succeeded" and finished["result"] == {"attempt": 1, "retry": False}

    again = enqueue(conn, "test.abort", {})
    assert wait_for(again.id, "10s", db=db_url)["state"] == "dead"
    with pytest.raises(NotFound):
        wait_for(999999, 1, db=db_url)
    assert _waiter_rows(conn) == []  # each wait deleted its row


def _waiter_rows(conn) -> list[tuple[int, datetime]]:
    return conn.execute("SELECT id, expires_at FROM dygo_result_waiters ORDER BY id").fetchall()


@PYTHON_WAITS
def test_a_python_wait_moves_its_registration_on_and_registers_again_when_its_row_was_deleted(
    conn, db_url, wait_for, monkeypatch
):
    monkeypatch.setattr(results, "WAITER_LIFETIME", 0.5)  # a wait of 20 s outlives its registration
    job = enqueue(conn, "test.record", {})  # no worker runs it
    answer: dict = {}
    thread = threading.Thread(target=lambda: answer.update(job=wait_for(job.id, "20s", db=db_url)))
    thread.start()
    ((first, expires),) = wait_until(lambda: _waiter_rows(conn), message="the wait to register")
    wait_until(
        lambda: [row[1] > expires for row in _waiter_rows(conn)] == [True], message="the registration to move on"
    )
    conn.execute("DELETE FROM dygo_result_waiters")  # as the maintainer deletes a row it found expired
    wait_until(lambda: [row[0] > first for row in _waiter_rows(conn)] == [True], message="the wait to register again")
    conn.execute("UPDATE dygo_jobs SET state = 'cancelled', finished_at = now() WHERE id = %s", (job.id,))
    thread.join(10)
    assert answer["job"]["state"] == "cancelled"
    assert _waiter_rows(conn) == []


def test_result_is_a_deprecated_alias_of_await_for_result_that_still_answers(conn, db_url):
    import dygo
    from dygo import store

    job = enqueue(conn, "test.record", {})
    conn.execute("UPDATE dygo_jobs SET state = 'cancelled', finished_at = now() WHERE id = %s", (job.id,))
    for alias in (dygo.result, store.result):
        with pytest.warns(DeprecationWarning, match=r"result\(\) is deprecated.*use dygo\.await_for_result\(\)"):
            waiting = alias(job.id, "1s", db=db_url)
        assert asyncio.run(waiting)["state"] == "cancelled"
    assert "result" not in dygo.__all__ and "await_for_result" in dygo.__all__


@pytest.mark.parametrize("kind", ["test.progress", "test.progress_sync"])
def test_progress_is_visible_mid_job_and_written_at_most_once_a_second(conn, api, worker, kind):
    job = enqueue(conn, kind, {"seconds": 2.5})
    seen: list[dict] = []

    def progress_while_active():
        body = api.admin.get(f"/api/v1/jobs/{job.id}").json()
        if body["state"] == "active" and body["progress"]:
            seen.append(body["progress"])
        return body["state"] == "succeeded"

    wait_until(progress_while_active, timeout=15, interval=0.02, message="the job to finish")
    assert seen, "no progress seen while the job ran"
    first = seen[0]
    assert 0 <= first["fraction"] < 1 and first["message"].startswith("report ") and first["attempt"] == 1
    # Thousands of reports, a write at most once a second: 2.5 s of reporting -> at most 3 writes
    # (at 0 s, 1 s and 2 s) while it was active.
    reports = int(api.admin.get(f"/api/v1/jobs/{job.id}").json()["result"].split()[0])
    assert reports > 500
    writes = {p["at"] for p in seen}
    assert 2 <= len(writes) <= 3, sorted(writes)
    stamps = sorted(epoch(at) for at in writes)
    assert all(b - a >= 0.95 for a, b in zip(stamps, stamps[1:], strict=False)), stamps


@pytest.mark.parametrize(
    ("kind", "fail"),
    [
        ("test.progress_final", False),
        ("test.progress_final", True),
        ("test.progress_final_sync", False),
        ("test.progress_final_sync", True),
    ],
)
def test_a_finished_job_shows_the_last_progress_its_handler_reported(conn, api, worker, kind, fail):
    # The last report comes 0.3 s after a written one: the once-a-second writer would not write it
    # before the job settles, so only the settle can store it.
    job = enqueue(conn, kind, {"fail": fail})
    silent = enqueue(conn, "test.record", {})
    body = api.admin.get(f"/api/v1/jobs/{job.id}", params={"wait": "10s"}).json()
    assert body["state"] == ("dead" if fail else "succeeded"), body
    progress = body["progress"]
    assert (progress["fraction"], progress["message"], progress["attempt"]) == (1.0, "failing" if fail else "done", 1)
    assert epoch(progress["at"]) == pytest.approx(epoch(body["finished_at"]), abs=0.001)
    assert api.admin.get(f"/api/v1/jobs/{silent.id}", params={"wait": "10s"}).json()["progress"] is None


def test_progress_refuses_a_fraction_outside_0_to_1_with_a_clear_error():
    ctx = make_context()
    ctx.progress(0.5, "halfway")  # no worker: validated, then nowhere to go
    for bad in (1.5, -0.1, float("nan"), "half", True):
        with pytest.raises(ValueError, match="fraction must be a number from 0 to 1"):
            ctx.progress(bad)
    with pytest.raises(ValueError, match="message must be a string"):
        ctx.progress(0.5, 42)  # type: ignore[arg-type]


def test_a_result_above_max_result_bytes_is_replaced_by_a_note_and_the_job_still_succeeds(conn, api, worker):
    small = enqueue(conn, "test.sized_result", {"chars": 60_000})
    big = enqueue(conn, "test.sized_result", {"chars": 70_000})  # 70,002 bytes of JSON > 64 KiB
    kept = api.admin.get(f"/api/v1/jobs/{small.id}", params={"wait": "10s"}).json()
    assert kept["state"] == "succeeded" and kept["result"] == "x" * 60_000
    noted = api.admin.get(f"/api/v1/jobs/{big.id}", params={"wait": "10s"}).json()
    assert noted["state"] == "succeeded"
    assert noted["result"] == {
        "result_not_stored": "70002 bytes of JSON, more than max_result_bytes (65536)",
        "bytes": 70002,
    }
    assert f"job {big.id} test.sized_result: result of 70002 bytes not stored" in worker.stderr()


def test_one_statement_finishing_a_thousand_waited_for_jobs_notifies_their_ids_in_a_few_chunks(conn, db_url):
    import psycopg
    from dygo.store import enqueue_many
    from dygo.store.admin import JobFilter, bulk_act
    from dygo.store.results import CHANNEL, finished_ids, register

    ids = [r.id for r in enqueue_many(conn, [{"kind": "test.record"}] * 1200)]
    waited = ids[100:1100]  # only jobs somebody waits for are notified (migration 0013)
    with psycopg.connect(db_url, autocommit=True) as listener:
        for job_id in waited:
            register(listener, job_id, 30)
        listener.execute(f"LISTEN {CHANNEL}")
        report = bulk_act(conn, "cancel", where=JobFilter(state="pending"))
        assert report.changed == 1200
        payloads = [n.payload for n in listener.notifies(timeout=2, stop_after=4)]
    assert len(payloads) == 3 and all(len(p) < 8000 for p in payloads)
    assert set().union(*(finished_ids(p) for p in payloads)) == set(waited)


def _listen_backends(conn) -> int:
    return conn.execute(
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND query = 'LISTEN dygo_finished'"
    ).fetchone()[0]


def test_waiters_survive_a_dropped_listen_connection_logged_as_lost_then_back(conn, api):
    job = enqueue(conn, "test.record", {})
    thread, answer = _wait_in_background(api, job.id, wait="20s")
    conn.execute(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
        "WHERE datname = current_database() AND query = 'LISTEN dygo_finished'"
    )
    wait_until(
        lambda: "database connection lost (result LISTEN connection" in api.process.stderr(), message="serve to notice"
    )
    # Finished while serve is not listening: its waiter re-reads when serve reconnects.
    conn.execute("UPDATE dygo_jobs SET state = 'cancelled', finished_at = now() WHERE id = %s", (job.id,))
    thread.join(10)
    assert answer["body"]["state"] == "cancelled"

    wait_until(lambda: _listen_backends(conn) == 1, message="serve to LISTEN again")
    assert (
        conn.execute(
            "SELECT application_name FROM pg_stat_activity WHERE datname = current_database() "
            "AND query = 'LISTEN dygo_finished'"
        ).fetchone()[0]
        == "dygo-serve-listen"
    )
    wait_until(lambda: "database connection back after" in api.process.stderr(), message="serve to log it back")
    other = enqueue(conn, "test.record", {})
    thread, answer = _wait_in_background(api, other.id, wait="20s")
    assert api.admin.post(f"/api/v1/jobs/{other.id}/cancel").status_code == 200
    finished = time.monotonic()
    thread.join(10)
    assert answer["body"]["state"] == "cancelled" and answer["at"] - finished < 0.5


def test_progress_is_written_by_a_once_worker_too(conn, spawn):
    job = enqueue(conn, "test.progress_sync", {"seconds": 1.5})
    once = spawn("worker", "--once")
    wait_until(
        lambda: conn.execute("SELECT progress FROM dygo_jobs WHERE id = %s", (job.id,)).fetchone()[0],
        message="a progress write",
    )
    assert once.wait() == 0
