"""The migrations build store/schema.sql exactly, from an empty database and from one the legacy migrations
made (keeping every row); down steps undo a migration; the trigger and Python chunk notified ids alike."""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from dygo.store import schema
from dygo.store.errors import SchemaError
from dygo.store.migrate import (
    BASELINE,
    LEGACY_DIR,
    MIGRATIONS_DIR,
    available_migrations,
    latest_version,
    migrate,
    revert,
)
from dygo.store.results import NOTIFY_IDS_MAX

from tests.conftest import dygo_env

SNAPSHOT = schema.SNAPSHOT.read_text(encoding="utf-8")
SHIPPED = [m.version for m in available_migrations()]  # the baseline and every migration after it
NEXT = latest_version() + 1
LEGACY = available_migrations(LEGACY_DIR)


@pytest.fixture(scope="module")
def dumpable(server_url: str) -> str:
    """The server, when the embedded wheel's pg_dump prints its schema as the snapshot was printed."""
    with psycopg.connect(server_url) as conn:
        major = conn.info.server_version // 10000
    version = subprocess.run([schema.pg_dump(), "--version"], capture_output=True, text=True, check=True).stdout
    dump_major = int(re.search(r"(\d+)\.", version).group(1))  # "pg_dump (PostgreSQL) 18.6"
    if major != dump_major:
        pytest.skip(f"the snapshot is PostgreSQL {dump_major}'s pg_dump of a {dump_major} server; this one is {major}")
    return server_url


@pytest.fixture
def empty_db(dumpable: str) -> Iterator[str]:
    with schema.scratch_database(dumpable, "dygo_migrations_test") as url:
        yield url


@pytest.fixture(scope="module")
def baseline_schema(dumpable: str) -> str:
    """The schema the baseline alone builds, as pg_dump prints it (the snapshot is the latest migration's)."""
    with schema.scratch_database(dumpable, "dygo_baseline_test") as url:
        with psycopg.connect(url) as conn:
            migrate(conn, BASELINE)
        return schema.dump(url)


def legacy_database(url: str, upto: int) -> None:
    """What the migrations before the baseline made of an empty database, up to version `upto`."""
    with psycopg.connect(url) as conn:
        migrate(conn, upto, directory=LEGACY_DIR)


def rows(url: str) -> dict[str, list[str]]:
    """Every row of every dygo table but dygo_migrations, as JSON text, in a stable order."""
    with psycopg.connect(url) as conn:
        tables = [
            name
            for (name,) in conn.execute(
                "SELECT tablename FROM pg_tables WHERE schemaname = 'public' AND tablename LIKE 'dygo\\_%' "
                "AND tablename <> 'dygo_migrations' ORDER BY 1"
            )
        ]
        return {t: sorted(r for (r,) in conn.execute(f"SELECT to_jsonb(t)::text FROM {t} t")) for t in tables}


ADDED_JOB_COLUMNS = r', "(node_id|parent_id|parent_step|parent_index)": null'
ADDED_LIMIT_COLUMNS = r'"(rate_burst|file_burst)": null, '


def _without_node_ids(tables: dict[str, list[str]]) -> dict[str, list[str]]:
    """The rows, without the tables and the job and limit columns later migrations added (empty and NULL)."""
    added = ("dygo_workflows", "dygo_nodes", "dygo_edges", "dygo_steps", "dygo_events", "dygo_limit_pace")
    kept = {t: r for t, r in tables.items() if t not in added}
    kept["dygo_jobs"] = sorted(re.sub(ADDED_JOB_COLUMNS, "", r) for r in kept["dygo_jobs"])
    kept["dygo_limits"] = sorted(re.sub(ADDED_LIMIT_COLUMNS, "", r) for r in kept["dygo_limits"])
    return kept


def recorded(url: str) -> list[int]:
    with psycopg.connect(url) as conn:
        return [v for (v,) in conn.execute("SELECT version FROM dygo_migrations ORDER BY version")]


JOBS_IN_EVERY_STATE = """
INSERT INTO dygo_jobs (kind, queue, state, run_at, attempt, max_attempts, lease_owner, lease_token,
                       lease_deadline, started_at, finished_at, result, last_error, errors, idempotency_key)
VALUES
  ('mail.send', 'default', 'pending', now(), 0, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, '[]', 'k-pending'),
  ('mail.send', 'default', 'pending', now() + interval '1 hour', 0, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
   '[]', NULL),
  ('mail.send', 'default', 'pending', now() + interval '30 seconds', 1, 5, NULL, NULL, NULL, now(), NULL, NULL,
   'boom', '[{"attempt": 1, "error": "boom"}]', NULL),
  ('mail.send', 'default', 'active', now(), 1, 20, 'host:1:abc', gen_random_uuid(), now() + interval '30 seconds',
   now(), NULL, NULL, NULL, '[]', 'k-active'),
  ('mail.send', 'default', 'succeeded', now(), 1, 20, NULL, NULL, NULL, now(), now(), '{"sent": true}', NULL, '[]',
   NULL),
  ('mail.send', 'bulk', 'dead', now(), 3, 3, NULL, NULL, NULL, now(), now(), NULL, 'order 123 failed',
   '[{"attempt": 3, "error": "order 123 failed"}]', NULL),
  ('mail.send', 'bulk', 'paused', now(), 0, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, '[]', 'k-paused'),
  ('mail.send', 'bulk', 'cancelled', now(), 0, NULL, NULL, NULL, NULL, NULL, now(), NULL, NULL, '[]', NULL)
"""

