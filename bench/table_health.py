"""Table health: push many no-op jobs through a real worker with retention on; does dygo_jobs stay healthy?

    .venv/bin/python bench/table_health.py                      # 20 rounds of 50,000 = 1,000,000 jobs
    .venv/bin/python bench/table_health.py --rounds 4 --jobs 10000   # a smoke run (under a minute)
    .venv/bin/python bench/table_health.py --json .dygo/bench/health.json

On a fresh database (`bench_health`) of the embedded server, one `dygo worker --concurrency 200` runs
with short retention (succeeded jobs kept `--completed-retention`, a pass every `--retention-interval`,
from a config directory written here). Each round enqueues `--jobs` no-op jobs (enqueue_many: COPY,
batches of 5,000) while the worker drains them, then records: processed jobs/s (jobs / (last finish -
first start), from the rows), the dygo_jobs heap and each index size, live and dead tuples
(pg_stat_user_tables), autovacuum runs so far. The verdict compares the median rate of the last
three rounds with the first three: the end must be at least 80% of the start.

Run from the repository root so `dygo db url` finds the project's embedded server (.dygo/pg).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import psycopg
from common import ROOT, CpuMeter, WorkerProcess, log, parent_pid, wait_until
from dygo.store.config import load_settings
from dygo.store.enqueue import JobRequest, enqueue_many
from dygo.store.loading import load_jobs
from dygo.store.migrate import migrate
from psycopg.conninfo import make_conninfo

KIND = "example.noop"
QUEUE = "default"
BATCH = 5_000
DATABASE = "bench_health"
THRESHOLD = 0.8  # the end's rate must be at least this share of the start's


@dataclass
class Round:
    number: int
    jobs_total: int  # jobs pushed through so far
    rate: float  # processed jobs/s in this round
    enqueue_rate: float  # jobs/s enqueued while the worker drained
    cpu_us_per_job: float  # worker + PostgreSQL CPU per job in the round: what the rate is on an idle machine
    heap_mb: float  # dygo_jobs main fork
    index_mb: dict[str, float]  # each index on dygo_jobs
    live_rows: int  # n_live_tup
    dead_rows: int  # n_dead_tup
    autovacuums: int  # autovacuum_count of dygo_jobs so far
    autovacuum_seconds: float  # total_autovacuum_time of dygo_jobs so far (wall clock, PostgreSQL 18)
    vacuum_us_per_job: float  # this round's share of it: an upper bound on the vacuum CPU the meter misses
    autoanalyzes: int
    deltas_mb: float  # dygo_stats_deltas, folded by retention
    wal_bytes_per_job: float = 0.0  # WAL written in the round (the whole server: run nothing else on it)
    full_page_images_per_job: float = 0.0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--jobs", type=int, default=50_000, help="jobs per round")
    parser.add_argument("--concurrency", type=int, default=200)
    parser.add_argument("--completed-retention", default="60s", help="dygo.yml completed_retention")
    parser.add_argument("--retention-interval", default="5s", help="dygo.yml retention_interval")
    parser.add_argument("--url", help="server URL (default: `dygo db url`); the database is recreated on it")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds a round may take to drain")
    parser.add_argument("--json", type=Path, help="also write the rounds here")
    parser.add_argument("--fillfactor", type=int, help="try dygo_jobs with this fillfactor (an experiment)")
    parser.add_argument(
        "--untuned",
        action="store_true",
        help="PostgreSQL's autovacuum defaults (migration 0008's table settings reset, naptime 1min "
        "on the server for the run): the 'before' of docs/operations/retention.md",
    )
    args = parser.parse_args()

    started = time.monotonic()
    url = fresh_database(args.url or embedded_server_url(), DATABASE)
    with psycopg.connect(url, autocommit=True) as conn:
        migrate(conn)
        if args.untuned:
            untune(conn)
        if args.fillfactor:
            conn.execute(f"ALTER TABLE dygo_jobs SET (fillfactor = {int(args.fillfactor)})")
        naptime = conn.execute("SHOW autovacuum_naptime").fetchone()[0]
        log(f"dygo_jobs settings: {table_options(conn)}; autovacuum_naptime {naptime}")
    rounds: list[Round] = []
    with tempfile.TemporaryDirectory(prefix="dygo-health-config-") as config_dir:
        write_config(Path(config_dir), args)
        load_jobs(load_settings(config_dir))
        env = {"DATABASE_URL": url, "DYGO_CONFIG_DIR": config_dir, "DYGO_LOG_LEVEL": "WARNING"}
        command = [
            str(Path(sys.executable).with_name("dygo")),
            "worker",
            "--queue",
            QUEUE,
            "--concurrency",
            str(args.concurrency),
        ]
        with WorkerProcess(command, env) as worker, psycopg.connect(url, autocommit=True) as conn:
            for number in range(1, args.rounds + 1):
                rounds.append(push_round(conn, worker, number, args.jobs, args.timeout, rounds))
                log(line(rounds[-1]))
    with psycopg.connect(url, autocommit=True) as conn:
        if args.untuned:
            set_naptime(conn, None)
        updates = conn.execute(
            "SELECT n_tup_upd, n_tup_hot_upd, n_tup_newpage_upd FROM pg_stat_user_tables WHERE relname = 'dygo_jobs'"
        ).fetchone()
    elapsed = time.monotonic() - started
    print(table(rounds))
    print(verdict(rounds))
    print(
        f"{rounds[-1].jobs_total:,} jobs in {elapsed:.0f} s wall clock; dygo_jobs updates: {updates[0]:,}, "
        f"HOT {updates[1]:,}, moved to another page {updates[2]:,}"
    )
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"rounds": [asdict(r) for r in rounds], "seconds": elapsed}, indent=1))
    return 0


def embedded_server_url() -> str:
    dygo = Path(sys.executable).with_name("dygo")
    return subprocess.run([str(dygo), "db", "url"], check=True, capture_output=True, text=True, cwd=ROOT).stdout.strip()


def fresh_database(server_url: str, name: str) -> str:
    with psycopg.connect(server_url, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}"')
    return make_conninfo(server_url, dbname=name)


def write_config(config_dir: Path, args: argparse.Namespace) -> None:
    (config_dir / "queues.yml").write_text(
        f"queues:\n  - name: {QUEUE}\n    concurrency: {args.concurrency}\n  - name: slow\n    concurrency: 2\n"
    )
    (config_dir / "dygo.yml").write_text(
        f"jobs: [jobs]\ncompleted_retention: {args.completed_retention}\n"
        f"retention_interval: {args.retention_interval}\n"
    )


def untune(conn: psycopg.Connection) -> None:
    for table in ("dygo_jobs", "dygo_stats_deltas", "dygo_workers"):
        options = conn.execute("SELECT reloptions FROM pg_class WHERE relname = %s", (table,)).fetchone()[0] or []
        names = [option.split("=", 1)[0] for option in options]
        if names:
            conn.execute(f"ALTER TABLE {table} RESET ({', '.join(names)})")
    set_naptime(conn, "1min")


def set_naptime(conn: psycopg.Connection, value: str | None) -> None:
    """ALTER SYSTEM on the server (the embedded one: dygo sets 10s there); None puts dygo's value back."""
    conn.execute(f"ALTER SYSTEM SET autovacuum_naptime = '{value or '10s'}'")
    conn.execute("SELECT pg_reload_conf()")
    time.sleep(0.5)


