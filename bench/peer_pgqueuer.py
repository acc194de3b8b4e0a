"""pgqueuer's side of the benchmark (run by run.py with `.venv-bench`; prints one JSON Result line).

    .venv-bench/bin/python bench/peer_pgqueuer.py --url postgresql://postgres@/bench_pgqueuer?host=...

Set up as pgqueuer's own documentation and benchmark (tools/benchmark.py) do: the asyncpg driver,
`Queries.enqueue` with lists for batches, and a worker subprocess running what `pgq run
peer_pgqueuer:create_worker --batch-size N` runs: `pgqueuer.run(factory, batch_size=N)` on uvloop.
(It is started as `peer_pgqueuer.py --worker` because `pgq run` 1.6.0 crashes with typer 0.29 on its
--log-level default: "'str' object has no attribute 'name'".) Tables are `durable` (pgqueuer's
default): logged, as dygo's are.
Its timestamps are in `pgqueuer_log` (one row per status: queued, picked, successful), whose
`created` is `now()` of the writing transaction, like dygo's columns.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from importlib.metadata import version
from pathlib import Path

import asyncpg
import pgqueuer
import uvloop
from common import (
    BENCH_DIR,
    OTHER_CLIENTS,
    CpuMeter,
    Plan,
    ProcessingRound,
    Result,
    WorkerProcess,
    add_plan_arguments,
    emit,
    enqueue_rates,
    log,
    median_round,
    parent_pid,
    plan_from,
    rate,
    refuse_other_clients,
)
from pgqueuer import AsyncpgDriver, PgQueuer, Queries
from pgqueuer.models import Job

ENTRYPOINT = "noop"


# --- the worker (the subprocess runs this factory) --------------------------------------------------------


@asynccontextmanager
async def create_worker() -> AsyncIterator[PgQueuer]:
    connection = await asyncpg.connect(os.environ["BENCH_URL"])
    pgq = PgQueuer(AsyncpgDriver(connection))

    @pgq.entrypoint(ENTRYPOINT)
    async def noop(job: Job) -> None:
        """Does nothing, like dygo's example.noop."""

    try:
        yield pgq
    finally:
        await connection.close()


# --- the measurements -----------------------------------------------------------------------------------


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_plan_arguments(parser)
    parser.add_argument(
        "--worker-batch-size",
        type=int,
        default=100,
        help="pgq run --batch-size (default 10; its tuning guide: raise it for short jobs)",
    )
    parser.add_argument(
        "--max-concurrent-tasks",
        type=int,
        default=200,
        help="pgq run --max-concurrent-tasks, at least 2 x batch size (0: unlimited, its default)",
    )
    parser.add_argument("--worker", action="store_true", help="be the worker process (BENCH_URL names the database)")
    args = parser.parse_args()
    if args.worker:
        uvloop.run(
            pgqueuer.run(
                create_worker, batch_size=args.worker_batch_size, max_concurrent_tasks=args.max_concurrent_tasks or None
            )
        )
        return 0
    result = asyncio.run(run(plan_from(args), args.worker_batch_size, args.max_concurrent_tasks))
    emit(result)
    return 0


async def run(plan: Plan, worker_batch_size: int, max_concurrent_tasks: int) -> Result:
    connection = await asyncpg.connect(plan.url)
    refuse_other_clients(await connection.fetch(OTHER_CLIENTS), "pgqueuer")
    client = Queries(AsyncpgDriver(connection))
    if not await client.has_table("pgqueuer"):
        await client.install()  # `pgq install`
        await client.optimize_autovacuum()  # `pgq autovac`, first item of its tuning checklist
    result = Result(
        system="pgqueuer",
        version=version("pgqueuer"),
        settings=f"pgq run --batch-size {worker_batch_size} --max-concurrent-tasks {max_concurrent_tasks} "
        f"(asyncpg, uvloop, durable tables, pgq autovac); Queries.enqueue lists of {plan.batch_size}",
    )
    result.enqueue_one, result.enqueue_one_rounds = await measure_enqueue_one(plan, client, connection)
    result.enqueue_batched, result.enqueue_batched_rounds = await measure_enqueue_batched(plan, client, connection)
    command = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--worker",
        "--url",
        plan.url,
        "--worker-batch-size",
        str(worker_batch_size),
        "--max-concurrent-tasks",
        str(max_concurrent_tasks),
    ]
    postmaster = await postmaster_pid(connection)
    with WorkerProcess(command, {"BENCH_URL": plan.url}, cwd=BENCH_DIR) as worker:
        await warm_up(plan, client, connection, worker)
        result.record_latency(await measure_latency(plan, client, connection, worker))
        await connection.execute("VACUUM ANALYZE pgqueuer, pgqueuer_log")
        for _ in range(plan.process_rounds):
            result.rounds.append(await measure_processing(plan, client, connection, worker, postmaster))
        result.processed = median_round(result.rounds)
    await connection.close()
    return result


