"""A pytest plugin for projects built on dygo: `pytest -p dygo.testing`, or `addopts = "-p dygo.testing"` in the
project's pytest configuration (docs/guides/testing.md).

Fixtures: `dygo_database` (a fresh migrated database per test, on the server of DATABASE_URL or the embedded
one, and DATABASE_URL pointing at it for the test), `dygo_conn`, `enqueued` (the jobs enqueued so far, by kind),
and `drain` / `adrain`, which run every due job in the test's process until none is left: jobs those jobs
enqueue, retries (their backoff skipped), snoozes and sleeps, and named schedules on demand; they return each
run and how it ended.

A drain is the worker itself, run a round at a time: each round is `dygo worker --once` in this process (the
same claim, executor and settle), so a job behaves in a drain as in production.
"""

from __future__ import annotations

import asyncio
import json
import os
import uuid
from collections.abc import Awaitable, Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psycopg
import pytest

from dygo.store import schedules as schedule_store
from dygo.store import testing as store
from dygo.store.config import Settings, load_settings
from dygo.store.db import database_url
from dygo.store.leases import ClaimedJob, Outcome, Succeeded
from dygo.store.loading import load_jobs
from dygo.store.registry import Registry
from dygo.store.testing import EnqueuedJob

__all__ = ["DrainNeverEnds", "Drained", "EnqueuedJob", "Run", "adrain_jobs", "drain_jobs"]

MAX_ROUNDS = 100  # rounds of a drain before it gives up: a job that keeps enqueuing or snoozing itself


@dataclass(frozen=True)
class Run:
    """One run of a job in a drain, and how it ended: "succeeded", "retried" (a failed attempt with attempts
    left), "dead", "snoozed", or "waiting" (a durable wait: an event, child jobs)."""

    id: int
    kind: str
    queue: str
    attempt: int
    outcome: str
    result: Any = None
    error: str | None = None


class Drained(list[Run]):
    """The runs of a drain, in the order they ended."""

    def kinds(self) -> list[str]:
        return [run.kind for run in self]

    def of(self, kind: str) -> list[Run]:
        return [run for run in self if run.kind == kind]

    def outcomes(self) -> list[tuple[str, str]]:
        """(kind, outcome) of each run: a short thing to compare with."""
        return [(run.kind, run.outcome) for run in self]


class DrainNeverEnds(AssertionError):
    """Jobs were still due after the rounds of a drain (MAX_ROUNDS): a job that re-enqueues or snoozes itself
    forever. `runs`: what the drain ran."""

    def __init__(self, message: str, runs: Drained) -> None:
        super().__init__(message)
        self.runs = runs


def _run_of(job: ClaimedJob, outcome: Outcome) -> Run:
    if isinstance(outcome, Succeeded):
        result = json.loads(outcome.result) if outcome.result is not None else None
        return Run(job.id, job.kind, job.queue, job.attempt, "succeeded", result)
    if outcome.state == "dead":
        word = "dead"
    elif outcome.state == "waiting":
        word = "waiting"
    else:
        word = "snoozed" if outcome.refund_attempt else "retried"
    return Run(job.id, job.kind, job.queue, job.attempt, word, error=outcome.error)


async def _round(settings: Settings, jobs: Registry, url: str, runs: Drained) -> int:
    """One `dygo worker --once` in this process; the runs it made are added to `runs`. How many it made."""
    from dygo.worker.options import WorkerOptions
    from dygo.worker.runtime import Worker

    queues = {name: queue.concurrency for name, queue in settings.queues.items()}
    worker = Worker(settings, jobs, WorkerOptions(queues=queues, once=True, poll_only=True, cron=False), url)
    executor = worker.runs.executor
    execute = executor.run
    before = len(runs)

    async def recorded(job: ClaimedJob) -> tuple[Outcome, float]:
        outcome, elapsed = await execute(job)
        runs.append(_run_of(job, outcome))
        return outcome, elapsed

    setattr(executor, "run", recorded)  # noqa: B010 - the worker's own executor, watched
    await worker.run()
    return len(runs) - before


async def adrain_jobs(
    url: str,
    *,
    settings: Settings | None = None,
    jobs: Registry | None = None,
    schedules: Iterable[str] = (),
    skip_delays: bool = True,
    max_rounds: int = MAX_ROUNDS,
) -> Drained:
    """Run every due job of the database at `url` in this process until none is left, and return the runs.
    `schedules`: names of schedules whose job is enqueued first (as the dashboard's "Trigger" does).
    `skip_delays`: retries, snoozes and sleeps run at once rather than after their delay."""
    settings = settings if settings is not None else load_settings()
    jobs = jobs if jobs is not None else load_jobs(settings)
    names = list(schedules)
    if names:
        async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
            await schedule_store.sync(conn, jobs.schedules.values())
        await asyncio.to_thread(_trigger, url, names)
    runs = Drained()
    for _ in range(max_rounds):
        since = await asyncio.to_thread(_database_now, url)
        if await _round(settings, jobs, url, runs):
            continue
        if skip_delays and await asyncio.to_thread(_run_delayed_now, url, since) > 0:
            continue
        return runs
    raise DrainNeverEnds(
        f"jobs were still due after {max_rounds} rounds of the drain (last kinds run: {runs.kinds()[-5:]}); "
        "does a job enqueue or snooze itself forever?",
        runs,
    )


