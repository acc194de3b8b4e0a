"""Events (`ctx.wait_for_event`, `dygo.emit`, store/events.py): real PostgreSQL, real `dygo worker` processes;
each effect of the waiting job is a `test_runs` row noted with its name (tests/jobs.py)."""

from __future__ import annotations

import asyncio
import threading

import psycopg
import pytest
from dygo.store import aemit, emit, enqueue
from dygo.store.admin import act_on_job
from dygo.store.errors import EventError
from dygo.store.events import Emitted, check_key, timeout_seconds
from dygo.store.maintenance import RetentionPeriods

from tests.conftest import wait_until
from tests.test_retention import run_trim
from tests.test_steps import effects, started_worker
from tests.test_worker import job_row, wait_for_state


def wait_of(conn: psycopg.Connection, job_id: int) -> tuple:
    """The job's event wait: (state, waits_for, result, has a deadline)."""
    row = conn.execute(
        "SELECT state, waits_for, result, wake_at IS NOT NULL FROM dygo_steps WHERE job_id = %s AND key = 'approval#1'",
        (job_id,),
    ).fetchone()
    return tuple(row) if row else ()


def waiting(conn: psycopg.Connection, job_id: int) -> dict:
    """The job once it waits for its event, its wait recorded."""
    row = wait_for_state(conn, job_id, "waiting")
    assert wait_of(conn, job_id)[0] == "waiting"
    return row


def blocked_on_lock(conn: psycopg.Connection, fragment: str) -> bool:
    """Whether a backend is waiting for a lock while running a statement that contains `fragment`."""
    return conn.execute(
        "SELECT EXISTS (SELECT FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE %s "
        "AND datname = current_database())",
        (f"%{fragment}%",),
    ).fetchone()[0]


def test_a_waiting_job_holds_no_slot_and_resumes_with_the_emitted_payload(conn, spawn):
    job = enqueue(conn, "test.wait_event", {"key": "order:1"})
    spawn("worker", "--concurrency", "1").wait_for_line("started")
    row = waiting(conn, job.id)
    assert row["attempt"] == 0 and row["lease_token"] is None  # refunded, and no run holds it
    assert wait_of(conn, job.id) == ("waiting", "order:1", None, False)

    other = enqueue(conn, "test.record", {})  # the worker runs one job at a time: the wait holds no slot
    wait_for_state(conn, other.id, "succeeded")

    assert emit(conn, "order:1", {"approved": True}) == Emitted(woken=1, duplicate=False)
    row = wait_for_state(conn, job.id, "succeeded", "dead")
    assert (row["state"], row["result"]) == ("succeeded", {"payload": {"approved": True}, "attempt": 1})
    assert effects(conn, job.id) == {"before": 1, "run": 2, "after": 1}
    assert wait_of(conn, job.id) == ("done", "order:1", {"approved": True}, False)


def test_an_event_emitted_before_the_wait_begins_is_not_lost(conn, spawn):
    assert emit(conn, "order:2", [1, 2]) == Emitted(woken=0, duplicate=False)
    job = enqueue(conn, "test.wait_event", {"key": "order:2"})
    started_worker(spawn)
    row = wait_for_state(conn, job.id, "succeeded", "dead")
    assert row["result"] == {"payload": [1, 2], "attempt": 1}
    assert effects(conn, job.id)["run"] == 1  # it never suspended: the wait found the event at once
    assert wait_of(conn, job.id)[:3] == ("done", "order:2", [1, 2])


def test_a_double_emit_keeps_the_first_payload_and_wakes_nobody(conn, spawn):
    job = enqueue(conn, "test.wait_event", {"key": "order:3"})
    started_worker(spawn)
    waiting(conn, job.id)
    assert emit(conn, "order:3", "first") == Emitted(woken=1, duplicate=False)
    assert emit(conn, "order:3", "second") == Emitted(woken=0, duplicate=True)
    assert wait_for_state(conn, job.id, "succeeded")["result"]["payload"] == "first"
    assert conn.execute("SELECT payload FROM dygo_events WHERE key = 'order:3'").fetchone()[0] == "first"


