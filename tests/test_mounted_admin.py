"""dygo's admin mounted in a user's own FastAPI application (tests/mounted/app.py) under /jobs, behind that
application's sign-in: a real uvicorn process, clicked through in a real headless Chromium."""

from __future__ import annotations

import asyncio
import re
import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from tests.conftest import REPO, dygo_env, free_port, wait_until
from tests.test_dashboard import CHROMIUM, NO_BROWSER, browser_context, expect, page  # noqa: F401, F811

pytestmark = [pytest.mark.shared_database, pytest.mark.skipif(not CHROMIUM.exists(), reason=NO_BROWSER)]

STAFF = {"session": "staff-session"}
VIEWER = {"session": "viewer-session"}


@pytest.fixture(scope="module")
def site(module_db_url: str) -> Iterator[str]:
    """The user's application, served by uvicorn as the user would."""
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "uvicorn", "tests.mounted.app:app", "--host", "127.0.0.1", "--port", str(port)],
        cwd=REPO,
        env=dygo_env(module_db_url),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    url = f"http://127.0.0.1:{port}"

    def answering() -> bool:
        assert process.poll() is None, process.stderr.read() if process.stderr else "uvicorn exited"
        try:
            return httpx.get(url + "/").status_code == 200
        except httpx.TransportError:
            return False

    wait_until(answering, message="the user's app to answer")
    yield url
    process.terminate()
    try:
        process.wait(3)
    except subprocess.TimeoutExpired:  # a keep-alive connection of the browser holds uvicorn's graceful stop
        process.kill()
        process.wait(10)


def test_api_and_pages_refuse_requests_the_applications_sign_in_refuses(site):
    assert httpx.get(site + "/").json() == {"app": "the user's own"}  # the application's own routes are its own
    for path in ("/jobs/api/v1/jobs", "/jobs/dashboard/", "/jobs/openapi.json", "/jobs/docs", "/jobs/metrics"):
        reply = httpx.get(site + path)
        assert reply.status_code == 401, path
    assert httpx.get(site + "/jobs/api/v1/jobs").json()["error"]["code"] == "unauthorized"
    assert "Sign-in required" in httpx.get(site + "/jobs/dashboard/jobs").text
    # A read role looks but does not act; tokens mean nothing here: the application's sign-in decides.
    assert httpx.get(site + "/jobs/api/v1/jobs", cookies=VIEWER).status_code == 200
    refused = httpx.post(site + "/jobs/api/v1/jobs", cookies=VIEWER, json={"kind": "test.noop"})
    assert refused.status_code == 403, refused.text


def test_openapi_document_and_docs_pages_name_the_mount_point(site, page):  # noqa: F811
    document = httpx.get(site + "/jobs/openapi.json", cookies=STAFF).json()
    assert document["servers"] == [{"url": "/jobs"}]
    assert "/api/v1/jobs" in document["paths"]
    assert "securitySchemes" not in document["components"]  # no bearer token: the application's sign-in applies
    page.context.add_cookies([{"name": "session", "value": "staff-session", "url": site}])
    page.goto(site + "/jobs/docs")
    expect(page.locator(".swagger-ui .info .title")).to_contain_text("dygo")  # the bundle and the document loaded
    expect(page.locator(".swagger-ui .servers select")).to_contain_text("/jobs")
    redoc = httpx.get(site + "/jobs/redoc", cookies=STAFF).text
    assert "/jobs/openapi.json" in redoc and "/jobs/docs/static/redoc.standalone.js" in redoc
    assert httpx.get(site + "/jobs/docs/static/redoc.standalone.js", cookies=STAFF).status_code == 200


