"""The bare reference of `bench/fleet.py --reference`: the least a Python worker process can do per job.

    .venv/bin/python bench/bare_worker.py URL [--concurrency 4] [--batch 32]

One asyncio process, one connection, no dygo code: it claims up to --batch pending jobs of queue
`default` from dygo's own table (dygo's order, `FOR UPDATE SKIP LOCKED`, the same columns a claim
sets), runs them --concurrency at a time (`bench.noop` returns, `bench.sleep` sleeps its `ms`), then
settles the batch as succeeded in the same round trip as the next claim (one pipeline, two
transactions). No leases, no heartbeat, no retries, no log, no metrics, and no commit waits for the WAL
flush (dygo's claims do not either; its settles do): everything dygo does beyond this is what dygo costs.
A fleet of these on the same server is the ceiling one PostgreSQL and this machine's cores allow a
fleet of Python workers, so the fleet's ratio (64 workers against the best size) can be read against
the same ratio here, measured in the same run.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal

import psycopg

CLAIM = """
UPDATE dygo_jobs SET state = 'active', attempt = attempt + 1, started_at = now()
WHERE id = ANY(ARRAY(
    SELECT id FROM dygo_jobs WHERE state = 'pending' AND queue = 'default' AND run_at <= now()
    ORDER BY priority DESC, run_at, id LIMIT %(batch)s FOR UPDATE SKIP LOCKED))
RETURNING id, kind, args"""
SETTLE = "UPDATE dygo_jobs SET state = 'succeeded', finished_at = now() WHERE id = ANY(%(ids)s::bigint[])"
# dygo's claim session's settings (store/claim.py CLAIM_SESSION), for the whole session here.
SESSION = (
    "SELECT set_config('enable_seqscan', 'off', false), set_config('synchronous_commit', 'off', false), "
    "set_config('plan_cache_mode', 'force_generic_plan', false)"
)
IDLE_POLL = 0.05  # seconds between claims that found nothing (a bare worker has no LISTEN)


async def run_job(kind: str, args: dict) -> None:
    if kind == "bench.sleep":
        await asyncio.sleep(args.get("ms", 10) / 1000)


async def run_batch(jobs: list[tuple[int, str, dict]], concurrency: int) -> list[int]:
    for start in range(0, len(jobs), concurrency):
        chunk = jobs[start : start + concurrency]
        if len(chunk) == 1:
            await run_job(chunk[0][1], chunk[0][2])
        else:
            await asyncio.gather(*(run_job(kind, args) for _, kind, args in chunk))
    return [job_id for job_id, _, _ in jobs]


async def work(url: str, concurrency: int, batch: int, stopping: asyncio.Event) -> None:
    name = f"dygo-worker-bare {os.getpid()}"  # counted by fleet.py's sampler like a worker's connections
    async with await psycopg.AsyncConnection.connect(url, autocommit=True, application_name=name) as conn:
        await conn.execute(SESSION)
        print("ready", flush=True)
        done: list[int] = []
        while not stopping.is_set():
            async with conn.pipeline() as pipeline:
                if done:
                    await conn.execute(SETTLE, {"ids": done})
                    await pipeline.sync()  # its own transaction: its locks go before the claim runs
                cursor = await conn.execute(CLAIM, {"batch": batch})
            jobs = await cursor.fetchall()
            if not jobs:
                done = []
                await asyncio.sleep(IDLE_POLL)
                continue
            done = await run_batch(jobs, concurrency)
        if done:
            await conn.execute(SETTLE, {"ids": done})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("url")
    parser.add_argument("--concurrency", type=int, default=4, help="jobs run at once")
    parser.add_argument("--batch", type=int, default=32, help="jobs per claim (dygo's fleet claims ~35)")
    args = parser.parse_args()

    async def start() -> None:
        stopping = asyncio.Event()
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stopping.set)
        await work(args.url, args.concurrency, args.batch, stopping)

    asyncio.run(start())


if __name__ == "__main__":
    main()
