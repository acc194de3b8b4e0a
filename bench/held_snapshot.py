"""A held snapshot: does a claim's cost depend on the number of dead rows? (`make bench-snapshot`)

Something that holds back VACUUM (an analytics query, a forgotten `BEGIN`, a replica with
`hot_standby_feedback`) keeps every row version a claim or a settle leaves behind; an index walk
that must step over them gets slower the longer the hold lasts. This measures it:

1. a fresh database (`bench_snapshot`) of the project's embedded server, migrated and never
   analysed (a freshly deployed table: the planner has no statistics yet);
2. one `dygo worker --concurrency 8`; a producer enqueues 1 ms jobs one at a time at `--rate`/s;
3. phases: `clean` (`--clean` s), `held` (`--hold` s, while another connection sits idle in a
   transaction that holds an xid), `after` (`--after` s, the hold released).

Pickup latency is measured two ways, per `--window` and per phase:
- `pickup`: from the producer's clock just before its `enqueue` call to the handler's first line
  (the job's arguments carry the first, the handler writes both to a file): what a caller sees,
  the enqueue's commit, the NOTIFY, the claim statement and the start in the worker included;
- `rows`: started_at - enqueued_at, from the job's row: the enqueue's transaction start to the
  claim's, which leaves out the claim statement's own time and everything after it.

Each window also gives the PostgreSQL server's CPU (its processes' user + system time from /proc,
exited backends included, as % of one core), the claim statements' calls, time and shared buffers
per call (pg_stat_statements, when the server preloads it; otherwise it says so), the entries of
dygo_jobs_ready read per index scan (pg_stat_user_indexes), the 1-minute load average, and two
measures of the machine's own speed: the worker's CPU per job (the hold does not change its work) and
the share of CPU time the hypervisor stole (/proc/stat). At the end: dead tuples of dygo_jobs,
sequential scans of it during the run. Targets: every window of the hold within 1.5x of the clean
phase in pickup p50 and p99 and in server CPU; no sequential scan of the job table.

With `--control URL`, a second server of the same version and settings (ALIKE) gets the same jobs at the same
rate, from its own producer and worker, through the whole run, and is never held. (A second database of the
same server would not do: while the held transaction runs, every snapshot taken on its server counts it as
running, so the other database's rows are kept too.) A machine whose speed drifts for minutes at a time
slows both servers alike, so each held window is also compared with the clean phase scaled by the control's
own change over the same minutes: held window / (held clean x control window / control clean).

    .venv/bin/python bench/held_snapshot.py                        # 60 s clean, 600 s held, 30 s after
    .venv/bin/python bench/held_snapshot.py --clean 20 --hold 60 --after 10    # a shorter look
    .venv/bin/python bench/held_snapshot.py --server postgresql:///postgres?host=/tmp/pg15   # another server
    DYGO_DATA_DIR=/tmp/dygo-control .venv/bin/python -m dygo db url    # a second embedded server, for the control
    .venv/bin/python bench/held_snapshot.py --control 'postgresql://postgres:@/postgres?host=/tmp/dygo-control/pg'
"""

from __future__ import annotations

import argparse
import math
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import psycopg
from psycopg.conninfo import make_conninfo

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_jobs  # noqa: E402, F401  (registers the kinds this script enqueues)
from common import (  # noqa: E402
    CLOCK_TICKS,
    ROOT,
    WorkerProcess,
    log,
    migrate,
    paced,
    parent_pid,
    percentile,
    process_cpu_seconds,
    wait_until,
)
from dygo.store.enqueue import enqueue  # noqa: E402

DATABASE = "bench_snapshot"
TARGET = 1.5  # every held window's p50, p99 and server CPU at most this multiple of the clean phase's

# The claim statements (store/claim.py), told apart from every other statement by what only they do.
CLAIM_STATS = """
SELECT coalesce(sum(calls), 0), coalesce(sum(total_exec_time), 0),
       coalesce(sum(shared_blks_hit + shared_blks_read), 0)
FROM pg_stat_statements
WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())
  AND query LIKE '%FOR UPDATE SKIP LOCKED%' AND query LIKE '%UPDATE dygo_jobs AS j%'"""
