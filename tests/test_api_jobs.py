"""Jobs over HTTP: one job with its history, lists with keyset pagination, and every action."""

from __future__ import annotations

import time

import pytest
from dygo.store import admin, enqueue, enqueue_many
from dygo.store.admin import JobFilter

# One database and one `dygo serve` for the module; the tests that run a worker, or list or change every
# job, keep a database of their own.
pytestmark = pytest.mark.shared_database


def add(api, **body) -> int:
    response = api.admin.post("/api/v1/jobs", json={"kind": "test.noop", **body})
    assert response.status_code == 201, response.text
    return response.json()["id"]


def make_active(conn, job_id: int) -> None:
    """As a worker's claim leaves it: leased, attempt spent."""
    conn.execute(
        """UPDATE dygo_jobs SET state = 'active', attempt = attempt + 1, started_at = now(),
                    lease_owner = 'elsewhere:1:abc', lease_token = gen_random_uuid(),
                    lease_deadline = now() + interval '1 hour' WHERE id = %s""",
        (job_id,),
    )


@pytest.mark.own_database
def test_a_job_carries_its_result_and_every_failed_attempt(api, spawn):
    job_id = add(api, kind="test.fail", args={"times": 1})
    assert spawn("worker", "--once").wait() == 0
    retrying = api.reader.get(f"/api/v1/jobs/{job_id}").json()
    assert retrying["state"] in ("scheduled", "pending") and retrying["attempt"] == 1  # 50 ms backoff
    time.sleep(0.2)  # the 50 ms backoff
    assert spawn("worker", "--once").wait() == 0
    job = api.reader.get(f"/api/v1/jobs/{job_id}").json()
    assert (job["state"], job["attempt"], job["result"]) == ("succeeded", 2, "recovered")
    [failure] = job["errors"]
    assert failure["attempt"] == 1 and failure["error"] == "ValueError: failure number 1"
    assert "raise ValueError" in failure["traceback"] and failure["worker"] and failure["at"]
    assert job["finished_at"] and job["started_at"] and job["lease_owner"] is None


@pytest.mark.own_database
def test_list_filters_by_queue_kind_state_and_text(api, conn):
    noop = add(api)
    other = add(api, kind="test.record_sync", args={"seconds": 0.25})
    later = add(api, kind="test.record", args={"seconds": 9}, delay="1h")
    dead = add(api, kind="test.record", args={"seconds": 7})
    api.admin.post(f"/api/v1/jobs/{dead}/archive")
    conn.execute("UPDATE dygo_jobs SET last_error = 'SMTP refused the recipient' WHERE id = %s", (dead,))

    def ids(**params) -> list[int]:
        response = api.reader.get("/api/v1/jobs", params=params)
        assert response.status_code == 200, response.text
        return [job["id"] for job in response.json()["jobs"]]

    assert ids() == [dead, later, other, noop]
    assert ids(order="oldest") == [noop, other, later, dead]
    assert ids(queue="other") == [other]
    assert ids(kind="test.record") == [dead, later]
    assert ids(state="scheduled") == [later]
    assert ids(state="pending") == [other, noop]
    assert ids(state="dead") == [dead]
    assert ids(state="dead", queue="other") == []
    assert ids(q='"seconds": 9') == [later]
    assert ids(q="smtp REFUSED") == [dead]
    assert ids(q="100%") == []  # the pattern is matched literally
    listed = api.reader.get("/api/v1/jobs", params={"state": "dead"}).json()["jobs"][0]
    assert listed["state"] == "dead" and listed["last_error"] == "SMTP refused the recipient"
    assert "errors" not in listed and "result" not in listed  # the list is a summary


@pytest.mark.own_database
def test_pages_stay_stable_while_jobs_are_inserted(api, conn):
    original = [r.id for r in enqueue_many(conn, [{"kind": "test.noop", "args": {"n": n}} for n in range(25)])]
    for order, expected in (("newest", original[::-1]), ("oldest", original)):
        seen: list[int] = []
        cursor = None
        while True:
            params = {"limit": 10, "order": order, **({"cursor": cursor} if cursor else {})}
            page = api.reader.get("/api/v1/jobs", params=params).json()
            seen += [job["id"] for job in page["jobs"]]
            enqueue(conn, "test.noop", {"inserted": "while paging"})
            enqueue(conn, "test.noop", {"inserted": "while paging"})
            cursor = page["next_cursor"]
            if cursor is None:
                break
        assert len(seen) == len(set(seen))  # nothing twice
        if order == "newest":
            assert seen == expected  # newer rows never push older ones to the next page
        else:
            assert seen[:25] == expected  # what was there is all seen, in order; new rows come after
            assert all(job_id > original[-1] for job_id in seen[25:])


