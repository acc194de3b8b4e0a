"""The enqueue routes answer one corpus of good and bad requests the same way on every path.

The routes' quick handlers (app/quick_route.py) read a well-formed request themselves and leave the rest
to FastAPI's standard handling of the same endpoint. This test sends one corpus through the real app
(in this process, on a fresh database per run, the lifespan and every middleware running) with tracing
off and on, and through a twin of the app whose enqueue routes are plain FastAPI routes of the same
endpoints (the standard handling for every request), and requires the same status, content type and
body (ids and server clocks aside), the same rows, and with tracing on the same spans.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import httpx
import psycopg
import pytest
from dygo.app.main import create_app
from dygo.store.config import load_settings
from dygo.store.enqueue import MAX_KEY_LENGTH
from dygo.store.registry import registry
from fastapi import FastAPI
from fastapi.routing import APIRoute
from psycopg.conninfo import make_conninfo
from starlette.routing import Match

from tests.conftest import ADMIN_TOKEN, TEST_CONFIG, FreshDatabases

trace = pytest.importorskip("opentelemetry.trace")
from opentelemetry.sdk.trace import TracerProvider  # noqa: E402
from opentelemetry.sdk.trace.export import SimpleSpanProcessor  # noqa: E402
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter  # noqa: E402
from opentelemetry.util._once import Once  # noqa: E402

ONE = "/api/v1/jobs"
BATCH = "/api/v1/jobs/batch"
JSON = {"content-type": "application/json"}
CALLER_SPAN = "4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7"
CALLER_TRACE = f"00-{CALLER_SPAN}-01"


@dataclass
class Case:
    name: str
    path: str
    body: bytes
    headers: list[tuple[str, str]] = field(default_factory=lambda: list(JSON.items()))


def case(name: str, path: str, body: Any, **headers: str) -> Case:
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    return Case(name, path, content, [*JSON.items(), *headers.items()])


def typed(name: str, path: str, body: bytes, content_type: str | None) -> Case:
    return Case(name, path, body, [] if content_type is None else [("content-type", content_type)])


EVERY_OPTION = {
    "kind": "test.record",
    "args": {"seconds": 0.5},
    "queue": "other",
    "priority": 7.0,
    "run_at": "2030-01-02T03:04:05+02:00",
    "max_attempts": 4,
    "meta": {"tenant": "acme"},
    "idempotency_key": "order-1",
    "idempotency_ttl": "1h",
}
PLAIN = {"kind": "test.noop", "args": {"n": 1}}
PLAIN_TEXT = json.dumps(PLAIN).encode()
RECORD = {"kind": "test.record", "args": {"seconds": 1}}  # a kind with an args model
BATCH_TEXT = json.dumps({"jobs": [PLAIN]}).encode()

CORPUS = [
    # One job: good.
    case("good single", ONE, PLAIN),
    case("every option", ONE, EVERY_OPTION),
    case("delay in seconds", ONE, {"kind": "test.noop", "delay": 90}),
    case("caller's trace", ONE, PLAIN, traceparent=CALLER_TRACE),
    case("header key", ONE, PLAIN, **{"Idempotency-Key": "webhook-77"}),
    case("duplicate header key", ONE, PLAIN, **{"Idempotency-Key": "webhook-77"}),
    case("body key of the header's job", ONE, {**PLAIN, "idempotency_key": "webhook-77"}),
    case("header and body keys agree", ONE, {**PLAIN, "idempotency_key": "same"}, **{"Idempotency-Key": "same"}),
    case("longest header key", ONE, PLAIN, **{"Idempotency-Key": "k" * MAX_KEY_LENGTH}),
    Case(
        "two header keys",
        ONE,
        PLAIN_TEXT,
        [*JSON.items(), ("idempotency-key", "a"), ("idempotency-key", "b")],
    ),
    typed("charset content type", ONE, PLAIN_TEXT, "application/json; charset=utf-8"),
    typed("+json content type", ONE, PLAIN_TEXT, "application/vnd.api+json"),
    case(
        "NaN and huge numbers in args",
        ONE,
        b'{"kind": "test.noop", "args": {"a": NaN, "b": 1e400, "c": 12345678901234567890123}}',
    ),
    case("repeated key in the body", ONE, b'{"kind": "no.such", "kind": "test.noop"}'),
    # One job: bad.
    case("bad JSON", ONE, b"{not json"),
    case("empty body", ONE, b""),
    typed("wrong content type", ONE, PLAIN_TEXT, "text/plain"),
    typed("no content type", ONE, PLAIN_TEXT, None),
    case("not an object", ONE, ["test.noop"]),
    case("missing kind", ONE, {"args": {}}),
    case("unknown kind", ONE, {"kind": "no.such"}),
    case("unknown queue", ONE, {"kind": "test.noop", "queue": "nope"}),
    case("bad args for the kind's model", ONE, {"kind": "test.record", "args": {"seconds": "soon"}}),
    case("lax args for the kind's model", ONE, {"kind": "test.record", "args": {"seconds": "5"}}),
    case("extra field", ONE, {**PLAIN, "colour": "red"}),
    case("wrong type", ONE, {**PLAIN, "priority": "high"}),
    case("option out of range", ONE, {**PLAIN, "priority": 5000}),
    case("bad duration", ONE, {**PLAIN, "delay": "tomorrow"}),
    case("bad timestamp", ONE, {**PLAIN, "run_at": "next tuesday"}),
    case("timestamp without a zone", ONE, {**PLAIN, "run_at": "2030-01-01T00:00:00"}),
    case("NUL in meta", ONE, {**PLAIN, "meta": {"k": "a\u0000b"}}),
    case("lone surrogate", ONE, b'{"kind": "test.noop", "args": {"k": "a\\ud800b"}}'),
    case("too-long header key", ONE, PLAIN, **{"Idempotency-Key": "k" * (MAX_KEY_LENGTH + 1)}),
    case("empty header key", ONE, PLAIN, **{"Idempotency-Key": ""}),
    case("header and body keys differ", ONE, {**PLAIN, "idempotency_key": "x"}, **{"Idempotency-Key": "y"}),
    case("too-large body", ONE, {"kind": "test.noop", "args": {"blob": "x" * (1024 * 1024)}}),
    # A batch: good.
    case("good batch", BATCH, {"jobs": [PLAIN, {"kind": "test.noop"}, {**PLAIN, "queue": "other", "delay": "1h"}]}),
    case("batch with options", BATCH, {"jobs": [EVERY_OPTION, {**EVERY_OPTION, "idempotency_key": "order-2"}]}),
    case("batch with a duplicate key", BATCH, {"jobs": [{**PLAIN, "idempotency_key": "b"}] * 2}),
    case(
        "batch, plain entries of a kind with an args model",
        BATCH,
        {"jobs": [{"kind": "test.record", "args": {"seconds": 1}}]},
    ),
    case("empty batch", BATCH, {"jobs": []}),
    case("batch at the maximum", BATCH, {"jobs": [PLAIN] * 1000}),
    typed("batch, charset content type", BATCH, BATCH_TEXT, "application/json; charset=utf-8"),
    case("batch with the caller's trace", BATCH, {"jobs": [PLAIN]}, traceparent=CALLER_TRACE),
    # A batch: bad.
    case("batch, bad JSON", BATCH, b'{"jobs": ['),
    typed("batch, wrong content type", BATCH, BATCH_TEXT, "text/plain"),
    case("batch with extra top-level keys", BATCH, {"jobs": [PLAIN], "queue": "other"}),
    case("batch without jobs", BATCH, {}),
    case("batch of a non-list", BATCH, {"jobs": {"kind": "test.noop"}}),
    case("batch of a non-object", BATCH, {"jobs": ["test.noop"]}),
    case("too-large batch", BATCH, {"jobs": [PLAIN] * 1001}),
    case("batch, entry with an extra field", BATCH, {"jobs": [PLAIN, {**PLAIN, "colour": "red"}]}),
    case("batch, entry with args not an object", BATCH, {"jobs": [PLAIN, {"kind": "test.noop", "args": [1]}]}),
    case(
        "batch, plain entry with lax args", BATCH, {"jobs": [PLAIN, {"kind": "test.record", "args": {"seconds": "5"}}]}
    ),
    case("batch, entry of an unknown kind", BATCH, {"jobs": [PLAIN, {"kind": "no.such"}]}),
    case("batch, entry with bad args", BATCH, {"jobs": [PLAIN, {"kind": "test.record", "args": {"seconds": "x"}}]}),
    case("batch, entry with a bad duration", BATCH, {"jobs": [PLAIN, {**PLAIN, "delay": "soon"}]}),
    case("batch, entry with NUL", BATCH, {"jobs": [PLAIN, {"kind": "test.noop", "args": {"k": "\u0000"}}]}),
    case("batch, too-large body", BATCH, {"jobs": [{"kind": "test.noop", "args": {"blob": "x" * (1024 * 1024)}}]}),
]

# The requests the quick handlers decline (FastAPI's standard handling answers them): another content type
# than application/json, a body the request model refuses or a JSON its parser refuses, a bad header.
DECLINED = {
    "charset content type",
    "+json content type",
    "empty body",
    "wrong content type",
    "no content type",
    "not an object",
    "missing kind",
    "extra field",
    "wrong type",
    "bad timestamp",
    "lone surrogate",
    "too-long header key",
    "empty header key",
    "bad JSON",
    "batch, charset content type",
    "batch, wrong content type",
    "batch with extra top-level keys",
    "batch without jobs",
    "batch of a non-list",
    "batch of a non-object",
    "batch, entry with an extra field",
    "batch, entry with args not an object",
    "batch, bad JSON",
}


@dataclass
class Answer:
    status: int
    content_type: str | None
    body: Any
    spans: list[dict[str, Any]]
    standard: bool | None  # answered by FastAPI's standard handling (known with tracing on: its operation spans)


def normalised(value: Any) -> Any:
    """The answer without what differs between runs: job ids and run_at times the server's clock set
    (a run_at the request gave, in 2030, stays)."""
    if isinstance(value, dict):
        return {
            key: "<id>"
            if key == "id" and isinstance(item, int)
            else "<now>"
            if key == "run_at" and isinstance(item, str) and not item.startswith("2030")
            else normalised(item)
            for key, item in value.items()
        }
    if isinstance(value, list):
        return [normalised(item) for item in value]
    return value


def span_records(spans: Sequence[Any]) -> list[dict[str, Any]]:
    """The spans of one request as a run can be compared with another: FastAPI's operation spans
    (`fastapi.dependencies`, `fastapi.endpoint`...) aside, as they time FastAPI's own dependency solving,
    which a quick handler does in its place; a parent named by role, as ids are random."""
    own = {span.get_span_context().span_id for span in spans}
    records = []
    for span in spans:
        if span.name.startswith("fastapi."):
            continue
        parent = span.parent
        records.append(
            {
                "name": span.name,
                "attributes": {key: value for key, value in (span.attributes or {}).items() if key != "dygo.job.id"},
                "status": span.status.status_code.name,
                "parent": None
                if parent is None
                else "caller"
                if f"{parent.trace_id:032x}-{parent.span_id:016x}" == CALLER_SPAN
                else "this request"
                if parent.span_id in own
                else "elsewhere",
            }
        )
    return records


@contextmanager
def tracing_on() -> Iterator[InMemorySpanExporter]:
    """A TracerProvider exporting to memory for the block, as an application's would; the global provider
    is put back afterwards, so other tests enqueue untraced."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    try:
        yield exporter
    finally:
        provider.shutdown()
        trace._TRACER_PROVIDER_SET_ONCE = Once()
        trace._TRACER_PROVIDER = None
        trace._PROXY_TRACER_PROVIDER = trace.ProxyTracerProvider()


