"""One rule for "the database is down" (store/outage.py is_outage): an outage is logged once and ridden out,
anything else the database answers stops the worker with one line naming it, and gives `serve` a 500.

The errors are real ones from the test server: a role without a privilege, a table without a column, a
backend terminated, a database refusing connections."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator

import psycopg
import pytest
from dygo.app.errors import ApiError, coded_response
from dygo.store import enqueue
from dygo.store.errors import (
    CodedError,
    Conflict,
    DatabaseUnavailable,
    EnqueueConflict,
    EnqueueError,
    NotFound,
    StatementError,
)
from dygo.store.outage import describe, is_outage
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from psycopg_pool import ConnectionPool, PoolTimeout

from tests.conftest import dygo_env, start_serve, wait_until

LOST = "database connection lost"


@pytest.fixture
def role_url(db_url: str, conn: psycopg.Connection, server_url: str) -> Iterator[tuple[str, str]]:
    """A login role with every privilege on this test database's tables (the test takes some away), and a URL
    that connects as it: (role, url)."""
    role = f"dygo_test_role_{uuid.uuid4().hex[:10]}"
    conn.execute(f"CREATE ROLE {role} LOGIN")
    conn.execute(f"GRANT ALL ON ALL TABLES IN SCHEMA public TO {role}")
    conn.execute(f"GRANT ALL ON ALL SEQUENCES IN SCHEMA public TO {role}")
    yield role, make_conninfo(db_url, user=role)
    conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = %s", (role,))
    conn.execute(f"DROP OWNED BY {role}")
    with psycopg.connect(server_url, autocommit=True) as admin:
        admin.execute(f"DROP ROLE {role}")


def start_worker(spawn, url: str):
    return spawn("worker", "--poll-interval", "60s", "--shutdown-timeout", "1s", env=dygo_env(url))


def assert_stopped_naming(process, *fragments: str) -> str:
    """The worker exits 1 within 30 s, its log names the error in one line, and says nothing of a lost
    connection."""
    assert process.wait(timeout=30) == 1, process.stderr()[-3000:]
    stderr = process.stderr()
    [line] = [line for line in stderr.splitlines() if "died on a database error that is not an outage" in line]
    for fragment in fragments:
        assert fragment in line, line
    assert LOST not in stderr, stderr[-3000:]
    assert "Traceback" not in stderr, stderr[-3000:]
    assert "died (see the log); exit 1" in "".join(process.lines)
    return line


def test_a_worker_whose_role_cannot_update_the_jobs_table_exits_1_naming_the_privilege(conn, spawn, role_url):
    role, url = role_url
    conn.execute(f"REVOKE UPDATE ON dygo_jobs FROM {role}")
    enqueue(conn, "test.record", {})
    process = start_worker(spawn, url)
    line = assert_stopped_naming(
        process, "InsufficientPrivilege (SQLSTATE 42501): permission denied for table dygo_jobs", "worker service "
    )
    assert "worker service producer" in line or "worker service maintainer" in line, line
    assert conn.execute("SELECT state FROM dygo_jobs").fetchone()[0] == "pending"


def test_a_worker_on_a_jobs_table_missing_a_column_the_claim_uses_exits_1_naming_it(conn, spawn, db_url):
    conn.execute("ALTER TABLE dygo_jobs DROP COLUMN priority")
    process = start_worker(spawn, db_url)
    assert_stopped_naming(process, "UndefinedColumn (SQLSTATE 42703)", "priority", "worker service producer")


@pytest.mark.parametrize("command", ["worker", "serve"])
def test_a_privilege_missing_at_start_ends_the_process_with_one_line_naming_it(conn, spawn, role_url, command):
    role, url = role_url
    conn.execute(f"REVOKE SELECT ON dygo_migrations FROM {role}")
    process = spawn(command, env=dygo_env(url, DYGO_SCHEMA_WAIT="0"))
    assert process.wait(timeout=30) == 1
    stderr = process.stderr()
    assert stderr.strip().splitlines() == [
        f"dygo {command}: start-up: checking the schema: InsufficientPrivilege (SQLSTATE 42501): "
        "permission denied for table dygo_migrations"
    ], stderr
    assert LOST not in stderr


def test_a_worker_rides_out_an_outage_and_finishes_the_job_enqueued_meanwhile(conn, spawn, db_url, server_url):
    dbname = conninfo_to_dict(db_url)["dbname"]
    process = start_worker(spawn, db_url)
    process.wait_for_line("ready")
    with psycopg.connect(server_url, autocommit=True) as admin:
        admin.execute(f"ALTER DATABASE {dbname} ALLOW_CONNECTIONS false")
        try:
            admin.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE datname = %s AND application_name LIKE 'dygo-worker%%'",
                (dbname,),
            )
            wait_until(lambda: LOST in process.stderr(), message="the worker to log the lost connection")
            job = enqueue(conn, "test.record", {})  # the test's own connection was open already
            time.sleep(1.0)
            assert process.process.poll() is None  # still up, retrying
        finally:
            admin.execute(f"ALTER DATABASE {dbname} ALLOW_CONNECTIONS true")
    wait_until(
        lambda: conn.execute("SELECT state FROM dygo_jobs WHERE id = %s", (job.id,)).fetchone()[0] == "succeeded",
        timeout=30,
        message="the job enqueued during the outage to succeed",
    )
    wait_until(lambda: "database connection back after" in process.stderr(), message="the back line")
    stderr = process.stderr()
    assert stderr.count(LOST) == 1, stderr[-3000:]
    # The lost line names what the database said: the terminated backend (57P01), or libpq's own error.
    lost = next(line for line in stderr.splitlines() if LOST in line)
    assert "AdminShutdown (SQLSTATE 57P01)" in lost or "OperationalError" in lost, lost
    assert "died" not in stderr and process.process.poll() is None


def test_serve_answers_500_on_a_database_error_that_is_not_an_outage_and_logs_no_lost_connection(conn, spawn, role_url):
    role, url = role_url
    conn.execute(f"REVOKE SELECT ON dygo_jobs FROM {role}")
    api = start_serve(url, spawn)
    try:
        reply = api.reader.get("/api/v1/jobs")
        assert reply.status_code == 500, reply.text
        assert reply.json()["error"]["code"] == "internal_error"
        assert "dygo_jobs" not in reply.text  # the client is told nothing of the schema
        wait_until(lambda: "a database statement failed: InsufficientPrivilege" in api.process.stderr(), timeout=5)
        assert LOST not in api.process.stderr()
    finally:
        api.close()


def test_is_outage_tells_connection_failures_from_statement_errors(db_url, conn):
    def error_of(sql: str, url: str = db_url) -> psycopg.Error:
        with psycopg.connect(url, autocommit=True) as c, pytest.raises(psycopg.Error) as caught:
            c.execute(sql)
        return caught.value

    missing_column = error_of("SELECT no_such_column FROM dygo_jobs")
    assert not is_outage(missing_column)
    assert describe(missing_column) == 'UndefinedColumn (SQLSTATE 42703): column "no_such_column" does not exist'
    assert not is_outage(error_of("SET statement_timeout = '10ms'; SELECT pg_sleep(1)"))  # QueryCanceled
    assert not is_outage(error_of("SELECT 1/0"))

    terminated = error_of("SELECT pg_terminate_backend(pg_backend_pid())")
    assert terminated.sqlstate == "57P01" and is_outage(terminated)
    with psycopg.connect(db_url, autocommit=True) as c:
        c.close()
        with pytest.raises(psycopg.Error) as closed:
            c.execute("SELECT 1")
    assert is_outage(closed.value)
    with pytest.raises(psycopg.Error) as refused:
        psycopg.connect(make_conninfo(db_url, host="/nonexistent"), connect_timeout=2)
    assert refused.value.sqlstate is None and is_outage(refused.value)
    with (
        ConnectionPool(make_conninfo(db_url, host="/nonexistent"), min_size=1, timeout=0.5) as pool,
        pytest.raises(PoolTimeout) as no_connection,
    ):
        pool.getconn()
    assert is_outage(no_connection.value)
    assert is_outage(ConnectionResetError("reset by peer"))
    assert not is_outage(ValueError("not the database's"))

    wrapped = StatementError("settling 1 job(s)", missing_column)
    assert wrapped.sqlstate == "42703"
    assert str(wrapped) == 'settling 1 job(s): UndefinedColumn (SQLSTATE 42703): column "no_such_column" does not exist'


@pytest.mark.parametrize(
    ("error", "status"),
    [
        (EnqueueError("invalid_args", "bad"), 422),
        (EnqueueConflict("conflict", "kept changing hands"), 409),
        (NotFound("job_not_found", "no job"), 404),
        (Conflict("invalid_transition", "not now"), 409),
        (ApiError(400, "invalid_cursor", "bad cursor"), 400),
        (DatabaseUnavailable("down now", "down", OSError("x"), 5), 503),
    ],
)
def test_every_coded_error_carries_its_http_status_and_the_one_body_shape(error: CodedError, status: int):
    reply = coded_response(error)
    assert reply.status_code == status
    assert reply.body.decode().startswith('{"error":{"code":"' + error.code + '","message":"' + error.message)
    assert isinstance(error, CodedError) and str(error) == error.message
