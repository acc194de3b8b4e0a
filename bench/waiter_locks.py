"""Do result waiters hold up settles? The advisory lock (0013, 0015) against 0014's row lock, side by side.

    .venv/bin/python bench/waiter_locks.py                 # 3 rounds of: none, 0015, 0014
    .venv/bin/python bench/waiter_locks.py --rounds 5 --rate 300

On a fresh database (`bench_waiter_locks` on the embedded server), one `dygo worker --concurrency 50`
drains 20,000 no-op jobs while a client registers and deletes result waiters at `--rate` a second
(store.results: what `GET /api/v1/jobs/{id}?wait=` does), all for one delayed job, so that no settle
has anyone to notify: what is measured is the registration's effect on settles alone. Each round runs
three variants: no waiters; the current protocol (migration 0015, as 0013: the trigger takes an advisory
lock shared, a registration takes it exclusive; its commit does not wait for the WAL flush); and
migration 0014's, put back for the round (no lock: the waiter commits its row, then reads its job FOR
SHARE). 0015 took 0014 back because that row lock made claims pass over pending jobs (see the migration):
this measures what that cost in settle throughput. It prints jobs/s and lock waits: the average number of backends seen
waiting on a heavyweight lock in `pg_stat_activity`, sampled every 2 ms, by wait event. Jobs/s moves
with anything else the machine runs; the lock waits do not.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parent))
from run import embedded_server_url, fresh_database  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from dygo.store import enqueue_many, results  # noqa: E402
from dygo.store.config import load_settings  # noqa: E402
from dygo.store.loading import load_jobs  # noqa: E402
from dygo.store.migrate import migrate  # noqa: E402
from dygo.store.sql.job_reads import GET_JOB  # noqa: E402
from dygo.store.sql.results import REGISTER_WAITER, UNREGISTER_WAITER, WAITER_TRANSACTION  # noqa: E402

DATABASE = "bench_waiter_locks"
MIGRATIONS = ROOT / "store" / "migrations" / "legacy"


def trigger_function(migration: str) -> str:
    text = (MIGRATIONS / migration).read_text()
    return text[text.index("CREATE OR REPLACE FUNCTION") :]


CURRENT = "0015_result_waiters_lock_again.sql"
ROW_LOCK = "0014_result_waiters_row_lock.sql"


def register_current(conn: psycopg.Connection, job_id: int) -> int:
    return results.register(conn, job_id, 60)[0]


def register_0014(conn: psycopg.Connection, job_id: int) -> int:
    """Migration 0014's registration: the row, committed, then the job read FOR SHARE."""
    with conn.pipeline():
        conn.execute("BEGIN")
        conn.execute(WAITER_TRANSACTION)
        inserted = conn.execute(REGISTER_WAITER, {"job_id": job_id, "seconds": 60})
        conn.execute("COMMIT")
        conn.execute(WAITER_TRANSACTION)
        conn.execute(GET_JOB + " FOR SHARE", (job_id,))
    return inserted.fetchone()[0]


def one_round(url: str, variant: str, rate: float, jobs: int) -> tuple[float, float, dict[str, float]]:
    """(jobs/s, registrations/s, lock waits per sample by wait event) of one variant."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(trigger_function(ROW_LOCK if variant == "0014" else CURRENT))
        conn.execute("TRUNCATE dygo_jobs, dygo_result_waiters")
        waited = enqueue_many(conn, [{"kind": "example.noop", "delay": "1h"}])[0].id
        stop = threading.Event()
        registrations = [0]
        waits: Counter[str] = Counter()
        samples = [0]
        register: Callable[[psycopg.Connection, int], int] = register_0014 if variant == "0014" else register_current

        def waiter() -> None:
            with psycopg.connect(url, autocommit=True) as own:
                while not stop.is_set():
                    began = time.perf_counter()
                    own.execute(UNREGISTER_WAITER, (register(own, waited),))
                    registrations[0] += 1
                    time.sleep(max(0.0, 1 / rate - (time.perf_counter() - began)))

        def sampler() -> None:
            with psycopg.connect(url, autocommit=True) as own:
                while not stop.is_set():
                    samples[0] += 1
                    for event, n in own.execute(
                        "SELECT wait_event, count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' GROUP BY 1"
                    ).fetchall():
                        waits[event] += n
                    time.sleep(0.002)

        env = dict(os.environ, DATABASE_URL=url, DYGO_LOG_LEVEL="WARNING")
        worker = subprocess.Popen(
            [str(ROOT / ".venv" / "bin" / "dygo"), "worker", "--concurrency", "50"],
            env=env,
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
        )
        try:
            time.sleep(3)  # started and idle
            threads = [threading.Thread(target=sampler, daemon=True)]
            if variant != "none":
                threads.append(threading.Thread(target=waiter, daemon=True))
            for thread in threads:
                thread.start()
            enqueue_many(conn, [{"kind": "example.noop"}] * jobs)
            began = time.perf_counter()
            while conn.execute("SELECT count(*) FROM dygo_jobs WHERE state = 'succeeded'").fetchone()[0] < jobs:
                time.sleep(0.05)
            elapsed = time.perf_counter() - began
        finally:
            stop.set()
            worker.terminate()
            worker.wait()
        conn.execute(trigger_function(CURRENT))
    return jobs / elapsed, registrations[0] / elapsed, {k: v / max(samples[0], 1) for k, v in waits.items()}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--rate", type=float, default=300.0, help="registrations a second (at most)")
    parser.add_argument("--jobs", type=int, default=20_000)
    args = parser.parse_args()
    load_jobs(load_settings(ROOT / "config"))
    url = fresh_database(embedded_server_url(), DATABASE)
    with psycopg.connect(url, autocommit=True) as conn:
        migrate(conn)
    print(f"{'round':>5}  {'variant':8} {'jobs/s':>8} {'registrations/s':>16}  lock waits per sample")
    for number in range(1, args.rounds + 1):
        for variant in ("none", "0015", "0014"):
            rate, registered, waits = one_round(url, variant, args.rate, args.jobs)
            shown = ", ".join(f"{event} {n:.3f}" for event, n in sorted(waits.items())) or "none"
            print(f"{number:>5}  {variant:8} {rate:>8,.0f} {registered:>16,.0f}  {shown}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
