"""Workflows and batches over HTTP: create (all or nothing, 422 naming what is wrong), idempotency, list, read,
wait for the end, cancel, act on a node, and batches that take more jobs until sealed. Jobs run in a real
worker; what moves a workflow is the database, in the transaction that ends each job."""

from __future__ import annotations

import threading
import time

import pytest

from tests.conftest import wait_until

# One database and one `dygo serve` for the module; the tests that run a worker, or list every workflow,
# keep a database of their own.
pytestmark = pytest.mark.shared_database


@pytest.fixture
def worker(spawn):
    process = spawn("worker", "--poll-interval", "60s")
    process.wait_for_line("started")
    return process


def create(api, body: dict, status: int = 201, **headers: str) -> dict:
    response = api.admin.post("/api/v1/workflows", json=body, headers=headers)
    assert response.status_code == status, response.text
    return response.json()


def workflow(api, workflow_id: int, **params: str) -> dict:
    response = api.reader.get(f"/api/v1/workflows/{workflow_id}", params=params)
    assert response.status_code == 200, response.text
    return response.json()


def node_states(shown: dict) -> dict[str, str]:
    return {node["name"]: node["state"] for node in shown["nodes"]}


def rows(conn) -> tuple[int, int]:
    """How many workflows and jobs the database holds."""
    return conn.execute("SELECT (SELECT count(*) FROM dygo_workflows), (SELECT count(*) FROM dygo_jobs)").fetchone()


def refusal(response, status: int = 422) -> dict:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert error["code"] and error["message"]
    return error


ORDER = {
    "name": "order",
    "chain": True,
    "nodes": [
        {"name": "charge", "kind": "test.record"},
        {"name": "ship", "kind": "test.record", "args": {"seconds": 0.2}},
        {"name": "mail", "kind": "test.record"},
    ],
}


@pytest.mark.own_database
def test_a_chain_runs_node_after_node_and_the_wait_answers_when_it_ends(api, worker):
    created = create(api, ORDER)
    assert created["deduplicated"] is False
    assert set(created["nodes"]) == set(created["jobs"]) == {"charge", "ship", "mail"}
    asked = time.monotonic()
    shown = workflow(api, created["id"], wait="20s")
    assert time.monotonic() - asked < 10  # woken by the end, not by the wait running out
    assert shown["state"] == "succeeded" and shown["finished_at"] and shown["nodes_left"] == 0
    assert node_states(shown) == {"charge": "succeeded", "ship": "succeeded", "mail": "succeeded"}
    assert [(edge["upstream"], edge["downstream"], edge["state"]) for edge in shown["edges"]] == [
        ("charge", "ship", "met"),
        ("ship", "mail", "met"),
    ]
    # The result: each node nothing runs after, by name; the jobs ran one after the other.
    assert shown["result"] == {"mail": {"attempt": 1, "retry": False}}
    jobs = {name: api.reader.get(f"/api/v1/jobs/{job_id}").json() for name, job_id in created["jobs"].items()}
    assert jobs["charge"]["finished_at"] <= jobs["ship"]["started_at"] <= jobs["ship"]["finished_at"]
    assert jobs["ship"]["finished_at"] <= jobs["mail"]["started_at"]
    # A job of a workflow names its node and workflow, so a client can find the one from the other.
    assert (jobs["ship"]["node_id"], jobs["ship"]["workflow_id"], jobs["ship"]["node"]) == (
        created["nodes"]["ship"],
        created["id"],
        "ship",
    )


def test_a_job_waits_for_its_node_and_the_counts_and_lists_say_so(api, conn):
    def counts() -> dict[str, int]:
        return api.reader.get("/api/v1/queues/default").json()["counts"]

    def waiting() -> set[int]:
        jobs = api.reader.get("/api/v1/jobs", params={"state": "waiting", "limit": 500}).json()["jobs"]
        return {job["id"] for job in jobs}

    before, waiting_before = counts(), waiting()
    created = create(api, ORDER)
    ship = api.reader.get(f"/api/v1/jobs/{created['jobs']['ship']}").json()
    assert ship["state"] == "waiting"
    queue = counts()
    assert (queue["pending"] - before["pending"], queue["waiting"] - before["waiting"]) == (1, 2)
    assert waiting() - waiting_before == {created["jobs"]["ship"], created["jobs"]["mail"]}
    shown = workflow(api, created["id"])
    ship_node = next(node for node in shown["nodes"] if node["name"] == "ship")
    assert ship_node["wait"] == "waiting on 1 of 1: charge" and ship_node["waiting_on"] == ["charge"]
    assert api.admin.post(f"/api/v1/workflows/{created['id']}/nodes/charge/skip").status_code == 200
    # Skipping is never a failure: the nodes after a skipped node are skipped, and the workflow succeeds.
    shown = workflow(api, created["id"])
    assert node_states(shown) == {"charge": "skipped", "ship": "skipped", "mail": "skipped"}
    assert shown["state"] == "succeeded"
    queue = counts()
    assert (queue["skipped"] - before["skipped"], queue["waiting"]) == (3, before["waiting"])
    assert api.reader.get("/api/v1/jobs", params={"state": "skipped"}).json()["jobs"]


