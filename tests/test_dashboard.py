"""The dashboard in a real headless Chromium against a real `dygo serve` (and a real `dygo worker`).

Screenshots of each page land in test-artifacts/dashboard/ (git-ignored).
"""

from __future__ import annotations

import os
import re
import tempfile
from collections.abc import Iterator
from pathlib import Path

import httpx
import psycopg
import pytest
from dygo.app.throttle import LOGIN_ATTEMPTS
from dygo.store import enqueue as enqueue_job

from tests.conftest import ADMIN_TOKEN, READ_TOKEN, REPO, Api, wait_until

CHROMIUM = Path("/usr/bin/chromium")
ARTIFACTS = REPO / "test-artifacts" / "dashboard"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]

# In CI (root, `make test` installs Chromium) a missing browser fails the tests instead of skipping them.
NO_BROWSER = (
    "Debian chromium is not installed at /usr/bin/chromium "
    "(`make test` installs it when run as root: apt-get install chromium)"
)
pytestmark = pytest.mark.skipif(not CHROMIUM.exists() and not os.environ.get("CI"), reason=NO_BROWSER)

sync_api = pytest.importorskip("playwright.sync_api")
expect = sync_api.expect


@pytest.fixture(scope="module")
def browser_context() -> Iterator:
    with tempfile.TemporaryDirectory(prefix="dygo-chromium-") as profile, sync_api.sync_playwright() as playwright:
        context = playwright.chromium.launch_persistent_context(
            profile,
            executable_path=str(CHROMIUM),
            args=CHROMIUM_ARGS,
            headless=True,
            viewport={"width": 1100, "height": 800},
        )
        context.set_default_timeout(10_000)
        yield context
        context.close()


@pytest.fixture
def page(browser_context) -> Iterator:
    browser_context.clear_cookies()
    page = browser_context.new_page()
    yield page
    page.close()


def shot(page, name: str) -> None:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / f"{name}.png"), full_page=True)


def log_in(page, api: Api, token: str = ADMIN_TOKEN) -> None:
    page.goto(f"{api.url}/dashboard/")
    expect(page).to_have_url(re.compile(r"/dashboard/login\?next="))
    page.fill("#token", token)
    page.click("button:has-text('Sign in')")
    expect(page.locator(".flash")).to_contain_text("Signed in")


def enqueue(api: Api, kind: str, args: dict | None = None, **options) -> int:
    reply = api.admin.post("/api/v1/jobs", json={"kind": kind, "args": args or {}, **options})
    assert reply.status_code == 201, reply.text
    return reply.json()["id"]


def state_of(conn, job_id: int) -> str:
    return conn.execute("SELECT state FROM dygo_jobs WHERE id = %s", (job_id,)).fetchone()[0]


def test_dead_jobs_are_grouped_and_a_group_retry_succeeds_on_a_real_worker(serve, spawn, conn, page):
    api = serve()
    ids = [enqueue(api, "test.fail_first_runs", {"times": 1}) for _ in range(2)]
    spawn("worker")
    log_in(page, api)
    shot(page, "overview")
    expect(page.locator("tr.worker")).to_have_count(1, timeout=15_000)  # the live refresh shows the worker
    wait_until(lambda: all(state_of(conn, i) == "dead" for i in ids), message="both jobs dead")

    page.goto(f"{api.url}/dashboard/dead")
    group = page.locator("section.group", has_text="test.fail_first_runs")
    expect(group).to_contain_text("ValueError: run <n> of job <n> failed")  # ids normalised: one group
    expect(group.locator(".count")).to_have_text("2")
    shot(page, "dead-letters")
    group.locator("button:has-text('Retry this group')").click()
    expect(page.locator(".flash.ok")).to_contain_text("Retried 2 dead test.fail_first_runs jobs")

    wait_until(lambda: all(state_of(conn, i) == "succeeded" for i in ids), message="retried jobs to succeed")
    page.goto(f"{api.url}/dashboard/")  # both throughput charts count these runs, from the rollups
    for chart in ("minutes", "days"):
        for series, total in (("succeeded", "2"), ("failed", "2"), ("dead", "2")):
            drawn = page.locator(f"figure[data-chart={chart}] .series[data-series={series}]")
            expect(drawn).to_have_attribute("data-total", total)
            expect(page.locator(f"figure[data-chart={chart}] .key[data-series={series}] .total")).to_have_text(total)
    minutes = page.locator("figure[data-chart=minutes] .plot svg")
    expect(minutes).to_have_attribute("aria-label", re.compile("2 succeeded, 2 failed attempts, 2 dead"))
    expect(minutes.locator("rect.hover title").last).to_contain_text("2 succeeded")  # this minute
    expect(page.locator("figure[data-chart=days] rect.hover")).to_have_count(30)
    expect(page.locator("figure[data-chart=minutes] rect.hover")).to_have_count(60)
    shot(page, "overview-throughput")
    page.goto(f"{api.url}/dashboard/jobs/{ids[0]}")
    expect(page.locator("h1 .state")).to_have_text("succeeded")
    expect(page.locator(".timeline")).to_contain_text("ValueError: run 1 of job")
    expect(page.locator("pre.json").last).to_contain_text("recovered")
    shot(page, "job-detail")


