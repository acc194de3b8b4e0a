"""The job page's step timeline and its "retry from this step" (a real Chromium, serve and workers)."""

from __future__ import annotations

from tests.test_dashboard import browser_context, enqueue, expect, log_in, page, pytestmark, shot, state_of
from tests.test_steps import effects, steps_of

__all__ = ["browser_context", "page", "pytestmark"]  # fixtures and the no-browser skip, shared


def test_the_job_page_shows_its_steps_and_retries_from_one(serve, spawn, conn, page):
    api = serve()
    job_id = enqueue(api, "test.steps_abc")
    assert spawn("worker", "--once").wait() == 0
    assert state_of(conn, job_id) == "dead"
    log_in(page, api)

    page.goto(f"{api.url}/dashboard/jobs/{job_id}")
    timeline = page.locator("ol.steps li")
    expect(timeline).to_have_count(3)
    expect(timeline.nth(0)).to_contain_text("a#1")
    expect(timeline.nth(1)).to_contain_text("b#1")
    expect(timeline.nth(1)).to_contain_text("attempt 1")
    expect(timeline.nth(1).locator(".step-result")).to_have_text("1")
    shot(page, "job-steps")
    timeline.nth(1).locator("button:has-text('Retry from this step')").click()
    expect(page.locator(".flash.ok")).to_have_text(
        f"Job {job_id}: forgot 2 steps from b#1 on (b#1, c#1); it is now pending."
    )
    assert set(steps_of(conn, job_id)) == {"a#1"}
    expect(page.locator("ol.steps li")).to_have_count(1)

    assert spawn("worker", "--once").wait() == 0
    assert state_of(conn, job_id) == "succeeded"
    assert effects(conn, job_id) == {"a": 1, "b": 2, "c": 2, "check": 2}


def test_a_sleeping_job_shows_its_sleep_on_the_timeline(serve, spawn, conn, page):
    api = serve()
    job_id = enqueue(api, "test.steps_sleep", {"seconds": 3600})
    assert spawn("worker", "--once").wait() == 0
    log_in(page, api)
    page.goto(f"{api.url}/dashboard/jobs/{job_id}")
    expect(page.locator("h1 .state")).to_have_text("scheduled")
    expect(page.locator("dl.facts")).to_contain_text("Sleeping")
    expect(page.locator("dl.facts")).to_contain_text("cool-off#1")
    sleep = page.locator("li[data-step='cool-off#1']")
    expect(sleep.locator(".sleep")).to_contain_text("Sleeps 1h, until")
    shot(page, "job-sleeping")