def test_an_emit_in_a_rolled_back_transaction_wakes_nobody_and_a_later_emit_does(conn, db_url, spawn):
    job = enqueue(conn, "test.wait_event", {"key": "order:4"})
    started_worker(spawn)
    waiting(conn, job.id)
    with psycopg.connect(db_url) as tx:  # not autocommit: the emit runs in this transaction
        assert emit(tx, "order:4", "lost") == Emitted(woken=1, duplicate=False)
        tx.rollback()
    assert job_row(conn, job.id)["state"] == "waiting" and wait_of(conn, job.id)[0] == "waiting"
    assert conn.execute("SELECT emitted_at FROM dygo_events WHERE key = 'order:4'").fetchone() == (None,)

    assert emit(conn, "order:4", "kept") == Emitted(woken=1, duplicate=False)
    assert wait_for_state(conn, job.id, "succeeded")["result"]["payload"] == "kept"


def test_an_emit_in_flight_when_the_wait_settles_makes_the_job_check_again_and_wake_at_its_commit(conn, db_url, spawn):
    """The emit's transaction has written the event but not committed: the run finds no event and suspends; its
    settle waits a moment for the event's row, then gives up (the worker's shared connection is not left to
    someone else's transaction) and settles the job to check again a second later, recording no wait. The
    worker runs other jobs meanwhile. At the emit's commit, the next check finds the event."""
    with psycopg.connect(db_url) as tx:
        assert emit(tx, "order:5", "raced") == Emitted(woken=0, duplicate=False)
        job = enqueue(conn, "test.wait_event", {"key": "order:5"})
        spawn("worker", "--concurrency", "1").wait_for_line("started")
        wait_until(lambda: effects(conn, job.id)["run"] >= 2, message="the wait to be checked again")
        assert wait_of(conn, job.id) == ()  # no wait recorded without the event's row
        other = enqueue(conn, "test.record", {})
        wait_for_state(conn, other.id, "succeeded")
        assert job_row(conn, job.id)["attempt"] <= 1  # every check refunded
        tx.commit()
    row = wait_for_state(conn, job.id, "succeeded", "dead")
    assert row["result"] == {"payload": "raced", "attempt": 1}
    assert wait_of(conn, job.id)[:3] == ("done", "order:5", "raced")


def test_an_emit_waiting_for_a_settle_that_holds_the_event_row_wakes_the_wait_it_records(conn, db_url, spawn):
    """The settle holds the event's row FOR SHARE and is held up before it records the wait (a test transaction
    has an uncommitted row under the wait's key); an emit then waits for the event's row. Once the settle
    commits, the emit finds the wait recorded and wakes it."""
    job = enqueue(conn, "test.wait_event", {"key": "order:6", "pause": 1.0})
    started_worker(spawn)
    result: list[Emitted] = []
    with psycopg.connect(db_url) as hold:
        wait_until(lambda: effects(conn, job.id)["run"] == 1, message="the run to pause before its wait")
        hold.execute(
            "INSERT INTO dygo_steps (job_id, key, op, seq, attempt, duration, state, waits_for) "
            "VALUES (%s, 'approval#1', 'event', 1, 1, 0, 'waiting', 'order:6')",
            (job.id,),
        )
        wait_until(lambda: blocked_on_lock(conn, "pg_current_xact_id"), message="the settle to wait for the step row")
        assert job_row(conn, job.id)["state"] == "active"  # its settle has not committed

        def emitter() -> None:
            with psycopg.connect(db_url, autocommit=True) as other:
                result.append(emit(other, "order:6", "after the settle"))

        thread = threading.Thread(target=emitter)
        thread.start()
        wait_until(lambda: blocked_on_lock(conn, "INSERT INTO dygo_events"), message="the emit to wait for the row")
        hold.rollback()
    thread.join(10)
    assert result == [Emitted(woken=1, duplicate=False)]
    row = wait_for_state(conn, job.id, "succeeded", "dead")
    assert row["result"] == {"payload": "after the settle", "attempt": 1}
    assert effects(conn, job.id)["run"] == 2


