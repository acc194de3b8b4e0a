"""What the ways of counting workflow jobs (bench/workflow_triggers.py) cost a plain job's updates and deletes,
timed by the server itself.

    .venv/bin/python bench/trigger_cost.py                          # batches of 1, 4 and 100; 15 rounds
    .venv/bin/python bench/trigger_cost.py --batches 4 --rounds 15 --pairs 1000

On a fresh database (`bench_trigger_cost`), for each variant in turn (the variants take turns in every round,
so a noisy minute hits them alike): plain jobs are written with COPY, then claimed and settled `--batch` at a
time, `--pairs` times, with a claim-like update (pending -> active, with a lease: what store/claim.py's claim
sets) and a settle-like one (active -> succeeded: what store/sql/leases.py's settle sets), each its own
transaction, and finally deleted 1,000 at a time as retention deletes them. Every statement runs under
`EXPLAIN (ANALYZE, FORMAT JSON)`, whose execution time includes the after triggers it fires and whose trigger
lines time each trigger's function (not the transition tables' capture, which is in the update's own time).

It prints, per variant, the median execution time of each kind of statement, its difference from `none`
(migration 0016's update triggers: no workflow counting) round by round, and the median time of the
functions of its update and delete triggers (wake-ups and result waiters included: every variant has them).
Besides the variants, `capture` is `none` plus statement triggers with migration 0017's transition tables
whose functions return at once: what keeping the OLD rows costs, apart from the functions. The order of the
variants turns each round. Times are wall times inside the server: no client round trip, no commit's WAL flush.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parent))
import workflow_triggers  # noqa: E402
from common import log  # noqa: E402
from run import background_load, embedded_server_url, fresh_database  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from dygo.store import enqueue_many  # noqa: E402
from dygo.store.config import load_settings  # noqa: E402
from dygo.store.loading import load_jobs  # noqa: E402
from dygo.store.migrate import migrate  # noqa: E402

DATABASE = "bench_trigger_cost"
EXPLAIN = "EXPLAIN (ANALYZE, FORMAT JSON) "
CLAIM = """UPDATE dygo_jobs SET state = 'active', attempt = attempt + 1, started_at = now(), lease_owner = 'bench',
    lease_token = gen_random_uuid(), lease_deadline = now() + interval '30 seconds'
WHERE id = ANY(%s) AND state = 'pending'"""
SETTLE = """UPDATE dygo_jobs SET state = 'succeeded', finished_at = now(), result = NULL,
    lease_owner = NULL, lease_token = NULL, lease_deadline = NULL
WHERE id = ANY(%s) AND state = 'active'"""
DELETE = "DELETE FROM dygo_jobs WHERE id = ANY(%s)"
KINDS = ("claim", "settle", "delete")
# The update and delete triggers of every variant: their functions' time is shown apart.
TIMED_TRIGGERS = (*workflow_triggers.TRIGGERS, "bench_moved", "bench_removed")

# `capture`: migration 0017's transition tables kept, nothing done with them.
CAPTURE = """
CREATE OR REPLACE FUNCTION bench_nothing() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN RETURN NULL; END $$;
CREATE TRIGGER bench_moved AFTER UPDATE ON dygo_jobs REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION bench_nothing();
CREATE TRIGGER bench_removed AFTER DELETE ON dygo_jobs REFERENCING OLD TABLE AS old_rows
    FOR EACH STATEMENT EXECUTE FUNCTION bench_nothing();
