"""Child jobs (`ctx.call`, `ctx.map`): the round trip of one call, and the fan-out and fan-in of a map.

    .venv/bin/python bench/children.py                                # 200 calls; maps of 1,000 and 10,000
    .venv/bin/python bench/children.py --calls 500 --maps 1000 10000 100000 --concurrency 100

On a fresh database (`bench_children` on the embedded server), one `dygo worker` (log level WARNING, the
default 60 s poll: wake-ups come from notifications) runs:

- call: `--calls` parents of `bench.parent_call` (bench/children_jobs.py), one at a time, each calling one
  no-op child. Round trip = the resumed parent's start (started_at, set at its claim) - the commit of its
  suspend (the call's step row, recorded_at = now() of the settle that enqueued the child). Also its parts:
  the child's start after that commit, and the parent's start after the child's end (finished_at).
- plain: the reference, the largest `--maps` size of no-op jobs enqueued in one statement, without a parent:
  jobs/s = jobs / (last end - the enqueue's commit).
- map: one parent of `bench.parent_map` per `--maps` size, mapping that many no-op children. Resume = the
  parent's resumed start - the commit of its suspend; children/s = children / (last child's end - the
  suspend's commit); `fan-in` = the resumed start - the last child's end (the count, the step's result made
  from the children's rows, the wake-up and the claim).

Every time is the database's now() of the transaction that wrote it.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import WorkerProcess, percentile, wait_until  # noqa: E402
from run import embedded_server_url, fresh_database  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from dygo.store.migrate import migrate  # noqa: E402

DATABASE = "bench_children"
TIMES = """
SELECT extract(epoch FROM p.started_at - s.recorded_at) * 1000,
       extract(epoch FROM min(c.started_at) - s.recorded_at) * 1000,
       extract(epoch FROM p.started_at - max(c.finished_at)) * 1000,
       extract(epoch FROM max(c.finished_at) - s.recorded_at),
       count(c.*), p.result
FROM dygo_jobs p JOIN dygo_steps s ON s.job_id = p.id JOIN dygo_jobs c ON c.parent_id = p.id
WHERE p.id = %s AND p.state = 'succeeded'
GROUP BY p.id, s.recorded_at"""


def finished(conn: psycopg.Connection, worker: WorkerProcess, job_id: int, timeout: float) -> tuple:
    def done() -> bool:
        worker.check_alive()
        row = conn.execute("SELECT state FROM dygo_jobs WHERE id = %s", (job_id,)).fetchone()
        if row is not None and row[0] == "dead":
            raise SystemExit(f"job {job_id} is dead: {worker.output[-10:]}")
        return row is not None and row[0] == "succeeded"

    wait_until(done, timeout, f"job {job_id} to succeed", interval=0.005)
    row = conn.execute(TIMES, (job_id,)).fetchone()
    assert row is not None
    return row


def enqueue(conn: psycopg.Connection, kind: str, args: str) -> int:
    row = conn.execute(
        "INSERT INTO dygo_jobs (kind, queue, args) VALUES (%s, 'default', %s::jsonb) RETURNING id", (kind, args)
    ).fetchone()
    assert row is not None
    return int(row[0])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--maps", type=int, nargs="*", default=[1000, 10000])
    parser.add_argument("--concurrency", type=int, default=50)
    args = parser.parse_args()
    url = fresh_database(embedded_server_url(), DATABASE)
    with tempfile.TemporaryDirectory(prefix="dygo-children-") as config, psycopg.connect(url, autocommit=True) as conn:
        migrate(conn)
        (Path(config) / "queues.yml").write_text(f"queues:\n  - name: default\n    concurrency: {args.concurrency}\n")
        (Path(config) / "dygo.yml").write_text("jobs: [children_jobs]\n")
        path = os.pathsep.join(filter(None, [str(Path(__file__).resolve().parent), os.environ.get("PYTHONPATH")]))
        env = {"DATABASE_URL": url, "DYGO_CONFIG_DIR": config, "DYGO_LOG_LEVEL": "WARNING", "PYTHONPATH": path}
        with WorkerProcess([str(Path(sys.executable).with_name("dygo")), "worker"], env) as worker:
            wait_until(lambda: conn.execute("SELECT count(*) FROM dygo_workers").fetchone()[0] > 0, 30, "the worker")
            calls = []
            for _ in range(args.calls):
                calls.append(finished(conn, worker, enqueue(conn, "bench.parent_call", "{}"), 30))
            n = max(args.maps, default=0)
            plain = None
            if n:
                conn.execute(
                    "INSERT INTO dygo_jobs (kind, queue, args) "
                    "SELECT 'bench.child', 'default', jsonb_build_object('i', i) FROM generate_series(1, %s) AS i",
                    (n,),
                )
                wait_until(
                    lambda: (
                        conn.execute(
                            "SELECT count(*) FROM dygo_jobs WHERE kind = 'bench.child' AND parent_id IS NULL "
                            "AND state = 'succeeded'"
                        ).fetchone()[0]
                        >= n
                    ),
                    600,
                    "the plain jobs",
                )
                row = conn.execute(
                    "SELECT extract(epoch FROM max(finished_at) - min(enqueued_at)) FROM dygo_jobs "
                    "WHERE kind = 'bench.child' AND parent_id IS NULL"
                ).fetchone()
                assert row is not None
                plain = (n, n / float(row[0]))
            maps = []
            for n in args.maps:
                row = finished(conn, worker, enqueue(conn, "bench.parent_map", f'{{"n": {n}}}'), 600)
                assert row[4] == n and row[5] == n, row
                maps.append((n, row))
                print(f"map of {n} done", file=sys.stderr, flush=True)
    print(f"one worker at concurrency {args.concurrency}; ms\n")
    print(f"call, {args.calls} parents one at a time:")
    for index, what in enumerate(("round trip", "child start", "parent resume")):
        ordered = sorted(float(c[index]) for c in calls)
        p50, p95 = percentile(ordered, 50), percentile(ordered, 95)
        print(f"  {what:>14}: p50 {p50:.1f}, p95 {p95:.1f}, max {ordered[-1]:.1f}")
    if plain is not None:
        print(f"plain: {plain[0]} no-op jobs in one statement, no parent: {plain[1]:,.0f} jobs/s")
    for n, (resume, start, fan_in, span, *_) in maps:
        print(
            f"map of {n}: resume {float(resume):.0f} ms after the suspend; first child {float(start):.0f} ms; "
            f"{n / float(span):,.0f} children/s; fan-in {float(fan_in):.1f} ms after the last child"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
