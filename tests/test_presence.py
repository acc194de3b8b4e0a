"""A dead worker's jobs come back in seconds through its presence lock (worker/presence.py), not after its
lease; a paused worker, whose session stays open, keeps its jobs; the watch counts only what it saw on the
server it talks to now. The worker processes run the default lease TTL (30 s), so only presence can explain a
re-run within seconds."""

from __future__ import annotations

import asyncio
import shutil
import signal
import time
from collections.abc import Callable
from pathlib import Path

import psycopg
import pytest
from dygo.store import JobRequest, enqueue_many, leases
from dygo.worker import presence
from dygo.worker.database import WorkerConnections
from dygo.worker.presence import PresenceWatch

from tests.conftest import TEST_CONFIG, dygo_env, wait_until

pytestmark = pytest.mark.alone

RECOVERED_WITHIN = 5.0  # seconds from a SIGKILL to every job of the dead worker running again


@pytest.fixture
def default_lease_env(db_url: str, tmp_path: Path) -> dict[str, str]:
    """The test kinds and queues with dygo's default lease TTL (the tests' own config shortens it)."""
    shutil.copy(TEST_CONFIG / "queues.yml", tmp_path / "queues.yml")
    (tmp_path / "dygo.yml").write_text("jobs: [tests.jobs, tests.jobs_children]\nmax_reaps: 2\n")
    return dygo_env(db_url, DYGO_CONFIG_DIR=str(tmp_path))


def runs_by_pid(conn: psycopg.Connection, ids: list[int]) -> dict[int, list[int]]:
    rows = conn.execute("SELECT pid, job_id FROM test_runs WHERE job_id = ANY(%s) ORDER BY at", (ids,)).fetchall()
    found: dict[int, list[int]] = {}
    for pid, job_id in rows:
        found.setdefault(pid, []).append(job_id)
    return found


def test_a_paused_worker_keeps_its_jobs_and_a_killed_ones_run_again_within_seconds(conn, spawn, default_lease_env):
    workers = [spawn("worker", "--concurrency", "4", env=default_lease_env) for _ in range(2)]
    for worker in workers:
        worker.wait_for_line("ready")
    assert "come back in seconds (presence lock" in workers[0].lines[0]
    jobs = enqueue_many(conn, [JobRequest("test.slow_first_briefly", {"seconds": 60})] * 3)
    ids = [j.id for j in jobs]
    wait_until(lambda: sum(map(len, runs_by_pid(conn, ids).values())) == 3, message="the three first runs")
    time.sleep(presence.PRESENCE_INTERVAL + 0.2)  # the other worker's watch has seen the victim's lock held
    victim_pid, held = max(runs_by_pid(conn, ids).items(), key=lambda item: len(item[1]))
    victim = next(w for w in workers if w.process.pid == victim_pid)

    # Paused longer than the watch's grace and pass together, shorter than the lease: its session stays open.
    victim.signal(signal.SIGSTOP)
    time.sleep(presence.ABSENCE_GRACE + 2 * presence.PRESENCE_INTERVAL)
    victim.signal(signal.SIGCONT)
    reaped = conn.execute("SELECT count(*) FROM dygo_jobs WHERE id = ANY(%s) AND reap_count > 0", (ids,)).fetchone()
    assert reaped[0] == 0

    killed_at = conn.execute("SELECT clock_timestamp()").fetchone()[0]
    victim.process.kill()
    victim.process.wait(5)
    again = "SELECT count(*), max(at) FROM test_runs WHERE job_id = ANY(%s) AND at > %s"
    count, last = wait_until(
        lambda: (row := conn.execute(again, (held, killed_at)).fetchone())[0] == len(held) and row,
        timeout=RECOVERED_WITHIN + 5,
        message="the killed worker's jobs to run again",
    )
    took = (last - killed_at).total_seconds()
    print(f"{count} job(s) of the killed worker ran again {took:.2f}s after the kill")
    assert took < RECOVERED_WITHIN
    errors = conn.execute("SELECT last_error FROM dygo_jobs WHERE id = ANY(%s)", (held,)).fetchall()
    assert all("is gone: its session to the database ended" in e for (e,) in errors)


def test_the_watch_counts_only_locks_it_saw_held_and_forgets_them_at_an_outage(conn, db_url, monkeypatch):
    monkeypatch.setattr(presence, "ABSENCE_GRACE", 0.2)
    for name in ("w-alive", "w-dead", "w-unseen"):
        conn.execute("INSERT INTO dygo_workers (id, hostname, pid, queues) VALUES (%s, 'h', 1, '{}')", (name,))

    async def go() -> None:
        database = WorkerConnections(db_url, "w-watcher")
        await database.pool.open()
        watch = PresenceWatch(database, "w-watcher", max_reaps=2)
        sessions = {}
        for name in ("w-alive", "w-dead"):
            sessions[name] = await psycopg.AsyncConnection.connect(db_url, autocommit=True)
            assert await leases.hold_presence(sessions[name], name)
        try:
            assert await watch.look() == []
            await sessions.pop("w-dead").close()
            # Never seen held, w-unseen is left to its lease; w-dead is gone once free for the grace.
            assert await looks(watch, until=lambda gone: gone != []) == ["w-dead"]
            # After an outage of its own worker, nothing seen before counts: w-dead may be reconnecting.
            database.outage.lost("a test", OSError("cut"))
            database.outage.back()
            assert await looks(watch, until=lambda gone: False, seconds=0.5) == []
        finally:
            for session in sessions.values():
                await session.close()
            await database.close()

    asyncio.run(go())


async def looks(watch: PresenceWatch, until: Callable[[list[str]], bool], seconds: float = 3.0) -> list[str]:
    """The watch's looks every 50 ms for `seconds` at most; the first that satisfies `until`, or the last."""
    deadline = time.monotonic() + seconds
    while True:
        gone = await watch.look()
        if until(gone) or time.monotonic() > deadline:
            return gone
        await asyncio.sleep(0.05)
