"""Hostile input against a real `dygo serve` and the Python API: refused with a 4xx (or a typed error), nothing written.

Values that are legitimate data (quotes, semicolons, backslashes, LIKE wildcards and any Unicode in args,
meta, idempotency keys and search text) are stored and found verbatim; values PostgreSQL cannot hold
(a NUL character, a lone surrogate) and values outside a field's rules are refused before any row is written.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta, timezone
from typing import Any
from urllib.parse import quote

import httpx
import psycopg
import pytest
from dygo.store import enqueue
from dygo.store.enqueue import JobRequest, enqueue_many
from dygo.store.errors import EnqueueError
from dygo.store.registry import KIND_PATTERN

SQL_SIGNIFICANT = [
    "'",
    "''",
    "'; DROP TABLE dygo_jobs; --",
    '"',
    ";",
    "--",
    "/* */",
    "\\",
    "\\'",
    "%",
    "_",
    "$1",
    "$$",
    "E'\\x00'",
    ")) OR 1=1 --",
]
UNICODE = ["ünïcödé", "🦆🔥", "שלום עולם", "مرحبا", "e\u0301\u0301", "\u200b\u200f", "𝔘𝔫𝔦"]
UNSTORABLE = ["\u0000", "a\u0000b", "\ud800"]  # PostgreSQL text holds no NUL; UTF-8 has no lone surrogate


@pytest.fixture(scope="module")
def db(module_db_url: str) -> Iterator[psycopg.Connection]:
    with psycopg.connect(module_db_url, autocommit=True) as connection:
        yield connection


def written(db: psycopg.Connection) -> tuple[int, ...]:
    """Rows in every table a request could write to."""
    return db.execute("""
        SELECT (SELECT count(*) FROM dygo_jobs), (SELECT count(*) FROM dygo_idempotency_keys),
               (SELECT count(*) FROM dygo_queues), (SELECT count(*) FROM dygo_schedules),
               (SELECT count(*) FROM dygo_stats_deltas)""").fetchone()


def refused(response: Any, *statuses: int) -> dict[str, Any]:
    """The error envelope of a 4xx, never a stack trace."""
    assert 400 <= response.status_code < 500, f"{response.status_code}: {response.text[:300]}"
    if statuses:
        assert response.status_code in statuses, f"{response.status_code}: {response.text[:300]}"
    error = response.json()["error"]
    assert error["code"] and error["message"] and "Traceback" not in response.text
    return error


def post_raw(module_api, path: str, body: bytes | str) -> Any:
    return module_api.admin.post(path, content=body, headers={"content-type": "application/json"})


# --- bodies: size, shape, types ----------------------------------------------------------------------


def test_oversize_bodies_are_refused_before_parsing(module_api, db):
    before = written(db)
    huge_args = {"kind": "test.noop", "args": {"blob": "x" * (1024 * 1024 + 1)}}
    refused(module_api.admin.post("/api/v1/jobs", json=huge_args), 413)
    batch = {"jobs": [{"kind": "test.noop", "args": {"pad": "y" * 2000}}] * 600}
    refused(module_api.admin.post("/api/v1/jobs/batch", json=batch), 413)

    def chunks() -> Iterator[bytes]:  # no Content-Length: the limit counts streamed bytes
        yield b'{"kind": "test.noop", "args": {"blob": "'
        for _ in range(300):
            yield b"z" * 4096
        yield b'"}}'

    refused(module_api.admin.post("/api/v1/jobs", content=chunks(), headers={"content-type": "application/json"}), 413)
    assert written(db) == before


@pytest.mark.parametrize(
    "body",
    [
        "",
        "{",
        "nul",
        "[]",
        "[1, 2]",
        '"a string"',
        "42",
        "null",
        '{"kind": "test.noop",}',
        "{'kind': 'test.noop'}",
        '{"kind": "test.noop", "args": {"n": NaN}}',
        '{"kind": "test.noop", "args": {"n": Infinity}}',
        '{"kind": "test.noop"} trailing',
        "\xff\xfe",
        '{"kind": "test.noop", "args": {"a": 1e999999}}',
        '{"kind": "test.noop", "args": ' + "[" * 5000 + "]" * 5000 + "}",
    ],
)
def test_malformed_json_is_a_400_or_422(module_api, db, body):
    before = written(db)
    refused(post_raw(module_api, "/api/v1/jobs", body.encode("utf-8", "surrogateescape")), 400, 422)
    refused(post_raw(module_api, "/api/v1/jobs/batch", body.encode("utf-8", "surrogateescape")), 400, 422)
    assert written(db) == before


@pytest.mark.parametrize(
    "body",
    [
        {"kind": 7},
        {"kind": None},
        {"kind": ["test.noop"]},
        {"kind": {"a": 1}},
        {},
        {"kind": "test.noop", "args": []},
        {"kind": "test.noop", "args": "x"},
        {"kind": "test.noop", "args": None},
        {"kind": "test.record", "args": {"seconds": "many"}},
        {"kind": "test.noop", "priority": "high"},
        {"kind": "test.noop", "priority": 1.5},
        {"kind": "test.noop", "priority": 10**30},
        {"kind": "test.noop", "priority": -(10**30)},
        {"kind": "test.noop", "max_attempts": 0},
        {"kind": "test.noop", "max_attempts": 2**31},
        {"kind": "test.noop", "max_attempts": True},
        {"kind": "test.noop", "meta": {"a": 1}},
        {"kind": "test.noop", "meta": ["a"]},
        {"kind": "test.noop", "meta": "a"},
        {"kind": "test.noop", "idempotency_key": 5},
        {"kind": "test.noop", "idempotency_key": ""},
        {"kind": "test.noop", "idempotency_key": "k" * 256},
        {"kind": "test.noop", "queue": 3},
        {"kind": "test.noop", "unknown_option": 1},
        {"kind": "test.noop", "run_at": "tomorrow"},
        {"kind": "test.noop", "run_at": "2030-01-01T00:00:00"},
        {"kind": "test.noop", "run_at": "0001-01-01T00:00:00+14:00"},
        {"kind": "test.noop", "run_at": 10**20},
        {"kind": "test.noop", "run_at": "2030-01-01T00:00:00Z", "delay": "1s"},
        {"jobs": []},
    ],
)
def test_wrong_types_and_values_are_422(module_api, db, body):
    before = written(db)
    refused(module_api.admin.post("/api/v1/jobs", json=body), 422)
    refused(module_api.admin.post("/api/v1/jobs/batch", json={"jobs": [{"kind": "test.noop"}, body]}), 422)
    assert written(db) == before


@pytest.mark.parametrize(
    "delay",
    [
        -1,
        "-1s",
        "-0.001",
        10**20,
        "100000000000000000000s",
        "1 fortnight",
        "1w",
        "1e9",
        "inf",
        "nan",
        "",
        " ",
        "1h30m",
        "5 minutes",
        True,
        [1],
        {"s": 1},
        "367d",
        1e308,
        "9" * 400,
    ],
)
def test_negative_and_absurd_durations_are_422(module_api, db, delay):
    before = written(db)
    for body in (
        {"kind": "test.noop", "delay": delay},
        {"kind": "test.noop", "idempotency_key": "ttl", "idempotency_ttl": delay},
    ):
        refused(module_api.admin.post("/api/v1/jobs", json=body), 422)
        refused(module_api.admin.post("/api/v1/jobs/batch", json={"jobs": [body]}), 422)
    refused(module_api.admin.post("/api/v1/queues/default/vacuum-dead", params={"older_than": str(delay)}), 422)
    assert written(db) == before


# --- text fields: SQL-significant characters, Unicode, NUL -------------------------------------------


@pytest.mark.parametrize("text", SQL_SIGNIFICANT + UNICODE)
def test_quotes_and_unicode_in_kind_and_queue_are_refused(module_api, db, text):
    before = written(db)
    # A kind is a dotted name, else refused by the request's schema; a queue must be configured.
    dotted = KIND_PATTERN.match(text) is not None
    kind_code = "unknown_kind" if dotted else "invalid_request"
    assert refused(module_api.admin.post("/api/v1/jobs", json={"kind": text}), 422)["code"] == kind_code
    unknown_queue = module_api.admin.post("/api/v1/jobs", json={"kind": "test.noop", "queue": text})
    assert refused(unknown_queue, 422)["code"] == "unknown_queue"
    assert refused(module_api.admin.post("/api/v1/jobs", json={"kind": text, "queue": text}), 422)["code"] == (
        "unknown_queue" if dotted else "invalid_request"
    )
    assert written(db) == before


@pytest.mark.parametrize("text", SQL_SIGNIFICANT + UNICODE)
def test_quotes_and_unicode_in_args_meta_and_key_are_stored_verbatim(module_api, db, text):
    body = {
        "kind": "test.noop",
        "args": {text: text, "list": [text]},
        "meta": {text: text},
        "idempotency_key": f"key-{text}",
        "delay": "1h",
    }
    created = module_api.admin.post("/api/v1/jobs", json=body)
    assert created.status_code == 201, created.text
    job = module_api.reader.get(f"/api/v1/jobs/{created.json()['id']}").json()
    assert (job["args"], job["meta"], job["idempotency_key"]) == (body["args"], body["meta"], body["idempotency_key"])
    again = module_api.admin.post("/api/v1/jobs", json=body)
    assert again.status_code == 200 and again.json()["id"] == job["id"]


@pytest.mark.parametrize("text", UNSTORABLE)
@pytest.mark.parametrize(
    "place", ["kind", "queue", "args key", "args value", "meta key", "meta value", "idempotency_key", "header key"]
)
def test_nul_and_lone_surrogates_are_refused_in_every_text_field(module_api, db, text, place):
    body: dict[str, Any] = {"kind": "test.noop"}
    headers = {}
    if place == "kind":
        body.update(kind=f"test{text}", queue="default")
    elif place == "queue":
        body["queue"] = f"default{text}"
    elif place.startswith("args"):
        body["args"] = {f"k{text}": 1} if place == "args key" else {"k": f"v{text}"}
    elif place.startswith("meta"):
        body["meta"] = {f"k{text}": "v"} if place == "meta key" else {"k": f"v{text}"}
    elif place == "idempotency_key":
        body["idempotency_key"] = f"key{text}"
    else:
        headers = {"Idempotency-Key": f"key{text}"}
    before = written(db)
    # json= would refuse to encode a lone surrogate; as an escape it is valid JSON text.
    raw = _json_with_escapes(body)
    if place == "header key":
        try:
            response = module_api.admin.post(
                "/api/v1/jobs", content=raw, headers={"content-type": "application/json", **headers}
            )
        except (UnicodeEncodeError, httpx.LocalProtocolError):
            return  # the HTTP client refuses to send it as a header: nothing reaches the server
        refused(response, 400, 422)
    else:
        refused(post_raw(module_api, "/api/v1/jobs", raw), 400, 422)
        refused(post_raw(module_api, "/api/v1/jobs/batch", '{"jobs": [' + raw + "]}"), 400, 422)
    assert written(db) == before


def _json_with_escapes(value: Any) -> str:
    return json.dumps(value, ensure_ascii=True)


@pytest.mark.parametrize("text", SQL_SIGNIFICANT + UNICODE + ["%%", "_%_", "\\%", "a\\_b"])
def test_quotes_wildcards_and_unicode_in_filters_match_literally(module_api, db, text):
    created = module_api.admin.post(
        "/api/v1/jobs", json={"kind": "test.noop", "args": {"needle": f"<{text}>"}, "delay": "1h"}
    ).json()
    before = written(db)
    for params in ({"queue": text}, {"kind": text}, {"queue": text, "kind": text, "q": text}):
        response = module_api.reader.get("/api/v1/jobs", params=params)
        assert response.status_code == 200 and response.json()["jobs"] == [], response.text
    # q searches the args as JSON text, so a quote or backslash is looked for as JSON spells it.
    needle = json.dumps(f"<{text}>", ensure_ascii=False)[1:-1]
    found = module_api.reader.get("/api/v1/jobs", params={"q": needle, "limit": 500}).json()["jobs"]
    assert created["id"] in [job["id"] for job in found]
    # A wildcard must not widen the match: every hit really contains the text.
    assert all(needle in json.dumps(job["args"], ensure_ascii=False) for job in found)
    for path in (f"/api/v1/queues/{text}", f"/api/v1/queues/{text}/stats", f"/api/v1/schedules/{text}"):
        response = module_api.reader.get(path.replace("%", "%25").replace("?", "%3F").replace("#", "%23"))
        refused(response, 404, 422)
    assert written(db) == before


@pytest.mark.parametrize("text", ["\u0000", "a\u0000b", "\ud800"])
def test_nul_and_invalid_utf8_in_filters_and_names_is_never_a_server_error(module_api, db, text):
    before = written(db)
    # Percent-encoded by hand: the HTTP client will not encode a lone surrogate itself. Its bytes are not
    # UTF-8, so the server reads them as U+FFFD, a name nothing has: an empty page, or a 4xx.
    quoted = quote(text.encode("utf-8", "surrogatepass"), safe="")
    for name in ("queue", "kind", "q", "cursor"):
        response = module_api.reader.get(f"/api/v1/jobs?{name}={quoted}")
        if "\u0000" in text or name == "cursor":
            refused(response, 400, 422)
        else:
            assert response.status_code == 200 and response.json()["jobs"] == [], response.text
    for method, path in (
        ("GET", f"/api/v1/queues/{quoted}"),
        ("GET", f"/api/v1/queues/{quoted}/stats"),
        ("POST", f"/api/v1/queues/{quoted}/pause"),
        ("POST", f"/api/v1/queues/{quoted}/purge"),
        ("GET", f"/api/v1/schedules/{quoted}"),
        ("POST", f"/api/v1/schedules/{quoted}/trigger"),
    ):
        refused(module_api.admin.request(method, path), 400, 404, 422)
    assert written(db) == before


# --- pagination and ids --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "params",
    [
        {"limit": 10**12},
        {"limit": -1},
        {"limit": 0},
        {"limit": "ten"},
        {"limit": "1e3"},
        {"limit": 2**63},
        {"cursor": "garbage"},
        {"cursor": "!!!"},
        {"cursor": "bmV3ZXN0Oi0x"},
        {"cursor": "x" * 101},
        {"cursor": "b2xkZXN0OjE"},  # made for the other order
        {"cursor": "bmV3ZXN0Ojk5OTk5OTk5OTk5OTk5OTk5OTk5OTk5"},  # past the largest id
        {"order": "sideways"},
        {"state": "exploded"},
        {"q": ""},
        {"q": "x" * 256},
        {"queue": "q" * 256},
    ],
)
def test_absurd_pagination_is_a_4xx(module_api, db, params):
    refused(module_api.reader.get("/api/v1/jobs", params=params), 400, 422)


@pytest.mark.parametrize("job_id", ["0", "-1", str(2**63), "9" * 40, "1.5", "abc", "1;DROP"])
def test_absurd_job_ids_are_a_4xx(module_api, db, job_id):
    before = written(db)
    refused(module_api.reader.get(f"/api/v1/jobs/{job_id}"), 404, 422)
    refused(module_api.admin.post(f"/api/v1/jobs/{job_id}/retry"), 404, 422)
    refused(module_api.admin.delete(f"/api/v1/jobs/{job_id}"), 404, 422)
    assert written(db) == before


@pytest.mark.parametrize("days", ["0", "-5", "91", str(10**12), "x"])
def test_absurd_stats_windows_are_a_422(module_api, days):
    refused(module_api.reader.get("/api/v1/stats", params={"days": days}), 422)
    refused(module_api.reader.get("/api/v1/queues/default/stats", params={"days": days}), 422)


# --- the Python API -----------------------------------------------------------------------------------


BAD_REQUESTS: list[dict[str, Any]] = [
    {"kind": "test.noop", "delay": -1},
    {"kind": "test.noop", "delay": "1 fortnight"},
    {"kind": "test.noop", "delay": 10**20},
    {"kind": "test.noop", "delay": float("inf")},
    {"kind": "test.noop", "delay": float("nan")},
    {"kind": "test.noop", "delay": timedelta(days=-1)},
    {"kind": "test.noop", "delay": timedelta(days=10**6)},
    {"kind": "test.noop", "idempotency_key": "k", "idempotency_ttl": "-5m"},
    {"kind": "test.noop", "run_at": datetime(2030, 1, 1)},  # no timezone
    {"kind": "test.noop", "run_at": "2030-01-01T00:00:00Z"},  # a string, not a datetime
    {"kind": "test.noop", "run_at": datetime(1, 1, 1, tzinfo=timezone(timedelta(hours=14)))},
    {"kind": "test.noop", "priority": 10**30},
    {"kind": "test.noop", "max_attempts": -3},
    {"kind": "test.noop", "meta": {"k": 1}},
    {"kind": "test.noop", "idempotency_key": ""},
    {"kind": "'; DROP TABLE dygo_jobs; --"},
    {"kind": "test.noop", "queue": "default'; --"},
    *(
        {"kind": "test.noop", field: value}
        for text in UNSTORABLE
        for field, value in (
            ("args", {"k": f"v{text}"}),
            ("args", {f"k{text}": 1}),
            ("meta", {"k": f"v{text}"}),
            ("meta", {f"k{text}": "v"}),
            ("idempotency_key", f"key{text}"),
            ("queue", f"default{text}"),
        )
    ),
    *({"kind": f"test{text}", "queue": "default"} for text in UNSTORABLE),
]


@pytest.mark.parametrize("request_fields", BAD_REQUESTS, ids=lambda fields: repr(fields)[:60])
def test_python_enqueue_refuses_bad_input_with_enqueue_error(db, request_fields):
    before = written(db)
    fields = dict(request_fields)
    kind, args = fields.pop("kind"), fields.pop("args", None)
    with pytest.raises(EnqueueError):
        enqueue(db, kind, args, **fields)
    with pytest.raises(EnqueueError):
        enqueue_many(db, [JobRequest("test.noop"), JobRequest(kind, args, **fields)])
    assert written(db) == before


def test_python_enqueue_stores_quotes_and_unicode_verbatim(db):
    for text in SQL_SIGNIFICANT + UNICODE:
        job = enqueue(db, "test.noop", {text: text}, meta={text: text}, idempotency_key=f"py-{text}", delay="1h")
        stored = db.execute("SELECT args, meta, idempotency_key FROM dygo_jobs WHERE id = %s", (job.id,)).fetchone()
        assert stored == ({text: text}, {text: text}, f"py-{text}")
    many = enqueue_many(
        db,
        [
            JobRequest("test.noop", {t: t}, meta={t: t}, run_at=datetime.now(UTC) + timedelta(hours=1))
            for t in SQL_SIGNIFICANT + UNICODE
        ],
    )
    rows = db.execute("SELECT args FROM dygo_jobs WHERE id = ANY(%s) ORDER BY id", ([m.id for m in many],)).fetchall()
    assert [r[0] for r in rows] == [{t: t} for t in SQL_SIGNIFICANT + UNICODE]


# --- the dashboard's filters ----------------------------------------------------------------------------


def test_dashboard_filters_take_hostile_text_without_a_server_error(serve, conn):
    api = serve(tokens=False)  # development on localhost: the dashboard needs no sign-in
    enqueue(conn, "test.noop", {"needle": "50% off_'quoted'"}, delay="1h")
    before = written(conn)
    for text in SQL_SIGNIFICANT + UNICODE + ["x" * 5000]:
        for name in ("queue", "kind", "q", "state", "cursor"):
            response = api.anon.get("/dashboard/jobs", params={name: text}, follow_redirects=False)
            assert response.status_code in (200, 303), f"{name}={text!r}: {response.status_code}"
    found = api.anon.get("/dashboard/jobs", params={"q": "50% off_'quoted'"})
    assert found.status_code == 200 and "50% off_" in found.text
    assert "50% off_" not in api.anon.get("/dashboard/jobs", params={"q": "50%_off"}).text  # wildcards are literal
    for name in ("queue", "kind", "q"):  # the dashboard's own error page, not the API's JSON
        nul = api.anon.get(f"/dashboard/jobs?{name}=a%00b")
        assert nul.status_code == 422 and nul.headers["content-type"].startswith("text/html"), nul.text[:300]
    for job_id in ("0", "-1", str(2**63), "abc"):
        assert 400 <= api.anon.get(f"/dashboard/jobs/{job_id}").status_code < 500
    assert written(conn) == before