def drain_jobs(url: str, **options: Any) -> Drained:
    """adrain_jobs, for a test that is not async. Where this thread already runs an event loop (Playwright's
    sync API does), the drain gets a loop of its own in another thread."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(adrain_jobs(url, **options))
    with ThreadPoolExecutor(1, thread_name_prefix="dygo-drain") as thread:
        return thread.submit(asyncio.run, adrain_jobs(url, **options)).result()


def _trigger(url: str, names: list[str]) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        for name in names:
            schedule_store.trigger(conn, name)


def _database_now(url: str) -> datetime:
    with psycopg.connect(url, autocommit=True) as conn:
        return store.database_now(conn)


def _run_delayed_now(url: str, since: datetime) -> int:
    with psycopg.connect(url, autocommit=True) as conn:
        return store.run_delayed_runs_now(conn, since)


# --- fixtures ------------------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def dygo_settings() -> Settings:
    """The project's settings (config/, or DYGO_CONFIG_DIR); override the fixture to test with others."""
    return load_settings()


@pytest.fixture(scope="session")
def dygo_jobs(dygo_settings: Settings) -> Registry:
    """The project's jobs (the modules config/dygo.yml names), imported."""
    return load_jobs(dygo_settings)


@pytest.fixture(scope="session")
def dygo_server(dygo_settings: Settings) -> Iterator[tuple[str, str]]:
    """(server URL, template database): the server of DATABASE_URL (its role needs CREATEDB) or the embedded
    one in the project's data folder, and a migrated database that each test's database is copied from."""
    server_url = database_url(dygo_settings)
    template = f"dygo_pytest_template_{os.getpid()}"
    store.create_template(server_url, template)
    yield server_url, template
    store.drop_database(server_url, template)


@pytest.fixture
def dygo_database(dygo_server: tuple[str, str], monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A fresh migrated database for this test (its URL); DATABASE_URL points at it while the test runs, so the
    code under test and the jobs a drain runs use it."""
    server_url, template = dygo_server
    name = f"dygo_pytest_{uuid.uuid4().hex[:12]}"
    url = store.copy_database(server_url, template, name)
    monkeypatch.setenv("DATABASE_URL", url)
    yield url
    store.drop_database(server_url, name)


@pytest.fixture
def dygo_conn(dygo_database: str) -> Iterator[psycopg.Connection]:
    """An autocommit connection to the test's database."""
    with psycopg.connect(dygo_database, autocommit=True) as conn:
        yield conn


@pytest.fixture
def enqueued(dygo_database: str) -> Callable[..., list[EnqueuedJob]]:
    """`enqueued(kind=None, *, queue=None, state=None, args=None)`: the jobs of the test's database, oldest
    first, of that kind, queue and state, whose args include `args` (a dict of some of their fields)."""

    def find(
        kind: str | None = None,
        *,
        queue: str | None = None,
        state: str | None = None,
        args: dict[str, Any] | None = None,
    ) -> list[EnqueuedJob]:
        with psycopg.connect(dygo_database, autocommit=True) as conn:
            found = store.enqueued_jobs(conn, kind, queue)
        return [
            job
            for job in found
            if (state is None or job.state == state)
            and (args is None or (isinstance(job.args, dict) and args.items() <= job.args.items()))
        ]

    return find


@pytest.fixture
def drain(dygo_database: str, dygo_settings: Settings, dygo_jobs: Registry) -> Callable[..., Drained]:
    """`drain(schedules=(), skip_delays=True)`: run every due job of the test's database (drain_jobs)."""

    def run(**options: Any) -> Drained:
        return drain_jobs(dygo_database, settings=dygo_settings, jobs=dygo_jobs, **options)

    return run


@pytest.fixture
def adrain(dygo_database: str, dygo_settings: Settings, dygo_jobs: Registry) -> Callable[..., Awaitable[Drained]]:
    """`await adrain(...)`: drain, for an async test."""

    def run(**options: Any) -> Awaitable[Drained]:
        return adrain_jobs(dygo_database, settings=dygo_settings, jobs=dygo_jobs, **options)

    return run
