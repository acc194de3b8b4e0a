"""Benchmark dygo side by side with pgqueuer and procrastinate on the embedded PostgreSQL server.

    .venv/bin/python bench/run.py                 # everything (a few minutes), prints the table
    .venv/bin/python bench/run.py --quick         # smaller counts, for a smoke run (under a minute)
    .venv/bin/python bench/run.py --profile       # also py-spy the dygo worker during one extra round
    .venv/bin/python bench/run.py --systems dygo --markdown --json bench/results.json
    .venv/bin/python bench/run.py --systems dygo_c4,pgqueuer_default,pgqueuer_c4 --repeat 3   # issue 12, item 7

Each system gets a fresh database on the same server (bench_dygo, bench_pgqueuer,
bench_procrastinate) and runs in its own interpreter, printing one JSON line that this script
collects: dygo with .venv (`bench/dygo_bench.py`), the peers with `.venv-bench`
(`bench/peer_pgqueuer.py`, `bench/peer_procrastinate.py`). A line is a system at one setting:
`dygo` and `pgqueuer` at concurrency 200 (claims of 100), `dygo_c1000` and `pgqueuer_b500` at concurrency
1,000 with claims of 500 (each one's fastest here for a backlog of no-op jobs), `dygo_c4` at the seed's default
concurrency 4, `pgqueuer_default` with pgqueuer's own defaults (batch 10, no concurrency cap) and
`pgqueuer_c4` capped at 4 concurrent tasks (batch 2: its cap must be at least twice the batch).
Peers are skipped, with a note, when `.venv-bench` or their package is missing. Set it up once with:

    python3 -m venv .venv-bench
    .venv-bench/bin/pip install pgqueuer procrastinate 'psycopg[binary,pool]' asyncpg py-spy

What is measured, and how, is described in bench/common.py and bench/README.md.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import shutil
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, replace
from functools import partial
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import psycopg
from common import (
    BENCH_DIR,
    ROOT,
    Plan,
    Result,
    log,
    machine_busy_seconds,
    percentile,
    percentiles,
    plan_arguments,
)
from psycopg.conninfo import make_conninfo

PEER_VENV = ROOT / ".venv-bench"

# What dygo must beat (the issue); p50/p95/p99 are ceilings in ms, the rest floors in jobs/s.
TARGETS = {"enqueue_one": 2_500, "enqueue_batched": 60_000, "processed": 6_000, "p50_ms": 3.0, "p99_ms": 8.0}


@dataclass(frozen=True)
class System:
    name: str  # the line's name: a system at one setting
    script: str
    python: Path
    needs: tuple[str, ...]  # modules that must import in `python`
    settings: tuple[str, ...] = ()  # the script's options for this line

    @property
    def ours(self) -> bool:
        return self.name.startswith("dygo")


def main() -> int:
    args = parse_arguments()
    server_url = args.server_url or embedded_server_url()
    log(f"server: {server_url}")
    loads = [background_load()]
    log(f"background load before the run: {loads[0]:.2f} of {os.cpu_count()} cores busy")

    base = Plan(url="")
    if args.quick:
        base = replace(
            base, one_jobs=1_000, batched_jobs=10_000, process_jobs=5_000, process_rounds=2, latency_jobs=100
        )
    if args.latency_jobs:
        base = replace(base, latency_jobs=args.latency_jobs)
    systems, notes = available_systems(args.systems)
    passes: dict[str, list[Result]] = {system.name: [] for system in systems}
    failed = False
    for number in range(1, args.repeat + 1):  # systems take turns, so a noisy minute hits them alike
        for system in systems:
            log(f"--- {system.name}, pass {number} of {args.repeat} ({system.python})")
            url = fresh_database(server_url, f"bench_{system.name}")
            checkpoint(server_url)  # every system starts from the same WAL state
            profile = args.profile and number == 1
            result = run_system(system, replace(base, url=url), [*system.settings, *system_arguments(system, profile)])
            if result is None:
                failed = True
                notes.append(f"{system.name} failed in pass {number}; see its output above")
            else:
                passes[system.name].append(replace(result, system=system.name))
            loads.append(background_load())  # idle again: anything busy now is not ours
    results = [combine(runs) for runs in passes.values() if runs]

    print()
    print(markdown_table(results) if args.markdown else text_table(results))
    for result in results:
        print(f"  {result.system}: {result.settings}")
        for line in result.notes:
            print(f"    {line}")
    print(f"  machine: {os.cpu_count()} cores; background load between systems: up to {max(loads):.2f} cores")
    if args.repeat > 1:
        print(
            f"  rates: the median of {args.repeat} passes (each pass: the median of its rounds); "
            f"latency: the percentiles of all passes' samples together"
        )
    for note in notes:
        print(f"  note: {note}")
    dygo = next((r for r in results if r.system == "dygo"), None)
    if dygo is not None:
        print(target_report(dygo))
        if len(results) > 1:
            print(peer_report(passes))
    print(small_concurrency_report(results))
    print(limit_cost_report(passes))
    print(workflow_overhead_report(passes))
    for result in results:
        if result.profile:
            print(f"\n{result.system}:", profile_report(result.profile))
    if args.json:
        Path(args.json).write_text(json.dumps([asdict(r) for r in results], indent=2) + "\n")
        log(f"wrote {args.json}")
    return 1 if failed else 0


def parse_arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--systems",
        type=lambda text: text.split(","),
        default=[s.name for s in all_systems()],
        help=f"comma-separated subset of {','.join(s.name for s in all_systems())}",
    )
    parser.add_argument("--quick", action="store_true", help="smaller counts: a smoke run")
    parser.add_argument(
        "--repeat",
        type=int,
        default=1,
        metavar="N",
        help="run every system N times, taking turns; report the median of the passes",
    )
    parser.add_argument("--profile", action="store_true", help="py-spy the dygo worker in one extra round")
    parser.add_argument(
        "--latency-jobs",
        type=int,
        metavar="N",
        help="jobs in each latency round (default 200; more makes the p99 less of a single sample)",
    )
    parser.add_argument("--markdown", action="store_true", help="print the table as Markdown")
    parser.add_argument("--json", metavar="PATH", help="also write the full results (rounds, CPU, profile) here")
    parser.add_argument("--server-url", help="PostgreSQL server to use (default: `dygo db url`, the embedded one)")
    return parser.parse_args()


def all_systems() -> list[System]:
    peer_python = PEER_VENV / "bin" / "python"
    dygo = partial(System, script="dygo_bench.py", python=Path(sys.executable), needs=("dygo.store",))
    pgqueuer = partial(System, script="peer_pgqueuer.py", python=peer_python, needs=("pgqueuer", "asyncpg", "uvloop"))
    return [
        dygo("dygo"),
        # dygo with a cluster-wide limit it never reaches (issue 13: at least 85% of dygo's rate).
        # A limit the queue never reaches, beside its twin without one (bench/README.md, "A limit never reached").
        dygo("dygo-concurrency-limited", settings=("--limit", "concurrency")),
        dygo("dygo-rate-limited", settings=("--limit", "rate")),
        dygo("dygo_c4", settings=("--concurrency", "4")),
        dygo("dygo_c4-concurrency-limited", settings=("--concurrency", "4", "--limit", "concurrency")),
        dygo("dygo_c4-rate-limited", settings=("--concurrency", "4", "--limit", "rate")),
        # Larger claims for a backlog at pgqueuer_b500's concurrency: the fastest setting here (issue 12, item 7).
        dygo("dygo_c1000", settings=("--concurrency", "1000", "--claim-batch-size", "500")),
        # The same code with migration 0017's workflow triggers dropped (what workflows cost plain jobs), or
        # counted another way (bench/workflow_triggers.py: row triggers; a third update trigger of its own).
        dygo("dygo_no_workflows", settings=("--workflow-triggers", "none")),
        dygo("dygo_c4_no_workflows", settings=("--concurrency", "4", "--workflow-triggers", "none")),
        dygo("dygo_row_workflows", settings=("--workflow-triggers", "row")),
        dygo("dygo_c4_row_workflows", settings=("--concurrency", "4", "--workflow-triggers", "row")),
        dygo("dygo_separate_workflows", settings=("--workflow-triggers", "separate")),
        dygo("dygo_c4_separate_workflows", settings=("--concurrency", "4", "--workflow-triggers", "separate")),
        # The same without claiming ahead (claim_ahead 0): a claim only for free slots, as before it.
        dygo("dygo_c4_exact", settings=("--concurrency", "4", "--claim-ahead", "0")),
        pgqueuer("pgqueuer"),
        pgqueuer("pgqueuer_b500", settings=("--worker-batch-size", "500", "--max-concurrent-tasks", "1000")),
        pgqueuer("pgqueuer_default", settings=("--worker-batch-size", "10", "--max-concurrent-tasks", "0")),
        pgqueuer("pgqueuer_c4", settings=("--worker-batch-size", "2", "--max-concurrent-tasks", "4")),
        System("procrastinate", "peer_procrastinate.py", peer_python, ("procrastinate", "psycopg")),
    ]


def available_systems(names: list[str]) -> tuple[list[System], list[str]]:
    """The systems asked for that can run here, and a note for each one skipped."""
    systems, notes = [], []
    for system in all_systems():
        if system.name not in names:
            continue
        missing = unavailable(system)
        if missing:
            notes.append(f"{system.name} skipped: {missing}")
            log(notes[-1])
        else:
            systems.append(system)
    return systems, notes


def system_arguments(system: System, profile: bool) -> list[str]:
    if system.ours and profile:
        py_spy = PEER_VENV / "bin" / "py-spy"
        binary = str(py_spy) if py_spy.exists() else shutil.which("py-spy")
        if binary:
            return ["--profile-with", binary]
        log("no py-spy (pip install py-spy into .venv-bench): dygo runs without the profile")
    return []


# --- the server and its databases ---------------------------------------------------------------------------


def embedded_server_url() -> str:
    """`dygo db url`: starts the embedded server if needed."""
    dygo = Path(sys.executable).with_name("dygo")
    return subprocess.run([str(dygo), "db", "url"], check=True, capture_output=True, text=True, cwd=ROOT).stdout.strip()


def database_url(server_url: str, name: str) -> str:
    """The server URL naming another database. Kept a URI where it is one: asyncpg reads URIs only."""
    if "://" in server_url:
        return urlunsplit(urlsplit(server_url)._replace(path=f"/{name}"))
    return make_conninfo(server_url, dbname=name)


def fresh_database(server_url: str, name: str) -> str:
    with psycopg.connect(server_url, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}"')
    return database_url(server_url, name)


def checkpoint(server_url: str) -> None:
    with psycopg.connect(server_url, autocommit=True) as conn:
        conn.execute("CHECKPOINT")


def background_load(seconds: float = 1.0) -> float:
    """Cores busy while this script waits: anything else running skews the figures."""
    before = machine_busy_seconds()
    time.sleep(seconds)
    return (machine_busy_seconds() - before) / seconds


# --- running one system -----------------------------------------------------------------------------------------


def unavailable(system: System) -> str | None:
    """Why `system` cannot run here, or None."""
    if not system.python.exists():
        return f"{system.python} not found (create .venv-bench: see bench/README.md)"
    probe = subprocess.run(
        [str(system.python), "-c", f"import {', '.join(system.needs)}"], capture_output=True, text=True, cwd=BENCH_DIR
    )
    if probe.returncode != 0:
        return f"cannot import {', '.join(system.needs)} in {system.python}: {probe.stderr.strip().splitlines()[-1]}"
    return None


def run_system(system: System, plan: Plan, extra: list[str]) -> Result | None:
    command = [str(system.python), str(BENCH_DIR / system.script), *plan_arguments(plan), *extra]
    started = time.monotonic()
    finished = subprocess.run(command, stdout=subprocess.PIPE, text=True, cwd=ROOT)  # stderr: progress, shown live
    log(f"--- {system.name} took {time.monotonic() - started:.0f}s")
    lines = finished.stdout.strip().splitlines()
    if finished.returncode != 0 or not lines:
        log(f"{system.name} exited with {finished.returncode}")
        return None
    return Result.from_json(lines[-1])


def combine(passes: list[Result]) -> Result:
    """One result from several passes of a system: the median of each rate, every round kept, and the
    latency percentiles of all passes' samples pooled (a p99 of 5 x 200 samples is the 10th slowest of
    1,000, where a median of five per-pass p99s is a median of second-slowest samples)."""
    first = passes[0]
    if len(passes) == 1:
        return first

    def median(attribute: str) -> float:
        return statistics.median(getattr(r, attribute) for r in passes)

    pooled = [x for r in passes for x in r.latency_ms]
    p50, p95, p99 = percentiles(pooled)
    return replace(
        first,
        enqueue_one=median("enqueue_one"),
        enqueue_batched=median("enqueue_batched"),
        processed=median("processed"),
        p50_ms=p50,
        p95_ms=p95,
        p99_ms=p99,
        latency_ms=pooled,
        enqueue_one_rounds=[x for r in passes for x in r.enqueue_one_rounds],
        enqueue_batched_rounds=[x for r in passes for x in r.enqueue_batched_rounds],
        rounds=[x for r in passes for x in r.rounds],
        notes=[
            f"pass {i}: enqueue one {r.enqueue_one:,.0f}/s, batched {r.enqueue_batched:,.0f}/s, processed "
            f"{r.processed:,.0f}/s, p50/p95/p99 {r.p50_ms:.2f}/{r.p95_ms:.2f}/{r.p99_ms:.2f} ms"
            for i, r in enumerate(passes, 1)
        ],
        profile=next((r.profile for r in passes if r.profile), None),
    )


# --- reporting ----------------------------------------------------------------------------------------------------

COLUMNS = [
    ("system", "system"),
    ("version", "version"),
    ("enqueue one/s", "enqueue_one"),
    ("enqueue batched/s", "enqueue_batched"),
    ("processed/s", "processed"),
    ("p50 ms", "p50_ms"),
    ("p95 ms", "p95_ms"),
    ("p99 ms", "p99_ms"),
]


def cell(value: object) -> str:
    if isinstance(value, float):
        if math.isnan(value):
            return "-"
        return f"{value:,.0f}" if value >= 100 else f"{value:.2f}"
    return str(value)


def rows(results: list[Result]) -> list[list[str]]:
    return [[cell(getattr(r, attribute)) for _, attribute in COLUMNS] for r in results]


def text_table(results: list[Result]) -> str:
    table = [[title for title, _ in COLUMNS], *rows(results)]
    widths = [max(len(row[i]) for row in table) for i in range(len(COLUMNS))]

    def line(row: list[str]) -> str:
        return "  ".join(
            value.ljust(width) if i < 2 else value.rjust(width)
            for i, (value, width) in enumerate(zip(row, widths, strict=True))
        )

    lines = [line(row) for row in table]
    return "\n".join([lines[0], "-" * len(lines[0]), *lines[1:]])


def markdown_table(results: list[Result]) -> str:
    header = "| " + " | ".join(title for title, _ in COLUMNS) + " |"
    rule = "|" + "|".join("---" if i < 2 else "---:" for i in range(len(COLUMNS))) + "|"
    return "\n".join([header, rule, *("| " + " | ".join(row) + " |" for row in rows(results))])


def target_report(dygo: Result) -> str:
    lines = ["", "dygo against its targets:"]
    for attribute, target in TARGETS.items():
        value = getattr(dygo, attribute)
        ceiling = attribute.endswith("_ms")
        ok = value <= target if ceiling else value >= target
        relation = "<=" if ceiling else ">="
        verdict = "ok  " if ok else "MISS"
        lines.append(f"  {verdict} {attribute:16} {cell(value):>8}  (target {relation} {cell(target)})")
    for r in dygo.rounds:
        lines.append(
            f"  round: {r.jobs} jobs in {r.seconds:.3f}s = {r.rate:,.0f}/s; CPU worker "
            f"{r.worker_cpu_seconds}s, PostgreSQL {r.postgres_cpu_seconds}s, "
            f"machine {r.machine_busy_seconds}s"
        )
    return "\n".join(lines)


LOWER_IS_BETTER = {"p50_ms": 50, "p95_ms": 95, "p99_ms": 99}  # latency columns, and their percentile


def peer_report(passes: dict[str, list[Result]]) -> str:
    """dygo against the best peer on every line: the margin, how many passes dygo won, and for latency a
    bootstrap 95% interval of the difference, so a gap smaller than the run's own noise reads as level."""
    ours = passes.get("dygo", [])
    peers = {name: runs for name, runs in passes.items() if name in ("pgqueuer", "procrastinate") and runs}
    if not ours or not peers:
        return ""
    mine = combine(ours)
    theirs = {name: combine(runs) for name, runs in peers.items()}
    lines = ["", "dygo against the best peer, line by line:"]
    for title, attribute in COLUMNS[2:]:
        beats = partial(better_on, attribute)
        best = next(name for name in theirs if all(not beats(theirs[other], theirs[name]) for other in theirs))
        value, peer_value = getattr(mine, attribute), getattr(theirs[best], attribute)
        margin = abs(value / peer_value - 1) * 100 if peer_value else float("nan")
        won = sum(beats(a, b) for a, b in zip(ours, peers[best], strict=False))
        line = (
            f"  {title:18} dygo {cell(value):>8}  {best} {cell(peer_value):>8}  "
            f"{'ahead' if beats(mine, theirs[best]) else 'behind'} by {margin:.1f}%; "
            f"dygo ahead in {won} of {min(len(ours), len(peers[best]))} passes"
        )
        if attribute in LOWER_IS_BETTER:
            low, high = bootstrap_difference(mine.latency_ms, theirs[best].latency_ms, LOWER_IS_BETTER[attribute])
            line += f"; dygo - {best}: 95% interval {low:+.2f} to {high:+.2f} ms"
            line += " (level: the interval holds 0)" if low <= 0 <= high else ""
        lines.append(line)
    return "\n".join(lines)


