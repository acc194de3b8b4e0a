"""Workflows through real workers: fan-in latency, and jobs/s through chains and a fan-out/fan-in against
plain jobs of the same count (bench/README.md, "Workflows").

    .venv/bin/python bench/workflows.py --markdown                 # everything: 1 and 4 workers, 3 passes
    .venv/bin/python bench/workflows.py --quick                    # smaller counts, one pass: a smoke run
    .venv/bin/python bench/workflows.py --functions --repeat 1     # + time in the trigger functions per drain
    .venv/bin/python bench/workflows.py --only fan-out --workers 4 --concurrency 4 --fan-out-groups 100
    .venv/bin/python bench/workflows.py --quick --variants current,row,deferred

On a fresh database (`bench_workflows` on the embedded server, `dygo db url`), for each fleet size in
`--workers` (real `dygo worker` processes, `--concurrency` 200 and claims of `--claim-batch-size` 100 each,
log level WARNING, the no-op jobs of `bench/bench_jobs.py`), `--repeat` times, the fleets taking turns:

* fan-in: a batch of N no-op jobs with an `on_complete` callback (`store.workflows.batch`), for each N of
  `--fan-in`. Fan-in latency = the callback job's `started_at` - the last member's `finished_at`: the last
  settle's transaction (whose trigger ends the group and releases the callback), its commit, the wake-up
  and the claim.
* chains: `--chains` workflows of 3 single-job nodes, one after the other, all enqueued in one
  transaction, then as many plain no-op jobs in one transaction (the bare reference). jobs/s = jobs /
  (last finish - first start), from the rows. Chain latency = the workflow's `finished_at` - the
  enqueue's commit (a `clock_timestamp()` just before it): under a burst, a chain waits behind the others.
* fan-out: one workflow of a start job, a group of `--fan-out` jobs after it (or as many jobs in
  `--fan-out-groups` sibling groups) and an end job after it, then as many plain jobs.
* paced: `--paced-chains` 3-step chains enqueued one at a time `--pace` seconds apart on idle workers:
  end-to-end latency (the workflow's `finished_at` - `created_at`), each hop (a node's `started_at` - the
  node before's `finished_at`) and each job's run; then as many plain jobs at the same pace, whose pickup
  (`started_at` - `enqueued_at`) is what a hop compares with.

With `track_commit_timestamp = on` on the server, the fan-in latency and each hop are split at the commit of
the transaction that ended the node (`pg_xact_commit_timestamp` of the node row's xmin). Each drain records
the CPU per job of the workers and of the server from the enqueue's commit to the drain's end, and samples
what the worker backends wait on (`pg_stat_activity` every `--sample-interval` s; for a lock, its type and
relation from `pg_locks`), as bench/fleet.py does: a node row that serialises settles shows there.
`--functions` also reads `pg_stat_user_functions` around each drain (`track_functions = pl` on the
database). `--variants` installs, fleet by fleet in turn, the ways of counting workflow jobs of
bench/workflow_triggers.py. Everything else is measured from the rows (`now()` of the writing transactions).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_jobs  # noqa: E402, F401  (registers bench.noop, as a producer that enqueues it would)
import workflow_triggers  # noqa: E402
from common import (  # noqa: E402
    ROOT,
    WorkerProcess,
    log,
    machine_busy_seconds,
    parent_pid,
    percentile,
    process_cpu_seconds,
    server_cpu_seconds,
    wait_until,
)
from common import (
    paced as pacing,  # this module's `paced` is the scenario
)
from run import background_load, embedded_server_url, fresh_database  # noqa: E402

sys.path.insert(0, str(ROOT))
from dygo.store import enqueue_many  # noqa: E402
from dygo.store.enqueue import JobRequest  # noqa: E402
from dygo.store.migrate import migrate  # noqa: E402
from dygo.store.workflows import Workflow, batch, chain, enqueue_workflow  # noqa: E402

DATABASE = "bench_workflows"
KIND = "bench.noop"
SCENARIOS = ("fan-in", "chains", "fan-out", "paced")
ENDED = ("succeeded", "failed", "cancelled")


# --- what one drain gives -------------------------------------------------------------------------------


@dataclass
class Drain:
    """One measured drain: jobs through the fleet, from the rows, with its CPU and what the backends waited on."""

    scenario: str  # fan-in N, chains, chains plain, fan-out, fan-out plain, paced, paced plain
    workers: int
    jobs: int
    seconds: float  # last finish - first start
    variant: str = "current"  # how workflow jobs are counted (bench/workflow_triggers.py)
    cpu_workers: float = 0.0
    cpu_server: float = 0.0
    machine_busy: float = 0.0  # of both cores, over the drain's wall time
    latencies_ms: list[float] = field(default_factory=list)  # fan-in: one; chains: one per workflow
    hops_ms: list[float] = field(default_factory=list)  # paced: node finished -> next started; plain: pickup
    runs_ms: list[float] = field(default_factory=list)  # paced: each job's started -> finished
    # fan-in and paced, with track_commit_timestamp: (the ending settle's start -> its commit, the commit -> the
    # next job's start), for each latency or hop
    splits_ms: list[tuple[float, float]] = field(default_factory=list)
    functions: dict[str, tuple[int, float, float]] = field(default_factory=dict)  # calls, total ms, self ms
    waits: Counter[str] = field(default_factory=Counter)  # backend-samples by wait event
    samples: int = 0  # sampler passes
    samples_locked: int = 0  # passes that saw at least one worker backend waiting on a lock

    @property
    def label(self) -> str:
        variant = "" if self.variant == "current" else f" [{self.variant} triggers]"
        return f"{self.workers} worker(s){variant}, {self.scenario}"

    @property
    def rate(self) -> float:
        return self.jobs / self.seconds if self.seconds > 0 else float("nan")

    @property
    def cpu_per_job_us(self) -> float:
        return (self.cpu_workers + self.cpu_server) / self.jobs * 1e6

    @property
    def server_per_job_us(self) -> float:
        return self.cpu_server / self.jobs * 1e6


# --- the fleet and the database ----------------------------------------------------------------------------


class Fleet:
    """`count` dygo worker processes on the benchmark's database, started and registered."""

    def __init__(self, url: str, count: int, args: argparse.Namespace, config: Path) -> None:
        path = os.pathsep.join(filter(None, [str(Path(__file__).resolve().parent), os.environ.get("PYTHONPATH")]))
        env = {"DATABASE_URL": url, "DYGO_CONFIG_DIR": str(config), "DYGO_LOG_LEVEL": "WARNING", "PYTHONPATH": path}
        command = [str(Path(sys.executable).with_name("dygo")), "worker", "--concurrency", str(args.concurrency)]
        self.workers = [WorkerProcess(command, env) for _ in range(count)]
        self.url = url
        with psycopg.connect(url, autocommit=True) as conn:

            def registered() -> bool:
                self.check_alive()
                row = conn.execute("SELECT count(*) FROM dygo_workers").fetchone()
                return row is not None and row[0] >= count

            wait_until(registered, args.timeout, f"{count} workers registered", interval=0.3)

    def check_alive(self) -> None:
        for worker in self.workers:
            worker.check_alive()

    def cpu(self) -> float:
        return sum(process_cpu_seconds(w.pid) for w in self.workers)

    def stop(self) -> None:
        for worker in self.workers:
            worker.process.terminate()
        for worker in self.workers:
            worker.stop()


