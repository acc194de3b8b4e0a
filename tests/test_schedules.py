"""Cron schedules: fire times across DST, declarations and their errors, the sync, exactly one job per
occurrence with real workers (racing, killed mid-fire, after downtime), and the admin API and CLI.

The clock is controlled without mocks: store-level tests pass `now` to the firing function, and
process tests drive occurrences by moving a schedule's next_run_at in the database and letting
real workers fire them (an `@yearly` spec keeps real occurrences out of the way).
"""

from __future__ import annotations

import asyncio
import shutil
import signal
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from zoneinfo import ZoneInfo

import psycopg
import pytest
from dygo.store.config import QueueConfig, Settings, load_settings
from dygo.store.cron import describe, next_fire
from dygo.store.errors import ConfigError
from dygo.store.registry import Registry, job, registry
from dygo.store.schedules import Schedule, fire_due, load_schedules, occurrence_key, schedule, sync

from tests.conftest import REPO, TEST_CONFIG, dygo_env, wait_until

NEW_YORK = ZoneInfo("America/New_York")


# --- helpers ---------------------------------------------------------------------------------------


@pytest.fixture
def config(tmp_path: Path) -> Path:
    """A config dir like tests/config; tests add their own schedules.yml."""
    directory = tmp_path / "config"
    directory.mkdir()
    for name in ("queues.yml", "dygo.yml"):
        shutil.copy(TEST_CONFIG / name, directory)
    return directory


def write_schedules(config: Path, text: str) -> Path:
    path = config / "schedules.yml"
    path.write_text(text)
    return path


def declared(config: Path) -> list[Schedule]:
    return list(load_schedules(load_settings(config), registry, declared={}).values())


def on_db(db_url: str, operation, *args, **kwargs):
    """Run an async store function on its own connection."""

    async def run():
        async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as conn:
            return await operation(conn, *args, **kwargs)

    return asyncio.run(run())


def jobs_of(conn, name: str) -> list[tuple[int, str]]:
    return conn.execute(
        "SELECT id, meta->>'occurrence' FROM dygo_jobs WHERE meta->>'schedule' = %s ORDER BY id", (name,)
    ).fetchall()


def next_run_at(conn, name: str) -> datetime | None:
    return conn.execute("SELECT next_run_at FROM dygo_schedules WHERE name = %s", (name,)).fetchone()[0]


def local(moments: list[datetime], zone: ZoneInfo = NEW_YORK) -> list[str]:
    return [m.astimezone(zone).strftime("%m-%d %H:%M %Z") for m in moments]


def series(spec: str, zone: ZoneInfo, start: datetime, count: int) -> list[datetime]:
    moments = [next_fire(spec, zone, start)]
    while len(moments) < count:
        moments.append(next_fire(spec, zone, moments[-1]))
    return moments


# --- fire times ------------------------------------------------------------------------------------


def test_daily_time_skipped_by_spring_forward_fires_once_shifted_by_the_jump():
    # 2025-03-09: New York clocks jump from 02:00 EST to 03:00 EDT, so 02:30 does not exist.
    moments = series("30 2 * * *", NEW_YORK, datetime(2025, 3, 7, 12, tzinfo=NEW_YORK), 4)
    assert local(moments) == ["03-08 02:30 EST", "03-09 03:30 EDT", "03-10 02:30 EDT", "03-11 02:30 EDT"]


def test_daily_time_repeated_by_fall_back_fires_once():
    # 2025-11-02: clocks go back from 02:00 EDT to 01:00 EST, so 01:30 happens twice.
    moments = series("30 1 * * *", NEW_YORK, datetime(2025, 10, 31, 12, tzinfo=NEW_YORK), 3)
    assert local(moments) == ["11-01 01:30 EDT", "11-02 01:30 EDT", "11-03 01:30 EST"]