EVERY_OTHER_TABLE = """
UPDATE dygo_jobs SET dead_fingerprint = dygo_error_fingerprint(last_error), progress = '{"fraction": 0.5}'
WHERE state IN ('dead', 'active');
INSERT INTO dygo_idempotency_keys VALUES ('k-window', 1, now() + interval '1 day');
INSERT INTO dygo_workers (id, hostname, pid, queues) VALUES ('host:1:abc', 'host', 1, '{"default": 4}');
INSERT INTO dygo_queues VALUES ('bulk', true, now());
INSERT INTO dygo_daily_stats VALUES (current_date, 'default', 'mail.send', 8, 1, 2, 1, 0);
INSERT INTO dygo_minute_stats VALUES (date_trunc('minute', now()), 'default', 'mail.send', 8, 1, 2, 1, 0);
INSERT INTO dygo_timing_deltas VALUES ('default', 'mail.send', 'latency', '{1,2,0}', 0.25, 3);
INSERT INTO dygo_timings VALUES ('default', 'mail.send', 'duration', '{0,1,0}', 0.5, 1);
INSERT INTO dygo_schedules (name, spec, kind, queue, next_run_at) VALUES ('nightly', '0 3 * * *', 'mail.send',
    'default', now() + interval '1 day');
INSERT INTO dygo_schedules (name, spec, kind, queue, paused) VALUES ('held', '@hourly', 'mail.send', 'bulk', true);
INSERT INTO dygo_limits (scope, name, key, concurrency_limit, rate_count, rate_window, in_file)
VALUES ('queue', 'bulk', NULL, 2, 10, 1.0, true), ('kind', 'mail.send', 'tenant', 1, NULL, NULL, false);
INSERT INTO dygo_limit_starts VALUES ('queue', 'bulk', '', now(), 2);
INSERT INTO dygo_result_waiters (job_id, expires_at) VALUES (1, now() + interval '90 seconds');
INSERT INTO dygo_dashboard_sessions VALUES ('sid-1', 'admin', now() + interval '1 hour');
INSERT INTO dygo_auth_failures VALUES ('10.0.0.1', ARRAY[now()]);
"""


def test_migrations_build_the_schema_snapshot(empty_db: str) -> None:
    with psycopg.connect(empty_db) as conn:
        assert [m.version for m in migrate(conn)] == SHIPPED
    assert schema.difference(SNAPSHOT, schema.dump(empty_db)) == ""


def test_legacy_migrations_build_the_same_schema_as_the_baseline(empty_db: str, baseline_schema: str) -> None:
    legacy_database(empty_db, LEGACY[-1].version)
    # The schema the legacy migrations built, before the baseline is recorded: the baseline's, but for the
    # rows of dygo_migrations, which a schema-only dump leaves out.
    assert schema.difference(baseline_schema, schema.dump(empty_db)) == ""


def test_migrate_carries_a_legacy_database_onto_the_baseline_keeping_every_row(empty_db: str, spawn) -> None:
    legacy_database(empty_db, LEGACY[-1].version)
    with psycopg.connect(empty_db, autocommit=True) as conn:
        conn.execute(JOBS_IN_EVERY_STATE)
        conn.execute(EVERY_OTHER_TABLE)
    before = rows(empty_db)
    assert all(before.values()), [t for t, r in before.items() if not r]  # every table holds a row
    states = {r.split('"state": "')[1].split('"')[0] for r in before["dygo_jobs"]}
    assert states == {"pending", "active", "succeeded", "dead", "paused", "cancelled"}

    process = spawn("migrate", env=dygo_env(empty_db))
    assert process.wait() == 0, process.stderr()
    assert process.lines == [f"applied {m}\n" for m in available_migrations()]

    assert _without_node_ids(rows(empty_db)) == before
    assert recorded(empty_db) == [m.version for m in LEGACY] + SHIPPED
    assert schema.difference(SNAPSHOT, schema.dump(empty_db)) == ""
    again = spawn("migrate", env=dygo_env(empty_db))
    assert again.wait() == 0 and again.lines == ["schema is up to date\n"]


def test_migrate_finishes_a_database_the_legacy_migrations_left_halfway(empty_db: str, spawn) -> None:
    legacy_database(empty_db, 10)
    with psycopg.connect(empty_db, autocommit=True) as conn:
        conn.execute(JOBS_IN_EVERY_STATE)
        ids = [i for (i,) in conn.execute("SELECT id FROM dygo_jobs ORDER BY id")]

    process = spawn("migrate", env=dygo_env(empty_db))
    assert process.wait() == 0, process.stderr()
    finished = [f"applied {m}\n" for m in LEGACY if m.version > 10]
    assert process.lines == [*finished, *(f"applied {m}\n" for m in available_migrations())]

    assert schema.difference(SNAPSHOT, schema.dump(empty_db)) == ""
    with psycopg.connect(empty_db) as conn:
        assert [i for (i,) in conn.execute("SELECT id FROM dygo_jobs ORDER BY id")] == ids
        # The legacy data migrations ran too: 0011 regrouped the dead job by whole numbers only.
        assert conn.execute("SELECT dead_fingerprint FROM dygo_jobs WHERE state = 'dead'").fetchone() == (
            "order <n> failed",
        )