@pytest.mark.own_database
def test_filters_that_scan_look_at_a_window_of_ids_per_page(conn, monkeypatch):
    monkeypatch.setattr(admin, "SCAN_WINDOW", 10)
    jobs = enqueue_many(conn, [{"kind": "test.record" if n % 7 == 0 else "test.noop"} for n in range(40)])
    wanted = [j.id for n, j in enumerate(jobs) if n % 7 == 0]
    for order, expected in (("newest", wanted[::-1]), ("oldest", wanted)):
        found: list[int] = []
        pages = 0
        position = None
        while True:
            page = admin.list_jobs(conn, JobFilter(kind="test.record"), order=order, limit=2, position=position)
            found += [job["id"] for job in page.jobs]
            pages += 1
            position = page.next_position
            if position is None:
                break
        assert found == expected
        assert pages >= 4  # 40 ids, 10 per window: several (some short or empty) pages


@pytest.mark.own_database
def test_sparse_pending_jobs_are_found_through_their_own_index(conn, monkeypatch):
    monkeypatch.setattr(admin, "SCAN_WINDOW", 5)
    jobs = enqueue_many(conn, [{"kind": "test.noop"}] * 30)
    waiting = [jobs[1].id, jobs[3].id, jobs[4].id]  # old ones, far from the newest ids
    conn.execute("UPDATE dygo_jobs SET state = 'succeeded' WHERE NOT (id = ANY(%s))", (waiting,))
    for order, expected in (("newest", waiting[::-1]), ("oldest", waiting)):
        first = admin.list_jobs(conn, JobFilter(state="pending"), order=order, limit=2)
        rest = admin.list_jobs(conn, JobFilter(state="pending"), order=order, limit=2, position=first.next_position)
        assert [job["id"] for job in first.jobs + rest.jobs] == expected
        assert len(first.jobs) == 2 and rest.next_position is None


def test_a_bad_cursor_is_a_400(api):
    add(api)
    add(api)
    cursor = api.reader.get("/api/v1/jobs", params={"limit": 1}).json()["next_cursor"]
    assert cursor
    # A cursor is a position (its digits, as the OpenAPI document's pattern says): it continues either order.
    assert api.reader.get("/api/v1/jobs", params={"cursor": cursor, "order": "oldest"}).status_code == 200
    for params in (
        {"cursor": "not-a-cursor!"},
        {"cursor": "b2xkZXN0Ong"},
        {"cursor": "0"},
        {"cursor": "01"},
        {"cursor": ""},
        {"cursor": "9" * 19},
    ):  # beyond the pattern's (and any bigint's) digits
        response = api.reader.get("/api/v1/jobs", params=params)
        assert response.status_code == 400 and response.json()["error"]["code"] == "invalid_cursor"
    bad = api.reader.get("/api/v1/jobs", params={"limit": 501})
    assert bad.status_code == 422 and bad.json()["error"]["code"] == "invalid_request"
    bad = api.reader.get("/api/v1/jobs", params={"state": "sleeping"})
    assert bad.status_code == 422


def act(api, job_id: int, action: str):
    return api.admin.post(f"/api/v1/jobs/{job_id}/{action}")


def assert_refused(response, state: str) -> None:
    assert response.status_code == 409, response.text
    error = response.json()["error"]
    assert error["code"] == "invalid_transition" and error["details"]["state"] == state
    assert f"is {state}" in error["message"]


def test_run_now_moves_a_scheduled_job_to_now_and_refuses_any_other(api, conn):
    scheduled = add(api, delay="1h")
    job = act(api, scheduled, "run-now").json()
    assert job["state"] == "pending"
    assert conn.execute("SELECT run_at <= now() FROM dygo_jobs WHERE id = %s", (scheduled,)).fetchone()[0]
    assert_refused(act(api, scheduled, "run-now"), "pending")  # already due: nothing to expedite
    response = act(api, 987654, "run-now")
    assert response.status_code == 404 and response.json()["error"]["code"] == "job_not_found"


def test_pause_and_resume_keep_the_run_at(api):
    job_id = add(api, delay="1h")
    assert act(api, job_id, "pause").json()["state"] == "paused"
    assert_refused(act(api, job_id, "pause"), "paused")
    assert_refused(act(api, job_id, "run-now"), "paused")
    assert act(api, job_id, "resume").json()["state"] == "scheduled"
    assert_refused(act(api, job_id, "resume"), "scheduled")


