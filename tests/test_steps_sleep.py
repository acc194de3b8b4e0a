"""Durable sleep (`ctx.sleep`, store/steps.py): real PostgreSQL, real `dygo worker` processes; each step's side
effect is a `test_runs` row noted with its name (tests/jobs.py)."""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime

import psycopg
import pytest
from dygo.store import enqueue
from dygo.store.errors import LeaseLost
from dygo.store.leases import ClaimedJob, Unsuccessful, recover_expired, settle_delay
from dygo.store.steps import StepLease, load_steps, record_sleep

from tests.claiming import claim
from tests.conftest import REPO, dygo_env, wait_until
from tests.test_steps import effects, started_worker, steps_of
from tests.test_worker import job_row, wait_for_state


def test_a_sleeping_job_frees_its_slot_and_resumes_after_its_wake_time_on_the_same_attempt(conn, spawn):
    job = enqueue(conn, "test.steps_sleep", {"seconds": 3})
    worker = spawn("worker", "--concurrency", "1")
    worker.wait_for_line("started")
    wait_until(lambda: effects(conn, job.id)["run"] == 1, message="the first run to reach its sleep")
    sleeping = wait_for_state(conn, job.id, "pending")
    assert sleeping["attempt"] == 0  # refunded: the run after the sleep is attempt 1 again
    wake_at = conn.execute("SELECT wake_at FROM dygo_steps WHERE job_id = %s AND key = 'cool-off#1'", (job.id,))
    assert sleeping["run_at"] >= wake_at.fetchone()[0]

    # The worker runs one job at a time: another job runs while the first sleeps.
    other = enqueue(conn, "test.record", {})
    wait_for_state(conn, other.id, "succeeded")
    assert job_row(conn, job.id)["state"] == "pending"

    row = wait_for_state(conn, job.id, "succeeded", "dead")
    assert (row["state"], row["attempt"], row["result"]) == ("succeeded", 1, [1, 1, 1])
    assert effects(conn, job.id) == {"one": 1, "run": 2, "two": 1}
    assert {key: op for key, (op, *_) in steps_of(conn, job.id).items()} == {
        "one#1": "step",
        "cool-off#1": "sleep",
        "two#1": "step",
    }


def test_a_sync_handler_sleeps_and_resumes(conn, spawn):
    job = enqueue(conn, "test.steps_sleep_sync", {})
    started_worker(spawn)
    row = wait_for_state(conn, job.id, "succeeded", "dead")
    assert (row["state"], row["attempt"], row["result"]) == ("succeeded", 1, [1, 1, 1])
    assert effects(conn, job.id) == {"one": 1, "two": 1}
    assert steps_of(conn, job.id)["cool-off#1"][0] == "sleep"


def test_the_old_run_of_a_reaped_job_can_record_no_sleep(conn, db_url):
    job_id = enqueue(conn, "test.noop", {}).id

    async def go():
        async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as c:
            [stale] = await claim(c, "default", 1, "w1", 30)
            old = StepLease(stale.id, stale.lease_token, stale.attempt)
            await c.execute("UPDATE dygo_jobs SET lease_deadline = now() - interval '1s' WHERE id = %s", (job_id,))
            assert (await recover_expired(c, max_reaps=3)).jobs == [(job_id, "pending")]
            with pytest.raises(LeaseLost, match=f"job {job_id}: step 'nap#1' not recorded"):
                await record_sleep(c, old, "nap#1", 1, 60.0)
            [fresh] = await claim(c, "default", 1, "w2", 30)
            new = StepLease(fresh.id, fresh.lease_token, fresh.attempt)
            left = await record_sleep(c, new, "nap#1", 1, 60.0)
            again = await record_sleep(c, new, "nap#1", 1, 3600.0)  # the first record of a key wins
            return left, again, await load_steps(c, job_id)

    left, again, stored = asyncio.run(go())
    assert 0 < again <= left <= 60
    assert list(stored) == ["nap#1"] and stored["nap#1"].left is not None


