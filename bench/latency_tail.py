"""Where dygo's wake-up latency goes: N jobs enqueued 20 ms apart to an idle real worker.

    .venv/bin/python bench/latency_tail.py [--jobs 600]

Prints p50/p95/p99 of start - enqueue (both from the rows, as bench/run.py reads them), split in two
at the moment the enqueue call returned to this script (the same machine's clock):

* enqueue: the insert's transaction start to its reply here (the statement, the commit's WAL flush and
  the reply; the NOTIFY leaves at the commit, just before the reply);
* wake-up: that reply to the claim's transaction start (the NOTIFY's way through the listening backend
  to the worker, the worker's hand-off to its producer, and the claim's way to its backend).

Then the slowest jobs, with the second of the run they were enqueued at, to tell a periodic stall
(heartbeat, timings flush, recovery) from scheduling jitter. Uses the embedded server and a database
of its own.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psycopg
from psycopg.conninfo import make_conninfo

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from dygo.store import embedded  # noqa: E402
from dygo.store.config import load_settings  # noqa: E402
from dygo.store.enqueue import enqueue  # noqa: E402
from dygo.store.loading import load_jobs  # noqa: E402

DATABASE = "bench_latency_tail"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=600)
    parser.add_argument("--interval", type=float, default=0.020, help="seconds between enqueues")
    args = parser.parse_args()
    server = embedded.ensure_running(ROOT / ".dygo")
    config = Path(tempfile.mkdtemp(prefix="dygo-latency-"))
    (config / "queues.yml").write_text(
        "queues:\n  - name: default\n    concurrency: 200\n  - name: slow\n    concurrency: 2\n"
    )
    (config / "dygo.yml").write_text("jobs: [jobs]\n")
    load_jobs(load_settings(str(config)))
    with psycopg.connect(server, autocommit=True) as admin:
        admin.execute(f"DROP DATABASE IF EXISTS {DATABASE} WITH (FORCE)")
        admin.execute(f"CREATE DATABASE {DATABASE}")
    url = make_conninfo(server, dbname=DATABASE)
    env = {**os.environ, "DATABASE_URL": url, "DYGO_CONFIG_DIR": str(config)}
    dygo = str(Path(sys.executable).with_name("dygo"))
    subprocess.run([dygo, "migrate"], env=env, check=True, capture_output=True)
    worker = subprocess.Popen(
        [dygo, "worker", "--queue", "default", "--concurrency", "200"],
        env=env,
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        with psycopg.connect(url, autocommit=True) as conn:
            time.sleep(1.5)
            for i in range(20):  # warm up: prepared statements, connections
                enqueue(conn, "example.noop", {"n": i})
                time.sleep(0.01)
            time.sleep(0.5)
            before = conn.execute("SELECT coalesce(max(id), 0) FROM dygo_jobs").fetchone()[0]
            start = time.perf_counter()
            returned: dict[int, float] = {}  # job id -> when its enqueue call returned, epoch seconds
            for i in range(args.jobs):
                pause = start + i * args.interval - time.perf_counter()
                if pause > 0:
                    time.sleep(pause)
                job = enqueue(conn, "example.noop", {"n": i})
                returned[job.id] = time.time()
            time.sleep(0.5)
            rows = conn.execute(
                "SELECT extract(epoch FROM started_at - enqueued_at)::float8 * 1000,"
                "       extract(epoch FROM enqueued_at - min(enqueued_at) OVER ())::float8,"
                "       id, extract(epoch FROM enqueued_at)::float8, extract(epoch FROM started_at)::float8"
                " FROM dygo_jobs WHERE id > %s AND started_at IS NOT NULL ORDER BY 1",
                (before,),
            ).fetchall()
    finally:
        worker.terminate()
        worker.wait()
        with psycopg.connect(server, autocommit=True) as admin:  # one database fewer for autovacuum to visit
            admin.execute(f"DROP DATABASE IF EXISTS {DATABASE} WITH (FORCE)")

    def spread(values: list[float]) -> str:
        ordered = sorted(values)
        p50, p95, p99 = (ordered[min(len(ordered) - 1, int(p * len(ordered)))] for p in (0.5, 0.95, 0.99))
        return f"p50 {p50:.2f} ms, p95 {p95:.2f} ms, p99 {p99:.2f} ms"

    print(f"{len(rows)} jobs: {spread([row[0] for row in rows])}")
    print(f"  enqueue (transaction start to reply): {spread([(returned[i] - e) * 1000 for _, _, i, e, _ in rows])}")
    print(f"  wake-up (reply to claim start):       {spread([(s - returned[i]) * 1000 for _, _, i, _, s in rows])}")
    print("slowest:", ", ".join(f"{ms:.2f} ms at {at:.2f}s" for ms, at, *_ in rows[-12:]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
