"""Typed enqueue from the job itself: `@job` returns the handler with `.enqueue` and friends for its kind."""

from __future__ import annotations

import asyncio
import textwrap
from pathlib import Path

import psycopg
import pytest
from dygo.store.children import kind_name

from dygo import EnqueueError, Job, enqueue_many, make_context
from tests.jobs import Context, Sleep, context, noop, record_async, record_sync

pytestmark = pytest.mark.shared_database

REPO = Path(__file__).resolve().parent.parent


def stored(conn: psycopg.Connection, job_id: int) -> tuple:
    return conn.execute("SELECT kind, queue, args, priority, meta FROM dygo_jobs WHERE id = %s", (job_id,)).fetchone()


def test_job_enqueues_its_own_kind_with_its_args_model(conn):
    result = record_async.enqueue(conn, Sleep(seconds=0.25), priority=3, meta={"tenant": "acme"})
    assert stored(conn, result.id) == ("test.record", "default", {"seconds": 0.25}, 3, {"tenant": "acme"})


def test_job_keeps_its_declared_queue_and_priority(conn):
    assert stored(conn, context.enqueue(conn, Context()).id)[:4] == ("test.context", "other", {}, 5)


def test_untyped_job_takes_a_dict(conn):
    assert stored(conn, noop.enqueue(conn, {"n": 1}).id)[:3] == ("test.noop", "default", {"n": 1})


def test_job_validates_args_as_the_string_kind_api_does(conn):
    with pytest.raises(EnqueueError) as raised:
        record_async.enqueue(conn, {"seconds": "soon"})  # type: ignore[arg-type]
    assert raised.value.code == "invalid_args"


def test_enqueue_many_puts_one_job_per_args_with_shared_options(conn):
    results = record_sync.enqueue_many(conn, [Sleep(seconds=n) for n in range(3)], priority=-2)
    rows = [stored(conn, r.id) for r in results]
    assert [r[2]["seconds"] for r in rows] == [0, 1, 2]
    assert {(r[0], r[1], r[3]) for r in rows} == {("test.record_sync", "other", -2)}


def test_requests_carry_options_per_job_into_the_batch(conn):
    first, again = enqueue_many(
        conn, [noop.request({}, idempotency_key="typed-once"), noop.request({}, idempotency_key="typed-once")]
    )
    assert (again.id, again.deduplicated) == (first.id, True)


def test_async_twins_enqueue_through_an_async_connection(db_url):
    async def go() -> list[tuple]:
        async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as aconn:
            one = await record_async.aenqueue(aconn, Sleep(seconds=1))
            many = await record_async.aenqueue_many(aconn, [Sleep(), Sleep()])
            cursor = await aconn.execute(
                "SELECT kind FROM dygo_jobs WHERE id = ANY(%s) ORDER BY id", ([one.id, *(r.id for r in many)],)
            )
            return await cursor.fetchall()

    assert asyncio.run(go()) == [("test.record",)] * 3


def test_calling_the_job_still_calls_its_handler():
    assert isinstance(context, Job)
    result = asyncio.run(context(make_context("test.context", id=7), Context()))
    assert (result["id"], result["kind"]) == (7, "test.context")
    assert (context.__name__, context.__module__, context.kind) == ("context", "tests.jobs", "test.context")


def test_a_job_names_its_kind_where_a_handler_is_taken():
    assert kind_name(context) == kind_name(context.handler) == "test.context"


def test_batch_on_a_connection_out_of_autocommit_rolls_back_with_the_caller(db_url):
    with psycopg.connect(db_url) as conn:  # no autocommit, no transaction open yet
        before = conn.execute("SELECT count(*) FROM dygo_jobs").fetchone()[0]
        conn.rollback()
        # A keyed job takes the several-statement path, which must not commit on its own.
        noop.enqueue_many(conn, [{}, {}], idempotency_key="rolled-back-batch")
        conn.rollback()
        assert conn.execute("SELECT count(*) FROM dygo_jobs").fetchone()[0] == before


def test_the_readme_example_enqueues_with_its_own_write(conn):
    from tests.typed_project.right import sign_up

    conn.execute("CREATE TABLE IF NOT EXISTS users (email text PRIMARY KEY)")
    job_id = sign_up(conn, "new@example.com")
    assert stored(conn, job_id)[:3] == ("email.send", "default", {"to": "new@example.com", "subject": "Welcome"})
    assert conn.execute("SELECT count(*) FROM users WHERE email = 'new@example.com'").fetchone() == (1,)


def test_the_readme_shows_the_tested_example():
    snippet = (REPO / "tests" / "typed_project" / "right.py").read_text().split("[start:typed]\n")[1]
    lines = snippet.split("    # --8<-- [end:typed]")[0].splitlines()
    assert textwrap.dedent("\n".join(lines)) in (REPO / "README.md").read_text()
