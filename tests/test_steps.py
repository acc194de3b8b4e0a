"""Durable steps (store/steps.py): real PostgreSQL, real `dygo worker` processes; every step's side effect is a
`test_runs` row noted with its name (tests/jobs.py), so a test counts how often each one ran."""

from __future__ import annotations

import asyncio
import shutil
import signal
from collections import Counter
from contextlib import asynccontextmanager

import psycopg
import pytest
from dygo.store import enqueue
from dygo.store.admin import act_on_job
from dygo.store.errors import LeaseLost, StepError, StepOrderError
from dygo.store.leases import recover_expired
from dygo.store.steps import (
    StepLease,
    StepReader,
    StepRules,
    Steps,
    StepWrite,
    load_steps,
    record_step,
    record_step_tx,
)

from tests.claiming import claim
from tests.conftest import TEST_CONFIG, dygo_env, wait_until
from tests.test_worker import wait_for_state

ORDER_WARNING = "steps replayed out of the recorded order"


def effects(conn: psycopg.Connection, job_id: int) -> Counter[str]:
    return Counter(note for (note,) in conn.execute("SELECT note FROM test_runs WHERE job_id = %s", (job_id,)))


def steps_of(conn: psycopg.Connection, job_id: int) -> dict[str, tuple]:
    rows = conn.execute("SELECT key, op, seq, attempt, result FROM dygo_steps WHERE job_id = %s", (job_id,))
    return {key: (op, seq, attempt, result) for key, op, seq, attempt, result in rows}


def started_worker(spawn, env: dict[str, str] | None = None):
    worker = spawn("worker", env=env)
    worker.wait_for_line("started")
    return worker


def kill(worker) -> None:
    worker.signal(signal.SIGKILL)
    worker.wait()


def test_a_job_killed_after_its_second_step_resumes_at_the_third(conn, spawn):
    job = enqueue(conn, "test.steps_three", {})
    first = started_worker(spawn)
    wait_until(lambda: effects(conn, job.id)["pause"] == 1, message="the job to pause after step two")
    assert set(steps_of(conn, job.id)) == {"one#1", "two#1"}
    kill(first)

    started_worker(spawn)
    row = wait_for_state(conn, job.id, "succeeded", timeout=20)  # after the 2 s lease expires
    assert row["reap_count"] == 1 and row["result"] == [1, 1, 1]
    assert effects(conn, job.id) == {"one": 1, "two": 1, "pause": 2, "three": 1}
    assert steps_of(conn, job.id)["three#1"][:3] == ("step", 3, 1)


def test_a_step_killed_between_its_effect_and_its_record_runs_again_once(conn, spawn):
    job = enqueue(conn, "test.step_hangs_before_record", {})
    first = started_worker(spawn)
    wait_until(lambda: effects(conn, job.id)["charge"] == 1)
    kill(first)

    started_worker(spawn)
    row = wait_for_state(conn, job.id, "succeeded", timeout=20)
    assert row["result"] == 2  # the second run's, recorded
    assert effects(conn, job.id) == {"charge": 2}  # at least once: twice here, never more
    assert steps_of(conn, job.id)["charge#1"][3] == 2


def test_a_step_tx_killed_before_its_commit_makes_its_effect_once(conn, spawn):
    job = enqueue(conn, "test.step_tx_hangs_before_commit", {})
    first = started_worker(spawn)
    wait_until(lambda: effects(conn, job.id)["tried"] == 1)
    kill(first)

    started_worker(spawn)
    row = wait_for_state(conn, job.id, "succeeded", timeout=20)
    assert row["result"] == 2
    # The function ran twice; its effect, written through the step's transaction, committed once.
    assert effects(conn, job.id) == {"tried": 2, "reserve": 1}
    assert steps_of(conn, job.id)["reserve#1"] == ("step_tx", 1, 1, 2)


def test_gathered_steps_keep_their_call_order_keys_and_a_retry_runs_none_again(conn, spawn):
    job = enqueue(conn, "test.steps_gather", {})
    worker = started_worker(spawn)
    row = wait_for_state(conn, job.id, "succeeded", "dead")
    assert (row["state"], row["attempt"]) == ("succeeded", 2)
    assert row["result"] == ["x first", "y", "x second"]
    assert effects(conn, job.id) == {"x first": 1, "y": 1, "x second": 1}
    recorded = steps_of(conn, job.id)
    # Keys and positions follow the calls, not the order the steps finished in.
    assert {key: (seq, result) for key, (_, seq, _, result) in recorded.items()} == {
        "x#1": (1, "x first"),
        "y#1": (2, "y"),
        "x#2": (3, "x second"),
    }
    kill(worker)
    assert ORDER_WARNING not in worker.stderr()


