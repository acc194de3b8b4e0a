"""What a durable step costs: a no-op job with 0, 1, 3 and 10 `ctx.step`s through a real worker.

    .venv/bin/python bench/steps.py                        # 3 rounds of 0, 1, 3, 10 steps, 2,000 jobs each
    .venv/bin/python bench/steps.py --jobs 5000 --rounds 5 --steps 0,1,10 --concurrency 50

On a fresh database (`bench_steps` on the embedded server), one `dygo worker` (`--concurrency` 10, log level
WARNING) runs `--jobs` jobs of `bench.steps` (bench/bench_jobs.py: `steps` calls of `ctx.step` on an async
function that returns None) for each step count in turn, all enqueued in one transaction before the worker
is told of them, the counts taking turns round after round; the tables are emptied between drains. 0 steps is
the bare reference: the same job, calling no step, in the same run.

Per drain: jobs/s = jobs / (last finish - first start), from the rows; the worker's and the server's CPU per
job (from /proc, so run it on the machine of the server). Then, against the 0-step drain of the same round,
the extra wall time and CPU per step: (per job with k steps - per job with 0) / k. The median round is
printed last. A job's steps cost one read (its first step reads the job's recorded steps) and one write per
step, each a round trip and a commit on the worker's one shared connection. The reference printed last is a
one-row INSERT committed on its own from the benchmark's process (median of 3 x 300): a step's write floor.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import CpuMeter, WorkerProcess, parent_pid, wait_until  # noqa: E402
from run import embedded_server_url, fresh_database  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from dygo.store.migrate import migrate  # noqa: E402

DATABASE = "bench_steps"


def drain(conn: psycopg.Connection, worker: WorkerProcess, postmaster: int, jobs: int, steps: int) -> dict:
    """Enqueue `jobs` jobs of `steps` steps in one statement and wait until they have all succeeded."""
    conn.execute("TRUNCATE dygo_jobs, dygo_steps")
    conn.execute(
        "INSERT INTO dygo_jobs (kind, queue, args) SELECT 'bench.steps', 'default', jsonb_build_object('steps', %s)"
        " FROM generate_series(1, %s)",
        (steps, jobs),
    )
    meter = CpuMeter(worker.pid, postmaster).start()
    conn.execute("SELECT pg_notify('dygo_jobs', 'default')")

    def done() -> bool:
        worker.check_alive()
        row = conn.execute("SELECT count(*) FROM dygo_jobs WHERE state = 'succeeded'").fetchone()
        return row is not None and row[0] >= jobs

    wait_until(done, 600, f"{jobs} jobs of {steps} steps", interval=0.05)
    meter.stop()
    row = conn.execute(
        "SELECT extract(epoch FROM max(finished_at) - min(started_at)), "
        "(SELECT count(*) FROM dygo_steps) FROM dygo_jobs"
    ).fetchone()
    assert row is not None
    seconds, recorded = float(row[0]), row[1]
    assert recorded == jobs * steps, f"{recorded} steps recorded, expected {jobs * steps}"
    return {
        "steps": steps,
        "jobs_s": jobs / seconds,
        "wall_us": seconds / jobs * 1e6,
        "worker_us": meter.worker / jobs * 1e6,
        "server_us": meter.postgres / jobs * 1e6,
    }


def bare_insert_us(conn: psycopg.Connection, count: int = 300) -> float:
    """The reference for one step's write: a one-row INSERT committed on its own, from this process."""
    conn.execute("CREATE TABLE IF NOT EXISTS bench_bare_insert (job_id bigint, key text, result jsonb)")
    began = time.perf_counter()
    for n in range(count):
        conn.execute("INSERT INTO bench_bare_insert VALUES (%s, 'step#1', 'null')", (n,))
    elapsed = time.perf_counter() - began
    conn.execute("DROP TABLE bench_bare_insert")
    return elapsed / count * 1e6


def table(rounds: list[list[dict]]) -> None:
    print(
        f"{'round':>6} {'steps':>5} {'jobs/s':>8} {'us/job':>8} {'us/step':>8} "
        f"{'worker CPU/step':>16} {'server CPU/step':>16}"
    )
    for number, drains in enumerate(rounds, 1):
        bare = next(d for d in drains if d["steps"] == 0)
        for d in drains:
            k = d["steps"]
            per_step = [(d[f] - bare[f]) / k if k else float("nan") for f in ("wall_us", "worker_us", "server_us")]
            print(
                f"{number:>6} {k:>5} {d['jobs_s']:>8,.0f} {d['wall_us']:>8.0f} {per_step[0]:>8.0f} "
                f"{per_step[1]:>16.0f} {per_step[2]:>16.0f}"
            )
    print("\nmedian of the rounds")
    counts = [d["steps"] for d in rounds[0]]
    for k in counts:
        mine = [next(d for d in drains if d["steps"] == k) for drains in rounds]
        bare = [next(d for d in drains if d["steps"] == 0) for drains in rounds]
        jobs_s = statistics.median(d["jobs_s"] for d in mine)
        if k:
            per = [
                statistics.median((m[f] - b[f]) / k for m, b in zip(mine, bare, strict=True))
                for f in ("wall_us", "worker_us", "server_us")
            ]
            print(
                f"{k:>3} steps: {jobs_s:>7,.0f} jobs/s, {per[0]:.0f} us per step "
                f"(CPU: worker {per[1]:.0f} us, server {per[2]:.0f} us)"
            )
        else:
            print(f"{k:>3} steps: {jobs_s:>7,.0f} jobs/s (the bare reference)")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=10)
    parser.add_argument("--steps", type=lambda t: [int(n) for n in t.split(",")], default=[0, 1, 3, 10])
    args = parser.parse_args()
    if 0 not in args.steps:
        parser.error("--steps must include 0, the bare reference")
    url = fresh_database(embedded_server_url(), DATABASE)
    with tempfile.TemporaryDirectory(prefix="dygo-steps-") as config, psycopg.connect(url, autocommit=True) as conn:
        migrate(conn)
        (Path(config) / "queues.yml").write_text(f"queues:\n  - name: default\n    concurrency: {args.concurrency}\n")
        (Path(config) / "dygo.yml").write_text("jobs: [bench_jobs]\n")
        path = os.pathsep.join(filter(None, [str(Path(__file__).resolve().parent), os.environ.get("PYTHONPATH")]))
        env = {"DATABASE_URL": url, "DYGO_CONFIG_DIR": config, "DYGO_LOG_LEVEL": "WARNING", "PYTHONPATH": path}
        postmaster = parent_pid(conn.info.backend_pid)
        with WorkerProcess([str(Path(sys.executable).with_name("dygo")), "worker"], env) as worker:
            wait_until(lambda: conn.execute("SELECT count(*) FROM dygo_workers").fetchone()[0] > 0, 30, "the worker")
            rounds = []
            for number in range(args.rounds):
                drains = [drain(conn, worker, postmaster, args.jobs, k) for k in args.steps]
                print(f"round {number + 1} done", file=sys.stderr, flush=True)
                rounds.append(drains)
            bare = statistics.median(bare_insert_us(conn) for _ in range(3))
    print(f"{args.jobs} jobs per drain, one worker at concurrency {args.concurrency}; us = microseconds\n")
    table(rounds)
    print(f"\nreference: a one-row INSERT committed on its own (autocommit), one client: {bare:.0f} us")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
