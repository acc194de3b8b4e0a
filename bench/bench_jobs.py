"""Job kinds for the benchmarks that start their own workers (`jobs: [bench_jobs]`, bench/ on PYTHONPATH)."""

import asyncio

from dygo import JobContext, job


@job("bench.noop")
async def noop(ctx: JobContext, args: dict) -> None:
    return None


@job("bench.sleep")
async def sleep(ctx: JobContext, args: dict) -> None:
    await asyncio.sleep(args.get("ms", 10) / 1000)