def test_cancel_then_retry_gives_a_fresh_attempt_budget(api, conn):
    job_id = add(api)
    conn.execute(
        """UPDATE dygo_jobs SET attempt = 3, errors = '[{"attempt": 1, "at": "2030-01-01T00:00:00Z",
                    "error": "boom"}]' WHERE id = %s""",
        (job_id,),
    )
    cancelled = act(api, job_id, "cancel").json()
    assert cancelled["state"] == "cancelled" and cancelled["finished_at"]
    assert_refused(act(api, job_id, "cancel"), "cancelled")
    retried = act(api, job_id, "retry").json()
    assert (retried["state"], retried["attempt"], retried["finished_at"]) == ("pending", 0, None)
    assert retried["errors"][0]["error"] == "boom"  # the history is kept
    assert_refused(act(api, job_id, "retry"), "pending")


def test_archive_parks_pending_and_scheduled_jobs_in_dead_without_running(api):
    for body in ({}, {"delay": "1h"}):
        job_id = add(api, **body)
        job = act(api, job_id, "archive").json()
        assert (job["state"], job["attempt"], job["last_error"]) == ("dead", 0, "archived by an operator before it ran")
        assert job["finished_at"]
        assert_refused(act(api, job_id, "archive"), "dead")
    assert act(api, job_id, "retry").json()["state"] == "pending"


def test_active_jobs_cannot_be_cancelled_paused_archived_or_deleted(api, conn):
    job_id = add(api)
    make_active(conn, job_id)
    for action in ("cancel", "pause", "archive", "retry", "resume", "run-now"):
        assert_refused(act(api, job_id, action), "active")
    assert_refused(api.admin.delete(f"/api/v1/jobs/{job_id}"), "active")
    assert conn.execute("SELECT state FROM dygo_jobs WHERE id = %s", (job_id,)).fetchone()[0] == "active"


def test_delete_removes_a_finished_job(api):
    job_id = add(api)
    act(api, job_id, "archive")
    assert api.admin.delete(f"/api/v1/jobs/{job_id}").status_code == 204
    assert api.reader.get(f"/api/v1/jobs/{job_id}").status_code == 404
    assert api.admin.delete(f"/api/v1/jobs/{job_id}").status_code == 404


def test_retrying_a_job_whose_key_a_live_job_holds_is_a_clean_409(api, conn):
    first = add(api, idempotency_key="invoice-9")
    act(api, first, "archive")
    second = add(api, idempotency_key="invoice-9")  # the key is free again: first is dead
    assert second != first
    response = act(api, first, "retry")
    assert response.status_code == 409 and response.json()["error"]["code"] == "idempotency_conflict"
    assert conn.execute("SELECT state FROM dygo_jobs WHERE id = %s", (first,)).fetchone()[0] == "dead"


@pytest.mark.parametrize(
    "path", ["/api/v1/jobs/0", "/api/v1/jobs/99999999999999999999", "/api/v1/jobs/abc", "/api/v1/jobs/-1/retry"]
)
def test_impossible_job_ids_are_422_not_500(module_api, path):
    method = module_api.admin.post if path.endswith("retry") else module_api.admin.get
    response = method(path)
    assert response.status_code == 422 and response.json()["error"]["code"] == "invalid_request"


def test_delete_with_a_state_guard_deletes_only_a_job_in_that_state(api, conn):
    # The seed's Delete(id, state): an operator deletes the dead job they looked at, never one that
    # was retried (and is pending again) meanwhile.
    job_id = add(api)
    act(api, job_id, "archive")  # dead
    refused = api.admin.delete(f"/api/v1/jobs/{job_id}", params={"state": "pending"})
    assert refused.status_code == 409 and refused.json()["error"]["code"] == "invalid_transition"
    assert "is dead" in refused.json()["error"]["message"]
    assert api.admin.delete(f"/api/v1/jobs/{job_id}", params={"state": "bogus"}).status_code == 422
    assert api.admin.delete(f"/api/v1/jobs/{job_id}", params={"state": "dead"}).status_code == 204
    scheduled = add(api, delay="1h")
    assert api.admin.delete(f"/api/v1/jobs/{scheduled}", params={"state": "pending"}).status_code == 409
    assert api.admin.delete(f"/api/v1/jobs/{scheduled}", params={"state": "scheduled"}).status_code == 204


@pytest.mark.own_database
def test_a_job_shows_when_its_last_attempt_failed(api, spawn):
    job_id = add(api, kind="test.fail", args={"times": 1})
    assert api.reader.get(f"/api/v1/jobs/{job_id}").json()["failed_at"] is None
    assert spawn("worker", "--once").wait() == 0
    job = api.reader.get(f"/api/v1/jobs/{job_id}").json()
    from datetime import datetime

    assert job["failed_at"] is not None
    assert datetime.fromisoformat(job["failed_at"]) == datetime.fromisoformat(job["errors"][-1]["at"])