def test_a_replay_out_of_the_recorded_order_warns_naming_the_step(conn, spawn):
    job = enqueue(conn, "test.steps_reorder", {})
    worker = started_worker(spawn)
    row = wait_for_state(conn, job.id, "succeeded", "dead")
    assert row["state"] == "succeeded" and row["result"] == [1, 1]
    assert effects(conn, job.id) == {"a": 1, "b": 1}
    kill(worker)
    assert "step 'b#1': steps replayed out of the recorded order (it is call 1 of this run" in worker.stderr()


def test_strict_steps_makes_a_replay_out_of_order_fail(conn, spawn, db_url, tmp_path):
    config = tmp_path / "config"
    shutil.copytree(TEST_CONFIG, config)
    with (config / "dygo.yml").open("a") as file:
        file.write("strict_steps: true\n")
    job = enqueue(conn, "test.steps_reorder", {})
    started_worker(spawn, env=dygo_env(db_url, DYGO_CONFIG_DIR=str(config)))
    row = wait_for_state(conn, job.id, "dead")
    assert row["last_error"].startswith("StepOrderError: step 'b#1': steps replayed out of the recorded order")
    assert effects(conn, job.id) == {"a": 1, "b": 1}


def test_a_step_result_over_the_limit_fails_naming_the_step(conn, spawn):
    job = enqueue(conn, "test.step_too_big", {})
    started_worker(spawn)
    row = wait_for_state(conn, job.id, "dead")
    assert row["last_error"].startswith(
        "StepError: step 'big#1': result of 1048578 bytes of JSON is larger than max_step_result_bytes (1048576)"
    )
    assert set(steps_of(conn, job.id)) == {"small#1"}  # the step that raised recorded nothing


def test_a_sync_handler_s_steps_run_once_across_attempts(conn, spawn):
    job = enqueue(conn, "test.steps_sync", {})
    started_worker(spawn)
    row = wait_for_state(conn, job.id, "succeeded", "dead")
    assert (row["state"], row["attempt"], row["result"]) == ("succeeded", 2, [1, 1, "reserved"])
    assert effects(conn, job.id) == {"a#1": 1, "a#2": 1, "reserve": 1}
    assert {key: op for key, (op, *_) in steps_of(conn, job.id).items()} == {
        "a#1": "step",
        "a#2": "step",
        "reserve#1": "step_tx",
    }


def test_an_operator_s_retry_of_a_dead_job_keeps_its_steps(conn, spawn):
    job = enqueue(conn, "test.steps_then_fail", {})
    started_worker(spawn)
    wait_for_state(conn, job.id, "dead")
    act_on_job(conn, "retry", job.id)
    row = wait_for_state(conn, job.id, "succeeded")
    assert row["result"] == 1
    assert effects(conn, job.id) == {"charge": 1, "check": 2}


# --- the store's fence, without a worker ------------------------------------------------------------


async def _aconnect(url: str) -> psycopg.AsyncConnection:
    return await psycopg.AsyncConnection.connect(url, autocommit=True)