# The producer's look for jobs behind its walk starts (store/claim.py JOBS_BEHIND), apart from the claims.
LOOK_STATS = """
SELECT coalesce(sum(calls), 0), coalesce(sum(total_exec_time), 0), coalesce(max(max_exec_time), 0)
FROM pg_stat_statements
WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())
  AND query LIKE '%run_at < w.since%'"""


@dataclass
class Sample:
    """Counters read at one instant of the run."""

    phase: str  # the phase that begins or goes on at this instant
    at: float  # epoch seconds
    server_cpu: float  # seconds
    worker_cpu: float
    claims: tuple[float, float, float] | None  # calls, total ms, shared buffers (None: no pg_stat_statements)
    looks: tuple[float, float, float] | None  # calls, total ms, longest ms so far
    index: tuple[int, int]  # dygo_jobs_ready: scans, entries read
    dead: int
    load: float
    steal: tuple[int, int]  # the machine's CPU time stolen by the hypervisor, and all of it (/proc/stat jiffies)


@dataclass
class Stream:
    """One server's database with its own worker and producer: the held one, or --control's."""

    name: str  # what the report calls it
    url: str
    postmaster: int
    stamps: Path
    worker: WorkerProcess
    conn: psycopg.Connection  # the bench's own, for the counters
    statements: bool  # pg_stat_statements readable
    seq_scans_before: int
    samples: list[Sample] = field(default_factory=list)


def main() -> int:
    args = parse_arguments()
    server = (
        args.server
        or subprocess.run(
            [sys.executable, "-m", "dygo", "db", "url"], check=True, capture_output=True, text=True, cwd=ROOT
        ).stdout.strip()
    )
    if args.control:
        alike(server, args.control)
    servers = {"the held server": server} | ({"the control server (never held)": args.control} if args.control else {})
    with tempfile.TemporaryDirectory(prefix="dygo-snapshot-") as config, ExitStack() as stack:
        streams = [
            stack.enter_context(started(name, url, Path(config, str(i)), args))
            for i, (name, url) in enumerate(servers.items())
        ]
        run_phases(streams, args)
        scans = [seq_scans(s.conn) - s.seq_scans_before for s in streams]  # before this script's own reads
        for stream in streams:
            wait_until(lambda s=stream: not pending(s.conn), 60, "the last jobs to finish", interval=0.2)
        runs = [spans(stream.samples, *collected(stream)) for stream in streams]
    for stream, (windows, phases), scanned in zip(streams, runs, scans, strict=True):
        print(f"## {stream.name}\n")
        report(windows, phases, scanned, stream.statements, args)
        print()
    if args.control:
        compare(*runs)
    return 0


@contextmanager
def started(name: str, server: str, config: Path, args: argparse.Namespace) -> Iterator[Stream]:
    """A fresh, migrated database on `server` with one worker, registered and idle."""
    with psycopg.connect(server, autocommit=True) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {DATABASE} WITH (FORCE)")
        conn.execute(f"CREATE DATABASE {DATABASE}")
    url = make_conninfo(server, dbname=DATABASE)
    config.mkdir()
    stamps = config / "stamps"
    Path(config, "queues.yml").write_text(f"queues:\n  - name: default\n    concurrency: {args.concurrency}\n")
    Path(config, "dygo.yml").write_text("jobs: [bench_jobs]\n")
    env = {
        "DATABASE_URL": url,
        "DYGO_CONFIG_DIR": str(config),
        "DYGO_LOG_LEVEL": "WARNING",
        "PYTHONPATH": str(Path(__file__).resolve().parent),
        "DYGO_BENCH_STAMPS": str(stamps),
    }
    migrate(env)
    command = [sys.executable, "-m", "dygo", "worker", "--concurrency", str(args.concurrency)]
    with psycopg.connect(url, autocommit=True) as conn:
        statements, scans = statements_loaded(conn), seq_scans(conn)
        with WorkerProcess(command, env=env) as worker:
            wait_until(lambda: registered(conn, worker), 60, "the worker to register", interval=0.2)
            yield Stream(name, url, parent_pid(conn.info.backend_pid), stamps, worker, conn, statements, scans)


