"""Claim latency and enqueue rate as the job table grows (`make bench-table-size`).

For each size (rows in dygo_jobs: 10k, 1M and 10M by default), a fresh database (`bench_size_<rows>`)
of the project's embedded server, migrated, is filled with INSERT ... SELECT generate_series: `--backlog`
of the rows (at least the jobs the claims take) pending and due in queue `default`, the rest succeeded
history (kept for completed_retention); then VACUUM ANALYZE, as autovacuum would have by then.

Then `--rounds` rounds, each measuring every size in turn (so the load of a shared machine falls on all
sizes alike):

* claim: `--claims` / rounds claims of `--batch` jobs each, one after the other on one connection
  through store.claim.claim_jobs (the worker's claim), each settled as succeeded before the
  next (store.leases.settle); the claim's round trip is timed, the settle is not;
* enqueue: store.enqueue one job at a time for `--enqueue-seconds` / rounds: jobs/s.

It prints one line per size (claim p50/p99 over all its claims, enqueue/s over all its rounds) and each
figure's ratio to the first size's. Target (issue "Fleet scale", item 5): claim p50/p99 and enqueue/s
within 1.5x of the 10k figures at 1M and 10M rows.

    .venv/bin/python bench/table_size.py                         # 10k, 1M, 10M rows (10M: minutes)
    .venv/bin/python bench/table_size.py --sizes 10000,1000000   # a shorter look
"""

from __future__ import annotations

import argparse
import asyncio
import subprocess
import sys
import time
from pathlib import Path

import psycopg
from psycopg.conninfo import make_conninfo

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_jobs  # noqa: E402, F401  (registers the kind this script enqueues)
from common import ROOT, log, percentile  # noqa: E402
from dygo.store.claim import claim_jobs  # noqa: E402
from dygo.store.enqueue import enqueue  # noqa: E402
from dygo.store.leases import Succeeded, settle  # noqa: E402
from dygo.store.migrate import migrate  # noqa: E402

DATABASE = "bench_size_{rows}"
TARGET = 1.5  # at most this multiple of the first size's figure (of its time per job for enqueue/s)
FILL_CHUNK = 1_000_000  # rows per INSERT, so no statement holds millions of rows in its trigger's transition table

# Pending rows first (a backlog due now, in id order), then succeeded history: one statement per chunk.
FILL = """
INSERT INTO dygo_jobs (kind, queue, args, state, run_at, enqueued_at, started_at, finished_at, attempt)
SELECT 'bench.noop', 'default', '{}', CASE WHEN n <= %(pending)s THEN 'pending' ELSE 'succeeded' END,
       now() - interval '1 hour', now() - interval '1 hour',
       CASE WHEN n > %(pending)s THEN now() - interval '1 hour' END,
       CASE WHEN n > %(pending)s THEN now() - interval '1 hour' END,
       CASE WHEN n > %(pending)s THEN 1 ELSE 0 END
FROM generate_series(%(first)s::bigint, %(last)s::bigint) AS n"""


