"""Workflows under concurrency and faults: the upstream jobs of one node settled at the same instant from
many connections, a late settle from a worker that lost its lease, operators acting on workflows while
they settle, retention deleting what a running workflow finished, and a settle a deadlock rolled back.
Each ends with the books: the counters agree with the rows (store/workflows.py check_invariants)."""

from __future__ import annotations

import asyncio
import json
import threading
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass

import psycopg
import pytest
from dygo.store import admin, leases, workflows
from dygo.store.errors import CodedError
from dygo.store.leases import ClaimedJob, Outcome, Succeeded, Unsuccessful
from dygo.store.workflows import Workflow, check_invariants, enqueue_workflow

from chaos.workflow_soak import soak
from tests.claiming import claim
from tests.conftest import dygo_env, wait_until
from tests.test_retention import copy_test_config

pytestmark = pytest.mark.alone

# Every release of a job (waiting -> pending), one row each: a job released twice would show twice.
RELEASES = """
CREATE TABLE test_releases (job_id bigint NOT NULL);
CREATE FUNCTION test_released() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO test_releases (job_id) VALUES (NEW.id);
    RETURN NULL;
END $$;
CREATE TRIGGER test_released AFTER UPDATE ON dygo_jobs FOR EACH ROW
    WHEN (OLD.state = 'waiting' AND NEW.state = 'pending') EXECUTE FUNCTION test_released();
"""


# The races: each upstream settle waits 2 ms before it updates its job, so the settles sent together are all
# inside their transactions at once, and records when its statement began and when its job's row was written.
RACES = """
CREATE TABLE test_settles (workflow_id bigint NOT NULL, began timestamptz NOT NULL, wrote timestamptz NOT NULL);
CREATE FUNCTION test_settle_slowly() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_sleep(0.002);
    INSERT INTO test_settles SELECT workflow_id, statement_timestamp(), clock_timestamp()
    FROM dygo_nodes WHERE id = NEW.node_id;
    RETURN NEW;
END $$;
CREATE TRIGGER test_settle_slowly BEFORE UPDATE ON dygo_jobs FOR EACH ROW
    WHEN (OLD.state = 'active' AND NEW.state = 'succeeded') EXECUTE FUNCTION test_settle_slowly();
"""
# Races in which two settles were in flight together: one began before the other had written its row.
OVERLAPPED = """
SELECT count(DISTINCT a.workflow_id) FROM test_settles a JOIN test_settles b
    ON a.workflow_id = b.workflow_id AND a.ctid <> b.ctid AND a.began <= b.began AND b.began < a.wrote"""


def node_rows(conn: psycopg.Connection, workflow_id: int) -> list[tuple]:
    return conn.execute("SELECT * FROM dygo_nodes WHERE workflow_id = %s ORDER BY id", (workflow_id,)).fetchall()


def releases(conn: psycopg.Connection, job_id: int) -> int:
    return conn.execute("SELECT count(*) FROM test_releases WHERE job_id = %s", (job_id,)).fetchone()[0]


async def settle_in_step(conn: psycopg.AsyncConnection, jobs: list[ClaimedJob], barrier: asyncio.Barrier) -> None:
    """Settle `jobs` one by one, each when every connection of the barrier is ready to settle its own."""
    for job in jobs:
        await barrier.wait()
        assert await leases.settle(conn, [Succeeded(job, "null")]) == {job.id}


