"""What a worker's claim costs its own process, by claim size: the fixed cost of a round trip against the cost
of each job it brings.

    .venv/bin/python bench/claim_cost.py                 # claims of 1, 3, 30 and 100 jobs
    .venv/bin/python bench/claim_cost.py --sizes 1 100 --claims 500

On a fresh database (`bench_claim_cost` on the embedded server), no-op jobs are enqueued, then claimed
`--claims` times per size on a claim session with the store's own function (store/claim.py claim_jobs: what
the worker's producer sends), one claim after the other. It prints, per size, this process's CPU per claim
and per job (user and system: a round trip's system calls count), and the wall time per claim. Nothing runs
the jobs and nothing settles them: the claim alone, as a profile cannot separate it from the rest.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from pathlib import Path

import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parent))
from run import embedded_server_url, fresh_database  # noqa: E402

DATABASE = "bench_claim_cost"


async def measure(url: str, sizes: list[int], claims: int) -> None:
    from dygo.store.claim import claim_jobs, claim_session

    conn = await psycopg.AsyncConnection.connect(url, autocommit=True)
    await claim_session(conn)
    for _ in range(20):  # the statement prepared, its plan cached
        await claim_jobs(conn, {"default": 1}, "bench", 30.0)
    print(f"{'jobs per claim':>14}  {'CPU per claim (user + system)':>29}  {'CPU per job':>11}  {'wall per claim':>14}")
    for size in sizes:
        got, before, wall = 0, os.times(), time.perf_counter()
        for _ in range(claims):
            got += len((await claim_jobs(conn, {"default": size}, "bench", 30.0)).jobs)
        after, wall = os.times(), time.perf_counter() - wall
        if got < size * claims:
            raise SystemExit(f"only {got} jobs claimed of {size * claims}: enqueue more")
        user, system = after.user - before.user, after.system - before.system
        print(
            f"{size:>14}  {(user + system) / claims * 1e6:>8,.0f} us ({user / claims * 1e6:,.0f} + "
            f"{system / claims * 1e6:,.0f} us)  {(user + system) / got * 1e6:>8,.1f} us  "
            f"{wall / claims * 1e6:>11,.0f} us"
        )
    await conn.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=int, nargs="+", default=[1, 3, 30, 100])
    parser.add_argument("--claims", type=int, default=1000, help="claims per size")
    args = parser.parse_args()
    url = fresh_database(embedded_server_url(), DATABASE)
    import bench_jobs  # noqa: F401  (registers bench.noop)
    from dygo.store.enqueue import enqueue_many
    from dygo.store.migrate import migrate

    with psycopg.connect(url, autocommit=True) as conn:
        migrate(conn)
        with conn.transaction():
            enqueue_many(conn, [{"kind": "bench.noop", "args": {}} for _ in range(sum(args.sizes) * args.claims + 20)])
    asyncio.run(measure(url, args.sizes, args.claims))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