def main() -> int:
    args = parse_arguments()
    server = subprocess.run(
        [sys.executable, "-m", "dygo", "db", "url"], check=True, capture_output=True, text=True, cwd=ROOT
    ).stdout.strip()
    urls = {}
    for size in args.sizes:
        urls[size] = fresh_database(server, size)
        fill(urls[size], size, min(size, max(int(size * args.backlog), args.claims * args.batch)))
    claim_ms: dict[int, list[float]] = {size: [] for size in args.sizes}
    enqueued: dict[int, list[tuple[int, float]]] = {size: [] for size in args.sizes}
    for number in range(1, args.rounds + 1):
        for size in args.sizes:
            claim_ms[size] += asyncio.run(claims(urls[size], args.claims // args.rounds, args.batch))
            enqueued[size].append(enqueue_count(urls[size], args.enqueue_seconds / args.rounds))
        log(f"round {number} of {args.rounds} done")
    results = []
    for size in args.sizes:
        times = sorted(claim_ms[size])
        rate = sum(n for n, _ in enqueued[size]) / sum(t for _, t in enqueued[size])
        results.append((size, percentile(times, 50), percentile(times, 99), rate))
    with psycopg.connect(server, autocommit=True) as conn:
        for size in args.sizes:
            conn.execute(f"DROP DATABASE IF EXISTS {DATABASE.format(rows=size)} WITH (FORCE)")
    report(results, args)
    return 0


def parse_arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--sizes",
        type=lambda text: [int(n) for n in text.split(",")],
        default=[10_000, 1_000_000, 10_000_000],
        help="rows in dygo_jobs, comma-separated",
    )
    parser.add_argument("--backlog", type=float, default=0.1, help="share of the rows pending (the rest succeeded)")
    parser.add_argument("--claims", type=int, default=1200, help="claims timed per size")
    parser.add_argument("--batch", type=int, default=5, help="jobs per claim")
    parser.add_argument("--enqueue-seconds", type=float, default=15.0, help="per size, over all rounds")
    parser.add_argument("--rounds", type=int, default=3)
    return parser.parse_args()


def fresh_database(server: str, size: int) -> str:
    name = DATABASE.format(rows=size)
    with psycopg.connect(server, autocommit=True) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
        conn.execute(f"CREATE DATABASE {name}")
    url = make_conninfo(server, dbname=name)
    with psycopg.connect(url) as conn:
        migrate(conn)
    return url


def fill(url: str, size: int, pending: int) -> None:
    started = time.monotonic()
    with psycopg.connect(url, autocommit=True) as conn:
        for first in range(1, size + 1, FILL_CHUNK):
            conn.execute(FILL, {"first": first, "last": min(first + FILL_CHUNK - 1, size), "pending": pending})
        conn.execute("VACUUM ANALYZE dygo_jobs")
        heap = conn.execute("SELECT pg_size_pretty(pg_table_size('dygo_jobs'))").fetchone()[0]
    log(f"{size:,} rows ({pending:,} pending), {heap}, filled and vacuumed in {time.monotonic() - started:.0f} s")


async def claims(url: str, count: int, batch: int) -> list[float]:
    times: list[float] = []
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        for _ in range(count):
            started = time.perf_counter()
            jobs = (await claim_jobs(conn, {"default": batch}, "bench", 60)).jobs
            times.append((time.perf_counter() - started) * 1000)
            assert len(jobs) == batch, "the backlog ran out"
            await settle(conn, [Succeeded(job, None) for job in jobs])
    return times


def enqueue_count(url: str, seconds: float) -> tuple[int, float]:
    """(jobs enqueued one at a time, seconds taken)."""
    with psycopg.connect(url, autocommit=True) as conn:
        count, started = 0, time.perf_counter()
        while time.perf_counter() - started < seconds:
            enqueue(conn, "bench.noop", {})
            count += 1
        return count, time.perf_counter() - started


def report(results: list[tuple[int, float, float, float]], args: argparse.Namespace) -> None:
    print(
        f"claims of {args.batch} jobs ({args.claims} per size), enqueue {args.enqueue_seconds:g} s per size, "
        f"{args.rounds} rounds"
    )
    print("| rows | claim p50 ms | p99 ms | enqueue one/s | p50 × | p99 × | enqueue time × |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    _, base50, base99, base_rate = results[0]
    worst = 0.0
    for size, p50, p99, rate in results:
        ratios = (p50 / base50, p99 / base99, base_rate / rate)
        worst = max(worst, *ratios)
        print(
            f"| {size:,} | {p50:.2f} | {p99:.2f} | {rate:,.0f} | {ratios[0]:.2f} | {ratios[1]:.2f} | {ratios[2]:.2f} |"
        )
    print(f"worst ratio to the first size: {worst:.2f} ({'ok' if worst <= TARGET else 'OVER'}; target <= {TARGET})")


if __name__ == "__main__":
    raise SystemExit(main())