def test_overview_counts_refresh_without_a_reload(serve, conn, page):
    api = serve()
    # Some history for the charts in the screenshots: a few minutes of the last hour and a few days.
    conn.execute(
        "INSERT INTO dygo_stats_deltas (day, queue, kind, succeeded, failed, dead, at) "
        "SELECT (t AT TIME ZONE 'UTC')::date, 'default', 'test.noop', 20 + mod(n * 7, 30), mod(n * 3, 7), "
        "mod(n, 2), t "
        "FROM generate_series(1, 40) AS n, LATERAL (SELECT now() - make_interval(mins => n) AS t) AS at "
        "UNION ALL SELECT (now() AT TIME ZONE 'UTC')::date - n, 'default', 'test.noop', 900 + n * 40, "
        "n * 5, n, now() - make_interval(days => n) FROM generate_series(1, 12) AS n"
    )
    log_in(page, api)
    pending = page.locator("tr[data-queue='default'] td.c-pending")
    expect(pending).to_have_text("0")
    enqueue(api, "test.noop")
    expect(pending).to_have_text("1", timeout=8_000)
    succeeded = page.locator("figure[data-chart=minutes] polyline[data-series=succeeded]")
    before = int(succeeded.get_attribute("data-total"))
    conn.execute(
        "INSERT INTO dygo_stats_deltas (day, queue, kind, succeeded) "
        "VALUES ((now() AT TIME ZONE 'UTC')::date, 'default', 'test.noop', 5)"
    )
    expect(succeeded).to_have_attribute("data-total", str(before + 5), timeout=8_000)  # the chart refreshes too
    page.emulate_media(color_scheme="dark")
    page.set_viewport_size({"width": 390, "height": 800})
    shot(page, "overview-dark-phone")
    page.goto(f"{api.url}/dashboard/jobs")
    shot(page, "jobs-dark-phone")


def test_a_forged_post_is_refused_with_a_page_not_a_stack_trace(serve, conn, page):
    api = serve()
    job_id = enqueue(api, "test.noop")
    log_in(page, api)
    reply = page.request.post(f"{api.url}/dashboard/jobs/{job_id}/cancel", form={"csrf": "forged"}, max_redirects=0)
    assert reply.status == 403
    assert "This form has expired" in reply.text()
    odd = page.request.post(f"{api.url}/dashboard/jobs/{job_id}/cancel", form={"csrf": "ünïcode"}, max_redirects=0)
    assert odd.status == 403 and "This form has expired" in odd.text()
    assert state_of(conn, job_id) == "pending"
    page.set_content(reply.text())
    shot(page, "csrf-refused")


def test_wrong_token_is_refused_at_login(serve, page):
    api = serve()
    page.goto(f"{api.url}/dashboard/login")
    page.fill("#token", "not-a-token")
    page.click("button:has-text('Sign in')")
    expect(page.locator(".flash.error")).to_have_text("That token is not valid.")
    page.goto(f"{api.url}/dashboard/jobs")
    expect(page).to_have_url(re.compile(r"/dashboard/login"))


