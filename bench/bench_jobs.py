"""Job kinds for the benchmarks that start their own workers (`jobs: [bench_jobs]`, bench/ on PYTHONPATH)."""

import asyncio
import os
import time

from dygo import JobContext, Snooze, job


@job("bench.noop")
async def noop(ctx: JobContext, args: dict) -> None:
    return None


@job("bench.sleep")
async def sleep(ctx: JobContext, args: dict) -> None:
    await asyncio.sleep(args.get("ms", 10) / 1000)


async def _nothing() -> None:
    return None


@job("bench.steps")
async def steps(ctx: JobContext, args: dict) -> None:
    """`steps` durable steps that do nothing (bench/steps.py): what a step costs on its own."""
    for _ in range(args.get("steps", 0)):
        await ctx.step("step", _nothing)


@job("bench.sleep_until")
async def sleep_until(ctx: JobContext, args: dict) -> None:
    """A durable sleep until the epoch second `until` (bench/sleep_wake.py), then nothing."""
    await ctx.sleep("nap", max(args["until"] - time.time(), 0.0))


@job("bench.snooze_until")
async def snooze_until(ctx: JobContext, args: dict) -> None:
    """A plain snooze until the epoch second `until`, then nothing (bench/sleep_wake.py's reference for a
    sleep: the same two runs and settles, no step read or write)."""
    left = args["until"] - time.time()
    if left > 0:
        raise Snooze(left)


@job("bench.wait_event")
async def wait_event(ctx: JobContext, args: dict) -> float:
    """Waits for the event `key` (bench/event_wake.py); returns the epoch second its run went on after the wait."""
    await ctx.wait_for_event("e", key=args["key"])
    return time.time()


_stamps: list = []  # the open file of this process's pickup stamps (bench/held_snapshot.py), once opened


@job("bench.stamped")
async def stamped(ctx: JobContext, args: dict) -> None:
    """Writes the producer's time before its enqueue (`t`) and the time this handler began, one line to the
    file in $DYGO_BENCH_STAMPS (bench/held_snapshot.py), then sleeps `ms` milliseconds."""
    began = time.time()
    if not _stamps:
        _stamps.append(open(os.environ["DYGO_BENCH_STAMPS"], "a", buffering=1))  # noqa: SIM115 (kept open)
    _stamps[0].write(f"{args['t']!r} {began!r}\n")
    await asyncio.sleep(args.get("ms", 1) / 1000)
