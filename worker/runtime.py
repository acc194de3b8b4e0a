"""The worker process: a few small loops, each owning one job.

* wake-up   - LISTEN for new or requeued jobs and wake the producer of their queue
* produce   - one per queue: claim a batch while there are free slots, start each job
* settle    - record finished jobs, a whole batch per statement, fenced by lease token
* renew     - extend the leases of everything claimed and not yet settled, at half the TTL
* maintain  - heartbeat row, recovery of expired leases, forgetting dead workers, and every
              `retention_interval` a retention pass (one worker of the cluster at a time)
* schedule  - fire due cron schedules, sleeping until the next fire time (or a NOTIFY that one changed)
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import signal
import socket
import sys
import time
from dataclasses import dataclass

import psycopg
from psycopg_pool import AsyncConnectionPool

from store import leases, maintenance, schedules
from store.config import Settings
from store.leases import ClaimedJob, Outcome, Unsuccessful
from store.registry import Registry
from worker.executor import Executor
from worker.progress import ProgressWriter

log = logging.getLogger("dygo.worker")
lifecycle = logging.getLogger("dygo.lifecycle")  # stdout; configured by dygo.logs

HEARTBEAT_INTERVAL = 5.0
RECOVER_INTERVAL = 1.0  # at most this often from the claim loop, so recovery stays cheap under load
SETTLE_BATCH = 1000
SCHEDULE_LOCKED_RETRY = 0.25  # a due schedule another worker is firing: its fire takes milliseconds


@dataclass(frozen=True)
class WorkerOptions:
    queues: dict[str, int]  # queue name -> concurrency in this process
    poll_interval: float = 60.0
    poll_only: bool = False
    once: bool = False
    shutdown_timeout: float = 30.0


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
        self.leased: dict[int, ClaimedJob] = {}  # claimed and not yet settled
        self.tasks: dict[int, asyncio.Task[None]] = {}  # handlers still running
        self.outbox: list[Outcome] = []  # finished, waiting for the settle loop
        self.outbox_ready = asyncio.Event()
        self.stopping = asyncio.Event()
        self.schedules_changed = asyncio.Event()  # a NOTIFY: some schedule may be due sooner
        self.last_recovery = 0.0
        self.next_retention = 0.0  # monotonic time of the next retention pass
        self.succeeded_walk = maintenance.SucceededWalk()
        # A connection per producer, plus settle, renew, schedule, progress and maintenance (two: a
        # retention pass holds its lock on one while it deletes on the other).
        self.pool = AsyncConnectionPool(url, min_size=1, max_size=len(self.slots) + 6,
                                        kwargs={"autocommit": True}, open=False)
        self.progress = ProgressWriter(self.pool, self.leased)
        self.executor = Executor(settings, jobs, self.progress.report)

    # --- lifecycle ------------------------------------------------------------------------------

    async def run(self) -> int:
        await self.pool.open(wait=True, timeout=30)
        try:
            async with self.pool.connection() as conn:
                await leases.check_schema(conn)
            if self.options.once:
                return await self._run_once()
            return await self._run_forever()
        finally:
            await self.pool.close()

    async def _run_once(self) -> int:
        await self._sync_schedules()
        await self._fire_due_schedules()
        await self._recover()
        claimed: list[ClaimedJob] = []
        progress = self.progress.start()
        for slots in self.slots.values():
            claimed += await self._claim(slots, slots.concurrency)
        await asyncio.gather(*(self.tasks.values()))
        progress.cancel()
        await asyncio.gather(progress, return_exceptions=True)
        await self._flush()
        say(f"dygo worker {self.id} ran {len(claimed)} job(s) once; exiting", event="ran_once", worker=self.id,
            jobs=len(claimed))
        return 0

    async def _run_forever(self) -> int:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.stop)
        await self._heartbeat()
        await self._sync_schedules()
        queues = ", ".join(f"{s.name}({s.concurrency})" for s in self.slots.values())
        mode = "polling only" if self.options.poll_only else "listening"
        say(f"dygo worker {self.id} started: queues {queues}; {mode}, poll every {self.options.poll_interval:g}s",
            event="started", worker=self.id, queues=self.options.queues)
        loops = [asyncio.create_task(self._produce(s), name=f"produce:{s.name}") for s in self.slots.values()]
        background = [asyncio.create_task(coro) for coro in (self._settle_loop(), self._renew_loop(),
                                                              self._maintain_loop(), self._schedule_loop())]
        background.append(self.progress.start())
        if not self.options.poll_only:
            background.append(asyncio.create_task(self._listen_loop()))
        await self.stopping.wait()
        say(f"dygo worker {self.id} stopping: {len(self.tasks)} job(s) in flight, "
            f"waiting up to {self.options.shutdown_timeout:g}s", event="stopping", worker=self.id,
            in_flight=len(self.tasks))
        await asyncio.gather(*loops, return_exceptions=True)
        await self._drain()
        for task in background:
            task.cancel()
        await asyncio.gather(*background, return_exceptions=True)
        await self._flush()
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
        unfinished = [self.leased[job_id] for job_id in self.tasks]
        running = list(self.tasks.values())
        for task in running:
            task.cancel()
        await asyncio.gather(*running, return_exceptions=True)
        if unfinished:
            log.warning("handing back %d unfinished job(s): %s", len(unfinished),
                        ", ".join(str(j.id) for j in unfinished))
            self.outbox += [Unsuccessful(j, "pending", refund_attempt=True) for j in unfinished]

    # --- produce: claim and start jobs ------------------------------------------------------------

    async def _produce(self, slots: QueueSlots) -> None:
        failures = 0
        while not self.stopping.is_set():
            if slots.free < slots.batch_threshold():
                slots.freed.clear()
                await slots.freed.wait()
                continue
            slots.wake.clear()
            try:
                wanted = min(slots.free, self.settings.claim_batch_size)
                claimed = await self._claim(slots, wanted)
                # Recovery comes right after a claim rather than before it, to keep its round trip
                # off the path from a wake-up to a started job; what it recovers wakes us again.
                if time.monotonic() - self.last_recovery >= RECOVER_INTERVAL:
                    await self._recover()
                if len(claimed) == wanted:
                    continue  # there may be more ready right now
                wait = await self._idle_wait(slots)
                failures = 0
            except (psycopg.Error, OSError) as exc:
                failures += 1
                wait = failure_backoff(failures)
                log.warning("claim from queue %s failed (%s); retrying in %.1fs", slots.name, exc, wait)
            await wait_for_event(slots.wake, wait)

    async def _claim(self, slots: QueueSlots, limit: int) -> list[ClaimedJob]:
        async with self.pool.connection() as conn:
            claimed = await leases.claim(conn, slots.name, limit, self.id, self.settings.lease_ttl)
        for job in claimed:
            self.leased[job.id] = job
            slots.running += 1
            self.tasks[job.id] = asyncio.create_task(self._execute(slots, job))
        return claimed

    async def _idle_wait(self, slots: QueueSlots) -> float:
        """Sleep until the next pending job is due, or the poll interval, whichever is first."""
        async with self.pool.connection() as conn:
            due_in = await leases.seconds_to_next_run(conn, [slots.name])
        wait = self.options.poll_interval
        if due_in is not None:
            wait = min(wait, max(due_in, 0.0) + 0.005)
        return wait

    async def _execute(self, slots: QueueSlots, job: ClaimedJob) -> None:
        try:
            outcome = await self.executor.run(job)
            self.outbox.append(outcome)
            self.outbox_ready.set()
        finally:
            del self.tasks[job.id]
            slots.running -= 1
            slots.freed.set()

    # --- settle -------------------------------------------------------------------------------------

    async def _settle_loop(self) -> None:
        while True:
            await self.outbox_ready.wait()
            self.outbox_ready.clear()
            await self._flush()

    async def _flush(self) -> None:
        """Settle everything in the outbox; on a database error keep it and retry (leases cover it)."""
        delay = 0.1
        while self.outbox:
            # Removed from the outbox only once settled, so a cancelled flush loses nothing.
            batch = self.outbox[:SETTLE_BATCH]
            try:
                async with self.pool.connection() as conn:
                    settled = await leases.settle(conn, batch)
                del self.outbox[:len(batch)]
            except (psycopg.Error, OSError) as exc:
                log.warning("settling %d job(s) failed (%s); retrying in %.1fs", len(batch), exc, delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 10.0)
                continue
            for outcome in batch:
                self.leased.pop(outcome.job.id, None)
                if outcome.job.id not in settled:
                    log.warning("job %s: lease lost before settling; its outcome was discarded", outcome.job.id)

    # --- renew leases -------------------------------------------------------------------------------

    async def _renew_loop(self) -> None:
        while True:
            await asyncio.sleep(self.settings.lease_ttl / 2)
            jobs = list(self.leased.values())
            try:
                async with self.pool.connection() as conn:
                    held = await leases.renew(conn, jobs, self.settings.lease_ttl)
            except (psycopg.Error, OSError) as exc:
                log.warning("renewing %d lease(s) failed: %s", len(jobs), exc)
                continue
            for job in jobs:
                if job.id not in held and job.id in self.leased:
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
            except (psycopg.Error, OSError) as exc:
                log.warning("maintenance failed: %s", exc)

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
                wait = self.options.poll_interval
                if due_in is not None:
                    # Due yet not fired: another worker holds it this instant; look again shortly.
                    wait = min(wait, due_in + 0.005 if due_in > 0 else SCHEDULE_LOCKED_RETRY)
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
                conn = await psycopg.AsyncConnection.connect(self.url, autocommit=True)
                async with conn:
                    await leases.listen(conn)
                    await schedules.listen(conn)
                    delay = 0.5
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
                log.warning("LISTEN connection lost (%s); reconnecting in %.1fs", exc, delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 30.0)


async def wait_for_event(event: asyncio.Event, timeout: float) -> None:
    """Sleep until `event` is set or `timeout` seconds pass, whichever is first."""
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(event.wait(), timeout)


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
