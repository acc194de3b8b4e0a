"""Workflows: nodes wait for the nodes before them, fan-in decided by the settle, policies, re-arm, batches.

Jobs here are claimed and settled by the store's own claim and settle (no worker process): what moves a
workflow is the database, in the transaction that ends each job.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterable
from uuid import uuid4

import psycopg
import pytest
from dygo.store import workflows
from dygo.store.leases import Succeeded, Unsuccessful, settle
from dygo.store.workflows import Workflow, WorkflowError, batch, chain, enqueue_workflow

from tests.claiming import claim


def run(coro):
    return asyncio.run(coro)


def work(db_url: str, dead: Iterable[str] = (), rounds: int = 20) -> list[str]:
    """Claim and settle every ready job until none is left: those whose node is in `dead` die, the rest
    succeed with {"node": name}. The node names in the order they ran."""
    dead = set(dead)
    ran: list[str] = []

    async def go() -> None:
        async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as conn:
            for _ in range(rounds):
                jobs = await claim(conn, "default", 1000, "w1", 30)
                if not jobs:
                    return
                outcomes = []
                for job in jobs:
                    name = job.args.get("node", "?")
                    ran.append(name)
                    if name in dead:
                        outcomes.append(Unsuccessful(job, "dead", error=f"{name} failed"))
                    else:
                        outcomes.append(Succeeded(job, json.dumps({"node": name})))
                await settle(conn, outcomes)

    run(go())
    return ran


def nodes(conn, workflow_id: int) -> dict[str, str]:
    return {node["name"]: node["state"] for node in workflows.get_workflow(conn, workflow_id)["nodes"]}


def job_states(conn, workflow_id: int) -> dict[str, list[str]]:
    rows = conn.execute(
        "SELECT n.name, j.state FROM dygo_jobs j JOIN dygo_nodes n ON n.id = j.node_id "
        "WHERE n.workflow_id = %s ORDER BY j.id",
        (workflow_id,),
    ).fetchall()
    found: dict[str, list[str]] = {}
    for name, state in rows:
        found.setdefault(name, []).append(state)
    return found


def test_chain_runs_its_nodes_one_after_the_other(conn, db_url):
    handle = enqueue_workflow(
        conn,
        chain(
            "order",
            ("charge", "test.noop", {"node": "charge"}),
            ("ship", "test.noop", {"node": "ship"}),
            ("mail", "test.noop", {"node": "mail"}),
        ),
    )
    assert job_states(conn, handle.id) == {"charge": ["pending"], "ship": ["waiting"], "mail": ["waiting"]}
    assert work(db_url) == ["charge", "ship", "mail"]
    shown = workflows.get_workflow(conn, handle.id)
    assert shown["state"] == "succeeded" and shown["nodes_left"] == 0
    assert shown["result"] == {"mail": {"node": "mail"}}


def test_fan_out_and_fan_in_release_the_last_node_once_the_group_ends(conn, db_url):
    wf = Workflow("album")
    wf.add("start", "test.noop", {"node": "start"})
    wf.map("resize", "test.noop", [{"node": "resize", "i": i} for i in range(50)], after="start")
    wf.add("build", "test.noop", {"node": "build"}, after=["resize", "start"])
    handle = enqueue_workflow(conn, wf)
    ran = work(db_url)
    assert ran == ["start"] + ["resize"] * 50 + ["build"]
    shown = workflows.get_workflow(conn, handle.id)
    group = next(node for node in shown["nodes"] if node["name"] == "resize")
    assert (group["jobs"], group["jobs_left"], group["succeeded"], group["state"]) == (50, 0, 50, "succeeded")
    assert shown["state"] == "succeeded"


def test_a_cycle_or_an_unknown_node_is_refused_naming_it(conn):
    wf = Workflow("loop")
    wf.add("a", "test.noop", after="c")
    wf.add("b", "test.noop", after="a")
    wf.add("c", "test.noop", after="b")
    with pytest.raises(WorkflowError, match="cycle: a -> c -> b -> a"):
        enqueue_workflow(conn, wf)
    wf = Workflow("typo")
    wf.add("a", "test.noop", after="nope")
    with pytest.raises(WorkflowError, match="node 'a' runs after 'nope', which is not a node"):
        enqueue_workflow(conn, wf)
    assert conn.execute("SELECT count(*) FROM dygo_workflows").fetchone()[0] == 0


def diamond(policy: str, **options) -> Workflow:
    """a -> (b, c) -> d -> e; b fails in the tests."""
    wf = Workflow("diamond", on_failure=policy, **options)
    wf.add("a", "test.noop", {"node": "a"})
    wf.add("b", "test.noop", {"node": "b"}, after="a")
    wf.add("c", "test.noop", {"node": "c"}, after="a")
    wf.add("d", "test.noop", {"node": "d"}, after=["b", "c"])
    wf.add("e", "test.noop", {"node": "e"}, after="d")
    return wf


def test_cancel_policy_cancels_everything_after_a_failed_node(conn, db_url):
    handle = enqueue_workflow(conn, diamond("cancel"))
    work(db_url, dead={"b"})
    assert nodes(conn, handle.id) == {
        "a": "succeeded",
        "b": "failed",
        "c": "succeeded",
        "d": "cancelled",
        "e": "cancelled",
    }
    assert job_states(conn, handle.id)["e"] == ["cancelled"]
    assert workflows.get_workflow(conn, handle.id)["state"] == "failed"


def test_continue_policy_runs_the_next_node_which_sees_the_failure(conn, db_url):
    handle = enqueue_workflow(conn, diamond("continue"))
    assert "d" in work(db_url, dead={"b"})
    assert nodes(conn, handle.id) == {
        "a": "succeeded",
        "b": "failed",
        "c": "succeeded",
        "d": "succeeded",
        "e": "succeeded",
    }


def test_skip_policy_skips_everything_after_and_skipped_is_not_a_failure(conn, db_url):
    handle = enqueue_workflow(conn, diamond("skip"))
    work(db_url, dead={"b"})
    assert nodes(conn, handle.id) == {"a": "succeeded", "b": "failed", "c": "succeeded", "d": "skipped", "e": "skipped"}
    assert job_states(conn, handle.id)["d"] == ["skipped"]
    shown = workflows.get_workflow(conn, handle.id)
    assert shown["state"] == "failed" and shown["nodes_failed"] == 1


def test_hold_policy_keeps_the_next_node_waiting_and_says_why(conn, db_url):
    handle = enqueue_workflow(conn, diamond("hold"))
    work(db_url, dead={"b"})
    shown = workflows.get_workflow(conn, handle.id)
    d = next(node for node in shown["nodes"] if node["name"] == "d")
    assert d["state"] == "waiting" and d["wait"] == "blocked by failed b"
    assert shown["state"] == "running"
    # b retried and succeeding releases d, then e.
    workflows.act_on_node(conn, handle.id, "b", "retry")
    assert work(db_url) == ["b", "d", "e"]
    assert workflows.get_workflow(conn, handle.id)["state"] == "succeeded"


def test_an_operator_skipping_a_held_node_ends_it_and_what_follows(conn, db_url):
    handle = enqueue_workflow(conn, diamond("hold"))
    work(db_url, dead={"b"})
    shown = workflows.act_on_node(conn, handle.id, "d", "skip")
    assert {node["name"]: node["state"] for node in shown["nodes"]} == {
        "a": "succeeded",
        "b": "failed",
        "c": "succeeded",
        "d": "skipped",
        "e": "skipped",
    }
    assert shown["state"] == "failed" and workflows.check_invariants(conn) == []


def test_fail_fast_cancels_every_node_not_ended(conn, db_url):
    handle = enqueue_workflow(conn, diamond("continue", fail_fast=True))

    async def fail_b_only() -> None:
        async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as c:
            jobs = await claim(c, "default", 10, "w1", 30)
            await settle(c, [Succeeded(job, "null") for job in jobs])  # a
            jobs = {job.args["node"]: job for job in await claim(c, "default", 10, "w1", 30)}
            await settle(c, [Unsuccessful(jobs["b"], "dead", error="b failed")])
            # c was running when b failed: it ends as it will.
            await settle(c, [Succeeded(jobs["c"], "null")])

    run(fail_b_only())
    assert nodes(conn, handle.id) == {
        "a": "succeeded",
        "b": "failed",
        "c": "succeeded",
        "d": "cancelled",
        "e": "cancelled",
    }


def test_retrying_a_failed_node_re_arms_what_its_failure_cancelled(conn, db_url):
    handle = enqueue_workflow(conn, diamond("cancel"))
    work(db_url, dead={"b"})
    assert workflows.get_workflow(conn, handle.id)["state"] == "failed"
    with pytest.raises(workflows.Conflict, match="retry that node instead"):
        workflows.act_on_node(conn, handle.id, "d", "retry")
    shown = workflows.act_on_node(conn, handle.id, "b", "retry")
    assert {n["name"]: n["state"] for n in shown["nodes"]} == {
        "a": "succeeded",
        "b": "running",
        "c": "succeeded",
        "d": "waiting",
        "e": "waiting",
    }
    assert shown["state"] == "running" and shown["nodes_left"] == 3 and shown["nodes_failed"] == 0
    assert work(db_url) == ["b", "d", "e"]
    assert workflows.get_workflow(conn, handle.id)["state"] == "succeeded"


def test_a_group_succeeds_within_its_allowed_failures(conn, db_url):
    wf = Workflow("tolerant")
    wf.map("m", "test.noop", [{"node": "ok"}] * 8 + [{"node": "bad"}] * 2, allow_failures=0.2)
    wf.add("after", "test.noop", {"node": "after"}, after="m")
    handle = enqueue_workflow(conn, wf)
    assert work(db_url, dead={"bad"})[-1] == "after"
    group = workflows.get_workflow(conn, handle.id)["nodes"][0]
    assert (group["state"], group["succeeded"], group["dead"]) == ("succeeded", 8, 2)


def test_a_job_of_a_workflow_reads_what_its_upstream_nodes_gave(conn, db_url):
    wf = Workflow("deps")
    wf.add("receipt", "test.noop", {"node": "receipt"})
    wf.map("emails", "test.noop", [{"node": "emails"}] * 3)
    wf.add("report", "test.noop", {"node": "report"}, after=["receipt", "emails"])
    enqueue_workflow(conn, wf)
    work(db_url, rounds=1)

    async def claim_report():
        async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as c:
            (job,) = await claim(c, "default", 10, "w1", 30)
            results = [r async for r in job.deps["emails"].results(c)]
            return job, results

    job, results = run(claim_report())
    assert job.deps["receipt"].result == {"node": "receipt"} and job.deps["receipt"].state == "succeeded"
    assert job.deps["emails"].counts["succeeded"] == 3 and job.deps["emails"].is_group
    assert [state for _, state, _ in results] == ["succeeded"] * 3


def test_batch_fires_its_callbacks_once_and_only_after_it_is_sealed(conn, db_url):
    handle = enqueue_workflow(
        conn,
        batch(
            "import",
            "test.noop",
            [{"node": "jobs"}] * 3,
            open=True,
            on_success=("test.noop", {"node": "on_success"}),
            on_complete=("test.noop", {"node": "on_complete"}),
            on_failure=("test.noop", {"node": "on_failure"}),
        ),
    )
    assert work(db_url) == ["jobs"] * 3  # open: its callbacks wait
    workflows.add_to_batch(conn, handle.id, "test.noop", [{"node": "jobs"}] * 2)
    assert work(db_url) == ["jobs"] * 2
    workflows.seal_batch(conn, handle.id)
    assert sorted(work(db_url)) == ["on_complete", "on_success"]
    assert nodes(conn, handle.id)["on_failure"] == "skipped"
    shown = workflows.get_workflow(conn, handle.id)
    assert shown["state"] == "succeeded"
    with pytest.raises(workflows.Conflict, match="sealed"):
        workflows.add_to_batch(conn, handle.id, "test.noop", [{}])


def test_deleting_a_waiting_job_does_not_strand_the_workflow(conn, db_url):
    handle = enqueue_workflow(conn, diamond("cancel"))
    e = handle.jobs["e"]
    conn.execute("DELETE FROM dygo_jobs WHERE id = %s", (e,))
    work(db_url)
    shown = workflows.get_workflow(conn, handle.id)
    assert nodes(conn, handle.id)["e"] == "cancelled" and shown["state"] == "failed"


def test_retention_deleting_succeeded_jobs_does_not_stall_a_workflow(conn, db_url):
    handle = enqueue_workflow(conn, diamond("cancel"))
    work(db_url, rounds=1)  # a
    conn.execute("DELETE FROM dygo_jobs WHERE state = 'succeeded'")
    work(db_url)
    assert workflows.get_workflow(conn, handle.id)["state"] == "succeeded"


def test_idempotency_key_gives_back_the_workflow_it_made(conn):
    first = enqueue_workflow(conn, _keyed("k1"))
    again = enqueue_workflow(conn, _keyed("k1"))
    assert again.deduplicated and again.id == first.id
    assert conn.execute("SELECT count(*) FROM dygo_jobs").fetchone()[0] == 1


def _keyed(key: str) -> Workflow:
    wf = Workflow("once", idempotency_key=key)
    wf.add("a", "test.noop", {})
    return wf


def _append(workflow_id: int, count: int):
    from dygo.store.enqueue import JobRequest, prepare, rows_json
    from dygo.store.leases import BatchAppend

    rows = [prepare(JobRequest("test.noop", {"node": "jobs"})) for _ in range(count)]
    return [BatchAppend(workflow_id, rows_json(rows), count)]


def test_a_job_adds_to_its_open_batch_only_with_the_settle_of_its_success(conn, db_url):
    handle = enqueue_workflow(
        conn, batch("grow", "test.noop", [{"node": "jobs"}] * 2, open=True, on_success=("test.noop", {"node": "cb"}))
    )

    async def go() -> None:
        async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as c:
            first, second = await claim(c, "default", 10, "w1", 30)
            # A run that fails adds nothing; one that succeeds adds its jobs in its settle's transaction.
            await settle(c, [Unsuccessful(first, "pending", delay=0, error="try again")])
            await settle(c, [Succeeded(second, "null", appends=_append(handle.id, 3))])
            # A zombie: its lease was taken over, so its late settle matches no row and adds nothing.
            claimed = await claim(c, "default", 10, "w2", 30)
            (again,) = [j for j in claimed if j.id == first.id]
            stale = type(again)(**{**{f: getattr(again, f) for f in again.__slots__}, "lease_token": str(uuid4())})
            assert await settle(c, [Succeeded(stale, "null", appends=_append(handle.id, 5))]) == set()
            assert await settle(c, [Succeeded(job, "null") for job in claimed]) == {job.id for job in claimed}

    run(go())
    group = workflows.get_workflow(conn, handle.id)["nodes"][0]
    assert (group["jobs"], group["jobs_left"], group["succeeded"]) == (5, 0, 5)
    assert len(job_states(conn, handle.id)["jobs"]) == 5
    assert nodes(conn, handle.id)["on_success"] == "waiting"  # open: done so far, but not sealed
    workflows.seal_batch(conn, handle.id)
    assert work(db_url) == ["cb"]


def test_an_operator_cancel_of_a_waiting_node_ends_it_and_its_retry_waits_for_the_nodes_before(conn, db_url):
    handle = enqueue_workflow(conn, diamond("cancel"))
    workflows.act_on_node(conn, handle.id, "d", "cancel")
    assert nodes(conn, handle.id) == {
        "a": "running",
        "b": "waiting",
        "c": "waiting",
        "d": "cancelled",
        "e": "cancelled",
    }
    # Retried before b and c ended, d waits for them again (its job is not claimable), and so does e.
    workflows.act_on_node(conn, handle.id, "d", "retry")
    assert job_states(conn, handle.id)["d"] == ["waiting"]
    assert work(db_url) == ["a", "b", "c", "d", "e"]
    assert workflows.get_workflow(conn, handle.id)["state"] == "succeeded"