@pytest.mark.parametrize(("upstream", "workflows_per_round", "rounds"), [(2, 50, 16), (64, 5, 4)])
def test_upstream_jobs_settled_at_the_same_instant_release_their_downstream_exactly_once(
    conn, db_url, upstream, workflows_per_round, rounds
):
    """Workflows of `upstream` single-job nodes before one node. Their upstream jobs are claimed, then each
    of `upstream` connections settles one of them, all sent together (a barrier per workflow) and in flight
    together (RACES): of the transactions that settle at once, exactly one sees the last edge settle and
    releases the downstream job, once; none leaves it waiting. 800 such races with two upstream jobs, 20
    with 64 (1,280 settles): at least half of them overlap, and a settle that misread the count would
    strand or double-release a downstream job in many of those."""
    conn.execute(RELEASES)
    conn.execute(RACES)
    handles = []
    # Commits that do not wait for the disk: the races are the same, and thousands of them fit in seconds.
    conn.execute("SET synchronous_commit = off")

    async def race() -> None:
        connections = [
            await psycopg.AsyncConnection.connect(db_url, autocommit=True, options="-c synchronous_commit=off")
            for _ in range(upstream)
        ]
        try:
            for _ in range(rounds):
                built = []
                with conn.transaction():
                    for _ in range(workflows_per_round):
                        wf = Workflow("fan-in")
                        names = [wf.add(f"u{i}", "test.noop", {"i": i}) for i in range(upstream)]
                        wf.add("down", "test.noop", {"down": True}, after=names, queue="other")  # not claimed here
                        built.append(enqueue_workflow(conn, wf))
                handles.extend(built)
                claimed = await claim(connections[0], "default", upstream * workflows_per_round, "w1", 60)
                by_node = {job.node_id: job for job in claimed}
                barrier = asyncio.Barrier(upstream)
                await asyncio.gather(
                    *(
                        settle_in_step(connection, [by_node[handle.nodes[f"u{i}"]] for handle in built], barrier)
                        for i, connection in enumerate(connections)
                    )
                )
        finally:
            for connection in connections:
                await connection.close()

    asyncio.run(race())
    assert len(handles) == workflows_per_round * rounds
    overlapped = conn.execute(OVERLAPPED).fetchone()[0]
    print(f"{overlapped} of {len(handles)} races had {upstream} settles in flight together")
    assert overlapped >= len(handles) // 2
    down_jobs = [handle.jobs["down"] for handle in handles]
    states = dict(conn.execute("SELECT id, state FROM dygo_jobs WHERE id = ANY(%s)", (down_jobs,)).fetchall())
    assert set(states.values()) == {"pending"}, "a downstream job was left waiting"
    released = dict(conn.execute("SELECT job_id, count(*) FROM test_releases GROUP BY job_id").fetchall())
    assert released == dict.fromkeys(down_jobs, 1)
    down_nodes = conn.execute(
        "SELECT DISTINCT state, deps, deps_left FROM dygo_nodes WHERE id = ANY(%s)",
        ([handle.nodes["down"] for handle in handles],),
    ).fetchall()
    assert down_nodes == [("running", upstream, 0)]
    assert check_invariants(conn) == []


def test_a_late_settle_from_a_worker_that_lost_its_lease_changes_no_counter(conn, db_url):
    """The lease of an upstream job runs out, lease recovery puts it back and another worker claims it. The
    first worker's settle, sent late with its old lease, moves nothing: no counter, no release; the
    second's releases the downstream node once; the first's again, after that, still nothing."""
    conn.execute(RELEASES)
    wf = Workflow("zombie")
    wf.add("a", "test.noop", {"node": "a"})
    wf.map("g", "test.noop", [{"node": "g"}] * 2)
    wf.add("b", "test.noop", {"node": "b"}, after=["a", "g"])
    handle = enqueue_workflow(conn, wf)

    async def go() -> tuple[list[tuple], list[tuple], list[tuple]]:
        async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as c:
            old = await claim(c, "default", 10, "zombie", 30)
            assert len(old) == 3
            await c.execute("UPDATE dygo_jobs SET lease_deadline = now() - interval '1 second' WHERE state = 'active'")
            recovered = await leases.recover_expired(c, max_reaps=5)
            assert sorted(state for _, state in recovered.jobs) == ["pending"] * 3
            new = await claim(c, "default", 10, "alive", 30)
            assert sorted(job.id for job in new) == sorted(job.id for job in old)
            before = node_rows(conn, handle.id)
            late = [Succeeded(old[0], '"late"'), Unsuccessful(old[1], "dead", error="late"), Succeeded(old[2], "1")]
            assert await leases.settle(c, late) == set()
            after_late = node_rows(conn, handle.id)
            assert await leases.settle(c, [Succeeded(job, json.dumps(job.id)) for job in new]) == {j.id for j in new}
            settled = node_rows(conn, handle.id)
            assert await leases.settle(c, late) == set()
            return before, after_late, settled

    before, after_late, settled = asyncio.run(go())
    assert after_late == before
    assert node_rows(conn, handle.id) == settled
    shown = {node["name"]: node for node in workflows.get_workflow(conn, handle.id)["nodes"]}
    assert (shown["a"]["state"], shown["g"]["succeeded"], shown["g"]["dead"]) == ("succeeded", 2, 0)
    assert shown["a"]["result"] == handle.jobs["a"]  # the result of the run that held the lease
    assert (shown["b"]["state"], shown["b"]["deps_left"]) == ("running", 0)
    assert releases(conn, handle.jobs["b"]) == 1
    assert check_invariants(conn) == []


