"""Whether the worker's hand-written encodings still pay against psycopg's own adapters, on a claim and a
settle of a `--batch`-job batch (100 by default), in this process's CPU.

    .venv/bin/python bench/claim_encoding.py                 # 300 rounds of each variant
    .venv/bin/python bench/claim_encoding.py --rounds 1000 --batch 100

On a fresh database (`bench_claim_encoding` on the embedded server) it measures, per call, the CPU of this
process (user + system: `time.process_time`), the variants taking turns so that load elsewhere hits them alike:

* the claim's arrays: CLAIM_JOBS sent with its parameters as array literals (store/codecs.py, what
  store/claim.py sends) or as Python lists (psycopg's list dumping), its rows loaded and made ClaimRows
  (in a transaction rolled back: every call claims the same jobs);
* the claim's JSON loader: the same claim on a claim session (store/claim.py claim_session: store/codecs.py
  load_json for `args` and `meta`) and on one with psycopg's (json.loads);
* the settle's arrays: SETTLE_SETTINGS and a settle statement pipelined as store/leases.py settle sends them,
  with its parameters as array literals or as Python lists, for a batch of successes (the usual one) and a
  batch half retried with errors and tracebacks (nine arrays) (rolled back: every call settles the same jobs);
* the store's own calls, for scale: store/claim.py claim_jobs on a claim session and store/leases.py settle,
  each on a fresh batch, committed.

A copy pays when its saving is a clear share of the store's own call: more than 10% of its CPU.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parent))
from run import embedded_server_url, fresh_database  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
import bench_jobs  # noqa: E402, F401  (registers bench.noop)
from dygo.store import claim  # noqa: E402
from dygo.store.codecs import array, plain_array  # noqa: E402
from dygo.store.enqueue import enqueue_many  # noqa: E402
from dygo.store.leases import SETTLE_SETTINGS, ClaimedJob, Succeeded, settle  # noqa: E402
from dygo.store.migrate import migrate  # noqa: E402
from dygo.store.registry import registry  # noqa: E402
from dygo.store.sql.leases import SETTLE_SUCCEEDED, SETTLE_UNSUCCESSFUL  # noqa: E402

DATABASE = "bench_claim_encoding"
ARGS = {"user_id": 123456, "email": "someone@example.com", "plan": "pro"}  # a job's arguments, as an example
ERROR = 'ValueError: bad "input" at C:\\data\\in.csv, line 3'
TRACEBACK = 'Traceback (most recent call last):\n  File "jobs/x.py", line 12, in run\n' + ERROR


def claim_params(batch: int, encode: bool) -> dict[str, Any]:
    """CLAIM_JOBS's parameters for one queue, as store/claim.py builds them (encode) or as Python lists."""
    kind_attempts, default = registry.max_attempts_at_claim()
    wanted = {"default": batch}
    lists = {
        "queues": list(wanted),
        "slots": list(wanted.values()),
        "full_kinds": [],
        **{  # one segment, from the head (claim.walk_segments)
            "walk_queues": list(wanted),
            "walk_tops": [claim.TOP_PRIORITY],
            "walk_bottoms": [claim.BOTTOM_PRIORITY],
            "walk_since": [None],
        },
    }
    return {
        **({name: array(values) for name, values in lists.items()} if encode else lists),
        "owner": "bench",
        "ttl": 30.0,
        "kind_attempts": kind_attempts,
        "max_attempts": default,
    }


async def claim_rolled_back(conn: psycopg.AsyncConnection[Any], batch: int, encode: bool) -> float:
    """CPU seconds of one claim statement (parameters built, sent, rows loaded), rolled back."""
    await conn.execute("BEGIN")
    began = time.process_time()
    cursor = conn.cursor(row_factory=claim.claim_rows)
    rows = await (await cursor.execute(claim.CLAIM_JOBS, claim_params(batch, encode))).fetchall()
    spent = time.process_time() - began
    await conn.execute("ROLLBACK")
    assert len(rows) == batch, rows
    return spent


