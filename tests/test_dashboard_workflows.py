"""The workflow pages of the dashboard in a real headless Chromium against one real `dygo serve`.

Jobs are claimed and settled by the store's own claim and settle (as tests/test_workflows.py does): what
moves a workflow is the database, and the pages read its counters. Screenshots land in
test-artifacts/dashboard/.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator

import psycopg
import pytest
from dygo.store import workflows
from dygo.store.leases import Succeeded, Unsuccessful, settle
from dygo.store.workflows import Workflow, enqueue_workflow

from tests.claiming import claim
from tests.conftest import READ_TOKEN, Api
from tests.test_dashboard import browser_context, expect, log_in, page, pytestmark, shot

__all__ = ["browser_context", "page", "pytestmark"]  # fixtures and the no-browser skip, shared


@pytest.fixture
def conn(module_db_url: str) -> Iterator[psycopg.Connection]:
    with psycopg.connect(module_db_url, autocommit=True) as connection:
        yield connection


def work(db_url: str, queue: str = "default") -> None:
    """Claim and settle every ready job of `queue` until none is left: a job whose args say `die` dies,
    the others succeed. In a thread of its own: Playwright's sync API holds this one's event loop."""

    async def go() -> None:
        async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as conn:
            while jobs := await claim(conn, queue, 1000, "w1", 30):
                await settle(
                    conn,
                    [
                        Unsuccessful(job, "dead", error=f"{job.args['node']} failed")
                        if job.args.get("die")
                        else Succeeded(job, json.dumps({"node": job.args["node"]}))
                        for job in jobs
                    ],
                )

    worker = threading.Thread(target=asyncio.run, args=(go(),))
    worker.start()
    worker.join()


def diamond(name: str, fail: str = "", **options) -> Workflow:
    """a -> (b, c) -> d -> e, and a group `fan` of 10 after a, two of whose jobs fail (it allows 2)."""
    wf = Workflow(name)
    wf.add("a", "test.noop", {"node": "a", "die": fail == "a"}, **options)
    wf.add("b", "test.noop", {"node": "b", "die": fail == "b"}, after="a", **options)
    wf.add("c", "test.noop", {"node": "c"}, after="a", **options)
    wf.add("d", "test.noop", {"node": "d"}, after=["b", "c"], **options)
    wf.add("e", "test.noop", {"node": "e"}, after="d", **options)
    members = [{"node": "fan", "die": i < 2} for i in range(10)]
    wf.map("fan", "test.noop", members, after="a", allow_failures=2, **options)
    return wf


def test_a_failed_node_cancels_downstream_and_its_retry_from_the_graph_re_arms_it(
    module_api: Api, module_db_url: str, conn, page
):
    handle = enqueue_workflow(conn, diamond("order-42", fail="b"))
    work(module_db_url)
    job_of_b = handle.jobs["b"]
    conn.execute("UPDATE dygo_jobs SET args = args - 'die' WHERE id = %s", (job_of_b,))  # b's next run succeeds
    log_in(page, module_api)

    page.click("header nav a:has-text('Workflows')")
    row = page.locator(f"tr[data-workflow='{handle.id}']")
    expect(row).to_contain_text("order-42")
    expect(row.locator(".state")).to_have_text("failed")
    expect(row).to_contain_text("6 of 6 nodes (3 failed)")  # b failed; d and e cancelled
    expect(row.locator("progress")).to_have_attribute("value", "6")
    shot(page, "workflows")
    page.goto(f"{module_api.url}/dashboard/workflows?state=running")
    expect(row).to_have_count(0)

    page.goto(f"{module_api.url}/dashboard/workflows")
    row.locator("a").first.click()
    graph = page.locator("svg.wgraph")
    for name, state in {"a": "succeeded", "b": "failed", "c": "succeeded", "d": "cancelled", "e": "cancelled"}.items():
        expect(graph.locator(f"g.node[data-node='{name}']")).to_have_attribute("data-state", state)
        expect(graph.locator(f"g.node[data-node='{name}'] text.state")).to_contain_text(state)  # words, not colour
    expect(graph.locator("path.edge[data-edge='b-d']")).to_have_attribute("data-state", "cancel")
    expect(graph.locator("path.edge[data-edge='c-d']")).to_have_attribute("data-state", "met")
    fan = graph.locator("g.node[data-node='fan']")
    expect(fan).to_contain_text("succeeded · group of 10")
    expect(fan).to_contain_text("8 succeeded · 0 left · 2 failed")
    nodes = page.locator("table.nodes")
    expect(nodes.locator("tr[data-node='d'] .after")).to_have_text(["b: cancel", "c: met"])
    expect(nodes.locator("tr[data-node='d'] button")).to_have_count(0)  # d waits for b's retry, not its own
    expect(nodes.locator("tr[data-node='fan'] td.num").first).to_have_text("group of 10")
    shot(page, "workflow-failed")

    nodes.locator("tr[data-node='b'] button:has-text('Retry')").click()
    expect(page.locator(".flash.ok")).to_have_text("Node b retried; it is now running, the workflow running.")
    for name in ("d", "e"):
        expect(graph.locator(f"g.node[data-node='{name}']")).to_have_attribute("data-state", "waiting")
    expect(graph.locator("g.node[data-node='d']")).to_contain_text("waiting on 1 of 2: b")
    expect(nodes.locator("tr[data-node='e'] .wait")).to_have_text("waiting on 1 of 1: d")
    expect(graph.locator("path.edge[data-edge='b-d']")).to_have_attribute("data-state", "open")
    shot(page, "workflow-retried")

    # A workflow job's page names its workflow and node; the jobs list shows its waiting jobs.
    graph.locator("g.node[data-node='b'] a").click()
    expect(page.locator("h1")).to_contain_text(f"Job {job_of_b}")
    page.click(f"dd a:has-text('order-42 ({handle.id})')")
    expect(page.locator("h1")).to_contain_text(f"Workflow {handle.id}")
    page.goto(f"{module_api.url}/dashboard/jobs")
    expect(page.locator(f"tr[data-job='{handle.jobs['d']}'] .state")).to_have_text("waiting")

    work(module_db_url)
    page.goto(f"{module_api.url}/dashboard/workflows/{handle.id}")
    expect(page.locator("h1 .state")).to_have_text("succeeded")
    expect(page.locator("pre.json")).to_contain_text('"node": "e"')  # the result: the last node's


def test_a_reader_sees_no_button_an_admin_skips_a_node_and_cancels_a_workflow(
    module_api: Api, module_db_url: str, conn, page
):
    # On queue "other", which nothing here works: a is pending, every other node waits.
    skipped = enqueue_workflow(conn, diamond("report-7", queue="other"))
    cancelled = enqueue_workflow(conn, diamond("report-8", queue="other"))
    url = f"{module_api.url}/dashboard/workflows"
    log_in(page, module_api, READ_TOKEN)
    page.goto(f"{url}/{skipped.id}")
    expect(page.locator("svg.wgraph g.node[data-node='b']")).to_contain_text("waiting on 1 of 1: a")
    expect(page.locator("main form[method=post]")).to_have_count(0)
    shot(page, "workflow-read-only")
    csrf = page.locator("header input[name=csrf]").get_attribute("value")
    for action in ("nodes/a/skip", "cancel"):
        reply = page.request.post(f"{url}/{skipped.id}/{action}", form={"csrf": csrf}, max_redirects=0)
        assert reply.status == 403 and "Read-only access" in reply.text()
    assert workflows.get_workflow(conn, skipped.id)["state"] == "running"

    page.context.clear_cookies()
    log_in(page, module_api)
    page.goto(f"{url}/{skipped.id}")
    page.locator("tr[data-node='a'] button:has-text('Skip')").click()
    # Skipping is never a failure: everything after a is skipped too, and the workflow succeeds.
    expect(page.locator(".flash.ok")).to_have_text("Node a skipped; it is now skipped, the workflow succeeded.")
    expect(page.locator("svg.wgraph g.node[data-state='skipped']")).to_have_count(6)
    expect(page.locator("path.edge[data-edge='a-b']")).to_have_attribute("data-state", "skip")

    page.goto(f"{url}/{cancelled.id}")
    page.click(".actions.bar button:has-text('Cancel workflow')")
    expect(page.locator(".flash.ok")).to_have_text(f"Workflow {cancelled.id} cancelled.")
    expect(page.locator("h1 .state")).to_have_text("cancelled")
    expect(page.locator("svg.wgraph g.node[data-state='cancelled']")).to_have_count(6)
    expect(page.locator("main form[method=post]")).to_have_count(0)  # nothing left to act on
    shot(page, "workflow-cancelled")
