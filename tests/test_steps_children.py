"""Child jobs (`ctx.call`, `ctx.map`; store/children.py): real PostgreSQL, real `dygo worker` processes; each
effect is a `test_runs` row noted with its name (tests/jobs_children.py)."""

from __future__ import annotations

import asyncio
import time
from contextlib import asynccontextmanager

import psycopg
import pytest
from dygo.store import enqueue
from dygo.store.admin import act_on_job
from dygo.store.children import call
from dygo.store.errors import Suspended
from dygo.store.leases import ClaimedJob, Unsuccessful, settle
from dygo.store.sql import children as children_sql
from dygo.store.steps import StepLease, StepRules, Steps

from tests.claiming import claim
from tests.conftest import wait_until
from tests.test_cli_jobs import dygo
from tests.test_retention import KEEP_A_DAY, add_job, run_trim
from tests.test_steps import effects, kill, started_worker, steps_of
from tests.test_worker import job_row, wait_for_state

RULES = StepRules(1 << 20, strict=False)


def children_of(conn: psycopg.Connection, parent_id: int) -> list[dict]:
    cursor = conn.cursor(row_factory=psycopg.rows.dict_row)
    return cursor.execute(
        "SELECT id, kind, state, result, parent_step, parent_index FROM dygo_jobs WHERE parent_id = %s ORDER BY id",
        (parent_id,),
    ).fetchall()


def test_a_call_returns_its_child_s_result_and_the_steps_before_it_do_not_run_again(conn, spawn):
    parent = enqueue(conn, "test.parent_call", {"x": 21})
    started_worker(spawn)
    row = wait_for_state(conn, parent.id, "succeeded", "dead")
    assert (row["state"], row["result"], row["attempt"]) == ("succeeded", [1, 42, 1], 1)
    # Two runs: the one that suspended at the call and the one its child woke; the step before ran once.
    assert effects(conn, parent.id) == {"before": 1, "run": 2, "after": 1}
    [child] = children_of(conn, parent.id)
    assert (child["kind"], child["state"], child["result"], child["parent_step"], child["parent_index"]) == (
        "test.child_double",
        "succeeded",
        42,
        "double#1",
        0,
    )
    assert effects(conn, child["id"]) == {"child": 1}
    op, seq, attempt, result = steps_of(conn, parent.id)["double#1"]
    assert (op, seq, attempt, result) == ("call", 2, 1, 42)
    state, left = conn.execute(
        "SELECT state, children_left FROM dygo_steps WHERE job_id = %s AND key = 'double#1'", (parent.id,)
    ).fetchone()
    assert (state, left) == ("done", 0)


def test_a_map_returns_its_children_s_results_in_input_order(conn, spawn):
    xs = [5, 3, 9, 1, 7, 2]
    parent = enqueue(conn, "test.parent_map", {"xs": xs})
    started_worker(spawn)
    row = wait_for_state(conn, parent.id, "succeeded", "dead")
    assert row["result"] == {"results": [x * 2 for x in xs], "empty": []}
    assert [c["parent_index"] for c in children_of(conn, parent.id)] == list(range(len(xs)))


def test_a_sync_handler_calls_and_maps(conn, spawn):
    parent = enqueue(conn, "test.parent_call_sync", {})
    started_worker(spawn)
    row = wait_for_state(conn, parent.id, "succeeded", "dead")
    assert (row["state"], row["result"]) == ("succeeded", [1, 10, [2, 4]])
    assert effects(conn, parent.id) == {"before": 1}


def test_a_dead_child_raises_child_failed_which_the_parent_catches(conn, spawn):
    parent = enqueue(conn, "test.parent_catches", {})
    started_worker(spawn)
    row = wait_for_state(conn, parent.id, "succeeded", "dead")
    [child] = children_of(conn, parent.id)
    assert row["state"] == "succeeded", row["last_error"]
    assert row["result"]["key"] == "risky#1"
    assert row["result"]["failed"] == [
        {"index": 0, "id": child["id"], "state": "dead", "error": "RuntimeError: child 1 breaks"}
    ]
    assert row["result"]["results"] == [None]
    assert row["result"]["message"] == (
        f"step 'risky#1': 1 of 1 child job did not succeed: [0] job {child['id']} dead: RuntimeError: child 1 breaks"
    )


