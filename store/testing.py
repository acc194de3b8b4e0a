"""The store's face for dygo.testing (the pytest plugin): scratch databases and what a test reads of its jobs.

A scratch database is a copy of a migrated template, made per test (a copy is a file copy on the server: far
quicker than migrating) and dropped after it, on the server of DATABASE_URL or the embedded one.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psycopg
from dygo.store.migrate import migrate
from dygo.store.sql import testing as statements
from psycopg import sql
from psycopg.conninfo import make_conninfo
from psycopg.rows import class_row


@dataclass(frozen=True)
class EnqueuedJob:
    """A job as a test sees it."""

    id: int
    kind: str
    queue: str
    args: Any
    meta: dict[str, str]
    priority: int
    attempt: int
    max_attempts: int
    run_at: datetime
    result: Any
    last_error: str | None
    state: str


def create_template(server_url: str, name: str) -> str:
    """A fresh database `name`, migrated to the latest schema (an older one of that name is dropped first)."""
    with psycopg.connect(server_url, autocommit=True) as admin:
        admin.execute(sql.SQL(statements.DROP_DATABASE).format(name=sql.Identifier(name)))
        admin.execute(sql.SQL(statements.CREATE_DATABASE).format(name=sql.Identifier(name)))
    url = make_conninfo(server_url, dbname=name)
    with psycopg.connect(url) as conn:
        migrate(conn)
    return url


def copy_database(server_url: str, template: str, name: str) -> str:
    """A new database `name`, a copy of `template` (which no session may be connected to)."""
    with psycopg.connect(server_url, autocommit=True) as admin:
        admin.execute(
            sql.SQL(statements.COPY_DATABASE).format(name=sql.Identifier(name), template=sql.Identifier(template))
        )
    return make_conninfo(server_url, dbname=name)


def drop_database(server_url: str, name: str) -> None:
    with psycopg.connect(server_url, autocommit=True) as admin:
        admin.execute(sql.SQL(statements.DROP_DATABASE).format(name=sql.Identifier(name)))


def database_now(conn: psycopg.Connection) -> datetime:
    """The database server's clock, which run times are compared with."""
    row = conn.execute(statements.DATABASE_NOW).fetchone()
    assert row is not None
    now: datetime = row[0]
    return now


def run_delayed_runs_now(conn: psycopg.Connection, since: datetime) -> int:
    """Retries waiting out their backoff, snoozed and sleeping jobs that were not due at `since`: due now.
    How many there were."""
    return conn.execute(statements.RUN_DELAYED_RUNS_NOW, {"since": since}).rowcount


def enqueued_jobs(conn: psycopg.Connection, kind: str | None = None, queue: str | None = None) -> list[EnqueuedJob]:
    with conn.cursor(row_factory=class_row(EnqueuedJob)) as cursor:
        return cursor.execute(statements.ENQUEUED_JOBS, {"kind": kind, "queue": queue}).fetchall()
