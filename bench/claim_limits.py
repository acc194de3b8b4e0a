"""What a cluster-wide limit that is never reached costs one claim: the worker's claim (store/claim.py
`claim_jobs`, on a claim session, prepared as the worker's is) with no limit, under a `concurrency_limit` and
under a `rate_limit` its queue never reaches.

    .venv/bin/python bench/claim_limits.py                  # claims of 4 and of 100, 300 of each variant
    .venv/bin/python bench/claim_limits.py --batch 4 --claims 1000

On a fresh database (`bench_claim_limits`) of the embedded server, `--rows` pending jobs wait in one queue and
`--active` of its jobs are active (another worker's), as a busy queue's are. Each claim takes `--batch` jobs;
between claims (untimed) the claimed jobs go back to pending and the limits are set for the next variant. The
variants take turns, one claim each, so a burst of load elsewhere on the machine hits them all alike. Prints
the median and p95 round trip of each variant and its ratio to no limit.
Run from the repository root so `dygo db url` finds the project's embedded server (.dygo/pg).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import subprocess
import sys
import time

import psycopg
from common import ROOT, log
from dygo.store import claim, limits
from dygo.store.migrate import migrate
from dygo.store.registry import Registry
from psycopg.conninfo import make_conninfo

DATABASE = "bench_claim_limits"
LIMITS = {
    "no limit": None,
    "concurrency": "INSERT INTO dygo_limits (scope, name, concurrency_limit) VALUES ('queue', 'default', 10000)",
    "rate": "INSERT INTO dygo_limits (scope, name, rate_count, rate_window) VALUES ('queue', 'default', 1000000, 1)",
}


async def measure(url: str, batch: int, claims: int) -> dict[str, list[float]]:
    timings: dict[str, list[float]] = {name: [] for name in LIMITS}
    conn = await psycopg.AsyncConnection.connect(url, autocommit=True)
    admin = await psycopg.AsyncConnection.connect(url, autocommit=True)
    await claim.claim_session(conn)
    jobs = Registry()
    for _ in range(claims):
        for name, insert in LIMITS.items():
            await admin.execute("DELETE FROM dygo_limits")
            if insert:
                await admin.execute(insert)
            limits.forget_cache()
            await limits.current(conn)  # read outside the timing, as the worker's cache has it
            start = time.perf_counter()
            taken = await claim.claim_jobs(conn, {"default": batch}, "bench", 30.0, jobs)
            timings[name].append((time.perf_counter() - start) * 1000)
            assert len(taken.jobs) == batch, (name, len(taken.jobs))
            await admin.execute(
                "UPDATE dygo_jobs SET state = 'pending', lease_owner = NULL, attempt = 0 WHERE lease_owner = 'bench'"
            )
            await admin.execute("DELETE FROM dygo_limit_pace")
    await conn.close()
    await admin.close()
    return timings


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=20_000, help="pending jobs in the queue")
    parser.add_argument("--active", type=int, default=50, help="active jobs of the queue (another worker's)")
    parser.add_argument("--batch", type=int, action="append", help="jobs one claim takes (default: 4 and 100)")
    parser.add_argument("--claims", type=int, default=300, help="claims of each variant")
    args = parser.parse_args()
    server = subprocess.run(
        [str(ROOT / ".venv" / "bin" / "dygo"), "db", "url"], cwd=ROOT, check=True, capture_output=True, text=True
    ).stdout.strip()
    with psycopg.connect(server, autocommit=True) as admin:
        admin.execute(f"DROP DATABASE IF EXISTS {DATABASE}")
        admin.execute(f"CREATE DATABASE {DATABASE}")
    url = make_conninfo(server, dbname=DATABASE)
    with psycopg.connect(url, autocommit=True) as conn:
        migrate(conn)
        conn.execute(
            "INSERT INTO dygo_jobs (kind, queue) SELECT 'bench.noop', 'default' FROM generate_series(1, %s)",
            (args.rows,),
        )
        conn.execute(
            "UPDATE dygo_jobs SET state = 'active', lease_owner = 'other', lease_token = gen_random_uuid(), "
            "lease_deadline = now() + interval '1 hour' WHERE id <= %s",
            (args.active,),
        )
        conn.execute("VACUUM ANALYZE dygo_jobs")
    for batch in args.batch or [4, 100]:
        timings = asyncio.run(measure(url, batch, args.claims))
        log(f"{args.rows} pending, {args.active} active; claims of {batch}, {args.claims} of each variant, in turns")
        base = statistics.median(timings["no limit"])
        print(f"{'limit':<12} {'batch':>5} {'median ms':>10} {'p95 ms':>8} {'x no limit':>11}")
        for name, samples in timings.items():
            samples.sort()
            median = statistics.median(samples)
            p95 = samples[int(len(samples) * 0.95) - 1]
            print(f"{name:<12} {batch:>5} {median:>10.3f} {p95:>8.3f} {median / base:>11.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