def settle_params(jobs: list[ClaimedJob], mixed: bool, encode: bool) -> list[tuple[str, dict[str, Any]]]:
    """The settle's statements and parameters as store/leases.py settle builds them (encode) or as lists."""
    half = len(jobs) // 2 if mixed else len(jobs)
    successes, others = jobs[:half], jobs[half:]
    ints = (lambda values: plain_array(map(str, values))) if encode else list
    texts = plain_array if encode else list
    values = array if encode else list
    statements = []
    if successes:
        ids = ints([job.id for job in successes])
        params = {
            "lock": ints([job.id for job in jobs]) if others else ids,
            "ids": ids,
            "tokens": texts([job.lease_token for job in successes]),
            "results": values([None] * len(successes)),
            "fractions": None,
            "messages": None,
        }
        statements.append((SETTLE_SUCCEEDED, params))
    if others:
        ids = ints([job.id for job in others])
        params = {
            "lock": ids,
            "ids": ids,
            "tokens": texts([job.lease_token for job in others]),
            "states": values(["pending"] * len(others)),
            "delays": values([30.0] * len(others)),
            "refunds": values([False] * len(others)),
            "errors": values([ERROR] * len(others)),
            "tracebacks": values([TRACEBACK] * len(others)),
            "fractions": None,
            "messages": None,
        }
        statements.append((SETTLE_UNSUCCESSFUL, params))
    return statements


async def settle_rolled_back(
    conn: psycopg.AsyncConnection[Any], jobs: list[ClaimedJob], mixed: bool, encode: bool
) -> float:
    """CPU seconds of one settle's pipeline (parameters built, sent, ids read back), rolled back."""
    await conn.execute("BEGIN")
    began = time.process_time()
    cursors = []
    async with conn.pipeline():
        await conn.execute(SETTLE_SETTINGS)
        for statement, params in settle_params(jobs, mixed, encode):
            cursors.append(await conn.execute(statement, params))
    settled = [row[0] for cursor in cursors for row in await cursor.fetchall()]
    spent = time.process_time() - began
    await conn.execute("ROLLBACK")
    assert len(settled) == len(jobs), settled
    return spent


async def timed(call: Callable[[], Awaitable[Any]]) -> tuple[float, Any]:
    began = time.process_time()
    result = await call()
    return time.process_time() - began, result


async def measure(url: str, rounds: int, batch: int) -> dict[str, list[float]]:
    connect = psycopg.AsyncConnection.connect
    async with (
        await connect(url, autocommit=True) as session,
        await connect(url, autocommit=True) as plain_json,
        await connect(url, autocommit=True) as settler,
    ):
        await claim.claim_session(session)
        await claim.claim_session(plain_json)
        psycopg.types.json.set_json_loads(json.loads, plain_json)  # psycopg's own loader again
        held = (await claim.claim_jobs(session, {"default": batch}, "bench", 600.0)).jobs  # settled rolled back
        samples: dict[str, list[float]] = {}

        def add(name: str, seconds: float) -> None:
            samples.setdefault(name, []).append(seconds)

        for i in range(rounds + 5):  # the first 5: statements prepared, plans cached
            keep = i >= 5
            for encode in (True, False) if i % 2 else (False, True):
                label = "literals" if encode else "psycopg lists"
                spent = await claim_rolled_back(session, batch, encode)
                if keep:
                    add(f"claim arrays: {label}", spent)
                for mixed in (False, True):
                    spent = await settle_rolled_back(settler, held, mixed, encode)
                    if keep:
                        add(f"settle {'half retried' if mixed else 'succeeded'} arrays: {label}", spent)
            for conn, label in ((session, "claim_session's"), (plain_json, "psycopg's json.loads")):
                spent = await claim_rolled_back(conn, batch, True)
                if keep:
                    add(f"claim JSON loader: {label}", spent)
            spent, got = await timed(lambda: claim.claim_jobs(session, {"default": batch}, "bench", 30.0))
            assert len(got.jobs) == batch, "enqueue more jobs"
            if keep:
                add("store claim_jobs (session, committed)", spent)
            spent, settled = await timed(lambda got=got: settle(settler, [Succeeded(job, None) for job in got.jobs]))
            assert len(settled) == batch
            if keep:
                add("store settle (succeeded, committed)", spent)
        return samples


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=300, help="calls of each variant")
    parser.add_argument("--batch", type=int, default=100, help="jobs per claim and per settle")
    args = parser.parse_args()
    url = fresh_database(embedded_server_url(), DATABASE)
    with psycopg.connect(url, autocommit=True) as conn:
        migrate(conn)
        jobs = [{"kind": "bench.noop", "args": ARGS}] * (args.batch * (args.rounds + 6))
        for start in range(0, len(jobs), 5000):
            enqueue_many(conn, jobs[start : start + 5000])
        conn.execute("VACUUM ANALYZE dygo_jobs")
    samples = asyncio.run(measure(url, args.rounds, args.batch))
    print(f"{args.batch} jobs per call, {args.rounds} calls of each; this process's CPU per call, median (p25-p75)")
    for name, values in samples.items():
        q1, q2, q3 = statistics.quantiles([v * 1e6 for v in values], n=4)
        print(f"  {name:<48} {q2:>8,.0f} us  ({q1:,.0f}-{q3:,.0f})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