async def truncate(connection: asyncpg.Connection) -> None:
    await connection.execute("TRUNCATE pgqueuer, pgqueuer_log, pgqueuer_statistics")


async def last_id(connection: asyncpg.Connection) -> int:
    return await connection.fetchval("SELECT coalesce(max(job_id), 0) FROM pgqueuer_log")


async def postmaster_pid(connection: asyncpg.Connection) -> int:
    return parent_pid(await connection.fetchval("SELECT pg_backend_pid()"))


async def measure_enqueue_one(plan: Plan, client: Queries, connection: asyncpg.Connection) -> tuple[float, list[float]]:
    seconds = []
    await truncate(connection)
    for _ in range(plan.enqueue_rounds):  # rows accumulate over the rounds, as in a live table
        started = time.perf_counter()
        for _ in range(plan.one_jobs):
            await client.enqueue(ENTRYPOINT, None)
        seconds.append(time.perf_counter() - started)
    await truncate(connection)
    return enqueue_rates("pgqueuer", "one at a time", plan.one_jobs, seconds)


async def enqueue_batch(client: Queries, count: int) -> None:
    await client.enqueue([ENTRYPOINT] * count, [None] * count, [0] * count)


async def measure_enqueue_batched(
    plan: Plan, client: Queries, connection: asyncpg.Connection
) -> tuple[float, list[float]]:
    seconds = []
    await truncate(connection)
    for _ in range(plan.enqueue_rounds):  # rows accumulate over the rounds, as in a live table
        started = time.perf_counter()
        for first in range(0, plan.batched_jobs, plan.batch_size):
            await enqueue_batch(client, min(plan.batch_size, plan.batched_jobs - first))
        seconds.append(time.perf_counter() - started)
    await truncate(connection)
    return enqueue_rates("pgqueuer", f"in batches of {plan.batch_size}", plan.batched_jobs, seconds)


async def wait_for_successes(
    connection: asyncpg.Connection, after_id: int, expected: int, worker: WorkerProcess, timeout: float
) -> None:
    deadline = time.monotonic() + timeout
    while True:
        worker.check_alive()
        done = await connection.fetchval(
            "SELECT count(*) FROM pgqueuer_log WHERE job_id > $1 AND status = 'successful'", after_id
        )
        if done >= expected:
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"pgqueuer: {done} of {expected} jobs done after {timeout:g}s")
        await asyncio.sleep(0.2)


async def warm_up(plan: Plan, client: Queries, connection: asyncpg.Connection, worker: WorkerProcess) -> None:
    before = await last_id(connection)
    await client.enqueue(ENTRYPOINT, None)
    await wait_for_successes(connection, before, 1, worker, plan.timeout)
    await asyncio.sleep(0.5)


async def measure_latency(
    plan: Plan, client: Queries, connection: asyncpg.Connection, worker: WorkerProcess
) -> list[float]:
    before = await last_id(connection)
    start = time.perf_counter()
    for i in range(plan.latency_jobs):
        delay = start + i * plan.latency_interval - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        await client.enqueue(ENTRYPOINT, None)
    await wait_for_successes(connection, before, plan.latency_jobs, worker, plan.timeout)
    rows = await connection.fetch(
        """SELECT extract(epoch FROM p.created - q.created) * 1000 AS ms
           FROM pgqueuer_log q JOIN pgqueuer_log p ON p.job_id = q.job_id AND p.status = 'picked'
           WHERE q.job_id > $1 AND q.status = 'queued'""",
        before,
    )
    return [float(r["ms"]) for r in rows]


async def measure_processing(
    plan: Plan, client: Queries, connection: asyncpg.Connection, worker: WorkerProcess, postmaster: int
) -> ProcessingRound:
    before = await last_id(connection)
    await enqueue_batch(client, plan.process_jobs)
    meter = CpuMeter(worker.pid, postmaster).start()
    await wait_for_successes(connection, before, plan.process_jobs, worker, plan.timeout)
    meter.stop()
    seconds = float(
        await connection.fetchval(
            """SELECT extract(epoch FROM max(created) FILTER (WHERE status = 'successful')
                                   - min(created) FILTER (WHERE status = 'picked'))
           FROM pgqueuer_log WHERE job_id > $1""",
            before,
        )
    )
    result = ProcessingRound(
        jobs=plan.process_jobs,
        seconds=round(seconds, 4),
        rate=rate(plan.process_jobs, seconds),
        worker_cpu_seconds=round(meter.worker, 2),
        postgres_cpu_seconds=round(meter.postgres, 2),
        machine_busy_seconds=round(meter.machine, 2),
    )
    log(
        f"pgqueuer: processed {plan.process_jobs} in {seconds:.3f}s ({result.rate:,.0f}/s); CPU: worker "
        f"{meter.worker:.2f}s, PostgreSQL {meter.postgres:.2f}s, machine {meter.machine:.2f}s"
    )
    return result


if __name__ == "__main__":
    sys.exit(main())
