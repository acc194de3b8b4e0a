"""Workflows run by a real worker process: what a node's job is told, and a batch its own jobs grow."""

from __future__ import annotations

from dygo.store import workflows
from dygo.store.workflows import Workflow, batch, enqueue_workflow

from tests.conftest import wait_until


def test_a_worker_runs_a_workflow_and_each_job_reads_the_nodes_before_it(conn, spawn):
    wf = Workflow("report")
    wf.add("receipt", "test.workflow_step", {})
    wf.map("emails", "test.workflow_step", [{}] * 3, after="receipt")
    wf.add("report", "test.workflow_step", {}, after=["receipt", "emails"])
    handle = enqueue_workflow(conn, wf)
    worker = spawn("worker")
    worker.wait_for_line("started")
    try:
        wait_until(lambda: workflows.get_workflow(conn, handle.id)["state"] == "succeeded", message="workflow done")
    except AssertionError as error:
        shown = workflows.get_workflow(conn, handle.id)
        raise AssertionError(f"{error}: {shown['nodes']}\n{worker.stderr()[-3000:]}") from None
    result = workflows.get_workflow(conn, handle.id)["result"]["report"]
    assert result["node"] == "report"
    assert result["deps"]["receipt"] == {
        "state": "succeeded",
        "result": {"node": "receipt", "deps": {}},
        "counts": {"jobs": 1, "succeeded": 1, "dead": 0, "cancelled": 0, "skipped": 0},
    }
    assert result["deps"]["emails"]["counts"]["succeeded"] == 3 and result["deps"]["emails"]["result"] is None


def test_jobs_of_an_open_batch_grow_it_and_its_callback_runs_once_after_the_seal(conn, spawn):
    handle = enqueue_workflow(
        conn,
        batch("grow", "test.workflow_step", [{"add": 2}] * 3, open=True, on_success=("test.workflow_step", {})),
    )
    worker = spawn("worker")
    worker.wait_for_line("started")

    def group() -> dict:
        return workflows.get_workflow(conn, handle.id)["nodes"][0]

    wait_until(lambda: group()["jobs"] == 9 and group()["jobs_left"] == 0, message="the batch's 9 jobs ran")
    assert workflows.get_workflow(conn, handle.id)["nodes"][1]["state"] == "waiting"  # not sealed yet
    workflows.seal_batch(conn, handle.id)
    wait_until(lambda: workflows.get_workflow(conn, handle.id)["state"] == "succeeded", message="callback ran")
    callback = handle.jobs["on_success"]
    runs = conn.execute("SELECT count(*) FROM test_runs WHERE job_id = %s", (callback,)).fetchone()[0]
    assert runs == 1