def write_config(config: Path, concurrency: int, claim_batch_size: int) -> None:
    (config / "queues.yml").write_text(f"queues:\n  - name: default\n    concurrency: {concurrency}\n")
    (config / "dygo.yml").write_text(f"jobs: [bench_jobs]\nclaim_batch_size: {claim_batch_size}\n")


def empty(conn: psycopg.Connection) -> None:
    """No job, no workflow, fresh statistics: every drain starts from the same table."""
    conn.execute("TRUNCATE dygo_jobs, dygo_edges, dygo_nodes, dygo_workflows")
    conn.execute("VACUUM ANALYZE dygo_jobs")
    conn.execute("VACUUM ANALYZE dygo_nodes")


class Sampler:
    """What the worker backends wait on, every `interval` s on a connection of its own, in a thread."""

    def __init__(self, url: str, interval: float) -> None:
        self.conn = psycopg.connect(url, autocommit=True)
        self.interval = interval
        self.waits: Counter[str] = Counter()
        self.samples = self.samples_locked = 0
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.stopping.wait(self.interval):
            # Not the idle wait for the client's next statement (ClientRead). For a backend waiting on a lock, the
            # lock's type and relation (a tuple lock names it; a wait for a transaction does not): the statement's
            # first words tell a claim from a settle.
            rows = self.conn.execute(
                "SELECT a.wait_event_type, a.wait_event, l.locktype, l.relation::regclass::text, l.mode,"
                " left(regexp_replace(a.query, '\\s+', ' ', 'g'), 60)"
                " FROM pg_stat_activity a LEFT JOIN LATERAL (SELECT locktype, relation, mode FROM pg_locks"
                " WHERE a.wait_event_type = 'Lock' AND pid = a.pid AND NOT granted LIMIT 1) l ON true"
                " WHERE a.application_name LIKE 'dygo-worker%%' AND a.state <> 'idle'"
                " AND a.wait_event IS DISTINCT FROM 'ClientRead'"
            ).fetchall()
            locked = 0
            for event_type, event, locktype, relation, mode, query in rows:
                if event_type is None:
                    self.waits["on CPU"] += 1
                    continue
                name = f"{event_type}:{event}"
                if event_type == "Lock":
                    locked += 1
                    name += f" ({locktype} {mode}{' on ' + relation if relation else ''}; {statement_of(query)})"
                self.waits[name] += 1
            self.samples += 1
            self.samples_locked += locked > 0

    def stop(self) -> None:
        self.stopping.set()
        self.thread.join()
        self.conn.close()


