"""procrastinate's side of the benchmark (run by run.py with `.venv-bench`; prints one JSON Result line).

    .venv-bench/bin/python bench/peer_procrastinate.py --url postgresql://postgres@/bench_procrastinate?host=...

Set up as its documentation describes: an `App` with the `PsycopgConnector`, `Task.defer_async`
one job at a time and `Task.batch_defer_async` for batches, the schema applied by
`SchemaManager.apply_schema_async` (what `procrastinate schema --apply` does), and the worker
started with its CLI: `procrastinate --app=peer_procrastinate.app worker --queues=default
--concurrency=N`. Its timestamps are in `procrastinate_events` (deferred, started, succeeded),
whose `at` is `now()` of the writing transaction, like dygo's columns.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from importlib.metadata import version
from pathlib import Path

import procrastinate
import psycopg
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

QUEUE = "default"

# The worker subprocess imports this module and finds the URL in BENCH_URL.
app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=os.environ.get("BENCH_URL", "")))


@app.task(name="noop", queue=QUEUE)
async def noop() -> None:
    """Does nothing, like dygo's example.noop."""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_plan_arguments(parser)
    parser.add_argument("--concurrency", type=int, default=200, help="procrastinate worker --concurrency")
    args = parser.parse_args()
    result = asyncio.run(run(plan_from(args), args.concurrency))
    emit(result)
    return 0


async def run(plan: Plan, concurrency: int) -> Result:
    result = Result(
        system="procrastinate",
        version=version("procrastinate"),
        settings=f"procrastinate worker --queues={QUEUE} --concurrency={concurrency}; "
        f"batch_defer_async batches of {plan.batch_size}",
    )
    async with await psycopg.AsyncConnection.connect(plan.url, autocommit=True) as check:  # before the app's pool
        refuse_other_clients(await (await check.execute(OTHER_CLIENTS)).fetchall(), "procrastinate")
    connector = procrastinate.PsycopgConnector(conninfo=plan.url)
    with app.replace_connector(connector):
        async with app.open_async(), await psycopg.AsyncConnection.connect(plan.url, autocommit=True) as conn:
            await measure(plan, concurrency, conn, result)
    return result


async def measure(plan: Plan, concurrency: int, conn: psycopg.AsyncConnection, result: Result) -> None:
    """The four measurements, against `app` (its connector now pointed at plan.url)."""
    if not await table_exists(conn):
        await app.schema_manager.apply_schema_async()
    result.enqueue_one, result.enqueue_one_rounds = await measure_enqueue_one(plan, noop, conn)
    result.enqueue_batched, result.enqueue_batched_rounds = await measure_enqueue_batched(plan, noop, conn)
    command = [
        str(Path(sys.executable).with_name("procrastinate")),
        "--app=peer_procrastinate.app",
        "worker",
        f"--queues={QUEUE}",
        f"--concurrency={concurrency}",
    ]
    env = {"BENCH_URL": plan.url, "PYTHONPATH": str(BENCH_DIR)}
    with WorkerProcess(command, env, cwd=BENCH_DIR) as worker:
        await warm_up(plan, noop, conn, worker)
        result.record_latency(await measure_latency(plan, noop, conn, worker))
        await conn.execute("VACUUM ANALYZE procrastinate_jobs, procrastinate_events")
        for _ in range(plan.process_rounds):
            result.rounds.append(await measure_processing(plan, noop, conn, worker))
        result.processed = median_round(result.rounds)


async def table_exists(conn: psycopg.AsyncConnection) -> bool:
    row = await (await conn.execute("SELECT to_regclass('procrastinate_jobs') IS NOT NULL")).fetchone()
    return bool(row and row[0])


async def scalar(conn: psycopg.AsyncConnection, query: str, *params: object) -> object:
    row = await (await conn.execute(query, params)).fetchone()
    return row[0] if row else None


async def truncate(conn: psycopg.AsyncConnection) -> None:
    await conn.execute("TRUNCATE procrastinate_jobs CASCADE")


async def last_id(conn: psycopg.AsyncConnection) -> int:
    return int(await scalar(conn, "SELECT coalesce(max(id), 0) FROM procrastinate_jobs"))  # type: ignore[arg-type]


