"""Retention: old history trimmed in batches by one worker at a time, recent rows and 0 = keep kept."""

from __future__ import annotations

import asyncio
import shutil
from contextlib import nullcontext
from pathlib import Path

import psycopg
import pytest
from dygo.store import admin, enqueue, maintenance
from dygo.store.config import load_settings
from dygo.store.errors import ConfigError
from dygo.store.maintenance import RetentionPeriods, SucceededWalk, Trimmed
from dygo.store.sql.stats import FOLD_STATS_LOCK

from tests.conftest import TEST_CONFIG, dygo_env, wait_until
from tests.twins import SIDES, Twins

DAY = 86400.0
KEEP_A_DAY = RetentionPeriods(succeeded=DAY, dead=DAY, cancelled=DAY, daily_stats=DAY)
KEEP_FOREVER = RetentionPeriods(succeeded=0, dead=0, cancelled=0, daily_stats=0)


def add_job(conn: psycopg.Connection, state: str, age_days: float) -> int:
    """A finished job enqueued and finished `age_days` ago (by the database clock)."""
    ago = f"{age_days} days"
    return conn.execute(
        "INSERT INTO dygo_jobs (kind, queue, state, enqueued_at, finished_at) "
        "VALUES ('test.record', 'default', %s, now() - %s::interval, now() - %s::interval) RETURNING id",
        (state, ago, ago),
    ).fetchone()[0]


def job_ids(conn: psycopg.Connection) -> set[int]:
    return {row[0] for row in conn.execute("SELECT id FROM dygo_jobs")}


def run_trim(url: str, retention: RetentionPeriods, walk: SucceededWalk | None = None) -> Trimmed | None:
    async def go() -> Trimmed | None:
        async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
            return await maintenance.trim(lambda: nullcontext(conn), retention, walk or SucceededWalk())

    return asyncio.run(go())


def test_old_finished_jobs_are_trimmed_and_recent_and_live_ones_kept(conn, db_url):
    old = {state: add_job(conn, state, 3) for state in ("succeeded", "dead", "cancelled", "skipped")}
    recent = {state: add_job(conn, state, 0.5) for state in ("succeeded", "dead", "cancelled", "skipped")}
    live = enqueue(conn, "test.record", {}).id
    trimmed = run_trim(db_url, KEEP_A_DAY)
    # Skipped jobs (a workflow's nodes that did not run) go with the cancelled ones, by cancelled_retention.
    assert (trimmed.succeeded, trimmed.dead, trimmed.cancelled, trimmed.skipped) == (1, 1, 1, 1)
    assert job_ids(conn) == {*recent.values(), live}
    assert not job_ids(conn) & set(old.values())
    assert "1 succeeded, 1 dead, 1 cancelled, 1 skipped" in trimmed.summary()


def test_zero_retention_keeps_history_forever(conn, db_url):
    ids = {add_job(conn, state, 300) for state in ("succeeded", "dead", "cancelled")}
    conn.execute(
        "INSERT INTO dygo_daily_stats (day, queue, kind, enqueued) VALUES (current_date - 300, 'default', "
        "'test.record', 1)"
    )
    assert run_trim(db_url, KEEP_FOREVER).total() == 0
    assert job_ids(conn) == ids
    assert conn.execute("SELECT count(*) FROM dygo_daily_stats WHERE day < current_date").fetchone()[0] == 1


def test_succeeded_backlog_is_trimmed_in_batches_across_the_walk(conn, db_url):
    conn.execute(
        "INSERT INTO dygo_jobs (kind, queue, state, enqueued_at, finished_at) "
        "SELECT 'test.record', 'default', 'succeeded', now() - interval '3 days', now() - interval '3 days' "
        "FROM generate_series(1, 2500)"
    )
    # A gap in the ids and a long-lived job at the front must not stop the walk.
    add_job(conn, "dead", 3)
    conn.execute("SELECT setval('dygo_jobs_id_seq', nextval('dygo_jobs_id_seq') + 50000)")
    late = add_job(conn, "succeeded", 2)
    kept = add_job(conn, "succeeded", 0.1)
    walk = SucceededWalk()
    trimmed = run_trim(db_url, RetentionPeriods(succeeded=DAY, dead=0, cancelled=0, daily_stats=0), walk)
    assert trimmed.succeeded == 2501
    assert late not in job_ids(conn) and kept in job_ids(conn)
    assert walk.after == 0  # reached the recent jobs, so the next pass starts from the oldest again