@pytest.mark.own_database
def test_fan_out_and_fan_in_run_a_map_node_between_two_single_jobs(api, worker):
    created = create(
        api,
        {
            "name": "album",
            "nodes": [
                {"name": "start", "kind": "test.record"},
                {"name": "resize", "kind": "test.record", "map": [{} for _ in range(12)], "after": ["start"]},
                {"name": "build", "kind": "test.record", "after": {"resize": None, "start": "cancel"}},
            ],
        },
    )
    assert set(created["jobs"]) == {"start", "build"}  # a group has many jobs: none is its own
    shown = workflow(api, created["id"], wait="20s")
    assert shown["state"] == "succeeded"
    resize = next(node for node in shown["nodes"] if node["name"] == "resize")
    assert (resize["is_group"], resize["jobs"], resize["succeeded"], resize["jobs_left"]) == (True, 12, 12, 0)


@pytest.mark.parametrize(
    ("nodes", "named"),
    [
        (
            [
                {"name": "a", "kind": "test.noop", "after": ["c"]},
                {"name": "b", "kind": "test.noop", "after": ["a"]},
                {"name": "c", "kind": "test.noop", "after": ["b"]},
            ],
            "cycle: a -> c -> b -> a",
        ),
        ([{"name": "a", "kind": "test.noop", "after": ["nope"]}], "node 'a' runs after 'nope', which is not a node"),
        ([{"name": "a", "kind": "test.noop"}, {"name": "a", "kind": "test.noop"}], "node 'a' is defined twice"),
        ([{"name": "a", "kind": "test.noop", "args": {}, "map": [{}]}], "node 'a': give args"),
        ([{"name": "a", "kind": "test.noop", "allow_failures": 1}], "node 'a': allow_failures applies to a map"),
        ([{"name": "a", "kind": "test.noop", "map": [{}], "allow_failures": 1.5}], "node 'a': allow_failures"),
        ([{"name": "a", "kind": "test.record", "args": {"seconds": "soon"}}], "node 'a' job 0: args for kind"),
        ([{"name": "a", "kind": "no.such.kind"}], "node 'a': kind 'no.such.kind' is not registered"),
    ],
    ids=[
        "cycle",
        "unknown-node",
        "repeated-name",
        "args-and-map",
        "allow-failures-single",
        "allow-failures-1.5",
        "bad-args",
        "unknown-kind",
    ],
)
def test_a_workflow_that_cannot_be_built_is_refused_naming_what_is_wrong(api, conn, nodes, named):
    before = rows(conn)
    error = refusal(api.admin.post("/api/v1/workflows", json={"name": "bad", "nodes": nodes}))
    assert named in error["message"], error
    assert rows(conn) == before


def test_an_empty_group_is_refused_for_the_options_or_kind_its_jobs_would_be_refused_for(api, conn):
    before = rows(conn)
    batch = {"name": "empty", "kind": "test.noop", "args": [], "open": True}
    for wrong, code in (({"priority": 5000}, "invalid_option"), ({"kind": "no.such.kind"}, "unknown_kind")):
        error = refusal(api.admin.post("/api/v1/batches", json={**batch, **wrong}))
        assert error["code"] == code and error["message"].startswith("node 'jobs': "), error
    node = {"name": "fan", "kind": "test.noop", "map": [], "queue": "nowhere"}
    error = refusal(api.admin.post("/api/v1/workflows", json={"name": "empty", "nodes": [node]}))
    assert error["code"] == "unknown_queue" and error["message"].startswith("node 'fan': "), error
    assert rows(conn) == before
    # The same with good options is a batch opened empty, which jobs can join later.
    assert api.admin.post("/api/v1/batches", json={**batch, "priority": 5}).status_code == 201


