"""Many workers, one PostgreSQL (`make bench-fleet`): where does one server stop scaling?

For each fleet size (default 1, 4, 16 and 64 worker processes, concurrency 4 each), on a fresh
database of a private embedded server (`.dygo/bench-fleet`, `max_connections` raised so that the
fleet's own connections are measured, not the server's default limit):

1. start the workers and wait until every one has registered (so the rate is not a start-up ramp);
2. enqueue 50,000 no-op jobs in one transaction, wait for them all to succeed;
3. enqueue 5,000 jobs of 10 ms in one transaction, wait likewise.

Per phase it prints jobs/s (jobs / (last finish - first start), read from the rows), the peak
number of worker connections in `pg_stat_activity` (and per worker), lock waits (the most worker
backends seen waiting on a lock at once, and the share of samples with any), executions per
job: a claim increments `attempt`, so any job with attempt > 1 ran twice (a duplicate), and CPU: per
job, of all the worker processes together and of the PostgreSQL server (its processes, read from /proc:
on the server's machine only), and how busy the machine's cores were, from just before the enqueue's commit
to the drain (the enqueue itself, a COPY of every job, is not the fleet's work).

Targets (issue "Fleet scale"): 64 workers >= 90% of the best fleet size's jobs/s, <= 3 connections
per worker, zero duplicates. `--url` measures another server instead. `--pgbouncer` runs the fleet
through a PgBouncer of its own (Debian's 1.18, transaction pooling, 20 server connections for the
database: tests/pgbouncer.py) in front of the private server, LISTEN and migrations on the direct URL.

`--reference` runs, after each dygo fleet, a fleet of as many `bench/bare_worker.py` processes (no dygo
code: claim a batch in dygo's order with SKIP LOCKED, run it, settle it, one connection, no leases, logs or
metrics) on the same jobs: what one PostgreSQL and this machine's cores allow a fleet of Python workers,
measured in the same run, so dygo's own fall from its best fleet size can be told from the machine's.

`--repeat N` runs every fleet size N times, the sizes taking turns, and judges each phase by its median
pass: on this VM one pass of a 64-worker fleet can be 15 points off another.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import (  # noqa: E402
    ROOT,
    WorkerProcess,
    log,
    machine_busy_seconds,
    migrate,
    parent_pid,
    process_cpu_seconds,
    server_cpu_seconds,
    wait_until,
)

sys.path.insert(0, str(ROOT))
from tests.pgbouncer import PgBouncer, missing_reason  # noqa: E402

DATA_DIR = ROOT / ".dygo" / "bench-fleet"
DATABASE = "bench_fleet"
MAX_CONNECTIONS = 500
SAMPLE_INTERVAL = 0.1
# The claim and shared connections ("dygo-worker <id>") and LISTEN ("dygo-worker-listen <id>").
WORKERS_LIKE = "dygo-worker%"


@dataclass
class Phase:
    workers: int
    name: str
    jobs: int
    seconds: float
    peak_connections: int
    peak_lock_waits: int
    lock_wait_share: float  # of samples with at least one worker backend waiting on a lock
    duplicates: int  # jobs claimed more than once
    max_attempt: int
    waits: Counter[str] = field(default_factory=Counter)  # worker backends seen waiting, by wait event
    runner: str = ""  # BARE for the phases of bench/bare_worker.py (--reference), "" for dygo's
    cpu: Cpu | None = None  # from just before the enqueue's commit to the drain

    @property
    def rate(self) -> float:
        return self.jobs / self.seconds if self.seconds > 0 else 0.0


@dataclass
class Cpu:
    """CPU seconds used between two readings: the worker processes together, the server, the machine."""

    workers: float
    server: float
    machine: float
    wall: float

    @staticmethod
    def read(workers: list[WorkerProcess], postmaster: int | None) -> Cpu:
        server = sum(server_cpu_seconds(postmaster).values()) if postmaster else 0.0
        return Cpu(sum(process_cpu_seconds(w.pid) for w in workers), server, machine_busy_seconds(), time.monotonic())

    def since(self, before: Cpu) -> Cpu:
        return Cpu(
            self.workers - before.workers,
            self.server - before.server,
            self.machine - before.machine,
            self.wall - before.wall,
        )


def postmaster_of(conn: psycopg.Connection) -> int | None:
    """The server's postmaster pid when it runs on this machine (the parent of this connection's backend)."""
    try:
        return parent_pid(conn.info.backend_pid)
    except (OSError, ValueError, IndexError):
        return None


def main() -> int:
    args = parse_arguments()
    server = args.url or private_server()
    bouncer = None
    if args.pgbouncer:
        reason = missing_reason()
        if reason:
            log(f"--pgbouncer: {reason}")
            return 2
        bouncer = PgBouncer(server, DATA_DIR.with_name("bench-fleet-pgbouncer"))
        bouncer.start()
        server, args.direct_url = bouncer.url(server), server
    try:
        return run(server, args)
    finally:
        if bouncer is not None:
            bouncer.stop()


def run(server: str, args: argparse.Namespace) -> int:
    url = fresh_database(server, args.direct_url)
    through = f" through PgBouncer ({server})" if args.pgbouncer else ""
    log(
        f"database {DATABASE}{through}; fleets {args.workers}; concurrency {args.concurrency} each; "
        f"claim_ahead {args.claim_ahead}"
    )
    with tempfile.TemporaryDirectory(prefix="dygo-fleet-") as config:
        write_config(Path(config), args.concurrency, args.claim_ahead)
        # The bench's folder (bench_jobs) ahead of any PYTHONPATH given (e.g. another dygo tree to compare).
        path = os.pathsep.join(filter(None, [str(Path(__file__).resolve().parent), os.environ.get("PYTHONPATH")]))
        env = {"DATABASE_URL": url, "DYGO_CONFIG_DIR": config, "DYGO_LOG_LEVEL": "WARNING", "PYTHONPATH": path}
        if args.direct_url:
            env["DATABASE_DIRECT_URL"] = with_database(args.direct_url)
        migrate(env)
        phases: list[Phase] = []
        for number in range(1, args.repeat + 1):
            if args.repeat > 1:
                log(f"pass {number} of {args.repeat}")
            for count in args.workers:
                phases += run_fleet(url, env, count, args)
                if args.reference:
                    phases += run_fleet(url, env, count, args, runner=BARE)
    print(table(phases))
    if args.repeat > 1:
        phases = medians(phases)
        print(f"the median pass of {args.repeat} (by jobs/s), per fleet and phase:")
        print(table(phases))
    for runner in dict.fromkeys(p.runner for p in phases):
        if runner == BARE:
            print("the bare reference (bench/bare_worker.py, the same fleet sizes, in the same run):")
        print(verdict([p for p in phases if p.runner == runner], pooled=args.pgbouncer))
    return 0


# --reference: after each dygo fleet, the same number of bench/bare_worker.py processes drain the same jobs.
BARE = "bare"


def parse_arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 4, 16, 64], help="fleet sizes to run")
    parser.add_argument("--concurrency", type=int, default=4, help="each worker's --concurrency")
    parser.add_argument("--claim-ahead", default="5ms", help="dygo.yml claim_ahead (default 5ms, dygo's default)")
    parser.add_argument("--noop-jobs", type=int, default=50_000)
    parser.add_argument("--sleep-jobs", type=int, default=5_000)
    parser.add_argument("--sleep-ms", type=int, default=10)
    parser.add_argument(
        "--url",
        help="a server URL to use instead of the private embedded one (its database "
        f"{DATABASE} is dropped and created), e.g. a PgBouncer in front of it",
    )
    parser.add_argument("--direct-url", help="with --url through a pooler: the server itself (DATABASE_DIRECT_URL)")
    parser.add_argument(
        "--pgbouncer",
        action="store_true",
        help="through a PgBouncer of its own in front of the server (transaction pooling)",
    )
    parser.add_argument("--timeout", type=float, default=600.0, help="per phase")
    parser.add_argument(
        "--repeat",
        type=int,
        default=1,
        help="passes over every fleet size, taking turns; the verdict is read from each phase's median pass",
    )
    parser.add_argument(
        "--reference",
        action="store_true",
        help="after each dygo fleet, as many bench/bare_worker.py processes (the least a Python "
        "worker does per job: claim, run, settle) drain the same jobs: the machine's ceiling",
    )
    parser.add_argument(
        "--bare-batch",
        type=int,
        default=32,
        help="with --reference: jobs per claim of a bare worker (default 32; dygo's fleet claims ~35)",
    )
    return parser.parse_args()


# --- the server and the database ------------------------------------------------------------------


def private_server() -> str:
    """The bench's own embedded server, so a fleet of 64 does not starve the project's dev server."""
    env = {**os.environ, "DYGO_DATA_DIR": str(DATA_DIR)}
    env.pop("DATABASE_URL", None)
    url = dygo("db", "start", env=env).strip()
    with psycopg.connect(url, autocommit=True) as conn:
        current = int(conn.execute("SHOW max_connections").fetchone()[0])
        if current >= MAX_CONNECTIONS:
            return url
        conn.execute(f"ALTER SYSTEM SET max_connections = {MAX_CONNECTIONS}")
    log(f"raising max_connections of {DATA_DIR} from {current} to {MAX_CONNECTIONS} (restart)")
    dygo("db", "stop", env=env)
    return dygo("db", "start", env=env).strip()


def dygo(*arguments: str, env: dict[str, str] | None = None) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "dygo", *arguments], env=env, cwd=ROOT, capture_output=True, text=True, check=True
    )
    return done.stdout


def with_database(url: str) -> str:
    info = psycopg.conninfo.conninfo_to_dict(url)
    info["dbname"] = DATABASE
    return psycopg.conninfo.make_conninfo(**info)


def fresh_database(server: str, direct: str | None) -> str:
    with psycopg.connect(direct or server, autocommit=True) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {DATABASE} WITH (FORCE)")
        conn.execute(f"CREATE DATABASE {DATABASE}")
    return with_database(server)


def write_config(config: Path, concurrency: int, claim_ahead: str) -> None:
    (config / "queues.yml").write_text(f"queues:\n  - name: default\n    concurrency: {concurrency}\n")
    (config / "dygo.yml").write_text(f"jobs: [bench_jobs]\nclaim_ahead: {claim_ahead}\n")


# --- one fleet ---------------------------------------------------------------------------------------


def run_fleet(url: str, env: dict[str, str], count: int, args: argparse.Namespace, runner: str = "") -> list[Phase]:
    """One fleet of `count` dygo workers, or with runner BARE of `count` bare_worker.py processes."""
    with psycopg.connect(url, autocommit=True, prepare_threshold=None) as conn:
        conn.execute("DELETE FROM dygo_jobs")
        conn.execute("DELETE FROM dygo_workers")
        conn.execute("VACUUM ANALYZE dygo_jobs")
    log(f"{count} {'bare ' if runner == BARE else ''}worker(s): starting")
    if runner == BARE:
        command = [
            sys.executable,
            str(Path(__file__).resolve().parent / "bare_worker.py"),
            env["DATABASE_URL"],
            "--concurrency",
            str(args.concurrency),
            "--batch",
            str(args.bare_batch),
        ]
        started = "SELECT count(*) FROM pg_stat_activity WHERE application_name LIKE 'dygo-worker-bare%'"
    else:
        command = [sys.executable, "-m", "dygo", "worker", "--concurrency", str(args.concurrency)]
        started = "SELECT count(*) FROM dygo_workers"
    workers = [WorkerProcess(command, env=env) for _ in range(count)]
    try:
        with psycopg.connect(url, autocommit=True, prepare_threshold=None) as conn:

            def registered() -> bool:
                for worker in workers:
                    worker.check_alive()
                return conn.execute(started).fetchone()[0] >= count

            wait_until(registered, args.timeout, f"{count} workers registered", interval=0.5)
        phases = [
            run_phase(url, workers, name, kind, job_args, jobs, args.timeout, runner)
            for name, kind, job_args, jobs in [
                ("no-op", "bench.noop", {}, args.noop_jobs),
                (f"{args.sleep_ms} ms", "bench.sleep", {"ms": args.sleep_ms}, args.sleep_jobs),
            ]
            if jobs > 0  # `--sleep-jobs 0` runs the no-op phase alone
        ]
    finally:
        for worker in workers:
            worker.process.terminate()
        for worker in workers:
            worker.stop()
    return phases


def run_phase(
    url: str,
    workers: list[WorkerProcess],
    name: str,
    kind: str,
    job_args: dict,
    jobs: int,
    timeout: float,
    runner: str = "",
) -> Phase:
    import bench_jobs  # noqa: F401  (registers the kinds, as a producer that enqueues them would)
    from dygo.store import enqueue_many  # the bench's own interpreter is dygo's .venv

    with psycopg.connect(url, autocommit=True, prepare_threshold=None) as conn:
        conn.execute("DELETE FROM dygo_jobs")
        sampler = Sampler(url)
        postmaster = postmaster_of(conn)
        with conn.transaction():
            enqueue_many(conn, [{"kind": kind, "args": job_args} for _ in range(jobs)])
            # After the COPY, before the commit: nobody can see the jobs yet. Read after the commit, the reading
            # (~300 processes in /proc) took so long beside 64 busy workers that their start went uncounted.
            before = Cpu.read(workers, postmaster)
        log(f"{len(workers)} worker(s), {name}: {jobs} jobs enqueued")

        def drained() -> bool:
            for worker in workers:
                worker.check_alive()
            return conn.execute("SELECT count(*) FROM dygo_jobs WHERE state = 'succeeded'").fetchone()[0] >= jobs

        try:
            wait_until(drained, timeout, f"{jobs} {name} jobs succeeded", interval=0.2)
        finally:
            sampler.stop()
        cpu = Cpu.read(workers, postmaster).since(before)
        seconds, duplicates, max_attempt = conn.execute(
            "SELECT extract(epoch FROM max(finished_at) - min(started_at)), count(*) FILTER (WHERE attempt > 1),"
            " max(attempt) FROM dygo_jobs"
        ).fetchone()
    phase = Phase(
        len(workers),
        name,
        jobs,
        float(seconds),
        sampler.peak_connections,
        sampler.peak_lock_waits,
        sampler.lock_wait_share,
        duplicates,
        max_attempt,
        sampler.waits,
        runner,
        cpu,
    )
    log(line(phase))
    log(f"  worker backends waiting, by event (backend-samples of {sampler.samples}): {waits(phase)}")
    return phase


class Sampler:
    """Reads pg_stat_activity every SAMPLE_INTERVAL on its own connection, in a thread."""

    def __init__(self, url: str) -> None:
        self.conn = psycopg.connect(url, autocommit=True, prepare_threshold=None)
        self.peak_connections = self.peak_lock_waits = self.samples = self.samples_waiting = 0
        self.waits: Counter[str] = Counter()
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.stopping.wait(SAMPLE_INTERVAL):
            # What each worker backend waits on (Lock: the lock's type, from pg_locks), but not the idle
            # wait for the client's next statement (ClientRead) nor a LISTEN session's. pg_locks is read only
            # for a backend waiting on a lock (a one-time filter): read for each of 192 backends, the whole
            # lock table each time, it cost the server ~10 ms a sample.
            events = self.conn.execute(
                "SELECT a.wait_event_type, a.wait_event, a.state, l.locktype, l.mode FROM pg_stat_activity a"
                " LEFT JOIN LATERAL (SELECT locktype, mode FROM pg_locks WHERE a.wait_event_type = 'Lock'"
                " AND pid = a.pid AND NOT granted LIMIT 1) l ON true WHERE a.application_name LIKE %s",
                (WORKERS_LIKE,),
            ).fetchall()
            connections = len(events)
            waiting = sum(event_type == "Lock" for event_type, *_ in events)
            for event_type, event, state, locktype, mode in events:
                if event_type and event != "ClientRead" and state != "idle":
                    self.waits[f"{event_type}:{event}" + (f" ({locktype} {mode})" if locktype else "")] += 1
            self.peak_connections = max(self.peak_connections, connections)
            self.peak_lock_waits = max(self.peak_lock_waits, waiting)
            self.samples += 1
            self.samples_waiting += waiting > 0

    @property
    def lock_wait_share(self) -> float:
        return self.samples_waiting / self.samples if self.samples else 0.0

    def stop(self) -> None:
        self.stopping.set()
        self.thread.join()
        self.conn.close()


# --- the report ------------------------------------------------------------------------------------------

HEADER = (
    "runner",
    "workers",
    "jobs",
    "jobs/s",
    "peak conns",
    "conns/worker",
    "lock waits (peak, share)",
    "duplicates",
    "CPU/job workers",
    "CPU/job server",
    "cores busy",
)


def cells(p: Phase) -> tuple[str, ...]:
    return (
        p.runner or "dygo",
        f"{p.workers}",
        f"{p.jobs:,} {p.name}",
        f"{p.rate:,.0f}",
        f"{p.peak_connections}",
        f"{p.peak_connections / p.workers:.2f}",
        f"{p.peak_lock_waits}, {p.lock_wait_share:.0%}",
        f"{p.duplicates}",
        *cpu_cells(p),
    )


def cpu_cells(p: Phase) -> tuple[str, str, str]:
    if p.cpu is None or p.cpu.wall <= 0:
        return ("-", "-", "-")
    cores = os.cpu_count() or 1
    server = f"{p.cpu.server / p.jobs * 1e6:,.0f} us" if p.cpu.server else "-"
    return f"{p.cpu.workers / p.jobs * 1e6:,.0f} us", server, f"{p.cpu.machine / p.cpu.wall:.2f} of {cores}"


def waits(p: Phase, top: int = 6) -> str:
    return ", ".join(f"{event} {count}" for event, count in p.waits.most_common(top)) or "none"


def line(p: Phase) -> str:
    return "  ".join(f"{name} {value}" for name, value in zip(HEADER, cells(p), strict=True))


def table(phases: list[Phase]) -> str:
    rows = [HEADER, *(cells(p) for p in phases)]
    rendered = ["| " + " | ".join(row) + " |" for row in rows]
    rendered.insert(1, "|" + "---|" * len(HEADER))
    return "\n".join(rendered)


def medians(phases: list[Phase]) -> list[Phase]:
    """Per fleet size, variant and phase, the pass with the median jobs/s (the lower middle of an even count):
    this VM's speed drifts from minute to minute, and one pass of a 64-worker fleet can be 15 points off.
    Duplicates are every pass's together, and connections the most any pass held."""
    groups: dict[tuple[str, int, str], list[Phase]] = {}
    for phase in phases:
        groups.setdefault((phase.runner, phase.workers, phase.name), []).append(phase)
    return [
        dataclasses.replace(
            sorted(runs, key=lambda p: p.rate)[(len(runs) - 1) // 2],
            duplicates=sum(p.duplicates for p in runs),
            peak_connections=max(p.peak_connections for p in runs),
        )
        for runs in groups.values()
    ]


def verdict(phases: list[Phase], pooled: bool = False) -> str:
    said = []
    for name in dict.fromkeys(p.name for p in phases):
        runs = [p for p in phases if p.name == name]
        best, largest = max(runs, key=lambda p: p.rate), max(runs, key=lambda p: p.workers)
        share = largest.rate / best.rate if best.rate else 0.0
        said.append(
            f"{name}: {largest.workers} workers at {share:.0%} of the best ({best.workers} workers, "
            f"{best.rate:,.0f}/s): {'ok' if share >= 0.9 else 'COLLAPSE'} (target >= 90%)"
        )
    worst = max(phases, key=lambda p: p.peak_connections / p.workers)
    if pooled:
        # Server backends: one LISTEN per worker (direct) and PgBouncer's pool, whose connections keep the
        # application_name of the last client that used them; each worker holds 2 PgBouncer clients.
        said.append(
            f"server connections at most {worst.peak_connections} for {worst.workers} workers "
            f"(through PgBouncer: one direct LISTEN each, the rest shared in its pool)"
        )
    else:
        said.append(
            f"connections per worker at most {worst.peak_connections / worst.workers:.2f} "
            f"({'ok' if worst.peak_connections <= 3 * worst.workers else 'OVER'}; target <= 3)"
        )
    duplicates = sum(p.duplicates for p in phases)
    said.append(f"duplicates {duplicates} ({'ok' if duplicates == 0 else 'FAIL'}; target 0)")
    return "\n".join(said)


if __name__ == "__main__":
    raise SystemExit(main())
