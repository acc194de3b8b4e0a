"""Enqueue: every option, both idempotency modes, batches by COPY, the outbox, and bad input."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import psycopg
import pytest
from dygo.store import EnqueueError, JobRequest, enqueue, enqueue_many
from dygo.store.leases import jobs_pending


def row(conn, job_id: int) -> dict:
    cursor = conn.cursor(row_factory=psycopg.rows.dict_row)
    return cursor.execute("SELECT *, run_at - enqueued_at AS lead FROM dygo_jobs WHERE id = %s", (job_id,)).fetchone()


def test_enqueue_stores_the_job_with_definition_defaults(conn):
    result = enqueue(conn, "test.context", {})
    job = row(conn, result.id)
    assert not result.deduplicated
    assert (job["kind"], job["queue"], job["priority"], job["state"], job["attempt"]) == (
        "test.context",
        "other",
        5,
        "pending",
        0,
    )
    assert job["max_attempts"] is None  # unset: resolved at the first lease (test_leases)


def test_enqueue_options_are_stored(conn):
    result = enqueue(
        conn, "test.record", {"seconds": 0.5}, queue="other", priority=-3, max_attempts=7, meta={"tenant": "acme"}
    )
    job = row(conn, result.id)
    assert (job["queue"], job["priority"], job["max_attempts"], job["meta"], job["args"]) == (
        "other",
        -3,
        7,
        {"tenant": "acme"},
        {"seconds": 0.5},
    )


def test_delay_is_computed_on_the_database_clock(conn):
    result = enqueue(conn, "test.noop", {}, delay="90s")
    job = row(conn, result.id)
    assert job["lead"] == timedelta(seconds=90)
    assert result.run_at == job["run_at"]


def test_run_at_is_kept_exactly(conn):
    when = datetime(2030, 1, 2, 3, 4, 5, tzinfo=UTC)
    assert row(conn, enqueue(conn, "test.noop", {}, run_at=when).id)["run_at"] == when


def test_live_idempotency_key_deduplicates_until_the_job_finishes(conn):
    first = enqueue(conn, "test.noop", {}, idempotency_key="order-42")
    again = enqueue(conn, "test.noop", {}, idempotency_key="order-42")
    assert (again.id, again.deduplicated) == (first.id, True)
    conn.execute("UPDATE dygo_jobs SET state = 'succeeded' WHERE id = %s", (first.id,))
    after = enqueue(conn, "test.noop", {}, idempotency_key="order-42")
    assert not after.deduplicated and after.id != first.id


def test_windowed_idempotency_key_survives_completion_until_it_expires(conn):
    first = enqueue(conn, "test.noop", {}, idempotency_key="hook-7", idempotency_ttl="1h")
    conn.execute("UPDATE dygo_jobs SET state = 'succeeded' WHERE id = %s", (first.id,))
    again = enqueue(conn, "test.noop", {}, idempotency_key="hook-7", idempotency_ttl="1h")
    assert (again.id, again.deduplicated) == (first.id, True)
    conn.execute("UPDATE dygo_idempotency_keys SET expires_at = now() - interval '1s'")
    later = enqueue(conn, "test.noop", {}, idempotency_key="hook-7", idempotency_ttl="1h")
    assert not later.deduplicated and later.id != first.id


@pytest.fixture(params=["enqueue_many", "aenqueue_many"])
def batch(request, conn, db_url):
    """The batch enqueue, sync and async: both keep the same rules."""
    if request.param == "enqueue_many":
        return lambda jobs: enqueue_many(conn, jobs)
    return lambda jobs: run_async_batch(db_url, jobs)


def test_batch_is_copied_in_order_with_per_row_options(conn, batch):
    requests = [JobRequest("test.noop", {}, priority=i % 3) for i in range(2500)]
    requests.append(JobRequest("test.record", {"seconds": 1}, delay="1h", queue="other"))
    results = batch(requests)
    assert len(results) == 2501 and not any(r.deduplicated for r in results)
    assert [r.id for r in results] == sorted(r.id for r in results)
    assert conn.execute("SELECT count(*) FROM dygo_jobs").fetchone()[0] == 2501
    last = row(conn, results[-1].id)
    assert (last["queue"], last["args"], last["lead"]) == ("other", {"seconds": 1}, timedelta(hours=1))
    assert last["run_at"] == results[-1].run_at and row(conn, results[4].id)["priority"] == 1


def test_small_batch_without_keys_keeps_order_and_per_row_options(conn, batch):
    at = datetime(2030, 1, 2, 3, 4, 5, 678000, tzinfo=UTC)
    results = batch(
        [
            {"kind": "test.noop", "priority": 2},
            {"kind": "test.record", "args": {"seconds": 1}, "queue": "other", "delay": "1h"},
            {"kind": "test.noop", "run_at": at, "max_attempts": 7},
        ]
    )
    assert [r.id for r in results] == sorted(r.id for r in results) and not any(r.deduplicated for r in results)
    first, second, third = (row(conn, r.id) for r in results)
    assert first["priority"] == 2 and (second["queue"], second["lead"]) == ("other", timedelta(hours=1))
    assert (third["run_at"], third["max_attempts"]) == (at, 7) and results[2].run_at == at


def test_batch_with_keys_reports_deduplicated_rows(conn, batch):
    held = enqueue(conn, "test.noop", {}, idempotency_key="a")
    results = batch(
        [
            {"kind": "test.noop", "idempotency_key": "a"},
            {"kind": "test.noop", "idempotency_key": "b"},
            {"kind": "test.noop", "idempotency_key": "b"},
            {"kind": "test.noop"},
            {"kind": "test.noop", "idempotency_key": "w", "idempotency_ttl": "1m"},
        ]
    )
    assert [r.deduplicated for r in results] == [True, False, True, False, False]
    assert results[0].id == held.id and results[2].id == results[1].id
    assert conn.execute("SELECT count(*) FROM dygo_jobs").fetchone()[0] == 4


def test_batch_is_all_or_nothing(conn):
    with pytest.raises(EnqueueError):
        enqueue_many(conn, [{"kind": "test.noop"}, {"kind": "no.such.kind"}])
    with pytest.raises(psycopg.errors.CheckViolation), conn.transaction():
        enqueue_many(conn, [{"kind": "test.noop"}])
        conn.execute("INSERT INTO dygo_jobs (kind, queue, max_attempts) VALUES ('x', 'default', 0)")
    assert conn.execute("SELECT count(*) FROM dygo_jobs").fetchone()[0] == 0


def test_enqueue_inside_the_callers_transaction_commits_and_notifies_with_it(db_url):
    with psycopg.connect(db_url, autocommit=True) as listener, psycopg.connect(db_url) as app:
        listener.execute("LISTEN dygo_jobs")
        app.execute("CREATE TABLE orders (id int)")
        app.commit()
        with app.transaction():
            app.execute("INSERT INTO orders VALUES (1)")
            job = enqueue(app, "test.noop", {})
            assert list(listener.notifies(timeout=0.2, stop_after=1)) == []  # nothing before commit
        # The payload: the queue and, for workers whose walk starts past it, the job's place in line.
        [payload] = [n.payload for n in listener.notifies(timeout=2, stop_after=1)]
        run_at = app.execute("SELECT run_at FROM dygo_jobs WHERE id = %s", (job.id,)).fetchone()[0]
        queue, notified = jobs_pending(payload)
        assert queue == "default" and notified is not None and abs(notified - run_at) < timedelta(microseconds=1)

        with pytest.raises(RuntimeError), app.transaction():
            enqueue(app, "test.noop", {})
            raise RuntimeError("the order failed")
        app.commit()
        assert app.execute("SELECT array_agg(id) FROM dygo_jobs").fetchone()[0] == [job.id]


@pytest.mark.parametrize(
    ("kind", "args", "options", "code", "message"),
    [
        ("no.such.kind", {}, {}, "unknown_kind", "not registered"),
        ("test.noop", {}, {"queue": "nope"}, "unknown_queue", "queue 'nope' is not configured"),
        ("test.record", {"seconds": "long"}, {}, "invalid_args", "invalid"),
        ("test.noop", [], {}, "invalid_args", "JSON object"),
        ("test.noop", {}, {"priority": 5000}, "invalid_option", "priority must be an integer from -1000 to 1000"),
        ("test.noop", {}, {"max_attempts": 0}, "invalid_option", "max_attempts"),
        ("test.noop", {}, {"delay": "-5s"}, "invalid_duration", "delay: must not be negative"),
        ("test.noop", {}, {"delay": "5s", "run_at": datetime.now(UTC)}, "invalid_option", "not both"),
        ("test.noop", {}, {"run_at": datetime(2030, 1, 1)}, "invalid_timestamp", "timezone"),
        ("test.noop", {}, {"meta": {"n": 1}}, "invalid_option", "meta must map strings"),
        ("test.noop", {}, {"idempotency_ttl": "1h"}, "invalid_option", "needs an idempotency_key"),
        ("test.noop", {}, {"idempotency_key": "x" * 300}, "invalid_option", "1 to 255"),
    ],
)
def test_bad_enqueue_names_the_field_and_writes_nothing(conn, kind, args, options, code, message):
    with pytest.raises(EnqueueError) as caught:
        enqueue(conn, kind, args, **options)
    assert caught.value.code == code
    assert message in str(caught.value)
    assert conn.execute("SELECT count(*) FROM dygo_jobs").fetchone()[0] == 0


# A producer process that imports no job module and never calls load_jobs: the rule that a job must name a
# configured queue holds for it too, on every Python enqueue path.
PRODUCER = r"""
import asyncio, json, sys
import psycopg
from dygo.store import EnqueueError, aenqueue, enqueue, enqueue_many
from dygo.store.enqueue import aenqueue_many