def test_a_timeout_raises_event_timeout_which_the_handler_can_catch(conn, spawn):
    job = enqueue(conn, "test.wait_event", {"key": "order:7", "timeout": "1s", "catch": True})
    started_worker(spawn)
    assert waiting(conn, job.id) and wait_of(conn, job.id)[3]  # a deadline
    row = wait_for_state(conn, job.id, "succeeded", "dead", timeout=10)
    assert row["result"] == {
        "timed_out": "step 'approval#1': event 'order:7' was not emitted within 1s",
        "attempt": 1,
    }
    assert wait_of(conn, job.id)[0] == "timed_out"
    assert effects(conn, job.id) == {"before": 1, "run": 2, "timed out": 1}
    assert emit(conn, "order:7", "late") == Emitted(woken=0, duplicate=False)  # a timed-out wait stays so


def test_an_uncaught_timeout_fails_the_attempt_naming_the_wait(conn, spawn):
    job = enqueue(conn, "test.wait_event", {"key": "order:8", "timeout": 0.5}, max_attempts=1)
    started_worker(spawn)
    row = wait_for_state(conn, job.id, "dead", "succeeded", timeout=10)
    assert row["state"] == "dead"
    assert "EventTimeout: step 'approval#1': event 'order:8' was not emitted within 0.5s" in row["last_error"]


def test_a_retry_after_the_event_replays_the_wait_without_waiting_again(conn, spawn):
    job = enqueue(conn, "test.wait_event", {"key": "order:9", "fail_once": True})
    started_worker(spawn)
    waiting(conn, job.id)
    emit(conn, "order:9", {"n": 9})
    row = wait_for_state(conn, job.id, "succeeded", "dead")
    assert row["result"] == {"payload": {"n": 9}, "attempt": 2}
    assert effects(conn, job.id) == {"before": 1, "run": 3, "after": 1, "fail": 2}
    assert row["errors"][0]["error"].endswith("failing once after the event")


def test_a_sync_handler_waits_for_its_event(conn, spawn):
    job = enqueue(conn, "test.wait_event_sync", {"key": "order:10"})
    started_worker(spawn)
    waiting(conn, job.id)
    emit(conn, "order:10", True)
    row = wait_for_state(conn, job.id, "succeeded", "dead")
    assert row["result"] == {"payload": True, "attempt": 1}
    assert effects(conn, job.id) == {"before": 1, "after": 1}


def test_many_jobs_waiting_for_one_key_are_all_woken_by_one_emit(conn, spawn):
    jobs = [enqueue(conn, "test.wait_event", {"key": "deploy:done"}).id for _ in range(5)]
    started_worker(spawn)
    for job_id in jobs:
        waiting(conn, job_id)
    assert emit(conn, "deploy:done") == Emitted(woken=5, duplicate=False)
    for job_id in jobs:
        assert wait_for_state(conn, job_id, "succeeded")["result"]["payload"] is None


def test_event_keys_payloads_and_timeouts_are_checked_with_errors_naming_the_field(conn, db_url):
    for bad in ("", "a/b", "tab\there", "x" * 201, 42):
        with pytest.raises(EventError, match="^key: ") as caught:
            check_key(bad)
        assert caught.value.details == {"field": "key"}
    with pytest.raises(EventError, match="^payload: must be JSON-serialisable"):
        emit(conn, "fine", {1, 2})
    with pytest.raises(EventError, match="^timeout: 'soon' is not a duration"):
        timeout_seconds("soon")
    with pytest.raises(EventError, match="^timeout: must not be negative"):
        timeout_seconds(-1)
    assert timeout_seconds("3d") == 3 * 86400 and timeout_seconds(None) is None
    with psycopg.connect(db_url) as tx:
        tx.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        with pytest.raises(EventError, match="^transaction: an emit needs a READ COMMITTED transaction"):
            emit(tx, "fine")


