"""The job page of a parent waiting on its child jobs and of a child, and the list of a parent's children (a
real Chromium, serve and workers)."""

from __future__ import annotations

from tests.test_dashboard import browser_context, enqueue, expect, log_in, page, pytestmark, shot, state_of

__all__ = ["browser_context", "page", "pytestmark"]  # fixtures and the no-browser skip, shared


def test_a_waiting_parent_links_its_children_and_a_child_links_its_parent(serve, spawn, conn, page):
    api = serve()
    parent_id = enqueue(api, "test.parent_catches", {"delay": "1h"})
    assert spawn("worker", "--once").wait() == 0
    assert state_of(conn, parent_id) == "waiting"
    [(child_id,)] = conn.execute("SELECT id FROM dygo_jobs WHERE parent_id = %s", (parent_id,)).fetchall()
    log_in(page, api)

    page.goto(f"{api.url}/dashboard/jobs/{parent_id}")
    expect(page.locator("h1 .state")).to_have_text("waiting")
    wait = page.locator("dl.facts .children-wait")
    expect(wait).to_have_text("at step risky#1 for 1 of 1 child job not yet ended")
    expect(page.locator("li[data-step='risky#1'] .children")).to_contain_text("1 child job, 1 not yet ended")
    shot(page, "job-waiting-on-children")
    wait.locator("a").click()
    expect(page.locator(".parent-filter")).to_contain_text(f"The child jobs of job {parent_id}")
    rows = page.locator("table.jobs tbody tr")
    expect(rows).to_have_count(1)
    expect(rows.first).to_have_attribute("data-job", str(child_id))
    expect(page.locator("[data-bulk-matching]")).to_have_count(0)  # the matching-everything actions are off

    rows.first.locator(f"a:has-text('{child_id}')").first.click()
    expect(page.locator("dl.facts .parent")).to_have_text(f"job {parent_id}, step risky#1, child 1")
    page.locator("dl.facts .parent a").click()
    expect(page.locator("h1")).to_contain_text(f"Job {parent_id}")