# What --control's server must share with the held one for the same minutes to cost both the same.
ALIKE = ("server_version", "shared_preload_libraries", "shared_buffers", "autovacuum_naptime", "synchronous_commit")


def alike(server: str, control: str) -> None:
    """Refuse a control that is the held server itself (the hold would hold it too) or is set up otherwise."""
    with psycopg.connect(server, autocommit=True) as ours, psycopg.connect(control, autocommit=True) as theirs:
        if ours.execute("SHOW data_directory").fetchone() == theirs.execute("SHOW data_directory").fetchone():
            raise SystemExit("--control names the held server itself: give it a second server (see the docstring)")
        for setting in ALIKE:
            mine, other = (c.execute(f"SHOW {setting}").fetchone()[0] for c in (ours, theirs))
            if mine != other:
                differ = f"--control's server has {setting} = {other!r}, the held one {mine!r}"
                raise SystemExit(f"{differ}: set them alike")


def collected(stream: Stream) -> tuple[list[tuple[float, float]], list[tuple[float, float]]]:
    """Each job's (time before its enqueue, pickup ms) from the handler's stamps, and (enqueued_at, started_at -
    enqueued_at in ms) from its row."""
    rows = stream.conn.execute(
        "SELECT extract(epoch FROM enqueued_at), 1000 * extract(epoch FROM started_at - enqueued_at)"
        " FROM dygo_jobs WHERE started_at IS NOT NULL ORDER BY enqueued_at"
    ).fetchall()
    picked = [(float(t), 1000 * (float(began) - float(t))) for t, began in (s.split() for s in stream.stamps.open())]
    return picked, [(float(at), float(ms)) for at, ms in rows]


def parse_arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rate", type=float, default=200.0, help="jobs enqueued per second")
    parser.add_argument("--job-ms", type=int, default=1)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--clean", type=float, default=60.0, help="seconds before the hold")
    parser.add_argument("--hold", type=float, default=600.0, help="seconds the snapshot is held")
    parser.add_argument("--after", type=float, default=30.0, help="seconds after the hold is released")
    parser.add_argument("--window", type=float, default=30.0, help="seconds per line of the latency table")
    parser.add_argument(
        "--server", help="URL of another PostgreSQL server to run on (default: the project's embedded one)"
    )
    parser.add_argument(
        "--control",
        metavar="URL",
        help="another PostgreSQL server, of the same version and settings, where the same jobs run at the same "
        "time and nothing is held: a control for the machine's own drift",
    )
    return parser.parse_args()


def statements_loaded(conn: psycopg.Connection) -> bool:
    """Whether pg_stat_statements can be read here (the server must preload it); counters reset if so."""
    try:
        conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        conn.execute("SELECT pg_stat_statements_reset()")
    except psycopg.Error as exc:
        log(f"pg_stat_statements unavailable ({str(exc).strip()}): no per-statement figures")
        return False
    return True


def registered(conn: psycopg.Connection, worker: WorkerProcess) -> bool:
    worker.check_alive()
    return conn.execute("SELECT count(*) FROM dygo_workers").fetchone()[0] > 0


def pending(conn: psycopg.Connection) -> bool:
    return conn.execute("SELECT EXISTS (SELECT FROM dygo_jobs WHERE state IN ('pending', 'active'))").fetchone()[0]


def seq_scans(conn: psycopg.Connection) -> int:
    conn.execute("SELECT pg_stat_force_next_flush()")
    time.sleep(1.1)  # the worker's backends flush their counters at most every second
    return conn.execute("SELECT seq_scan FROM pg_stat_user_tables WHERE relname = 'dygo_jobs'").fetchone()[0]