url, out = sys.argv[1], {}

def attempt(name, call):
    try:
        call()
        out[name] = "stored"
    except EnqueueError as exc:
        out[name] = [exc.code, str(exc), exc.details]

with psycopg.connect(url, autocommit=True) as conn:
    attempt("unknown", lambda: enqueue(conn, "totally.unknown", {}, queue="nowhere"))
    attempt("not_kebab", lambda: enqueue(conn, "example.noop", {}, queue="Not_Kebab"))
    attempt("batch", lambda: enqueue_many(conn, [{"kind": "x.y", "queue": "default"},
                                                 {"kind": "x.y", "queue": "nowhere"}]))
    attempt("configured", lambda: enqueue(conn, "x.y", {}, queue="other"))

async def main():
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        try:
            await aenqueue(conn, "x.y", {}, queue="nowhere")
            out["async"] = "stored"
        except EnqueueError as exc:
            out["async"] = [exc.code, str(exc), exc.details]
        try:
            await aenqueue_many(conn, [{"kind": "x.y", "queue": "elsewhere"}])
            out["async_batch"] = "stored"
        except EnqueueError as exc:
            out["async_batch"] = [exc.code, str(exc), exc.details]

asyncio.run(main())
print(json.dumps(out))
"""


def run_producer(db_url: str, cwd, **env: str) -> dict:
    import json
    import os
    import subprocess
    import sys

    from tests.conftest import REPO

    environment = {k: v for k, v in os.environ.items() if not k.startswith("DYGO_")}
    environment.update(PYTHONPATH=str(REPO), **env)
    done = subprocess.run(
        [sys.executable, "-c", PRODUCER, db_url], cwd=cwd, env=environment, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_enqueue_refuses_unknown_and_non_kebab_queues_without_loaded_config(conn, db_url, tmp_path):
    from tests.conftest import TEST_CONFIG

    out = run_producer(db_url, tmp_path, DYGO_CONFIG_DIR=str(TEST_CONFIG))
    assert out["unknown"][0] == "unknown_queue" and "'nowhere' is not configured" in out["unknown"][1]
    assert out["unknown"][2] == {"field": "queue"}
    assert out["not_kebab"][0] == "unknown_queue" and "kebab-case" in out["not_kebab"][1]
    assert out["batch"][0] == "unknown_queue" and out["batch"][1].startswith("jobs[1]: ")
    assert out["async"][0] == "unknown_queue" and out["async_batch"][0] == "unknown_queue"
    assert out["configured"] == "stored"
    assert conn.execute("SELECT queue FROM dygo_jobs").fetchall() == [("other",)]


def test_enqueue_without_any_queue_config_refuses_rather_than_guessing(conn, db_url, tmp_path):
    out = run_producer(db_url, tmp_path)  # no config/ here, no DYGO_CONFIG_DIR
    assert out["configured"][0] == "queues_unknown"
    assert "queues.yml" in out["configured"][1] and "DYGO_CONFIG_DIR" in out["configured"][1]
    assert "kebab-case" in out["not_kebab"][1]  # a bad name is refused as such, config or not
    assert conn.execute("SELECT count(*) FROM dygo_jobs").fetchone()[0] == 0


# --- aenqueue_many: the async batch, with enqueue_many's rules ----------------------------------------


def run_async_batch(db_url: str, jobs: list, *, fail_after: bool = False) -> list:
    import asyncio

    from dygo.store.enqueue import aenqueue_many

    async def go() -> list:
        async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as aconn:
            if not fail_after:
                return await aenqueue_many(aconn, jobs)
            async with aconn.transaction():  # the caller's transaction: the batch goes with it
                await aenqueue_many(aconn, jobs)
                raise RuntimeError("the caller's work failed")

    return asyncio.run(go())


def test_async_batch_is_all_or_nothing(conn, db_url):
    with pytest.raises(EnqueueError) as caught:
        run_async_batch(db_url, [{"kind": "test.noop"}, {"kind": "no.such.kind"}])
    assert caught.value.code == "unknown_kind" and str(caught.value).startswith("jobs[1]: ")
    with pytest.raises(RuntimeError):
        run_async_batch(db_url, [{"kind": "test.noop"}] * 3, fail_after=True)
    assert conn.execute("SELECT count(*) FROM dygo_jobs").fetchone()[0] == 0
    assert run_async_batch(db_url, []) == []


def _row(**values) -> dict:
    base = {"kind": "test.noop", "queue": "default", "args": "{}", "meta": "{}", "priority": 0}
    base.update({"run_at": None, "delay": 0.0, "max_attempts": None, "key": None, "ttl": None})
    return {**base, **values}


def _as_objects(rows: list[dict]) -> list[dict]:
    """The same rows as plain objects, for json.dumps: args and meta parsed back from their JSON text."""
    import json

    return [
        {
            "kind": r["kind"],
            "queue": r["queue"],
            "args": json.loads(r["args"]),
            "meta": json.loads(r["meta"]),
            "priority": r["priority"],
            "run_at": None if r["run_at"] is None else r["run_at"].isoformat(),
            "delay": r["delay"],
            "max_attempts": r["max_attempts"],
        }
        for r in rows
    ]


def test_a_batchs_rows_are_written_with_the_bytes_json_dumps_gives_them():
    import json
    from datetime import timezone

    from dygo.store.enqueue import JobRequest, prepare, rows_json

    awkward = 'a "quoted" \\ back\\slash, tab\t, newline\n, bell\x07, \x7f, é, 漢字, emoji 🎉, \u2028'
    prepared = [
        prepare(JobRequest("test.noop", {"text": awkward, awkward: [awkward, 2**70, -(2**63), 0.1, 1e-7, 1e300]})),
        prepare(JobRequest("test.noop", {}, meta={"tenant": awkward}, priority=-1000, max_attempts=1000)),
        prepare(JobRequest("test.noop", {}, delay="1.5s")),
        prepare(JobRequest("test.noop", {}, delay=0.1)),
        prepare(JobRequest("test.noop", {}, run_at=datetime(2030, 1, 2, 3, 4, 5, 678901, tzinfo=UTC))),
        prepare(
            JobRequest(
                "test.noop", {}, run_at=datetime(1, 1, 1, tzinfo=timezone(timedelta(hours=5))) + timedelta(days=1)
            )
        ),
        prepare(JobRequest("not.registered-kind_1", {"a": None, "b": True, "c": False}, queue="default")),
    ]
    built = [
        _row(delay=31622400.0),  # a year, the longest
        _row(delay=1e-9, max_attempts=2**31 - 1, priority=1000),
        _row(run_at=datetime(2030, 6, 1, 12, 0, tzinfo=timezone(timedelta(hours=-9, minutes=-30)))),
        _row(kind='kind "with" quotes \\', queue="q\u00e9"),
    ]
    for rows in (prepared, built, prepared + built, prepared[:1], []):
        assert rows_json(rows) == json.dumps(_as_objects(rows))
