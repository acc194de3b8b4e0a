"""A held snapshot: does a claim's cost depend on the number of dead rows? (`make bench-snapshot`)

Something that holds back VACUUM (an analytics query, a forgotten `BEGIN`, a replica with
`hot_standby_feedback`) keeps every row version a claim or a settle leaves behind; an index walk
that must step over them gets slower the longer the hold lasts. This measures it:

1. a fresh database (`bench_snapshot`) of the project's embedded server, migrated and never
   analysed (a freshly deployed table: the planner has no statistics yet);
2. one `dygo worker --concurrency 8`; a producer enqueues 1 ms jobs one at a time at `--rate`/s;
3. phases: `clean` (`--clean` s), `held` (`--hold` s, while another connection sits idle in a
   transaction that holds an xid), `after` (`--after` s, the hold released).

It prints pickup latency (started_at - enqueued_at, from the rows) p50/p99 per `--window`, each
phase's p50/p99, the dead tuples of dygo_jobs at the end of the hold, and the sequential scans of
dygo_jobs during the run (pg_stat_user_tables; this script's own queries use indexes until the run's
end). Targets (issue "Fleet scale", item 5): held p50 within 1.5x of clean over the hold, and no
sequential scan of the job table at any time.

    .venv/bin/python bench/held_snapshot.py                        # 60 s clean, 600 s held, 30 s after
    .venv/bin/python bench/held_snapshot.py --clean 20 --hold 60 --after 10    # a shorter look
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psycopg
from psycopg.conninfo import make_conninfo

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_jobs  # noqa: E402, F401  (registers the kinds this script enqueues)
from common import ROOT, WorkerProcess, log, paced, percentile, wait_until  # noqa: E402
from dygo.store.enqueue import enqueue  # noqa: E402

DATABASE = "bench_snapshot"
TARGET = 1.5  # held p50 at most this multiple of clean p50


def main() -> int:
    args = parse_arguments()
    server = subprocess.run(
        [sys.executable, "-m", "dygo", "db", "url"], check=True, capture_output=True, text=True, cwd=ROOT
    ).stdout.strip()
    with psycopg.connect(server, autocommit=True) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {DATABASE} WITH (FORCE)")
        conn.execute(f"CREATE DATABASE {DATABASE}")
    url = make_conninfo(server, dbname=DATABASE)
    with tempfile.TemporaryDirectory(prefix="dygo-snapshot-") as config:
        Path(config, "queues.yml").write_text(f"queues:\n  - name: default\n    concurrency: {args.concurrency}\n")
        Path(config, "dygo.yml").write_text("jobs: [bench_jobs]\n")
        env = {
            "DATABASE_URL": url,
            "DYGO_CONFIG_DIR": config,
            "DYGO_LOG_LEVEL": "WARNING",
            "PYTHONPATH": str(Path(__file__).resolve().parent),
        }
        subprocess.run(
            [sys.executable, "-m", "dygo", "migrate"],
            env={**os.environ, **env},
            cwd=ROOT,
            check=True,
            stdout=subprocess.DEVNULL,
        )
        with psycopg.connect(url, autocommit=True) as conn:
            seq_scans_before = seq_scans(conn)
        command = [sys.executable, "-m", "dygo", "worker", "--concurrency", str(args.concurrency)]
        with WorkerProcess(command, env=env) as worker, psycopg.connect(url, autocommit=True) as conn:
            wait_until(lambda: registered(conn, worker), 60, "the worker to register", interval=0.2)
            phases = run_phases(url, conn, worker, args)
            scans = seq_scans(conn) - seq_scans_before  # before this script's own reads of the table
            wait_until(lambda: not pending(conn), 60, "the last jobs to finish", interval=0.2)
            report(conn, phases, scans, args.window)
    return 0


def parse_arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rate", type=float, default=200.0, help="jobs enqueued per second")
    parser.add_argument("--job-ms", type=int, default=1)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--clean", type=float, default=60.0, help="seconds before the hold")
    parser.add_argument("--hold", type=float, default=600.0, help="seconds the snapshot is held")
    parser.add_argument("--after", type=float, default=30.0, help="seconds after the hold is released")
    parser.add_argument("--window", type=float, default=30.0, help="seconds per line of the latency table")
    return parser.parse_args()


def registered(conn: psycopg.Connection, worker: WorkerProcess) -> bool:
    worker.check_alive()
    return conn.execute("SELECT count(*) FROM dygo_workers").fetchone()[0] > 0


def pending(conn: psycopg.Connection) -> bool:
    return conn.execute("SELECT EXISTS (SELECT FROM dygo_jobs WHERE state IN ('pending', 'active'))").fetchone()[0]


def seq_scans(conn: psycopg.Connection) -> int:
    conn.execute("SELECT pg_stat_force_next_flush()")
    time.sleep(1.1)  # the worker's backends flush their counters at most every second
    return conn.execute("SELECT seq_scan FROM pg_stat_user_tables WHERE relname = 'dygo_jobs'").fetchone()[0]


def run_phases(
    url: str, conn: psycopg.Connection, worker: WorkerProcess, args: argparse.Namespace
) -> list[tuple[str, float, float, int]]:
    """Produce jobs through three phases; returns (phase, start, end, dead tuples at its end) per phase."""
    phases: list[tuple[str, float, float, int]] = []
    producing = threading.Event()
    producing.set()
    producer = threading.Thread(target=produce, args=(url, args, producing), daemon=True)
    producer.start()
    holder: psycopg.Connection | None = None
    for name, seconds in (("clean", args.clean), ("held", args.hold), ("after", args.after)):
        if name == "held":
            holder = psycopg.connect(url)
            holder.execute("SELECT pg_current_xact_id()")  # an xid: VACUUM keeps every version newer than it
        elif holder is not None:
            holder.rollback()
            holder.close()
        log(f"{name}: {seconds:g} s")
        start = database_clock(conn)
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            worker.check_alive()
            time.sleep(min(1.0, max(0.0, deadline - time.monotonic())))
        phases.append((name, start, database_clock(conn), dead_tuples(conn)))
    producing.clear()
    producer.join()
    return phases


def produce(url: str, args: argparse.Namespace, producing: threading.Event) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        for _ in paced(10**9, 1 / args.rate):
            if not producing.is_set():
                return
            enqueue(conn, "bench.sleep", {"ms": args.job_ms})


def database_clock(conn: psycopg.Connection) -> float:
    return float(conn.execute("SELECT extract(epoch FROM clock_timestamp())").fetchone()[0])


def dead_tuples(conn: psycopg.Connection) -> int:
    conn.execute("SELECT pg_stat_force_next_flush()")
    return conn.execute("SELECT n_dead_tup FROM pg_stat_user_tables WHERE relname = 'dygo_jobs'").fetchone()[0]


def report(conn: psycopg.Connection, phases: list[tuple[str, float, float, int]], scans: int, window: float) -> None:
    rows = conn.execute(
        "SELECT extract(epoch FROM enqueued_at), 1000 * extract(epoch FROM started_at - enqueued_at)"
        " FROM dygo_jobs WHERE started_at IS NOT NULL ORDER BY enqueued_at"
    ).fetchall()
    samples = [(float(at), float(ms)) for at, ms in rows]
    print("| phase | from s | jobs | pickup p50 ms | p99 ms |")
    print("|---|---|---|---|---|")
    origin = phases[0][1]
    for name, start, end, _ in phases:
        edge = start
        while edge < end:
            chunk = sorted(ms for at, ms in samples if edge <= at < min(edge + window, end))
            if chunk:
                print(
                    f"| {name} | {edge - origin:.0f} | {len(chunk)} | {percentile(chunk, 50):.1f} | "
                    f"{percentile(chunk, 99):.1f} |"
                )
            edge += window
    print()
    summary: dict[str, float] = {}
    for name, start, end, dead in phases:
        chunk = sorted(ms for at, ms in samples if start <= at < end)
        summary[name] = statistics.median(chunk) if chunk else float("nan")
        print(
            f"{name}: {len(chunk)} jobs, pickup p50 {summary[name]:.1f} ms, p99 {percentile(chunk, 99):.1f} ms; "
            f"dead tuples at its end {dead:,}"
        )
    ratio = summary["held"] / summary["clean"]
    print(f"held p50 / clean p50 = {ratio:.2f} ({'ok' if ratio <= TARGET else 'OVER'}; target <= {TARGET})")
    print(f"sequential scans of dygo_jobs during the run: {scans} ({'ok' if scans == 0 else 'OVER'}; target 0)")


if __name__ == "__main__":
    raise SystemExit(main())
