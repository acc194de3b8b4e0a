"""The worker process: a few small loops, each owning one job.

* wake-up   - LISTEN for new or requeued jobs and wake the producer of their queue
* produce   - one per queue: claim a batch while there are free slots, start each job
* settle    - record finished jobs, a whole batch per statement, fenced by lease token
* renew     - extend the leases of everything claimed and not yet settled, at half the TTL
* maintain  - heartbeat row, recovery of expired leases, forgetting dead workers, and every
              `retention_interval` a retention pass (one worker of the cluster at a time)
* schedule  - fire due cron schedules, sleeping until the next fire time (or a NOTIFY that one changed)
* timings   - every TIMINGS_INTERVAL, append the latency/duration histogram counts observed since
              the last flush (store/timings.py) for GET /metrics on `dygo serve`
* progress  - write the latest `ctx.progress` reports, at most once a second (worker/progress.py);
              a run's last report is stored by its settle
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import os
import secrets
import signal
import socket
import sys
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any
from uuid import UUID

import psycopg
from psycopg_pool import AsyncConnectionPool

from store import leases, maintenance, schedules, timings, tracing
from store.config import Settings
from store.errors import ConfigError
from store.leases import ClaimedJob, Outcome, Unsuccessful
from store.outage import OutageLog
from store.registry import Registry
from worker.executor import Executor
from worker.progress import ProgressWriter
from worker.telemetry import WorkerCollector, WorkerStats, outcome_name, serve_metrics

log = logging.getLogger("dygo.worker")
lifecycle = logging.getLogger("dygo.lifecycle")  # stdout; configured by dygo.logs

HEARTBEAT_INTERVAL = 5.0
RECOVER_INTERVAL = 1.0  # at most this often from the claim loop, so recovery stays cheap under load
SETTLE_BATCH = 1000
LISTEN_RETRY_MAX = 5.0
SCHEDULE_LOCKED_RETRY = 0.25  # a due schedule another worker is firing: its fire takes milliseconds
UNTRACED = contextlib.nullcontext()
TIMINGS_INTERVAL = 5.0  # one insert per interval, whatever the throughput; a crash loses at most this much


@dataclass(frozen=True)
class WorkerOptions:
    queues: dict[str, int]  # queue name -> concurrency in this process
    poll_interval: float = 60.0
    poll_only: bool = False
    once: bool = False
    shutdown_timeout: float = 30.0
    metrics_port: int | None = None  # serve this process's own metrics (worker/telemetry.py); None: off
    metrics_host: str = "127.0.0.1"


def make_worker_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(3)}"


class QueueSlots:
    """One queue's capacity in this process, and the signals its producer waits on."""

    def __init__(self, name: str, concurrency: int) -> None:
        self.name = name
        self.concurrency = concurrency
        self.running = 0
        self.wake = asyncio.Event()  # a NOTIFY, a timer or shutdown
        self.freed = asyncio.Event()  # a job finished
        # The producer's own connection: a pool checkout would add ~0.2 ms to every wake-up.
        self.conn: psycopg.AsyncConnection | None = None

    async def connection(self, url: str, options: dict[str, Any]) -> psycopg.AsyncConnection:
        if self.conn is None or self.conn.closed:
            self.conn = await psycopg.AsyncConnection.connect(url, **options)
        return self.conn

    async def close_connection(self) -> None:
        if self.conn is not None:
            await self.conn.close()
            self.conn = None

    @property
    def free(self) -> int:
        return self.concurrency - self.running

    def batch_threshold(self) -> int:
        # Claim in batches once saturated, not one job per freed slot.
        return max(1, self.concurrency // 4)


class Worker:
    def __init__(self, settings: Settings, jobs: Registry, options: WorkerOptions, url: str) -> None:
        self.settings = settings
        self.jobs = jobs
        self.options = options
        self.url = url
        self.id = make_worker_id()
        self.slots = {name: QueueSlots(name, n) for name, n in options.queues.items()}
        # Keyed by lease token, not job id: a job whose lease ran out while this worker was cut off
        # (a database restart, a long pause) can be recovered and claimed by this same worker again
        # while its first run is still going; by id, the two runs overwrote each other's entries.
        self.leased: dict[UUID, ClaimedJob] = {}  # claimed and not yet settled
        self.tasks: dict[UUID, asyncio.Task[None]] = {}  # handlers still running
        self.outbox: list[Outcome] = []  # finished, waiting for the settle loop
        self.outbox_ready = asyncio.Event()
        self.flushing = asyncio.Lock()  # one settle at a time: the settle loop's and shutdown's final one
        self.stopping = asyncio.Event()
        self.schedules_changed = asyncio.Event()  # a NOTIFY: some schedule may be due sooner
        self.last_recovery = 0.0
        self.next_retention = 0.0  # monotonic time of the next retention pass
        self.succeeded_walk = maintenance.SucceededWalk()
        self.stats = WorkerStats()
        # Decided once: a TracerProvider is configured when the job modules are imported (or by
        # opentelemetry-instrument), before a worker exists; untraced, a job pays nothing for tracing.
        self.traced = tracing.active()
        # application_name lets an operator (and the chaos suite) find this worker's backends.
        self.connect_options = {"autocommit": True, "application_name": f"dygo-worker {self.id}"}
        # Settle, renew, schedule, timings, progress and maintenance (two: a retention pass holds its lock on
        # one while it deletes on the other); producers keep connections of their own.
        self.pool = AsyncConnectionPool(url, min_size=1, max_size=7, kwargs=self.connect_options, open=False)
        self.outage = OutageLog(log)
        self.progress = ProgressWriter(self.pool, self.leased, self.outage)
        self.executor = Executor(settings, jobs, self.progress.report)

    # --- lifecycle ------------------------------------------------------------------------------

    async def run(self) -> int:
        await self._wait_for_database()
        await self.pool.open(wait=True, timeout=30)
        try:
            async with self.pool.connection() as conn:
                await leases.check_schema(conn)
            if self.options.metrics_port is not None:
                self._serve_metrics(self.options.metrics_host, self.options.metrics_port)
            if self.options.once:
                return await self._run_once()
            return await self._run_forever()
        finally:
            await self.pool.close()

    async def _wait_for_database(self) -> None:
        """At start, an unreachable database is retried with backoff and said once, as in an outage
        later on: under a process manager the worker then starts working as soon as it is back."""
        failures = 0
        while True:
            try:
                conn = await psycopg.AsyncConnection.connect(self.url, **self.connect_options)
            except psycopg.OperationalError as exc:
                failures += 1
                self.outage.lost("start-up: cannot reach the database", exc)
                await asyncio.sleep(failure_backoff(failures))
                continue
            await conn.close()
            self.outage.back()
            return

    async def _run_once(self) -> int:
        await self._sync_schedules()
        await self._fire_due_schedules()
        await self._recover()
        claimed: list[ClaimedJob] = []
        progress = self.progress.start()
        for slots in self.slots.values():
            async with self.pool.connection() as conn:
                claimed += await self._claim(conn, slots, slots.concurrency)
        await asyncio.gather(*(self.tasks.values()))
        progress.cancel()
        await asyncio.gather(progress, return_exceptions=True)
        await self._flush()
        await self._flush_timings()
        say(f"dygo worker {self.id} ran {len(claimed)} job(s) once; exiting", event="ran_once", worker=self.id,
            jobs=len(claimed))
        return 0

    async def _run_forever(self) -> int:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.stop)
        await self._heartbeat()
        await self._sync_schedules()
        # Everything imported and built so far lives as long as the process: keep it out of the
        # collector's full passes, which would otherwise walk it and stall the loop for milliseconds.
        gc.freeze()
        queues = ", ".join(f"{s.name}({s.concurrency})" for s in self.slots.values())
        mode = "polling only" if self.options.poll_only else "listening"
        say(f"dygo worker {self.id} started: queues {queues}; {mode}, poll every {self.options.poll_interval:g}s",
            event="started", worker=self.id, queues=self.options.queues)
        loops = [asyncio.create_task(self._produce(s), name=f"produce:{s.name}") for s in self.slots.values()]
        background = [asyncio.create_task(coro) for coro in (self._settle_loop(), self._renew_loop(),
                                                              self._maintain_loop(), self._schedule_loop(),
                                                              self._timings_loop())]
        background.append(self.progress.start())
        if not self.options.poll_only:
            background.append(asyncio.create_task(self._listen_loop()))
        await self.stopping.wait()
        say(f"dygo worker {self.id} stopping: {len(self.tasks)} job(s) in flight, "
            f"waiting up to {self.options.shutdown_timeout:g}s", event="stopping", worker=self.id,
            in_flight=len(self.tasks))
        await asyncio.gather(*loops, return_exceptions=True)
        for slots in self.slots.values():
            await slots.close_connection()
        await self._drain()
        for task in background:
            task.cancel()
        await asyncio.gather(*background, return_exceptions=True)
        await self._flush()
        await self._flush_timings()
        async with self.pool.connection() as conn:
            await leases.worker_gone(conn, self.id)
        say(f"dygo worker {self.id} stopped", event="stopped", worker=self.id)
        return 0

    def stop(self) -> None:
        self.stopping.set()
        for slots in self.slots.values():
            slots.wake.set()
            slots.freed.set()

    async def _drain(self) -> None:
        """Let running jobs finish within the shutdown timeout, then hand the rest straight back."""
        if self.tasks:
            await asyncio.wait(list(self.tasks.values()), timeout=self.options.shutdown_timeout)
        unfinished = [self.leased[token] for token in self.tasks]
        running = list(self.tasks.values())
        for task in running:
            task.cancel()
        await asyncio.gather(*running, return_exceptions=True)
        if unfinished:
            log.warning("handing back %d unfinished job(s): %s", len(unfinished),
                        ", ".join(str(j.id) for j in unfinished))
            self.outbox += [Unsuccessful(j, "pending", refund_attempt=True, progress=self.progress.take(j.lease_token))
                            for j in unfinished]

    # --- produce: claim and start jobs ------------------------------------------------------------

    async def _produce(self, slots: QueueSlots) -> None:
        failures = 0
        while not self.stopping.is_set():
            if slots.free < slots.batch_threshold():
                slots.freed.clear()
                await slots.freed.wait()
                continue
            slots.wake.clear()
            reused = slots.conn is not None
            try:
                conn = await slots.connection(self.url, self.connect_options)
                wanted = min(slots.free, self.settings.claim_batch_size)
                claimed = await self._claim(conn, slots, wanted)
                failures = 0
                await self._back()
                # Recovery comes right after a claim rather than before it, to keep its round trip
                # off the path from a wake-up to a started job; what it recovers wakes us again.
                if time.monotonic() - self.last_recovery >= RECOVER_INTERVAL:
                    await self._recover()
                if len(claimed) == wanted:
                    continue  # there may be more ready right now
                wait = await self._idle_wait(conn, slots)
            except (psycopg.Error, OSError) as exc:
                await slots.close_connection()
                if reused:
                    # A connection left idle through a database restart fails on its first use after
                    # it: a fresh one decides, at once, whether the database is really away.
                    continue
                failures += 1
                wait = failure_backoff(failures)
                await self._lost(f"claim from queue {slots.name}", exc)
            await wait_for_event(slots.wake, wait)

    async def _claim(self, conn: psycopg.AsyncConnection, slots: QueueSlots, limit: int) -> list[ClaimedJob]:
        claimed = await leases.claim(conn, slots.name, limit, self.id, self.settings.lease_ttl)
        for job in claimed:
            self.stats.claimed_job(job.queue, job.kind, job.waited)
            self.leased[job.lease_token] = job
            slots.running += 1
            self.tasks[job.lease_token] = asyncio.create_task(self._execute(slots, job))
        return claimed

    async def _idle_wait(self, conn: psycopg.AsyncConnection, slots: QueueSlots) -> float:
        """Sleep until the next pending job is due, or the poll interval, whichever is first."""
        due_in = await leases.seconds_to_next_run(conn, [slots.name])
        wait = self.options.poll_interval
        if due_in is not None:
            wait = min(wait, max(due_in, 0.0) + 0.005)
        return wait

    async def _execute(self, slots: QueueSlots, job: ClaimedJob) -> None:
        try:
            with tracing.execution_span(job) if self.traced else UNTRACED as span:
                outcome, elapsed = await self.executor.run(job)
                outcome.progress = self.progress.take(job.lease_token)  # stored by the settle
                name = outcome_name(outcome)
                tracing.record_outcome(span, name, getattr(outcome, "error", None))
            self.stats.executed(job.queue, job.kind, name, elapsed)
            self.outbox.append(outcome)
            self.outbox_ready.set()
        finally:
            del self.tasks[job.lease_token]
            slots.running -= 1
            slots.freed.set()

    # --- settle -------------------------------------------------------------------------------------

    async def _settle_loop(self) -> None:
        while True:
            await self.outbox_ready.wait()
            self.outbox_ready.clear()
            # Shielded: cancelled at shutdown between the commit and its reply, a settled batch would
            # stay in the outbox, be sent again by the final flush, be refused, and be reported as lost.
            await asyncio.shield(self._flush())

    async def _flush(self) -> None:
        """Settle everything in the outbox; on a database error keep it and retry (leases cover it)."""
        async with self.flushing:
            await self._flush_outbox()

    async def _flush_outbox(self) -> None:
        delay = 0.1
        while self.outbox:
            # Removed from the outbox only once settled, so a cancelled flush loses nothing.
            batch = self.outbox[:SETTLE_BATCH]
            try:
                async with self.pool.connection() as conn:
                    settled = await leases.settle(conn, batch)
                del self.outbox[:len(batch)]
                await self._back()
            except (psycopg.Error, OSError) as exc:
                await self._lost(f"settling {len(batch)} job(s)", exc)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 10.0)
                continue
            for outcome in batch:
                self.leased.pop(outcome.job.lease_token, None)
                if outcome.job.id not in settled:
                    log.warning("job %s: lease lost before settling; its outcome was discarded", outcome.job.id)
            outcomes = Counter(outcome_name(o) for o in batch if o.job.id in settled)
            self.stats.settled_batch(outcomes, len(batch) - outcomes.total())

    # --- timings and metrics ---------------------------------------------------------------------------

    async def _timings_loop(self) -> None:
        while True:
            await asyncio.sleep(TIMINGS_INTERVAL)
            await self._flush_timings()

    async def _flush_timings(self) -> None:
        """Append what was observed since the last flush; on failure it stays unflushed for the next one."""
        deltas = self.stats.timings.unflushed()
        if not deltas:
            return
        try:
            async with self.pool.connection() as conn:
                await timings.record(conn, deltas)
            await self._back()
        except (psycopg.Error, OSError) as exc:
            # Metrics, not jobs: never worth failing a worker for, nor its shutdown. Logged like any other
            # lost connection, once per outage, not once per flush.
            await self._lost("recording timings (kept for the next flush)", exc)
            return
        self.stats.timings.mark_flushed(deltas)

    def _serve_metrics(self, host: str, port: int) -> None:
        def slots() -> dict[str, tuple[int, int]]:
            return {name: (s.running, s.concurrency) for name, s in self.slots.items()}

        try:
            bound = serve_metrics(host, port, WorkerCollector(self.stats, slots))
        except OSError as exc:
            raise ConfigError("--metrics-port", str(port), f"cannot listen on {host}:{port} ({exc.strerror or exc}); "
                              "choose a free port, or another --metrics-host") from None
        say(f"dygo worker metrics: http://{host}:{bound}/metrics")

    # --- renew leases -------------------------------------------------------------------------------

    async def _renew_loop(self) -> None:
        while True:
            await asyncio.sleep(self.settings.lease_ttl / 2)
            jobs = list(self.leased.values())
            try:
                async with self.pool.connection() as conn:
                    held = await leases.renew(conn, jobs, self.settings.lease_ttl)
                await self._back()
            except (psycopg.Error, OSError) as exc:
                await self._lost(f"renewing {len(jobs)} lease(s)", exc)
                continue
            for job in jobs:
                if job.id not in held and job.lease_token in self.leased:
                    log.warning("job %s: lease lost (recovered by another worker); its outcome will be discarded",
                                job.id)

    # --- maintenance ---------------------------------------------------------------------------------

    async def _maintain_loop(self) -> None:
        while True:
            await asyncio.sleep(HEARTBEAT_INTERVAL)
            try:
                await self._heartbeat()
                await self._recover()
                async with self.pool.connection() as conn:
                    await leases.forget_stale_workers(conn, HEARTBEAT_INTERVAL * 12)
                if time.monotonic() >= self.next_retention:
                    self.next_retention = time.monotonic() + self.settings.retention_interval
                    await self._trim_history()
                await self._back()
            except (psycopg.Error, OSError) as exc:
                await self._lost("maintenance", exc)

    async def _trim_history(self) -> None:
        retention = maintenance.Retention.from_settings(self.settings)
        async with self.pool.connection() as guard, self.pool.connection() as conn:
            trimmed = await maintenance.trim(guard, conn, retention, self.succeeded_walk)
        if trimmed is not None and trimmed.total():
            log.info("retention: trimmed %s", trimmed.summary())

    async def _heartbeat(self) -> None:
        async with self.pool.connection() as conn:
            await leases.heartbeat(conn, self.id, socket.gethostname(), os.getpid(), self.options.queues)

    async def _recover(self) -> None:
        self.last_recovery = time.monotonic()
        async with self.pool.connection() as conn:
            recovered = await leases.recover_expired(conn, self.settings.max_reaps)
        for job_id, state in recovered:
            log.warning("job %s: lease expired, %s", job_id,
                        "dead as poison (recovered too often)" if state == "dead" else "back to pending")

    # --- schedules ------------------------------------------------------------------------------------

    async def _sync_schedules(self) -> None:
        """Bring the schedules table in line with this process's declarations (at start)."""
        async with self.pool.connection() as conn:
            changes = await schedules.sync(conn, self.jobs.schedules.values())
        if changes:
            log.info("schedules synced: %s", changes)

    async def _fire_due_schedules(self) -> None:
        async with self.pool.connection() as conn:
            fired = await schedules.fire_due(conn)
        for f in fired:
            when = f"occurrence {f.occurrence.isoformat()}"
            if f.error:
                log.error("schedule %s %s: %s", f.name, when, f.error)
            elif f.skipped:
                log.warning("schedule %s %s missed, skipped (missed: skip)", f.name, when)
            else:
                log.info("schedule %s %s fired: job %s%s", f.name, when, f.job_id,
                         " (already enqueued)" if f.deduplicated else "")

    async def _schedule_loop(self) -> None:
        """Fire due schedules; sleep until the next fire time, a schedule change or the poll interval."""
        failures = 0
        while True:
            self.schedules_changed.clear()
            try:
                await self._fire_due_schedules()
                async with self.pool.connection() as conn:
                    due_in = await schedules.seconds_to_next_fire(conn)
                failures = 0
                await self._back()
                wait = self.options.poll_interval
                if due_in is not None:
                    # Due yet not fired: another worker holds it this instant; look again shortly.
                    wait = min(wait, due_in + 0.005 if due_in > 0 else SCHEDULE_LOCKED_RETRY)
            except (psycopg.OperationalError, OSError) as exc:
                failures += 1
                wait = failure_backoff(failures)
                await self._lost("firing schedules", exc)
            except Exception as exc:  # noqa: BLE001 - one bad fire must not stop every schedule for good
                failures += 1
                wait = failure_backoff(failures)
                log.warning("firing schedules failed (%s); retrying in %.1fs", exc, wait)
            await wait_for_event(self.schedules_changed, wait)

    # --- wake-up --------------------------------------------------------------------------------------

    async def _listen_loop(self) -> None:
        """Wake producers on NOTIFY. On a lost connection, reconnect with backoff (polling goes on)."""
        delay = 0.5
        while True:
            try:
                conn = await psycopg.AsyncConnection.connect(self.url, autocommit=True,
                                                             application_name=f"dygo-worker-listen {self.id}")
                async with conn:
                    await leases.listen(conn)
                    await schedules.listen(conn)
                    delay = 0.5
                    await self._back()
                    for slots in self.slots.values():  # catch up on anything sent while not listening
                        slots.wake.set()
                    self.schedules_changed.set()
                    async for notify in conn.notifies():
                        if notify.channel == schedules.CHANNEL:
                            self.schedules_changed.set()
                            continue
                        slots = self.slots.get(notify.payload)
                        if slots is not None:
                            slots.wake.set()
            except (psycopg.Error, OSError) as exc:
                await self._lost("LISTEN connection (polling every "
                                 f"{self.options.poll_interval:g}s until it is back)", exc)
                await asyncio.sleep(delay)
                # Capped low: its reconnect is what wakes every producer once the database is back.
                delay = min(delay * 2, LISTEN_RETRY_MAX)

    async def _lost(self, where: str, exc: BaseException) -> None:
        if self.outage.lost(where, exc):
            # The pool's idle connections died with the server; dropped now, each would fail once
            # more after the database is back, and be logged as a second outage.
            await self._check_pool()

    async def _back(self) -> None:
        if self.outage.back():
            # Again at the end: a connection whose backend was still shutting down passed the first
            # check, and died after it.
            await self._check_pool()

    async def _check_pool(self) -> None:
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self.pool.check(), 5.0)


async def wait_for_event(event: asyncio.Event, timeout: float) -> None:
    """Sleep until `event` is set or `timeout` seconds pass, whichever is first."""
    # Not asyncio.wait_for: on Python 3.11 it swallows a cancel that arrives as the event is set,
    # so a loop cancelled at shutdown went on for another poll interval (seen as a hung SIGTERM);
    # nor does asyncio.timeout wrap the wait in a task of its own.
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(timeout):
            await event.wait()


def failure_backoff(failures: int) -> float:
    """Backoff after consecutive database failures of a loop: 1 s, 2 s, 4 s ... at most 30 s."""
    return min(30.0, 0.5 * 2**failures)


def say(line: str, **fields: object) -> None:
    """Lifecycle lines go to stdout; everything else is a log line on stderr. The `dygo` command sets
    up the lifecycle logger (text or JSON with these fields); without it, a plain print."""
    if lifecycle.handlers:
        lifecycle.info(line, extra={"fields": fields})
    else:
        print(line, file=sys.stdout, flush=True)