def test_frequent_spec_follows_real_time_through_both_dst_changes():
    back = series("*/30 * * * *", NEW_YORK, datetime(2025, 11, 2, 0, 50, tzinfo=NEW_YORK), 5)
    assert local(back) == [
        "11-02 01:00 EDT",
        "11-02 01:30 EDT",
        "11-02 01:00 EST",
        "11-02 01:30 EST",
        "11-02 02:00 EST",
    ]
    forward = series("0 * * * *", NEW_YORK, datetime(2025, 3, 9, 0, 10, tzinfo=NEW_YORK), 3)
    assert local(forward) == ["03-09 01:00 EST", "03-09 03:00 EDT", "03-09 04:00 EDT"]  # one hour, no duplicate


def test_descriptors_and_fire_times_in_utc():
    after = datetime(2025, 6, 30, 23, 59, 30, tzinfo=UTC)
    assert next_fire("@hourly", "UTC", after) == datetime(2025, 7, 1, 0, 0, tzinfo=UTC)
    assert next_fire("@monthly", "UTC", after) == datetime(2025, 7, 1, tzinfo=UTC)
    assert next_fire("*/5 * * * *", "Asia/Kolkata", after) == datetime(2025, 7, 1, 0, 0, tzinfo=UTC)
    assert next_fire("0 9 * * *", "Asia/Kolkata", after) == datetime(2025, 7, 1, 3, 30, tzinfo=UTC)


@pytest.mark.parametrize(
    ("spec", "words"),
    [
        ("* * * * *", "every minute"),
        ("*/5 * * * *", "every 5 minutes"),
        ("15 * * * *", "every hour at :15"),
        ("@daily", "every day at 00:00"),
        ("30 2 * * *", "every day at 02:30"),
        ("0 9 * * mon-fri", "on weekdays at 09:00"),
        ("0 9-17 * * 1-5", "every hour from 09:00 to 17:00 on weekdays"),
        ("@weekly", "every Sunday at 00:00"),
        ("0 12 1,15 * *", "on days 1 and 15 of every month at 12:00"),
        ("@yearly", "every year on January 1 at 00:00"),
        ("0 0 L * *", "minute 0, hour 0, day-of-month L, month *, day-of-week *"),
    ],
)
def test_spec_in_words(spec, words):
    assert describe(spec) == words


# --- declarations and validation -------------------------------------------------------------------


def settings_with(*queues: str) -> Settings:
    return Settings(config_dir=Path("nowhere"), queues={q: QueueConfig(q, 1) for q in queues})


def test_code_and_decorator_declarations_load_resolved():
    jobs = Registry()

    @job("report.build", queue="reports", cron="@daily", timezone="Europe/Paris", registry=jobs)
    async def build(ctx, args: dict) -> None: ...

    book: dict[str, Schedule] = {}
    schedule("report.hourly", "0 * * * *", "report.build", {"fmt": "pdf"}, priority=5, missed="skip", declared=book)
    loaded = load_schedules(settings_with("default", "reports"), jobs, book)
    assert loaded["report.build"] == Schedule(
        "report.build", "@daily", "report.build", {}, "reports", timezone="Europe/Paris"
    )
    assert loaded["report.hourly"] == Schedule(
        "report.hourly", "0 * * * *", "report.build", {"fmt": "pdf"}, "reports", priority=5, missed="skip"
    )
    with pytest.raises(ConfigError, match="already declared by tests.test_schedules"):
        schedule("report.hourly", "@daily", "report.build", declared=book)


def test_yaml_declarations_load_with_every_option(config):
    write_schedules(
        config,
        """
schedules:
  - name: nightly-report
    cron: "30 2 * * *"
    timezone: America/New_York
    kind: test.record
    args: {seconds: 0.5}
    queue: other
    priority: 3
    max_attempts: 2
    missed: skip
""",
    )
    [loaded] = declared(config)
    assert loaded == Schedule(
        "nightly-report", "30 2 * * *", "test.record", {"seconds": 0.5}, "other", 3, 2, "America/New_York", "skip"
    )