"""

Times = dict[str, list[float]]  # statement kind (and "<kind> trigger") -> ms of each statement


def timed(conn: psycopg.Connection, statement: str, ids: list[int], kind: str, times: Times) -> None:
    row = conn.execute(EXPLAIN + statement, (ids,)).fetchone()
    assert row is not None
    plan: dict[str, Any] = (row[0] if isinstance(row[0], list) else json.loads(row[0]))[0]
    times[kind].append(plan["Execution Time"])
    triggered = [t["Time"] for t in plan.get("Triggers", []) if t["Trigger Name"] in TIMED_TRIGGERS]
    times[f"{kind} trigger"].append(sum(triggered))


def install(conn: psycopg.Connection, variant: str) -> None:
    conn.execute("DROP TRIGGER IF EXISTS bench_moved ON dygo_jobs")
    conn.execute("DROP TRIGGER IF EXISTS bench_removed ON dygo_jobs")
    workflow_triggers.install(conn, "none" if variant == "capture" else variant)
    if variant == "capture":
        conn.execute(CAPTURE)


def one_round(conn: psycopg.Connection, variant: str, pairs: int, batch: int) -> Times:
    install(conn, variant)
    ids = [job.id for job in enqueue_many(conn, [{"kind": "example.noop"}] * (pairs * batch))]
    conn.execute("VACUUM ANALYZE dygo_jobs")
    times: Times = defaultdict(list)
    for start in range(0, len(ids), batch):
        chunk = ids[start : start + batch]
        timed(conn, CLAIM, chunk, "claim", times)
        timed(conn, SETTLE, chunk, "settle", times)
    for start in range(0, len(ids), 1000):
        timed(conn, DELETE, ids[start : start + 1000], "delete", times)
    return times


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 4, 100], help="jobs per claim and settle")
    parser.add_argument("--pairs", type=int, default=500, help="claims and settles per variant and round")
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument(
        "--variants",
        type=lambda text: text.split(","),
        default=["capture", *workflow_triggers.VARIANTS],
        help=f"comma-separated, of capture,{','.join(workflow_triggers.VARIANTS)}; none is always run",
    )
    args = parser.parse_args()
    variants = list(dict.fromkeys(["none", *args.variants]))
    load_jobs(load_settings(ROOT / "config"))
    url = fresh_database(embedded_server_url(), DATABASE)
    log(f"background load before the run: {background_load():.2f} cores busy")
    with psycopg.connect(url, autocommit=True) as conn:
        migrate(conn)
        for batch in args.batches:
            rounds: dict[str, list[Times]] = {v: [] for v in variants}
            for number in range(1, args.rounds + 1):
                turn = number % len(variants)  # each variant in each place in turn
                for variant in variants[turn:] + variants[:turn]:
                    rounds[variant].append(one_round(conn, variant, args.pairs, batch))
                log(
                    f"batch {batch}, round {number}: settle median "
                    + ", ".join(f"{v} {statistics.median(rounds[v][-1]['settle']) * 1000:.0f} us" for v in variants)
                )
            print(report(batch, args.pairs, rounds), flush=True)
    log(f"background load after the run: {background_load():.2f} cores busy")
    return 0


def report(batch: int, pairs: int, rounds: dict[str, list[Times]]) -> str:
    count = len(rounds["none"])
    lines = [
        f"batches of {batch}: {pairs} claims and settles and {-(-pairs * batch // 1000)} deletes of up to 1,000 "
        f"per variant and round, {count} rounds. us per statement: the median over all rounds; 'added': the "
        f"round's median less none's in the same round, median (lowest to highest) of the rounds; 'trigger': "
        f"the update and delete triggers' functions"
    ]
    for variant, runs in rounds.items():
        cells = []
        for kind in KINDS:
            pooled = [x for times in runs for x in times[kind]]
            added = sorted(
                statistics.median(mine[kind]) - statistics.median(base[kind])
                for mine, base in zip(runs, rounds["none"], strict=True)
            )
            trigger = [x for times in runs for x in times[f"{kind} trigger"]]
            cells.append(
                f"{kind} {statistics.median(pooled) * 1000:6.1f}"
                + (
                    f" (trigger {statistics.median(trigger) * 1000:.1f})"
                    if variant == "none"
                    else f" (added {statistics.median(added) * 1000:+5.1f}, {added[0] * 1000:+.1f} to "
                    f"{added[-1] * 1000:+.1f}; trigger {statistics.median(trigger) * 1000:.1f})"
                )
            )
        lines.append(f"  {variant:>9}: " + "; ".join(cells))
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
