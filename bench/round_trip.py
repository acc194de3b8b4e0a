"""The cost of one database round trip from each client stack a worker here runs on (issue 12, item 7).

    .venv/bin/python bench/round_trip.py                # psycopg 3 async on asyncio: what dygo runs on
    .venv-bench/bin/python bench/round_trip.py --all    # and asyncpg on asyncio and on uvloop: what pgqueuer runs on

At concurrency 4 a no-op job's worker is bound by round trips (a claim of up to 4 jobs, a settle): this
prints, per stack, the wall time and the client process's CPU time (user + system) of one prepared
`SELECT 1` round trip on an idle connection to the embedded server (`dygo db url`, or `--url`), median of
`--rounds` rounds of `--count` round trips. It is the floor under each system's claim and settle.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import subprocess
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


async def psycopg_round_trips(url: str, count: int) -> tuple[float, float]:
    import psycopg

    conn = await psycopg.AsyncConnection.connect(url, autocommit=True, prepare_threshold=0)
    try:
        return await timed(lambda: conn.execute("SELECT 1"), count)
    finally:
        await conn.close()


async def asyncpg_round_trips(url: str, count: int) -> tuple[float, float]:
    import asyncpg

    conn = await asyncpg.connect(url)
    try:
        statement = await conn.prepare("SELECT 1")
        return await timed(statement.fetch, count)
    finally:
        await conn.close()


async def timed(round_trip: Callable[[], Awaitable[object]], count: int) -> tuple[float, float]:
    """(wall, CPU) seconds per round trip."""
    wall, cpu = time.perf_counter(), time.process_time()
    for _ in range(count):
        await round_trip()
    return (time.perf_counter() - wall) / count, (time.process_time() - cpu) / count


def measure(name: str, run: Callable[[], tuple[float, float]], rounds: int) -> None:
    results = [run() for _ in range(rounds)]
    wall = statistics.median(r[0] for r in results) * 1e6
    cpu = statistics.median(r[1] for r in results) * 1e6
    print(f"{name:28} {wall:6.0f} us wall  {cpu:6.0f} us client CPU per round trip")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", help="default: the embedded server's (`dygo db url`)")
    parser.add_argument("--count", type=int, default=3000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--all", action="store_true", help="asyncpg too, on asyncio and on uvloop (.venv-bench)")
    args = parser.parse_args()
    url = args.url or subprocess.check_output([str(ROOT / ".venv/bin/dygo"), "db", "url"], text=True).strip()
    measure("psycopg 3 async, asyncio", lambda: asyncio.run(psycopg_round_trips(url, args.count)), args.rounds)
    if args.all:
        import uvloop

        measure("asyncpg, asyncio", lambda: asyncio.run(asyncpg_round_trips(url, args.count)), args.rounds)
        measure("asyncpg, uvloop", lambda: uvloop.run(asyncpg_round_trips(url, args.count)), args.rounds)
        measure("psycopg 3 async, uvloop", lambda: uvloop.run(psycopg_round_trips(url, args.count)), args.rounds)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