def with_standard_enqueue_routes(app: FastAPI) -> FastAPI:
    """The app, its enqueue routes answered by FastAPI's standard handling of the same endpoints: plain
    FastAPI routes, ahead of the app's own in its route table."""
    for route in list(app.router.routes):
        if isinstance(route, APIRoute) and route.path in (ONE, BATCH) and "POST" in route.methods:
            twin = APIRoute(route.path, route.endpoint, methods=["POST"], status_code=route.status_code)
            app.router.routes.insert(0, twin)
            scope = {"type": "http", "method": "POST", "path": route.path, "root_path": ""}
            chosen = next(candidate for candidate in app.router.routes if candidate.matches(scope)[0] == Match.FULL)
            assert chosen is twin
    return app


async def send_corpus(app: FastAPI, exporter: InMemorySpanExporter | None) -> list[Answer]:
    answers = []
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        headers = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1", headers=headers) as client:
            for item in CORPUS:
                if exporter is not None:
                    exporter.clear()
                response = await client.post(item.path, content=item.body, headers=item.headers)
                try:
                    body = normalised(response.json())
                except ValueError:
                    body = response.text
                finished = exporter.get_finished_spans() if exporter else []
                standard = any(span.name == "fastapi.dependencies" for span in finished) if exporter else None
                answers.append(
                    Answer(
                        response.status_code,
                        response.headers.get("content-type"),
                        body,
                        span_records(finished),
                        standard,
                    )
                )
    return answers