def test_read_only_token_sees_no_buttons_and_cannot_post(serve, conn, page):
    api = serve()
    job_id = enqueue(api, "test.noop")
    conn.execute(
        "UPDATE dygo_jobs SET state = 'dead', finished_at = now(), last_error = 'ValueError: x', "
        "dead_fingerprint = dygo_error_fingerprint('ValueError: x') WHERE id = %s",
        (job_id,),
    )
    log_in(page, api, READ_TOKEN)
    for path in ("/dashboard/dead", f"/dashboard/jobs/{job_id}", "/dashboard/jobs", "/dashboard/queues"):
        page.goto(api.url + path)
        expect(page.locator("main form[method=post]")).to_have_count(0)
    page.goto(f"{api.url}/dashboard/dead")
    expect(page.locator("section.group")).to_contain_text("ValueError: x")
    shot(page, "read-only-dead-letters")
    csrf = page.locator("header input[name=csrf]").get_attribute("value")
    reply = page.request.post(f"{api.url}/dashboard/jobs/{job_id}/retry", form={"csrf": csrf}, max_redirects=0)
    assert reply.status == 403 and "Read-only access" in reply.text()
    assert state_of(conn, job_id) == "dead"


def test_jobs_filter_paginate_and_act_on_one(serve, conn, page):
    api = serve()
    batch = [{"kind": "test.noop", "args": {"n": n}, "delay": "1h"} for n in range(53)]
    assert api.admin.post("/api/v1/jobs/batch", json={"jobs": batch}).status_code == 201
    other = enqueue(api, "test.record_sync")
    log_in(page, api)

    page.goto(f"{api.url}/dashboard/jobs?state=scheduled")
    expect(page.locator("tr[data-job]")).to_have_count(50)
    shot(page, "jobs")
    page.click("a[rel=next]")
    expect(page.locator("tr[data-job]")).to_have_count(3)
    page.goto(f"{api.url}/dashboard/jobs?queue=other")
    expect(page.locator("tr[data-job]")).to_have_count(1)
    page.goto(f"{api.url}/dashboard/jobs?q=%22n%22%3A+7")  # text in the args: "n": 7
    expect(page.locator("tr[data-job]")).to_have_count(1)

    job_id = int(page.locator("tr[data-job]").get_attribute("data-job"))
    page.click(f"tr[data-job='{job_id}'] a")
    for button, flash in [
        ("Pause", "paused; it is now paused"),
        ("Resume", "resumed; it is now scheduled"),
        ("Run now", "set to run now; it is now pending"),
        ("Cancel", "cancelled"),
        ("Retry", "retried; it is now pending"),
    ]:
        page.click(f".actions.bar button:has-text('{button}')")
        expect(page.locator(".flash.ok")).to_contain_text(f"Job {job_id} {flash}")
    page.click(".actions.bar button:has-text('Delete')")
    expect(page.locator(".flash.ok")).to_have_text(f"Job {job_id} deleted.")
    expect(page).to_have_url(re.compile(r"/dashboard/jobs$"))
    assert conn.execute("SELECT count(*) FROM dygo_jobs WHERE id = %s", (job_id,)).fetchone()[0] == 0
    assert state_of(conn, other) == "pending"


def test_jobs_list_shows_no_last_error_for_a_job_that_failed_then_succeeded(serve, conn, page):
    api = serve()
    recovered, retrying = enqueue(api, "test.noop"), enqueue(api, "test.noop")
    # As a worker leaves them: the error of the failed attempt stays in the row (and its history).
    conn.execute(
        "UPDATE dygo_jobs SET state = 'succeeded', attempt = 2, finished_at = now(), "
        "last_error = 'ValueError: failure number 1', errors = jsonb_build_array(jsonb_build_object("
        "'attempt', 1, 'at', now(), 'error', 'ValueError: failure number 1', 'traceback', 'Traceback')) "
        "WHERE id = %s",
        (recovered,),
    )
    conn.execute(
        "UPDATE dygo_jobs SET attempt = 1, last_error = 'ValueError: still failing' WHERE id = %s", (retrying,)
    )
    log_in(page, api)
    page.goto(f"{api.url}/dashboard/jobs")
    expect(page.locator(f"tr[data-job='{retrying}'] .error-line")).to_have_text("ValueError: still failing")
    expect(page.locator(f"tr[data-job='{recovered}'] .error-line")).to_have_text("")
    page.click(f"tr[data-job='{recovered}'] a")
    expect(page.locator("body")).to_contain_text("ValueError: failure number 1")  # the history stays on its page


