"""`dygo events emit` as a real subprocess against a real database, with a real worker's job waiting."""

from __future__ import annotations

from dygo.store import enqueue

from tests.test_cli_jobs import dygo
from tests.test_steps_events import waiting
from tests.test_worker import wait_for_state


def test_events_emit_wakes_the_waiting_job_with_its_json_payload(conn, db_url, spawn):
    job = enqueue(conn, "test.wait_event", {"key": "order:42"})
    spawn("worker").wait_for_line("started")
    waiting(conn, job.id)
    emitted = dygo(db_url, "events", "emit", "order:42", "--payload", '{"approved": true}')
    assert emitted.returncode == 0, emitted.stderr
    assert emitted.stdout.strip() == "emitted event 'order:42': 1 waiting job(s) woken"
    assert wait_for_state(conn, job.id, "succeeded")["result"]["payload"] == {"approved": True}

    again = dygo(db_url, "events", "emit", "order:42")
    assert again.returncode == 0
    assert "was emitted before: the first emit wins" in again.stdout


def test_events_emit_refuses_a_bad_payload_or_key(db_url):
    bad_json = dygo(db_url, "events", "emit", "k", "--payload", "{not json")
    assert bad_json.returncode == 2 and "--payload: must be JSON" in bad_json.stderr
    bad_key = dygo(db_url, "events", "emit", "a/b")
    assert bad_key.returncode == 1
    assert bad_key.stderr.strip() == "dygo: key: an event key may not contain '/' or control characters, got 'a/b'"


def test_jobs_steps_shows_an_event_wait_with_its_key_and_state(conn, db_url, spawn):
    job = enqueue(conn, "test.wait_event", {"key": "order:43", "timeout": "1d"})
    spawn("worker").wait_for_line("started")
    waiting(conn, job.id)
    shown = dygo(db_url, "jobs", "steps", str(job.id))
    assert shown.returncode == 0, shown.stderr
    [line] = [line for line in shown.stdout.splitlines() if "approval#1" in line]
    assert line.split()[1:3] == ["approval#1", "event"]
    assert "waiting for event 'order:43' until 20" in line
