"""Per-worker caps: `@job(concurrency=N)`, `default_concurrency`, `max_concurrency` and
`dygo worker --max-concurrency`. Real worker processes; every start and end is recorded from inside the
handler (tests/jobs.py `spanned`), so an overlap is measured, not inferred."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import psycopg
import pytest
from dygo.store import enqueue_many
from dygo.store.errors import ConfigError
from dygo.store.registry import Registry, job

from tests.claiming import claim_queues
from tests.conftest import REPO, TEST_CONFIG, dygo_env, wait_until


def max_overlap(conn, kinds: tuple[str, ...]) -> int:
    """The most runs of `kinds` in progress at one moment, from the handlers' own start/end rows."""
    rows = conn.execute(
        "SELECT r.at, r.note FROM test_runs r JOIN dygo_jobs j ON j.id = r.job_id "
        "WHERE j.kind = ANY(%s) AND r.note IN ('start', 'end') ORDER BY r.at",
        (list(kinds),),
    ).fetchall()
    running = highest = 0
    for _, note in rows:
        running += 1 if note == "start" else -1
        highest = max(highest, running)
    return highest


def ended(conn, count: int) -> bool:
    return conn.execute("SELECT count(*) FROM test_runs WHERE note = 'end'").fetchone()[0] >= count


def config(tmp_path: Path, extra: str) -> Path:
    (tmp_path / "queues.yml").write_text((TEST_CONFIG / "queues.yml").read_text())
    (tmp_path / "dygo.yml").write_text((TEST_CONFIG / "dygo.yml").read_text() + extra)
    return tmp_path


def test_a_kind_capped_at_one_never_runs_twice_at_once_while_other_kinds_of_its_queue_keep_running(conn, db_url, spawn):
    # The capped kind first, at the head of the queue: a claim that took it in order would fill the
    # worker's 10 slots with it and leave the other kind waiting behind it.
    enqueue_many(
        conn,
        [{"kind": "test.capped", "args": {"seconds": 0.3}} for _ in range(6)]
        + [{"kind": "test.span", "args": {"seconds": 0.2}} for _ in range(20)],
    )
    worker = spawn("worker", "--queue", "default", "--concurrency", "10")
    worker.wait_for_line("started")
    wait_until(lambda: ended(conn, 26), timeout=30, message="all 26 jobs to end")
    # A handler's 'end' row commits before its job's settle: wait for the settles too.
    wait_until(
        lambda: conn.execute("SELECT count(*) FROM dygo_jobs WHERE state IN ('pending', 'active')").fetchone()[0] == 0,
        timeout=10,
        message="all 26 jobs to be settled",
    )
    # Never claimed ahead of a free slot of its kind (to wait in memory, active with its lease running):
    # each capped job was claimed (started_at, the claim's clock) after the previous one's handler ended.
    rows = conn.execute(
        "SELECT j.started_at, max(r.at) FILTER (WHERE r.note = 'end') FROM dygo_jobs j "
        "JOIN test_runs r ON r.job_id = j.id WHERE j.kind = 'test.capped' GROUP BY j.id ORDER BY j.started_at"
    )
    claims = rows.fetchall()
    assert len(claims) == 6
    assert all(claimed >= previous_end for (claimed, _), (_, previous_end) in zip(claims[1:], claims, strict=False))
    assert max_overlap(conn, ("test.capped",)) == 1
    assert max_overlap(conn, ("test.span",)) >= 5  # the rest of the slots went to the other kind
    starts = dict(
        conn.execute(
            "SELECT j.kind, array_agg(r.at ORDER BY r.at) FROM test_runs r JOIN dygo_jobs j ON j.id = r.job_id "
            "WHERE r.note = 'start' GROUP BY j.kind"
        ).fetchall()
    )
    last_span_end = conn.execute(
        "SELECT max(r.at) FROM test_runs r JOIN dygo_jobs j ON j.id = r.job_id "
        "WHERE j.kind = 'test.span' AND r.note = 'end'"
    ).fetchone()[0]
    # 20 jobs of 0.2 s on the 9 other slots end in ~0.5 s; the capped kind's 6 in a row take ~1.8 s.
    assert last_span_end < starts["test.capped"][4]
    # Each job ran once, on its first attempt: none was claimed and handed back.
    assert conn.execute("SELECT count(*) FROM dygo_jobs WHERE state = 'succeeded' AND attempt = 1").fetchone()[0] == 26


def test_default_concurrency_caps_kinds_that_set_none_and_a_kinds_own_cap_wins(conn, db_url, spawn, tmp_path):
    enqueue_many(
        conn,
        [{"kind": "test.span", "args": {"seconds": 0.15}} for _ in range(10)]
        + [{"kind": "test.capped", "args": {"seconds": 0.15}} for _ in range(4)],
    )
    env = dygo_env(db_url, DYGO_CONFIG_DIR=str(config(tmp_path, "default_concurrency: 2\n")))
    worker = spawn("worker", "--queue", "default", "--concurrency", "10", env=env)
    worker.wait_for_line("started")
    wait_until(lambda: ended(conn, 14), timeout=30, message="all 14 jobs to end")
    assert max_overlap(conn, ("test.span",)) == 2
    assert max_overlap(conn, ("test.capped",)) == 1
    assert max_overlap(conn, ("test.span", "test.capped")) == 3


