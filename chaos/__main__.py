"""`python -m chaos` (what `make chaos` runs): every fault-injection scenario, the report table, exit 1 on any problem.

.venv/bin/python -m chaos                               # full: 10,000 jobs per scenario
.venv/bin/python -m chaos --short --scenario kill       # the short version of one scenario
.venv/bin/python -m chaos --markdown chaos/results.md --json chaos/results.json
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from dygo.store import embedded

from chaos.runner import REPO, SCENARIOS, Lab, Plan, as_json, run, table


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m chaos", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--scenario",
        action="append",
        choices=list(SCENARIOS),
        dest="scenarios",
        help="run only this scenario (repeatable; default: all)",
    )
    parser.add_argument("--short", action="store_true", help="the short version inside `make test`")
    parser.add_argument("--jobs", type=int, help="jobs per scenario (full default 10000)")
    parser.add_argument("--faults", type=int, help="fault events per scenario (full default 12)")
    parser.add_argument("--job-seconds", type=float, help="mean duration of an ordinary job (default 0.05)")
    parser.add_argument("--workers", type=int, help="worker processes (default 3)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--data-dir",
        type=Path,
        default=REPO / ".dygo" / "chaos",
        help="the embedded PostgreSQL this suite starts, stops and restarts (default .dygo/chaos)",
    )
    parser.add_argument(
        "--pgbouncer",
        action="store_true",
        help="workers go through a PgBouncer of the suite's own in transaction mode (LISTEN on DATABASE_DIRECT_URL)",
    )
    parser.add_argument("--markdown", type=Path, help="also write the table here")
    parser.add_argument("--json", type=Path, help="also write every figure and note here")
    args = parser.parse_args(argv)
    plan = Plan.short() if args.short else Plan()
    for name in ("jobs", "faults", "job_seconds", "workers"):
        if getattr(args, name) is not None:
            setattr(plan, name, getattr(args, name))
    was_running = embedded.status(args.data_dir).running
    lab = Lab(args.data_dir, args.data_dir / "logs", pgbouncer=args.pgbouncer)
    started = time.monotonic()
    try:
        reports = run(args.scenarios or list(SCENARIOS), plan, lab, seed=args.seed)
    finally:
        lab.close()
        if not was_running:  # the suite's own server: no reason to leave it running
            embedded.stop(args.data_dir)
    took = time.monotonic() - started
    print(table(reports))
    print(f"\n{sum(r.jobs for r in reports):,} jobs in {took:.0f}s; worker logs in {lab.logs}")
    for report in reports:
        for problem in report.problems:
            print(f"PROBLEM {report.scenario}: {problem}", file=sys.stderr)
    if args.markdown:
        args.markdown.write_text(table(reports) + "\n")
    if args.json:
        args.json.write_text(as_json(reports) + "\n")
    return 0 if all(r.ok for r in reports) else 1


if __name__ == "__main__":
    sys.exit(main())