# Issue 12, item 7: dygo's processing rate at the seed's default concurrency 4 when the issue was filed, on
# a quiet machine (bench/README.md, "Per-job overhead at concurrency 4").
C4_BEFORE = 1_500


def limit_cost_report(passes: dict[str, list[Result]]) -> str:
    """Each line under a limit it never reaches against its twin without one: the ratio of their processed/s
    pass by pair (the twins ran next to each other in each pass), the median and the range."""
    lines = []
    for name, runs in passes.items():
        twin = name.split("-")[0]
        if not name.endswith("-limited") or twin not in passes:
            continue
        ratios = [a.processed / b.processed for a, b in zip(runs, passes[twin], strict=False) if b.processed]
        if ratios:
            lines.append(
                f"  {name}: {statistics.median(ratios):.0%} of {twin} (pass by pass: "
                f"{', '.join(f'{r:.0%}' for r in ratios)}; target >= 85%)"
            )
    return "\n".join(["", "a limit never reached, against no limit:", *lines]) if lines else ""


def small_concurrency_report(results: list[Result]) -> str:
    """Issue 12, item 7: dygo at concurrency 4 against its old figure and pgqueuer's defaults, and each at its best."""
    rate = {r.system: r.processed for r in results}
    lines = []
    if "dygo_c4" in rate:
        c4 = rate["dygo_c4"]
        lines.append(
            f"  dygo_c4 {c4:,.0f}/s = {c4 / C4_BEFORE:.2f} x the {C4_BEFORE:,}/s before (target >= 2; "
            f"that figure is from a quiet machine, compare only on one)"
        )
        if "dygo_c4_exact" in rate:
            exact = rate["dygo_c4_exact"]
            lines.append(
                f"  dygo_c4 {c4:,.0f}/s = {c4 / exact:.2f} x dygo_c4_exact {exact:,.0f}/s (claim_ahead 0: "
                f"claims only for free slots; this run's own before)"
            )
        for peer in ("pgqueuer_default", "pgqueuer_c4"):
            if peer in rate:
                target = " (target >= 1)" if peer == "pgqueuer_default" else ""
                lines.append(f"  dygo_c4 {c4:,.0f}/s = {c4 / rate[peer]:.2f} x {peer} {rate[peer]:,.0f}/s{target}")
    theirs = {name: value for name, value in rate.items() if name.startswith("pgqueuer")}
    ours = {name: value for name, value in rate.items() if name.startswith("dygo")}
    if theirs and ours:
        best, peer = max(ours, key=ours.__getitem__), max(theirs, key=theirs.__getitem__)
        lines.append(
            f"  best: {best} {ours[best]:,.0f}/s = {ours[best] / theirs[peer]:.2f} x {peer} "
            f"{theirs[peer]:,.0f}/s (target >= 2)"
        )
    return "\n".join(["", "processing at small concurrency and at best (issue 12, item 7):", *lines]) if lines else ""