def cancel_while_a_group_ends(conn: psycopg.Connection) -> Race:
    """A settle ends group g (and counts jobs of group h, still running) while an operator cancels the
    workflow: the cancel locks h to count its pending jobs cancelled, the settle needs the workflow's row."""
    wf = Workflow("cancelled while it ends a group")
    wf.map("g", "test.noop", [{}] * 3)
    wf.map("h", "test.noop", [{}] * 6, priority=-1)  # claimed after g's
    wf.add("after", "test.noop", {}, after=["g", "h"])
    handle = enqueue_workflow(conn, wf)
    return Race(
        claim=5,
        settles=lambda jobs: [[Succeeded(job, "null") for job in jobs]],
        act=lambda operator: workflows.cancel_workflow(operator, handle.id),
    )


def settles_of_both_kinds_across_two_workflows(conn: psycopg.Connection) -> Race:
    """One settle succeeds jobs of workflow Y and fails jobs of workflow X (two statements), another succeeds
    jobs of both: each locks both workflows, and must in the same order."""
    for name in ("X", "Y"):
        wf = Workflow(name)
        wf.map("one", "test.noop", [{"w": name, "n": 1}] * 2)
        wf.map("two", "test.noop", [{"w": name, "n": 2}] * 2)
        enqueue_workflow(conn, wf)

    def settles(jobs: list[ClaimedJob]) -> list[list[Outcome]]:
        by = defaultdict(list)
        for job in jobs:
            by[job.args["w"], job.args["n"]].append(job)
        mixed = [Succeeded(job, "null") for job in by["Y", 1]] + [Unsuccessful(j, "dead") for j in by["X", 1]]
        return [mixed, [Succeeded(job, "null") for job in by["X", 2] + by["Y", 2]]]

    return Race(claim=8, settles=settles, act=None)


def operator_on_a_node_being_released(verb: str) -> Callable[[psycopg.Connection], Race]:
    """A settle ends node u and so releases node d (its jobs from waiting to pending) while an operator
    cancels one of d's jobs, or skips d: the operator's statement holds d's job rows."""

    def build(conn: psycopg.Connection) -> Race:
        wf = Workflow(f"{verb} while released")
        wf.add("u", "test.noop", {})
        wf.map("d", "test.noop", [{}] * 3, after="u")
        handle = enqueue_workflow(conn, wf)
        first_of_d = conn.execute("SELECT min(id) FROM dygo_jobs WHERE node_id = %s", (handle.nodes["d"],))
        job_id = first_of_d.fetchone()[0]

        def act(operator: psycopg.Connection) -> object:
            if verb == "cancel job":
                return admin.act_on_job(operator, "cancel", job_id)
            return workflows.act_on_node(operator, handle.id, "d", "skip")

        return Race(claim=1, settles=lambda jobs: [[Succeeded(job, "null") for job in jobs]], act=act)

    return build


@dataclass
class Race:
    claim: int  # jobs to claim before the race
    settles: Callable[[list[ClaimedJob]], list[list[Outcome]]]  # one batch per connection, all sent at once
    act: Callable[[psycopg.Connection], object] | None  # the operator's action, at the same time


