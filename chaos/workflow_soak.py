"""A soak of the workflow engine: many workflows settled from several connections at once, leases running
out under them (late settles), and an operator acting on the same workflows all the while.

python -m chaos.workflow_soak                         # 60 s on its own embedded server (.dygo/workflow-soak)
python -m chaos.workflow_soak --seconds 600 --settlers 8
python -m chaos.workflow_soak --url postgresql://...  # a database of your own (migrated here; its jobs are not kept)

Store-level: jobs are claimed and settled by the store's own claim and settle (as a worker does, batches of
mixed outcomes), lease recovery runs beside them, and the operator cancels workflows, retries, skips and
cancels nodes, cancels, retries and deletes single jobs, and seals open batches. What it looks for:

* a database error that is not a refusal: a deadlock (40P01), a serialization failure (40001), anything
  else. A worker exits on any of them (store/outage.py), so every one counts;
* counters that disagree with the rows once it is quiet (store/workflows.py check_invariants), a stranded
  node among them.

Exit status 1 when it found either. tests/test_workflow_concurrency.py runs a few seconds of it.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import random
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
from dygo.store import admin, embedded, leases, workflows
from dygo.store.claim import claim_jobs
from dygo.store.errors import CodedError
from dygo.store.leases import ClaimedJob, Outcome, Succeeded, Unsuccessful
from dygo.store.migrate import migrate
from dygo.store.workflows import Workflow
from psycopg.conninfo import make_conninfo

REPO = Path(__file__).resolve().parent.parent
KIND = "soak.step"  # never run by a worker: the soak settles it itself
QUEUE = "default"
LEASE = 1.0  # seconds; a settler stalls past it now and then, so its settle comes late
STALL_CHANCE = 0.03
RUNNING_TARGET = 40  # workflows kept running while the soak lasts


@dataclass
class SoakReport:
    seconds: float = 0.0
    workflows: int = 0
    settled: int = 0  # jobs a settle moved
    late_settles: int = 0  # jobs a settle sent after the lease ran out (refused, or the lease was still there)
    recovered: int = 0
    actions: Counter[str] = field(default_factory=Counter)  # operator actions done, by name
    refused: Counter[str] = field(default_factory=Counter)  # operator actions refused (Conflict, NotFound)
    errors: Counter[str] = field(default_factory=Counter)  # database errors, "where SQLSTATE"
    violations: list[str] = field(default_factory=list)
    unfinished: int = 0  # workflows still running at the end (held nodes wait for an operator, by design)

    @property
    def deadlocks(self) -> int:
        return sum(n for key, n in self.errors.items() if key.endswith(("40P01", "40001")))

    @property
    def ok(self) -> bool:
        return not self.errors and not self.violations

    def summary(self) -> str:
        return (
            f"{self.seconds:.0f}s: {self.workflows} workflows, {self.settled} jobs settled, {self.late_settles} "
            f"late settles, {self.recovered} leases recovered; operator {dict(self.actions)} "
            f"(refused {sum(self.refused.values())}); database errors {dict(self.errors) or 'none'}; "
            f"{len(self.violations)} invariant violations; {self.unfinished} workflows held or unfinished"
        )


def shape(rng: random.Random, n: int) -> Workflow:
    """One workflow of a random shape, policy and size. Each job's args say how its settles go."""

    def args() -> dict[str, Any]:
        return {"fail": round(rng.choice([0.0, 0.0, 0.1, 0.3]), 2), "retry": rng.random() < 0.2}

    def members() -> list[dict[str, Any]]:
        return [args() for _ in range(rng.randint(0, 6))]

    options = {"queue": QUEUE}
    kind = rng.choice(["diamond", "diamond", "fan_in", "batch", "chain"])
    if kind == "batch":
        batch = workflows.batch(
            f"soak-{n}",
            KIND,
            [args() for _ in range(rng.randint(1, 30))],
            allow_failures=rng.choice([0, 1, 0.2]),
            open=rng.random() < 0.3,
            **options,
        )
        for callback, policy in workflows.CALLBACKS.items():  # batch() takes no queue for its callbacks
            batch.add(callback, KIND, args(), after={workflows.BATCH_JOBS: policy}, **options)
        return batch
    wf = Workflow(f"soak-{n}", on_failure=rng.choice(workflows.POLICIES), fail_fast=rng.random() < 0.2)
    if kind == "fan_in":
        roots = [wf.add(f"r{i}", KIND, args(), **options) for i in range(rng.randint(2, 12))]
        wf.add("sink", KIND, args(), after=roots, **options)
    elif kind == "chain":
        for i in range(4):
            wf.add(f"s{i}", KIND, args(), after=[f"s{i - 1}"] if i else [], **options)
    else:
        wf.add("a", KIND, args(), **options)
        wf.map("b", KIND, members(), after="a", allow_failures=rng.choice([0, 1]), **options)
        wf.add("c", KIND, args(), after={"a": rng.choice([None, *workflows.POLICIES])}, **options)
        wf.map("d", KIND, members(), after=["b", "c"], **options)
        wf.add("e", KIND, args(), after="d", **options)
    return wf


