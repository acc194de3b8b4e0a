"""How soon a job in `ctx.sleep` runs again after its wake time, with many jobs waking at the same instant.

    .venv/bin/python bench/sleep_wake.py                      # 3 rounds of 1,000 jobs, concurrency 50
    .venv/bin/python bench/sleep_wake.py --jobs 5000 --rounds 5 --concurrency 100 --lead 8

On a fresh database (`bench_sleep_wake` on the embedded server), one `dygo worker` (log level WARNING, the
default 60 s poll: wake-ups come from its timers and notifications) runs, round after round:

- sleep: `--jobs` jobs of `bench.sleep_until` (bench/bench_jobs.py), all enqueued in one statement; each first
  run calls `ctx.sleep` until the same instant, `--lead` seconds ahead, and leaves its slot. The round checks
  that every job had recorded its sleep and was pending before that instant, then waits until all succeeded.
  Latency per job = the resumed run's start (started_at, set at its claim) - the wake time of its sleep row.
- reference: `--jobs` no-op jobs enqueued with the same run_at, `--lead` seconds ahead (a plain scheduled job).
  Latency = started_at - run_at.

Printed: p50, p95 and max of each, per round, then the median round; `run_at` is how far after its wake time
each sleeping job's run_at was settled (the settle turns the sleep's seconds left into a run_at at its own
now(), a moment after the sleep was recorded), a part of the sleep's latency. What separates the two is the resumed
run's own work (its one read of the recorded steps) and the sleep's settle; both share the claim's path.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import WorkerProcess, percentile, wait_until  # noqa: E402
from run import embedded_server_url, fresh_database  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from dygo.store.migrate import migrate  # noqa: E402

DATABASE = "bench_sleep_wake"
WHAT = ("sleep", "scheduled", "run_at", "snooze")


def summary(latencies_ms: list[float]) -> tuple[float, float, float]:
    ordered = sorted(latencies_ms)
    return percentile(ordered, 50), percentile(ordered, 95), ordered[-1]


def succeeded(conn: psycopg.Connection, worker: WorkerProcess, jobs: int, what: str) -> None:
    def done() -> bool:
        worker.check_alive()
        row = conn.execute("SELECT count(*) FROM dygo_jobs WHERE state = 'succeeded'").fetchone()
        return row is not None and row[0] >= jobs

    wait_until(done, 600, f"{jobs} {what} jobs to succeed", interval=0.05)


def sleep_round(
    conn: psycopg.Connection, worker: WorkerProcess, jobs: int, lead: float
) -> tuple[list[float], list[float]]:
    """Each job's latency after its wake time, and how far after the wake time its run_at was settled."""
    conn.execute("TRUNCATE dygo_jobs, dygo_steps")
    until = time.time() + lead
    conn.execute(
        "INSERT INTO dygo_jobs (kind, queue, args) "
        "SELECT 'bench.sleep_until', 'default', jsonb_build_object('until', %s::float8) FROM generate_series(1, %s)",
        (until, jobs),
    )
    conn.execute("SELECT pg_notify('dygo_jobs', 'default')")

    def asleep() -> bool:
        worker.check_alive()
        row = conn.execute(
            "SELECT count(*) FROM dygo_jobs j JOIN dygo_steps s ON s.job_id = j.id AND s.op = 'sleep' "
            "WHERE j.state = 'pending' AND j.attempt = 0"
        ).fetchone()
        return row is not None and row[0] >= jobs

    wait_until(asleep, lead, f"{jobs} jobs asleep before their wake time")
    if time.time() >= until:
        raise SystemExit(f"the jobs were not all asleep before their wake time: raise --lead above {lead}")
    succeeded(conn, worker, jobs, "sleeping")
    rows = conn.execute(
        "SELECT extract(epoch FROM j.started_at - s.wake_at) * 1000, extract(epoch FROM j.run_at - s.wake_at) * 1000,"
        " j.attempt FROM dygo_jobs j JOIN dygo_steps s ON s.job_id = j.id AND s.op = 'sleep'"
    ).fetchall()
    assert all(attempt == 1 for *_, attempt in rows), "a sleep spent an attempt"
    return [float(ms) for ms, _, _ in rows], [float(ms) for _, ms, _ in rows]