# A line's twins: the same code with migration 0017's workflow triggers dropped, or counting another way.
WITHOUT_WORKFLOWS, OTHER_WAYS = "_no_workflows", ("_row_workflows", "_separate_workflows")


def workflow_overhead_report(passes: dict[str, list[Result]]) -> str:
    """A line and its other-way twins against its twin without the workflow triggers: processed/s pass by
    pass (the passes took turns), the pooled latency percentiles and the CPU per job (target: within 2%)."""
    lines = []
    for base, twin in passes.items():
        if not base.endswith(WITHOUT_WORKFLOWS) or not twin:
            continue
        name = base.removesuffix(WITHOUT_WORKFLOWS)
        for line in (name, *(name + way for way in OTHER_WAYS)):
            runs = passes.get(line, [])
            if not runs:
                continue
            ratios = [a.processed / b.processed for a, b in zip(runs, twin, strict=False) if b.processed]
            with_, without = combine(runs), combine(twin)
            lines.append(
                f"  {line} {with_.processed:,.0f}/s = {with_.processed / without.processed:.1%} of {base} "
                f"{without.processed:,.0f}/s (medians; pass by pass {', '.join(f'{r:.1%}' for r in ratios)}; "
                f"target >= 98%)"
            )
            lines.append(
                f"    latency p50/p95/p99 {with_.p50_ms:.2f}/{with_.p95_ms:.2f}/{with_.p99_ms:.2f} ms against "
                f"{without.p50_ms:.2f}/{without.p95_ms:.2f}/{without.p99_ms:.2f} ms"
            )
            lines.append(f"    CPU per job, worker + server (server) us, each round: {cpu_per_job(runs)}")
        lines.append(f"    {base}: {cpu_per_job(twin)}")
    if not lines:
        return ""
    return "\n".join(["", "workflows installed but unused (against the same code without their triggers):", *lines])