def test_a_sleep_s_settle_counts_its_seconds_left_from_when_they_were_measured():
    """The settle sets run_at to the wake time, not the wake time plus however long the settle waited."""
    job = ClaimedJob(1, "test.noop", "default", {}, {}, 1, 3, datetime.now(UTC), "token")
    snooze = Unsuccessful(job, "pending", delay=10.0, refund_attempt=True)
    assert settle_delay(snooze) == 10.0
    sleep = Unsuccessful(job, "pending", delay=10.0, refund_attempt=True, delay_since=time.monotonic() - 4.0)
    assert 5.0 < settle_delay(sleep) <= 6.0
    overdue = Unsuccessful(job, "pending", delay=1.0, refund_attempt=True, delay_since=time.monotonic() - 4.0)
    assert settle_delay(overdue) == 0.0


def test_a_run_that_sleeps_logs_sleeping_with_its_wake_time(conn, spawn):
    job = enqueue(conn, "test.steps_sleep", {"seconds": 3600})
    worker = started_worker(spawn)
    wait_until(lambda: effects(conn, job.id)["run"] == 1, message="the run to reach its sleep")
    line = f"job {job.id} test.steps_sleep attempt 1/3 sleeping in "
    wait_until(lambda: line in worker.stderr(), message="the run's execution line")
    [logged] = [text for text in worker.stderr().splitlines() if line in text]
    assert logged.split(", ")[-1] in ("wakes in 59m59s", "wakes in 60m00s")


def test_the_example_checkout_charges_once_sleeps_and_ships_on_its_retry(conn, db_url, spawn):
    """The README's example (jobs/examples.py, the repository's own config): the retry after the failed
    ship replays the charge recorded by attempt 1 and the sleep already over, and ships."""
    job_id = conn.execute(
        "INSERT INTO dygo_jobs (kind, queue, args) VALUES ('example.checkout', 'default', "
        """'{"fail_at_ship": 1, "cool_off": 0.5}') RETURNING id"""
    ).fetchone()[0]
    worker = spawn("worker", env=dygo_env(db_url, DYGO_CONFIG_DIR=str(REPO / "config")))
    worker.wait_for_line("started")
    row = wait_for_state(conn, job_id, "succeeded", "dead")
    assert (row["state"], row["attempt"]) == ("succeeded", 2), worker.stderr()[-2000:]
    assert row["result"] == {"charge": f"ch_{job_id}", "at_attempt": 1, "label": f"lbl_{job_id}"}
    keys = [key for (key,) in conn.execute("SELECT key FROM dygo_steps WHERE job_id = %s ORDER BY seq", (job_id,))]
    assert keys == ["charge#1", "cool-off#1", "ship#1"]


def test_the_example_approval_waits_for_its_event_then_runs_its_parcels_as_child_jobs(conn, db_url, spawn):
    """jobs/examples.py's example.approval with the repository's own config: waits without a slot until
    its event is emitted (as `dygo events emit` does), then waits for its two child jobs' results."""
    from dygo.store import emit

    job_id = conn.execute(
        "INSERT INTO dygo_jobs (kind, queue, args) VALUES ('example.approval', 'default', "
        """'{"order": "7"}') RETURNING id"""
    ).fetchone()[0]
    worker = spawn("worker", env=dygo_env(db_url, DYGO_CONFIG_DIR=str(REPO / "config")))
    worker.wait_for_line("started")
    wait_for_state(conn, job_id, "waiting")
    assert emit(conn, "approval:7", {"approved": True}).woken == 1
    row = wait_for_state(conn, job_id, "succeeded", "dead")
    assert row["state"] == "succeeded", worker.stderr()[-2000:]
    assert row["result"]["approved"] is True and len(row["result"]["parcels"]) == 2
    children = conn.execute("SELECT count(*) FROM dygo_jobs WHERE parent_id = %s AND state = 'succeeded'", (job_id,))
    assert children.fetchone()[0] == 2
