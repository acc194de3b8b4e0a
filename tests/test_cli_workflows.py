"""`dygo workflows list|show` as real subprocesses against a real database."""

from __future__ import annotations

import re

from dygo.store import workflows
from dygo.store.workflows import Workflow, enqueue_workflow

from tests.test_cli_jobs import dygo


def order(name: str = "order") -> Workflow:
    wf = Workflow(name)
    wf.add("charge", "test.record", {})
    wf.map("pack", "test.record", [{}, {}], after="charge")
    wf.add("mail", "test.record", {}, after={"pack": "skip", "charge": None})
    return wf


def test_workflows_list_shows_the_newest_first_and_filters_by_state(conn, db_url):
    first = enqueue_workflow(conn, order("first"))
    second = enqueue_workflow(conn, order("second"))
    workflows.cancel_workflow(conn, first.id)
    listed = dygo(db_url, "workflows", "list")
    assert listed.returncode == 0, listed.stderr
    lines = listed.stdout.splitlines()
    assert lines[0].split() == ["ID", "NAME", "STATE", "NODES", "LEFT", "FAILED", "CREATED", "FINISHED"]
    assert [line.split()[:6] for line in lines[1:]] == [
        [str(second.id), "second", "running", "3", "3", "0"],
        [str(first.id), "first", "cancelled", "3", "0", "3"],
    ]
    running = dygo(db_url, "workflows", "list", "--state", "running", "--limit", "5").stdout.splitlines()
    assert [line.split()[0] for line in running[1:]] == [str(second.id)]
    assert dygo(db_url, "workflows", "list", "--state", "failed").stdout.strip() == "no workflows match"
    assert dygo(db_url, "workflows", "list", "--state", "done").returncode == 2  # not a state: usage error


def test_workflows_show_lists_each_node_with_its_counts_and_why_it_waits(conn, db_url):
    handle = enqueue_workflow(conn, order())
    shown = dygo(db_url, "workflows", "show", str(handle.id))
    assert shown.returncode == 0, shown.stderr
    lines = shown.stdout.splitlines()
    assert lines[:3] == [f"id               {handle.id}", "name             order", "state            running"]
    assert "nodes            3 (3 not ended, 0 failed or cancelled)" in lines
    header = next(i for i, line in enumerate(lines) if line.startswith("NODE"))
    assert lines[header].split() == [
        "NODE",
        "STATE",
        "JOB",
        "JOBS",
        "SUCCEEDED",
        "DEAD",
        "CANCELLED",
        "SKIPPED",
        "LEFT",
        "AFTER",
        "WAIT",
    ]
    rows = {line.split()[0]: re.split(r" {2,}", line.strip()) for line in lines[header + 1 :]}
    charge = str(handle.jobs["charge"])
    assert rows["charge"] == ["charge", "running", charge, "1", "0", "0", "0", "0", "1", "-", "-"]
    assert rows["pack"] == [
        "pack",
        "waiting",
        "group",
        "2",
        "0",
        "0",
        "0",
        "0",
        "2",
        "charge",
        "waiting on 1 of 1: charge",
    ]
    assert rows["mail"][-2:] == ["charge, pack (skip)", "waiting on 2 of 2: charge, pack"]

    # Run to the end (two worker passes: charge, then pack and mail): its result shows too.
    for _ in range(3):
        assert dygo(db_url, "worker", "--once").returncode == 0
    done = dygo(db_url, "workflows", "show", str(handle.id)).stdout
    assert "state            succeeded" in done
    assert 'result           {"mail": {' in done and '"attempt": 1' in done

    # A job of the workflow names it.
    job = dygo(db_url, "jobs", "show", str(handle.jobs["mail"])).stdout
    assert f"workflow         {handle.id}, node mail (dygo workflows show {handle.id})" in job

    missing = dygo(db_url, "workflows", "show", "999999")
    assert missing.returncode == 1 and "no workflow 999999" in missing.stderr
