"""A batch's rows as the JSON text INSERT_JOBS reads: store/enqueue.py's writer against json.dumps, per job.

    .venv/bin/python bench/batch_rows.py                 # batches of 1,000 plain jobs, 9 rounds
    .venv/bin/python bench/batch_rows.py --batch 100 --rounds 15

No database: the encoding alone. A batch of `--batch` plain jobs (a registered kind, small args, no option)
goes through `store.enqueue.prepare` as `aenqueue_many` does, then its rows are written as one JSON array by:

* `writer`: store/enqueue.py `rows_json`, each row's text put together around its values' JSON (the args and
  meta are JSON text already, from `prepare`);
* `json.dumps`: one `json.dumps` of the row objects, so the args and meta are parsed back and encoded again
  (json.dumps cannot take JSON text as a value).

It prints this process's CPU µs per job of each, median over the rounds, beside `prepare`'s own µs per job
(what the batch costs this process before the encoding).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any


def by_json_dumps(rows: list[dict[str, Any]]) -> str:
    return json.dumps(
        [
            {
                "kind": r["kind"],
                "queue": r["queue"],
                "args": json.loads(r["args"]),
                "meta": json.loads(r["meta"]),
                "priority": r["priority"],
                "run_at": None if r["run_at"] is None else r["run_at"].isoformat(),
                "delay": r["delay"],
                "max_attempts": r["max_attempts"],
            }
            for r in rows
        ]
    )


def per_job(work: Callable[[], Any], jobs: int, rounds: int) -> float:
    times = []
    for _ in range(rounds):
        started = time.process_time()  # this process's CPU: other processes on the machine do not count
        work()
        times.append(time.process_time() - started)
    return statistics.median(times) / jobs * 1e6


def main() -> None:
    from dygo.store.enqueue import JobRequest, prepare, rows_json
    from dygo.store.registry import Registry, job

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, default=1000, help="jobs in a batch")
    parser.add_argument("--rounds", type=int, default=9, help="rounds (median)")
    args = parser.parse_args()

    jobs = Registry()
    jobs.queues = ["default"]

    @job("email.send", registry=jobs)
    async def send(ctx: Any, args: Any) -> None: ...

    payload = [{"to": f"user{i}@example.com", "template": "welcome"} for i in range(args.batch)]
    requests = [JobRequest("email.send", each) for each in payload]
    rows = [prepare(request, jobs, trace={}) for request in requests]
    assert rows_json(rows) == by_json_dumps(rows)
    print(f"Python {sys.version.split()[0]}, batches of {args.batch:,} plain jobs, median of {args.rounds} rounds")
    results = {
        "prepare": per_job(lambda: [prepare(request, jobs, trace={}) for request in requests], args.batch, args.rounds),
        "writer": per_job(lambda: rows_json(rows), args.batch, args.rounds),
        "json.dumps": per_job(lambda: by_json_dumps(rows), args.batch, args.rounds),
    }
    for name, us in results.items():
        print(f"{name:>10}  {us:6.2f} µs per job")


if __name__ == "__main__":
    main()
