"""The job page of a job waiting for an event: its wait on the step timeline, and the "Emit event" form (a real
Chromium, serve and workers)."""

from __future__ import annotations

from tests.conftest import READ_TOKEN
from tests.test_dashboard import browser_context, enqueue, expect, log_in, page, pytestmark, shot, state_of
from tests.test_steps import effects

__all__ = ["browser_context", "page", "pytestmark"]  # fixtures and the no-browser skip, shared


def test_a_waiting_job_shows_its_event_wait_and_is_woken_by_the_emit_form(serve, spawn, conn, page):
    api = serve()
    job_id = enqueue(api, "test.wait_event", {"key": "order:42", "timeout": "1d"})
    assert spawn("worker", "--once").wait() == 0
    assert state_of(conn, job_id) == "waiting"
    log_in(page, api)

    page.goto(f"{api.url}/dashboard/jobs/{job_id}")
    expect(page.locator("h1 .state")).to_have_text("waiting")
    wait = page.locator("li[data-step='approval#1'] .event-wait")
    expect(wait).to_contain_text("Waits for event order:42: waiting, deadline")
    expect(page.locator(".waiting-event")).to_contain_text("for event order:42 until")
    shot(page, "job-waiting-event")

    form = page.locator("form.emit-event")
    form.locator("textarea[name=payload]").fill("{not json")
    form.locator("button").click()
    expect(page.locator(".flash.error")).to_contain_text("Event 'order:42' not emitted: the payload is not JSON")
    assert state_of(conn, job_id) == "waiting"

    page.locator("form.emit-event textarea[name=payload]").fill('{"approved": true}')
    page.locator("form.emit-event button").click()
    expect(page.locator(".flash.ok")).to_have_text("Event 'order:42' emitted: 1 waiting job(s) woken.")
    assert state_of(conn, job_id) == "pending"
    expect(page.locator("form.emit-event")).to_have_count(0)
    expect(page.locator("li[data-step='approval#1'] .event-wait")).to_contain_text("done")
    expect(page.locator("li[data-step='approval#1'] .step-result")).to_contain_text('"approved": true')

    assert spawn("worker", "--once").wait() == 0
    assert state_of(conn, job_id) == "succeeded"
    assert effects(conn, job_id) == {"before": 1, "run": 2, "after": 1}


def test_a_read_only_visitor_sees_the_wait_but_no_emit_form(serve, spawn, conn, page):
    api = serve()
    job_id = enqueue(api, "test.wait_event", {"key": "order:43"})
    assert spawn("worker", "--once").wait() == 0
    log_in(page, api, token=READ_TOKEN)
    page.goto(f"{api.url}/dashboard/jobs/{job_id}")
    expect(page.locator(".waiting-event")).to_contain_text("for event order:43")
    expect(page.locator("li[data-step='approval#1'] .event-wait")).to_contain_text("no deadline")
    expect(page.locator("form.emit-event")).to_have_count(0)