def server_cpu(postmaster: int) -> float:
    """CPU seconds of one PostgreSQL server: the postmaster, its live children, and its exited children
    (the postmaster reaps them: its cutime and cstime), so a backend or autovacuum worker that ended
    between two readings still counts."""
    fields = Path(f"/proc/{postmaster}/stat").read_text().rsplit(")", 1)[1].split()
    total = sum(int(v) for v in fields[11:15]) / CLOCK_TICKS  # utime, stime, cutime, cstime
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if parent_pid(int(entry.name)) == postmaster:
                    total += process_cpu_seconds(int(entry.name))
            except (OSError, ValueError, IndexError):
                continue
    return total


def sample(stream: Stream, phase: str) -> Sample:
    conn = stream.conn
    conn.execute("SELECT pg_stat_force_next_flush()")
    index = conn.execute(
        "SELECT idx_scan, idx_tup_read FROM pg_stat_user_indexes WHERE indexrelname = 'dygo_jobs_ready'"
    ).fetchone()
    dead = conn.execute("SELECT n_dead_tup FROM pg_stat_user_tables WHERE relname = 'dygo_jobs'").fetchone()[0]
    claims = conn.execute(CLAIM_STATS).fetchone() if stream.statements else None
    looks = conn.execute(LOOK_STATS).fetchone() if stream.statements else None
    return Sample(
        phase,
        time.time(),
        server_cpu(stream.postmaster),
        process_cpu_seconds(stream.worker.pid),
        None if claims is None else (float(claims[0]), float(claims[1]), float(claims[2])),
        None if looks is None else (float(looks[0]), float(looks[1]), float(looks[2])),
        (int(index[0]), int(index[1])),
        int(dead),
        os.getloadavg()[0],
        stolen(),
    )


def stolen() -> tuple[int, int]:
    """The machine's stolen and total CPU time so far: a VM's host taking cores away slows every process."""
    fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
    return fields[7], sum(fields)


def run_phases(streams: list[Stream], args: argparse.Namespace) -> None:
    """Produce jobs into every stream through three phases, reading each one's counters at every window's edge
    (the same instants for all); the hold is on the first stream's. The last sample is the end of the
    run (phase 'end')."""
    producing = threading.Event()
    producing.set()
    producers = [threading.Thread(target=produce, args=(s.url, args, producing), daemon=True) for s in streams]
    for producer in producers:
        producer.start()
    holder: psycopg.Connection | None = None
    for name, seconds in (("clean", args.clean), ("held", args.hold), ("after", args.after)):
        if name == "held":
            holder = psycopg.connect(streams[0].url)
            holder.execute("SELECT pg_current_xact_id()")  # an xid: VACUUM keeps every version newer than it
        elif holder is not None:
            holder.rollback()
            holder.close()
        log(f"{name}: {seconds:g} s")
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline - 0.5:
            for stream in streams:
                stream.samples.append(sample(stream, name))
            edge = min(deadline, time.monotonic() + args.window)
            while time.monotonic() < edge:
                for stream in streams:
                    stream.worker.check_alive()
                time.sleep(min(1.0, max(0.0, edge - time.monotonic())))
    for stream in streams:
        stream.samples.append(sample(stream, "end"))
    producing.clear()
    for producer in producers:
        producer.join()


def produce(url: str, args: argparse.Namespace, producing: threading.Event) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        for _ in paced(10**9, 1 / args.rate):
            if not producing.is_set():
                return
            enqueue(conn, "bench.stamped", {"ms": args.job_ms, "t": time.time()})