def stored(url: str) -> list[tuple[Any, ...]]:
    """The rows the corpus wrote, without what differs between runs (ids, times, the trace context)."""
    with psycopg.connect(url) as conn:
        return conn.execute(
            "SELECT kind, queue, args, priority, max_attempts, meta - 'traceparent', idempotency_key, state, "
            "run_at > now() + interval '1 minute' FROM dygo_jobs ORDER BY id"
        ).fetchall()


@pytest.fixture
def run_corpus(server_url: str, fresh_databases: FreshDatabases, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """Send the corpus to a fresh app on a fresh database; its answers and the rows it wrote."""
    monkeypatch.setenv("DYGO_ADMIN_TOKEN", ADMIN_TOKEN)
    taken: list[str] = []

    def run(*, traced: bool, standard: bool) -> tuple[list[Answer], list[tuple[Any, ...]]]:
        taken.append(fresh_databases.take())
        url = make_conninfo(server_url, dbname=taken[-1])
        app = create_app(load_settings(TEST_CONFIG), registry, url)
        if standard:
            with_standard_enqueue_routes(app)
        if traced:
            with tracing_on() as exporter:
                answers = asyncio.run(send_corpus(app, exporter))
        else:
            answers = asyncio.run(send_corpus(app, None))
        return answers, stored(url)

    yield run
    for name in taken:
        fresh_databases.give_back(name)


def test_every_request_gets_the_same_answer_traced_or_not_and_from_the_standard_route(run_corpus):
    quick, quick_rows = run_corpus(traced=False, standard=False)
    runs = {
        "traced": run_corpus(traced=True, standard=False),
        "standard route": run_corpus(traced=False, standard=True),
        "standard route, traced": run_corpus(traced=True, standard=True),
    }
    for name, (answers, rows) in runs.items():
        for item, expected, got in zip(CORPUS, quick, answers, strict=True):
            answer, wanted = (
                (got.status, got.content_type, got.body),
                (expected.status, expected.content_type, expected.body),
            )
            assert answer == wanted, (name, item.name)
        assert rows == quick_rows, name
    traced, standard_traced = runs["traced"][0], runs["standard route, traced"][0]
    assert [answer.spans for answer in traced] == [answer.spans for answer in standard_traced]

    by_name = {item.name: answer for item, answer in zip(CORPUS, quick, strict=True)}
    # What each answer is (so that the paths agreeing is not all of them failing the same way).
    assert {name: by_name[name].status for name in ("good single", "every option", "good batch", "empty batch")} == {
        "good single": 201,
        "every option": 201,
        "good batch": 201,
        "empty batch": 201,
    }
    assert by_name["duplicate header key"].status == 200 and by_name["duplicate header key"].body["deduplicated"]
    assert by_name["body key of the header's job"].status == 200
    assert by_name["every option"].body == {"id": "<id>", "deduplicated": False, "run_at": "2030-01-02T01:04:05Z"}
    assert by_name["good batch"].body == {"jobs": [{"id": "<id>", "deduplicated": False, "run_at": "<now>"}] * 3}
    assert by_name["batch with a duplicate key"].body["jobs"][1] == {"id": "<id>", "deduplicated": True, "run_at": None}
    errors = {
        "bad JSON": (400, "invalid_json"),
        "batch, bad JSON": (400, "invalid_json"),
        "wrong content type": (422, "invalid_request"),
        "no content type": (422, "invalid_request"),
        "missing kind": (422, "invalid_request"),
        "unknown kind": (422, "unknown_kind"),
        "bad args for the kind's model": (422, "invalid_args"),
        "lax args for the kind's model": (422, "invalid_args"),
        "extra field": (422, "invalid_request"),
        "too-long header key": (422, "invalid_request"),
        "empty header key": (422, "invalid_request"),
        "header and body keys differ": (409, "idempotency_key_mismatch"),
        "batch with extra top-level keys": (422, "invalid_request"),
        "too-large batch": (422, "batch_too_large"),
        "too-large body": (413, "payload_too_large"),
        "batch, too-large body": (413, "payload_too_large"),
        "batch, entry of an unknown kind": (422, "unknown_kind"),
        "batch, entry with args not an object": (422, "invalid_request"),
        "batch, plain entry with lax args": (422, "invalid_args"),
    }
    assert {name: (by_name[name].status, by_name[name].body["error"]["code"]) for name in errors} == errors
    # With tracing on, every enqueue is in a dygo.enqueue span, within FastAPI's request span, or a child of the
    # caller's span when it sent one (as the request span is).
    traced_by_name = {item.name: answer for item, answer in zip(CORPUS, traced, strict=True)}
    for name in ("good single", "good batch", "every option", "caller's trace", "batch with the caller's trace"):
        spans = {span["name"]: span["parent"] for span in traced_by_name[name].spans}
        path = ONE if "batch" not in name else BATCH
        parent = "caller" if "caller" in name else None
        assert spans == {"dygo.enqueue": parent or "this request", f"POST {path}": parent}, name
    assert all(answer.spans == [] for answer in quick)
    # Which path answered: the quick handlers took every well-formed request and declined the rest; the twin's
    # plain routes solved FastAPI's dependencies for every request that reached them. (A body that is not JSON
    # is refused before FastAPI solves any dependency, and a too-large one before any route.)
    unsolved = {"bad JSON", "batch, bad JSON", "too-large body", "batch, too-large body"}
    assert {item.name for item, answer in zip(CORPUS, traced, strict=True) if answer.standard} == DECLINED - unsolved
    assert {item.name for item, answer in zip(CORPUS, standard_traced, strict=True) if not answer.standard} == unsolved
