"""Versioned plain-SQL migrations in store/migrations/, applied once each, in order.

* `NNNN_name.sql` is a migration: the version NNNN, then what it does. Every change to the schema that
  ships is one new migration with the next version; a shipped migration is never edited.
* `NNNN_name.down.sql` beside it, where the change can be undone, is its down step: `dygo migrate --to V`
  runs the down steps of the applied migrations above V, newest first. A migration without one (the
  baseline; one that drops data) stops a revert before anything is undone.
* 0016_baseline is the whole schema as first released. The migrations before it (0001-0015, kept in
  store/migrations/legacy/) built the same schema: a database they made is finished with the legacy
  files it lacks, then gets the baseline recorded as applied, and keeps every row.
* store/schema.sql is the schema the migrations build (store/schema.py, tests/test_migrations.py).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
from dygo.store.errors import SchemaError
from dygo.store.sql import schema as sql

MIGRATIONS_DIR = Path(__file__).parent / "migrations"
LEGACY_DIR = MIGRATIONS_DIR / "legacy"
BASELINE = 16  # 0016_baseline: every legacy version is below it


@dataclass(frozen=True)
class Migration:
    version: int
    name: str
    path: Path
    down: Path | None = None  # NNNN_name.down.sql, when the migration can be undone

    def __str__(self) -> str:
        return f"{self.version:04d}_{self.name}"


def available_migrations(directory: Path = MIGRATIONS_DIR) -> list[Migration]:
    migrations = []
    for path in sorted(directory.glob("*.sql")):
        if path.name.endswith(".down.sql"):
            continue
        number, _, name = path.stem.partition("_")
        down = path.with_name(f"{path.stem}.down.sql")
        migrations.append(Migration(int(number), name, path, down if down.exists() else None))
    return migrations


def latest_version() -> int:
    return available_migrations()[-1].version


def migrate(conn: psycopg.Connection, target: int | None = None, directory: Path = MIGRATIONS_DIR) -> list[Migration]:
    """Apply what is missing up to `target` (default: all), in one transaction under an advisory lock;
    return what was applied. A database made by the legacy migrations is carried onto the baseline first."""
    applied: list[Migration] = []
    conn.autocommit = True
    with conn.transaction():
        done = _lock_and_read(conn)
        if done and BASELINE not in done and min(done) < BASELINE:
            applied += _finish_legacy(conn, done, directory)
            done = _applied(conn)
        for migration in available_migrations(directory):
            if migration.version in done or (target is not None and migration.version > target):
                continue
            with conn.transaction():
                conn.execute(migration.path.read_text(encoding="utf-8"))
                conn.execute(sql.RECORD_MIGRATION, (migration.version, migration.name))
            applied.append(migration)
    return applied


def revert(conn: psycopg.Connection, target: int, directory: Path = MIGRATIONS_DIR) -> list[Migration]:
    """Run the down steps of the applied migrations above version `target`, newest first, in one transaction
    under the migrations' lock; return what was reverted. Raises SchemaError, undoing nothing, when `target`
    is not a migration of this code or a migration above it has no down step."""
    known = {m.version: m for m in available_migrations(directory)}
    if target not in known:
        raise SchemaError(f"no migration {target:04d}: this code has {', '.join(map(str, known.values()))}")
    reverted: list[Migration] = []
    conn.autocommit = True
    with conn.transaction():
        steps = []
        for version in sorted((v for v in _lock_and_read(conn) if v > target), reverse=True):
            migration = known.get(version)
            if migration is None:
                raise SchemaError(f"the database has migration {version:04d}, newer than this code: upgrade dygo")
            if migration.down is None:
                raise SchemaError(f"{migration} has no down step ({migration}.down.sql): it cannot be undone")
            steps.append((migration, migration.down))
        for migration, down in steps:
            with conn.transaction():
                conn.execute(down.read_text(encoding="utf-8"))
                conn.execute(sql.FORGET_MIGRATION, (migration.version,))
            reverted.append(migration)
    return reverted


def _lock_and_read(conn: psycopg.Connection) -> dict[int, str]:
    conn.execute(sql.MIGRATIONS_LOCK)
    conn.execute(sql.MIGRATIONS_TABLE)
    return _applied(conn)


def _applied(conn: psycopg.Connection) -> dict[int, str]:
    return {version: name for version, name in conn.execute(sql.APPLIED_VERSIONS)}


def _finish_legacy(conn: psycopg.Connection, done: dict[int, str], directory: Path) -> list[Migration]:
    """Apply the legacy migrations `done` lacks, then record the baseline without running it: the legacy
    migrations build exactly the baseline's schema (tests/test_migrations.py checks it)."""
    legacy = available_migrations(LEGACY_DIR)
    known = {(m.version, m.name) for m in legacy}
    for version, name in done.items():
        if version < BASELINE and (version, name) not in known:
            raise SchemaError(
                f"the database records migration {version:04d}_{name}, which is none of dygo's migrations "
                f"before {BASELINE:04d}_baseline: this code cannot tell what schema it has"
            )
    applied = []
    for migration in legacy:
        if migration.version in done:
            continue
        with conn.transaction():
            conn.execute(migration.path.read_text(encoding="utf-8"))
            conn.execute(sql.RECORD_MIGRATION, (migration.version, migration.name))
        applied.append(migration)
    baseline = next(m for m in available_migrations(directory) if m.version == BASELINE)
    conn.execute(sql.RECORD_MIGRATION, (baseline.version, baseline.name))
    return [*applied, baseline]


def check_version(version: int | None) -> None:
    """Raise SchemaError unless `version` (from sql.SCHEMA_VERSION) is the latest migration."""
    latest = latest_version()
    if version is None or version == 0:
        raise SchemaError("the database has no dygo schema yet: run `dygo migrate`")
    if version < latest:
        raise SchemaError(f"the database schema is at version {version}, this code needs {latest}: run `dygo migrate`")
    if version > latest:
        raise SchemaError(f"the database schema is at version {version}, newer than this code ({latest}): upgrade dygo")


def schema_version(conn: psycopg.Connection) -> int | None:
    """The latest applied migration, or None when dygo never migrated this database."""
    (exists,) = conn.execute(sql.HAS_MIGRATIONS_TABLE).fetchall()[0]
    if not exists:
        return None
    (version,) = conn.execute(sql.SCHEMA_VERSION).fetchall()[0]
    return int(version)


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
