"""Bearer tokens on every route, roles, when `dygo serve` refuses to start, and tokens never logged."""

from __future__ import annotations

import re

import pytest

from tests.conftest import ADMIN_TOKEN, READ_TOKEN, dygo_env

SAMPLE_PATH_VALUES = {"job_id": "1", "name": "default"}


def every_api_operation(api) -> list[tuple[str, str]]:
    """(method, path) of every operation the OpenAPI document lists under /api/ with the bearer scheme, path
    parameters filled. The others (events' callback URLs) carry a signature instead: they have tests of their
    own (tests/test_api_events.py), and test_only_callback_urls_go_without_a_token checks there are no more."""
    operations = []
    for path, methods in api.anon.get("/openapi.json").json()["paths"].items():
        if path.startswith("/api/"):
            concrete = re.sub(r"\{(\w+)\}", lambda m: SAMPLE_PATH_VALUES.get(m.group(1), "x"), path)
            operations += [(method.upper(), concrete) for method, op in methods.items() if "security" in op]
    return operations


def test_only_callback_urls_go_without_a_token(module_api):
    paths = module_api.anon.get("/openapi.json").json()["paths"]
    open_operations = [
        (method, path)
        for path, methods in paths.items()
        if path.startswith("/api/")
        for method, operation in methods.items()
        if "security" not in operation
    ]
    assert open_operations == [("post", "/api/v1/events/{key}/callback")]
    refused = module_api.anon.post("/api/v1/events/x/callback", params={"sig": "forged"}, json=1)
    assert refused.status_code == 403  # no token needed, but the signature is checked


def test_the_document_lists_every_area(module_api):
    paths = {path for _, path in every_api_operation(module_api)}
    for expected in (
        "/api/v1/jobs",
        "/api/v1/jobs/batch",
        "/api/v1/jobs/1/run-now",
        "/api/v1/queues/default/purge",
        "/api/v1/stats",
        "/api/v1/workers",
        "/api/v1/nuke",
    ):
        assert expected in paths


def test_every_api_route_refuses_a_missing_or_wrong_token(module_api):
    for n, (method, path) in enumerate(every_api_operation(module_api)):
        # Wrong tokens come from a different (proxied) client address each, or the throttle locks one out.
        guesser = {"X-Forwarded-For": f"198.51.100.{n + 1}"}
        for headers in (
            {},
            {"Authorization": "Bearer wrong-token-0123456789abc", **guesser},
            {"Authorization": f"Basic {ADMIN_TOKEN}"},
            {"Authorization": "Bearer"},
        ):
            response = module_api.anon.request(method, path, headers=headers, params={"older_than": "1d"})
            assert response.status_code == 401, (method, path, headers, response.text)
            assert response.json()["error"]["code"] == "unauthorized"
            assert response.headers["www-authenticate"].startswith("Bearer")


def test_a_read_only_token_reads_but_never_writes(module_api):
    for method, path in every_api_operation(module_api):
        response = module_api.reader.request(method, path, params={"older_than": "1d"})
        if method == "GET":
            assert response.status_code not in (401, 403), (method, path, response.text)
        else:
            assert response.status_code == 403, (method, path, response.text)
            assert response.json()["error"]["code"] == "forbidden"


def test_an_admin_token_is_let_through_everywhere(module_api):
    for method, path in every_api_operation(module_api):
        if path.endswith("/nuke"):
            continue  # it would empty the shared database; its own tests cover it
        response = module_api.admin.request(method, path, params={"older_than": "1d"})
        assert response.status_code not in (401, 403), (method, path, response.text)


def test_health_and_documentation_need_no_token(module_api):
    for path in ("/healthz", "/readyz", "/openapi.json", "/docs"):
        assert module_api.anon.get(path).status_code == 200, path


def test_unauthenticated_requests_are_refused_before_the_body_is_read(module_api):
    response = module_api.anon.post("/api/v1/jobs", content=b"x" * (2 * 1024 * 1024))
    assert response.status_code == 401


def test_without_tokens_development_on_localhost_is_open(serve):
    api = serve(tokens=False)
    assert api.anon.get("/api/v1/queues").status_code == 200
    assert "auth off" in "".join(api.process.lines)


@pytest.mark.parametrize(
    ("args", "env", "fragment"),
    [
        (("--env", "production"), {}, "environment production: the API must be protected"),
        (("--env", "test"), {}, "environment test: the API must be protected"),
        (("--host", "0.0.0.0"), {}, "host 0.0.0.0: binding beyond localhost"),
        ((), {"PORT": "0"}, "host 0.0.0.0: binding beyond localhost"),  # Heroku-style: PORT set binds 0.0.0.0
        (("--env", "production"), {"DYGO_ADMIN_TOKEN": "short"}, "at least 16 characters"),
    ],
)
def test_serve_refuses_to_start_unprotected(spawn, db_url, args, env, fragment):
    process = spawn("serve", *args, env=dygo_env(db_url, **env))
    assert process.wait() == 2
    assert fragment in process.stderr()
    assert "short" not in process.stderr().replace("at least", "")


def test_production_with_tokens_starts_and_enforces_them(serve):
    api = serve("--env", "production")
    assert "bearer tokens: 1 admin, 1 read-only" in "".join(api.process.lines)
    assert api.anon.get("/api/v1/queues").status_code == 401
    assert api.reader.get("/api/v1/queues").status_code == 200


def test_tokens_never_reach_the_logs(serve):
    api = serve("--env", "production")
    api.admin.get("/api/v1/queues")
    api.reader.post("/api/v1/jobs", json={"kind": "test.noop"})
    api.anon.get("/api/v1/queues", headers={"Authorization": "Bearer not-the-token-0123456789"})
    api.admin.get("/api/v1/jobs/12345")
    api.process.signal(2)
    api.process.wait()
    logs = "".join(api.process.lines) + api.process.stderr()
    assert "GET /api/v1/queues" in logs  # the access log is there...
    for token in (ADMIN_TOKEN, READ_TOKEN, "not-the-token-0123456789"):
        assert token not in logs  # ...and no token in it