def table_options(conn: psycopg.Connection) -> str:
    row = conn.execute("SELECT reloptions FROM pg_class WHERE relname = 'dygo_jobs'").fetchone()
    return ", ".join(row[0]) if row and row[0] else "PostgreSQL defaults"


def push_round(
    conn: psycopg.Connection, worker: WorkerProcess, number: int, jobs: int, timeout: float, previous: list[Round]
) -> Round:
    before = conn.execute("SELECT coalesce(max(id), 0) FROM dygo_jobs").fetchone()[0]
    meter = CpuMeter(worker.pid, parent_pid(conn.info.backend_pid)).start()
    wal_before = conn.execute("SELECT wal_bytes, wal_fpi FROM pg_stat_wal").fetchone()
    enqueue_started = time.perf_counter()
    for first in range(0, jobs, BATCH):
        enqueue_many(conn, [JobRequest(KIND, {"n": first + i}) for i in range(min(BATCH, jobs - first))])
    enqueue_seconds = time.perf_counter() - enqueue_started

    expected = (previous[-1].jobs_total if previous else 0) + jobs

    def drained() -> bool:
        worker.check_alive()
        # From the stats rollups, a few small rows: polling the jobs table itself would read the very
        # dead index entries and heap pages this benchmark is watching pile up, and slow the worker.
        return succeeded_so_far(conn) >= expected

    wait_until(drained, timeout, f"round {number} to drain", interval=0.2)
    meter.stop()
    wal_after = conn.execute("SELECT wal_bytes, wal_fpi FROM pg_stat_wal").fetchone()
    # Retention keeps succeeded rows `completed_retention` after they finish: these are all still there.
    row = conn.execute(
        "SELECT count(*), extract(epoch FROM max(finished_at) - min(started_at)) FROM dygo_jobs "
        "WHERE id > %s AND state = 'succeeded'",
        (before,),
    ).fetchone()
    if row[0] != jobs:
        raise RuntimeError(f"round {number}: {row[0]} of {jobs} jobs succeeded")
    seconds = float(row[1])
    conn.execute("SELECT pg_stat_force_next_flush()")
    time.sleep(0.6)  # cumulative statistics reach the shared view at most every ~1 s
    stats = conn.execute("""
        SELECT n_live_tup, n_dead_tup, autovacuum_count, autoanalyze_count, total_autovacuum_time / 1000
        FROM pg_stat_user_tables WHERE relname = 'dygo_jobs'""").fetchone()
    vacuumed = float(stats[4]) - (previous[-1].autovacuum_seconds if previous else 0.0)
    index_mb = {
        name: mb(size)
        for name, size in conn.execute("""
        SELECT indexrelname, pg_relation_size(indexrelid) FROM pg_stat_user_indexes
        WHERE relname = 'dygo_jobs' ORDER BY indexrelname""")
    }
    heap = conn.execute("SELECT pg_relation_size('dygo_jobs')").fetchone()[0]
    deltas = conn.execute("SELECT pg_total_relation_size('dygo_stats_deltas')").fetchone()[0]
    return Round(
        number=number,
        jobs_total=expected,
        rate=round(jobs / seconds, 1),
        enqueue_rate=round(jobs / enqueue_seconds, 1),
        cpu_us_per_job=round((meter.worker + meter.postgres) / jobs * 1e6, 1),
        heap_mb=mb(heap),
        index_mb=index_mb,
        live_rows=stats[0],
        dead_rows=stats[1],
        autovacuums=stats[2],
        autoanalyzes=stats[3],
        autovacuum_seconds=round(float(stats[4]), 3),
        vacuum_us_per_job=round(vacuumed / jobs * 1e6, 1),
        deltas_mb=mb(deltas),
        wal_bytes_per_job=round(float(wal_after[0] - wal_before[0]) / jobs, 1),
        full_page_images_per_job=round((wal_after[1] - wal_before[1]) / jobs, 3),
    )