@pytest.mark.parametrize(
    ("entry", "rule"),
    [
        ("{name: bad, cron: '61 * * * *', kind: test.noop}", "cron: '61 * * * *' is not a valid cron expression"),
        ("{name: bad, cron: '* * * *', kind: test.noop}", "cron: '* * * *' must have 5 fields"),
        ("{name: bad, cron: '*/10 * * * * *', kind: test.noop}", "must have 5 fields"),
        ("{name: bad, cron: '@reboot', kind: test.noop}", "cron: unknown descriptor '@reboot'"),
        ("{name: bad, cron: '0 0 31 2 *', kind: test.noop}", "cron: '0 0 31 2 *' never fires"),
        ("{name: bad, cron: '', kind: test.noop}", "cron: must be a cron expression"),
        (
            "{name: bad, cron: '@daily', kind: test.noop, timezone: Mars/Olympus}",
            "timezone: 'Mars/Olympus' is not an IANA time zone",
        ),
        ("{name: bad, cron: '@daily', kind: no.such}", "kind: 'no.such' is not registered"),
        ("{name: bad, cron: '@daily', kind: test.noop, queue: nope}", "queue: 'nope' is not configured"),
        ("{name: bad, cron: '@daily', kind: test.noop, missed: all}", "missed: must be 'once' or 'skip'"),
        ("{name: bad, cron: '@daily', kind: test.noop, priority: 5000}", "priority: must be an integer"),
        ("{name: bad, cron: '@daily', kind: test.record, args: {seconds: soon}}", "args: args for kind 'test.record'"),
        ("{name: bad, cron: '@daily', kind: test.noop, every: 5m}", "unknown key 'every'"),
        ("{name: bad, kind: test.noop}", "cron: is required"),
        ("{name: 'no spaces', cron: '@daily', kind: test.noop}", "name: 'no spaces' must be a name"),
    ],
)
def test_invalid_schedule_is_rejected_naming_file_schedule_and_field(config, entry, rule):
    path = write_schedules(config, f"schedules:\n  - {{name: fine, cron: '@daily', kind: test.noop}}\n  - {entry}\n")
    with pytest.raises(ConfigError) as caught:
        declared(config)
    assert caught.value.source == str(path)
    assert caught.value.entry.startswith("schedules[1]")
    assert rule in caught.value.rule


def test_duplicate_names_across_sources_are_rejected(config):
    write_schedules(config, "schedules:\n  - {name: twice, cron: '@daily', kind: test.noop}\n")
    book: dict[str, Schedule] = {}
    schedule("twice", "@hourly", "test.noop", declared=book)
    with pytest.raises(ConfigError, match=r"name: 'twice' is already declared by tests.test_schedules"):
        load_schedules(load_settings(config), registry, book)


def test_decorator_with_a_bad_cron_fails_at_load_naming_the_job():
    jobs = Registry()

    @job("report.bad", cron="every day", registry=jobs)
    async def bad(ctx, args: dict) -> None: ...

    with pytest.raises(ConfigError) as caught:
        load_schedules(settings_with("default"), jobs, {})
    assert (caught.value.entry, caught.value.rule[:6]) == ("job 'report.bad'", "cron: ")


def test_worker_with_an_invalid_schedule_exits_2_before_touching_the_database(config):
    write_schedules(config, "schedules:\n  - {name: nightly, cron: '30 25 * * *', kind: test.noop}\n")
    env = {
        "PATH": "/usr/bin:/bin",
        "PYTHONPATH": str(REPO),
        "DYGO_CONFIG_DIR": str(config),
        "DATABASE_URL": "postgresql://nobody@127.0.0.1:1/none",
    }
    result = subprocess.run(
        [sys.executable, "-m", "dygo", "worker"], cwd=REPO, env=env, capture_output=True, text=True, timeout=30
    )
    assert result.returncode == 2
    assert f"{config}/schedules.yml: schedules[0] (nightly): cron: '30 25 * * *'" in result.stderr


# --- sync and firing in the store (controlled clock) -----------------------------------------------