def test_an_uncaught_child_failure_fails_the_parent_like_any_error(conn, spawn):
    parent = enqueue(conn, "test.parent_uncaught", {})
    started_worker(spawn)
    row = wait_for_state(conn, parent.id, "dead")
    assert row["last_error"].startswith("ChildFailed: step 'risky#1': 1 of 1 child job did not succeed")


def test_a_map_with_failed_children_tells_which_and_keeps_the_results_of_the_others(conn, spawn):
    parent = enqueue(conn, "test.parent_map", {"xs": [1, -2, 3, -4]})
    started_worker(spawn)
    row = wait_for_state(conn, parent.id, "succeeded", "dead")
    children = children_of(conn, parent.id)
    assert row["result"]["results"] == [2, None, 6, None]
    assert row["result"]["failed"] == [
        {"index": 1, "id": children[1]["id"], "state": "dead", "error": "RuntimeError: negative -2"},
        {"index": 3, "id": children[3]["id"], "state": "dead", "error": "RuntimeError: negative -4"},
    ]
    assert row["result"]["message"].startswith("step 'items#1': 2 of 4 child jobs did not succeed: [1] job ")


def test_a_bad_child_is_refused_in_the_parent_before_anything_is_enqueued(conn, spawn):
    parent = enqueue(conn, "test.parent_bad_child", {})
    started_worker(spawn)
    row = wait_for_state(conn, parent.id, "dead")
    assert row["last_error"].startswith("EnqueueError: args[0]: queue 'no-such-queue' is not configured")
    assert children_of(conn, parent.id) == []


def test_a_waiting_parent_holds_no_slot(conn, spawn):
    """One slot: the parent's child runs on the same worker, which would deadlock if the parent kept it."""
    parent = enqueue(conn, "test.parent_map", {"xs": [1, 2, 3]})
    worker = spawn("worker", "--concurrency", "1")
    worker.wait_for_line("started")
    row = wait_for_state(conn, parent.id, "succeeded", "dead")
    assert row["result"] == {"results": [2, 4, 6], "empty": []}
    line = f"job {parent.id} test.parent_map attempt 1/2 waiting in "
    wait_until(lambda: line in worker.stderr(), message="the parent's execution line")
    [logged] = [text for text in worker.stderr().splitlines() if line in text]
    assert logged.endswith(" for 3 child jobs")


def test_a_child_deleted_before_it_ran_makes_the_parent_raise_child_failed(conn, spawn):
    parent = enqueue(conn, "test.parent_catches", {"delay": "1h"})
    started_worker(spawn)
    wait_for_state(conn, parent.id, "waiting")
    [child] = children_of(conn, parent.id)
    assert child["state"] == "pending"
    conn.execute("DELETE FROM dygo_jobs WHERE id = %s", (child["id"],))
    row = wait_for_state(conn, parent.id, "succeeded", "dead")
    assert row["result"]["failed"] == [{"index": 0, "id": None, "state": "deleted", "error": None}]
    assert row["result"]["message"] == "step 'risky#1': 1 of 1 child job did not succeed: [0] a deleted job deleted"


def test_a_child_cancelled_by_an_operator_makes_the_parent_raise_child_failed(conn, spawn):
    parent = enqueue(conn, "test.parent_catches", {"delay": "1h"})
    started_worker(spawn)
    wait_for_state(conn, parent.id, "waiting")
    [child] = children_of(conn, parent.id)
    act_on_job(conn, "cancel", child["id"])
    row = wait_for_state(conn, parent.id, "succeeded", "dead")
    assert row["result"]["failed"] == [{"index": 0, "id": child["id"], "state": "cancelled", "error": None}]


