"""Fault-injection scenarios against real `dygo worker` / `dygo serve` processes and a real PostgreSQL.

Each scenario gets a fresh database on a dedicated embedded server (its own data directory, so
restarting it disturbs nobody else), enqueues `Plan.jobs` jobs whose handlers record every
execution in `chaos_runs` (chaos/jobs.py), injects its faults while the workers drain the queue,
then checks the books (`check_books`, the same for every scenario and for the short runs inside
`make test`):

* lost: a job that did not end in its expected state (`succeeded`, or `dead` with the expected
  error for the misbehaving handlers), or that succeeded without any recorded execution. Must be 0.
* stuck: a job still `active` once every worker is idle and its lease TTL has passed. Must be 0.
* over-run: a job executed more often than 1 + the crashes that hit it. A trigger on dygo_jobs
  (installed by this runner only) records how every lease ended: settled, reaped after a crash or
  freeze, handed back at shutdown, or failed. Executions are counted by distinct lease token, so
  two executions under one lease, or a claim of a row someone else held, would show. Must be 0.
* stale settles: a succeeded job whose result (the lease token of the run that returned it,
  chaos/jobs.py) is not the lease the row held when it was settled (the trigger's record), i.e. a
  worker that had lost its lease overwrote the row; or a job settled as succeeded more than once.
  Must be 0. Settles that fencing refused are counted from the workers' logs ("lease lost before
  settling"): freezing a worker past its lease TTL (scenario 1) makes them happen for real.
* duplicates: executions beyond the first, per job, summed; each is explained by a crash.
* workflows: their counters agree with their rows (store/workflows.py check_invariants). Must hold.
"""

from __future__ import annotations

import json
import os
import random
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
import psycopg
from dygo.store import JobRequest, embedded, enqueue, enqueue_many
from dygo.store.config import load_settings
from dygo.store.loading import load_jobs
from dygo.store.migrate import migrate
from dygo.store.workflows import BATCH_JOBS, batch, check_invariants, enqueue_workflow
from psycopg.conninfo import make_conninfo

from chaos.jobs import MISBEHAVING  # also registers the chaos kinds here, which enqueue validates against

if TYPE_CHECKING:
    from tests.pgbouncer import PgBouncer

REPO = Path(__file__).resolve().parent.parent
CONFIG = REPO / "chaos" / "config"
# The runner enqueues as a producer of the chaos workers: their queues (`probe` is not in config/queues.yml).
load_jobs(load_settings(CONFIG))
LEASE_TTL = 3.0  # chaos/config/dygo.yml
# Scenario "presence": dygo's default lease TTL, the rest as in chaos/config.
CONFIG_DEFAULT_LEASE = REPO / "chaos" / "config_default_lease"
DEFAULT_LEASE_TTL = 30.0
PRESENCE_RECOVERY_LIMIT = 5.0  # seconds from a SIGKILL to every job of the killed worker running again
PRESENCE_FREEZE = 6.0  # seconds a worker stays paused: longer than that limit, shorter than the lease
SEASONED = 3.0  # seconds a worker runs before it is a victim: the others' watches have seen its lock by then
POLL_INTERVAL = 2.0
SHUTDOWN_TIMEOUT = 1.0

BOOKS_TABLES = """
CREATE TABLE chaos_runs (
    id          bigserial   PRIMARY KEY,
    job_id      bigint      NOT NULL,
    attempt     integer     NOT NULL,
    pid         integer     NOT NULL,
    lease_token uuid,
    execution   uuid        NOT NULL UNIQUE,
    started     timestamptz NOT NULL,  -- the handler's start; `at` is when its row got in (later across an outage)
    at          timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE INDEX ON chaos_runs (job_id);
CREATE TABLE chaos_lease_ends (
    job_id      bigint      NOT NULL,
    lease_token uuid,
    new_state   text        NOT NULL,
    reaped      boolean     NOT NULL,
    failed      boolean     NOT NULL,
    handed_back boolean     NOT NULL,
    at          timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE INDEX ON chaos_lease_ends (job_id);
CREATE FUNCTION chaos_lease_ended() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO chaos_lease_ends (job_id, lease_token, new_state, reaped, failed, handed_back)
    VALUES (NEW.id, OLD.lease_token, NEW.state, NEW.reap_count > OLD.reap_count,
            NEW.reap_count = OLD.reap_count AND jsonb_array_length(NEW.errors) > jsonb_array_length(OLD.errors),
            NEW.reap_count = OLD.reap_count AND NEW.state = 'pending' AND NEW.attempt < OLD.attempt
                AND jsonb_array_length(NEW.errors) = jsonb_array_length(OLD.errors));
    RETURN NULL;
END $$;
CREATE TRIGGER chaos_lease_ended AFTER UPDATE ON dygo_jobs FOR EACH ROW
    WHEN (OLD.state = 'active' AND NEW.state <> 'active') EXECUTE FUNCTION chaos_lease_ended();
-- Scenario 6's callback runs (chaos/jobs.py): a second run of one callback job would break the unique index.
CREATE TABLE chaos_callbacks (
    job_id            bigint      NOT NULL,
    lease_token       uuid,
    members_succeeded integer,
    at                timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE UNIQUE INDEX ON chaos_callbacks (job_id);
"""

# Per job: executions (distinct lease tokens and rows), and how its leases ended.
BOOKS = """
WITH runs AS (
    SELECT job_id, count(*) AS executions, count(DISTINCT lease_token) AS tokens
    FROM chaos_runs GROUP BY job_id
), ends AS (
    SELECT job_id, count(*) FILTER (WHERE reaped) AS reaped, count(*) FILTER (WHERE handed_back) AS handed_back,
           count(*) FILTER (WHERE failed) AS failed, count(*) FILTER (WHERE new_state = 'succeeded') AS successes,
           (array_agg(lease_token::text) FILTER (WHERE new_state = 'succeeded'))[1] AS settled_lease
    FROM chaos_lease_ends GROUP BY job_id
)
SELECT j.id, j.kind, j.state, j.last_error, j.result ->> 'token', coalesce(r.executions, 0), coalesce(r.tokens, 0),
       e.settled_lease, coalesce(e.successes, 0), coalesce(e.reaped, 0), coalesce(e.handed_back, 0),
       coalesce(e.failed, 0)
FROM dygo_jobs j LEFT JOIN runs r ON r.job_id = j.id LEFT JOIN ends e ON e.job_id = j.id"""