def fate(job: ClaimedJob, rng: random.Random) -> Outcome:
    """Succeed, die, or fail and be retried, as the job's args give the odds."""
    if rng.random() < float(job.args.get("fail", 0)):
        if job.args.get("retry") and job.attempt < 3:
            return Unsuccessful(job, "pending", error="soak: failed, retried")
        return Unsuccessful(job, "dead", error="soak: failed")
    return Succeeded(job, '{"ok": true}')


def error_key(where: str, exc: BaseException) -> str:
    return f"{where} {getattr(exc, 'sqlstate', None) or type(exc).__name__}"


class Soak:
    def __init__(self, url: str, seconds: float, settlers: int, seed: int) -> None:
        self.url = url
        self.seconds = seconds
        self.settlers = settlers
        self.rng = random.Random(seed)
        self.operator_rng = random.Random(seed + 1)  # its own: the operator acts from a thread
        self.report = SoakReport()
        self.stop_load = asyncio.Event()  # enqueuer and operator stop
        self.stop_all = asyncio.Event()  # settlers and recovery stop

    async def run(self) -> SoakReport:
        started = time.monotonic()
        load = [asyncio.create_task(self.enqueuer()), asyncio.create_task(self.operator())]
        workers = [asyncio.create_task(self.settler(i)) for i in range(self.settlers)]
        workers.append(asyncio.create_task(self.recovery()))
        await asyncio.sleep(self.seconds)
        self.stop_load.set()
        await asyncio.gather(*load)
        await self.quiet()
        self.stop_all.set()
        await asyncio.gather(*workers)
        self.report.seconds = time.monotonic() - started
        with psycopg.connect(self.url, autocommit=True) as conn:
            self.report.violations = workflows.check_invariants(conn)
            self.report.unfinished = conn.execute(
                "SELECT count(*) FROM dygo_workflows WHERE state = 'running'"
            ).fetchone()[0]
        return self.report

    async def quiet(self) -> None:
        """Seal every open batch, then wait until no job is pending or active (a stalled lease recovered)."""
        with psycopg.connect(self.url, autocommit=True) as conn:
            for (workflow_id,) in conn.execute(
                "SELECT DISTINCT n.workflow_id FROM dygo_nodes n WHERE NOT n.sealed AND n.state <> 'cancelled'"
            ).fetchall():
                with contextlib.suppress(CodedError):  # sealed, or cancelled, meanwhile
                    workflows.seal_batch(conn, workflow_id)
            deadline = time.monotonic() + 120
            while conn.execute("SELECT EXISTS (SELECT FROM dygo_jobs WHERE state IN ('pending', 'active'))").fetchone()[
                0
            ]:
                if time.monotonic() > deadline:
                    raise TimeoutError("jobs still pending or active 120 s after the load stopped")
                await asyncio.sleep(0.1)

    async def enqueuer(self) -> None:
        async with await psycopg.AsyncConnection.connect(self.url, autocommit=True) as conn:
            while not self.stop_load.is_set():
                cursor = await conn.execute("SELECT count(*) FROM dygo_workflows WHERE state = 'running'")
                running = (await cursor.fetchone() or (0,))[0]
                for _ in range(max(0, RUNNING_TARGET - running)):
                    self.report.workflows += 1
                    await workflows.aenqueue_workflow(conn, shape(self.rng, self.report.workflows))
                await asyncio.sleep(0.05)

    async def settler(self, number: int) -> None:
        rng = random.Random(self.rng.random())
        async with await psycopg.AsyncConnection.connect(self.url, autocommit=True) as conn:
            while not self.stop_all.is_set():
                try:
                    jobs = (await claim_jobs(conn, {QUEUE: rng.randint(1, 40)}, f"soak-{number}", LEASE)).jobs
                except psycopg.Error as exc:
                    self.report.errors[error_key("claim", exc)] += 1
                    continue
                if not jobs:
                    await asyncio.sleep(0.01)
                    continue
                late = rng.random() < STALL_CHANCE
                await asyncio.sleep(LEASE + 0.5 if late else rng.uniform(0, 0.01))
                outcomes = [fate(job, rng) for job in jobs]
                try:
                    settled = await leases.settle(conn, outcomes)
                except psycopg.Error as exc:
                    self.report.errors[error_key("settle", exc)] += 1
                    continue
                self.report.settled += len(settled)
                if late:
                    self.report.late_settles += len(jobs)

    async def recovery(self) -> None:
        async with await psycopg.AsyncConnection.connect(self.url, autocommit=True) as conn:
            while not self.stop_all.is_set():
                try:
                    self.report.recovered += len((await leases.recover_expired(conn, max_reaps=1000)).jobs)
                except psycopg.Error as exc:
                    self.report.errors[error_key("recover", exc)] += 1
                await asyncio.sleep(0.2)

    async def operator(self) -> None:
        conn = await asyncio.to_thread(psycopg.connect, self.url, autocommit=True)
        try:
            while not self.stop_load.is_set():
                await asyncio.to_thread(self.act, conn)
                await asyncio.sleep(0.005)
        finally:
            await asyncio.to_thread(conn.close)

    def act(self, conn: psycopg.Connection) -> None:
        """One operator action on a random running workflow, node or job (sync: as the API runs them)."""
        rng = self.operator_rng
        row = conn.execute("SELECT id FROM dygo_workflows WHERE state = 'running' ORDER BY random() LIMIT 1").fetchone()
        if row is None:
            return
        workflow_id = row[0]
        [action] = rng.choices(
            ["cancel_workflow", "node", "job", "delete_job", "seal", "add_to_batch"], weights=[1, 8, 8, 2, 2, 2]
        )
        if action == "cancel_workflow":
            return self._do(action, workflows.cancel_workflow, conn, workflow_id)
        if action == "node":
            names = [n for (n,) in conn.execute("SELECT name FROM dygo_nodes WHERE workflow_id = %s", (workflow_id,))]
            verb = rng.choice(["retry", "retry", "skip", "cancel"])
            return self._do(f"{verb} node", workflows.act_on_node, conn, workflow_id, rng.choice(names), verb)
        if action in ("seal", "add_to_batch"):
            if action == "seal":
                return self._do(action, workflows.seal_batch, conn, workflow_id)
            return self._do(action, workflows.add_to_batch, conn, workflow_id, KIND, [{}], queue=QUEUE)
        states = ["waiting", "pending", "paused"] if action == "delete_job" else ["waiting", "pending", "dead"]
        job = conn.execute(
            "SELECT j.id, j.state FROM dygo_jobs j JOIN dygo_nodes n ON n.id = j.node_id "
            "WHERE n.workflow_id = %s AND j.state = ANY(%s) ORDER BY random() LIMIT 1",
            (workflow_id, states),
        ).fetchone()
        if job is None:
            return
        if action == "delete_job":
            return self._do(action, admin.delete_job, conn, job[0])
        verb = "retry" if job[1] == "dead" else "cancel"
        return self._do(f"{verb} job", admin.act_on_job, conn, verb, job[0])

    def _do(self, name: str, action: Any, *args: Any, **options: Any) -> None:
        try:
            action(*args, **options)
            self.report.actions[name] += 1
        except CodedError:
            self.report.refused[name] += 1
        except psycopg.Error as exc:
            self.report.errors[error_key(name, exc)] += 1