def test_queues_pause_resume_and_purge_after_a_confirmation(serve, conn, page):
    api = serve()
    for _ in range(3):
        enqueue(api, "test.noop")
    log_in(page, api)
    page.goto(f"{api.url}/dashboard/queues")
    row = page.locator("tr[data-queue='default']")
    row.locator("button:has-text('Pause')").click()
    expect(page.locator(".flash.ok")).to_contain_text("Queue default paused")
    expect(row.locator(".badge.paused")).to_be_visible()
    shot(page, "queues")
    row.locator("button:has-text('Resume')").click()
    expect(row.locator(".badge.paused")).to_have_count(0)

    row.locator("a:has-text('Purge')").click()
    expect(page.locator(".notice")).to_contain_text("This deletes 3 jobs: 3 pending, 0 scheduled and 0 dead")
    shot(page, "purge-confirmation")
    page.click("button:has-text('Delete 3 jobs')")
    expect(page.locator(".flash.ok")).to_contain_text("Purged queue default: deleted 3 pending")
    assert conn.execute("SELECT count(*) FROM dygo_jobs").fetchone()[0] == 0


def test_development_without_tokens_is_open_like_the_api(serve, page):
    api = serve(tokens=False)
    page.goto(f"{api.url}/")
    expect(page).to_have_url(re.compile(r"/dashboard/$"))
    expect(page.locator("h1")).to_have_text("Overview")
    page.goto(f"{api.url}/dashboard/schedules")
    expect(page.locator("h1")).to_have_text("Schedules")
    page.goto(f"{api.url}/dashboard/jobs/999999")
    expect(page.locator("h1")).to_have_text("No such job")


def test_schedules_pause_resume_and_trigger(serve, conn, page):
    api = serve()
    conn.execute(
        "INSERT INTO dygo_schedules (name, spec, kind, queue, next_run_at) "
        "VALUES ('nightly', '30 2 * * *', 'test.noop', 'default', now() + interval '1 day')"
    )
    log_in(page, api)
    page.goto(f"{api.url}/dashboard/schedules")
    row = page.locator("tr[data-schedule='nightly']")
    expect(row).to_contain_text("every day at 02:30")
    row.locator("button:has-text('Pause')").click()
    expect(page.locator(".flash.ok")).to_have_text("Schedule nightly paused.")
    expect(row.locator(".state")).to_have_text("paused")
    row.locator("button:has-text('Resume')").click()
    expect(row.locator(".state")).to_have_text("active")
    row.locator("button:has-text('Trigger now')").click()
    expect(page.locator(".flash.ok")).to_contain_text("Schedule nightly triggered: job")
    job_id = conn.execute("SELECT last_job_id FROM dygo_schedules WHERE name = 'nightly'").fetchone()[0]
    assert state_of(conn, job_id) == "pending"
    expect(row).to_contain_text(f"job {job_id}")
    shot(page, "schedules")


def kill(conn, *job_ids: int) -> None:
    conn.execute(
        "UPDATE dygo_jobs SET state = 'dead', finished_at = now(), last_error = 'ValueError: boom', "
        "dead_fingerprint = dygo_error_fingerprint('ValueError: boom') WHERE id = ANY(%s)",
        (list(job_ids),),
    )