@pytest.mark.parametrize(
    "build",
    [
        cancel_while_a_group_ends,
        settles_of_both_kinds_across_two_workflows,
        operator_on_a_node_being_released("cancel job"),
        operator_on_a_node_being_released("skip node"),
    ],
    ids=["cancel workflow", "settles of both kinds", "cancel a job released", "skip a node released"],
)
def test_settles_and_operator_actions_at_the_same_instant_meet_no_deadlock(conn, db_url, build):
    """Settles and an operator's action that take the same workflow's rows, sent together, 100 times: every
    transaction takes a workflow's row before its nodes and its jobs' rows (migration 0017,
    dygo_lock_workflows), so none waits for another in a cycle. A deadlock would fail a statement (40P01)."""
    errors: Counter[str] = Counter()

    async def go() -> None:
        settlers = [await psycopg.AsyncConnection.connect(db_url, autocommit=True) for _ in range(2)]
        with psycopg.connect(db_url, autocommit=True) as operator:
            for _ in range(100):
                race = build(conn)
                jobs = await claim(settlers[0], "default", race.claim, "w1", 60)
                sent = [leases.settle(c, batch) for c, batch in zip(settlers, race.settles(jobs), strict=False)]
                if race.act is not None:
                    sent.append(asyncio.to_thread(race.act, operator))
                for outcome in await asyncio.gather(*sent, return_exceptions=True):
                    if isinstance(outcome, psycopg.Error):
                        errors[f"{type(outcome).__name__} {outcome.sqlstate}"] += 1
                    elif isinstance(outcome, BaseException) and not isinstance(outcome, CodedError):
                        raise outcome
                # What the round left ready goes aside, so the next round claims its own jobs.
                conn.execute("UPDATE dygo_jobs SET queue = 'other' WHERE queue = 'default' AND state = 'pending'")
        for c in settlers:
            await c.close()

    asyncio.run(go())
    assert errors == {}
    assert check_invariants(conn) == []


def test_operators_acting_while_workflows_settle_meet_no_deadlock_and_leave_the_books_right(db_url):
    """A few seconds of chaos/workflow_soak.py: four connections claim and settle batches of mixed outcomes
    (now and then after their lease ran out), lease recovery runs, and an operator cancels workflows,
    retries, skips and cancels nodes, cancels, retries and deletes jobs and seals batches, all at once. No
    statement fails but for a refusal (a deadlock would be a 40P01 here), and once it is quiet the
    counters agree with the rows: nothing stranded."""
    report = asyncio.run(soak(db_url, seconds=6, settlers=4, seed=7))
    print(report.summary())
    assert report.errors == {}
    assert report.violations == []
    assert report.settled > 500 and report.late_settles > 0 and sum(report.actions.values()) > 20


def test_retention_deleting_finished_members_of_a_running_workflow_does_not_stall_it(conn, db_url, spawn, tmp_path):
    """A real worker whose retention keeps succeeded jobs one second runs a workflow: a node runs until the
    group before it is deleted whole, and the workflow still ends, succeeded, its counters intact (a node's
    counts, and what ctx.deps tells the jobs after it, need none of its rows)."""
    config = copy_test_config(tmp_path, "completed_retention: 1s\nretention_interval: 1s\n")
    wf = Workflow("kept short")
    wf.map("first", "test.record", [{"seconds": 0.01}] * 20)
    wf.add("wait", "test.until_trimmed", {}, after="first")
    wf.map("then", "test.record", [{"seconds": 0.01}] * 20, after="wait")
    wf.add("last", "test.record", {}, after=["then", "first"])
    handle = enqueue_workflow(conn, wf)
    worker = spawn("worker", env=dygo_env(db_url, DYGO_CONFIG_DIR=str(config)))
    worker.wait_for_line("started")
    wait_until(
        lambda: workflows.get_workflow(conn, handle.id)["state"] != "running", timeout=30, message="the workflow"
    )
    shown = workflows.get_workflow(conn, handle.id)
    assert shown["state"] == "succeeded"
    nodes = {node["name"]: node for node in shown["nodes"]}
    assert nodes["wait"]["result"] == {
        "state": "succeeded",
        "jobs": 20,
        "succeeded": 20,
        "dead": 0,
        "cancelled": 0,
        "skipped": 0,
    }
    assert (nodes["first"]["jobs"], nodes["first"]["succeeded"], nodes["first"]["jobs_left"]) == (20, 20, 0)
    assert shown["result"] == {"last": {"attempt": 1, "retry": False}}
    assert check_invariants(conn) == []
    # The pass logs after its commit, which the workflow's last jobs may finish before.
    wait_until(lambda: "retention: trimmed" in worker.stderr(), message="the retention pass's log line")
    assert "Traceback" not in worker.stderr()