def test_a_kind_at_its_cap_never_strands_its_remaining_jobs(conn, db_url, spawn, tmp_path):
    # A job of the capped kind that ends while a claim is under way, the claim taking the kind's last free
    # slot, must not leave the rest of the kind waiting for the poll interval (60 s here): short jobs of
    # varied length make such an end during a claim happen many times over.
    enqueue_many(conn, [{"kind": "test.span", "args": {"seconds": 0.01 + (n % 5) * 0.005}} for n in range(120)])
    env = dygo_env(db_url, DYGO_CONFIG_DIR=str(config(tmp_path, "default_concurrency: 2\n")))
    worker = spawn("worker", "--queue", "default", "--concurrency", "10", "--poll-interval", "60s", env=env)
    worker.wait_for_line("started")
    wait_until(lambda: ended(conn, 120), timeout=20, message="all 120 jobs to end")
    assert max_overlap(conn, ("test.span",)) == 2


def spans_in_both_queues(conn) -> None:
    enqueue_many(
        conn,
        [{"kind": "test.span", "args": {"seconds": 0.15}} for _ in range(12)]
        + [{"kind": "test.span", "queue": "other", "args": {"seconds": 0.15}} for _ in range(6)],
    )


def test_max_concurrency_flag_caps_all_handlers_of_the_process_together(conn, db_url, spawn, tmp_path):
    spans_in_both_queues(conn)
    # The flag wins over the setting; the queues' own concurrency adds up to 8 + 2.
    env = dygo_env(db_url, DYGO_CONFIG_DIR=str(config(tmp_path, "max_concurrency: 6\n")))
    worker = spawn("worker", "--max-concurrency", "3", env=env)
    assert "at most 3 jobs at once" in worker.wait_for_line("started")
    wait_until(lambda: ended(conn, 18), timeout=30, message="all 18 jobs to end")
    assert max_overlap(conn, ("test.span",)) == 3
    queues = {row[0] for row in conn.execute("SELECT DISTINCT queue FROM dygo_jobs WHERE state = 'succeeded'")}
    assert queues == {"default", "other"}


def test_max_concurrency_setting_caps_all_handlers_of_the_process_together(conn, db_url, spawn, tmp_path):
    spans_in_both_queues(conn)
    env = dygo_env(db_url, DYGO_CONFIG_DIR=str(config(tmp_path, "max_concurrency: 4\n")))
    worker = spawn("worker", env=env)
    assert "at most 4 jobs at once" in worker.wait_for_line("started")
    wait_until(lambda: ended(conn, 18), timeout=30, message="all 18 jobs to end")
    assert max_overlap(conn, ("test.span",)) == 4


# --- the claim statement ------------------------------------------------------------------------


def claim(db_url: str, slots: dict[str, int], caps: dict[str, int]) -> list[str]:
    import asyncio

    async def go() -> list[str]:
        async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as aconn:
            return [job.kind for job in await claim_queues(aconn, slots, "w1", 30, kind_free=caps)]

    return asyncio.run(go())


def test_claim_takes_no_more_of_a_capped_kind_than_its_free_slots_and_fills_the_rest_with_others(conn, db_url):
    enqueue_many(conn, [{"kind": "test.capped"} for _ in range(5)] + [{"kind": "test.span"} for _ in range(5)])
    assert sorted(claim(db_url, {"default": 10}, {"test.capped": 2})) == ["test.capped"] * 2 + ["test.span"] * 5
    # A kind with no free slot is skipped in the walk: the claim takes the others behind it.
    enqueue_many(conn, [{"kind": "test.capped"} for _ in range(5)] + [{"kind": "test.span"} for _ in range(5)])
    assert claim(db_url, {"default": 3}, {"test.capped": 0}) == ["test.span"] * 3
    left = conn.execute("SELECT count(*) FROM dygo_jobs WHERE kind = 'test.capped' AND state = 'pending'")
    assert left.fetchone()[0] == 8  # the trimmed and the skipped are pending still, no attempt spent
    assert conn.execute("SELECT max(attempt) FROM dygo_jobs WHERE state = 'pending'").fetchone()[0] == 0


