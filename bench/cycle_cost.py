"""Where a worker's cycle's CPU goes: its claim of a batch of jobs and their settle, one after the other.

    .venv/bin/python bench/cycle_cost.py                  # 2 rounds of: triggers on, triggers off
    .venv/bin/python bench/cycle_cost.py --jobs 20000 --rounds 3
    .venv/bin/python bench/cycle_cost.py --jobs 50000 --batch 500  # the claims of a worker at concurrency 500

On a fresh database (`bench_cycle_cost` on the embedded server), `--jobs` no-op jobs are enqueued, then
claimed `--batch` (4: concurrency 4's claims) at a time on a claim session and settled as many at a time on a
second connection, with the store's own functions (store/claim.py claim_jobs, store/leases.py settle: what the worker's
producer and settler send). It prints, per job: wall time, this client's CPU, and the CPU of each of the two
PostgreSQL backends (read from /proc, so run it on the machine of the server), and the median wall time of
one settle call. `--variants` names what each round runs with, taking turns: `current` (as migrated),
`no-notify` (the statement trigger on job updates disabled, dygo_jobs_updated: wake-ups for retries, result
waiters, workflow counts), and the ways of counting workflow jobs of bench/workflow_triggers.py: `none`
(migration 0016's triggers: what a plain job cost before workflows), `separate`, `row` and `deferred`.
No peer, no concurrency: a breakdown of one cycle, not a throughput figure (bench/run.py's dygo_c4 line
is that).

    .venv/bin/python bench/cycle_cost.py --variants current,none,row --rounds 5 --jobs 20000
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from pathlib import Path

import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parent))
import workflow_triggers  # noqa: E402
from common import process_cpu_seconds  # noqa: E402
from run import embedded_server_url, fresh_database  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from dygo.store import claim, enqueue_many, leases  # noqa: E402
from dygo.store.config import load_settings  # noqa: E402
from dygo.store.leases import Succeeded  # noqa: E402
from dygo.store.loading import load_jobs  # noqa: E402
from dygo.store.migrate import migrate  # noqa: E402

DATABASE = "bench_cycle_cost"
NOTIFY_TRIGGERS = ("dygo_jobs_updated",)
VARIANTS = ("current", "no-notify", *workflow_triggers.VARIANTS[1:])


async def cycles(url: str, jobs: int, batch: int) -> tuple[int, float, float, float, float, float]:
    """(jobs settled, wall s, client CPU s, claim backend CPU s, settle backend CPU s, median settle call s)."""
    async with (
        await psycopg.AsyncConnection.connect(url, autocommit=True) as claimer,
        await psycopg.AsyncConnection.connect(url, autocommit=True) as settler,
    ):
        await claim.claim_session(claimer)
        claim_pid, settle_pid = claimer.info.backend_pid, settler.info.backend_pid
        claim_cpu, settle_cpu = process_cpu_seconds(claim_pid), process_cpu_seconds(settle_pid)
        began, client = time.perf_counter(), time.process_time()
        done = 0
        settles = []
        while done < jobs:
            claimed = (await claim.claim_jobs(claimer, {"default": batch}, "bench", 30.0)).jobs
            if not claimed:
                break
            settling = time.perf_counter()
            await leases.settle(settler, [Succeeded(job, None) for job in claimed])
            settles.append(time.perf_counter() - settling)
            done += len(claimed)
        return (
            done,
            time.perf_counter() - began,
            time.process_time() - client,
            process_cpu_seconds(claim_pid) - claim_cpu,
            process_cpu_seconds(settle_pid) - settle_cpu,
            statistics.median(settles) if settles else float("nan"),
        )


def one_round(server_url: str, variant: str, jobs: int, batch: int) -> str:
    url = fresh_database(server_url, DATABASE)
    with psycopg.connect(url, autocommit=True) as conn:
        migrate(conn)
        if variant == "no-notify":
            for trigger in NOTIFY_TRIGGERS:
                conn.execute(f"ALTER TABLE dygo_jobs DISABLE TRIGGER {trigger}")
        elif variant != "current":
            workflow_triggers.install(conn, variant)
        enqueue_many(conn, [{"kind": "example.noop"}] * jobs)
        conn.execute("VACUUM ANALYZE dygo_jobs")
    done, wall, client, claim, settle, settle_call = asyncio.run(cycles(url, jobs, batch))
    per_job = 1e6 / done
    return (
        f"{variant:>9} {done / wall:>8,.0f} {wall * per_job:>8.0f} {client * per_job:>10.0f} "
        f"{claim * per_job:>10.0f} {settle * per_job:>11.0f} {settle_call * 1e6:>12.0f}"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument(
        "--batch",
        type=int,
        default=4,
        help="jobs per claim and per settle (the worker's at "
        "concurrency 4; 100 and 500 are its claims at concurrency 200 and 500)",
    )
    parser.add_argument(
        "--variants",
        type=lambda text: text.split(","),
        default=["current", "no-notify"],
        help=f"comma-separated, each round in turn, of {','.join(VARIANTS)} (default current,no-notify)",
    )
    args = parser.parse_args()
    if unknown := set(args.variants) - set(VARIANTS):
        parser.error(f"unknown variant(s) {', '.join(sorted(unknown))}")
    load_jobs(load_settings(ROOT / "config"))
    server_url = embedded_server_url()
    print(
        f"per job, in microseconds, {args.batch} jobs per claim and per settle (jobs/s: claim and settle one "
        f"after the other, one client)"
    )
    print(
        f"{'variant':>9} {'jobs/s':>8} {'wall':>8} {'client CPU':>10} {'claim CPU':>10} {'settle CPU':>11} "
        f"{'settle us':>12}"
    )
    for _ in range(args.rounds):
        for variant in args.variants:
            print(one_round(server_url, variant, args.jobs, args.batch), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