def succeeded_so_far(conn: psycopg.Connection) -> int:
    row = conn.execute(
        "SELECT (SELECT coalesce(sum(succeeded), 0) FROM dygo_daily_stats) "
        "+ (SELECT coalesce(sum(succeeded), 0) FROM dygo_stats_deltas)"
    ).fetchone()
    return int(row[0])


def mb(size: int) -> float:
    return round(size / 1024 / 1024, 1)


def short(index: str) -> str:
    return index.removeprefix("dygo_jobs_")


def line(r: Round) -> str:
    indexes = ", ".join(f"{short(name)} {size}" for name, size in r.index_mb.items())
    return (
        f"round {r.number}: {r.jobs_total:,} jobs, {r.rate:,.0f}/s, {r.cpu_us_per_job:.0f} µs CPU/job; "
        f"WAL {r.wal_bytes_per_job:.0f} B/job ({r.full_page_images_per_job:.2f} FPI); "
        f"heap {r.heap_mb} MB; indexes MB: {indexes}; "
        f"live {r.live_rows:,}, dead {r.dead_rows:,}; autovacuums {r.autovacuums}"
    )


def table(rounds: list[Round]) -> str:
    names = list(rounds[0].index_mb)
    header = [
        "round",
        "jobs so far",
        "processed/s",
        "CPU µs/job",
        "vacuum µs/job",
        "heap MB",
        *(f"{short(n)} MB" for n in names),
        "live rows",
        "dead rows",
        "autovacuums",
        "deltas MB",
    ]
    body = [
        [
            str(r.number),
            f"{r.jobs_total:,}",
            f"{r.rate:,.0f}",
            f"{r.cpu_us_per_job:.0f}",
            f"{r.vacuum_us_per_job:.0f}",
            f"{r.heap_mb}",
            *(f"{r.index_mb.get(n, 0)}" for n in names),
            f"{r.live_rows:,}",
            f"{r.dead_rows:,}",
            str(r.autovacuums),
            f"{r.deltas_mb}",
        ]
        for r in rounds
    ]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in body]
    return "\n".join(lines)


def verdict(rounds: list[Round]) -> str:
    span = min(3, len(rounds) // 2) or 1
    start = statistics.median(r.rate for r in rounds[:span])
    end = statistics.median(r.rate for r in rounds[-span:])
    share = end / start if start else 0.0
    outcome = "PASS" if share >= THRESHOLD else "FAIL"
    # Autovacuum runs in processes the CPU meter can miss (started and gone within a round): its
    # time on dygo_jobs, averaged over the rounds (a vacuum lands in one round of several), is added.
    # An upper bound: wall clock, not CPU.
    cpu_start = statistics.median(r.cpu_us_per_job for r in rounds[:span]) + statistics.mean(
        r.vacuum_us_per_job for r in rounds[:span]
    )
    cpu_end = statistics.median(r.cpu_us_per_job for r in rounds[-span:]) + statistics.mean(
        r.vacuum_us_per_job for r in rounds[-span:]
    )
    capacity = cpu_start / cpu_end if cpu_end else 0.0
    return (
        f"{outcome}: end {end:,.0f}/s is {share:.0%} of start {start:,.0f}/s "
        f"(median of the first and last {span} rounds; must be >= {THRESHOLD:.0%})\n"
        f"CPU per job (worker + PostgreSQL + autovacuum, the machine's other load left out): "
        f"start {cpu_start:.0f} µs, "
        f"end {cpu_end:.0f} µs: the end's capacity is {capacity:.0%} of the start's"
    )


if __name__ == "__main__":
    sys.exit(main())