def cpu_per_job(runs: list[Result]) -> str:
    shown = []
    for r in (r for run in runs for r in run.rounds):
        total = 1e6 * (r.worker_cpu_seconds + r.postgres_cpu_seconds) / r.jobs
        shown.append(f"{total:.0f} ({1e6 * r.postgres_cpu_seconds / r.jobs:.0f})")
    return ", ".join(shown)


def better_on(attribute: str, a: Result, b: Result) -> bool:
    """Whether `a` beats `b` on one column: lower latency, or a higher rate."""
    if attribute in LOWER_IS_BETTER:
        return getattr(a, attribute) < getattr(b, attribute)
    return getattr(a, attribute) > getattr(b, attribute)


def bootstrap_difference(ours: list[float], theirs: list[float], p: int, resamples: int = 1000) -> tuple[float, float]:
    """A 95% interval for the p-th percentile of `ours` minus that of `theirs`, resampling each sample set."""
    if not ours or not theirs:
        return float("nan"), float("nan")
    rng = random.Random(0)  # the same samples give the same interval

    def resampled(values: list[float]) -> float:
        return percentile(sorted(rng.choices(values, k=len(values))), p)

    differences = sorted(resampled(ours) - resampled(theirs) for _ in range(resamples))
    return differences[int(0.025 * resamples)], differences[int(0.975 * resamples) - 1]


def profile_report(profile: dict[str, object]) -> str:
    if "error" in profile:
        return f"\nprofile: {profile['error']}"
    lines = ["", f"dygo worker profile (py-spy, {profile['samples']} samples of busy threads; raw: {profile['raw']})"]
    titles = (("own time (the frame itself)", "own"), ("total time (dygo's functions, callees included)", "total"))
    for title, key in titles:
        lines.append(f"  top by {title}:")
        for name, percent in profile[key]:  # type: ignore[attr-defined]
            lines.append(f"    {percent:5.1f}%  {name}")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