def test_sync_adds_keeps_updates_and_disables_without_deleting(conn, db_url, config):
    now = datetime(2025, 1, 1, 12, 0, 30, tzinfo=UTC)
    write_schedules(
        config,
        "schedules:\n  - {name: a, cron: '*/5 * * * *', kind: test.noop}\n"
        "  - {name: b, cron: '@daily', kind: test.noop}\n",
    )
    result = on_db(db_url, sync, declared(config), now=now)
    assert (result.added, result.updated, result.disabled) == (["a", "b"], [], [])
    assert next_run_at(conn, "a") == datetime(2025, 1, 1, 12, 5, tzinfo=UTC)

    # Unchanged: a later start keeps the stored next fire (no occurrence skipped or repeated).
    assert not on_db(db_url, sync, declared(config), now=now + timedelta(hours=1))
    assert next_run_at(conn, "a") == datetime(2025, 1, 1, 12, 5, tzinfo=UTC)
    # One without a next fire time (a fire that could not compute it) gets one again.
    conn.execute("UPDATE dygo_schedules SET next_run_at = NULL WHERE name = 'a'")
    assert on_db(db_url, sync, declared(config), now=now + timedelta(hours=1)).updated == ["a"]
    assert next_run_at(conn, "a") == datetime(2025, 1, 1, 13, 5, tzinfo=UTC)

    # A changed spec is recomputed; a removed schedule is disabled and keeps its row.
    write_schedules(config, "schedules:\n  - {name: a, cron: '*/10 * * * *', kind: test.noop}\n")
    result = on_db(db_url, sync, declared(config), now=now + timedelta(hours=1))
    assert (result.added, result.updated, result.disabled) == ([], ["a"], ["b"])
    assert next_run_at(conn, "a") == datetime(2025, 1, 1, 13, 10, tzinfo=UTC)
    assert conn.execute("SELECT enabled FROM dygo_schedules WHERE name = 'b'").fetchone() == (False,)
    assert on_db(db_url, fire_due, now=now + timedelta(days=7))[0].name == "a"  # b no longer fires

    # Declared again: enabled, from the next occurrence after now.
    write_schedules(config, "schedules:\n  - {name: b, cron: '@daily', kind: test.noop}\n")
    assert on_db(db_url, sync, declared(config), now=now + timedelta(days=9)).updated == ["b"]
    assert next_run_at(conn, "b") == datetime(2025, 1, 11, tzinfo=UTC)


def test_each_occurrence_fires_exactly_once_as_the_clock_moves(conn, db_url, config):
    start = datetime(2025, 1, 1, tzinfo=UTC)
    write_schedules(config, "schedules:\n  - {name: half-hourly, cron: '*/30 * * * *', kind: test.noop}\n")
    on_db(db_url, sync, declared(config), now=start)

    async def tick(db) -> None:
        for minute in range(0, 24 * 60, 7):  # the clock moves through a day in 7-minute steps
            now = start + timedelta(minutes=minute)
            await fire_due(db, now=now)
            assert await fire_due(db, now=now) == []  # asking again at the same time fires nothing

    on_db(db_url, tick)
    occurrences = [o for _, o in jobs_of(conn, "half-hourly")]
    expected = [(start + timedelta(minutes=30 * i)).isoformat() for i in range(1, 48)]
    assert occurrences == expected  # 00:30 .. 23:30, in order, none twice


def test_downtime_fires_one_catch_up_job_or_none_when_skipping(conn, db_url, config):
    start = datetime(2025, 1, 1, tzinfo=UTC)
    write_schedules(
        config,
        "schedules:\n  - {name: catch-up, cron: '*/5 * * * *', kind: test.noop}\n"
        "  - {name: skipper, cron: '*/5 * * * *', kind: test.noop, missed: skip}\n",
    )
    on_db(db_url, sync, declared(config), now=start)
    back = start + timedelta(minutes=50, seconds=20)  # down through ten occurrences, 00:05 .. 00:50
    fired = {f.name: f for f in on_db(db_url, fire_due, now=back)}
    assert jobs_of(conn, "catch-up") == [(fired["catch-up"].job_id, "2025-01-01T00:05:00+00:00")]
    assert fired["skipper"].skipped and fired["skipper"].job_id is None and jobs_of(conn, "skipper") == []
    for name in ("catch-up", "skipper"):  # both go on from the next occurrence after now
        assert next_run_at(conn, name) == datetime(2025, 1, 1, 0, 55, tzinfo=UTC)

    # A skipping schedule still fires an occurrence that is merely late (a restart, a busy moment).
    late = on_db(db_url, fire_due, now=datetime(2025, 1, 1, 0, 55, 30, tzinfo=UTC))
    assert sorted((f.name, f.skipped) for f in late) == [("catch-up", False), ("skipper", False)]