def statement_of(query: str | None) -> str:
    """A worker statement by its first words: enough to tell a settle from a claim."""
    text = (query or "").lower()
    for marker, name in (
        ("settled as", "settle"),
        ("set state = 'succeeded'", "settle"),
        ("lease_deadline = now()", "renew"),
        ("for update skip locked", "claim"),
        ("dygo_workers", "heartbeat"),
    ):
        if marker in text:
            return name
    return text[:40] or "?"


class Meter:
    """CPU of the workers and of the server, and what the backends wait on, from `start` (just before the
    enqueue's commit: the enqueue's own work is not the fleet's) to `stop` (the drain's end)."""

    def __init__(self, fleet: Fleet, conn: psycopg.Connection, interval: float, functions: bool = False) -> None:
        self.fleet, self.conn, self.interval = fleet, conn, interval
        self.settle = STATS_FLUSH if functions else 0.0
        self.postmaster = parent_pid(conn.info.backend_pid)

    def start(self) -> None:
        self.functions = function_stats(self.conn) if self.settle else {}
        self.sampler = Sampler(self.fleet.url, self.interval)
        self.workers, self.server = self.fleet.cpu(), sum(server_cpu_seconds(self.postmaster).values())
        self.machine, self.wall = machine_busy_seconds(), time.monotonic()

    def stop(self, drain: Drain) -> None:
        self.sampler.stop()
        drain.cpu_workers = self.fleet.cpu() - self.workers
        drain.cpu_server = sum(server_cpu_seconds(self.postmaster).values()) - self.server
        drain.machine_busy = (machine_busy_seconds() - self.machine) / max(time.monotonic() - self.wall, 1e-9)
        drain.waits, drain.samples = self.sampler.waits, self.sampler.samples
        drain.samples_locked = self.sampler.samples_locked
        if not self.settle:
            return
        time.sleep(self.settle)
        after = function_stats(self.conn)
        for name, (calls, total, own) in after.items():
            was = self.functions.get(name, (0, 0.0, 0.0))
            if calls > was[0]:
                drain.functions[name] = (calls - was[0], total - was[1], own - was[2])


# A backend sends its function counts at most once a second, and at the latest 10 s after going idle.
STATS_FLUSH = 10.5
# The functions of the job triggers on update and delete, and those they call (workflow_triggers.py's too).
FUNCTIONS = (
    "dygo_jobs_updated",
    "dygo_jobs_moved",
    "dygo_jobs_removed",
    "dygo_tally",
    "dygo_advance",
    "dygo_move_node_jobs",
    "dygo_job_moved",
    "dygo_job_moved_later",
    "dygo_tally_moves",
)


def function_stats(conn: psycopg.Connection) -> dict[str, tuple[int, float, float]]:
    """Calls, total ms and own ms of each of FUNCTIONS so far (track_functions = 'pl': see main)."""
    rows = conn.execute(
        "SELECT funcname, calls, total_time, self_time FROM pg_stat_user_functions WHERE funcname = ANY(%s)",
        (list(FUNCTIONS),),
    ).fetchall()
    return {name: (int(calls), float(total), float(own)) for name, calls, total, own in rows}


def wait_for(conn: psycopg.Connection, fleet: Fleet, query: str, expected: int, timeout: float, what: str) -> None:
    def done() -> bool:
        fleet.check_alive()
        row = conn.execute(query).fetchone()
        return row is not None and row[0] >= expected

    wait_until(done, timeout, f"{expected} {what}", interval=0.05)


# The commit time of the transaction that last wrote a node row (NULL without track_commit_timestamp): for a
# node that ended, the transaction that ended it, which released what follows.
COMMITTED = (
    "CASE WHEN current_setting('track_commit_timestamp') = 'on' "
    "THEN extract(epoch FROM pg_xact_commit_timestamp({row}.xmin)) * 1000 END"
)
WORKFLOWS_ENDED = "SELECT count(*) FROM dygo_workflows WHERE state IN ('succeeded', 'failed', 'cancelled')"
JOBS_SUCCEEDED = "SELECT count(*) FROM dygo_jobs WHERE state = 'succeeded'"
SPAN = "SELECT extract(epoch FROM max(finished_at) - min(started_at)) FROM dygo_jobs"