def test_a_bad_policy_is_refused_naming_the_field(api):
    body = {"name": "bad", "nodes": [{"name": "a", "kind": "test.noop", "on_failure": "retry"}]}
    error = refusal(api.admin.post("/api/v1/workflows", json=body))
    assert error["code"] == "invalid_request"
    assert error["details"][0]["loc"] == ["body", "nodes", 0, "on_failure"]
    body = {"name": "bad", "on_failure": "ignore", "nodes": [{"name": "a", "kind": "test.noop"}]}
    assert refusal(api.admin.post("/api/v1/workflows", json=body))["details"][0]["loc"] == ["body", "on_failure"]


def test_the_same_idempotency_key_gives_the_same_workflow_back(api, conn):
    workflows_before = rows(conn)[0]
    first = create(api, ORDER, **{"Idempotency-Key": "order-42"})
    again = create(api, {**ORDER, "name": "other"}, status=200, **{"Idempotency-Key": "order-42"})
    assert again == {**first, "deduplicated": True}
    # The body's key is the header's; both given, they must agree (as for POST /api/v1/jobs).
    assert create(api, {**ORDER, "idempotency_key": "order-42"}, status=200)["id"] == first["id"]
    mismatch = api.admin.post(
        "/api/v1/workflows", json={**ORDER, "idempotency_key": "a"}, headers={"Idempotency-Key": "b"}
    )
    assert refusal(mismatch, 409)["code"] == "idempotency_key_mismatch"
    assert rows(conn)[0] == workflows_before + 1
    batch = {"name": "b", "kind": "test.noop", "args": [{}]}
    assert api.admin.post("/api/v1/batches", json=batch, headers={"Idempotency-Key": "order-42"}).json() == again


@pytest.mark.own_database
def test_the_list_is_newest_first_with_filters_and_a_cursor(api):
    ids = [create(api, {**ORDER, "name": f"wf-{n % 2}"})["id"] for n in range(5)]
    api.admin.post(f"/api/v1/workflows/{ids[1]}/cancel")

    def listed(**params) -> tuple[list[int], str | None]:
        response = api.reader.get("/api/v1/workflows", params=params)
        assert response.status_code == 200, response.text
        page = response.json()
        return [item["id"] for item in page["workflows"]], page["next_cursor"]

    assert listed() == (ids[::-1], None)
    first, cursor = listed(limit=2)
    assert (first, cursor) == (ids[:2:-1], str(ids[3]))
    assert listed(limit=2, before=cursor) == ([ids[2], ids[1]], str(ids[1]))
    assert listed(limit=2, before=str(ids[1])) == ([ids[0]], None)
    assert listed(state="cancelled") == ([ids[1]], None)
    assert listed(name="wf-0") == ([ids[4], ids[2], ids[0]], None)
    summary = api.reader.get("/api/v1/workflows", params={"limit": 1}).json()["workflows"][0]
    assert (summary["name"], summary["state"], summary["nodes"], summary["nodes_left"]) == ("wf-0", "running", 3, 3)
    assert refusal(api.reader.get("/api/v1/workflows", params={"before": "x"}), 400)["code"] == "invalid_cursor"
    assert refusal(api.reader.get("/api/v1/workflows", params={"state": "done"}))["code"] == "invalid_request"


def _wait_in_background(api, workflow_id: int, wait: str = "20s") -> tuple[threading.Thread, dict]:
    answer: dict = {}

    def call() -> None:
        response = api.reader.get(f"/api/v1/workflows/{workflow_id}", params={"wait": wait}, timeout=30)
        answer.update(status=response.status_code, body=response.json(), at=time.monotonic())

    thread = threading.Thread(target=call)
    thread.start()
    return thread, answer