async def measure_enqueue_one(
    plan: Plan, task: procrastinate.tasks.Task, conn: psycopg.AsyncConnection
) -> tuple[float, list[float]]:
    seconds = []
    await truncate(conn)
    for _ in range(plan.enqueue_rounds):  # rows accumulate over the rounds, as in a live table
        started = time.perf_counter()
        for _ in range(plan.one_jobs):
            await task.defer_async()
        seconds.append(time.perf_counter() - started)
    await truncate(conn)
    return enqueue_rates("procrastinate", "one at a time", plan.one_jobs, seconds)


async def measure_enqueue_batched(
    plan: Plan, task: procrastinate.tasks.Task, conn: psycopg.AsyncConnection
) -> tuple[float, list[float]]:
    seconds = []
    await truncate(conn)
    for _ in range(plan.enqueue_rounds):  # rows accumulate over the rounds, as in a live table
        started = time.perf_counter()
        for first in range(0, plan.batched_jobs, plan.batch_size):
            await task.batch_defer_async(*({} for _ in range(min(plan.batch_size, plan.batched_jobs - first))))
        seconds.append(time.perf_counter() - started)
    await truncate(conn)
    return enqueue_rates("procrastinate", f"in batches of {plan.batch_size}", plan.batched_jobs, seconds)


async def wait_for_successes(
    conn: psycopg.AsyncConnection, after_id: int, expected: int, worker: WorkerProcess, timeout: float
) -> None:
    deadline = time.monotonic() + timeout
    while True:
        worker.check_alive()
        done = await scalar(
            conn, "SELECT count(*) FROM procrastinate_jobs WHERE id > %s AND status = 'succeeded'", after_id
        )
        if isinstance(done, int) and done >= expected:
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"procrastinate: {done} of {expected} jobs done after {timeout:g}s")
        await asyncio.sleep(0.2)


async def warm_up(
    plan: Plan, task: procrastinate.tasks.Task, conn: psycopg.AsyncConnection, worker: WorkerProcess
) -> None:
    before = await last_id(conn)
    await task.defer_async()
    await wait_for_successes(conn, before, 1, worker, plan.timeout)
    await asyncio.sleep(0.5)


async def measure_latency(
    plan: Plan, task: procrastinate.tasks.Task, conn: psycopg.AsyncConnection, worker: WorkerProcess
) -> list[float]:
    before = await last_id(conn)
    start = time.perf_counter()
    for i in range(plan.latency_jobs):
        delay = start + i * plan.latency_interval - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        await task.defer_async()
    await wait_for_successes(conn, before, plan.latency_jobs, worker, plan.timeout)
    cursor = await conn.execute(
        """SELECT extract(epoch FROM s.at - d.at) * 1000
           FROM procrastinate_events d JOIN procrastinate_events s ON s.job_id = d.job_id AND s.type = 'started'
           WHERE d.job_id > %s AND d.type = 'deferred'""",
        (before,),
    )
    return [float(r[0]) for r in await cursor.fetchall()]


async def measure_processing(
    plan: Plan, task: procrastinate.tasks.Task, conn: psycopg.AsyncConnection, worker: WorkerProcess
) -> ProcessingRound:
    before = await last_id(conn)
    await task.batch_defer_async(*({} for _ in range(plan.process_jobs)))
    meter = CpuMeter(worker.pid, parent_pid(conn.info.backend_pid)).start()
    await wait_for_successes(conn, before, plan.process_jobs, worker, plan.timeout)
    meter.stop()
    seconds = float(
        await scalar(  # type: ignore[arg-type]
            conn,
            """SELECT extract(epoch FROM max(at) FILTER (WHERE type = 'succeeded')
                                         - min(at) FILTER (WHERE type = 'started'))
                 FROM procrastinate_events WHERE job_id > %s""",
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
        f"procrastinate: processed {plan.process_jobs} in {seconds:.3f}s ({result.rate:,.0f}/s); CPU: worker "
        f"{meter.worker:.2f}s, PostgreSQL {meter.postgres:.2f}s, machine {meter.machine:.2f}s"
    )
    return result


if __name__ == "__main__":
    sys.exit(main())
