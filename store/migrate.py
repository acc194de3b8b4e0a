"""Versioned plain-SQL migrations in store/migrations/NNNN_name.sql, applied once each, in order."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
from dygo.store import queries
from dygo.store.errors import SchemaError

MIGRATIONS_DIR = Path(__file__).parent / "migrations"


@dataclass(frozen=True)
class Migration:
    version: int
    name: str
    path: Path


def available_migrations() -> list[Migration]:
    migrations = []
    for path in sorted(MIGRATIONS_DIR.glob("*.sql")):
        number, _, name = path.stem.partition("_")
        migrations.append(Migration(int(number), name, path))
    return migrations


def latest_version() -> int:
    return available_migrations()[-1].version


def migrate(conn: psycopg.Connection) -> list[Migration]:
    """Apply what is missing, all in one transaction under an advisory lock; return what was applied."""
    applied: list[Migration] = []
    conn.autocommit = True
    with conn.transaction():
        conn.execute(queries.MIGRATIONS_LOCK)
        conn.execute(queries.MIGRATIONS_TABLE)
        done = {row[0] for row in conn.execute(queries.APPLIED_MIGRATIONS)}
        for migration in available_migrations():
            if migration.version in done:
                continue
            with conn.transaction():
                conn.execute(migration.path.read_text(encoding="utf-8"))
                conn.execute(queries.RECORD_MIGRATION, (migration.version, migration.name))
            applied.append(migration)
    return applied


def check_version(version: int | None) -> None:
    """Raise SchemaError unless `version` (from queries.SCHEMA_VERSION) is the latest migration."""
    latest = latest_version()
    if version is None or version == 0:
        raise SchemaError("the database has no dygo schema yet: run `dygo migrate`")
    if version < latest:
        raise SchemaError(f"the database schema is at version {version}, this code needs {latest}: run `dygo migrate`")
    if version > latest:
        raise SchemaError(f"the database schema is at version {version}, newer than this code ({latest}): upgrade dygo")


def schema_version(conn: psycopg.Connection) -> int | None:
    """The latest applied migration, or None when dygo never migrated this database."""
    if not conn.execute(queries.HAS_MIGRATIONS_TABLE).fetchone()[0]:
        return None
    return conn.execute(queries.SCHEMA_VERSION).fetchone()[0]


def check_schema(conn: psycopg.Connection) -> None:
    check_version(schema_version(conn))


SCHEMA_POLL_INTERVAL = 0.5  # seconds between looks while waiting for the schema


def wait_for_schema(url: str, timeout: float, waiting: Callable[[SchemaError], None], **connect: Any) -> None:
    """Return once the database at `url` has this code's schema. While it has none, or an older one (a
    release phase may be migrating it right now), look again every SCHEMA_POLL_INTERVAL for up to `timeout`
    seconds, calling `waiting` once with the reason; then raise that SchemaError, saying how long it waited.
    A schema newer than this code is refused at once: waiting cannot fix it. Connection errors propagate."""
    deadline = time.monotonic() + timeout
    told = False
    while True:
        with psycopg.connect(url, **connect) as conn:
            version = schema_version(conn)
        try:
            check_version(version)
            return
        except SchemaError as exc:
            if (version or 0) > latest_version():
                raise
            if time.monotonic() >= deadline:
                if not told:
                    raise
                raise SchemaError(f"{exc} (waited {timeout:g}s for it; DYGO_SCHEMA_WAIT sets how long)") from None
            if not told:
                waiting(exc)
                told = True
        time.sleep(SCHEMA_POLL_INTERVAL)