def test_migrate_refuses_a_database_recording_a_migration_it_does_not_know(empty_db: str) -> None:
    legacy_database(empty_db, 3)
    with psycopg.connect(empty_db, autocommit=True) as conn:
        conn.execute("UPDATE dygo_migrations SET name = 'homemade' WHERE version = 3")
        with pytest.raises(SchemaError, match="0003_homemade.*cannot tell what schema it has"):
            migrate(conn)
        assert recorded(empty_db) == [1, 2, 3]


def test_migrate_twice_on_an_empty_database_applies_the_baseline_once(empty_db: str, spawn) -> None:
    first = spawn("migrate", env=dygo_env(empty_db))
    assert first.wait() == 0, first.stderr()
    assert first.lines == [f"applied {m}\n" for m in available_migrations()]
    second = spawn("migrate", env=dygo_env(empty_db))
    assert second.wait() == 0, second.stderr()
    assert second.lines == ["schema is up to date\n"]
    assert recorded(empty_db) == SHIPPED
    assert schema.difference(SNAPSHOT, schema.dump(empty_db)) == ""


@pytest.fixture
def with_a_reversible_migration(tmp_path: Path) -> Path:
    """This code's migrations plus NEXT, which has a down step, and NEXT + 1, which has none."""
    for path in MIGRATIONS_DIR.glob("*.sql"):
        shutil.copy(path, tmp_path)
    (tmp_path / f"{NEXT:04d}_labels.sql").write_text(
        "CREATE TABLE dygo_labels (job_id bigint PRIMARY KEY, label text);\n"
    )
    (tmp_path / f"{NEXT:04d}_labels.down.sql").write_text("DROP TABLE dygo_labels;\n")
    (tmp_path / f"{NEXT + 1:04d}_label_index.sql").write_text(
        "CREATE INDEX dygo_labels_label ON dygo_labels (label);\n"
    )
    return tmp_path


def test_a_down_step_undoes_its_migration(empty_db: str, with_a_reversible_migration: Path) -> None:
    directory = with_a_reversible_migration
    with psycopg.connect(empty_db) as conn:
        applied = [m.version for m in migrate(conn, NEXT, directory=directory)]
        assert applied == [*SHIPPED, NEXT]
        assert [m.version for m in revert(conn, NEXT - 1, directory=directory)] == [NEXT]
        assert conn.execute("SELECT to_regclass('dygo_labels')").fetchone() == (None,)
    assert recorded(empty_db) == SHIPPED
    assert schema.difference(SNAPSHOT, schema.dump(empty_db)) == ""


def test_every_shipped_migration_after_the_baseline_reverts_and_applies_again(empty_db: str) -> None:
    with psycopg.connect(empty_db) as conn:
        migrate(conn)
        assert [m.version for m in revert(conn, BASELINE)] == SHIPPED[:0:-1]
        assert recorded(empty_db) == [BASELINE]
        migrate(conn)
    assert schema.difference(SNAPSHOT, schema.dump(empty_db)) == ""


def test_a_revert_past_a_migration_without_down_step_undoes_nothing(
    empty_db: str, with_a_reversible_migration: Path
) -> None:
    directory = with_a_reversible_migration
    with psycopg.connect(empty_db) as conn:
        migrate(conn, directory=directory)
        with pytest.raises(SchemaError, match=f"{NEXT + 1:04d}_label_index has no down step"):
            revert(conn, BASELINE, directory=directory)
        assert conn.execute("SELECT to_regclass('dygo_labels')::text").fetchone() == ("dygo_labels",)
    assert recorded(empty_db) == [*SHIPPED, NEXT, NEXT + 1]


def test_migrate_to_a_version_it_does_not_have_says_which_it_has(empty_db: str, spawn) -> None:
    process = spawn("migrate", "--to", "3", env=dygo_env(empty_db))
    assert process.wait() == 1
    assert f"no migration 0003: this code has {BASELINE:04d}_baseline" in process.stderr()
    with psycopg.connect(empty_db) as conn:
        assert conn.execute("SELECT to_regclass('dygo_jobs')").fetchone() == (None,)


def test_the_finished_trigger_and_python_chunk_ids_alike(db_url: str) -> None:
    with psycopg.connect(db_url) as conn:
        (definition,) = conn.execute("SELECT pg_get_functiondef('dygo_jobs_updated'::regproc)").fetchone()
    chunks = re.findall(r"row_number\(\) OVER \(\)\) / (\d+) AS chunk", definition)
    assert chunks == [str(NOTIFY_IDS_MAX)]