def test_a_child_that_ends_before_its_parent_s_wait_commits_still_wakes_the_parent(conn, db_url, spawn):
    """The children are inserted by the parent's settle: a barrier holds that settle's transaction after the
    insert, and meanwhile no other worker sees (let alone claims) the child; once it commits, the child runs
    and wakes the parent."""
    conn.execute(
        """CREATE FUNCTION test_barrier() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            IF EXISTS (SELECT FROM new_rows WHERE parent_id IS NOT NULL) THEN
                PERFORM pg_advisory_xact_lock(4242);
            END IF;
            RETURN NULL;
        END $$"""
    )
    conn.execute(
        "CREATE TRIGGER test_barrier AFTER INSERT ON dygo_jobs REFERENCING NEW TABLE AS new_rows "
        "FOR EACH STATEMENT EXECUTE FUNCTION test_barrier()"
    )
    with psycopg.connect(db_url, autocommit=True) as barrier:
        barrier.execute("SELECT pg_advisory_lock(4242)")
        parent = enqueue(conn, "test.parent_call", {"x": 8})
        started_worker(spawn)
        started_worker(spawn)  # a second worker, idle and free to claim a child
        wait_until(
            lambda: conn.execute(
                "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND objid = 4242 AND NOT granted "
                "AND database = (SELECT oid FROM pg_database WHERE datname = current_database())"
            ).fetchone()[0],
            message="the parent's settle to reach the barrier after inserting its child",
        )
        time.sleep(1.0)
        assert children_of(conn, parent.id) == []  # not committed: no worker can claim it
        assert job_row(conn, parent.id)["state"] == "active"
        barrier.execute("SELECT pg_advisory_unlock(4242)")
    row = wait_for_state(conn, parent.id, "succeeded", "dead")
    assert row["result"] == [1, 16, 1]
    [child] = children_of(conn, parent.id)
    assert effects(conn, child["id"]) == {"child": 1}


def test_a_worker_killed_before_its_parent_s_settle_commits_enqueues_no_child(conn, db_url, spawn):
    """The first run's settle is held at its first statement (the test locks the parent's row), its worker is
    SIGKILLed and its connection ends: nothing of the settle commits. The lease expires, the next run suspends
    again, and only its settle enqueues the child: one child, run once."""
    parent = enqueue(conn, "test.parent_holds_first_run", {})
    first = started_worker(spawn)
    wait_until(lambda: effects(conn, parent.id)["run"] == 1, message="the first run to reach its call")
    with psycopg.connect(db_url) as holder:
        holder.execute("SELECT 1 FROM dygo_jobs WHERE id = %s FOR UPDATE", (parent.id,))
        waiting = (
            "SELECT l.pid FROM pg_locks l JOIN pg_stat_activity a USING (pid) "
            "WHERE NOT l.granted AND l.pid <> pg_backend_pid() AND a.datname = current_database()"
        )
        wait_until(lambda: conn.execute(waiting).fetchall(), message="the first run's settle to wait for the row")
        kill(first)
        for (pid,) in conn.execute(waiting).fetchall():
            conn.execute("SELECT pg_terminate_backend(%s)", (pid,))
        holder.rollback()
    assert children_of(conn, parent.id) == []
    assert job_row(conn, parent.id)["state"] == "active"

    started_worker(spawn)
    row = wait_for_state(conn, parent.id, "succeeded", "dead", timeout=30)  # after the 2 s lease expires
    assert (row["state"], row["result"], row["reap_count"]) == ("succeeded", 8, 1)
    [child] = children_of(conn, parent.id)
    assert effects(conn, child["id"]) == {"child": 1}
    assert effects(conn, parent.id)["run"] == 3  # killed, suspended, woken


def test_a_map_of_a_thousand_children_completes_and_wakes_its_parent_once(conn, spawn):
    xs = list(range(1000))
    parent = enqueue(conn, "test.parent_map", {"xs": xs})
    started_worker(spawn)
    row = wait_for_state(conn, parent.id, "succeeded", "dead", timeout=60)
    assert row["result"]["results"] == [x * 2 for x in xs]
    assert effects(conn, parent.id) == {"run": 2}  # suspended once, woken once
    assert len(children_of(conn, parent.id)) == 1000


def test_a_cancelled_waiting_parent_leaves_its_children_running_and_a_retry_resumes_with_their_results(conn, spawn):
    parent = enqueue(conn, "test.parent_catches", {"delay": "1h"})
    started_worker(spawn)
    wait_for_state(conn, parent.id, "waiting")
    act_on_job(conn, "cancel", parent.id)
    [child] = children_of(conn, parent.id)
    assert child["state"] == "pending"
    # The parent is retried while its child still waits: the replay suspends again and enqueues nothing.
    act_on_job(conn, "retry", parent.id)
    wait_until(lambda: effects(conn, parent.id) == {} and job_row(conn, parent.id)["state"] == "waiting")
    assert len(children_of(conn, parent.id)) == 1
    conn.execute("UPDATE dygo_jobs SET run_at = now() WHERE id = %s", (child["id"],))
    row = wait_for_state(conn, parent.id, "succeeded", "dead")
    assert row["result"]["failed"][0]["state"] == "dead"


