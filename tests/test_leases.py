"""Claim order, SKIP LOCKED, lease renewal, fencing, settling and recovery of expired leases."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import uuid

import psycopg
import pytest
from dygo.store import enqueue, enqueue_many
from dygo.store.backoff import retry_delay
from dygo.store.claim import claim_session
from dygo.store.leases import Succeeded, Unsuccessful, recover_expired, renew, settle

from tests.claiming import claim


def run(coro):
    return asyncio.run(coro)


async def aconnect(url: str) -> psycopg.AsyncConnection:
    return await psycopg.AsyncConnection.connect(url, autocommit=True)


def claim_now(url: str, queue: str = "default", limit: int = 100, owner: str = "w1", ttl: float = 30):
    async def go():
        async with await aconnect(url) as conn:
            return await claim(conn, queue, limit, owner, ttl)

    return run(go())


def state(conn, job_id: int) -> tuple:
    return conn.execute(
        "SELECT state, attempt, lease_owner IS NOT NULL FROM dygo_jobs WHERE id = %s", (job_id,)
    ).fetchone()


def test_claim_order_is_priority_then_run_at_then_id(conn, db_url):
    low = enqueue(conn, "test.noop", {}, priority=0)
    high = enqueue(conn, "test.noop", {}, priority=10)
    older = enqueue(conn, "test.noop", {}, priority=0)
    conn.execute("UPDATE dygo_jobs SET run_at = now() - interval '1 minute' WHERE id = %s", (older.id,))
    future = enqueue(conn, "test.noop", {}, priority=99, delay="1h")
    enqueue(conn, "test.context", {})  # another queue
    claimed = claim_now(db_url)
    assert [j.id for j in claimed] == [high.id, older.id, low.id]
    assert future.id not in [j.id for j in claimed]
    assert all(j.attempt == 1 and j.lease_token for j in claimed)
    assert state(conn, high.id) == ("active", 1, True)


def test_two_concurrent_claimers_skip_each_others_rows(conn, db_url):
    enqueue_many(conn, [{"kind": "test.noop"}] * 10)

    async def go():
        async with await aconnect(db_url) as first, await aconnect(db_url) as second:
            async with first.transaction():  # hold the first claim's row locks open
                mine = await claim(first, "default", 6, "w1", 30)
                theirs = await asyncio.wait_for(claim(second, "default", 6, "w2", 30), timeout=2)
            return mine, theirs

    mine, theirs = run(go())
    assert len(mine) == 6 and len(theirs) == 4
    assert not {j.id for j in mine} & {j.id for j in theirs}


def test_settle_is_fenced_by_the_lease_token(conn, db_url):
    job_id = enqueue(conn, "test.noop", {}).id
    [stale] = claim_now(db_url, ttl=30)
    conn.execute("UPDATE dygo_jobs SET lease_deadline = now() - interval '1s' WHERE id = %s", (job_id,))

    async def go():
        async with await aconnect(db_url) as c:
            assert (await recover_expired(c, max_reaps=3)).jobs == [(job_id, "pending")]
            [fresh] = await claim(c, "default", 1, "w2", 30)
            assert await settle(c, [Succeeded(stale, json.dumps("stale"))]) == set()
            assert await settle(c, [Unsuccessful(stale, "dead", error="stale")]) == set()
            assert await renew(c, [stale], 30) == set()
            assert await renew(c, [fresh], 30) == {job_id}
            assert await settle(c, [Succeeded(fresh, json.dumps("fresh"))]) == {job_id}

    run(go())
    assert conn.execute("SELECT state, result, lease_owner FROM dygo_jobs WHERE id = %s", (job_id,)).fetchone() == (
        "succeeded",
        "fresh",
        None,
    )


def record_commit_modes(conn) -> None:
    """A trigger that writes, for every statement updating dygo_jobs, the synchronous_commit it runs under
    (read back from test_commit_modes.claim)."""
    conn.execute("""CREATE TABLE test_commit_modes (claim text);
        CREATE FUNCTION test_commit_mode() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN INSERT INTO test_commit_modes VALUES (current_setting('synchronous_commit')); RETURN NULL; END $$;
        CREATE TRIGGER test_commit_mode AFTER UPDATE ON dygo_jobs FOR EACH STATEMENT
            EXECUTE FUNCTION test_commit_mode()""")


def test_a_claim_commits_without_waiting_for_the_wal_flush_and_leaves_the_session_as_it_was(conn, db_url):
    # A slot's claim does not wait on the disk. Seen from inside the claim's transaction
    # by a trigger; the session's own setting (a pooled server session's, behind PgBouncer) is untouched.
    record_commit_modes(conn)
    job = enqueue(conn, "test.noop", {})

    async def go():
        async with await aconnect(db_url) as c:
            claimed = await claim(c, "default", 1, "w1", 30)
            return claimed, (await (await c.execute("SHOW synchronous_commit")).fetchone())[0]

    claimed, session = run(go())
    assert [j.id for j in claimed] == [job.id] and state(conn, job.id)[0] == "active"
    assert [row[0] for row in conn.execute("SELECT claim FROM test_commit_modes")] == ["off"]
    assert session == "on"


def test_a_settle_is_all_or_nothing_even_when_its_second_statement_cannot_be_sent(conn, db_url):
    done, failed = (enqueue(conn, "test.noop", {}).id for _ in range(2))
    jobs = {j.id: j for j in claim_now(db_url)}
    # psycopg refuses a NUL in text before sending it: the successes' statement was already on its way.
    unsendable = Unsuccessful(jobs[failed], "pending", delay=1, error="bad\x00byte")

    async def go(outcomes):
        async with await aconnect(db_url) as c:
            try:
                return await settle(c, outcomes)
            finally:
                assert (await (await c.execute("SELECT 1")).fetchone()) == (1,)  # usable after it

    with pytest.raises(psycopg.DataError):
        run(go([Succeeded(jobs[done], None), unsendable]))
    assert [state(conn, i)[0] for i in (done, failed)] == ["active", "active"]
    assert run(go([Succeeded(jobs[done], None), Unsuccessful(jobs[failed], "dead", error="boom")])) == {done, failed}
    assert [state(conn, i)[0] for i in (done, failed)] == ["succeeded", "dead"]


def test_a_settle_stores_each_runs_last_progress_fenced_by_its_lease_token(conn, db_url):
    done, silent, failed, fenced = (enqueue(conn, "test.noop", {}).id for _ in range(4))
    jobs = {j.id: j for j in claim_now(db_url)}
    conn.execute(
        """UPDATE dygo_jobs SET progress = '{"fraction": 0.5, "message": "written"}' WHERE id = %s""", (silent,)
    )
    stolen = dataclasses.replace(jobs[fenced], lease_token=str(uuid.uuid4()))  # a run that lost its lease

    async def go():
        async with await aconnect(db_url) as c:
            return await settle(
                c,
                [
                    Succeeded(jobs[done], None, progress=(1.0, "done")),
                    Succeeded(jobs[silent], None),
                    Succeeded(stolen, None, progress=(0.9, "stale")),
                    Unsuccessful(jobs[failed], "dead", error="boom", progress=(0.25, None)),
                ],
            )

    assert run(go()) == {done, silent, failed}
    progress = dict(conn.execute("SELECT id, progress FROM dygo_jobs").fetchall())
    assert {k: v for k, v in progress[done].items() if k != "at"} == {"fraction": 1.0, "message": "done", "attempt": 1}
    assert progress[silent] == {"fraction": 0.5, "message": "written"}  # no report: left as it was
    assert progress[failed]["fraction"] == 0.25 and progress[failed]["message"] is None
    assert progress[fenced] is None


def test_failure_records_the_attempt_history_and_backoff(conn, db_url):
    job_id = enqueue(conn, "test.noop", {}).id
    [job] = claim_now(db_url)
    delay = retry_delay(job.id, job.attempt, 15)

    async def go():
        async with await aconnect(db_url) as c:
            await settle(c, [Unsuccessful(job, "pending", delay=delay, error="ValueError: boom", traceback="tb")])

    run(go())
    row = conn.execute(
        "SELECT state, run_at - now() > interval '14 seconds', last_error, errors FROM dygo_jobs WHERE id = %s",
        (job_id,),
    ).fetchone()
    assert row[:3] == ("pending", True, "ValueError: boom")
    [entry] = row[3]
    assert (entry["attempt"], entry["error"], entry["traceback"]) == (1, "ValueError: boom", "tb")
    assert entry["worker"] == "w1"


def test_backoff_is_deterministic_and_exponential():
    assert retry_delay(7, 3, 10) == retry_delay(7, 3, 10)
    assert 40 <= retry_delay(7, 3, 10) < 50
    assert retry_delay(7, 4, 10) > retry_delay(7, 3, 10)
    assert retry_delay(7, 40, 10) <= 6 * 3600 * 1.25


def test_expired_lease_is_recovered_then_dies_as_poison_after_max_reaps(conn, db_url):
    job_id = enqueue(conn, "test.noop", {}).id

    async def crash_once():
        async with await aconnect(db_url) as c:
            await claim(c, "default", 1, "crashy", 30)
            await c.execute("UPDATE dygo_jobs SET lease_deadline = now() - interval '1s'")
            return (await recover_expired(c, max_reaps=2)).jobs

    assert run(crash_once()) == [(job_id, "pending")]
    assert state(conn, job_id) == ("pending", 0, False)  # the lost attempt is refunded
    assert run(crash_once()) == [(job_id, "pending")]
    assert run(crash_once()) == [(job_id, "dead")]
    reaps, errors = conn.execute("SELECT reap_count, errors FROM dygo_jobs WHERE id = %s", (job_id,)).fetchone()
    assert reaps == 3 and len(errors) == 3
    assert "lease expired: worker crashy" in errors[0]["error"]


def test_renewal_extends_the_lease(conn, db_url):
    enqueue(conn, "test.noop", {})
    [job] = claim_now(db_url, ttl=5)

    async def go():
        async with await aconnect(db_url) as c:
            return await renew(c, [job], 600)

    assert run(go()) == {job.id}
    assert conn.execute("SELECT lease_deadline > now() + interval '500 seconds' FROM dygo_jobs").fetchone()[0]


def test_snooze_and_hand_back_refund_the_attempt(conn, db_url):
    enqueue_many(conn, [{"kind": "test.noop"}] * 2)
    first, second = claim_now(db_url)

    async def go():
        async with await aconnect(db_url) as c:
            await settle(
                c,
                [
                    Unsuccessful(first, "pending", delay=60, refund_attempt=True),
                    Unsuccessful(second, "pending", refund_attempt=True),
                ],
            )

    run(go())
    rows = conn.execute("SELECT attempt, run_at > now(), errors FROM dygo_jobs ORDER BY id").fetchall()
    assert rows == [(0, True, []), (0, False, [])]


# Widens the window in which a settle holds the row lock of a job it marked succeeded, so that the issue's
# interleaving happens on every run: the settle's transaction sleeps right after locking that row.
SLOW_SUCCESS = """
CREATE FUNCTION test_slow_success() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN PERFORM pg_sleep(0.5); RETURN NULL; END $$;
CREATE TRIGGER test_slow_success AFTER UPDATE ON dygo_jobs FOR EACH ROW
    WHEN (OLD.state = 'active' AND NEW.state = 'succeeded') EXECUTE FUNCTION test_slow_success()"""


def test_settle_and_lease_renewal_lock_rows_in_one_order_and_never_deadlock(conn, db_url):
    # A settles S (succeeded) and U (failed) in one transaction; B renews [U, S] meanwhile, U having the
    # lower id. Locking in different orders, A held S and wanted U while B held U and wanted S:
    # DeadlockDetected, seen live as a stall and a false "database connection lost (renewing ...)".
    u_job, s_job = enqueue_many(conn, [{"kind": "test.noop"}] * 2)
    claimed = {job.id: job for job in claim_now(db_url)}
    u, s = claimed[u_job.id], claimed[s_job.id]
    conn.execute(SLOW_SUCCESS)

    def sleeping() -> bool:
        return (
            conn.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'PgSleep' AND datname = current_database()"
            ).fetchone()[0]
            > 0
        )

    async def go():
        async with await aconnect(db_url) as a, await aconnect(db_url) as b:
            settling = asyncio.create_task(
                settle(a, [Succeeded(s, None), Unsuccessful(u, "pending", delay=60, error="boom")])
            )
            for _ in range(500):  # until A holds S's lock (asleep in the trigger)
                if sleeping():
                    break
                await asyncio.sleep(0.01)
            renewing = asyncio.create_task(renew(b, [u, s], 30))
            return await asyncio.gather(settling, renewing)

    settled, held = run(go())
    assert settled == {u.id, s.id}
    assert held == set()  # renewed after the settle committed: both leases are gone
    assert state(conn, s.id)[0] == "succeeded" and state(conn, u.id)[0] == "pending"


def test_max_attempts_unset_at_enqueue_is_resolved_from_the_registration_at_the_first_lease(conn, db_url):
    # A registration's retries apply at the first lease unless the job set its own. Stamped at
    # enqueue, a producer that does not import the kind stored the default (20) for a kind declared with 3.
    registered = enqueue(conn, "test.fail", {})  # @job(max_attempts=3)
    own = enqueue(conn, "test.fail", {}, max_attempts=7)
    plain = enqueue(conn, "test.noop", {})  # no max_attempts in its registration: the configured default
    stored = dict(conn.execute("SELECT id, max_attempts FROM dygo_jobs").fetchall())
    assert stored == {registered.id: None, own.id: 7, plain.id: None}
    claimed = {job.id: job.max_attempts for job in claim_now(db_url)}
    assert claimed == {registered.id: 3, own.id: 7, plain.id: 20}
    assert dict(conn.execute("SELECT id, max_attempts FROM dygo_jobs").fetchall()) == claimed  # durably


def test_the_workers_claim_session_claims_in_one_statement_planned_once_that_does_not_wait_for_the_flush(conn, db_url):
    # On the worker's own claim connection the settings are the session's, so each claim is
    # the claim statement alone (no settings statement before it), prepared with a generic plan, committed
    # asynchronously.
    record_commit_modes(conn)
    enqueue_many(conn, [{"kind": "test.noop"}] * 10)

    async def go():
        async with await aconnect(db_url) as c:
            await claim_session(c)
            claimed = [job for _ in range(10) for job in await claim(c, "default", 1, "w1", 30)]
            cursor = await c.execute("SELECT statement, generic_plans FROM pg_prepared_statements")
            statements = await cursor.fetchall()
            return claimed, statements

    claimed, statements = run(go())
    assert len(claimed) == 10
    assert [row[0] for row in conn.execute("SELECT claim FROM test_commit_modes")] == ["off"] * 10
    assert not [s for s, _ in statements if "set_config" in s], statements
    [generic_plans] = [n for s, n in statements if "FOR UPDATE SKIP LOCKED" in s]
    assert generic_plans >= 5  # prepared on its 5th execution, planned once since