def test_a_replayed_occurrence_is_deduplicated_by_its_key(conn, db_url, config):
    start = datetime(2025, 1, 1, tzinfo=UTC)
    write_schedules(config, "schedules:\n  - {name: daily, cron: '@daily', kind: test.noop}\n")
    on_db(db_url, sync, declared(config), now=start)
    [first] = on_db(db_url, fire_due, now=start + timedelta(days=1, minutes=1))
    conn.execute("UPDATE dygo_schedules SET next_run_at = %s", (first.occurrence,))  # moved back by hand
    [again] = on_db(db_url, fire_due, now=start + timedelta(days=1, minutes=2))
    assert (again.job_id, again.deduplicated) == (first.job_id, True)
    assert len(jobs_of(conn, "daily")) == 1


def test_an_occurrence_that_cannot_be_enqueued_is_reported_and_passed_over(conn, db_url, config):
    start = datetime(2025, 1, 1, tzinfo=UTC)
    write_schedules(config, "schedules:\n  - {name: daily, cron: '@daily', kind: test.noop}\n")
    on_db(db_url, sync, declared(config), now=start)
    conn.execute("UPDATE dygo_schedules SET queue = 'retired'")  # as written by a worker with other config
    [fired] = on_db(db_url, fire_due, now=start + timedelta(days=1, minutes=1))
    assert fired.job_id is None and "queue 'retired' is not configured" in fired.error
    assert next_run_at(conn, "daily") == datetime(2025, 1, 3, tzinfo=UTC) and jobs_of(conn, "daily") == []


def test_dst_occurrences_fired_through_the_database(conn, db_url, config):
    write_schedules(
        config, "schedules:\n  - {name: ny, cron: '30 2 * * *', timezone: America/New_York, kind: test.noop}\n"
    )
    start = datetime(2025, 3, 7, 12, tzinfo=NEW_YORK)
    on_db(db_url, sync, declared(config), now=start)

    async def tick(db) -> None:
        for hour in range(4 * 24):
            await fire_due(db, now=start + timedelta(hours=hour, minutes=1))

    on_db(db_url, tick)
    occurrences = [datetime.fromisoformat(o) for _, o in jobs_of(conn, "ny")]
    assert local(occurrences) == ["03-08 02:30 EST", "03-09 03:30 EDT", "03-10 02:30 EDT", "03-11 02:30 EDT"]


# --- real worker processes -------------------------------------------------------------------------

YEARLY = "schedules:\n  - {name: yearly, cron: '@yearly', kind: test.mark}\n"


def start_workers(spawn, db_url: str, config: Path, count: int, *flags: str) -> list:
    env = dygo_env(db_url, DYGO_CONFIG_DIR=str(config))
    workers = [spawn("worker", *flags, env=env) for _ in range(count)]
    for worker in workers:
        worker.wait_for_line("started")
    return workers


def test_four_workers_fire_50_occurrences_as_exactly_50_jobs(conn, db_url, config, spawn):
    write_schedules(config, YEARLY)
    workers = start_workers(spawn, db_url, config, 4, "--queue", "default")
    # Each round moves next_run_at back to a distinct occurrence; the update NOTIFYs every worker at once.
    occurrences = [datetime(1970 + k, 1, 1, tzinfo=UTC) for k in range(50)]
    for occurrence in occurrences:
        conn.execute("UPDATE dygo_schedules SET next_run_at = %s WHERE name = 'yearly'", (occurrence,))
        wait_until(
            lambda o=occurrence: [j for j in jobs_of(conn, "yearly") if j[1] == o.isoformat()],
            timeout=10,
            interval=0.005,
            message=f"occurrence {occurrence}",
        )
    wait_until(lambda: conn.execute("SELECT count(*) FROM test_runs").fetchone()[0] >= 50, message="50 runs")
    time.sleep(0.3)  # room for a duplicate to show up, were there one
    assert [o for _, o in jobs_of(conn, "yearly")] == [o.isoformat() for o in occurrences]
    runs, distinct = conn.execute("SELECT count(*), count(DISTINCT job_id) FROM test_runs").fetchone()
    assert (runs, distinct) == (50, 50)
    fires = sum(w.stderr().count("schedule yearly occurrence") for w in workers)
    assert fires == 50
    assert next_run_at(conn, "yearly").year == datetime.now(UTC).year + 1


