"""POST /api/v1/events/{key} and its signed callback URL (app/events.py): a real `dygo serve`, and real
workers whose jobs wait for the events."""

from __future__ import annotations

from urllib.parse import quote

from dygo.store import enqueue

from tests.conftest import dygo_env
from tests.test_steps_events import waiting
from tests.test_worker import wait_for_state

SECRET = "a-callback-secret-for-tests-0123456789"


def test_an_admin_emits_an_event_and_the_waiting_job_resumes_with_its_payload(conn, api, spawn):
    job = enqueue(conn, "test.wait_event", {"key": "order:42"})
    spawn("worker").wait_for_line("started")
    waiting(conn, job.id)
    [_, wait] = api.reader.get(f"/api/v1/jobs/{job.id}/steps").json()["steps"]
    assert {k: wait[k] for k in ("key", "op", "state", "waits_for", "wake_at")} == {
        "key": "approval#1",
        "op": "event",
        "state": "waiting",
        "waits_for": "order:42",
        "wake_at": None,
    }
    response = api.admin.post("/api/v1/events/order:42", json={"approved": True})
    assert response.status_code == 200, response.text
    assert response.json() == {"woken": 1, "duplicate": False}
    assert wait_for_state(conn, job.id, "succeeded")["result"]["payload"] == {"approved": True}

    again = api.admin.post("/api/v1/events/order:42", json={"approved": False})
    assert again.json() == {"woken": 0, "duplicate": True}
    assert conn.execute("SELECT payload FROM dygo_events WHERE key = 'order:42'").fetchone()[0] == {"approved": True}


def test_an_emit_without_a_body_has_a_null_payload(conn, api):
    assert api.admin.post("/api/v1/events/ping").json() == {"woken": 0, "duplicate": False}
    assert conn.execute("SELECT payload, emitted_at IS NOT NULL FROM dygo_events WHERE key = 'ping'").fetchone() == (
        None,
        True,
    )


def test_emitting_needs_an_admin_token_and_a_valid_key(api):
    assert api.anon.post("/api/v1/events/k", json=1).status_code == 401
    refused = api.reader.post("/api/v1/events/k", json=1)
    assert refused.status_code == 403 and refused.json()["error"]["code"] == "forbidden"
    too_long = api.admin.post(f"/api/v1/events/{'k' * 201}", json=1)
    assert too_long.status_code == 422
    control = api.admin.post("/api/v1/events/" + quote("a\tb"), json=1)
    assert control.status_code == 422
    assert control.json()["error"] == {
        "code": "invalid_event",
        "message": "key: an event key may not contain '/' or control characters, got 'a\\tb'",
        "details": {"field": "key"},
    }


def test_a_signed_callback_url_emits_without_a_token_and_a_bad_signature_is_refused(conn, db_url, serve, spawn):
    api = serve(DYGO_SECRET_KEY=SECRET)
    spawn("worker", env=dygo_env(db_url, DYGO_SECRET_KEY=SECRET)).wait_for_line("started")
    made = enqueue(conn, "test.callback_url", {"key": "invoice:7"})
    url = wait_for_state(conn, made.id, "succeeded")["result"]
    assert url.startswith("/api/v1/events/invoice:7/callback?sig=")
    job = enqueue(conn, "test.wait_event", {"key": "invoice:7"})
    waiting(conn, job.id)

    forged = api.anon.post(url[:-3] + ("AAA" if not url.endswith("AAA") else "BBB"), json="forged")
    assert forged.status_code == 403 and forged.json()["error"]["code"] == "bad_signature"
    other_key = api.anon.post(url.replace("invoice:7", "invoice:8"), json="forged")
    assert other_key.status_code == 403
    assert api.anon.post("/api/v1/events/invoice:7/callback", json="no sig").status_code == 422
    assert conn.execute("SELECT emitted_at FROM dygo_events WHERE key = 'invoice:7'").fetchone() == (None,)

    response = api.anon.post(url, json={"paid": 120})
    assert response.status_code == 200, response.text
    assert response.json() == {"woken": 1, "duplicate": False}
    assert wait_for_state(conn, job.id, "succeeded")["result"]["payload"] == {"paid": 120}


def test_a_server_without_a_secret_key_refuses_every_callback(api):
    response = api.anon.post("/api/v1/events/k/callback?sig=abc", json=1)
    assert response.status_code == 403
    assert response.json()["error"]["code"] == "callbacks_disabled"
    assert "DYGO_SECRET_KEY is not set" in response.json()["error"]["message"]


def test_the_openapi_document_has_both_endpoints_and_the_callback_needs_no_token(api):
    paths = api.anon.get("/openapi.json").json()["paths"]
    emit = paths["/api/v1/events/{key}"]["post"]
    callback = paths["/api/v1/events/{key}/callback"]["post"]
    assert emit["security"] == [{"bearer": []}] and "security" not in callback
    assert set(emit["responses"]) >= {"200", "401", "403", "422"}
    assert set(callback["responses"]) >= {"200", "403", "422"}
    assert [p["name"] for p in callback["parameters"]] == ["key", "sig"]