def snooze_round(conn: psycopg.Connection, worker: WorkerProcess, jobs: int, lead: float) -> list[float]:
    """Each job's latency after the instant it snoozed until (its run_at as settled)."""
    conn.execute("TRUNCATE dygo_jobs, dygo_steps")
    until = time.time() + lead
    conn.execute(
        "INSERT INTO dygo_jobs (kind, queue, args) "
        "SELECT 'bench.snooze_until', 'default', jsonb_build_object('until', %s::float8) FROM generate_series(1, %s)",
        (until, jobs),
    )
    conn.execute("SELECT pg_notify('dygo_jobs', 'default')")

    def snoozing() -> bool:
        worker.check_alive()
        row = conn.execute(
            "SELECT count(*) FROM dygo_jobs WHERE state = 'pending' AND attempt = 0 AND started_at IS NOT NULL"
        ).fetchone()
        return row is not None and row[0] >= jobs

    wait_until(snoozing, lead, f"{jobs} jobs snoozed before their wake time")
    succeeded(conn, worker, jobs, "snoozed")
    rows = conn.execute(
        "SELECT extract(epoch FROM started_at - to_timestamp((args->>'until')::float8)) * 1000 FROM dygo_jobs"
    ).fetchall()
    return [float(ms) for (ms,) in rows]


def scheduled_round(conn: psycopg.Connection, worker: WorkerProcess, jobs: int, lead: float) -> list[float]:
    conn.execute("TRUNCATE dygo_jobs, dygo_steps")
    conn.execute(
        "INSERT INTO dygo_jobs (kind, queue, args, run_at) "
        "SELECT 'bench.noop', 'default', '{}', now() + make_interval(secs => %s) FROM generate_series(1, %s)",
        (lead, jobs),
    )
    conn.execute("SELECT pg_notify('dygo_jobs', 'default')")
    succeeded(conn, worker, jobs, "scheduled")
    rows = conn.execute("SELECT extract(epoch FROM started_at - run_at) * 1000 FROM dygo_jobs").fetchall()
    return [float(ms) for (ms,) in rows]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=50)
    parser.add_argument("--lead", type=float, default=5.0, help="seconds from the enqueue to the wake time")
    args = parser.parse_args()
    url = fresh_database(embedded_server_url(), DATABASE)
    with tempfile.TemporaryDirectory(prefix="dygo-sleep-") as config, psycopg.connect(url, autocommit=True) as conn:
        migrate(conn)
        (Path(config) / "queues.yml").write_text(f"queues:\n  - name: default\n    concurrency: {args.concurrency}\n")
        (Path(config) / "dygo.yml").write_text("jobs: [bench_jobs]\n")
        path = os.pathsep.join(filter(None, [str(Path(__file__).resolve().parent), os.environ.get("PYTHONPATH")]))
        env = {"DATABASE_URL": url, "DYGO_CONFIG_DIR": config, "DYGO_LOG_LEVEL": "WARNING", "PYTHONPATH": path}
        with WorkerProcess([str(Path(sys.executable).with_name("dygo")), "worker"], env) as worker:
            wait_until(lambda: conn.execute("SELECT count(*) FROM dygo_workers").fetchone()[0] > 0, 30, "the worker")
            rounds = []
            for number in range(args.rounds):
                latencies, settled_after = sleep_round(conn, worker, args.jobs, args.lead)
                sleeping, drift = summary(latencies), summary(settled_after)
                scheduled = summary(scheduled_round(conn, worker, args.jobs, args.lead))
                snoozed = summary(snooze_round(conn, worker, args.jobs, args.lead))
                print(f"round {number + 1} done", file=sys.stderr, flush=True)
                rounds.append((sleeping, scheduled, drift, snoozed))
    print(f"{args.jobs} jobs waking at one instant, one worker at concurrency {args.concurrency}; ms after it\n")
    print(f"{'round':>6} {'what':>10} {'p50':>8} {'p95':>8} {'max':>8}")
    for number, pair in enumerate(rounds, 1):
        for what, (p50, p95, most) in zip(WHAT, pair, strict=True):
            print(f"{number:>6} {what:>10} {p50:>8.0f} {p95:>8.0f} {most:>8.0f}")
    print("\nmedian of the rounds")
    for index, what in enumerate(WHAT):
        p50, p95, most = (statistics.median(r[index][i] for r in rounds) for i in range(3))
        print(f"{what:>10}: p50 {p50:.0f} ms, p95 {p95:.0f} ms, max {most:.0f} ms")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
