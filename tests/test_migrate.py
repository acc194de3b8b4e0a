"""`dygo migrate`: applies once, reports, is safe to run twice at once; version checks."""

from __future__ import annotations

import psycopg
import pytest
from dygo.store.errors import SchemaError
from dygo.store.migrate import BASELINE, LEGACY_DIR, available_migrations, check_version, latest_version
from psycopg.conninfo import make_conninfo

from tests.conftest import dygo_env


@pytest.fixture
def empty_db(server_url):
    with psycopg.connect(server_url, autocommit=True) as admin:
        admin.execute("DROP DATABASE IF EXISTS dygo_migrate_test WITH (FORCE)")
        admin.execute("CREATE DATABASE dygo_migrate_test")
    yield make_conninfo(server_url, dbname="dygo_migrate_test")
    with psycopg.connect(server_url, autocommit=True) as admin:
        admin.execute("DROP DATABASE IF EXISTS dygo_migrate_test WITH (FORCE)")


def test_two_concurrent_migrates_apply_each_migration_once(empty_db, spawn):
    env = dygo_env(empty_db)
    processes = [spawn("migrate", env=env) for _ in range(2)]
    assert [p.wait() for p in processes] == [0, 0]
    outputs = sorted("".join(p.lines) for p in processes)
    everything = "".join(f"applied {m.version:04d}_{m.name}\n" for m in available_migrations())
    assert outputs == sorted([everything, "schema is up to date\n"])
    with psycopg.connect(empty_db) as conn:
        applied = conn.execute("SELECT version FROM dygo_migrations ORDER BY version").fetchall()
        assert applied == [(m.version,) for m in available_migrations()]


def test_migrations_are_numbered_plain_sql_files_from_the_baseline_on():
    versions = [m.version for m in available_migrations()]
    assert versions == sorted(set(versions)) and versions[0] == BASELINE
    assert all(m.path.suffix == ".sql" and not m.path.name.endswith(".down.sql") for m in available_migrations())
    assert all(m.down is None or m.down.name == f"{m}.down.sql" for m in available_migrations())
    legacy = [m.version for m in available_migrations(LEGACY_DIR)]
    assert legacy == list(range(1, BASELINE))


def test_outdated_or_newer_schema_is_refused_with_what_to_do():
    with pytest.raises(SchemaError, match="run `dygo migrate`"):
        check_version(None)
    with pytest.raises(SchemaError, match="newer than this code"):
        check_version(latest_version() + 1)
    check_version(latest_version())


def test_migrate_needs_no_queues_yml(empty_db, spawn, tmp_path):
    # The release phase of a deploy migrates; it runs no job and reads no queue.
    process = spawn("migrate", env=dygo_env(empty_db, DYGO_CONFIG_DIR=str(tmp_path)))
    assert process.wait() == 0, process.stderr()
    assert f"applied {latest_version():04d}_" in "".join(process.lines)
