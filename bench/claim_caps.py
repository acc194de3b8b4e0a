"""The claim statement's cost with and without per-worker kind caps.

    .venv/bin/python bench/claim_caps.py                        # 400 claims of each variant
    .venv/bin/python bench/claim_caps.py --base 6ee10ed         # also the claim statement of that revision

On a fresh database (`bench_claim_caps`) of the embedded server, `--rows` pending jobs of three kinds
(one in three of each) wait in one queue. Each claim takes `--batch` jobs (what a saturated worker's claim
takes) in a transaction that is rolled back, so every claim sees the same table. The variants take turns
(one claim of each, then again), so a burst of load elsewhere on the machine hits them all alike:

* `base`: the CLAIM_JOBS of `--base REV` (read with `git show`), when given;
* `no cap`: CLAIM_JOBS, no kind at its cap (what a worker without caps sends);
* `cap trims`: CLAIM_JOBS_CAPPED, one kind with 3 free slots, fewer than the claim takes (the per-kind window);
* `kind full`: CLAIM_JOBS, one kind at its cap, so the walk skips its rows.

Prints the median and p95 of each variant's round trip (planning included: this script sends each claim
unprepared, to compare the statements' plans; the worker prepares its claim once, store/claim.py), and the
median planning and execution time the server reports for it (EXPLAIN ANALYZE, timing off).
Run from the repository root so `dygo db url` finds the project's embedded server (.dygo/pg).
"""

from __future__ import annotations

import argparse
import ast
import statistics
import subprocess
import sys
import time
from typing import Any

import psycopg
from common import ROOT, log
from dygo.store import claim
from dygo.store.migrate import migrate
from psycopg.conninfo import make_conninfo

DATABASE = "bench_claim_caps"
KINDS = ("bench.a", "bench.b", "bench.c")


def base_statement(revision: str) -> str:
    """CLAIM_JOBS at `revision`: a string constant of store/claim.py, or, before that module, built by
    store/queries.py (whose free-slots parameter was `limits`)."""
    shown = subprocess.run(
        ["git", "show", f"{revision}:store/claim.py"], cwd=ROOT, check=False, capture_output=True, text=True
    )
    if shown.returncode == 0:
        for node in ast.parse(shown.stdout).body:
            if isinstance(node, ast.Assign) and [t.id for t in node.targets if isinstance(t, ast.Name)] == [
                "CLAIM_JOBS"
            ]:
                return ast.literal_eval(node.value)
        raise SystemExit(f"no CLAIM_JOBS in {revision}:store/claim.py")
    source = subprocess.run(
        ["git", "show", f"{revision}:store/queries.py"], cwd=ROOT, check=True, capture_output=True, text=True
    ).stdout
    namespace: dict[str, Any] = {}
    exec(compile(source, f"{revision}:store/queries.py", "exec"), namespace)  # constants only
    return namespace["CLAIM_JOBS"].replace("%(limits)s", "%(slots)s")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=30_000, help="pending jobs in the queue")
    parser.add_argument("--batch", type=int, default=100, help="jobs one claim takes")
    parser.add_argument("--claims", type=int, default=400, help="claims of each variant")
    parser.add_argument("--base", metavar="REV", help="also time the claim statement of this git revision")
    parser.add_argument("--url", help="server URL (default: `dygo db url`); the database is recreated on it")
    args = parser.parse_args()

    server = (
        args.url
        or subprocess.run(
            [str(ROOT / ".venv" / "bin" / "dygo"), "db", "url"], cwd=ROOT, check=True, capture_output=True, text=True
        ).stdout.strip()
    )
    with psycopg.connect(server, autocommit=True) as admin:
        admin.execute(f"DROP DATABASE IF EXISTS {DATABASE}")
        admin.execute(f"CREATE DATABASE {DATABASE}")
    url = make_conninfo(server, dbname=DATABASE)
    with psycopg.connect(url, autocommit=True) as conn:
        migrate(conn)
        conn.execute(
            "INSERT INTO dygo_jobs (kind, queue) SELECT (%s::text[])[1 + g %% 3], 'default' "
            "FROM generate_series(1, %s) AS g",
            (list(KINDS), args.rows),
        )
        conn.execute("VACUUM ANALYZE dygo_jobs")

        common = {
            "queues": ["default"],
            "slots": [args.batch],
            "owner": "bench",
            "ttl": 30.0,
            "kind_attempts": "{}",
            "max_attempts": 20,
        }
        variants: dict[str, tuple[str, dict[str, Any]]] = {}
        if args.base:
            variants["base"] = (base_statement(args.base), common)
        variants["no cap"] = (claim.CLAIM_JOBS, {**common, "full_kinds": [], "cap_kinds": [], "cap_free": []})
        variants["cap trims"] = (
            claim.CLAIM_JOBS_CAPPED,
            {**common, "full_kinds": [], "cap_kinds": [KINDS[0]], "cap_free": [3]},
        )
        variants["kind full"] = (
            claim.CLAIM_JOBS,
            {**common, "full_kinds": [KINDS[0]], "cap_kinds": [], "cap_free": []},
        )
        timings: dict[str, list[float]] = {name: [] for name in variants}
        planning: dict[str, list[float]] = {name: [] for name in variants}
        executing: dict[str, list[float]] = {name: [] for name in variants}
        claimed: dict[str, int] = {}
        for _ in range(args.claims):
            for name, (statement, params) in variants.items():
                conn.execute("BEGIN")
                start = time.perf_counter()
                rows = conn.execute(statement, params, prepare=False).fetchall()
                timings[name].append((time.perf_counter() - start) * 1000)
                conn.execute("ROLLBACK")
                claimed[name] = len(rows)
                # The server's own account, steadier than a round trip on a busy machine.
                conn.execute("BEGIN")
                explain = "EXPLAIN (ANALYZE, TIMING OFF, SUMMARY, FORMAT JSON) " + statement
                summary = conn.execute(explain, params, prepare=False).fetchone()[0][0]
                conn.execute("ROLLBACK")
                planning[name].append(summary["Planning Time"])
                executing[name].append(summary["Execution Time"])

    log(f"{args.rows} pending jobs, claims of {args.batch}, {args.claims} of each variant, taking turns")
    print(f"{'variant':<10} {'jobs':>5} {'median ms':>10} {'p95 ms':>8} {'planning ms':>12} {'execution ms':>13}")
    for name, samples in timings.items():
        samples.sort()
        p95 = samples[int(len(samples) * 0.95) - 1]
        print(
            f"{name:<10} {claimed[name]:>5} {statistics.median(samples):>10.2f} {p95:>8.2f} "
            f"{statistics.median(planning[name]):>12.3f} {statistics.median(executing[name]):>13.3f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
