"""A claim's walk under a held snapshot, from `since` and from the head, as dead entries pile up.

A fresh database (`bench_held_walk`) of the project's embedded server, or of `--server`; another
connection holds an xid; each step enqueues 20,000 jobs due 10 s ago and 100 due now and claims them all
(their ready-index entries dead but kept), enqueues one more, and runs the worker's claim statement
(store/claim.py CLAIM_JOBS: prepared, generic plan, the claim-session settings) under `EXPLAIN (ANALYZE,
BUFFERS)`, rolled back: from `since` = now - 0.5 s within the jobs' one priority (the producer's walk start
once its claims met it; store/claim.py walk_segments) and from the head; and the producer's look behind its walk
start (JOBS_BEHIND). Prints ms and shared buffers of each.

    .venv/bin/python bench/held_walk.py
    .venv/bin/python bench/held_walk.py --server 'postgresql://postgres@/postgres?host=/tmp/pg15'
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from pathlib import Path

import psycopg
from psycopg import ClientCursor
from psycopg.conninfo import make_conninfo

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import ROOT, migrate  # noqa: E402
from dygo.store import claim  # noqa: E402

DATABASE = "bench_held_walk"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--server", help="URL of another PostgreSQL server (default: the project's embedded one)")
    parser.add_argument("--steps", type=int, default=4)
    args = parser.parse_args()
    server = (
        args.server
        or subprocess.run(
            [sys.executable, "-m", "dygo", "db", "url"], check=True, capture_output=True, text=True, cwd=ROOT
        ).stdout.strip()
    )
    with psycopg.connect(server, autocommit=True) as conn:
        print(conn.execute("SELECT version()").fetchone()[0])
        conn.execute(f"DROP DATABASE IF EXISTS {DATABASE} WITH (FORCE)")
        conn.execute(f"CREATE DATABASE {DATABASE}")
    url = make_conninfo(server, dbname=DATABASE)
    migrate({"DATABASE_URL": url})
    names: list[str] = []

    def parameter(match: re.Match[str]) -> str:
        if match.group(1) not in names:
            names.append(match.group(1))
        return f"${names.index(match.group(1)) + 1}"

    prepared = re.sub(r"%\((\w+)\)s", parameter, claim.CLAIM_JOBS)
    params = {"queues": ["default"], "slots": [8], "owner": "bench", "ttl": 60.0, "kind_attempts": "{}",
              "max_attempts": 3, "full_kinds": [], "cap_kinds": [], "cap_free": []}  # fmt: skip
    with (
        psycopg.connect(url, autocommit=True) as conn,
        psycopg.connect(url) as holder,
        psycopg.connect(url, cursor_factory=ClientCursor) as explain,
    ):
        holder.execute("SELECT pg_current_xact_id()")  # an xid: VACUUM keeps every version newer than it
        skip_scan = conn.info.server_version >= claim.SKIP_SCAN_SERVER  # the walk's shape, as the claim's
        explain.execute(claim.CLAIM_SESSION)
        explain.execute(f"PREPARE c AS {prepared}")
        explain.commit()
        print("| dead entries | from since: ms / buffers | from the head: ms / buffers | look behind: ms / buffers |")
        print("|---:|---|---|---|")
        for step in range(1, args.steps + 1):
            conn.execute(
                "INSERT INTO dygo_jobs (kind, queue, run_at) SELECT 'bench.noop', 'default', now() - interval '10 s'"
                " FROM generate_series(1, 20000)"
            )
            conn.execute(
                "INSERT INTO dygo_jobs (kind, queue) SELECT 'bench.noop', 'default' FROM generate_series(1, 100)"
            )
            conn.execute("UPDATE dygo_jobs SET state = 'active' WHERE state = 'pending'")
            conn.execute("UPDATE dygo_jobs SET state = 'succeeded' WHERE state = 'active'")
            conn.execute("INSERT INTO dygo_jobs (kind, queue) VALUES ('bench.noop', 'default')")
            since = conn.execute("SELECT now() - interval '0.5 s'").fetchone()[0]
            cells = []
            for start in (since, None):
                starts = {} if start is None else {"default": claim.WalkStart(start, frozenset({0}))}
                segments = claim.walk_segments(["default"], starts, skip_scan=skip_scan)
                values = [{**params, **segments}[name] for name in names]
                cells.append(measure(explain, f"EXECUTE c({', '.join(['%s'] * len(names))})", values))
            look = claim.JOBS_BEHIND.replace("%(queues)s", "%s").replace("%(since)s", "%s")
            cells.append(measure(explain, look, [["default"], [since]]))
            print(f"| {20100 * step:,} | " + " | ".join(f"{ms:.2f} / {buffers:,}" for ms, buffers in cells) + " |")
        holder.rollback()
    return 0


def measure(conn: psycopg.Connection, statement: str, values: list[object]) -> tuple[float, int]:
    """Run `statement` under EXPLAIN (ANALYZE, BUFFERS), rolled back (and twice: the first plans it)."""
    for _ in range(2):
        plan = conn.execute(f"EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) {statement}", values).fetchone()[0][0]
        conn.rollback()
        conn.execute(claim.CLAIM_SESSION)
    top = plan["Plan"]
    return plan["Execution Time"], top.get("Shared Hit Blocks", 0) + top.get("Shared Read Blocks", 0)


if __name__ == "__main__":
    raise SystemExit(main())