def test_retention_deletes_events_and_placeholders_older_than_event_retention(conn, db_url):
    conn.execute(
        "INSERT INTO dygo_events (key, payload, emitted_at, created_at) VALUES "
        "('old', '1', now() - interval '8 days', now() - interval '9 days'), "
        "('recent', '2', now() - interval '1 day', now() - interval '9 days'), "  # a placeholder emitted lately
        "('old placeholder', NULL, NULL, now() - interval '8 days'), "
        "('placeholder', NULL, NULL, now() - interval '1 day')"
    )
    week = RetentionPeriods(succeeded=0, dead=0, cancelled=0, daily_stats=0, events=7 * 86400)
    trimmed = run_trim(db_url, week)
    assert trimmed is not None and trimmed.events == 2
    assert {key for (key,) in conn.execute("SELECT key FROM dygo_events")} == {"recent", "placeholder"}
    assert run_trim(db_url, RetentionPeriods(succeeded=0, dead=0, cancelled=0, daily_stats=0)).events == 0


def test_a_cancelled_waiting_job_retried_waits_again_or_resumes_if_its_event_came(conn, spawn):
    job = enqueue(conn, "test.wait_event", {"key": "order:11"})
    other = enqueue(conn, "test.wait_event", {"key": "order:12"})
    started_worker(spawn)
    waiting(conn, job.id)
    waiting(conn, other.id)
    for job_id in (job.id, other.id):
        assert act_on_job(conn, "cancel", job_id)["state"] == "cancelled"

    # Emitted while its job is cancelled: the wait is done, but nobody is woken.
    assert emit(conn, "order:12", "meanwhile") == Emitted(woken=0, duplicate=False)
    assert wait_of(conn, other.id)[:3] == ("done", "order:12", "meanwhile")
    assert job_row(conn, other.id)["state"] == "cancelled"

    act_on_job(conn, "retry", other.id)
    assert wait_for_state(conn, other.id, "succeeded", "dead")["result"]["payload"] == "meanwhile"
    act_on_job(conn, "retry", job.id)
    wait_until(lambda: effects(conn, job.id)["run"] == 2, message="the retry to replay its wait")
    waiting(conn, job.id)  # it waits again, on the wait recorded before
    assert emit(conn, "order:11", "later") == Emitted(woken=1, duplicate=False)
    assert wait_for_state(conn, job.id, "succeeded", "dead")["result"]["payload"] == "later"


@pytest.mark.parametrize("ending", ["emit", "timeout"])
def test_a_wait_ended_while_its_replay_runs_wakes_the_job_when_the_replay_waits_again(conn, spawn, ending):
    """A retried job replays a wait still waiting; while its run goes on, an emit (or the timeout sweep) ends the
    wait and leaves the job alone (it is active). The run then waits again: its settle finds the wait ended
    and makes the job pending at once, and the next run gets the payload (or EventTimeout)."""
    args = {"key": f"order:13{ending}", "pause": 3.0, "pause_at": 2, "catch": True}
    if ending == "timeout":
        args["timeout"] = 1.5  # passes while the retry's run pauses
    job = enqueue(conn, "test.wait_event", args)
    started_worker(spawn)
    waiting(conn, job.id)
    act_on_job(conn, "cancel", job.id)
    act_on_job(conn, "retry", job.id)
    wait_until(lambda: effects(conn, job.id)["run"] == 2, message="the retry's run to pause before its wait")
    if ending == "emit":
        assert emit(conn, args["key"], "while it ran") == Emitted(woken=0, duplicate=False)
    else:
        wait_until(lambda: wait_of(conn, job.id)[0] == "timed_out", timeout=5, message="the sweep")
    assert job_row(conn, job.id)["state"] == "active"
    row = wait_for_state(conn, job.id, "succeeded", "dead")
    expected = "while it ran" if ending == "emit" else None
    assert row["result"].get("payload") == expected
    assert ("timed_out" in row["result"]) == (ending == "timeout")
    assert effects(conn, job.id)["run"] == 3