async def soak(url: str, seconds: float, settlers: int = 4, seed: int = 1) -> SoakReport:
    """Run the soak for `seconds` against the migrated database at `url`; then wait until it is quiet and
    check the books."""
    return await Soak(url, seconds, settlers, seed).run()


def fresh_database(data_dir: Path) -> str:
    server = embedded.ensure_running(data_dir)
    with psycopg.connect(server, autocommit=True) as conn:
        conn.execute("DROP DATABASE IF EXISTS workflow_soak WITH (FORCE)")
        conn.execute("CREATE DATABASE workflow_soak")
    url = make_conninfo(server, dbname="workflow_soak")
    with psycopg.connect(url) as conn:
        migrate(conn)
    return url


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m chaos.workflow_soak", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--settlers", type=int, default=4)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--url", help="a database to use (migrated here) instead of a fresh embedded one")
    parser.add_argument("--data-dir", type=Path, default=REPO / ".dygo" / "workflow-soak")
    args = parser.parse_args(argv)
    url = args.url
    if url is None:
        url = fresh_database(args.data_dir)
    else:
        with psycopg.connect(url) as conn:
            migrate(conn)
    report = asyncio.run(soak(url, args.seconds, args.settlers, args.seed))
    print(report.summary())
    for violation in report.violations[:50]:
        print(f"VIOLATION {violation}", file=sys.stderr)
    if args.url is None:
        embedded.stop(args.data_dir)
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
