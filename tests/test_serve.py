"""The minimal `dygo serve`: enqueue over HTTP with clear 422s, read a job back, health."""

from __future__ import annotations

import socket

import httpx
import pytest

from tests.conftest import DygoProcess, wait_until

# One database and one `dygo serve` for the module: each test counts or reads only the rows it made.
pytestmark = pytest.mark.shared_database


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def api(module_db_url):
    port = free_port()
    process = DygoProcess(module_db_url, "serve", "--port", str(port))
    client = httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=10)

    def healthy():
        try:
            return client.get("/healthz").status_code == 200
        except httpx.TransportError:
            return False

    try:
        process.wait_for_line("dygo serve: http://127.0.0.1")
        wait_until(healthy, message="serve to answer /healthz")
        yield client
    finally:
        client.close()
        process.stop()


def test_enqueue_over_http_then_read_the_job_back(api, conn):
    response = api.post(
        "/api/v1/jobs",
        json={"kind": "test.record", "args": {"seconds": 1.5}, "priority": 3, "delay": "1m", "meta": {"via": "http"}},
    )
    assert response.status_code == 201, response.text
    body = response.json()
    assert body["deduplicated"] is False
    job = api.get(f"/api/v1/jobs/{body['id']}").json()
    assert (job["kind"], job["queue"], job["state"], job["priority"]) == ("test.record", "default", "scheduled", 3)
    assert job["args"] == {"seconds": 1.5} and job["meta"] == {"via": "http"}
    assert job["errors"] == [] and job["attempt"] == 0


def test_idempotency_key_over_http_answers_200_with_the_same_job(api):
    first = api.post("/api/v1/jobs", json={"kind": "test.noop", "idempotency_key": "k-1"})
    again = api.post("/api/v1/jobs", json={"kind": "test.noop", "idempotency_key": "k-1"})
    assert (first.status_code, again.status_code) == (201, 200)
    assert again.json()["id"] == first.json()["id"] and again.json()["deduplicated"] is True


@pytest.mark.parametrize(
    ("body", "code", "fragment"),
    [
        ({"kind": "no.such"}, "unknown_kind", "not registered"),
        ({"kind": "test.noop", "queue": "nope"}, "unknown_queue", "'nope' is not configured"),
        ({"kind": "test.record", "args": {"seconds": "soon"}}, "invalid_args", "invalid"),
        ({"kind": "test.noop", "priorty": 1}, "invalid_request", "invalid"),
        ({"kind": "test.noop", "delay": "tomorrow"}, "invalid_duration", "not a duration"),
        ({"args": {}}, "invalid_request", "invalid"),
    ],
)
def test_bad_enqueue_is_a_422_naming_the_problem(api, conn, body, code, fragment):
    before = conn.execute("SELECT count(*) FROM dygo_jobs").fetchone()[0]
    response = api.post("/api/v1/jobs", json=body)
    assert response.status_code == 422
    error = response.json()["error"]
    assert error["code"] == code and fragment in error["message"]
    assert conn.execute("SELECT count(*) FROM dygo_jobs").fetchone()[0] == before


def test_invalid_args_details_name_the_field(api):
    error = api.post("/api/v1/jobs", json={"kind": "test.record", "args": {"seconds": "x"}}).json()["error"]
    assert error["details"][0]["loc"] == ["seconds"]


def test_malformed_json_is_a_400_not_a_stack_trace(api):
    response = api.post("/api/v1/jobs", content=b"{not json", headers={"content-type": "application/json"})
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "invalid_json"


def test_unknown_job_is_404(api):
    response = api.get("/api/v1/jobs/999999")
    assert response.status_code == 404
    assert response.json()["error"] == {"code": "job_not_found", "message": "no job with id 999999", "details": None}


def test_health_and_openapi(api):
    assert api.get("/healthz").json() == {"status": "ok"}
    assert "/api/v1/jobs" in api.get("/openapi.json").json()["paths"]
