"""Enqueue over HTTP: one and many, every option, idempotency, the per-kind schemas, and bad input."""

from __future__ import annotations

import dataclasses
import json
import typing
from datetime import UTC, datetime, timedelta, timezone
from zoneinfo import ZoneInfo

import psycopg
import pytest
from dygo.app.jobs import _options, _PlainBatch, _PlainEntry, batch_enqueued_body, enqueued_body
from dygo.app.schemas import BatchEnqueued, BatchRequest, Enqueued, EnqueueRequest
from dygo.store.enqueue import Enqueued as Result
from pydantic import TypeAdapter

# One database and one `dygo serve` for the module: each test counts or reads only the rows it made.
pytestmark = pytest.mark.shared_database


def count_jobs(conn) -> int:
    return conn.execute("SELECT count(*) FROM dygo_jobs").fetchone()[0]


def test_enqueue_with_every_option_is_stored_as_asked(api, conn):
    response = api.admin.post(
        "/api/v1/jobs",
        json={
            "kind": "test.record",
            "args": {"seconds": 0.5},
            "queue": "other",
            "priority": 7,
            "run_at": "2030-01-02T03:04:05Z",
            "max_attempts": 4,
            "meta": {"tenant": "acme"},
            "idempotency_key": "order-1",
        },
    )
    assert response.status_code == 201, response.text
    body = response.json()
    assert body["deduplicated"] is False and body["run_at"].startswith("2030-01-02T03:04:05")
    job = api.reader.get(f"/api/v1/jobs/{body['id']}").json()
    assert (job["queue"], job["priority"], job["max_attempts"], job["state"]) == ("other", 7, 4, "scheduled")
    assert (job["meta"], job["args"], job["idempotency_key"]) == ({"tenant": "acme"}, {"seconds": 0.5}, "order-1")


def test_delay_runs_on_the_database_clock(api, conn):
    job_id = api.admin.post("/api/v1/jobs", json={"kind": "test.noop", "delay": "90s"}).json()["id"]
    lead = conn.execute(
        "SELECT extract(epoch FROM run_at - enqueued_at) FROM dygo_jobs WHERE id = %s", (job_id,)
    ).fetchone()[0]
    assert lead == 90


def test_idempotency_key_header_is_the_same_mechanism(api):
    headers = {"Idempotency-Key": "webhook-77"}
    first = api.admin.post("/api/v1/jobs", json={"kind": "test.noop"}, headers=headers)
    again = api.admin.post("/api/v1/jobs", json={"kind": "test.noop"}, headers=headers)
    body_key = api.admin.post("/api/v1/jobs", json={"kind": "test.noop", "idempotency_key": "webhook-77"})
    assert (first.status_code, again.status_code, body_key.status_code) == (201, 200, 200)
    assert first.json()["id"] == again.json()["id"] == body_key.json()["id"]
    assert again.json()["deduplicated"] is True
    clash = api.admin.post("/api/v1/jobs", json={"kind": "test.noop", "idempotency_key": "other"}, headers=headers)
    assert clash.status_code == 409 and clash.json()["error"]["code"] == "idempotency_key_mismatch"


def test_idempotency_ttl_holds_the_key_after_the_job_finished(api, conn):
    body = {"kind": "test.noop", "idempotency_key": "daily-report", "idempotency_ttl": "1h"}
    first = api.admin.post("/api/v1/jobs", json=body).json()
    conn.execute("UPDATE dygo_jobs SET state = 'succeeded' WHERE id = %s", (first["id"],))
    again = api.admin.post("/api/v1/jobs", json=body)
    assert again.status_code == 200 and again.json()["id"] == first["id"]


def test_batch_enqueues_every_job_in_order(api, conn):
    response = api.admin.post(
        "/api/v1/jobs/batch",
        json={
            "jobs": [
                {"kind": "test.noop"},
                {"kind": "test.record", "args": {"seconds": 1}, "delay": "1h", "priority": 3},
                {"kind": "test.noop", "idempotency_key": "once"},
                {"kind": "test.noop", "idempotency_key": "once"},
            ]
        },
    )
    assert response.status_code == 201, response.text
    results = response.json()["jobs"]
    assert [r["deduplicated"] for r in results] == [False, False, False, True]
    assert results[3]["id"] == results[2]["id"]
    rows = conn.execute(
        "SELECT id, kind, priority FROM dygo_jobs WHERE id >= %s ORDER BY id", (results[0]["id"],)
    ).fetchall()
    assert [(kind, priority) for _, kind, priority in rows] == [("test.noop", 0), ("test.record", 3), ("test.noop", 0)]
    assert [row[0] for row in rows] == [r["id"] for r in results[:3]]