def test_bulk_retry_ticked_rows_then_everything_matching_the_filter_after_a_count(serve, conn, page):
    api = serve()
    noop = [enqueue(api, "test.noop", {"n": n}) for n in range(5)]
    other = enqueue(api, "test.record_sync")
    kill(conn, *noop, other)
    waiting = enqueue(api, "test.noop", delay="1h")
    log_in(page, api)

    page.goto(f"{api.url}/dashboard/jobs?state=dead")
    expect(page.locator("tr[data-job]")).to_have_count(6)
    for job_id in noop[:2]:
        page.check(f"tr[data-job='{job_id}'] input[name=id]")
    shot(page, "jobs-bulk-ticked")
    page.click("button[data-bulk=retry]")
    expect(page.locator(".flash.ok")).to_have_text(
        "Retried 2 of 2 selected jobs; 0 skipped (retry applies to jobs that are dead or cancelled)."
    )
    expect(page).to_have_url(re.compile(r"/dashboard/jobs\?state=dead$"))
    assert [state_of(conn, i) for i in noop] == ["pending"] * 2 + ["dead"] * 3

    page.goto(f"{api.url}/dashboard/jobs?state=dead&kind=test.noop")
    expect(page.locator("tr[data-job]")).to_have_count(3)
    page.click("a[data-bulk-matching=retry]")
    expect(page.locator("h1")).to_have_text("Retry every job matching the filter?")
    expect(page.locator(".notice")).to_contain_text(
        "The filter matches 3 jobs. 3 of them are dead or cancelled and will be retried; the other 0 are skipped."
    )
    shot(page, "bulk-confirmation")
    page.click("button:has-text('Retry 3 jobs')")
    expect(page.locator(".flash.ok")).to_contain_text("Retried 3 of 3 jobs matching the filter; 0 skipped")
    expect(page).to_have_url(re.compile(r"/dashboard/jobs\?kind=test.noop&state=dead$"))
    assert all(state_of(conn, i) == "pending" for i in noop)
    assert state_of(conn, other) == "dead"  # another kind: not matched

    # A filter matching jobs the action does not apply to counts them as skipped, here and after.
    page.goto(f"{api.url}/dashboard/jobs")  # no filter: every job
    page.click("a[data-bulk-matching=cancel]")
    expect(page.locator("main p.muted").first).to_have_text("Filter: none (every job)")
    expect(page.locator(".notice")).to_contain_text(
        "The filter matches 7 jobs. 6 of them are pending, scheduled or paused and will be cancelled; "
        "the other 1 is skipped."
    )
    page.click("button:has-text('Cancel 6 jobs')")
    expect(page.locator(".flash.ok")).to_contain_text("Cancelled 6 of 7 jobs matching the filter; 1 skipped")
    assert state_of(conn, waiting) == "cancelled" and state_of(conn, other) == "dead"
    shot(page, "jobs-bulk-cancelled")

    # Ticked rows: a delete skips nothing that is not active; a forged bulk post changes nothing.
    page.check(f"tr[data-job='{other}'] input[name=id]")
    page.check(f"tr[data-job='{waiting}'] input[name=id]")
    page.click("button[data-bulk=delete]")
    expect(page.locator(".flash.ok")).to_contain_text("Deleted 2 of 2 selected jobs; 0 skipped")
    assert conn.execute("SELECT count(*) FROM dygo_jobs WHERE id = ANY(%s)", ([other, waiting],)).fetchone()[0] == 0
    forged = page.request.post(f"{api.url}/dashboard/bulk/delete/matching", form={"csrf": "forged"}, max_redirects=0)
    assert forged.status == 403 and "This form has expired" in forged.text()
    assert conn.execute("SELECT count(*) FROM dygo_jobs").fetchone()[0] == 5


def test_bulk_actions_are_refused_to_a_read_only_token(serve, conn, page):
    api = serve()
    job_id = enqueue(api, "test.noop", delay="1h")
    log_in(page, api, READ_TOKEN)
    page.goto(f"{api.url}/dashboard/jobs")
    expect(page.locator("input[name=id]")).to_have_count(0)
    expect(page.locator("[data-bulk-matching]")).to_have_count(0)
    csrf = page.locator("header input[name=csrf]").get_attribute("value")
    for path, form in [
        ("/dashboard/bulk/archive", {"csrf": csrf, "id": str(job_id)}),
        ("/dashboard/bulk/archive/matching", {"csrf": csrf}),
    ]:
        reply = page.request.post(api.url + path, form=form, max_redirects=0)
        assert reply.status == 403 and "Read-only access" in reply.text()
    assert state_of(conn, job_id) == "pending"


def test_overview_shows_queue_lag_and_failing_kinds(serve, conn, page):
    api = serve()
    late = enqueue(api, "test.noop")
    conn.execute("UPDATE dygo_jobs SET run_at = now() - interval '7 minutes' WHERE id = %s", (late,))
    enqueue(api, "test.noop", queue="other", delay="1h")  # scheduled: not lagging
    conn.execute(
        "INSERT INTO dygo_stats_deltas (day, queue, kind, failed, dead) VALUES "
        "((now() AT TIME ZONE 'UTC')::date, 'default', 'test.fail_first_runs', 4, 2), "
        "((now() AT TIME ZONE 'UTC')::date - 1, 'default', 'test.noop', 1, 0), "
        "((now() AT TIME ZONE 'UTC')::date - 3, 'default', 'test.record_sync', 9, 9)"
    )
    log_in(page, api)
    expect(page.locator("tr[data-queue='default'] td.lag")).to_have_text("7m")
    expect(page.locator("tr[data-queue='other'] td.lag")).to_have_text("—")
    rows = page.locator("table.failing tbody tr")
    expect(rows).to_have_count(2)  # three days ago is out of the window
    expect(rows.nth(0)).to_have_attribute("data-kind", "test.fail_first_runs")
    expect(rows.nth(0).locator("td.num")).to_have_text(["2", "4"])
    expect(rows.nth(1)).to_have_attribute("data-kind", "test.noop")
    shot(page, "overview-lag-failing")