def test_worker_killed_mid_fire_loses_and_duplicates_nothing(conn, db_url, config, spawn, server_url):
    write_schedules(config, YEARLY)
    [first] = start_workers(spawn, db_url, config, 1)
    occurrence = datetime(2000, 1, 1, tzinfo=UTC)
    # Hold the occurrence's key in an open transaction: the firing worker blocks mid-fire on it,
    # holding the schedule row lock, with its job not yet inserted.
    with psycopg.connect(db_url) as holder:
        holder.execute(
            "INSERT INTO dygo_idempotency_keys (key, job_id, expires_at) VALUES (%s, 0, now())",
            (occurrence_key("yearly", occurrence),),
        )
        conn.execute("UPDATE dygo_schedules SET next_run_at = %s WHERE name = 'yearly'", (occurrence,))
        wait_until(
            lambda: conn.execute(
                "SELECT 1 FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock' "
                "AND query LIKE '%dygo_idempotency_keys%'"
            ).fetchone(),
            message="the worker to block mid-fire",
        )
        first.signal(signal.SIGKILL)
        first.wait()
        [second] = start_workers(spawn, db_url, config, 1)
        time.sleep(0.5)
        assert jobs_of(conn, "yearly") == []  # the row is still locked by the dead worker's transaction
        holder.rollback()
    wait_until(lambda: jobs_of(conn, "yearly"), message="the second worker to fire the occurrence")
    wait_until(lambda: conn.execute("SELECT count(*) FROM test_runs").fetchone()[0] == 1, message="the job to run")
    time.sleep(0.3)
    [(job_id, fired)] = jobs_of(conn, "yearly")
    assert fired == occurrence.isoformat()
    assert conn.execute("SELECT pid FROM test_runs").fetchone()[0] == second.process.pid
    assert conn.execute("SELECT last_job_id FROM dygo_schedules").fetchone()[0] == job_id


def test_once_after_downtime_fires_one_catch_up_job_and_skips_when_told(conn, db_url, config, spawn):
    write_schedules(
        config,
        "schedules:\n  - {name: catch-up, cron: '* * * * *', kind: test.mark}\n"
        "  - {name: skipper, cron: '* * * * *', kind: test.mark, missed: skip}\n",
    )
    on_db(db_url, sync, declared(config))
    # The workers were down for the last ten occurrences.
    conn.execute("UPDATE dygo_schedules SET next_run_at = date_trunc('minute', now()) - interval '9 minutes'")
    missed_from = next_run_at(conn, "catch-up")
    before = conn.execute("SELECT now()").fetchone()[0]
    once = spawn("worker", "--once", env=dygo_env(db_url, DYGO_CONFIG_DIR=str(config)))
    assert once.wait() == 0
    assert "ran 1 job(s) once" in "".join(once.lines)
    [(job_id, occurrence)] = jobs_of(conn, "catch-up")
    assert occurrence == missed_from.astimezone(UTC).isoformat()
    assert jobs_of(conn, "skipper") == []
    assert conn.execute("SELECT count(*) FROM test_runs WHERE job_id = %s", (job_id,)).fetchone()[0] == 1
    # Each schedule's next occurrence is its first one after the run (which may have crossed a minute).
    assert conn.execute(
        "SELECT bool_and(next_run_at > %s AND next_run_at <= now() + interval '1 minute') FROM dygo_schedules",
        (before,),
    ).fetchone()[0]
    assert "skipper occurrence" in once.stderr() and "skipped (missed: skip)" in once.stderr()


