"""OpenTelemetry: the enqueue span's context travels in the job's meta to the worker's handler span."""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from dygo.store import aenqueue, enqueue, enqueue_many
from dygo.store.config import load_settings
from dygo.store.registry import registry
from dygo.store.schedules import load_schedules, sync

from tests.conftest import REPO, TEST_CONFIG, dygo_env
from tests.span_file import read_spans

trace = pytest.importorskip("opentelemetry.trace")
from opentelemetry.sdk.trace import TracerProvider  # noqa: E402
from opentelemetry.sdk.trace.export import SimpleSpanProcessor  # noqa: E402
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter  # noqa: E402
from opentelemetry.util._once import Once  # noqa: E402


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    """This test process exports to memory; the global provider is put back afterwards, so other tests
    enqueue without tracing (as opentelemetry-test-utils' reset_trace_globals does)."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    yield exporter
    provider.shutdown()
    trace._TRACER_PROVIDER_SET_ONCE = Once()
    trace._TRACER_PROVIDER = None
    trace._PROXY_TRACER_PROVIDER = trace.ProxyTracerProvider()


def ids(span) -> tuple[str, str]:
    context = span.get_span_context()
    return f"{context.trace_id:032x}", f"{context.span_id:016x}"


def meta(conn, job_id: int) -> dict[str, str]:
    return conn.execute("SELECT meta FROM dygo_jobs WHERE id = %s", (job_id,)).fetchone()[0]


def run_worker_once(spawn, db_url: str, spans_file) -> list[dict]:
    worker = spawn("worker", "--once", env=dygo_env(db_url, DYGO_TEST_SPANS_FILE=str(spans_file)))
    assert worker.wait() == 0, worker.stderr()
    return [span for span in read_spans(spans_file) if span["name"].startswith("dygo.execute")]


def test_handler_span_in_the_worker_is_a_child_of_the_enqueue_span(conn, db_url, spawn, spans, tmp_path):
    succeeding = enqueue(conn, "test.noop", {}, meta={"tenant": "acme"}).id
    failing = enqueue(conn, "test.fail", {"times": 10}).id
    batch = [job.id for job in enqueue_many(conn, [{"kind": "test.noop"}, {"kind": "test.noop", "queue": "other"}])]
    enqueued = spans.get_finished_spans()
    assert [span.name for span in enqueued] == ["dygo.enqueue"] * 3
    single, fail_span, batch_span = enqueued
    assert dict(single.attributes) == {
        "dygo.job.kind": "test.noop",
        "dygo.job.queue": "default",
        "dygo.job.id": succeeding,
    }
    assert dict(batch_span.attributes) == {"dygo.jobs.count": 2}
    trace_id, span_id = ids(single)
    carried = meta(conn, succeeding)
    assert carried.pop("traceparent").startswith(f"00-{trace_id}-{span_id}-")  # then the flags: sampled
    assert carried == {"tenant": "acme"}

    executed = {span["attributes"]["dygo.job.id"]: span for span in run_worker_once(spawn, db_url, tmp_path / "s")}
    assert set(executed) == {succeeding, failing, *batch}
    for job_id, parent in [(succeeding, single), (failing, fail_span), (batch[0], batch_span), (batch[1], batch_span)]:
        assert (executed[job_id]["trace_id"], executed[job_id]["parent_id"]) == ids(parent)
    ok = executed[succeeding]
    assert ok["name"] == "dygo.execute test.noop" and ok["status"] == "UNSET"
    assert ok["attributes"] == {
        "dygo.job.id": succeeding,
        "dygo.job.kind": "test.noop",
        "dygo.job.queue": "default",
        "dygo.job.attempt": 1,
        "dygo.job.outcome": "succeeded",
    }
    failed = executed[failing]
    assert failed["attributes"]["dygo.job.outcome"] == "failed" and failed["status"] == "ERROR"
    assert [
        (e["name"], e["attributes"]["exception.type"], e["attributes"]["exception.message"]) for e in failed["events"]
    ] == [("exception", "ValueError", "failure number 1")]
    assert executed[batch[1]]["attributes"]["dygo.job.queue"] == "other"


def test_http_enqueue_continues_the_callers_trace_into_the_worker(serve, conn, db_url, spawn, tmp_path):
    spans_file = tmp_path / "spans.jsonl"
    api = serve(DYGO_TEST_SPANS_FILE=str(spans_file))
    caller_trace, caller_span = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
    response = api.admin.post(
        "/api/v1/jobs", json={"kind": "test.noop"}, headers={"traceparent": f"00-{caller_trace}-{caller_span}-01"}
    )
    assert response.status_code == 201, response.text
    job_id = response.json()["id"]
    [enqueued] = [span for span in read_spans(spans_file) if span["name"] == "dygo.enqueue"]
    assert (enqueued["trace_id"], enqueued["parent_id"]) == (caller_trace, caller_span)
    assert list(meta(conn, job_id)) == ["traceparent"]
    assert meta(conn, job_id)["traceparent"].startswith(f"00-{caller_trace}-{enqueued['span_id']}-")

    [executed] = run_worker_once(spawn, db_url, spans_file)
    assert (executed["trace_id"], executed["parent_id"]) == (caller_trace, enqueued["span_id"])


def test_without_opentelemetry_installed_enqueue_and_worker_run_untraced(conn, db_url):
    """A process where `import opentelemetry` fails, as when the `otel` extra is not installed."""
    blocked = "import sys; sys.modules['opentelemetry'] = None; "
    enqueue_script = blocked + (
        "import os, psycopg; from dygo.store import enqueue, tracing; from dygo.store.config import load_settings; "
        "from dygo.store.loading import load_jobs; load_jobs(load_settings()); assert not tracing.active(); "
        "conn = psycopg.connect(os.environ['DATABASE_URL'], autocommit=True); "
        "print(enqueue(conn, 'test.noop', {}, meta={'tenant': 'acme'}).id)"
    )
    worker_script = blocked + "from dygo.cli import main; sys.exit(main(['worker', '--once']))"
    env = dygo_env(db_url)
    done = subprocess.run(
        [sys.executable, "-c", enqueue_script], cwd=REPO, env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    job_id = int(done.stdout)
    worker = subprocess.run(
        [sys.executable, "-c", worker_script], cwd=REPO, env=env, capture_output=True, text=True, timeout=60
    )
    assert worker.returncode == 0, worker.stderr
    state, job_meta = conn.execute("SELECT state, meta FROM dygo_jobs WHERE id = %s", (job_id,)).fetchone()
    assert (state, job_meta) == ("succeeded", {"tenant": "acme"})


def test_async_enqueue_is_traced_like_the_sync_one(conn, db_url, spans):
    async def enqueue_one() -> int:
        async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as aconn:
            return (await aenqueue(aconn, "test.noop", {}, queue="other")).id

    job_id = asyncio.run(enqueue_one())
    [span] = spans.get_finished_spans()
    assert (span.name, dict(span.attributes)) == (
        "dygo.enqueue",
        {"dygo.job.kind": "test.noop", "dygo.job.queue": "other", "dygo.job.id": job_id},
    )
    trace_id, span_id = ids(span)
    assert meta(conn, job_id)["traceparent"].startswith(f"00-{trace_id}-{span_id}-")


def due_schedule(conn, db_url: str, tmp_path: Path) -> Path:
    """A config dir declaring schedule `tick` (test.noop every minute), synced and due now."""
    config = tmp_path / "config"
    config.mkdir()
    for name in ("queues.yml", "dygo.yml"):
        shutil.copy(TEST_CONFIG / name, config)
    (config / "schedules.yml").write_text("schedules:\n  - {name: tick, cron: '* * * * *', kind: test.noop}\n")

    async def synced() -> None:
        async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as aconn:
            await sync(aconn, load_schedules(load_settings(config), registry, declared={}).values())

    asyncio.run(synced())
    conn.execute("UPDATE dygo_schedules SET next_run_at = now() - interval '1 second'")
    return config


def fired_job(conn) -> tuple[int, dict[str, str]]:
    [(job_id, job_meta)] = conn.execute("SELECT id, meta FROM dygo_jobs WHERE meta->>'schedule' = 'tick'").fetchall()
    return job_id, job_meta


def test_a_cron_fired_job_runs_in_the_trace_of_its_schedule_fire_span(conn, db_url, spawn, tmp_path):
    config = due_schedule(conn, db_url, tmp_path)
    spans_file = tmp_path / "spans.jsonl"
    worker = spawn(
        "worker", "--once", env=dygo_env(db_url, DYGO_CONFIG_DIR=str(config), DYGO_TEST_SPANS_FILE=str(spans_file))
    )
    assert worker.wait() == 0, worker.stderr()
    job_id, job_meta = fired_job(conn)
    by_name = {span["name"]: span for span in read_spans(spans_file)}
    fire, enqueued, executed = by_name["dygo.schedule.fire"], by_name["dygo.enqueue"], by_name["dygo.execute test.noop"]
    assert fire["parent_id"] is None  # a fire has no caller: it starts the trace
    assert fire["attributes"] == {
        "dygo.schedule.name": "tick",
        "dygo.schedule.occurrence": job_meta["occurrence"],
        "dygo.job.kind": "test.noop",
        "dygo.job.id": job_id,
        "dygo.schedule.outcome": "fired",
    }
    # fire -> enqueue (its context in the job's meta) -> the handler, one trace
    assert (enqueued["trace_id"], enqueued["parent_id"]) == (fire["trace_id"], fire["span_id"])
    assert job_meta["traceparent"].startswith(f"00-{fire['trace_id']}-{enqueued['span_id']}-")
    assert (executed["trace_id"], executed["parent_id"]) == (fire["trace_id"], enqueued["span_id"])
    assert executed["attributes"]["dygo.job.id"] == job_id


def test_an_untraced_worker_fires_schedules_without_trace_context_in_the_meta(conn, db_url, spawn, tmp_path):
    config = due_schedule(conn, db_url, tmp_path)
    worker = spawn("worker", "--once", env=dygo_env(db_url, DYGO_CONFIG_DIR=str(config)))
    assert worker.wait() == 0, worker.stderr()
    _, job_meta = fired_job(conn)
    assert sorted(job_meta) == ["occurrence", "schedule"]