def test_dashboard_is_clicked_through_under_the_prefix_and_its_actions_work(site, page, conn):  # noqa: F811
    page.goto(site + "/login/staff")  # the application signs the user in and sends them to /jobs/
    expect(page).to_have_url(site + "/jobs/dashboard/")
    expect(page.locator(".visitor")).to_contain_text("admin")
    assert page.locator("form[action$='/logout']").count() == 0  # the application signs out, not dygo
    # Every link, form, script and stylesheet of the page is under the mount point, and the styles applied.
    urls = page.eval_on_selector_all(
        "a[href], link[href], script[src], form[action], [data-src]",
        "els => els.map(e => e.getAttribute('href') || e.getAttribute('src') || e.getAttribute('action')"
        " || e.getAttribute('data-src'))",
    )
    assert urls and all(url.startswith(("/jobs/dashboard/", "#")) for url in urls), urls
    assert page.evaluate("getComputedStyle(document.querySelector('header')).display") != "inline"

    created = httpx.post(
        site + "/jobs/api/v1/jobs", cookies=STAFF, json={"kind": "test.noop", "run_at": "2099-01-01T00:00:00Z"}
    )
    assert created.status_code == 201, created.text
    job_id = created.json()["id"]
    page.click("nav a:has-text('Jobs')")
    expect(page).to_have_url(site + "/jobs/dashboard/jobs")
    page.click(f"a[href='/jobs/dashboard/jobs/{job_id}']")
    expect(page).to_have_url(site + f"/jobs/dashboard/jobs/{job_id}")
    page.click("button:has-text('Pause')")
    expect(page.locator(".flash.ok")).to_contain_text(f"Job {job_id} paused")
    expect(page).to_have_url(site + f"/jobs/dashboard/jobs/{job_id}")
    page.click("button:has-text('Cancel')")
    expect(page.locator(".flash.ok")).to_contain_text("it is now cancelled")
    assert conn.execute("SELECT state FROM dygo_jobs WHERE id = %s", (job_id,)).fetchone()[0] == "cancelled"
    page.goto(site + "/jobs/dashboard/login")  # no sign-in page of dygo's own
    expect(page).to_have_url(site + "/jobs/dashboard/")
    page.goto(site + "/jobs/")
    expect(page).to_have_url(site + "/jobs/dashboard/")


def test_a_read_role_sees_the_dashboard_without_actions(site, page):  # noqa: F811
    page.context.add_cookies([{"name": "session", "value": "viewer-session", "url": site}])
    page.goto(site + "/jobs/dashboard/queues")
    expect(page.locator(".visitor")).to_contain_text("read")
    expect(page.locator("h1")).to_have_text(re.compile("Queues"))
    assert page.locator("form[method=post]").count() == 0


def test_running_opens_a_mounted_apps_pools_inside_the_parents_own_lifespan(module_db_url):
    from contextlib import asynccontextmanager

    from dygo.app import create_app, running
    from dygo.store.config import load_settings
    from dygo.store.registry import registry
    from fastapi import FastAPI

    from tests.conftest import TEST_CONFIG

    admin = create_app(load_settings(TEST_CONFIG), registry, module_db_url, authenticate=lambda request: "read")
    started = []

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        async with running(admin):
            started.append(True)
            yield

    parent = FastAPI(lifespan=lifespan)
    parent.mount("/ops/jobs", admin)

    async def visit() -> httpx.Response:
        async with parent.router.lifespan_context(parent):
            transport = httpx.ASGITransport(app=parent)
            async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as client:
                return await client.get("/ops/jobs/api/v1/queues")

    with ThreadPoolExecutor(1) as thread:  # a loop of its own: Playwright's sync API runs one in this thread
        reply = thread.submit(asyncio.run, visit()).result()
    assert started == [True]
    assert reply.status_code == 200, reply.text
    assert [queue["name"] for queue in reply.json()["queues"]][:1] == ["default"]


def test_a_mounted_app_without_authenticate_still_wants_its_tokens_under_the_prefix(module_db_url):
    from dygo.app import create_app, mount
    from dygo.store.config import load_settings
    from dygo.store.registry import registry
    from fastapi import FastAPI

    from tests.conftest import ADMIN_TOKEN, TEST_CONFIG

    settings = load_settings(TEST_CONFIG).model_copy(update={"api_tokens": (("admin", ADMIN_TOKEN),)})
    parent = FastAPI()
    mount(parent, "/ops", create_app(settings, registry, module_db_url))

    async def visit() -> list[object]:
        async with parent.router.lifespan_context(parent):
            transport = httpx.ASGITransport(app=parent)
            async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as client:
                anonymous = await client.get("/ops/api/v1/queues")
                signed = await client.get("/ops/api/v1/queues", headers={"Authorization": f"Bearer {ADMIN_TOKEN}"})
                page = await client.get("/ops/dashboard/jobs")
                return [anonymous.status_code, signed.status_code, page.status_code, page.headers.get("location")]

    with ThreadPoolExecutor(1) as thread:
        assert thread.submit(asyncio.run, visit()).result() == [
            401,
            200,
            303,
            "/ops/dashboard/login?next=%2Fops%2Fdashboard%2Fjobs",
        ]