def span(conn: psycopg.Connection) -> float:
    row = conn.execute(SPAN).fetchone()
    return float(row[0]) if row and row[0] is not None else float("nan")


def clock(conn: psycopg.Connection) -> float:
    """The database's clock (epoch seconds); read just before a commit, when its jobs became visible."""
    row = conn.execute("SELECT extract(epoch FROM clock_timestamp())").fetchone()
    assert row is not None
    return float(row[0])


@dataclass
class Setting:
    """What a drain runs on: the fleet, the way workflow jobs are counted, the options."""

    fleet: Fleet
    variant: str
    args: argparse.Namespace

    def drain(self, scenario: str, jobs: int) -> Drain:
        return Drain(scenario, len(self.fleet.workers), jobs, 0.0, variant=self.variant)


def burst(
    conn: psycopg.Connection, setting: Setting, drain: Drain, enqueue: Callable[[], object], done: str, expected: int
) -> float:
    """Enqueue in one transaction, meter from its commit, wait until `done` counts `expected`; the database's
    clock at the commit comes back."""
    meter = Meter(setting.fleet, conn, setting.args.sample_interval, setting.args.functions)
    with conn.transaction():
        enqueue()
        meter.start()
        visible = clock(conn)
    try:
        wait_for(conn, setting.fleet, done, expected, setting.args.timeout, drain.scenario)
    finally:
        meter.stop(drain)
    drain.seconds = span(conn)
    return visible


# --- the scenarios ------------------------------------------------------------------------------------------


def fan_in(conn: psycopg.Connection, setting: Setting, members: int) -> Drain:
    empty(conn)
    drain = setting.drain(f"fan-in {members:,}", members + 1)
    workflow = batch("fan-in", KIND, [{}] * members, on_complete=(KIND, {}))
    burst(conn, setting, drain, lambda: enqueue_workflow(conn, workflow), WORKFLOWS_ENDED, 1)
    row = conn.execute(
        f"""SELECT extract(epoch FROM c.started_at - g.last) * 1000, extract(epoch FROM g.last - g.first), w.state,
               {COMMITTED.format(row="gn")} AS committed, extract(epoch FROM g.last) * 1000,
               extract(epoch FROM c.started_at) * 1000
        FROM dygo_workflows w
        JOIN dygo_nodes cn ON cn.workflow_id = w.id AND cn.name = 'on_complete'
        JOIN dygo_jobs c ON c.id = cn.job_id
        JOIN dygo_nodes gn ON gn.workflow_id = w.id AND gn.name = 'jobs'
        CROSS JOIN LATERAL (SELECT max(finished_at) AS last, min(started_at) AS first FROM dygo_jobs
                            WHERE node_id = gn.id) g"""
    ).fetchone()
    assert row is not None and row[2] == "succeeded", row
    latency, drained, _, committed, last, started = row
    drain.latencies_ms = [float(latency)]
    split = ""
    if committed is not None:
        drain.splits_ms = [(float(committed) - float(last), float(started) - float(committed))]
        split = f" (the settle's transaction {drain.splits_ms[0][0]:.1f} ms, then {drain.splits_ms[0][1]:.1f} ms)"
    log(
        f"{drain.label}: {float(latency):.1f} ms from the last member's settle to the callback's start{split}; "
        f"members drained at {members / float(drained):,.0f}/s"
    )
    return drain


def chains(conn: psycopg.Connection, setting: Setting, count: int) -> Drain:
    empty(conn)
    drain = setting.drain("chains", 3 * count)
    workflows = [chain(f"chain-{i}", ("a", KIND, {}), ("b", KIND, {}), ("c", KIND, {})) for i in range(count)]

    def enqueue() -> None:
        for workflow in workflows:
            enqueue_workflow(conn, workflow)

    visible = burst(conn, setting, drain, enqueue, WORKFLOWS_ENDED, count)
    rows = conn.execute(
        "SELECT (extract(epoch FROM finished_at) - %s) * 1000, state FROM dygo_workflows", (visible,)
    ).fetchall()
    assert all(state == "succeeded" for _, state in rows), Counter(state for _, state in rows)
    drain.latencies_ms = [float(ms) for ms, _ in rows]
    return drain