def test_capped_claim_still_walks_the_ready_index(conn):
    from dygo.store import claim

    conn.execute("INSERT INTO dygo_jobs (kind, queue) SELECT 'test.noop', 'default' FROM generate_series(1, 5000)")
    params = {
        "queues": ["default", "other"],
        "slots": [100, 100],
        "owner": "w1",
        "ttl": 30,
        "kind_attempts": "{}",
        "max_attempts": 20,
        "full_kinds": ["test.capped"],
        "cap_kinds": ["test.span"],
        "cap_free": [3],
        **claim.walk_segments(["default", "other"], {}),
    }
    plan = "\n".join(row[0] for row in conn.execute("EXPLAIN " + claim.CLAIM_JOBS_CAPPED, params))
    assert "dygo_jobs_ready" in plan and "Seq Scan on dygo_jobs" not in plan, plan


# --- bad values are refused, naming the kind, setting or flag -------------------------------------


@pytest.mark.parametrize("value", [0, -1, True, 1.5, "3"])
def test_job_concurrency_must_be_an_integer_of_at_least_1(value):
    with pytest.raises(ConfigError, match=r"job 'x\.y': concurrency must be an integer of at least 1, got"):
        job("x.y", concurrency=value, registry=Registry())(lambda ctx, args: None)


def run_worker(tmp_path: Path, *flags: str, extra: str = "") -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "dygo", "worker", *flags],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        env={
            "PATH": "/usr/bin:/bin",
            "DYGO_CONFIG_DIR": str(config(tmp_path, extra)),
            "PYTHONPATH": str(REPO),
            "DATABASE_URL": "postgresql://nobody@127.0.0.1:1/none",
        },
    )


@pytest.mark.parametrize("key", ["default_concurrency", "max_concurrency"])
def test_a_bad_cap_setting_exits_2_naming_the_file_and_key(tmp_path, key):
    result = run_worker(tmp_path, extra=f"{key}: 0\n")
    assert result.returncode == 2, result.stderr
    assert f"{tmp_path / 'dygo.yml'}: {key}: must be an integer greater than 0" in result.stderr


def test_a_bad_max_concurrency_flag_exits_2_naming_the_flag(tmp_path):
    result = run_worker(tmp_path, "--max-concurrency", "0")
    assert result.returncode == 2, result.stderr
    assert "argument --max-concurrency: must be an integer greater than 0, got '0'" in result.stderr


def test_a_queue_holding_only_jobs_of_a_kind_at_its_cap_is_not_claimed_for_in_a_loop(conn, spawn):
    import signal

    # While the first job runs, the two behind it are ready but of a kind at its cap: the claim skips them,
    # and the idle timer must skip them too, or the worker claims (for nothing) every few milliseconds.
    enqueue_many(conn, [{"kind": "test.capped", "args": {"seconds": 1.0}} for _ in range(3)])
    worker = spawn("worker", "--queue", "default", "--concurrency", "10", "--poll-interval", "60s")
    worker.wait_for_line("started")
    wait_until(lambda: ended(conn, 3), timeout=30, message="the 3 jobs to end")
    assert max_overlap(conn, ("test.capped",)) == 1
    worker.signal(signal.SIGTERM)
    assert worker.wait() == 0  # its connections closed: their statistics are flushed
    walks = conn.execute("SELECT idx_scan FROM pg_stat_user_indexes WHERE indexrelname = 'dygo_jobs_ready'")
    # A few walks per job (the claim that takes it, one that finds its kind full, the idle timer's), not
    # one every few milliseconds for 3 s.
    count = walks.fetchone()[0]
    assert count < 60, count


def test_the_process_cap_deals_its_free_slots_around_the_queues_starting_one_further_each_claim():
    from dygo.worker.capacity import Capacity

    capacity = Capacity({}, max_concurrency=3)
    wanted = {"a": 8, "b": 8, "c": 2}
    assert capacity.share(wanted) == {"a": 1, "b": 1, "c": 1}
    capacity.started("x")
    assert capacity.share(wanted) == {"b": 1, "c": 1}  # the second claim starts at b
    capacity.started("x")
    capacity.started("x")
    assert capacity.share(wanted) == {}  # full: nothing to claim until a job ends
    capacity.finished("x")
    assert capacity.share({"a": 1}) == {"a": 1}
    assert Capacity({}, None).share(wanted) == wanted  # no process cap: untouched


def test_a_job_module_with_a_bad_concurrency_stops_the_worker_with_exit_2_naming_the_kind(tmp_path):
    (tmp_path / "badcap.py").write_text(
        "from dygo import job\n\n\n@job('bad.cap', concurrency=0)\ndef handler(ctx, args):\n    return None\n"
    )
    result = subprocess.run(
        [sys.executable, "-m", "dygo", "worker"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        env={
            "PATH": "/usr/bin:/bin",
            "DYGO_CONFIG_DIR": str(config(tmp_path, "jobs: [badcap]\n")),
            "PYTHONPATH": str(REPO),
            "DATABASE_URL": "postgresql://nobody@127.0.0.1:1/none",
        },
    )
    assert result.returncode == 2, result.stderr
    assert "badcap: job 'bad.cap': concurrency must be an integer of at least 1, got 0" in result.stderr