def test_a_waiting_request_is_woken_by_a_cancel_and_cancelling_twice_is_a_conflict(api, conn):
    created = create(api, ORDER)  # no worker: it would run forever
    thread, answer = _wait_in_background(api, created["id"])
    waiters = "SELECT count(*) FROM dygo_result_waiters WHERE job_id = %s"  # a workflow's waiter: minus its id
    wait_until(lambda: conn.execute(waiters, (-created["id"],)).fetchone()[0] == 1)
    cancelled_at = time.monotonic()
    response = api.admin.post(f"/api/v1/workflows/{created['id']}/cancel")
    assert response.status_code == 200 and response.json()["state"] == "cancelled"
    thread.join(30)
    # Woken by the workflow's end (the 20 s wait would have answered much later), with its state after it.
    assert answer["status"] == 200 and answer["at"] - cancelled_at < 10
    assert answer["body"]["state"] == "cancelled"
    assert set(node_states(answer["body"]).values()) == {"cancelled"}
    assert refusal(api.admin.post(f"/api/v1/workflows/{created['id']}/cancel"), 409)["code"] == "workflow_not_running"
    wait_until(lambda: conn.execute(waiters, (-created["id"],)).fetchone()[0] == 0)


def test_a_wait_that_runs_out_answers_the_workflow_as_it_is(api):
    created = create(api, ORDER)
    asked = time.monotonic()
    shown = workflow(api, created["id"], wait="300ms")
    assert 0.3 <= time.monotonic() - asked < 5
    assert shown["state"] == "running" and shown["result"] is None
    for wait in ("61s", "soon"):
        error = refusal(api.reader.get(f"/api/v1/workflows/{created['id']}", params={"wait": wait}))
        assert error["code"] == "invalid_duration" and error["details"]["field"] == "wait"
    for params in ({}, {"wait": "1s"}):
        assert refusal(api.reader.get("/api/v1/workflows/999999", params=params), 404)["code"] == "workflow_not_found"


@pytest.mark.own_database
def test_retrying_a_failed_node_re_arms_what_its_failure_cancelled(api, worker):
    created = create(
        api,
        {
            "name": "flaky",
            "chain": True,
            "nodes": [
                {"name": "fetch", "kind": "test.fail_first_runs", "args": {"times": 1}},
                {"name": "store", "kind": "test.record"},
            ],
        },
    )
    failed = workflow(api, created["id"], wait="20s")
    assert failed["state"] == "failed" and node_states(failed) == {"fetch": "failed", "store": "cancelled"}
    # The node that did not run is retried through the one that failed, never alone.
    error = refusal(api.admin.post(f"/api/v1/workflows/{created['id']}/nodes/store/retry"), 409)
    assert error["code"] == "node_not_retryable"
    retried = api.admin.post(f"/api/v1/workflows/{created['id']}/nodes/fetch/retry")
    assert retried.status_code == 200, retried.text
    assert retried.json()["state"] == "running"
    shown = workflow(api, created["id"], wait="20s")
    assert shown["state"] == "succeeded" and node_states(shown) == {"fetch": "succeeded", "store": "succeeded"}
    assert shown["result"] == {"store": {"attempt": 1, "retry": False}}
    # Nothing left to retry, skip or cancel: 409 naming the node's state; unknown names and ids: 404.
    nodes = f"/api/v1/workflows/{created['id']}/nodes"
    assert refusal(api.admin.post(f"{nodes}/fetch/retry"), 409)["code"] == "node_state"
    assert refusal(api.admin.post(f"{nodes}/fetch/cancel"), 409)["code"] == "node_state"
    assert refusal(api.admin.post(f"{nodes}/nope/skip"), 404)["code"] == "node_not_found"
    assert refusal(api.admin.post("/api/v1/workflows/999999/nodes/fetch/skip"), 404)["code"] == "workflow_not_found"


def test_cancelling_a_waiting_node_cancels_what_runs_after_it_and_its_retry_waits_its_turn(api, conn):
    created = create(api, ORDER)
    shown = api.admin.post(f"/api/v1/workflows/{created['id']}/nodes/ship/cancel").json()
    assert node_states(shown) == {"charge": "running", "ship": "cancelled", "mail": "cancelled"}
    assert shown["state"] == "running"  # charge still runs
    retried = api.admin.post(f"/api/v1/workflows/{created['id']}/nodes/ship/retry").json()
    assert node_states(retried) == {"charge": "running", "ship": "waiting", "mail": "waiting"}
    states = dict(conn.execute("SELECT id, state FROM dygo_jobs").fetchall())
    assert [states[created["jobs"][name]] for name in ("charge", "ship", "mail")] == ["pending", "waiting", "waiting"]