@dataclass
class Span:
    """What happened between two samples (a window, or a whole phase)."""

    phase: str
    start: Sample
    end: Sample
    pickup: list[float]  # ms, sorted
    rows: list[float]  # ms, sorted

    @property
    def cpu(self) -> float:
        return 100 * (self.end.server_cpu - self.start.server_cpu) / (self.end.at - self.start.at)

    @property
    def cpu_per_job(self) -> float:
        """Server CPU ms per job enqueued in the span: the rate a loaded machine's producer keeps varies."""
        return 1000 * (self.end.server_cpu - self.start.server_cpu) / len(self.pickup) if self.pickup else math.nan

    @property
    def worker_cpu(self) -> float:
        return 100 * (self.end.worker_cpu - self.start.worker_cpu) / (self.end.at - self.start.at)

    @property
    def worker_cpu_per_job(self) -> float:
        """The worker's CPU ms per job: its work per job does not depend on the hold, so this measures the
        machine's speed (a slower minute slows the server's statements alike)."""
        return 1000 * (self.end.worker_cpu - self.start.worker_cpu) / len(self.pickup) if self.pickup else math.nan

    @property
    def steal(self) -> float:
        total = self.end.steal[1] - self.start.steal[1]
        return 100 * (self.end.steal[0] - self.start.steal[0]) / total if total else math.nan

    def claim_figures(self) -> str:
        if self.start.claims is None or self.end.claims is None:
            return "– | – | –"
        calls, ms, buffers = (b - a for a, b in zip(self.start.claims, self.end.claims, strict=True))
        if not calls:
            return "0 | – | –"
        return f"{calls:,.0f} | {ms / calls:.3f} | {buffers / calls:.1f}"

    def look_figures(self) -> str:
        if self.start.looks is None or self.end.looks is None:
            return "–"
        calls, ms = self.end.looks[0] - self.start.looks[0], self.end.looks[1] - self.start.looks[1]
        return f"{calls:,.0f} × {ms / calls:.1f} ms" if calls else "0"

    def entries_per_scan(self) -> float:
        scans = self.end.index[0] - self.start.index[0]
        return (self.end.index[1] - self.start.index[1]) / scans if scans else float("nan")

    def row(self, origin: float) -> str:
        p, r = self.pickup, self.rows
        return (
            f"| {self.phase} | {self.start.at - origin:.0f} | {len(p)} | "
            f"{percentile(p, 50):.1f} / {percentile(p, 95):.1f} / {percentile(p, 99):.1f} | "
            f"{percentile(r, 50):.1f} / {percentile(r, 99):.1f} | {self.cpu:.0f} % | {self.cpu_per_job:.2f} | "
            f"{self.worker_cpu:.0f} % | {self.worker_cpu_per_job:.2f} | "
            f"{self.claim_figures()} | {self.look_figures()} | {self.entries_per_scan():.1f} | {self.end.dead:,} | "
            f"{self.end.load:.2f} | {self.steal:.1f} % |"
        )


def span(
    phase: str, start: Sample, end: Sample, picked: list[tuple[float, float]], rows: list[tuple[float, float]]
) -> Span:
    def within(samples: list[tuple[float, float]]) -> list[float]:
        return sorted(ms for at, ms in samples if start.at <= at < end.at)

    return Span(phase, start, end, within(picked), within(rows))


def spans(
    samples: list[Sample], picked: list[tuple[float, float]], rows: list[tuple[float, float]]
) -> tuple[list[Span], dict[str, Span]]:
    """The run's windows, and its three phases whole."""
    windows = [span(a.phase, a, b, picked, rows) for a, b in zip(samples, samples[1:], strict=False)]
    phases: dict[str, Span] = {}
    for name in ("clean", "held", "after"):
        mine = [s for s in samples if s.phase == name]
        following = samples[samples.index(mine[-1]) + 1]
        phases[name] = span(name, mine[0], following, picked, rows)
    return windows, phases


# The figures judged against the clean phase, each for a Span.
JUDGED: dict[str, Callable[[Span], float]] = {
    "pickup p50": lambda s: percentile(s.pickup, 50),
    "pickup p99": lambda s: percentile(s.pickup, 99),
    "PostgreSQL CPU": lambda s: s.cpu,
}