def test_expired_keys_go_and_live_ones_stay(conn, db_url):
    conn.execute(
        "INSERT INTO dygo_idempotency_keys (key, job_id, expires_at) VALUES "
        "('expired', 1, now() - interval '1 second'), ('live', 2, now() + interval '1 hour')"
    )
    assert run_trim(db_url, KEEP_FOREVER).idempotency_keys == 1
    assert [row[0] for row in conn.execute("SELECT key FROM dygo_idempotency_keys")] == ["live"]


def test_stats_deltas_are_folded_and_old_days_trimmed(conn, db_url):
    conn.execute(
        "INSERT INTO dygo_stats_deltas (day, queue, kind, enqueued) VALUES "
        "(current_date - 100, 'default', 'test.record', 2), (current_date, 'default', 'test.record', 3)"
    )
    assert run_trim(db_url, KEEP_A_DAY).daily_stats == 1
    assert conn.execute("SELECT count(*) FROM dygo_stats_deltas").fetchone()[0] == 0
    assert conn.execute("SELECT day = current_date, enqueued FROM dygo_daily_stats").fetchall() == [(True, 3)]


@pytest.mark.parametrize("side", SIDES)
def test_the_fold_moves_stats_and_timing_deltas_into_their_rollups_unless_another_process_folds(conn, db_url, side):
    conn.execute("INSERT INTO dygo_stats_deltas (day, queue, kind, enqueued) VALUES (current_date, 'default', 'a', 3)")
    conn.execute(
        "INSERT INTO dygo_timing_deltas (queue, kind, measure, buckets, sum, count) "
        "VALUES ('default', 'a', 'duration', '{1,2}', 0.5, 3)"
    )
    rollups = "SELECT (SELECT sum(enqueued) FROM dygo_daily_stats), (SELECT sum(count) FROM dygo_timings)"
    deltas = "SELECT (SELECT count(*) FROM dygo_stats_deltas), (SELECT count(*) FROM dygo_timing_deltas)"
    folder = Twins(admin, db_url, side)
    try:
        with psycopg.connect(db_url) as other:  # another process folding holds the fold's lock
            other.execute(FOLD_STATS_LOCK)
            assert folder.fold_stats() is False
            assert conn.execute(deltas).fetchone() == (1, 1)
        assert folder.fold_stats() is True
        assert folder.idle()
    finally:
        folder.close()
    assert conn.execute(deltas).fetchone() == (0, 0)
    assert conn.execute(rollups).fetchone() == (3, 3)


def test_only_one_worker_holds_the_retention_lock(conn, db_url):
    old = add_job(conn, "succeeded", 3)

    async def go() -> tuple[bool, bool, Trimmed | None]:
        async with (
            await psycopg.AsyncConnection.connect(db_url, autocommit=True) as first,
            await psycopg.AsyncConnection.connect(db_url, autocommit=True) as second,
            await psycopg.AsyncConnection.connect(db_url, autocommit=True) as work,
        ):
            async with maintenance.retention_lock(first) as first_held:
                async with maintenance.retention_lock(second) as second_held:
                    pass
                skipped = await maintenance.trim(lambda: nullcontext(work), KEEP_A_DAY, SucceededWalk())
            return first_held, second_held, skipped

    first_held, second_held, skipped = asyncio.run(go())
    assert (first_held, second_held, skipped) == (True, False, None)
    assert old in job_ids(conn)  # the pass that found the lock taken deleted nothing
    assert run_trim(db_url, KEEP_A_DAY).succeeded == 1  # the lock went with the first transaction


def test_worker_trims_history_and_logs_one_line(conn, db_url, spawn, tmp_path):
    config = copy_test_config(tmp_path, "completed_retention: 1h\ndead_retention: 0\nretention_interval: 1s\n")
    old = add_job(conn, "succeeded", 1)
    dead = add_job(conn, "dead", 1)
    worker = spawn("worker", env=dygo_env(db_url, DYGO_CONFIG_DIR=str(config)))
    worker.wait_for_line("started")
    wait_until(lambda: old not in job_ids(conn), timeout=15, message="the old succeeded job to be trimmed")
    assert dead in job_ids(conn)  # dead_retention: 0 keeps them
    wait_until(
        lambda: "retention: trimmed 1 succeeded, 0 dead" in worker.stderr(), timeout=5, message="the retention log line"
    )