def test_archive_a_scheduled_job_from_its_page(serve, conn, page):
    api = serve()
    job_id = enqueue(api, "test.noop", delay="1h")
    log_in(page, api)
    page.goto(f"{api.url}/dashboard/jobs/{job_id}")
    page.click(".actions.bar button:has-text('Archive')")
    expect(page.locator(".flash.ok")).to_have_text(f"Job {job_id} archived; it is now dead.")
    expect(page.locator(".actions.bar button:has-text('Archive')")).to_have_count(0)
    assert state_of(conn, job_id) == "dead"


def test_vacuum_dead_confirms_how_many_it_deletes_then_says_what_it_did(serve, conn, page):
    api = serve()
    old, recent = enqueue(api, "test.noop"), enqueue(api, "test.noop")
    kill(conn, old, recent)
    conn.execute("UPDATE dygo_jobs SET finished_at = now() - interval '10 days' WHERE id = %s", (old,))
    log_in(page, api)
    page.goto(f"{api.url}/dashboard/queues")
    shot(page, "queues-with-dead")
    page.locator("tr[data-queue='default'] a:has-text('Vacuum dead')").click()
    expect(page.locator(".notice")).to_contain_text("This deletes 1 job dead for over 7 days")  # the default
    page.select_option("#older_than", "0s")
    page.click("button:has-text('Count again')")
    expect(page.locator(".notice")).to_contain_text("This deletes 2 dead jobs of queue default")
    page.select_option("#older_than", "1d")
    page.click("button:has-text('Count again')")
    expect(page.locator(".notice")).to_contain_text("This deletes 1 job dead for over a day of queue default")
    shot(page, "vacuum-confirmation")
    page.click("button:has-text('Delete 1 dead job')")
    expect(page.locator(".flash.ok")).to_have_text("Vacuumed queue default: deleted 1 job dead for over a day.")
    assert conn.execute("SELECT array_agg(id) FROM dygo_jobs").fetchone()[0] == [recent]
    page.context.clear_cookies()
    log_in(page, api, READ_TOKEN)
    page.goto(f"{api.url}/dashboard/queues/default/vacuum-dead?older_than=0s")
    expect(page.locator("main form[method=post]")).to_have_count(0)
    csrf = page.locator("header input[name=csrf]").get_attribute("value")
    reply = page.request.post(
        f"{api.url}/dashboard/queues/default/vacuum-dead", form={"csrf": csrf, "older_than": "0s"}, max_redirects=0
    )
    assert reply.status == 403 and "Read-only access" in reply.text()
    assert state_of(conn, recent) == "dead"


def test_too_many_failed_sign_ins_get_a_429_page_saying_when_to_try_again(serve, page):
    api = serve()
    page.goto(f"{api.url}/dashboard/login")
    for _ in range(LOGIN_ATTEMPTS - 1):
        page.fill("#token", "not-a-token")
        page.click("button:has-text('Sign in')")
        expect(page.locator(".flash.error")).to_have_text("That token is not valid.")
    page.fill("#token", "not-a-token")
    with page.expect_response(lambda r: r.url.endswith("/dashboard/login") and r.request.method == "POST") as reply:
        page.click("button:has-text('Sign in')")
    assert reply.value.status == 429
    assert 240 < int(reply.value.headers["retry-after"]) <= 300
    expect(page.locator("h1")).to_have_text("Too many failed sign-ins")
    expect(page.locator(".notice")).to_contain_text(re.compile(r"Try again in [45] minutes \(at \d\d:\d\d:\d\d UTC\)"))
    shot(page, "login-rate-limited")
    page.goto(f"{api.url}/dashboard/login")  # the right token is refused too while locked out
    page.fill("#token", ADMIN_TOKEN)
    page.click("button:has-text('Sign in')")
    expect(page.locator("h1")).to_have_text("Too many failed sign-ins")
    page.goto(f"{api.url}/dashboard/jobs")
    expect(page).to_have_url(re.compile(r"/dashboard/login"))


# --- Details of the job pages a user relies on: one `dygo serve` for these; each test makes its
# own jobs and looks only at them.


@pytest.fixture(scope="module")
def module_conn(module_db_url: str) -> Iterator[psycopg.Connection]:
    with psycopg.connect(module_db_url, autocommit=True) as connection:
        yield connection