@dataclass
class Plan:
    """How big and how rough a run is; `short()` is the version inside `make test`."""

    jobs: int = 10_000
    faults: int = 12  # fault events injected over the run
    job_seconds: float = 0.05  # mean handler duration of the ordinary jobs
    workers: int = 3
    concurrency: int = 8
    timeout: float = 900.0  # a scenario that has not finished by then fails
    # Scenario 6: a batch of this many members with one callback, this many runs, on this many workers.
    members: int = 10_000
    workflow_runs: int = 3
    workflow_workers: int = 4

    @classmethod
    def short(cls) -> Plan:
        return cls(
            jobs=300,
            faults=2,
            job_seconds=0.08,
            workers=2,
            concurrency=8,
            timeout=90.0,
            members=2_000,
            workflow_runs=1,
            workflow_workers=2,
        )


@dataclass
class Report:
    scenario: str
    jobs: int = 0
    faults: int = 0  # crashes, freezes, restarts, terminations or deploys injected
    duplicates: int = 0
    lost: int = 0
    stuck: int = 0
    over_run: int = 0
    stale_settles: int = 0
    refused_settles: int = 0  # settles fencing refused (worker logs)
    max_recovery: float | None = None  # seconds; what it measures is in `recovery_means`
    recovery_means: str = ""
    seconds: float = 0.0
    problems: list[str] = field(default_factory=list)
    notes: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.problems


class WorkerProcess:
    """A real `dygo worker`; stdout and stderr go to files in the run's log directory."""

    def __init__(self, lab: Lab, url: str, *args: str, name: str, **env: str) -> None:
        self.stdout_path = lab.logs / f"{name}.out"
        self.stderr_path = lab.logs / f"{name}.err"
        with open(self.stdout_path, "w") as out, open(self.stderr_path, "w") as err:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "dygo", *args],
                cwd=REPO,
                env={**lab.env(url, pooled=args[0] == "worker"), **env},
                stdout=out,
                stderr=err,
            )
        self.pid = self.process.pid
        self.frozen_until: float | None = None
        self.started_at = time.monotonic()

    def stdout(self) -> str:
        return self.stdout_path.read_text()

    def stderr(self) -> str:
        return self.stderr_path.read_text()

    def alive(self) -> bool:
        return self.process.poll() is None

    def wait_started(self, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while "started" not in self.stdout() and "listening on" not in self.stderr():
            if not self.alive() or time.monotonic() > deadline:
                raise RuntimeError(f"dygo {self.process.args[3:]} did not start: {self.stderr()[-2000:]}")
            time.sleep(0.05)

    def kill(self) -> None:
        if self.alive():
            if self.frozen_until is not None:
                self.process.send_signal(signal.SIGCONT)
            self.process.kill()
            self.process.wait(10)


class Lab:
    """The dedicated embedded server, a fresh database per scenario, and the processes started."""

    def __init__(self, data_dir: Path, logs: Path, pgbouncer: bool = False) -> None:
        self.data_dir = data_dir
        self.logs = logs
        logs.mkdir(parents=True, exist_ok=True)
        for old in [*logs.glob("*.out"), *logs.glob("*.err")]:  # a previous run's, which would confuse a reader
            old.unlink()
        self.server_url = embedded.ensure_running(data_dir)
        self.config = CONFIG  # the DYGO_CONFIG_DIR of the processes started from now on
        self.processes: list[WorkerProcess] = []
        self.scenario = "lab"
        self.started = 0  # processes started so far, for unique log file names
        # --pgbouncer: workers reach PostgreSQL through a PgBouncer in transaction mode, LISTEN on the direct
        # URL (serve stays direct: its pooler support is its own piece of work). The suite's own
        # connections (books, faults) stay direct.
        self.pgbouncer: PgBouncer | None = None
        if pgbouncer:
            from tests.pgbouncer import PgBouncer, missing_reason

            reason = missing_reason()
            if reason:
                raise RuntimeError(f"--pgbouncer: {reason}")
            self.pgbouncer = PgBouncer(self.server_url, data_dir.parent / f"{data_dir.name}-pgbouncer")
            self.pgbouncer.start()

    def env(self, url: str, pooled: bool = True) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("DYGO_", "DATABASE_"))}
        env.update(DATABASE_URL=url, DYGO_CONFIG_DIR=str(self.config), PYTHONPATH=str(REPO), PYTHONUNBUFFERED="1")
        if self.pgbouncer is not None and pooled:
            env.update(DATABASE_URL=self.pgbouncer.url(url), DATABASE_DIRECT_URL=url)
        return env

    def database(self, scenario: str) -> str:
        self.scenario = scenario
        name = f"chaos_{scenario}"
        with psycopg.connect(self.server_url, autocommit=True) as admin:
            admin.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
            admin.execute(f"CREATE DATABASE {name}")
        url = make_conninfo(self.server_url, dbname=name)
        with psycopg.connect(url) as conn:
            migrate(conn)
            conn.execute(BOOKS_TABLES)
        return url

    def worker(self, url: str, *extra: str, concurrency: int, wait: bool = True) -> WorkerProcess:
        self.started += 1
        name = f"{self.scenario}-worker-{self.started}"
        process = WorkerProcess(
            self,
            url,
            "worker",
            "--concurrency",
            str(concurrency),
            "--poll-interval",
            f"{POLL_INTERVAL:g}s",
            "--shutdown-timeout",
            f"{SHUTDOWN_TIMEOUT:g}s",
            *extra,
            name=name,
        )
        self.processes.append(process)
        if wait:
            process.wait_started()
        return process

    def serve(self, url: str, port: int, **env: str) -> WorkerProcess:
        self.started += 1
        process = WorkerProcess(
            self, url, "serve", "--port", str(port), name=f"{self.scenario}-serve-{self.started}", **env
        )
        self.processes.append(process)
        return process

    def stop_all(self) -> None:
        for process in self.processes:
            process.kill()
        self.processes.clear()

    def close(self) -> None:
        if self.pgbouncer is not None:
            self.pgbouncer.stop()

    def stop_server(self) -> None:
        embedded.stop(self.data_dir)

    def start_server(self) -> None:
        self.server_url = embedded.ensure_running(self.data_dir)