def fan_out(conn: psycopg.Connection, setting: Setting, members: int) -> Drain:
    empty(conn)
    drain = setting.drain("fan-out", members + 2)
    workflow = Workflow("fan-out")
    workflow.add("start", KIND, {})
    groups = setting.args.fan_out_groups  # more than one: the same jobs in sibling groups, each its own node row
    fan = [
        workflow.map(f"fan{g}", KIND, [{}] * (members // groups + (g < members % groups)), after="start")
        for g in range(groups)
    ]
    workflow.add("end", KIND, {}, after=fan)
    visible = burst(conn, setting, drain, lambda: enqueue_workflow(conn, workflow), WORKFLOWS_ENDED, 1)
    row = conn.execute("SELECT (extract(epoch FROM finished_at) - %s) * 1000, state FROM dygo_workflows", (visible,))
    ms, state = row.fetchone() or (None, None)
    assert state == "succeeded", state
    drain.latencies_ms = [float(ms)]
    return drain


def plain(conn: psycopg.Connection, setting: Setting, scenario: str, jobs: int) -> Drain:
    """The bare reference: as many plain no-op jobs, enqueued in one transaction."""
    empty(conn)
    drain = setting.drain(f"{scenario} plain", jobs)
    requests = [JobRequest(KIND, {}) for _ in range(jobs)]
    visible = burst(conn, setting, drain, lambda: enqueue_many(conn, requests), JOBS_SUCCEEDED, jobs)
    row = conn.execute("SELECT (extract(epoch FROM max(finished_at)) - %s) * 1000 FROM dygo_jobs", (visible,))
    drain.latencies_ms = [float((row.fetchone() or (0,))[0])]
    return drain


def paced(conn: psycopg.Connection, setting: Setting, count: int) -> list[Drain]:
    """Chains one at a time on idle workers: what a chain takes end to end, each hop, and each node's run; then
    as many plain jobs one at a time, whose pickup (started - enqueued) is what a hop compares with."""
    empty(conn)
    args = setting.args
    drain = setting.drain("paced", 3 * count)
    meter = Meter(setting.fleet, conn, args.sample_interval, args.functions)
    meter.start()
    for _ in pacing(count, args.pace):
        enqueue_workflow(conn, chain("paced", ("a", KIND, {}), ("b", KIND, {}), ("c", KIND, {})))
    wait_for(conn, setting.fleet, WORKFLOWS_ENDED, count, args.timeout, "paced chains ended")
    meter.stop(drain)
    drain.seconds = span(conn)
    drain.latencies_ms = [
        float(r[0])
        for r in conn.execute(
            "SELECT extract(epoch FROM finished_at - created_at) * 1000 FROM dygo_workflows WHERE state = 'succeeded'"
        ).fetchall()
    ]
    rows = conn.execute(
        f"""SELECT extract(epoch FROM j.started_at) * 1000, extract(epoch FROM j.finished_at) * 1000,
                   {COMMITTED.format(row="n")}, n.workflow_id
        FROM dygo_nodes n JOIN dygo_jobs j ON j.id = n.job_id ORDER BY n.workflow_id, n.id"""
    ).fetchall()
    for before, after in zip(rows, rows[1:], strict=False):
        if before[3] != after[3]:
            continue
        drain.hops_ms.append(float(after[0]) - float(before[1]))
        if before[2] is not None:
            drain.splits_ms.append((float(before[2]) - float(before[1]), float(after[0]) - float(before[2])))
    drain.runs_ms = [float(finished) - float(started) for started, finished, _, _ in rows]

    empty(conn)
    reference = setting.drain("paced plain", count)
    meter.start()
    for _ in pacing(count, args.pace):
        enqueue_many(conn, [JobRequest(KIND, {})])
    wait_for(conn, setting.fleet, JOBS_SUCCEEDED, count, args.timeout, "paced plain jobs succeeded")
    meter.stop(reference)
    reference.seconds = span(conn)
    rows = conn.execute(
        "SELECT extract(epoch FROM started_at - enqueued_at) * 1000, extract(epoch FROM finished_at - started_at)"
        " * 1000 FROM dygo_jobs"
    ).fetchall()
    reference.hops_ms = [float(pickup) for pickup, _ in rows]
    reference.runs_ms = [float(ran) for _, ran in rows]
    return [drain, reference]


# --- the run ---------------------------------------------------------------------------------------------------


def run_fleet(url: str, conn: psycopg.Connection, count: int, variant: str, args: argparse.Namespace) -> list[Drain]:
    """One fleet of `count` workers through every scenario, with workflow jobs counted as `variant` says."""
    workflow_triggers.install(conn, variant)
    log(f"{count} worker(s), {variant} triggers: starting")
    setting = Setting(Fleet(url, count, args, args.config), variant, args)
    drains: list[Drain] = []
    try:
        for scenario in args.only:
            if scenario == "fan-in":
                drains += [fan_in(conn, setting, members) for members in args.fan_in]
            elif scenario == "chains" and args.chains:
                drains += [chains(conn, setting, args.chains), plain(conn, setting, "chains", 3 * args.chains)]
                log(pair_line(drains[-2], drains[-1]))
            elif scenario == "fan-out" and args.fan_out:
                drains += [fan_out(conn, setting, args.fan_out), plain(conn, setting, "fan-out", args.fan_out + 2)]
                log(pair_line(drains[-2], drains[-1]))
            elif scenario == "paced" and args.paced_chains:
                drains += paced(conn, setting, args.paced_chains)
                chains_, plain_ = drains[-2], drains[-1]
                log(
                    f"{chains_.label}: end to end p50 {pct(chains_.latencies_ms, 50):.2f} ms, p99 "
                    f"{pct(chains_.latencies_ms, 99):.2f} ms; hop p50 {pct(chains_.hops_ms, 50):.2f} ms against a "
                    f"plain job's pickup p50 {pct(plain_.hops_ms, 50):.2f} ms"
                )
    finally:
        setting.fleet.stop()
    return drains


def pair_line(workflow: Drain, bare: Drain) -> str:
    return (
        f"{workflow.label}: {workflow.jobs:,} jobs at {workflow.rate:,.0f}/s ({workflow.cpu_per_job_us:.0f} us "
        f"CPU/job) against plain {bare.rate:,.0f}/s ({bare.cpu_per_job_us:.0f} us): {workflow.rate / bare.rate:.0%}; "
        f"lock waits in {share(workflow):.0%} of samples (plain {share(bare):.0%})"
    )


def parse_arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 4], help="fleet sizes (worker processes)")
    parser.add_argument("--concurrency", type=int, default=200, help="each worker's --concurrency")
    parser.add_argument("--claim-batch-size", type=int, default=100, help="dygo.yml claim_batch_size")
    parser.add_argument("--repeat", type=int, default=3, help="passes over every fleet size, taking turns")
    parser.add_argument(
        "--only", type=lambda text: text.split(","), default=list(SCENARIOS), help=f"of {','.join(SCENARIOS)}"
    )
    parser.add_argument(
        "--variants",
        type=lambda text: text.split(","),
        default=["current"],
        help="ways of counting workflow jobs, each fleet in turn (bench/workflow_triggers.py: current, separate, "
        "row, deferred)",
    )
    parser.add_argument("--fan-in", type=int, nargs="+", default=[1_000, 10_000, 100_000], help="group sizes")
    parser.add_argument("--chains", type=int, default=2_000, help="3-step chains enqueued at once")
    parser.add_argument("--fan-out", type=int, default=10_000, help="jobs of the fan-out's group")
    parser.add_argument(
        "--fan-out-groups",
        type=int,
        default=1,
        help="split the fan-out's jobs into this many sibling groups between the same start and end: the same "
        "work without one node row that every settle of the group locks",
    )
    parser.add_argument("--paced-chains", type=int, default=200, help="chains enqueued one at a time")
    parser.add_argument("--pace", type=float, default=0.02, help="seconds between paced chains")
    parser.add_argument("--sample-interval", type=float, default=0.05, help="seconds between wait samples")
    parser.add_argument("--timeout", type=float, default=600.0, help="per drain")
    parser.add_argument(
        "--functions",
        action="store_true",
        help="time the trigger functions per drain (pg_stat_user_functions): waits 10.5 s after each drain for the "
        "workers' sessions to report",
    )
    parser.add_argument("--quick", action="store_true", help="small counts and one pass: a smoke run")
    parser.add_argument("--markdown", action="store_true", help="print the tables as Markdown")
    args = parser.parse_args()
    if args.quick:
        args.fan_in, args.chains, args.fan_out, args.paced_chains, args.repeat = [1_000, 10_000], 500, 2_000, 50, 1
    if unknown := set(args.only) - set(SCENARIOS):
        parser.error(f"unknown scenario(s) {', '.join(sorted(unknown))}: choose from {', '.join(SCENARIOS)}")
    if unknown := set(args.variants) - {"current", "separate", "row", "deferred"}:
        parser.error(
            f"unknown variant(s) {', '.join(sorted(unknown))}: current, separate, row or deferred (none moves nothing)"
        )
    return args