def test_a_dead_jobs_page_says_why_it_is_dead_and_shows_no_future_run(module_api: Api, page):
    job_id = enqueue(module_api, "test.noop", delay="1h")
    assert module_api.admin.post(f"/api/v1/jobs/{job_id}/archive").status_code == 200
    log_in(page, module_api)
    page.goto(f"{module_api.url}/dashboard/jobs/{job_id}")
    expect(page.locator("h1 .state")).to_have_text("dead")
    expect(page.locator(".dead-reason")).to_contain_text("archived by an operator before it ran")
    expect(page.locator("dl.facts")).not_to_contain_text("(in ")  # it will never run
    expect(page.locator("body")).not_to_contain_text("No failed attempts.")


def test_favicon_is_served_so_a_first_visit_logs_no_error(module_api: Api, page):
    icon = httpx.get(f"{module_api.url}/favicon.ico")
    assert icon.status_code == 200 and icon.headers["content-type"].startswith("image/")
    failed: list[str] = []
    page.on("response", lambda response: failed.append(response.url) if response.status >= 400 else None)
    log_in(page, module_api)
    href = page.locator("link[rel=icon]").get_attribute("href")
    assert page.request.get(f"{module_api.url}{href}").status == 200
    assert failed == []


def test_at_phone_width_a_table_that_scrolls_sideways_shows_a_cue(module_api: Api, page):
    log_in(page, module_api)
    page.set_viewport_size({"width": 390, "height": 800})
    page.goto(f"{module_api.url}/dashboard/")
    counts = page.locator(".scroll:has(table.counts)")
    expect(counts).to_have_attribute("data-more", "right")  # columns are hidden to the right
    counts.evaluate("element => { element.scrollLeft = element.scrollWidth; }")
    expect(counts).to_have_attribute("data-more", "left")  # at the end: what is hidden is to the left
    page.set_viewport_size({"width": 1100, "height": 800})
    expect(counts).not_to_have_attribute("data-more", "left")
    expect(counts).not_to_have_attribute("data-more", "right")


def test_jobs_page_bulk_buttons_stay_on_the_line_of_their_label(module_api: Api, page):
    enqueue(module_api, "test.noop", delay="1h")
    log_in(page, module_api)
    page.set_viewport_size({"width": 1280, "height": 800})
    page.goto(f"{module_api.url}/dashboard/jobs")
    for label, buttons in (("Selected:", "[data-bulk]"), ("Everything matching the filter:", "[data-bulk-matching]")):
        label_box = page.locator("#bulk .muted", has_text=label).bounding_box()
        middle = label_box["y"] + label_box["height"] / 2
        for button in page.locator(f"#bulk {buttons}").all():  # all four on the label's line, after it
            box = button.bounding_box()
            assert abs(box["y"] + box["height"] / 2 - middle) < 6, (label, button.inner_text(), label_box, box)
            assert box["x"] > label_box["x"]


def test_failing_kinds_link_dead_jobs_only_for_a_kind_that_has_some(module_api: Api, module_conn, page):
    module_conn.execute(
        "INSERT INTO dygo_stats_deltas (day, queue, kind, failed, dead) VALUES "
        "((now() AT TIME ZONE 'UTC')::date, 'default', 'audit.flaky', 4, 0), "
        "((now() AT TIME ZONE 'UTC')::date, 'default', 'audit.broken', 1, 2)"
    )
    log_in(page, module_api)
    page.goto(f"{module_api.url}/dashboard/")
    expect(page.locator("table.failing tr[data-kind='audit.broken'] a", has_text="dead jobs")).to_have_count(1)
    expect(page.locator("table.failing tr[data-kind='audit.flaky'] a")).to_have_count(0)


def test_queues_page_has_the_cancelled_column_the_overview_has(module_api: Api, module_conn, page):
    job_id = enqueue(module_api, "test.noop", delay="1h")
    assert module_api.admin.post(f"/api/v1/jobs/{job_id}/cancel").status_code == 200
    cancelled = module_conn.execute(
        "SELECT count(*) FROM dygo_jobs WHERE queue = 'default' AND state = 'cancelled'"
    ).fetchone()[0]
    log_in(page, module_api)
    page.goto(f"{module_api.url}/dashboard/queues")
    headers = [text.strip().lower() for text in page.locator("thead th").all_inner_texts()]
    assert "cancelled" in headers
    column = headers.index("cancelled") + 1
    expect(page.locator(f"tr[data-queue=default] td:nth-child({column})")).to_have_text(str(cancelled))