def test_a_node_re_armed_after_retention_deleted_some_of_its_cancelled_jobs_still_ends(conn, db_url):
    """u fails and so cancels group d; retention deletes one of d's cancelled jobs; u is retried. d waits
    again with the jobs that are left, the deleted one still counted cancelled, and ends when they have
    (cancelled: one of its jobs never ran), rather than waiting forever for a job that no longer exists."""
    wf = Workflow("re-armed")
    wf.add("u", "test.noop", {})
    wf.map("d", "test.noop", [{}] * 3, after="u")
    handle = enqueue_workflow(conn, wf)

    async def settle_ready(dead: bool) -> None:
        async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as c:
            jobs = await claim(c, "default", 10, "w1", 30)
            outcomes = [Unsuccessful(j, "dead", error="u failed") if dead else Succeeded(j, "1") for j in jobs]
            await leases.settle(c, outcomes)

    asyncio.run(settle_ready(dead=True))
    assert {node["name"]: node["state"] for node in workflows.get_workflow(conn, handle.id)["nodes"]} == {
        "u": "failed",
        "d": "cancelled",
    }
    first_of_d = "SELECT min(id) FROM dygo_jobs WHERE node_id = %s"
    conn.execute(f"DELETE FROM dygo_jobs WHERE id = ({first_of_d})", (handle.nodes["d"],))  # as retention does
    workflows.act_on_node(conn, handle.id, "u", "retry")
    d = workflows.get_workflow(conn, handle.id)["nodes"][1]
    assert (d["state"], d["jobs"], d["jobs_left"], d["cancelled"]) == ("waiting", 3, 2, 1)
    asyncio.run(settle_ready(dead=False))  # u
    asyncio.run(settle_ready(dead=False))  # d's two jobs
    shown = workflows.get_workflow(conn, handle.id)
    d = shown["nodes"][1]
    assert (d["state"], d["succeeded"], d["cancelled"], d["jobs_left"]) == ("cancelled", 2, 1, 0)
    assert shown["state"] == "failed"
    assert check_invariants(conn) == []


def test_a_settle_chosen_as_a_deadlocks_victim_is_settled_again_and_the_worker_stays_up(conn, db_url, spawn):
    """An operator's transaction holds a workflow's row; the worker's settle of a job of it waits for that
    row while holding the job's; the operator then asks for the job's row: a deadlock, and the worker's
    settle (the first to wait) is its victim. The worker settles the batch once more, which succeeds once
    the operator is done: the job succeeds, the next node runs, the worker stays up."""
    handle = enqueue_workflow(conn, workflows.chain("victim", ("a", "test.record", {}), ("b", "test.record", {})))
    job_a = handle.jobs["a"]
    waiting_on_a_lock = (
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
        "AND application_name LIKE 'dygo-worker %%' AND wait_event_type = 'Lock'"
    )
    with psycopg.connect(db_url) as operator:
        operator.execute("SET deadlock_timeout = '30s'")  # the worker, waiting first, detects the deadlock
        operator.execute("SELECT FROM dygo_workflows WHERE id = %s FOR UPDATE", (handle.id,))
        worker = spawn("worker", "--concurrency", "2")
        worker.wait_for_line("started")
        wait_until(lambda: conn.execute(waiting_on_a_lock).fetchone()[0] == 1, message="the settle to wait")
        operator.execute("SELECT FROM dygo_jobs WHERE id = %s FOR UPDATE", (job_a,))  # granted: the worker gave way
        operator.commit()
    wait_until(
        lambda: (
            conn.execute("SELECT state FROM dygo_jobs WHERE id = %s", (handle.jobs["b"],)).fetchone()[0] == "succeeded"
        ),
        message="node b to run after a",
    )
    assert conn.execute("SELECT state, errors FROM dygo_jobs WHERE id = %s", (job_a,)).fetchone() == ("succeeded", [])
    runs = defaultdict(int)
    for (job_id,) in conn.execute("SELECT job_id FROM test_runs"):
        runs[job_id] += 1
    assert runs == {job_a: 1, handle.jobs["b"]: 1}
    assert "DeadlockDetected" in worker.stderr() and "running it again" in worker.stderr()
    assert worker.process.poll() is None and "Traceback" not in worker.stderr()
    assert check_invariants(conn) == []