def test_a_parent_whose_step_ended_while_it_ran_again_is_pending_after_its_settle(conn, db_url):
    """A parent that replays a waiting step suspends again; if its children end between its read and its
    settle, the settle finds the step ended (after locking its row) and puts the parent back to pending."""
    parent = enqueue(conn, "test.parent_catches", {"delay": "1h"})

    async def go() -> None:
        async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as c:

            @asynccontextmanager
            async def connect():
                yield c

            async def run_once() -> tuple[ClaimedJob, Suspended]:
                [job] = await claim(c, "default", 1, "w1", 30)
                steps = Steps(StepLease(job.id, job.lease_token, job.attempt), job.kind, RULES, connect)
                with pytest.raises(Suspended) as suspended:
                    await call(steps, "risky", "test.child_dies", {"x": 1}, {"delay": "1h"})
                return job, suspended.value

            job, suspended = await run_once()
            assert suspended.wait.record == children_sql.RECORD_CHILDREN
            await settle(c, [Unsuccessful(job, "waiting", refund_attempt=True, wait=suspended.wait)])
            await c.execute("UPDATE dygo_jobs SET state = 'pending' WHERE id = %s", (job.id,))  # an operator's
            job, suspended = await run_once()  # reads the step waiting
            assert suspended.wait.record == children_sql.WAIT_AGAIN
            await c.execute("DELETE FROM dygo_jobs WHERE parent_id = %s", (job.id,))  # its child ends meanwhile
            await settle(c, [Unsuccessful(job, "waiting", refund_attempt=True, wait=suspended.wait)])

    asyncio.run(go())
    assert job_row(conn, parent.id)["state"] == "pending"
    assert children_of(conn, parent.id) == []
    assert conn.execute("SELECT op, state FROM dygo_steps WHERE job_id = %s", (parent.id,)).fetchone() == (
        "call",
        "failed",
    )


def test_retention_keeps_the_succeeded_children_of_a_step_still_waiting(conn, db_url):
    parent = add_job(conn, "waiting", 3)
    conn.execute(
        "INSERT INTO dygo_steps (job_id, key, op, seq, attempt, duration, state, children, children_left) "
        "VALUES (%s, 'many#1', 'map', 1, 1, 0, 'waiting', 2, 1)",
        (parent,),
    )
    conn.execute(
        "INSERT INTO dygo_jobs (kind, queue, state, enqueued_at, finished_at, parent_id, parent_step, parent_index) "
        "VALUES ('test.child_double', 'default', 'succeeded', now() - interval '3 days', now() - interval '3 days', "
        "%s, 'many#1', 0)",
        (parent,),
    )
    assert run_trim(db_url, KEEP_A_DAY).succeeded == 0
    conn.execute("UPDATE dygo_steps SET state = 'done' WHERE job_id = %s", (parent,))
    assert run_trim(db_url, KEEP_A_DAY).succeeded == 1


def test_the_api_lists_a_parent_s_children_and_shows_a_child_s_parent_and_the_wait(api, conn, spawn):
    parent = enqueue(conn, "test.parent_map", {"xs": [1, 2, 3]})
    other = enqueue(conn, "test.parent_map", {"xs": [4]})
    assert spawn("worker", "--once").wait() == 0
    assert job_row(conn, parent.id)["state"] == "waiting"
    listed = api.reader.get("/api/v1/jobs", params={"parent_id": parent.id, "order": "oldest"})
    assert listed.status_code == 200, listed.text
    children = listed.json()["jobs"]
    assert [c["kind"] for c in children] == ["test.child_maybe"] * 3
    assert [c["args"] for c in children] == [{"x": 1}, {"x": 2}, {"x": 3}]
    assert api.reader.get("/api/v1/jobs", params={"parent_id": other.id}).json()["jobs"][0]["args"] == {"x": 4}

    child = api.reader.get(f"/api/v1/jobs/{children[2]['id']}").json()
    assert (child["parent_id"], child["parent_step"], child["parent_index"]) == (parent.id, "items#1", 2)
    assert api.reader.get(f"/api/v1/jobs/{parent.id}").json()["parent_id"] is None
    [step] = api.reader.get(f"/api/v1/jobs/{parent.id}/steps").json()["steps"]
    assert (step["key"], step["op"], step["state"], step["children"], step["children_left"]) == (
        "items#1",
        "map",
        "waiting",
        3,
        3,
    )
    assert api.reader.get("/api/v1/jobs", params={"parent_id": 0}).status_code == 422