def test_worker_timer_fires_at_the_occurrence(conn, db_url, config, spawn):
    write_schedules(config, YEARLY)
    start_workers(spawn, db_url, config, 1)
    due = conn.execute(
        "UPDATE dygo_schedules SET next_run_at = now() + interval '1 second' RETURNING next_run_at"
    ).fetchone()[0]
    [(job_id, _)] = wait_until(lambda: jobs_of(conn, "yearly"), timeout=10, message="the occurrence to fire")
    enqueued_at = conn.execute("SELECT enqueued_at FROM dygo_jobs WHERE id = %s", (job_id,)).fetchone()[0]
    assert timedelta(0) <= enqueued_at - due < timedelta(milliseconds=500)


# --- admin: API and CLI ----------------------------------------------------------------------------


def test_list_pause_resume_trigger_over_http_and_the_cli(conn, db_url, config, spawn, serve):
    write_schedules(
        config,
        "schedules:\n"
        "  - {name: nightly, cron: '30 2 * * *', timezone: Europe/Paris, kind: test.record}\n"
        "  - {name: gone, cron: '@daily', kind: test.noop}\n",
    )
    on_db(db_url, sync, declared(config))
    server = serve()
    api, base = server.admin, "/api/v1/schedules"

    listed = {s["name"]: s for s in server.reader.get(base).json()["schedules"]}
    nightly = listed["nightly"]
    assert (nightly["description"], nightly["timezone"], nightly["status"]) == (
        "every day at 02:30",
        "Europe/Paris",
        "active",
    )
    assert nightly["last_job"] is None and nightly["queue"] == "default" and nightly["args"] == {"seconds": 0.0}
    next_before = datetime.fromisoformat(nightly["next_run_at"])
    assert next_before.astimezone(ZoneInfo("Europe/Paris")).strftime("%H:%M") == "02:30"
    assert server.reader.post(f"{base}/nightly/pause").status_code == 403  # operations need an admin token

    paused = api.post(f"{base}/nightly/pause").json()
    assert (paused["status"], paused["next_run_at"]) == ("paused", None)
    conn.execute("UPDATE dygo_schedules SET next_run_at = now() - interval '1 hour' WHERE name = 'nightly'")
    assert on_db(db_url, fire_due) == []  # a paused schedule does not fire
    on_db(db_url, sync, declared(config))  # nor does a deploy undo the pause
    assert api.get(f"{base}/nightly").json()["status"] == "paused"

    resumed = api.post(f"{base}/nightly/resume").json()
    assert resumed["status"] == "active"
    assert datetime.fromisoformat(resumed["next_run_at"]) == next_before  # the missed hour is not made up

    response = api.post(f"{base}/nightly/trigger")
    assert response.status_code == 201, response.text
    job_id = response.json()["job"]["id"]
    meta = conn.execute("SELECT meta FROM dygo_jobs WHERE id = %s", (job_id,)).fetchone()[0]
    assert meta == {"schedule": "nightly", "trigger": "manual"}
    after = api.get(f"{base}/nightly").json()
    assert after["last_job"] == {"id": job_id, "state": "pending"} and after["last_run_at"] is not None
    assert datetime.fromisoformat(after["next_run_at"]) == next_before  # occurrences unaffected

    assert api.get(f"{base}/nope").json() == {
        "error": {"code": "schedule_not_found", "message": "no schedule named 'nope'", "details": None}
    }
    assert api.post(f"{base}/nope/pause").status_code == 404
    write_schedules(
        config, "schedules:\n  - {name: nightly, cron: '30 2 * * *', timezone: Europe/Paris, kind: test.record}\n"
    )
    on_db(db_url, sync, declared(config))
    refused = api.post(f"{base}/gone/trigger")
    assert (refused.status_code, refused.json()["error"]["code"]) == (409, "schedule_removed")

    cli = spawn("schedules")
    assert cli.wait() == 0
    header, *rows = cli.lines
    assert header.split()[:6] == ["NAME", "SPEC", "TIMEZONE", "NEXT", "LAST", "STATUS"]
    assert rows[0].startswith("gone ") and " removed " in rows[0]
    assert rows[1].startswith("nightly ") and "30 2 * * *" in rows[1] and "Europe/Paris" in rows[1]
    assert f"{job_id} pending" in rows[1] and rows[1].rstrip().endswith("every day at 02:30")