# An operator's statements over many jobs, each with whether the job it must meet is dead first.
MANY_JOBS = {
    "bulk by ids": (lambda c, job: admin.bulk_act(c, "cancel", ids=[job]), False),
    "bulk by filter": (lambda c, job: admin.bulk_act(c, "cancel", where=admin.JobFilter(queue="other")), False),
    "purge": (lambda c, job: admin.purge_queue(c, "other"), False),
    "retry a queue's dead": (lambda c, job: admin.retry_dead(c, "other"), True),
    "retry all dead": (lambda c, job: admin.retry_dead(c, None), True),
    "retry a dead group": (lambda c, job: admin.retry_dead_group(c, "test.record", ""), True),
}


@pytest.mark.parametrize("name", list(MANY_JOBS))
def test_an_operator_moving_many_jobs_takes_their_workflows_first_and_meets_no_deadlock(conn, db_url, name):
    """A transaction holds a workflow's row, as a settle of one of its jobs does in the job trigger, and then
    asks for one of its jobs' rows, as that settle's advance does. An operator's statement over many jobs,
    that job among them, sent in between, waits for the workflow's row before it takes any job's: the
    transaction gets the job at once, and the operator's statement runs once it commits."""
    action, dead = MANY_JOBS[name]
    wf = Workflow("bulk")
    wf.add("b", "test.record", {}, after=wf.add("a", "test.record", {}, queue="other"))
    handle = enqueue_workflow(conn, wf)
    job = handle.jobs["a"]
    if dead:
        conn.execute("UPDATE dygo_jobs SET state = 'dead', finished_at = now(), last_error = 'x' WHERE id = %s", (job,))
    outcome: dict[str, object] = {}
    with psycopg.connect(db_url) as engine, psycopg.connect(db_url, autocommit=True) as operator:
        engine.execute("SET lock_timeout = '5s'")
        engine.execute("SELECT FROM dygo_workflows WHERE id = %s FOR UPDATE", (handle.id,))

        def act() -> None:
            try:
                outcome["result"] = action(operator, job)
            except psycopg.Error as exc:
                outcome["error"] = exc

        thread = threading.Thread(target=act)
        thread.start()
        waiting = "SELECT wait_event_type FROM pg_stat_activity WHERE pid = %s"
        wait_until(
            lambda: conn.execute(waiting, (operator.info.backend_pid,)).fetchone()[0] == "Lock",
            message="the operator's statement to wait",
        )
        engine.execute("SELECT FROM dygo_jobs WHERE id = %s FOR UPDATE", (job,))  # granted, or lock_timeout
        engine.commit()
        thread.join(10)
    assert "error" not in outcome and "result" in outcome, outcome
    state = conn.execute("SELECT state FROM dygo_jobs WHERE id = %s", (job,)).fetchone()
    assert state == (None if name == "purge" else ("pending",) if dead else ("cancelled",))
    assert check_invariants(conn) == []
