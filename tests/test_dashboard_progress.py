"""The job detail page shows a running job's progress (a real Chromium, serve and worker)."""

from __future__ import annotations

from tests.conftest import wait_until
from tests.test_dashboard import browser_context, enqueue, expect, log_in, page, pytestmark, shot

__all__ = ["browser_context", "page", "pytestmark"]  # fixtures and the no-browser skip, shared


def test_job_page_shows_the_progress_of_a_running_job(serve, spawn, page):
    api = serve()
    spawn("worker").wait_for_line("started")
    job_id = enqueue(api, "test.progress", {"seconds": 4})
    wait_until(lambda: api.admin.get(f"/api/v1/jobs/{job_id}").json()["progress"], message="a progress report")
    log_in(page, api)
    page.goto(f"{api.url}/dashboard/jobs/{job_id}")
    shot(page, "job-progress")
    expect(page.locator("dd.progress progress")).to_be_visible()
    expect(page.locator("dd.progress")).to_contain_text("% report ")
    expect(page.locator("dd.progress")).to_contain_text("attempt 1")