def test_batch_is_all_or_nothing_and_names_the_bad_job(api, conn):
    before = count_jobs(conn)
    response = api.admin.post(
        "/api/v1/jobs/batch",
        json={
            "jobs": [{"kind": "test.noop"}, {"kind": "test.record", "args": {"seconds": "soon"}}, {"kind": "test.noop"}]
        },
    )
    assert response.status_code == 422
    error = response.json()["error"]
    assert error["code"] == "invalid_args" and error["message"].startswith("jobs[1]: ")
    assert error["details"]["index"] == 1 and error["details"]["errors"][0]["loc"] == ["seconds"]
    assert count_jobs(conn) == before


def test_batch_above_the_configured_maximum_is_refused(api, conn):
    before = count_jobs(conn)
    response = api.admin.post("/api/v1/jobs/batch", json={"jobs": [{"kind": "test.noop"}] * 1001})
    assert response.status_code == 422
    assert response.json()["error"]["code"] == "batch_too_large"
    assert response.json()["error"]["details"] == {"max": 1000, "got": 1001}
    assert count_jobs(conn) == before


def test_oversize_body_is_413_whether_declared_or_streamed(api, conn):
    before = count_jobs(conn)
    big = b'{"kind": "test.noop", "args": {"blob": "' + b"x" * (1024 * 1024) + b'"}}'
    declared = api.admin.post("/api/v1/jobs", content=big, headers={"content-type": "application/json"})

    def chunks():
        for start in range(0, len(big), 65536):
            yield big[start : start + 65536]

    streamed = api.admin.post("/api/v1/jobs", content=chunks(), headers={"content-type": "application/json"})
    for response in (declared, streamed):
        assert response.status_code == 413
        assert response.json()["error"]["code"] == "payload_too_large"
    assert count_jobs(conn) == before
    at_the_limit = big.replace(b"x" * (len(big) - 1024 * 1024), b"", 1)
    assert len(at_the_limit) == 1024 * 1024
    accepted = api.admin.post("/api/v1/jobs", content=at_the_limit, headers={"content-type": "application/json"})
    assert accepted.status_code == 201, accepted.text


@pytest.mark.parametrize(
    ("body", "status", "code"),
    [
        (b"{not json", 400, "invalid_json"),
        (b'{"kind": "test.noop", "priority": "high"}', 422, "invalid_request"),
        (b'{"kind": "test.noop", "meta": {"n": 1}}', 422, "invalid_request"),
        (b'{"kind": "test.noop", "colour": "red"}', 422, "invalid_request"),
        (b'["test.noop"]', 422, "invalid_request"),
        (b'{"kind": "no.such"}', 422, "unknown_kind"),
        (b'{"kind": "test.noop", "queue": "nope"}', 422, "unknown_queue"),
        (b'{"kind": "test.record", "args": {"seconds": "soon"}}', 422, "invalid_args"),
        (b'{"kind": "test.noop", "priority": 5000}', 422, "invalid_option"),
        (b'{"kind": "test.noop", "delay": "tomorrow"}', 422, "invalid_duration"),
        (b'{"kind": "test.noop", "idempotency_key": "k", "idempotency_ttl": "-1h"}', 422, "invalid_duration"),
        (b'{"kind": "test.noop", "run_at": "next tuesday"}', 422, "invalid_timestamp"),
        (b'{"kind": "test.noop", "run_at": "2030-01-01T00:00:00"}', 422, "invalid_timestamp"),
        (b'{"kind": "test.noop", "meta": {"k": "a\\u0000b"}}', 422, "invalid_value"),
    ],
)
def test_each_kind_of_bad_input_has_its_own_code_and_writes_nothing(module_api, module_db_url, body, status, code):
    # One server for all these cases: none of them may write anything.
    with psycopg.connect(module_db_url) as conn:
        before = count_jobs(conn)
    response = module_api.admin.post("/api/v1/jobs", content=body, headers={"content-type": "application/json"})
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert error["code"] == code and error["message"]
    assert "Traceback" not in response.text
    with psycopg.connect(module_db_url) as conn:
        assert count_jobs(conn) == before


