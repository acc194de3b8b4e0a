"""Issue 15 in a real headless Chromium: what another site's page can do to `dygo serve`, framing, the
dashboard under its Content-Security-Policy, and API docs that load nothing from another origin."""

from __future__ import annotations

import http.server
import re
import threading
from collections.abc import Iterator

import pytest

from tests.conftest import free_port, wait_until
from tests.test_dashboard import CHROMIUM, NO_BROWSER, browser_context, expect, log_in, page  # noqa: F401, F811

pytestmark = pytest.mark.skipif(not CHROMIUM.exists(), reason=NO_BROWSER)


class SiteServer:
    """Another web site on this machine: serves one HTML page at /."""

    def __init__(self, host: str) -> None:
        self.html = ""
        owner = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802
                body = owner.html.encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/html; charset=utf-8")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args) -> None:
                pass

        self.port = free_port()
        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self.url = f"http://{host}:{self.port}/"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def other_site() -> Iterator[SiteServer]:
    site = SiteServer("localhost")  # the service is 127.0.0.1: localhost is another site to a browser
    yield site
    site.close()


def queue_paused(api, name: str) -> bool:
    return next(q for q in api.admin.get("/api/v1/queues").json()["queues"] if q["name"] == name)["paused"]


def test_another_sites_page_cannot_drive_development_mode(serve, page, other_site):  # noqa: F811
    api = serve(tokens=False)  # development on localhost: no token, so only the Origin rules stand in the way
    other_site.html = f"""<!doctype html><title>evil</title>
<form id="nuke" method="post" action="{api.url}/api/v1/queues/default/pause"><input name="x" value="1"></form>
<script>
fetch("{api.url}/api/v1/queues/other/pause", {{method: "POST", mode: "no-cors"}})
  .finally(() => {{ document.title = "fetched"; document.getElementById("nuke").submit(); }});
</script>"""
    with page.expect_response(lambda r: r.url.endswith("/api/v1/queues/default/pause")) as reply:
        page.goto(other_site.url)
    assert reply.value.status == 403
    assert "cross_site_request" in reply.value.text()
    assert not queue_paused(api, "default") and not queue_paused(api, "other")


def test_the_signed_in_dashboard_cannot_be_framed(serve, page, other_site):  # noqa: F811
    api = serve()
    log_in(page, api)
    other_site.html = f'<!doctype html><title>framer</title><iframe src="{api.url}/dashboard/queues"></iframe>'
    page.goto(other_site.url)
    wait_until(lambda: len(page.frames) == 2, message="the frame to be created")
    frame = page.frames[1]
    page.wait_for_timeout(500)
    assert frame.locator("button").count() == 0  # no admin buttons inside someone else's page
    assert "Queues" not in frame.content()


def test_the_dashboard_works_under_its_content_security_policy(serve, page):  # noqa: F811
    api = serve()
    violations: list[str] = []
    page.on(
        "console",
        lambda message: (
            violations.append(message.text)
            if "Content Security Policy" in message.text or "Refused to" in message.text
            else None
        ),
    )
    for _ in range(3):
        assert api.admin.post("/api/v1/jobs", json={"kind": "test.noop", "delay": "1h"}).status_code == 201
    log_in(page, api)
    expect(page.locator("figure[data-chart=minutes]")).to_be_visible()
    assert api.admin.post("/api/v1/jobs", json={"kind": "test.noop", "delay": "1h"}).status_code == 201
    expect(page.locator("#live")).to_contain_text("4", timeout=10_000)  # the live refresh still runs
    page.goto(f"{api.url}/dashboard/jobs")
    page.check("#tick-all")  # the jobs page's script still runs
    expect(page.locator("input[name=id][form=bulk]:checked")).to_have_count(4)
    assert violations == []


@pytest.mark.parametrize(("path", "rendered"), [("/docs", ".opblock-summary-path"), ("/redoc", "[data-section-id]")])
def test_api_docs_load_only_from_the_service_itself(serve, page, path, rendered):  # noqa: F811
    api = serve("--env", "production")
    requested: list[tuple[str, str]] = []
    loaded: list[str] = []
    blocked: dict[str, str | None] = {}
    page.on("request", lambda request: requested.append((request.url, request.resource_type)))
    page.on("response", lambda response: loaded.append(response.url))
    page.on("requestfailed", lambda request: blocked.update({request.url: request.failure}))
    page.goto(f"{api.url}{path}")
    expect(page.locator(rendered).first).to_be_visible(timeout=20_000)
    expect(page.get_by_text(re.compile(r"/api/v1/jobs")).first).to_be_attached()
    page.wait_for_timeout(300)
    own = (api.url, "data:", "blob:")
    # No script, stylesheet or font from anywhere else; ReDoc's bundle points an <img> at its vendor's
    # logo, which the page's Content-Security-Policy blocks: nothing from another origin is loaded.
    assert [url for url, kind in requested if not url.startswith(own) and kind != "image"] == []
    assert [url for url in loaded if not url.startswith(own)] == []
    for url, _ in requested:
        if not url.startswith(own):
            assert blocked.get(url) == "csp", (url, blocked)