def report(
    windows: list[Span],
    phases: dict[str, Span],
    scans: int,
    statements: bool,
    args: argparse.Namespace,
) -> None:
    header = (
        "| phase | from s | jobs | pickup p50 / p95 / p99 ms | rows p50 / p99 ms | PostgreSQL CPU | CPU ms per job | "
        "worker CPU | worker CPU ms per job | claims | ms per claim | buffers per claim | looks behind | "
        "index entries per scan | dead tuples at end | load | steal |\n"
        "|---|---:|---:|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
    )
    origin = windows[0].start.at
    print(f"{args.rate:g} jobs/s of {args.job_ms} ms jobs, one worker at concurrency {args.concurrency}")
    print(header)
    for window in windows:
        print(window.row(origin))
    print()
    print(header)
    for whole in phases.values():
        print(whole.row(origin))
    print()
    if not statements:
        print("claims: pg_stat_statements is not loaded by this server (shared_preload_libraries)")
    clean = phases["clean"]
    held = [w for w in windows if w.phase == "held"]
    for what, figure in {**JUDGED, "PostgreSQL CPU per job": lambda s: s.cpu_per_job}.items():
        worst = max(figure(w) / figure(clean) for w in held)
        whole = figure(phases["held"]) / figure(clean)
        print(
            f"{what}: worst held window / clean = {worst:.2f}, whole hold / clean = {whole:.2f} "
            f"({'ok' if worst <= TARGET else 'OVER'}; target <= {TARGET})"
        )
    worst = max(w.worker_cpu_per_job / clean.worker_cpu_per_job for w in held)
    print(
        f"the machine: worker CPU per job, worst held window / clean = {worst:.2f} (the hold does not change the "
        "worker's work: above 1, the machine was slower then)"
    )
    ratio = percentile(phases["held"].rows, 50) / percentile(clean.rows, 50)
    print(f"rows (started_at - enqueued_at) p50, whole hold / clean = {ratio:.2f}")
    print(f"sequential scans of dygo_jobs during the run: {scans} ({'ok' if scans == 0 else 'OVER'}; target 0)")


def compare(held: tuple[list[Span], dict[str, Span]], control: tuple[list[Span], dict[str, Span]]) -> None:
    """Each held window against the clean phase scaled by the control's change over the same minutes: the
    hold's own effect, with the machine's drift (which slows both servers alike) taken out."""
    (held_windows, held_phases), (control_windows, control_phases) = held, control

    def ratio(figure: Callable[[Span], float], h: Span, c: Span) -> float:
        return (figure(h) / figure(held_phases["clean"])) / (figure(c) / figure(control_phases["clean"]))

    print("## the held server against the control, window by window\n")
    print(
        "| phase | from s | pickup p50 ms, held / control | pickup p99 ms, held / control | "
        "PostgreSQL CPU %, held / control | same-window p50 | same-window p99 | same-window CPU |"
    )
    print("|---|---:|---|---|---|---:|---:|---:|")
    origin = held_windows[0].start.at
    pairs = [(h.phase, h, c) for h, c in zip(held_windows, control_windows, strict=True)]
    pairs += [(f"{name} (whole)", held_phases[name], control_phases[name]) for name in held_phases]
    for label, h, c in pairs:
        figures = " | ".join(f"{f(h):.1f} / {f(c):.1f}" for f in JUDGED.values())
        ratios = " | ".join(f"{ratio(f, h, c):.2f}" for f in JUDGED.values())
        print(f"| {label} | {h.start.at - origin:.0f} | {figures} | {ratios} |")
    print()
    windows = [(h, c) for h, c in zip(held_windows, control_windows, strict=True) if h.phase == "held"]
    for what, figure in JUDGED.items():
        worst = max(ratio(figure, h, c) for h, c in windows)
        whole = ratio(figure, held_phases["held"], control_phases["held"])
        drift = max(figure(c) / figure(control_phases["clean"]) for _, c in windows)
        print(
            f"{what}: held window / (clean x control's change), worst = {worst:.2f}, whole hold = {whole:.2f} "
            f"({'ok' if worst <= TARGET else 'OVER'}; target <= {TARGET}); the control's own worst window / its "
            f"clean phase = {drift:.2f}"
        )


if __name__ == "__main__":
    raise SystemExit(main())