def main() -> int:
    args = parse_arguments()
    server = embedded_server_url()
    url = fresh_database(server, DATABASE)
    loads = [background_load()]
    log(f"database {DATABASE}; background load before the run: {loads[0]:.2f} of {os.cpu_count()} cores busy")
    drains: list[Drain] = []
    with tempfile.TemporaryDirectory(prefix="dygo-workflows-") as config, psycopg.connect(url, autocommit=True) as conn:
        args.config = Path(config)
        write_config(args.config, args.concurrency, args.claim_batch_size)
        migrate(conn)
        if args.functions:  # time spent in the trigger functions (pg_stat_user_functions), in every worker session
            conn.execute(f"ALTER DATABASE {DATABASE} SET track_functions = 'pl'")
        for number in range(1, args.repeat + 1):
            log(f"pass {number} of {args.repeat}")
            for count in args.workers:
                for variant in args.variants:
                    drains += run_fleet(url, conn, count, variant, args)
                    loads.append(background_load())
    print(report(drains, args, max(loads)))
    return 0


# --- the report ------------------------------------------------------------------------------------------------


def pct(values: list[float], p: float) -> float:
    return percentile(sorted(values), p)


def share(drain: Drain) -> float:
    return drain.samples_locked / drain.samples if drain.samples else 0.0