def test_queues_page_shows_limits_with_their_use_and_changes_them(serve, conn, page):
    api = serve()
    log_in(page, api)
    page.goto(f"{api.url}/dashboard/queues")
    expect(page.locator("table.limits")).to_contain_text("No limits")
    form = page.locator("form.new-limit")
    form.locator("select[name=scope]").select_option("kind")
    form.locator("input[name=name]").fill("test.noop")
    form.locator("input[name=concurrency_limit]").fill("3")
    form.locator("input[name=rate_limit]").fill("100/m")
    form.locator("button").click()
    expect(page.locator(".flash.ok")).to_contain_text("Limits on kind test.noop set")
    row = page.locator("tr[data-limit='kind:test.noop']")
    expect(row).to_contain_text("100/m")
    expect(row.locator(".in-use")).to_have_text("0")
    row.locator("input[name=concurrency_limit]").fill("0")
    row.locator("button:has-text('Set')").click()
    expect(page.locator(".flash.error")).to_contain_text("concurrency_limit must be an integer greater than 0")
    row.locator("input[name=rate_limit]").fill("")
    row.locator("input[name=concurrency_limit]").fill("")
    row.locator("button:has-text('Set')").click()
    expect(page.locator(".flash.ok")).to_contain_text("Limits on kind test.noop removed")
    assert conn.execute("SELECT count(*) FROM dygo_limits WHERE concurrency_limit IS NOT NULL").fetchone()[0] == 0


def test_the_limit_form_refuses_what_the_file_refuses_and_changes_nothing(module_api, module_conn, page):
    log_in(page, module_api)
    page.goto(f"{module_api.url}/dashboard/queues")
    count = "SELECT count(*) FROM dygo_limits WHERE name = 'test.sleep'"
    assert module_conn.execute(count).fetchone()[0] == 0
    form = page.locator("form.new-limit")
    for key, concurrency, rate, rule in (
        ("", "\u0665", "", "written in digits 0-9"),  # an Arabic-Indic five
        ("", "1_0", "", "written in digits 0-9"),
        ("", "", "\u0663\u0660/s", "must be a count per unit"),
        ("meta." + "t" * 300, "3", "", "key must be at most 255 characters"),
        ("meta.tenant", "", "", "key needs a concurrency_limit or a rate_limit"),
    ):
        form.locator("select[name=scope]").select_option("kind")
        form.locator("input[name=name]").fill("test.sleep")
        form.locator("input[name=key]").fill(key)
        form.locator("input[name=concurrency_limit]").fill(concurrency)
        form.locator("input[name=rate_limit]").fill(rate)
        form.locator("button").click()
        expect(page.locator(".flash.error")).to_contain_text(rule)
        assert module_conn.execute(count).fetchone()[0] == 0, (key[:20], concurrency, rate)


def test_pages_read_from_a_replica_say_so_and_the_overview_keeps_saying_so_as_it_refreshes(
    serve, conn, replica_url, page
):
    on_primary = enqueue_on(conn, "primary")
    api = serve(DATABASE_READ_URL=replica_url)
    with psycopg.connect(replica_url, autocommit=True) as replica:
        log_in(page, api)
        notice = page.locator("p.notice.replica")
        expect(notice).to_be_visible()
        expect(notice).to_have_text(
            "Read from a replica (DATABASE_READ_URL): its lag is unknown (the server is not in recovery)."
        )
        pending = page.locator("tr[data-queue='default'] td.c-pending")
        expect(pending).to_have_text("0")  # the replica's count: the primary has a pending job
        enqueue_on(replica, "replica")
        expect(pending).to_have_text("1", timeout=8_000)  # refreshed from the replica, the notice with it
        expect(page.locator("#live p.notice.replica")).to_be_visible()  # the lag is refreshed with the counts
        expect(notice).to_have_count(1)
        shot(page, "overview-replica")
        for path in ("/jobs", "/queues", "/dead", "/workflows", "/schedules"):
            page.goto(f"{api.url}/dashboard{path}")
            expect(notice).to_be_visible()
        page.goto(f"{api.url}/dashboard/jobs/{on_primary}")  # a job's page reads the primary: no notice
        expect(page.locator("h1")).to_contain_text(str(on_primary))
        expect(notice).to_have_count(0)


def enqueue_on(conn, where: str) -> int:
    return enqueue_job(conn, "test.noop", {"where": where}).id
