"""A job's steps over HTTP: GET /api/v1/jobs/{id}/steps and "retry from this step", with real workers."""

from __future__ import annotations

from dygo.store import enqueue

from tests.test_api_jobs import make_active
from tests.test_steps import effects, steps_of


def test_a_job_s_steps_are_listed_in_call_order_and_a_sleep_shows_on_the_job(api, conn, spawn):
    job = enqueue(conn, "test.steps_sleep", {"seconds": 3600})
    assert spawn("worker", "--once").wait() == 0
    answer = api.reader.get(f"/api/v1/jobs/{job.id}/steps")
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert body["job_id"] == job.id
    one, nap = body["steps"]
    assert {k: one[k] for k in ("key", "name", "occurrence", "op", "seq", "attempt", "result", "wake_at")} == {
        "key": "one#1",
        "name": "one",
        "occurrence": 1,
        "op": "step",
        "seq": 1,
        "attempt": 1,
        "result": 1,
        "wake_at": None,
    }
    assert one["recorded_at"] and one["duration"] >= 0
    assert (nap["key"], nap["op"], nap["seq"], nap["duration"], nap["result"]) == ("cool-off#1", "sleep", 2, 3600, None)
    job_body = api.reader.get(f"/api/v1/jobs/{job.id}").json()
    assert job_body["state"] == "scheduled" and job_body["attempt"] == 0
    assert job_body["sleeping"] == {"step": "cool-off#1", "wake_at": nap["wake_at"]}

    missing = api.reader.get("/api/v1/jobs/999999999/steps")
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "job_not_found"
    plain = enqueue(conn, "test.noop", {})
    assert api.reader.get(f"/api/v1/jobs/{plain.id}/steps").json() == {"job_id": plain.id, "steps": []}


def test_retry_from_a_step_forgets_it_and_the_later_ones_and_reruns_only_those(api, conn, spawn):
    job = enqueue(conn, "test.steps_abc", {})
    assert spawn("worker", "--once").wait() == 0
    assert api.reader.get(f"/api/v1/jobs/{job.id}").json()["state"] == "dead"

    refused = api.reader.post(f"/api/v1/jobs/{job.id}/steps/b%231/retry")
    assert refused.status_code == 403  # an admin action
    unknown = api.admin.post(f"/api/v1/jobs/{job.id}/steps/z%231/retry")
    assert unknown.status_code == 404 and unknown.json()["error"]["code"] == "step_not_found"

    answer = api.admin.post(f"/api/v1/jobs/{job.id}/steps/b%231/retry")
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert body["forgotten"] == ["b#1", "c#1"] and body["job"]["state"] == "pending"
    assert set(steps_of(conn, job.id)) == {"a#1"}

    assert spawn("worker", "--once").wait() == 0
    done = api.reader.get(f"/api/v1/jobs/{job.id}").json()
    assert (done["state"], done["result"]) == ("succeeded", [1, 2, 2])
    assert effects(conn, job.id) == {"a": 1, "b": 2, "c": 2, "check": 2}


def test_retry_from_a_step_of_a_scheduled_job_only_forgets_and_an_active_job_is_refused(api, conn, spawn):
    job = enqueue(conn, "test.steps_sleep", {"seconds": 3600})
    assert spawn("worker", "--once").wait() == 0
    answer = api.admin.post(f"/api/v1/jobs/{job.id}/steps/cool-off%231/retry")
    assert answer.status_code == 200, answer.text
    assert answer.json()["forgotten"] == ["cool-off#1"] and answer.json()["job"]["state"] == "scheduled"
    assert set(steps_of(conn, job.id)) == {"one#1"}

    make_active(conn, job.id)
    refused = api.admin.post(f"/api/v1/jobs/{job.id}/steps/one%231/retry")
    assert refused.status_code == 409 and "job " + str(job.id) + " is active" in refused.json()["error"]["message"]
    assert refused.json()["error"]["details"]["state"] == "active"
    assert set(steps_of(conn, job.id)) == {"one#1"}
