"""A handler's timeout: what asyncio.timeout costs per job against a hand-written copy of its cancel accounting.

    .venv/bin/python bench/timeouts.py                       # 1, 200 and 1,000 jobs in flight, 7 rounds
    .venv/bin/python bench/timeouts.py --in-flight 4 200 1000 --jobs 100000 --rounds 9

No database, no worker: the timeout alone, in the shape the executor gives it. Each "job" is a coroutine that
suspends once (as a handler awaiting anything does) and returns, run under a 300-second timeout; `--in-flight`
of them run at once, so that many timers are armed together, as in a worker at that concurrency. Per job it
prints this process's CPU time over the same jobs run without a timeout (the cost of the timeout alone), median
over the rounds, for:

* `asyncio.timeout`: `async with asyncio.timeout(seconds): await call`;
* `timer per call`: worker/deadlines.py `within` (the services' waits): asyncio.timeout's accounting, one
  loop timer per call;
* `timer per length`: worker/deadlines.py `Deadlines.within` (the handlers' timeouts): the same accounting,
  one loop timer per timeout length for all the running calls of that length.

`--in-flight 1` is one call at a time: the enter and exit with a single timer armed. Compare the figures with
the worker's CPU per job (bench/README.md), measured the same day on the same machine.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

TIMEOUT = 300.0  # the default handler timeout (config default_timeout 5m)


async def handler() -> None:
    await asyncio.sleep(0)  # suspends once, as a handler awaiting anything does


async def bare(call: Coroutine[Any, Any, Any], seconds: float) -> Any:
    return await call


async def with_asyncio_timeout(call: Coroutine[Any, Any, Any], seconds: float) -> Any:
    async with asyncio.timeout(seconds):
        return await call


Timed = Callable[[Coroutine[Any, Any, Any], float], Awaitable[Any]]


def variants() -> dict[str, Callable[[], Timed]]:
    from dygo.worker.deadlines import Deadlines, within

    return {
        "none": lambda: bare,
        "asyncio.timeout": lambda: with_asyncio_timeout,
        "timer per call": lambda: within,
        "timer per length": lambda: Deadlines().within,
    }


async def run_jobs(timed: Timed, jobs: int, in_flight: int) -> float:
    """CPU seconds of this process to run `jobs` jobs, `in_flight` at once, each under `timed` (CPU time, not
    wall time: other processes on the machine do not count)."""
    each, left = divmod(jobs, in_flight)

    async def lane(count: int) -> None:
        for _ in range(count):
            await timed(handler(), TIMEOUT)

    started = time.process_time()
    await asyncio.gather(*(lane(each + (i < left)) for i in range(in_flight)))
    return time.process_time() - started


def measure(in_flight: int, jobs: int, rounds: int) -> dict[str, float]:
    """Median µs per job of each variant, the variants taking turns round after round."""
    seconds: dict[str, list[float]] = {name: [] for name in variants()}
    for _ in range(rounds):
        for name, make in variants().items():
            seconds[name].append(asyncio.run(run_jobs(make(), jobs, in_flight)))
    return {name: statistics.median(values) / jobs * 1e6 for name, values in seconds.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--in-flight", type=int, nargs="+", default=[1, 200, 1000], help="jobs running at once")
    parser.add_argument("--jobs", type=int, default=60_000, help="jobs per round")
    parser.add_argument("--rounds", type=int, default=7, help="rounds per variant (median)")
    args = parser.parse_args()
    print(f"Python {sys.version.split()[0]}, {args.jobs:,} jobs a round, median of {args.rounds} rounds")
    names = [name for name in variants() if name != "none"]
    print(f"{'in flight':>9}  {'no timeout':>10}  " + "  ".join(f"{name:>16}" for name in names) + "  (µs per job)")
    for in_flight in args.in_flight:
        us = measure(in_flight, args.jobs, args.rounds)
        base = us["none"]
        print(f"{in_flight:>9}  {base:>10.2f}  " + "  ".join(f"{us[name] - base:>+16.2f}" for name in names))


if __name__ == "__main__":
    main()