def test_the_old_run_of_a_reaped_job_can_record_no_step(conn, db_url):
    job_id = enqueue(conn, "test.noop", {}).id
    ran: list[str] = []

    async def effect(c: psycopg.AsyncConnection) -> str:
        ran.append("tx")
        await c.execute("INSERT INTO test_runs (job_id, attempt, pid, note) VALUES (%s, 1, 0, 'tx')", (job_id,))
        return '"done"'

    async def go():
        async with await _aconnect(db_url) as c:
            [stale] = await claim(c, "default", 1, "w1", 30)
            old = StepLease(stale.id, stale.lease_token, stale.attempt)
            assert await record_step(c, old, StepWrite("before#1", "step", 1, 0.0, '"ok"')) == '"ok"'
            await c.execute("UPDATE dygo_jobs SET lease_deadline = now() - interval '1s' WHERE id = %s", (job_id,))
            assert (await recover_expired(c, max_reaps=3)).jobs == [(job_id, "pending")]
            with pytest.raises(LeaseLost, match=f"job {job_id}: step 'after#1' not recorded"):
                await record_step(c, old, StepWrite("after#1", "step", 2, 0.0, '"late"'))
            [fresh] = await claim(c, "default", 1, "w2", 30)
            with pytest.raises(LeaseLost):  # still fenced out, now that another run holds the lease
                await record_step_tx(c, old, "reserve#1", 2, effect)
            assert ran == []
            new = StepLease(fresh.id, fresh.lease_token, fresh.attempt)
            assert await record_step_tx(c, new, "reserve#1", 2, effect) == '"done"'
            return await load_steps(c, job_id)

    stored = asyncio.run(go())
    assert {key: step.result for key, step in stored.items()} == {"before#1": '"ok"', "reserve#1": '"done"'}
    assert effects(conn, job_id) == {"tx": 1}


def test_a_step_tx_whose_key_is_recorded_already_rolls_its_effect_back(conn, db_url):
    job_id = enqueue(conn, "test.noop", {}).id

    async def effect(c: psycopg.AsyncConnection) -> str:
        await c.execute("INSERT INTO test_runs (job_id, attempt, pid, note) VALUES (%s, 1, 0, 'tx')", (job_id,))
        return '"second"'

    async def go():
        async with await _aconnect(db_url) as c:
            [job] = await claim(c, "default", 1, "w1", 30)
            lease = StepLease(job.id, job.lease_token, job.attempt)
            await record_step(c, lease, StepWrite("reserve#1", "step_tx", 1, 0.0, '"first"'))
            return await record_step_tx(c, lease, "reserve#1", 1, effect)

    assert asyncio.run(go()) == '"first"'
    assert effects(conn, job_id) == {}


def test_steps_in_strict_mode_raise_where_they_would_warn(conn, db_url):
    """The journal alone, in this process: a recorded job whose replay calls its steps in another order."""
    job_id = enqueue(conn, "test.noop", {}).id

    async def go(strict: bool) -> list:
        async with await _aconnect(db_url) as c:
            [job] = await claim(c, "default", 1, "w1", 30)
            lease = StepLease(job.id, job.lease_token, job.attempt)

            @asynccontextmanager
            async def connect():
                yield c

            first = Steps(lease, job.kind, StepRules(1024, strict), connect)
            assert [await first.step(n, lambda n=n: n, (), {}) for n in ("a", "b")] == ["a", "b"]
            replay = Steps(lease, job.kind, StepRules(1024, strict), connect)
            out = [await replay.step("b", lambda: "again", (), {})]
            with pytest.raises(StepError, match="'x#1': result of 1026 bytes of JSON is larger than"):
                await replay.step("x", lambda: "y" * 1024, (), {})
            await c.execute("UPDATE dygo_jobs SET state = 'pending', lease_token = NULL WHERE id = %s", (job_id,))
            await c.execute("DELETE FROM dygo_steps")
            return out

    assert asyncio.run(go(False)) == ["b"]
    with pytest.raises(StepOrderError, match="step 'b#1': steps replayed out of the recorded order"):
        asyncio.run(go(True))


def test_runs_whose_first_steps_come_together_read_their_steps_in_one_query(conn, db_url):
    """The worker's StepReader: 50 jobs resuming at once (a shared wake time) cost one read, not 50."""
    ids = [enqueue(conn, "test.noop", {}).id for _ in range(50)]
    conn.execute(
        "INSERT INTO dygo_steps (job_id, key, op, seq, attempt, duration, result) "
        "SELECT id, 'a#1', 'step', 1, 1, 0, to_jsonb(id) FROM unnest(%s::bigint[]) AS id",
        (ids[:40],),
    )
    reads = []

    async def go():
        async with await _aconnect(db_url) as c:

            @asynccontextmanager
            async def connect():
                reads.append(1)
                yield c

            reader = StepReader(connect)
            return await asyncio.gather(*(reader.load(job_id) for job_id in ids))

    loaded = asyncio.run(go())
    assert len(reads) == 1
    assert [{key: step.result for key, step in stored.items()} for stored, _ in loaded] == [
        {"a#1": str(job_id)} for job_id in ids[:40]
    ] + [{}] * 10