def median_share(drains: list[Drain]) -> float:
    return statistics.median(share(d) for d in drains) if drains else float("nan")


def render(header: list[str], rows: list[list[str]], markdown: bool) -> str:
    if markdown:
        lines = [
            "| " + " | ".join(header) + " |",
            "|" + "|".join("---:" if i else "---" for i in range(len(header))) + "|",
        ]
        return "\n".join(lines + ["| " + " | ".join(row) + " |" for row in rows])
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    lines = [
        "  ".join(cell.rjust(w) if i else cell.ljust(w) for i, (cell, w) in enumerate(zip(row, widths, strict=True)))
        for row in [header, *rows]
    ]
    return "\n".join([lines[0], "-" * len(lines[0]), *lines[1:]])


Key = tuple[str, int, str]  # scenario, workers, variant


def grouped(drains: list[Drain], scenario: Callable[[str], bool]) -> dict[Key, list[Drain]]:
    groups: dict[Key, list[Drain]] = {}
    for drain in drains:
        if scenario(drain.scenario):
            groups.setdefault((drain.scenario, drain.workers, drain.variant), []).append(drain)
    return groups


def spread(values: list[float], digits: int = 0) -> str:
    """The median, and the lowest and highest of the passes."""
    if not values:
        return "-"
    fmt = f"{{:,.{digits}f}}"
    middle = fmt.format(statistics.median(values))
    return middle if len(values) == 1 else f"{middle} ({fmt.format(min(values))}–{fmt.format(max(values))})"


def split_cell(splits: list[tuple[float, float]]) -> str:
    if not splits:
        return "-"
    return f"{pct([a for a, _ in splits], 50):.2f} / {pct([b for _, b in splits], 50):.2f}"


def named(scenario: str, variant: str) -> str:
    return scenario if variant == "current" else f"{scenario} [{variant} triggers]"