def test_aemit_wakes_on_an_async_connection_in_its_own_or_the_caller_s_transaction(conn, db_url, spawn):
    jobs = {key: enqueue(conn, "test.wait_event", {"key": key}).id for key in ("async:1", "async:2")}
    started_worker(spawn)
    for job_id in jobs.values():
        waiting(conn, job_id)

    async def go() -> list[Emitted]:
        async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as aconn:
            first = await aemit(aconn, "async:1", {"n": 1})
            async with aconn.transaction():
                second = await aemit(aconn, "async:2", {"n": 2})
                again = await aemit(aconn, "async:2", {"n": 3})
            return [first, second, again]

    assert asyncio.run(go()) == [Emitted(1, False), Emitted(1, False), Emitted(0, True)]
    for n, job_id in enumerate(jobs.values(), 1):
        assert wait_for_state(conn, job_id, "succeeded")["result"]["payload"] == {"n": n}


def test_an_emit_inside_a_savepoint_wakes_its_waits(conn, db_url, spawn):
    job = enqueue(conn, "test.wait_event", {"key": "order:14"})
    started_worker(spawn)
    waiting(conn, job.id)
    with psycopg.connect(db_url, autocommit=True) as outer, outer.transaction(), outer.transaction():
        assert emit(outer, "order:14", "nested") == Emitted(woken=1, duplicate=False)
    assert wait_for_state(conn, job.id, "succeeded")["result"]["payload"] == "nested"


def test_a_settle_that_cannot_take_an_event_row_rechecks_only_event_waits():
    from datetime import UTC, datetime

    from dygo.store.events import RECHECK_DELAY, recheck
    from dygo.store.leases import ClaimedJob, Succeeded, Unsuccessful, Wait
    from dygo.store.sql.events import LOCK_EVENT

    def claimed(job_id: int) -> ClaimedJob:
        return ClaimedJob(job_id, "test.noop", "default", {}, {}, 1, 3, datetime.now(UTC), "token")

    event_wait = Unsuccessful(claimed(1), "waiting", refund_attempt=True, wait=Wait("e", "SELECT 1", {}, LOCK_EVENT))
    other_wait = Unsuccessful(claimed(2), "waiting", refund_attempt=True, wait=Wait("child", "SELECT 1", {}))
    success = Succeeded(claimed(3), None)
    assert recheck([other_wait, success]) is None
    again = recheck([event_wait, other_wait, success])
    assert again is not None and again[1:] == [other_wait, success]
    assert (again[0].state, again[0].delay, again[0].refund_attempt, again[0].wait) == (
        "pending",
        RECHECK_DELAY,
        True,
        None,
    )


def test_cancelling_a_workflow_cancels_its_job_waiting_for_an_event(conn, spawn):
    from dygo.store.workflows import Workflow, cancel_workflow, enqueue_workflow, get_workflow

    wf = Workflow("approval")
    wf.add("approve", "test.wait_event", {"key": "order:wf"})
    handle = enqueue_workflow(conn, wf)
    job_id = handle.jobs["approve"]
    spawn("worker").wait_for_line("started")
    waiting(conn, job_id)

    cancel_workflow(conn, handle.id)
    assert job_row(conn, job_id)["state"] == "cancelled"
    assert get_workflow(conn, handle.id)["state"] == "cancelled"
    assert emit(conn, "order:wf", {}).woken == 0  # its event no longer runs it
    assert effects(conn, job_id) == {"before": 1, "run": 1}
