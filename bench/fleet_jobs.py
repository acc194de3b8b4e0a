"""The two job kinds of bench/fleet.py (loaded by its workers through `jobs: [fleet_jobs]`)."""

import asyncio

from store import JobContext, job


@job("fleet.noop")
async def noop(ctx: JobContext, args: dict) -> None:
    return None


@job("fleet.sleep")
async def sleep(ctx: JobContext, args: dict) -> None:
    await asyncio.sleep(args.get("ms", 10) / 1000)