# --- helpers -----------------------------------------------------------------------------------------


def db_now(conn: psycopg.Connection) -> float:
    return conn.execute("SELECT extract(epoch FROM clock_timestamp())::float8").fetchone()[0]


def enqueue_work(
    url: str, jobs: int, job_seconds: float, rng: random.Random, extra: list[JobRequest] | None = None
) -> None:
    requests = [
        JobRequest("chaos.work", {"seconds": round(rng.uniform(0, 2 * job_seconds), 4)}) for _ in range(jobs)
    ] + (extra or [])
    rng.shuffle(requests)
    with psycopg.connect(url, autocommit=True) as conn:
        for start in range(0, len(requests), 1000):
            enqueue_many(conn, requests[start : start + 1000])


def finished(conn: psycopg.Connection) -> tuple[int, int]:
    row = conn.execute(
        "SELECT count(*) FILTER (WHERE state IN ('succeeded', 'dead')), count(*) FROM dygo_jobs"
    ).fetchone()
    return row[0], row[1]


def drive(
    conn: psycopg.Connection,
    plan: Plan,
    fault: Callable[[int], None],
    tick: Callable[[], None] | None = None,
    faults: int | None = None,
) -> None:
    """Wait for every job to finish, calling `fault(n)` at evenly spaced points of progress."""
    faults = plan.faults if faults is None else faults
    total = finished(conn)[1]
    marks = [total * (n + 1) // (faults + 1) for n in range(faults)]
    deadline = time.monotonic() + plan.timeout
    injected = 0
    while True:
        done, total = finished(conn)
        while injected < len(marks) and done >= marks[injected]:
            fault(injected)
            injected += 1
        if done >= total and injected == len(marks):
            return
        if tick:
            tick()
        if time.monotonic() > deadline:
            raise TimeoutError(f"{total - done} of {total} jobs unfinished after {plan.timeout:g}s")
        time.sleep(0.05)


def worker_log_counts(workers: list[WorkerProcess]) -> dict[str, int]:
    text = "".join(w.stderr() for w in workers)
    return {
        "refused_settles": len(re.findall(r"lease lost before settling", text)),
        "outage_lost_lines": len(re.findall(r"database connection lost", text)),
        "outage_back_lines": len(re.findall(r"database connection back", text)),
        "tracebacks_in_logs": len(re.findall(r"^Traceback", text, re.MULTILINE)),
    }


def check_books(
    conn: psycopg.Connection,
    report: Report,
    expect_dead: dict[str, str] | None = None,
    may_run_again: frozenset[int] = frozenset(),
) -> None:
    """The books: lost, stuck, over-run, stale settles and duplicates, from the job rows and chaos tables.
    `may_run_again`: jobs allowed one execution more than their recorded crashes explain (a failover's: a
    claim committed on the old primary, not yet on the standby, is lost with it and made again)."""
    expect_dead = expect_dead or {}
    stuck = conn.execute("SELECT count(*) FROM dygo_jobs WHERE state = 'active' AND lease_deadline < now()").fetchone()[
        0
    ]
    report.stuck = stuck
    lost, over, stale, duplicates, jobs = 0, 0, 0, 0, 0
    examples: list[str] = []
    for (
        job_id,
        kind,
        state,
        last_error,
        result_token,
        executions,
        tokens,
        settled_lease,
        successes,
        reaped,
        handed_back,
        failed,
    ) in conn.execute(BOOKS):
        jobs += 1
        if kind in expect_dead:
            ok = state == "dead" and expect_dead[kind] in (last_error or "") and executions >= 1
        else:
            ok = state == "succeeded" and executions >= 1
        if not ok:
            lost += 1
            examples.append(f"job {job_id} {kind}: {state}, {executions} run(s), error {last_error!r}")
        crashes = reaped + handed_back + failed
        if executions > 1 + crashes + (job_id in may_run_again) or tokens < executions:
            over += 1
            examples.append(f"job {job_id}: {executions} run(s) ({tokens} lease(s)) but {crashes} crash(es)")
        if state == "succeeded" and (result_token != settled_lease or successes != 1):
            stale += 1
            examples.append(
                f"job {job_id}: result from lease {result_token}, row held {settled_lease} "
                f"when settled ({successes} success settle(s))"
            )
        duplicates += max(0, executions - 1)
    report.jobs, report.lost, report.over_run, report.stale_settles, report.duplicates = (
        jobs,
        lost,
        over,
        stale,
        duplicates,
    )
    for name, value in (("lost", lost), ("stuck active", stuck), ("over-run", over), ("stale settles", stale)):
        if value:
            report.problems.append(f"{value} {name}")
    # Workflows' counters against their rows (scenario 6 runs one; the others have none to disagree).
    violations = check_invariants(conn)
    if violations:
        report.problems.append(f"{len(violations)} workflow invariant violations: {violations[:5]}")
    if examples:
        report.notes["examples"] = examples[:10]


def max_first_run_after(
    conn: psycopg.Connection, events: list[tuple[float, list[int]]], notes: dict[str, Any]
) -> float | None:
    """For each (moment, job ids) event: how long until all those jobs had run again; the worst one. `notes`
    gets the slowest job's history (its errors and runs), so a slow recovery explains itself in the report."""
    worst: float | None = None
    slowest: tuple[int, float] | None = None  # (job id, moment of its event)
    for moment, ids in events:
        if not ids:
            continue
        row = conn.execute(
            "SELECT job_id, first::float8 FROM (SELECT job_id, min(extract(epoch FROM at)) AS first FROM chaos_runs "
            "WHERE job_id = ANY(%s) AND at > to_timestamp(%s) GROUP BY job_id) t ORDER BY first DESC LIMIT 1",
            (ids, moment),
        ).fetchone()
        if row is not None and (worst is None or row[1] - moment > worst):
            worst, slowest = row[1] - moment, (row[0], moment)
    if slowest is not None:
        notes["slowest_recovery"] = job_history(conn, *slowest)
    return worst


def job_history(conn: psycopg.Connection, job_id: int, moment: float) -> dict[str, Any]:
    """A job's errors and runs, their times in seconds after `moment`."""
    errors, reaps = conn.execute("SELECT errors, reap_count FROM dygo_jobs WHERE id = %s", (job_id,)).fetchone()
    runs = conn.execute(
        "SELECT round((extract(epoch FROM at) - %s)::numeric, 3)::float8, pid FROM chaos_runs "
        "WHERE job_id = %s ORDER BY at",
        (moment, job_id),
    ).fetchall()
    return {
        "job": job_id,
        "reaps": reaps,
        "runs (s after the fault, pid)": [list(r) for r in runs],
        "errors": [{k: e.get(k) for k in ("attempt", "at", "worker", "error")} for e in errors or []],
    }


def active_ids_of(conn: psycopg.Connection, pid: int) -> list[int]:
    owner = f"{socket.gethostname()}:{pid}:%"
    return [
        r[0] for r in conn.execute("SELECT id FROM dygo_jobs WHERE state = 'active' AND lease_owner LIKE %s", (owner,))
    ]


def settle_down(conn: psycopg.Connection) -> None:
    """Let a frozen or killed worker's last leases run out and be recovered before the books."""
    deadline = time.monotonic() + LEASE_TTL * 4
    while time.monotonic() < deadline:
        if not conn.execute("SELECT 1 FROM dygo_jobs WHERE state = 'active' LIMIT 1").fetchone():
            return
        time.sleep(0.1)


# --- scenarios ------------------------------------------------------------------------------------------


def scenario_kill(lab: Lab, plan: Plan, rng: random.Random) -> Report:
    """1. SIGKILL random workers at random moments (and now and then freeze one past its lease
    TTL with SIGSTOP, so its settles arrive stale), restarting the killed ones at once."""
    report = Report("1. SIGKILL / freeze workers", recovery_means="kill or freeze to all its jobs running again")
    url = lab.database("kill")
    enqueue_work(url, plan.jobs, plan.job_seconds, rng)
    workers = [lab.worker(url, concurrency=plan.concurrency) for _ in range(plan.workers)]
    events: list[tuple[float, list[int]]] = []
    kills, freezes = 0, 0
    with psycopg.connect(url, autocommit=True) as conn:

        def fault(n: int) -> None:
            nonlocal kills, freezes
            time.sleep(rng.uniform(0, 0.5))  # a random moment, not exactly at the progress mark
            victim = rng.choice([w for w in workers if w.alive() and w.frozen_until is None])
            if n % 2 == 1:
                victim.process.send_signal(signal.SIGSTOP)
                victim.frozen_until = time.monotonic() + LEASE_TTL + 1.5
                freezes += 1
            else:
                victim.process.kill()
                victim.process.wait(10)
                workers.remove(victim)
                workers.append(lab.worker(url, concurrency=plan.concurrency, wait=False))
                kills += 1
            events.append((db_now(conn), active_ids_of(conn, victim.pid)))

        def thaw() -> None:
            for w in workers:
                if w.frozen_until is not None and time.monotonic() >= w.frozen_until:
                    w.process.send_signal(signal.SIGCONT)
                    w.frozen_until = None

        started = time.monotonic()
        drive(conn, plan, fault, tick=thaw)
        report.seconds = time.monotonic() - started
        for _ in range(100):  # a frozen worker still to thaw: its stale settles are part of the test
            if all(w.frozen_until is None for w in workers):
                break
            thaw()
            time.sleep(0.1)
        time.sleep(0.5)
        settle_down(conn)
        check_books(conn, report)
        report.max_recovery = max_first_run_after(conn, events, report.notes)
    counts = worker_log_counts(lab.processes)
    report.refused_settles = counts["refused_settles"]
    report.faults = kills + freezes
    report.notes.update(kills=kills, freezes=freezes, faults_per_minute=round(report.faults / report.seconds * 60, 1))
    if freezes and not report.refused_settles:
        report.notes["freeze"] = "no stale settle happened to be attempted (the frozen worker held no job)"
    lab.stop_all()
    return report


def busy_seasoned_worker(conn: psycopg.Connection, workers: list[WorkerProcess], rng: random.Random) -> WorkerProcess:
    """A worker holding jobs and running for SEASONED seconds at least: one started moments ago may not have
    been seen holding its presence lock yet by the others, and would be left to its lease."""
    deadline = time.monotonic() + 30.0
    while True:
        seasoned = [w for w in workers if w.alive() and time.monotonic() - w.started_at >= SEASONED]
        busy = [w for w in seasoned if active_ids_of(conn, w.pid)]
        if busy:
            return rng.choice(busy)
        if time.monotonic() > deadline:
            raise TimeoutError("no seasoned worker held a job for 30s")
        time.sleep(0.05)


def scenario_presence(lab: Lab, plan: Plan, rng: random.Random) -> Report:
    """7. At dygo's default lease TTL (30 s): pause a worker with SIGSTOP for PRESENCE_FREEZE (its session
    stays open: it keeps its jobs, none is recovered or run twice) or SIGKILL one (its jobs must all run again
    within PRESENCE_RECOVERY_LIMIT, through its presence lock, not its lease), by turns."""
    report = Report("7. SIGKILL / pause at the default lease", recovery_means="kill to all its jobs running again")
    url = lab.database("presence")
    # Longer jobs than the other scenarios': the run must outlast pauses of PRESENCE_FREEZE.
    enqueue_work(url, plan.jobs, plan.job_seconds * 4, rng)
    lab.config = CONFIG_DEFAULT_LEASE
    try:
        workers = [lab.worker(url, concurrency=plan.concurrency) for _ in range(plan.workers)]
    finally:
        lab.config = CONFIG
    kills: list[tuple[float, list[int]]] = []
    freezes: list[tuple[float, float, list[int]]] = []  # (paused at, resumed at, its active jobs) on the db clock
    with psycopg.connect(url, autocommit=True) as conn:

        def fault(n: int) -> None:
            time.sleep(rng.uniform(0, 0.5))
            victim = busy_seasoned_worker(conn, workers, rng)
            if n % 2 == 0:
                victim.process.send_signal(signal.SIGSTOP)
                paused_at, held = db_now(conn), active_ids_of(conn, victim.pid)
                time.sleep(PRESENCE_FREEZE)
                victim.process.send_signal(signal.SIGCONT)
                freezes.append((paused_at, db_now(conn), held))
                return
            victim.process.kill()
            victim.process.wait(10)
            kills.append((db_now(conn), active_ids_of(conn, victim.pid)))
            workers.remove(victim)
            lab.config = CONFIG_DEFAULT_LEASE
            try:
                workers.append(lab.worker(url, concurrency=plan.concurrency, wait=False))
            finally:
                lab.config = CONFIG

        started = time.monotonic()
        drive(conn, plan, fault)
        report.seconds = time.monotonic() - started
        settle_down(conn)
        check_books(conn, report)
        report.max_recovery = max_first_run_after(conn, kills, report.notes)
        frozen_jobs = sorted({job for _, _, held in freezes for job in held})
        lost_by_pause = conn.execute(
            "SELECT count(*) FROM chaos_lease_ends WHERE job_id = ANY(%s) AND reaped", (frozen_jobs,)
        ).fetchone()[0]
        run_twice = conn.execute(
            "SELECT count(*) FROM (SELECT job_id FROM chaos_runs WHERE job_id = ANY(%s) GROUP BY job_id "
            "HAVING count(*) > 1) t",
            (frozen_jobs,),
        ).fetchone()[0]
    report.faults = len(kills) + len(freezes)
    report.refused_settles = worker_log_counts(lab.processes)["refused_settles"]
    report.notes.update(
        kills=len(kills),
        freezes=len(freezes),
        jobs_held_by_killed=sum(len(held) for _, held in kills),
        jobs_held_by_paused=len(frozen_jobs),
        paused_jobs_recovered=lost_by_pause,
        paused_jobs_run_twice=run_twice,
        pause_seconds=PRESENCE_FREEZE,
        recovery_limit=PRESENCE_RECOVERY_LIMIT,
        lease_ttl=DEFAULT_LEASE_TTL,
    )
    if not kills or not any(held for _, held in kills):
        report.problems.append("no kill caught a worker holding jobs")
    if not frozen_jobs:
        report.problems.append("no pause caught a worker holding jobs")
    if report.max_recovery is not None and report.max_recovery > PRESENCE_RECOVERY_LIMIT:
        report.problems.append(f"a killed worker's jobs ran again {report.max_recovery:.2f}s after the kill")
    if lost_by_pause or run_twice:
        report.problems.append(f"a pause alone cost jobs: {lost_by_pause} recovered, {run_twice} run twice")
    lab.stop_all()
    return report


def scenario_db_restart(lab: Lab, plan: Plan, rng: random.Random, outage: float = 4.0) -> Report:
    """2. Restart PostgreSQL mid-run: workers and serve reconnect by themselves, log it once each,
    and serve answers 503 database_unavailable (JSON, no stack trace) while it is down."""
    report = Report("2. PostgreSQL restart", recovery_means="database back up to the first job settled")
    url = lab.database("restart")
    # Slower jobs, so that the run outlasts stopping and starting the server.
    enqueue_work(url, plan.jobs, plan.job_seconds * 3, rng)
    workers = [lab.worker(url, concurrency=plan.concurrency) for _ in range(plan.workers)]
    port = free_port()
    serve = lab.serve(url, port)
    client = httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=15)
    wait_for(lambda: get_status(client, "/readyz") == 200, 30, "serve to be ready")
    restarts = max(1, plan.faults // 4)
    recoveries: list[float] = []
    answers: list[str] = []
    conn = psycopg.connect(url, autocommit=True)
    started = time.monotonic()

    def fault(n: int) -> None:
        nonlocal conn
        conn.close()
        lab.stop_server()
        down_at = time.time()
        while time.time() - down_at < outage:
            try:
                reply = client.get("/api/v1/jobs", params={"limit": 1})
                body = reply.json()
                answers.append(f"{reply.status_code} {body.get('error', {}).get('code')}")
            except (httpx.HTTPError, ValueError) as exc:
                answers.append(f"no answer: {exc}")
            time.sleep(0.3)
        lab.start_server()
        up_at = time.time()
        conn = psycopg.connect(url, autocommit=True)
        wait_for(
            lambda: (
                conn.execute("SELECT count(*) FROM chaos_lease_ends WHERE at > to_timestamp(%s)", (up_at,)).fetchone()[
                    0
                ]
                > 0
                or finished(conn)[0] == finished(conn)[1]
            ),
            60,
            "a job to settle after the restart",
        )
        first = conn.execute(
            "SELECT extract(epoch FROM min(at))::float8 FROM chaos_lease_ends WHERE at > to_timestamp(%s)", (up_at,)
        ).fetchone()[0]
        if first is not None:
            recoveries.append(first - up_at)
        wait_for(lambda: get_status(client, "/readyz") == 200, 30, "serve to be ready again")

    class Reconnecting:
        def __getattr__(self, name: str) -> Any:
            return getattr(conn, name)

    drive(Reconnecting(), plan, fault, faults=restarts)  # type: ignore[arg-type]
    report.seconds = time.monotonic() - started
    settle_down(conn)
    check_books(conn, report)
    conn.close()
    client.close()
    report.faults = restarts
    report.max_recovery = max(recoveries) if recoveries else None
    bad_answers = [a for a in answers if a not in ("503 database_unavailable",)]
    report.notes.update(outage_seconds=outage, serve_answers_while_down=sorted(set(answers)))
    if not answers:
        report.problems.append("serve was never asked while the database was down")
    if bad_answers:
        report.problems.append(f"serve answered {sorted(set(bad_answers))} while the database was down")
    for w in workers:
        if not w.alive():
            report.problems.append(f"worker pid {w.pid} exited: {w.stderr()[-500:]}")
    per_process = {p.stderr_path.name: worker_log_counts([p]) for p in [*workers, serve]}
    for name, counts in per_process.items():
        lost, back = counts["outage_lost_lines"], counts["outage_back_lines"]
        if lost != restarts or back != restarts:
            report.problems.append(
                f"{name}: {lost} 'connection lost' and {back} 'connection back' lines "
                f"for {restarts} outage(s); expected one each"
            )
        if counts["tracebacks_in_logs"]:
            report.problems.append(f"{name}: a traceback in the log")
    report.notes["log_lines_per_process"] = {
        n: (c["outage_lost_lines"], c["outage_back_lines"]) for n, c in per_process.items()
    }
    report.refused_settles = worker_log_counts(workers)["refused_settles"]
    lab.stop_all()
    return report


def scenario_terminate(lab: Lab, plan: Plan, rng: random.Random) -> Report:
    """3. pg_terminate_backend on every worker connection, the LISTEN one included; right after,
    a job on an idle queue must still start within the poll interval."""
    report = Report("3. pg_terminate_backend", recovery_means="wake-up delay of a job enqueued right after")
    url = lab.database("terminate")
    enqueue_work(url, plan.jobs, plan.job_seconds, rng)
    workers = [lab.worker(url, concurrency=plan.concurrency) for _ in range(plan.workers)]
    probes: list[int] = []
    terminated = 0
    with psycopg.connect(url, autocommit=True) as conn:

        def fault(n: int) -> None:
            nonlocal terminated
            # Alternate: only the LISTEN connections, then every connection of the workers.
            pattern = "dygo-worker-listen %" if n % 2 == 0 else "dygo-worker%"
            killed = conn.execute(
                "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) FROM pg_stat_activity "
                "WHERE datname = current_database() AND application_name LIKE %s",
                (pattern,),
            ).fetchone()[0]
            terminated += killed
            if n % 2 == 0 and killed < len(workers):
                report.problems.append(f"found {killed} LISTEN connection(s) for {len(workers)} workers")
            probes.append(enqueue(conn, "chaos.probe", {}).id)

        started = time.monotonic()
        drive(conn, plan, fault)
        report.seconds = time.monotonic() - started
        settle_down(conn)
        check_books(conn, report)
        delays = [
            r[0]
            for r in conn.execute(
                "SELECT extract(epoch FROM min(r.at) - j.enqueued_at)::float8 FROM dygo_jobs j "
                "JOIN chaos_runs r ON r.job_id = j.id WHERE j.id = ANY(%s) GROUP BY j.id, j.enqueued_at",
                (probes,),
            )
        ]
    report.faults = plan.faults
    report.max_recovery = max(delays) if delays else None
    report.notes.update(
        backends_terminated=terminated, probe_delays=[round(d, 3) for d in delays], poll_interval=POLL_INTERVAL
    )
    if len(delays) != len(probes):
        report.problems.append(f"{len(probes) - len(delays)} probe job(s) never ran")
    if delays and max(delays) > POLL_INTERVAL:
        report.problems.append(f"a wake-up took {max(delays):.2f}s, longer than the poll interval")
    for w in workers:
        if not w.alive():
            report.problems.append(f"worker pid {w.pid} exited: {w.stderr()[-500:]}")
    report.refused_settles = worker_log_counts(workers)["refused_settles"]
    lab.stop_all()
    return report


def running_a_long_job(
    conn: psycopg.Connection, worker: WorkerProcess, seconds: float, count: int, timeout: float = 30.0
) -> None:
    """Make sure the deploy about to stop `worker` catches a long job: a deploy that catches none proves
    nothing, and with long jobs spread at random among short ones some deploys caught none (a flaky test).
    Unless it already runs one, `count` long jobs jump the queue and this waits until it has claimed one.
    Other workers, the new one above all, may take every long job first: then `count` more jump the queue."""
    mine = (
        "SELECT EXISTS (SELECT FROM dygo_jobs WHERE state = 'active' AND kind = 'chaos.work' "
        "AND (args->>'seconds')::float8 = %s AND split_part(lease_owner, ':', 2) = %s)"
    )
    queued = (
        "SELECT EXISTS (SELECT FROM dygo_jobs WHERE state = 'available' AND kind = 'chaos.work' "
        "AND (args->>'seconds')::float8 = %s AND priority = 10)"
    )
    deadline = time.monotonic() + timeout
    batches = 0
    while not conn.execute(mine, (seconds, str(worker.pid))).fetchone()[0]:
        if time.monotonic() > deadline:
            raise TimeoutError(f"worker pid {worker.pid} claimed none of {batches} x {count} long jobs in {timeout:g}s")
        if not conn.execute(queued, (seconds,)).fetchone()[0]:
            enqueue_many(conn, [JobRequest("chaos.work", {"seconds": seconds}, priority=10) for _ in range(count)])
            batches += 1
        time.sleep(0.02)


def scenario_deploy(lab: Lab, plan: Plan, rng: random.Random, long_seconds: float = 3.0) -> Report:
    """4. Rolling deploys with long jobs: start a new worker, SIGTERM the oldest. Jobs that cannot
    finish within the shutdown timeout are handed straight back and restarted by another worker."""
    report = Report("4. SIGTERM during deploys", recovery_means="hand-back to running again")
    url = lab.database("deploy")
    long_jobs = max(plan.workers * 2, plan.jobs // 100)
    extra = [JobRequest("chaos.work", {"seconds": long_seconds}) for _ in range(long_jobs)]
    enqueue_work(url, plan.jobs - long_jobs, plan.job_seconds, rng, extra)
    workers = [lab.worker(url, concurrency=plan.concurrency) for _ in range(plan.workers)]
    drains: list[float] = []
    exit_codes: list[int] = []
    handed_back = 0
    with psycopg.connect(url, autocommit=True) as conn:

        def fault(n: int) -> None:
            nonlocal handed_back
            workers.append(lab.worker(url, concurrency=plan.concurrency))
            old = workers.pop(0)
            running_a_long_job(conn, old, long_seconds, plan.concurrency)
            sent = time.monotonic()
            old.process.send_signal(signal.SIGTERM)
            exit_codes.append(old.process.wait(SHUTDOWN_TIMEOUT + 30))
            drains.append(time.monotonic() - sent)
            found = re.search(r"handing back \d+ unfinished job\(s\): ([\d, ]+)", old.stderr())
            ids = [int(x) for x in found.group(1).split(",")] if found else []
            handed_back += len(ids)

        started = time.monotonic()
        drive(conn, plan, fault)
        report.seconds = time.monotonic() - started
        settle_down(conn)
        check_books(conn, report)
        report.max_recovery = conn.execute(
            "SELECT max((SELECT extract(epoch FROM min(r.at) - e.at) FROM chaos_runs r "
            "            WHERE r.job_id = e.job_id AND r.at > e.at))::float8 "
            "FROM chaos_lease_ends e WHERE e.handed_back"
        ).fetchone()[0]
    report.faults = plan.faults
    report.notes.update(
        handed_back=handed_back,
        long_jobs=long_jobs,
        long_job_seconds=long_seconds,
        shutdown_timeout=SHUTDOWN_TIMEOUT,
        max_drain_seconds=round(max(drains), 2),
    )
    if any(code != 0 for code in exit_codes):
        report.problems.append(f"a worker exited with {exit_codes} on SIGTERM")
    if max(drains) > SHUTDOWN_TIMEOUT + 5:
        report.problems.append(f"a worker took {max(drains):.1f}s to stop (shutdown timeout {SHUTDOWN_TIMEOUT}s)")
    if not handed_back:
        report.problems.append("no job was handed back: the deploys never caught a long job")
    report.refused_settles = worker_log_counts(lab.processes)["refused_settles"]
    if report.refused_settles:  # no lease runs out in a deploy: a refused settle is a settle sent twice
        report.problems.append(f"{report.refused_settles} settle(s) refused although no lease was lost")
    lab.stop_all()
    return report


def scenario_bad_handlers(lab: Lab, plan: Plan, rng: random.Random) -> Report:
    """5. Handlers that hang past their timeout, raise, exit their thread or the interpreter, or
    return what cannot be stored: each ends dead with its error recorded; the one worker stays up."""
    report = Report("5. Misbehaving handlers", recovery_means="longest claim-to-settle of a misbehaving job")
    url = lab.database("handlers")
    kinds = sorted(MISBEHAVING)
    bad = max(len(kinds) * 2, plan.jobs // 10)
    extra = [JobRequest(kinds[i % len(kinds)], {}) for i in range(bad)]
    enqueue_work(url, plan.jobs - bad, plan.job_seconds / 5, rng, extra)
    worker = lab.worker(url, concurrency=plan.concurrency)
    with psycopg.connect(url, autocommit=True) as conn:
        started = time.monotonic()
        drive(conn, plan, lambda n: None, faults=0)
        report.seconds = time.monotonic() - started
        check_books(conn, report, expect_dead=MISBEHAVING)
        report.max_recovery = conn.execute(
            "SELECT max(extract(epoch FROM e.at - r.at))::float8 FROM chaos_lease_ends e JOIN chaos_runs r "
            "ON r.lease_token = e.lease_token JOIN dygo_jobs j ON j.id = e.job_id WHERE j.kind <> 'chaos.work'"
        ).fetchone()[0]
        by_kind = dict(conn.execute("SELECT kind, count(*) FROM dygo_jobs WHERE state = 'dead' GROUP BY kind"))
    report.faults = bad
    report.notes.update(misbehaving_by_kind=by_kind)
    if not worker.alive():
        report.problems.append(f"the worker exited: {worker.stderr()[-1000:]}")
    if len(lab.processes) != 1:
        report.problems.append("the worker had to be restarted")
    lab.stop_all()
    return report


CALLBACK_LAG = 1.0  # seconds from the last member's settle to the callback's start, at most
KILL_EVERY = (1.5, 3.5)  # seconds between two kills of scenario 6, drawn at random

# The batch's two nodes, and what the callback's start lagged behind the members' last settle.
BATCH_FACTS = """
SELECT w.state, g.state, g.jobs, g.succeeded, g.jobs_left, c.state, c.job_id, cb.state, cb.errors,
       extract(epoch FROM cb.started_at - (SELECT max(finished_at) FROM dygo_jobs WHERE node_id = g.id))::float8
FROM dygo_workflows w
JOIN dygo_nodes g ON g.workflow_id = w.id AND g.name = 'jobs'
JOIN dygo_nodes c ON c.workflow_id = w.id AND c.name = 'on_success'
LEFT JOIN dygo_jobs cb ON cb.id = c.job_id
WHERE w.id = %s"""


def scenario_workflow(lab: Lab, plan: Plan, rng: random.Random) -> Report:
    """6. A batch of `plan.members` jobs with one on_success callback, `plan.workflow_workers` workers, one of
    them SIGKILLed every few seconds (and restarted) until the members have all ended (at most `plan.faults`
    kills a run); `plan.workflow_runs`
    runs, each on a fresh database. Each run: every member ran and succeeded (the books), the callback ran
    exactly once (its record sits under a unique index on its job id) and saw every member succeeded, the
    counters agree with the rows (store/workflows.py check_invariants), and the callback started within
    CALLBACK_LAG of the last member's settle (its started_at against the members' latest finished_at)."""
    report = Report("6. Batch callback, SIGKILL workers", recovery_means="last member settled to callback started")
    lags: list[float] = []
    kills_per_run: list[int] = []
    started = time.monotonic()
    for run_number in range(1, plan.workflow_runs + 1):
        part = Report(f"run {run_number}")
        url = lab.database(f"workflow_{run_number}")
        members = [{"seconds": round(rng.uniform(0, plan.job_seconds), 4)} for _ in range(plan.members)]
        with psycopg.connect(url, autocommit=True) as conn:
            handle = enqueue_workflow(
                conn, batch(f"chaos batch {run_number}", "chaos.work", members, on_success=("chaos.callback", {}))
            )
            workers = [lab.worker(url, concurrency=plan.concurrency) for _ in range(plan.workflow_workers)]
            kills = 0
            next_kill = time.monotonic() + rng.uniform(*KILL_EVERY)
            deadline = time.monotonic() + plan.timeout
            while conn.execute("SELECT state = 'running' FROM dygo_workflows WHERE id = %s", (handle.id,)).fetchone()[
                0
            ]:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"the batch of run {run_number} had not ended after {plan.timeout:g}s")
                members_left = conn.execute(
                    "SELECT jobs_left FROM dygo_nodes WHERE id = %s", (handle.nodes[BATCH_JOBS],)
                ).fetchone()[0]
                # Kills stop once the members have ended: a kill during the callback's own run would run it
                # again by design (at least once), which is not what this scenario proves.
                if members_left and kills < plan.faults and time.monotonic() >= next_kill:
                    victim = rng.choice([w for w in workers if w.alive()])
                    victim.process.kill()
                    victim.process.wait(10)
                    workers.remove(victim)
                    workers.append(lab.worker(url, concurrency=plan.concurrency, wait=False))
                    kills += 1
                    next_kill = time.monotonic() + rng.uniform(*KILL_EVERY)
                time.sleep(0.05)
            settle_down(conn)
            check_books(conn, part)
            facts = conn.execute(BATCH_FACTS, (handle.id,)).fetchone()
            workflow_state, group_state, jobs, succeeded, jobs_left, callback_node, callback_id = facts[:7]
            callback_state, callback_errors, lag = facts[7:]
            callback_runs = conn.execute("SELECT members_succeeded FROM chaos_callbacks").fetchall()
        kills_per_run.append(kills)
        if lag is not None:
            lags.append(lag)
        expected = (
            ("workflow", workflow_state, "succeeded"),
            ("members node", (group_state, jobs, succeeded, jobs_left), ("succeeded", plan.members, plan.members, 0)),
            ("callback node and job", (callback_node, callback_state), ("succeeded", "succeeded")),
            ("callback's errors", callback_errors, []),
            ("callback runs (members it saw succeeded)", callback_runs, [(plan.members,)]),
        )
        for what, found, wanted in expected:
            if found != wanted:
                part.problems.append(f"{what}: {found!r}, expected {wanted!r}")
        if lag is None or lag > CALLBACK_LAG:
            part.problems.append(f"the callback started {lag}s after the last member settled (at most {CALLBACK_LAG}s)")
        if not kills:
            part.problems.append("no worker was killed while the members ran")
        for worker in workers:
            if not worker.alive():
                part.problems.append(f"worker pid {worker.pid} exited: {worker.stderr()[-500:]}")
        part.refused_settles = worker_log_counts(lab.processes)["refused_settles"]
        lab.stop_all()
        for name in ("jobs", "duplicates", "lost", "stuck", "over_run", "stale_settles", "refused_settles"):
            setattr(report, name, getattr(report, name) + getattr(part, name))
        report.problems += [f"run {run_number}: {problem}" for problem in part.problems]
        if "examples" in part.notes:
            report.notes.setdefault("examples", []).extend(part.notes["examples"])
        print(
            f"workflow run {run_number}: {plan.members:,} members, {kills} kill(s), callback started "
            f"{'-' if lag is None else f'{lag:.3f}s'} after the last member settled",
            file=sys.stderr,
        )
    report.seconds = time.monotonic() - started
    report.faults = sum(kills_per_run)
    report.max_recovery = max(lags) if lags else None
    report.notes.update(
        runs=plan.workflow_runs,
        members=plan.members,
        workers=plan.workflow_workers,
        kills_per_run=kills_per_run,
        callback_lags=[round(lag, 3) for lag in lags],
        callback_lag_limit=CALLBACK_LAG,
    )
    return report


def scenario_failover(lab: Lab, plan: Plan, rng: random.Random) -> Report:
    from chaos.failover import scenario_failover as failover  # its own module: it builds its own servers

    return failover(lab, plan, rng)


def scenario_replica(lab: Lab, plan: Plan, rng: random.Random) -> Report:
    from chaos.failover import scenario_replica as replica

    return replica(lab, plan, rng)


SCENARIOS: dict[str, Callable[[Lab, Plan, random.Random], Report]] = {
    "kill": scenario_kill,
    "restart": scenario_db_restart,
    "terminate": scenario_terminate,
    "deploy": scenario_deploy,
    "handlers": scenario_bad_handlers,
    "workflow": scenario_workflow,
    "presence": scenario_presence,
    "failover": scenario_failover,
    "replica": scenario_replica,
}


def run(names: list[str], plan: Plan, lab: Lab, seed: int = 1) -> list[Report]:
    reports = []
    for name in names:
        rng = random.Random(f"{seed}:{name}")
        try:
            reports.append(SCENARIOS[name](lab, plan, rng))
        finally:
            lab.stop_all()
    return reports


# --- small utilities ---------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get_status(client: httpx.Client, path: str) -> int | None:
    try:
        return client.get(path).status_code
    except httpx.HTTPError:
        return None


def wait_for(predicate: Callable[[], Any], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:g}s waiting for {what}")
        time.sleep(0.05)


def table(reports: list[Report]) -> str:
    """The report as a Markdown table."""
    lines = [
        "| Scenario | Jobs | Faults injected | Duplicates executed | Lost | Stuck | Stale settles "
        "(refused) | Max recovery | Took |",
        "|---|---:|---:|---:|---:|---:|---:|---|---:|",
    ]
    for r in reports:
        recovery = "-" if r.max_recovery is None else f"{r.max_recovery:.2f}s ({r.recovery_means})"
        lines.append(
            f"| {r.scenario} | {r.jobs:,} | {r.faults:,} | {r.duplicates:,} | {r.lost} | {r.stuck} | "
            f"{r.stale_settles} ({r.refused_settles}) | {recovery} | {r.seconds:.0f}s |"
        )
    return "\n".join(lines)


def as_json(reports: list[Report]) -> str:
    return json.dumps([asdict(r) | {"ok": r.ok} for r in reports], indent=2, default=str)
