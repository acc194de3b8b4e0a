"""How soon a job in `ctx.wait_for_event` goes on after an emit of its key commits, and how many a second.

    .venv/bin/python bench/event_wake.py                          # 1,000 jobs, emitted flat out, one per transaction
    .venv/bin/python bench/event_wake.py --jobs 200 --rate 50     # paced: 50 emits a second (unloaded latency)
    .venv/bin/python bench/event_wake.py --burst 100              # 100 keys emitted per transaction

On a fresh database (`bench_event_wake` on the embedded server), one `dygo worker` (log level WARNING, the default
60 s poll: wake-ups come from notifications) runs, round after round: `--jobs` jobs of `bench.wait_event`
(bench/bench_jobs.py), each waiting for its own key, are enqueued in one statement; once every one is
`waiting`, this process emits the keys (`dygo.emit`, on one autocommit connection), `--burst` keys per
transaction, flat out or `--rate` emits a second. Each job's handler returns the epoch second its run went on
after the wait. Latency per job = that second - the moment its emit's transaction committed (the commit's
return here; same host, same clock). Rate = jobs / (the last job's resume - the first commit).

Printed per round: p50, p95, p99, max latency and jobs/s, then the median round; the emitter's time in its
transactions, commits included, per emit (µs/emit); and, measured after the round, a one-row INSERT committed on
its own from this process (µs/INSERT): an emit's floor on this disk at that moment.
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
from common import WorkerProcess, paced, percentile, wait_until  # noqa: E402
from run import embedded_server_url, fresh_database  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from dygo.store.events import emit  # noqa: E402
from dygo.store.migrate import migrate  # noqa: E402

DATABASE = "bench_event_wake"


def bare_insert_us(conn: psycopg.Connection, count: int = 300) -> float:
    """The floor of an emit in its own transaction: a one-row INSERT committed on its own (one round trip and
    a commit's WAL flush), from this process, measured in each round next to the emits."""
    conn.execute("CREATE TABLE IF NOT EXISTS bench_bare_insert (key text, payload jsonb)")
    began = time.perf_counter()
    for n in range(count):
        conn.execute("INSERT INTO bench_bare_insert VALUES (%s, 'null')", (f"k:{n}",))
    elapsed = time.perf_counter() - began
    conn.execute("DROP TABLE bench_bare_insert")
    return elapsed / count * 1e6


def one_round(
    conn: psycopg.Connection, worker: WorkerProcess, jobs: int, burst: int, rate: float
) -> tuple[list[float], float, float]:
    """Each job's latency (ms) from its emit's commit to its resume; jobs/s; µs per emit on the emitter."""
    conn.execute("TRUNCATE dygo_jobs, dygo_steps, dygo_events")
    conn.execute(
        "INSERT INTO dygo_jobs (kind, queue, args) "
        "SELECT 'bench.wait_event', 'default', jsonb_build_object('key', 'k:' || i) FROM generate_series(1, %s) i",
        (jobs,),
    )
    conn.execute("SELECT pg_notify('dygo_jobs', 'default')")

    def all_waiting() -> bool:
        worker.check_alive()
        row = conn.execute("SELECT count(*) FROM dygo_jobs WHERE state = 'waiting'").fetchone()
        return row is not None and row[0] >= jobs

    wait_until(all_waiting, 120, f"{jobs} jobs waiting for their events", interval=0.05)
    committed: dict[str, float] = {}
    keys = [f"k:{i}" for i in range(1, jobs + 1)]
    batches = [keys[i : i + burst] for i in range(0, jobs, burst)]
    interval = burst / rate if rate else 0.0
    spent = 0.0  # in the emits' transactions, commits included
    for index in paced(len(batches), interval):
        began = time.perf_counter()
        with conn.transaction():
            for key in batches[index]:
                emit(conn, key, {"n": key})
        spent += time.perf_counter() - began
        committed.update(dict.fromkeys(batches[index], time.time()))
    per_emit_us = spent / jobs * 1e6

    def all_done() -> bool:
        worker.check_alive()
        row = conn.execute("SELECT count(*) FROM dygo_jobs WHERE state = 'succeeded'").fetchone()
        return row is not None and row[0] >= jobs

    wait_until(all_done, 300, f"{jobs} jobs to resume", interval=0.05)
    rows = conn.execute("SELECT args->>'key', result::float8, attempt FROM dygo_jobs").fetchall()
    assert all(attempt == 1 for *_, attempt in rows), "a wait spent an attempt"
    latencies = [(resumed - committed[key]) * 1000 for key, resumed, _ in rows]
    span = max(resumed for _, resumed, _ in rows) - min(committed.values())
    return latencies, jobs / span, per_emit_us


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=50)
    parser.add_argument("--burst", type=int, default=1, help="keys emitted per transaction")
    parser.add_argument("--rate", type=float, default=0.0, help="emits a second (0: flat out)")
    args = parser.parse_args()
    url = fresh_database(embedded_server_url(), DATABASE)
    with tempfile.TemporaryDirectory(prefix="dygo-event-") as config, psycopg.connect(url, autocommit=True) as conn:
        migrate(conn)
        (Path(config) / "queues.yml").write_text(f"queues:\n  - name: default\n    concurrency: {args.concurrency}\n")
        (Path(config) / "dygo.yml").write_text("jobs: [bench_jobs]\n")
        path = os.pathsep.join(filter(None, [str(Path(__file__).resolve().parent), os.environ.get("PYTHONPATH")]))
        env = {"DATABASE_URL": url, "DYGO_CONFIG_DIR": config, "DYGO_LOG_LEVEL": "WARNING", "PYTHONPATH": path}
        with WorkerProcess([str(Path(sys.executable).with_name("dygo")), "worker"], env) as worker:
            wait_until(lambda: conn.execute("SELECT count(*) FROM dygo_workers").fetchone()[0] > 0, 30, "the worker")
            rounds = []
            for number in range(args.rounds):
                latencies, jobs_per_s, per_emit = one_round(conn, worker, args.jobs, args.burst, args.rate)
                ordered = sorted(latencies)
                summary = [percentile(ordered, p) for p in (50, 95, 99)] + [ordered[-1], jobs_per_s, per_emit]
                summary.append(bare_insert_us(conn))
                print(f"round {number + 1} done", file=sys.stderr, flush=True)
                rounds.append(summary)
    pace = f"{args.rate:g} emits/s" if args.rate else "flat out"
    print(
        f"{args.jobs} jobs waiting for their own keys, emitted {pace}, {args.burst} per transaction; one worker at "
        f"concurrency {args.concurrency}; ms from the emit's commit to the handler going on\n"
    )
    print(f"{'round':>6} {'p50':>8} {'p95':>8} {'p99':>8} {'max':>8} {'jobs/s':>8} {'µs/emit':>8} {'µs/INSERT':>9}")
    for number, (p50, p95, p99, most, jobs_per_s, per_emit, bare) in enumerate(rounds, 1):
        print(
            f"{number:>6} {p50:>8.1f} {p95:>8.1f} {p99:>8.1f} {most:>8.1f} {jobs_per_s:>8.0f} {per_emit:>8.0f} "
            f"{bare:>9.0f}"
        )
    p50, p95, p99, most, jobs_per_s, per_emit, bare = (statistics.median(r[i] for r in rounds) for i in range(7))
    print(
        f"\nmedian of the rounds: p50 {p50:.1f} ms, p95 {p95:.1f} ms, p99 {p99:.1f} ms, max {most:.1f} ms, "
        f"{jobs_per_s:.0f} jobs/s, {per_emit:.0f} µs per emit; a one-row INSERT committed alone {bare:.0f} µs"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