# The same refusals for a batch entry, plain ({"kind", "args"} only) or not: each names the entry's index.
@pytest.mark.parametrize(
    ("entry", "status", "code", "loc"),
    [
        ({"kind": "test.noop", "args": [1]}, 422, "invalid_request", ["body", "jobs", 1, "args"]),
        ({"kind": 5}, 422, "invalid_request", ["body", "jobs", 1, "kind"]),
        ({"args": {}}, 422, "invalid_request", ["body", "jobs", 1, "kind"]),
        ({"kind": "test.noop", "args": {}, "colour": "red"}, 422, "invalid_request", ["body", "jobs", 1, "colour"]),
        (
            {"kind": "test.noop", "args": {"k": {"deep": 1}}, "priority": "5"},
            422,
            "invalid_request",
            ["body", "jobs", 1, "priority"],
        ),
        ({"kind": "no.such", "args": {}}, 422, "unknown_kind", None),
        ({"kind": "test.noop", "args": {"k": "a\ud800b"}}, 422, "invalid_value", None),
        ({"kind": "test.record", "args": {"seconds": "soon"}}, 422, "invalid_args", None),
    ],
)
def test_each_bad_batch_entry_is_refused_with_its_index_and_writes_nothing(
    module_api, module_db_url, entry, status, code, loc
):
    body = json.dumps({"jobs": [{"kind": "test.noop", "args": {"n": 0}}, entry]})
    with psycopg.connect(module_db_url) as conn:
        before = count_jobs(conn)
    response = module_api.admin.post("/api/v1/jobs/batch", content=body, headers={"content-type": "application/json"})
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert error["code"] == code, error
    if loc is None:
        assert error["message"].startswith("jobs[1]: ") and error["details"]["index"] == 1
    else:
        assert [detail["loc"] for detail in error["details"]] == [loc]
    with psycopg.connect(module_db_url) as conn:
        assert count_jobs(conn) == before


@pytest.mark.parametrize(
    ("content_type", "status"),
    [
        ("application/json", 201),
        ("application/json; charset=utf-8", 201),
        ("application/vnd.api+json", 201),
        ("text/plain", 422),
        (None, 422),
    ],
)
def test_a_json_body_is_read_as_json_whatever_json_content_type_names_it(module_api, content_type, status):
    headers = {} if content_type is None else {"content-type": content_type}
    for path, body in (
        ("/api/v1/jobs", b'{"kind": "test.noop"}'),
        ("/api/v1/jobs/batch", b'{"jobs": [{"kind": "test.noop"}]}'),
    ):
        response = module_api.admin.post(path, content=body, headers=headers)
        assert response.status_code == status, (path, content_type, response.text)


@pytest.mark.parametrize(
    ("key", "status", "code"),
    [
        ("", 422, "invalid_request"),
        ("k" * 256, 422, "invalid_request"),
        ("k" * 255, 201, None),
    ],
)
def test_the_idempotency_key_header_holds_1_to_255_characters(module_api, key, status, code):
    response = module_api.admin.post(
        "/api/v1/jobs",
        content=b'{"kind": "test.noop"}',
        headers={"content-type": "application/json", "Idempotency-Key": key},
    )
    assert response.status_code in (status, 200), response.text
    if code is not None:
        error = response.json()["error"]
        assert error["code"] == code and error["details"][0]["loc"] == ["header", "Idempotency-Key"]


def test_a_single_enqueue_answers_the_documented_fields_only(api):
    response = api.admin.post("/api/v1/jobs", json={"kind": "test.noop", "args": {"n": 1}})
    assert response.status_code == 201
    body = response.json()
    assert sorted(body) == ["deduplicated", "id", "run_at"] and body["run_at"].endswith("Z")
    assert response.headers["content-type"] == "application/json"
    assert response.headers["cache-control"] == "no-store" and response.headers["x-frame-options"] == "DENY"


def test_a_kind_registered_elsewhere_can_be_enqueued_with_an_explicit_queue(api, conn):
    response = api.admin.post("/api/v1/jobs", json={"kind": "billing.invoice", "queue": "other", "args": {"n": 1}})
    assert response.status_code == 201
    stored = conn.execute("SELECT kind, queue FROM dygo_jobs WHERE id = %s", (response.json()["id"],)).fetchone()
    assert stored == ("billing.invoice", "other")