def copy_test_config(tmp_path: Path, extra: str) -> Path:
    shutil.copy(TEST_CONFIG / "queues.yml", tmp_path / "queues.yml")
    (tmp_path / "dygo.yml").write_text((TEST_CONFIG / "dygo.yml").read_text() + extra)
    return tmp_path


def test_retention_settings_are_parsed_with_their_defaults(tmp_path):
    defaults = load_settings(copy_test_config(tmp_path, ""))
    assert (
        defaults.completed_retention,
        defaults.dead_retention,
        defaults.stats_retention,
        defaults.retention_interval,
    ) == (DAY, 30 * DAY, 90 * DAY, 60.0)
    settings = load_settings(copy_test_config(tmp_path, "completed_retention: 0\ncancelled_retention: 7d\n"))
    assert (settings.completed_retention, settings.cancelled_retention) == (0.0, 7 * DAY)


@pytest.mark.parametrize(
    ("line", "rule"),
    [
        ("completed_retention: -1h", "must not be negative"),
        ("dead_retention: forever", "or 0 to keep forever"),
        ("stats_retention: 2y", "is not a duration"),
        ("retention_interval: 0", "greater than 0"),
    ],
)
def test_bad_retention_settings_name_file_entry_and_rule(tmp_path, line, rule):
    config = copy_test_config(tmp_path, line + "\n")
    with pytest.raises(ConfigError) as caught:
        load_settings(config)
    assert caught.value.source == str(config / "dygo.yml")
    assert caught.value.entry == line.split(":")[0]
    assert rule in caught.value.rule


def test_finished_workflows_are_trimmed_with_their_nodes_and_running_ones_kept(conn, db_url):
    from dygo.store.workflows import Workflow, enqueue_workflow

    def workflow(name: str) -> int:
        wf = Workflow(name)
        wf.add("a", "test.record", {})
        wf.add("b", "test.record", {}, after="a")
        return enqueue_workflow(conn, wf).id

    old, recent, running = workflow("old"), workflow("recent"), workflow("running")
    conn.execute(
        "UPDATE dygo_workflows SET state = 'succeeded', finished_at = now() - %s::interval WHERE id = %s",
        ("3 days", old),
    )
    conn.execute("UPDATE dygo_workflows SET state = 'failed', finished_at = now() WHERE id = %s", (recent,))
    trimmed = run_trim(db_url, RetentionPeriods(succeeded=0, dead=0, cancelled=0, daily_stats=0, workflows=DAY))
    assert trimmed.workflows == 1
    assert {row[0] for row in conn.execute("SELECT id FROM dygo_workflows")} == {recent, running}
    assert conn.execute("SELECT count(*) FROM dygo_nodes WHERE workflow_id = %s", (old,)).fetchone() == (0,)
    assert conn.execute("SELECT count(*) FROM dygo_edges WHERE workflow_id = %s", (old,)).fetchone() == (0,)


def test_the_steps_of_a_deleted_job_are_trimmed_and_a_live_jobs_kept(conn, db_url):
    gone, kept = add_job(conn, "dead", 0.5), add_job(conn, "dead", 0.5)
    for job_id in (gone, kept):
        conn.execute(
            "INSERT INTO dygo_steps (job_id, key, op, seq, attempt, duration, result) "
            "VALUES (%s, 'charge#1', 'step', 1, 1, 0.01, '1'), (%s, 'ship#1', 'step', 2, 1, 0.01, NULL)",
            (job_id, job_id),
        )
    conn.execute("DELETE FROM dygo_jobs WHERE id = %s", (gone,))  # as an operator's delete would
    trimmed = run_trim(db_url, KEEP_FOREVER)
    assert trimmed.steps == 2
    assert conn.execute("SELECT DISTINCT job_id FROM dygo_steps").fetchall() == [(kept,)]
