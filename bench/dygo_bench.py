"""dygo's side of the benchmark (run by run.py with dygo's own .venv; prints one JSON Result line).

    .venv/bin/python bench/dygo_bench.py --url postgresql://postgres@/bench_dygo?host=... [--profile-with PY_SPY]

The worker is the real `dygo worker --queue default --concurrency 200` subprocess, configured
for throughput through a config directory written here (DYGO_CONFIG_DIR):
`claim_batch_size` from --claim-batch-size, `claim_ahead` from --claim-ahead. The log level is the
default INFO, so the worker writes its one line per job to stderr as a user's would (`--log-level
WARNING` measures without them).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from importlib.metadata import version
from pathlib import Path

import psycopg
import workflow_triggers
from common import (
    OTHER_CLIENTS,
    OUTPUT_DIR,
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
    paced,
    parent_pid,
    plan_from,
    py_spy,
    rate,
    refuse_other_clients,
    summarise_profile,
    wait_for_rows,
)
from dygo.store.config import load_settings
from dygo.store.enqueue import JobRequest, enqueue, enqueue_many
from dygo.store.loading import load_jobs
from dygo.store.migrate import migrate

KIND = "example.noop"
QUEUE = "default"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_plan_arguments(parser)
    parser.add_argument("--concurrency", type=int, default=200)
    parser.add_argument("--claim-batch-size", type=int, default=100, help="dygo.yml claim_batch_size (default 100)")
    parser.add_argument("--claim-ahead", default="5ms", help="dygo.yml claim_ahead (default 5ms, dygo's default)")
    parser.add_argument("--log-level", default="INFO", help="the worker's DYGO_LOG_LEVEL")
    parser.add_argument("--profile-with", metavar="PY_SPY", help="py-spy binary: profile one extra processing round")
    parser.add_argument("--profile-jobs", type=int, default=50_000)
    parser.add_argument(
        "--limit",
        choices=tuple(NEVER_REACHED),
        default="none",
        help="give the queue a cluster-wide limit it never reaches: what a safety cap costs (bench/README.md)",
    )
    parser.add_argument(
        "--workflow-triggers",
        choices=workflow_triggers.VARIANTS,
        default="current",
        help="how workflow jobs are counted (bench/workflow_triggers.py): migration 0017's triggers (current), "
        "none (what workflows cost a plain job), or another way (separate, row, deferred)",
    )
    args = parser.parse_args()
    plan = plan_from(args)

    with tempfile.TemporaryDirectory(prefix="dygo-bench-config-") as config_dir:
        write_config(Path(config_dir), args.concurrency, args.claim_batch_size, args.limit, args.claim_ahead)
        load_jobs(load_settings(config_dir))
        # One client connection for the whole run, as the peers' scripts keep theirs (and as an application's
        # pool would): a fresh session's first insert also compiles the plpgsql trigger functions, a
        # once-per-connection cost (~1.5 ms) that would otherwise be the first latency sample of every pass.
        conn = psycopg.connect(plan.url, autocommit=True)
        refuse_other_clients(conn.execute(OTHER_CLIENTS).fetchall(), "dygo")
        migrate(conn)
        if args.workflow_triggers != "current":
            workflow_triggers.install(conn, args.workflow_triggers)
        result = Result(
            system="dygo" if args.limit == "none" else f"dygo-{args.limit}-limited",
            version=dygo_version(),
            settings=f"dygo worker --queue {QUEUE} --concurrency {args.concurrency}, "
            f"{NEVER_REACHED[args.limit] + ', ' if args.limit != 'none' else ''}"
            f"{'' if args.workflow_triggers == 'current' else f'workflow triggers: {args.workflow_triggers}, '}"
            f"claim_batch_size {args.claim_batch_size}, claim_ahead {args.claim_ahead}, "
            f"log level {args.log_level}; "
            f"enqueue_many batches of {plan.batch_size}",
        )
        result.enqueue_one, result.enqueue_one_rounds = measure_enqueue_one(plan, conn)
        result.enqueue_batched, result.enqueue_batched_rounds = measure_enqueue_batched(plan, conn)
        env = {"DATABASE_URL": plan.url, "DYGO_CONFIG_DIR": config_dir, "DYGO_LOG_LEVEL": args.log_level}
        command = [
            str(Path(sys.executable).with_name("dygo")),
            "worker",
            "--queue",
            QUEUE,
            "--concurrency",
            str(args.concurrency),
        ]
        with WorkerProcess(command, env) as worker:
            warm_up(plan, conn, worker)
            result.record_latency(measure_latency(plan, conn, worker))
            vacuum_analyze(conn)
            result.rounds = [
                measure_processing(plan, conn, worker, plan.process_jobs) for _ in range(plan.process_rounds)
            ]
            result.processed = median_round(result.rounds)
            if args.profile_with:
                result.profile = profile_processing(plan, conn, worker, args.profile_with, args.profile_jobs)
        conn.close()
    emit(result)
    return 0


# Cluster-wide limits on the benchmark's queue that the run never reaches: what the limited claim costs.
# A queue's limit that no-op jobs on this machine never reach: a user's generous safety cap.
NEVER_REACHED = {"none": "", "concurrency": "concurrency_limit: 10000", "rate": "rate_limit: 1000000/s"}


def write_config(
    config_dir: Path, concurrency: int, claim_batch_size: int, limit_name: str = "none", claim_ahead: str = "5ms"
) -> None:
    # `slow` is there because jobs/examples.py declares a job on it.
    limit = f"    {NEVER_REACHED[limit_name]}\n" if limit_name != "none" else ""
    (config_dir / "queues.yml").write_text(
        f"queues:\n  - name: {QUEUE}\n    concurrency: {concurrency}\n{limit}  - name: slow\n    concurrency: 2\n"
    )
    (config_dir / "dygo.yml").write_text(
        f"jobs: [jobs]\nclaim_batch_size: {claim_batch_size}\nclaim_ahead: {claim_ahead}\n"
    )


def dygo_version() -> str:
    return version("dygo-jobs")


def truncate(conn: psycopg.Connection) -> None:
    conn.execute("TRUNCATE dygo_jobs")


def vacuum_analyze(conn: psycopg.Connection) -> None:
    """What autovacuum would have done by now in a running system (every system gets it)."""
    conn.execute("VACUUM ANALYZE dygo_jobs")


def last_id(conn: psycopg.Connection) -> int:
    row = conn.execute("SELECT coalesce(max(id), 0) FROM dygo_jobs").fetchone()
    return row[0] if row else 0


# --- 1 and 2: enqueue -----------------------------------------------------------------------------------


def measure_enqueue_one(plan: Plan, conn: psycopg.Connection) -> tuple[float, list[float]]:
    seconds = []
    truncate(conn)
    for _ in range(plan.enqueue_rounds):  # rows accumulate over the rounds, as in a live table
        started = time.perf_counter()
        for i in range(plan.one_jobs):
            enqueue(conn, KIND, {"n": i})
        seconds.append(time.perf_counter() - started)
    truncate(conn)
    return enqueue_rates("dygo", "one at a time", plan.one_jobs, seconds)


def measure_enqueue_batched(plan: Plan, conn: psycopg.Connection) -> tuple[float, list[float]]:
    seconds = []
    truncate(conn)
    for _ in range(plan.enqueue_rounds):  # rows accumulate over the rounds, as in a live table
        started = time.perf_counter()
        for first in range(0, plan.batched_jobs, plan.batch_size):
            count = min(plan.batch_size, plan.batched_jobs - first)
            enqueue_many(conn, [JobRequest(KIND, {"n": first + i}) for i in range(count)])
        seconds.append(time.perf_counter() - started)
    truncate(conn)
    return enqueue_rates("dygo", f"in batches of {plan.batch_size}", plan.batched_jobs, seconds)


# --- 3 and 4: the worker --------------------------------------------------------------------------------


def count_succeeded(conn: psycopg.Connection, after_id: int) -> int:
    row = conn.execute("SELECT count(*) FROM dygo_jobs WHERE id > %s AND state = 'succeeded'", (after_id,)).fetchone()
    return row[0] if row else 0


def warm_up(plan: Plan, conn: psycopg.Connection, worker: WorkerProcess) -> None:
    """One job through the worker: it is then started, listening and idle."""
    before = last_id(conn)
    enqueue(conn, KIND, {})
    wait_for_rows(lambda: count_succeeded(conn, before), 1, worker, plan.timeout, "warm-up job")
    time.sleep(0.5)


def measure_latency(plan: Plan, conn: psycopg.Connection, worker: WorkerProcess) -> list[float]:
    before = last_id(conn)
    for i in paced(plan.latency_jobs, plan.latency_interval):
        enqueue(conn, KIND, {"n": i})
    wait_for_rows(lambda: count_succeeded(conn, before), plan.latency_jobs, worker, plan.timeout, "latency jobs")
    rows = conn.execute(
        "SELECT extract(epoch FROM started_at - enqueued_at) * 1000 FROM dygo_jobs WHERE id > %s ORDER BY id", (before,)
    ).fetchall()
    return [float(r[0]) for r in rows]


def measure_processing(plan: Plan, conn: psycopg.Connection, worker: WorkerProcess, jobs: int) -> ProcessingRound:
    before = last_id(conn)
    enqueue_many(conn, [JobRequest(KIND, {"n": i}) for i in range(jobs)])
    meter = CpuMeter(worker.pid, parent_pid(conn.info.backend_pid)).start()
    wait_for_rows(lambda: count_succeeded(conn, before), jobs, worker, plan.timeout, "processed jobs")
    meter.stop()
    row = conn.execute(
        "SELECT extract(epoch FROM max(finished_at) - min(started_at)) FROM dygo_jobs WHERE id > %s", (before,)
    ).fetchone()
    seconds = float(row[0]) if row and row[0] is not None else float("nan")
    result = ProcessingRound(
        jobs=jobs,
        seconds=round(seconds, 4),
        rate=rate(jobs, seconds),
        worker_cpu_seconds=round(meter.worker, 2),
        postgres_cpu_seconds=round(meter.postgres, 2),
        machine_busy_seconds=round(meter.machine, 2),
    )
    log(
        f"dygo: processed {jobs} in {seconds:.3f}s ({result.rate:,.0f}/s); CPU: worker {meter.worker:.2f}s, "
        f"PostgreSQL {meter.postgres:.2f}s, machine {meter.machine:.2f}s"
    )
    return result


def profile_processing(
    plan: Plan, conn: psycopg.Connection, worker: WorkerProcess, py_spy_binary: str, jobs: int
) -> dict[str, object]:
    raw = OUTPUT_DIR / "dygo-worker-profile.txt"
    with py_spy(py_spy_binary, worker.pid, raw):
        profiled = measure_processing(plan, conn, worker, jobs)
    log(f"dygo: profiled round (py-spy attached) ran at {profiled.rate:,.0f}/s")
    return summarise_profile(raw) if raw.exists() else {"error": "py-spy wrote no profile"}


if __name__ == "__main__":
    sys.exit(main())