@pytest.mark.own_database
def test_an_open_batch_takes_jobs_until_sealed_and_fires_its_callback_once(api, worker, conn):
    response = api.admin.post(
        "/api/v1/batches",
        json={
            "name": "import",
            "kind": "test.record",
            "args": [{}, {}],
            "open": True,
            "priority": 5,
            "on_complete": {"kind": "test.record", "args": {"seconds": 0}},
            "on_failure": {"kind": "test.noop"},
        },
    )
    assert response.status_code == 201, response.text
    created = response.json()
    assert set(created["nodes"]) == {"jobs", "on_complete", "on_failure"}
    batch_id = created["id"]

    # Its first jobs run, but the batch cannot end, nor its callback fire, before it is sealed.
    def group() -> dict:
        return next(node for node in workflow(api, batch_id)["nodes"] if node["name"] == "jobs")

    wait_until(lambda: group()["succeeded"] == 2, message="the batch's first jobs settled")
    shown = workflow(api, batch_id)
    jobs_node = next(node for node in shown["nodes"] if node["name"] == "jobs")
    assert (jobs_node["state"], jobs_node["succeeded"], jobs_node["sealed"]) == ("running", 2, False)
    callback = next(node for node in shown["nodes"] if node["name"] == "on_complete")
    assert callback["wait"] == "waiting on 1 of 1: jobs"
    added = api.admin.post(f"/api/v1/batches/{batch_id}/jobs", json={"kind": "test.record", "args": [{}, {}, {}]})
    assert added.status_code == 201, added.text
    assert added.json()["batch"] == batch_id and len(added.json()["jobs"]) == 3
    assert api.reader.get(f"/api/v1/jobs/{added.json()['jobs'][0]}").json()["node"] == "jobs"
    sealed = api.admin.post(f"/api/v1/batches/{batch_id}/seal")
    assert sealed.status_code == 200, sealed.text
    shown = workflow(api, batch_id, wait="20s")
    assert shown["state"] == "succeeded"
    assert node_states(shown) == {"jobs": "succeeded", "on_complete": "succeeded", "on_failure": "skipped"}
    runs = conn.execute("SELECT job_id FROM test_runs ORDER BY at").fetchall()
    assert len(runs) == 6 and runs[-1][0] == created["jobs"]["on_complete"]  # the callback once, last
    late = api.admin.post(f"/api/v1/batches/{batch_id}/jobs", json={"kind": "test.record", "args": [{}]})
    assert refusal(late, 409)["code"] == "batch_sealed"
    assert refusal(api.admin.post(f"/api/v1/batches/{batch_id}/seal"), 409)["code"] == "batch_sealed"
    assert refusal(api.admin.post("/api/v1/batches/999999/seal"), 404)["code"] == "workflow_not_found"


def test_a_read_token_reads_workflows_and_only_an_admin_token_changes_them(api):
    created = create(api, ORDER)
    assert api.reader.get(f"/api/v1/workflows/{created['id']}").status_code == 200
    assert api.reader.get("/api/v1/workflows").status_code == 200
    for path in ("/api/v1/workflows", f"/api/v1/workflows/{created['id']}/cancel", "/api/v1/batches"):
        assert refusal(api.reader.post(path, json={}), 403)["code"] == "forbidden"
    assert api.anon.get("/api/v1/workflows").status_code == 401


def test_every_workflow_route_is_in_the_openapi_document_with_its_response_model(api):
    paths = api.anon.get("/openapi.json").json()["paths"]
    expected = {
        ("post", "/api/v1/workflows"): "WorkflowCreated",
        ("get", "/api/v1/workflows"): "WorkflowPage",
        ("get", "/api/v1/workflows/{workflow_id}"): "Workflow",
        ("post", "/api/v1/workflows/{workflow_id}/cancel"): "Workflow",
        ("post", "/api/v1/workflows/{workflow_id}/nodes/{node}/retry"): "Workflow",
        ("post", "/api/v1/workflows/{workflow_id}/nodes/{node}/skip"): "Workflow",
        ("post", "/api/v1/workflows/{workflow_id}/nodes/{node}/cancel"): "Workflow",
        ("post", "/api/v1/batches"): "WorkflowCreated",
        ("post", "/api/v1/batches/{workflow_id}/jobs"): "BatchJobsAdded",
        ("post", "/api/v1/batches/{workflow_id}/seal"): "Workflow",
    }
    for (method, path), model in expected.items():
        responses = paths[path][method]["responses"]
        success = responses.get("201") or responses["200"]
        assert success["content"]["application/json"]["schema"]["$ref"].endswith(f"/{model}"), (method, path)
        assert "422" in responses and "401" in responses