def report(drains: list[Drain], args: argparse.Namespace, load: float) -> str:
    out: list[str] = []
    fan_ins = grouped(drains, lambda s: s.startswith("fan-in"))
    if fan_ins:
        rows = []
        for (scenario, workers, variant), runs in fan_ins.items():
            latencies = [d.latencies_ms[0] for d in runs]
            splits = [x for d in runs for x in d.splits_ms]
            rows.append(
                [
                    named(scenario.removeprefix("fan-in ") + " -> 1", variant),
                    str(workers),
                    str(len(runs)),
                    f"{statistics.median(latencies):.1f}",
                    f"{max(latencies):.1f}",
                    split_cell(splits),
                    spread([d.rate for d in runs]),
                    spread([d.cpu_per_job_us for d in runs]),
                    f"{median_share(runs):.0%}",
                ]
            )
        out += [
            "fan-in: the last member's settle -> the callback's start, over the passes, split at the commit of the "
            "settle's transaction (track_commit_timestamp); jobs/s and CPU per job (workers + server) of the whole "
            "drain, median (lowest–highest)",
            render(
                [
                    "group",
                    "workers",
                    "runs",
                    "p50 ms",
                    "max ms",
                    "settle's transaction / commit -> start, p50 ms",
                    "jobs/s",
                    "CPU us/job",
                    "lock-wait samples",
                ],
                rows,
                args.markdown,
            ),
            "",
        ]
    pairs = []
    for name in ("chains", "fan-out"):
        for (scenario, workers, variant), runs in grouped(drains, lambda s, name=name: s == name).items():
            bare = grouped(drains, lambda s, name=name: s == f"{name} plain").get(
                (f"{name} plain", workers, variant), []
            )
            ratios = [w.rate / b.rate for w, b in zip(runs, bare, strict=False) if b.rate]
            done = [x for d in runs for x in d.latencies_ms]
            pairs.append(
                [
                    named(f"{scenario} ({runs[0].jobs:,} jobs)", variant),
                    str(workers),
                    spread([d.rate for d in runs]),
                    spread([d.rate for d in bare]),
                    spread([100 * r for r in ratios]) + "%",
                    spread([d.cpu_per_job_us for d in runs]) + " / " + spread([d.cpu_per_job_us for d in bare]),
                    spread([d.server_per_job_us for d in runs]) + " / " + spread([d.server_per_job_us for d in bare]),
                    f"{pct(done, 50):,.0f} / {pct(done, 99):,.0f}",
                    f"{median_share(runs):.0%} / {median_share(bare):.0%}",
                ]
            )
    if pairs:
        out += [
            "throughput: workflow jobs/s against plain no-op jobs of the same count, median (lowest–highest) of the "
            "passes, the ratio pass by pass; 'done': each workflow's finished_at after the enqueue's commit",
            render(
                [
                    "shape",
                    "workers",
                    "workflow jobs/s",
                    "plain jobs/s",
                    "workflow / plain",
                    "CPU us/job wf / plain",
                    "server us/job wf / plain",
                    "done p50 / p99 ms",
                    "lock-wait samples wf / plain",
                ],
                pairs,
                args.markdown,
            ),
            "",
        ]
    paced_runs = grouped(drains, lambda s: s == "paced")
    if paced_runs:
        rows = []
        for (_, workers, variant), runs in paced_runs.items():
            plain_runs = grouped(drains, lambda s: s == "paced plain").get(("paced plain", workers, variant), [])
            latencies = [x for d in runs for x in d.latencies_ms]
            hops = [x for d in runs for x in d.hops_ms]
            pickups = [x for d in plain_runs for x in d.hops_ms]
            ran = [x for d in runs for x in d.runs_ms]
            ran_plain = [x for d in plain_runs for x in d.runs_ms]
            rows.append(
                [
                    named(str(workers), variant),
                    f"{len(latencies):,}",
                    f"{pct(latencies, 50):.2f} / {pct(latencies, 99):.2f}",
                    f"{pct(hops, 50):.2f} / {pct(hops, 99):.2f}",
                    split_cell([x for d in runs for x in d.splits_ms]),
                    f"{pct(pickups, 50):.2f} / {pct(pickups, 99):.2f}",
                    f"{pct(ran, 50):.2f} / {pct(ran_plain, 50):.2f}",
                ]
            )
        out += [
            f"paced 3-step chains, one every {args.pace * 1000:.0f} ms on idle workers, all passes' samples pooled: "
            "enqueue -> last node finished; a hop (a node finished -> the next started) against a plain job's "
            "pickup (enqueued -> started, as many enqueued at the same pace); a job's run (started -> finished)",
            render(
                [
                    "workers",
                    "chains",
                    "end to end p50 / p99 ms",
                    "hop p50 / p99 ms",
                    "hop: settle's transaction / commit -> start, p50 ms",
                    "plain pickup p50 / p99 ms",
                    "run p50 ms chain / plain",
                ],
                rows,
                args.markdown,
            ),
            "",
        ]
    rows = []
    for (scenario, workers, variant), runs in grouped(drains, lambda s: True).items():
        jobs = sum(d.jobs for d in runs)
        totals: dict[str, list[float]] = {}
        for d in runs:
            for name, (calls, total, own) in d.functions.items():
                was = totals.setdefault(name, [0, 0.0, 0.0])
                was[0], was[1], was[2] = was[0] + calls, was[1] + total, was[2] + own
        if not totals:
            continue
        shown = [
            f"{name} {calls / jobs:.2f} calls, {1000 * total / jobs:.1f} us ({1000 * own / jobs:.1f} own)"
            for name, (calls, total, own) in sorted(totals.items(), key=lambda item: -item[1][1])
        ]
        rows.append([named(scenario, variant), str(workers), "; ".join(shown)])
    if rows:
        out += [
            "time in the trigger functions per job (pg_stat_user_functions, track_functions = pl; 'own': the "
            "function's own statements; a total includes the functions it calls and the triggers its updates fire)",
            render(["drain", "workers", "per job"], rows, args.markdown),
            "",
        ]
    out.append("what the worker backends waited on (backend-samples, all passes; 'on CPU': running, no wait):")
    for (scenario, workers, variant), runs in grouped(drains, lambda s: True).items():
        waits: Counter[str] = sum((d.waits for d in runs), Counter())
        samples = sum(d.samples for d in runs)
        top = ", ".join(f"{event} {n}" for event, n in waits.most_common(5)) or "nothing"
        out.append(f"  {named(scenario, variant)}, {workers} worker(s), {samples} samples: {top}")
    out.append(
        f"machine: {os.cpu_count()} cores; background load between fleets up to {load:.2f} cores; workers "
        f"--concurrency {args.concurrency}, claim_batch_size {args.claim_batch_size}, log level WARNING; "
        f"the fan-out's jobs in {args.fan_out_groups} group(s); "
        f"cores busy during the drains (all processes): "
        f"{min(d.machine_busy for d in drains):.2f}–{max(d.machine_busy for d in drains):.2f}"
    )
    return "\n".join(out)


if __name__ == "__main__":
    raise SystemExit(main())