def test_openapi_shows_each_registered_kinds_args(api):
    document = api.anon.get("/openapi.json").json()
    schemas = document["components"]["schemas"]
    body = document["paths"]["/api/v1/jobs"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    refs = [variant["$ref"].rsplit("/", 1)[1] for variant in body["anyOf"]]
    assert "kind.Enqueue_test_record" in refs and refs[-1] == "EnqueueRequest"
    record = schemas["kind.Enqueue_test_record"]
    assert record["properties"]["kind"]["const"] == "test.record"
    args_model = schemas[record["properties"]["args"]["$ref"].rsplit("/", 1)[1]]
    assert args_model["properties"]["seconds"]["type"] == "number"
    batch_items = schemas["BatchRequest"]["properties"]["jobs"]["items"]
    assert batch_items == body
    assert document["components"]["securitySchemes"]["bearer"]["scheme"] == "bearer"
    assert api.anon.get("/docs").status_code == 200


def test_run_at_in_the_past_is_due_now(api):
    past = datetime(2020, 1, 1, tzinfo=UTC).isoformat()
    job_id = api.admin.post("/api/v1/jobs", json={"kind": "test.noop", "run_at": past}).json()["id"]
    assert api.reader.get(f"/api/v1/jobs/{job_id}").json()["state"] == "pending"


# The answers' bytes and the options handed to the store come from pydantic; these prove they are the
# documented models' own, for the values that could tell a hand-written copy apart.
TRICKY_RUN_ATS = [
    datetime(2030, 1, 2, 3, 4, 5, tzinfo=UTC),
    datetime(2030, 1, 2, 3, 4, 5, 120000, tzinfo=UTC),  # trailing zeros in the microseconds
    datetime(2030, 1, 2, 3, 4, 5, 1, tzinfo=timezone(timedelta(hours=5, minutes=30))),
    datetime(2030, 1, 2, 3, 4, 5, tzinfo=timezone(timedelta(hours=-8))),
    datetime(2030, 1, 2, 3, 4, 5, tzinfo=ZoneInfo("UTC")),
    datetime(2030, 7, 2, 3, 4, 5, 999999, tzinfo=ZoneInfo("Europe/Paris")),
    datetime(1, 1, 1, tzinfo=UTC),
    None,  # a deduplicated batch entry
]


def test_the_enqueue_answers_are_the_bytes_of_the_documented_models():
    assert list(Enqueued.model_fields) == [f.name for f in dataclasses.fields(Result)]
    results = [Result(2**63 - 1 - n, n % 2 == 1, run_at) for n, run_at in enumerate(TRICKY_RUN_ATS)]
    for result in results:
        assert enqueued_body(result) == Enqueued.model_validate(result, from_attributes=True).model_dump_json().encode()
    documented = BatchEnqueued.model_validate({"jobs": results}, from_attributes=True).model_dump_json()
    assert batch_enqueued_body(results) == documented.encode()
    assert batch_enqueued_body([]) == b'{"jobs":[]}'
    assert json.loads(enqueued_body(results[1]))["run_at"] == "2030-01-02T03:04:05.120000Z"


@pytest.mark.parametrize(
    "body",
    [
        {"kind": "k"},
        {"kind": "k", "args": {"a": 1}},
        {"kind": "k", "queue": None, "priority": None, "meta": {}},
        {"kind": "k", "queue": "q", "priority": 3, "run_at": "2030-01-02T03:04:05+02:00", "meta": {"a": "b"}},
        {"kind": "k", "delay": "5s", "max_attempts": 2.0, "idempotency_key": "x", "idempotency_ttl": 60},
    ],
)
def test_the_options_given_to_the_store_are_the_request_models_dump(body):
    request = EnqueueRequest.model_validate(body)
    dumped = request.model_dump(exclude={"kind", "args"}, exclude_unset=True, exclude_none=True)
    assert _options(request) == dumped
    assert set(dumped) == {name for name, value in body.items() if value is not None} - {"kind", "args"}


@pytest.mark.parametrize(
    ("method", "path", "allow"),
    [
        ("PUT", "/api/v1/jobs", "GET, POST"),
        ("OPTIONS", "/api/v1/jobs", "GET, POST"),
        ("GET", "/api/v1/jobs/batch", "POST"),
        ("PUT", "/api/v1/jobs/5", "DELETE, GET"),
        ("GET", "/api/v1/jobs/5/retry", "POST"),
    ],
)
def test_a_method_the_path_does_not_take_is_405_naming_every_documented_method(module_api, method, path, allow):
    response = module_api.admin.request(method, path)
    assert response.status_code == 405 and response.json()["error"]["code"] == "method_not_allowed"
    assert response.headers["allow"] == allow


def test_a_plain_batch_entry_is_the_request_models_kind_and_args_only():
    """The quick handler reads a batch of plain entries into dicts (app/jobs.py _PlainBatch): the same fields,
    types and refusal of other keys as the request models, so it takes nothing they refuse."""
    fields = EnqueueRequest.model_fields
    assert typing.get_type_hints(_PlainEntry) == {name: fields[name].annotation for name in ("kind", "args")}
    required = TypeAdapter(_PlainEntry).json_schema()["required"]
    assert required == [name for name in ("kind", "args") if fields[name].is_required()]
    batch = BatchRequest.model_fields
    assert list(typing.get_type_hints(_PlainBatch)) == list(batch) and batch["jobs"].annotation == list[EnqueueRequest]
    for typed_dict, model in ((_PlainEntry, EnqueueRequest), (_PlainBatch, BatchRequest)):
        assert typed_dict.__pydantic_config__["extra"] == model.model_config["extra"] == "forbid"