def test_dygo_jobs_list_shows_a_parent_s_children(conn, db_url, spawn):
    parent = enqueue(conn, "test.parent_map", {"xs": [7, 8]})
    assert spawn("worker", "--once").wait() == 0
    listed = dygo(db_url, "jobs", "list", "--parent", str(parent.id), "--oldest")
    assert listed.returncode == 0, listed.stderr
    ids = [int(line.split()[0]) for line in listed.stdout.splitlines()[1:]]
    assert ids == [c["id"] for c in children_of(conn, parent.id)] and len(ids) == 2


def test_a_child_can_call_a_child_of_its_own(conn, spawn):
    parent = enqueue(conn, "test.parent_nested", {"x": 3})
    started_worker(spawn)
    row = wait_for_state(conn, parent.id, "succeeded", "dead")
    [middle] = children_of(conn, parent.id)
    [inner] = children_of(conn, middle["id"])
    assert row["result"] == [middle["id"], 6]
    assert (middle["state"], inner["state"], inner["result"]) == ("succeeded", "succeeded", 6)
    assert effects(conn, parent.id) == {"run": 2}


def test_children_settled_by_several_workers_at_once_wake_their_parent_once(conn, spawn):
    xs = list(range(300))
    parents = [enqueue(conn, "test.parent_map", {"xs": xs}) for _ in range(3)]
    workers = [started_worker(spawn) for _ in range(3)]
    for parent in parents:
        row = wait_for_state(conn, parent.id, "succeeded", "dead", timeout=60)
        assert row["result"]["results"] == [x * 2 for x in xs]
        assert effects(conn, parent.id) == {"run": 2}
    assert not any("deadlock" in worker.stderr() for worker in workers)


def test_a_child_retried_while_its_parent_waits_counts_again_and_after_it_was_told_changes_nothing(conn, spawn):
    parent = enqueue(conn, "test.parent_map", {"xs": [-1, -2], "options": {"delay": "1h"}})
    started_worker(spawn)
    wait_for_state(conn, parent.id, "waiting")
    first, second = children_of(conn, parent.id)

    def left() -> int:
        return conn.execute("SELECT children_left FROM dygo_steps WHERE job_id = %s", (parent.id,)).fetchone()[0]

    act_on_job(conn, "run-now", first["id"])
    wait_for_state(conn, first["id"], "dead")
    assert left() == 1
    act_on_job(conn, "retry", first["id"])  # out of an ended state: counted back
    assert left() == 2
    wait_for_state(conn, first["id"], "dead")
    assert left() == 1 and job_row(conn, parent.id)["state"] == "waiting"
    act_on_job(conn, "run-now", second["id"])
    row = wait_for_state(conn, parent.id, "succeeded", "dead")
    assert [f["index"] for f in row["result"]["failed"]] == [0, 1]

    act_on_job(conn, "retry", second["id"])  # the parent was told: nothing changes for it
    wait_for_state(conn, second["id"], "dead")
    assert conn.execute("SELECT state, children_left FROM dygo_steps WHERE job_id = %s", (parent.id,)).fetchone() == (
        "failed",
        0,
    )
    assert effects(conn, parent.id) == {"run": 2}


def test_children_of_a_killed_worker_are_recovered_and_their_parent_wakes_once_with_every_result(conn, spawn):
    parent = enqueue(conn, "test.parent_map_slow", {"n": 12, "seconds": 1.0})
    doomed = started_worker(spawn)
    wait_until(
        lambda: (
            conn.execute(
                "SELECT count(*) FROM dygo_jobs WHERE parent_id = %s AND state = 'active'", (parent.id,)
            ).fetchone()[0]
            >= 4
        ),
        message="children running on the first worker",
    )
    kill(doomed)
    started_worker(spawn)
    row = wait_for_state(conn, parent.id, "succeeded", "dead", timeout=60)
    assert row["result"] == list(range(12))
    assert effects(conn, parent.id) == {"run": 2}
    children = children_of(conn, parent.id)
    assert len(children) == 12 and {c["state"] for c in children} == {"succeeded"}
    reaped = conn.execute("SELECT count(*) FROM dygo_jobs WHERE parent_id = %s AND reap_count > 0", (parent.id,))
    assert reaped.fetchone()[0] >= 1
