"""The worker process: wires its services, starts them, watches them, and stops them in one order.

* producer      - claim ready jobs for every queue in one statement, start them, and while jobs are short
                  claim ahead of the free slots (worker/producer.py, worker/ahead.py)
* listener      - hold the worker's presence lock on its own session; LISTEN for new or requeued jobs and
                  schedule changes, wake the others (worker/listener.py)
* presence-watch - find workers gone (their presence lock free), recover their jobs (worker/presence.py)
* scheduler     - fire due cron schedules (worker/scheduler.py)
* maintainer    - heartbeat, recovery of expired leases, stale workers, retention (worker/maintainer.py)
* lease-keeper  - renew the leases of running jobs at half the TTL (worker/lease_keeper.py)
* progress      - write `ctx.progress` reports at most once a second (worker/progress.py)
* settler       - record finished jobs, a batch per statement (worker/settler.py)
* timings       - append latency/duration histogram counts for /metrics (worker/timings_writer.py)

A service rides out a database outage itself: the database unreachable, connections refused or cut
(store/outage.py is_outage). It logs one lost/back pair per outage for the whole worker, retries, and the
worker stays up. Anything else that ends a service stops the worker:

* a database error that is not an outage: a privilege the role lacks, a column missing after a bad
  deploy, a value refused. Retrying would get the same answer; it is logged in one line naming the
  service, what it was doing, and the error's name, SQLSTATE and message (never as a lost connection);
* any other exception: a defect, logged with the service's name and its traceback.

The worker then stops as on SIGTERM (in-flight jobs finish or are handed back) and exits 1, so its
process manager starts a fresh one (not a restart in place: a fresh process starts from the database,
not from the state that made the service die) and the operator reads why in the log. The same errors at
start (a privilege the start-up statements need) end the process with that one line and exit 1.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import signal
from collections.abc import AsyncIterator, Awaitable, Callable

import psycopg
from dygo.store import leases, limits
from dygo.store.config import Settings
from dygo.store.errors import StatementError
from dygo.store.leases import ClaimedJob
from dygo.store.outage import describe, is_outage
from dygo.store.registry import Registry
from dygo.worker.capacity import Capacity
from dygo.worker.database import WorkerConnections
from dygo.worker.event_timeouts import EventTimeouts
from dygo.worker.executor import Executor
from dygo.worker.lease_keeper import LeaseKeeper
from dygo.worker.lifecycle import announce
from dygo.worker.listener import Listener
from dygo.worker.maintainer import Heartbeat, Maintainer, Recovery, Retention, StaleWorkers
from dygo.worker.options import WorkerOptions, make_worker_id
from dygo.worker.presence import PresenceWatch
from dygo.worker.producer import Producer, QueueSlots
from dygo.worker.progress import ProgressWriter
from dygo.worker.runs import Runs
from dygo.worker.scheduler import Scheduler
from dygo.worker.service import Service
from dygo.worker.settler import Settler
from dygo.worker.telemetry import WorkerStats, serve_worker_metrics
from dygo.worker.timings_writer import TimingsWriter

log = logging.getLogger("dygo.worker")
EXIT_SERVICE_DIED = 1


class Worker:
    """One worker process: its services, built and wired once here, in the order they depend on each other."""

    def __init__(self, settings: Settings, jobs: Registry, options: WorkerOptions, url: str) -> None:
        self.settings = settings
        self.options = options
        self.id = make_worker_id()
        self.database = WorkerConnections(url, self.id)
        self.stats = WorkerStats()
        leased: dict[str, ClaimedJob] = {}  # worker/runs.py says who writes and reads it
        self.slots = {
            name: QueueSlots(name, n, settings.claim_ahead, settings.claim_batch_size)
            for name, n in options.queues.items()
        }
        self.capacity = Capacity(jobs.concurrency_caps(settings.default_concurrency), options.max_concurrency)
        self.progress = ProgressWriter(self.database, leased)
        self.settler = Settler(self.database, leased, self.stats)
        self.runs = Runs(
            leased,
            Executor(settings, jobs, self.progress.report, self.database.connection, self.database.sync_connection),
            self.settler,
            self.progress,
            self.stats,
        )
        self.heartbeat = Heartbeat(self.database, self.id, options.queues)
        self.recovery = Recovery(self.database, settings.max_reaps)
        self.listening = not options.poll_only and self.database.listen_url is not None
        self.producer = Producer(
            self.database,
            self.slots,
            self.runs,
            self.recovery,
            self.id,
            settings.lease_ttl,
            settings.claim_batch_size,
            options.poll_interval,
            self.capacity,
            notified=self.listening,
        )
        # What a settle means for claiming goes to the producer (settler.QueueWakeups); set here because the
        # producer needs the runs, which need the settler.
        self.settler.wakeups = self.producer
        self.scheduler = Scheduler(self.database, jobs, options.poll_interval)
        self.timings = TimingsWriter(self.database, self.stats)
        # The stop order: the producer first (no new claims), then, once in-flight jobs are drained, the
        # rest; the settler and the timings writer flush a last time after them.
        self.services: list[Service] = [self.producer]
        self.listener = Listener(
            self.database,
            self.producer.wake_queue,
            self.producer.wake_all,
            self.scheduler.changed,
            options.poll_interval,
            self.id,
            listen=not options.poll_only,
        )
        if self.database.listen_url is not None:
            self.services.append(self.listener)
        if options.cron:
            self.services.append(self.scheduler)
        self.services += [
            Maintainer(self.heartbeat, self.recovery, StaleWorkers(self.database), Retention(self.database, settings)),
            PresenceWatch(self.database, self.id, settings.max_reaps),
            EventTimeouts(self.database),  # the deadlines of event waits (store/events.py)
            LeaseKeeper(self.database, leased, settings.lease_ttl),
            self.progress,
            self.settler,
            self.timings,
        ]
        self.died: list[str] = []  # services that ended on an unexpected error
        self.last_write_failed = False  # a last write of the stop failed on a database error (_last)
        self.said: set[str] = set()  # the database errors logged as a service's death: not said again at the stop
        self.ready = False  # services running and, unless polling only, listening (_announce_ready)

    async def run(self) -> int:
        await self.database.wait_until_reachable()
        await self.database.pool.open(wait=True, timeout=30)
        try:
            async with starting("checking the schema and syncing the limits"), self.database.connection() as conn:
                await leases.check_schema(conn)
                # Before the first claim, so it claims under the file's limits (store/limits.py sync).
                await limits.sync(conn, self.settings.limits)
            if self.options.metrics_port is not None:
                bound = serve_worker_metrics(
                    self.options.metrics_host,
                    self.options.metrics_port,
                    self.stats,
                    lambda: {n: (s.running, s.concurrency, len(s.ahead)) for n, s in self.slots.items()},
                    self.is_ready,
                )
                announce(f"dygo worker metrics: http://{self.options.metrics_host}:{bound}/metrics")
            if self.options.once:
                return await self._run_once()
            return await self._run_forever()
        finally:
            await self.database.close()

    async def _run_once(self) -> int:
        if self.options.cron:
            await self.scheduler.sync()
            await self.scheduler.fire_due()
        await self.recovery.run_once()
        await EventTimeouts(self.database).run_once()
        progress = self.progress.start()
        async with self.database.connection() as conn:
            claimed = (
                await self.producer.claim(
                    conn, self.capacity.share({s.name: s.concurrency for s in self.slots.values()})
                )
            ).jobs
        await self.runs.wait()
        progress.cancel()
        await asyncio.gather(progress, return_exceptions=True)
        await self.settler.flush()
        await self.timings.flush()
        announce(
            f"dygo worker {self.id} ran {len(claimed)} job(s) once; exiting",
            event="ran_once",
            worker=self.id,
            jobs=len(claimed),
        )
        return 0

    async def _run_forever(self) -> int:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.stop)
        async with starting("writing the worker's heartbeat row"):
            await self.heartbeat.run_once()
        if self.options.cron:
            async with starting("syncing the schedules"):
                await self.scheduler.sync()
        # Everything imported and built so far lives as long as the process: keep it out of the
        # collector's full passes, which would otherwise walk it and stall the loop for milliseconds.
        gc.freeze()
        queues = ", ".join(f"{s.name}({s.concurrency})" for s in self.slots.values())
        cron = "" if self.options.cron else "; cron off"
        cap = "" if self.options.max_concurrency is None else f"at most {self.options.max_concurrency} jobs at once; "
        announce(
            f"dygo worker {self.id} started: queues {queues}; {cap}{self._mode()}, "
            f"poll every {self.options.poll_interval:g}s{cron}; {self._recovery_mode()}",
            event="started",
            worker=self.id,
            queues=self.options.queues,
        )
        tasks = [asyncio.create_task(service.run(), name=service.name) for service in self.services]
        for task in tasks:
            task.add_done_callback(self._watch)
        announcing = asyncio.create_task(self._announce_ready())
        await self.producer.stopping.wait()
        self.ready = False
        announcing.cancel()
        announce(
            f"dygo worker {self.id} stopping: {len(self.runs.tasks)} job(s) in flight, "
            f"waiting up to {self.options.shutdown_timeout:g}s",
            event="stopping",
            worker=self.id,
            in_flight=len(self.runs.tasks),
        )
        await asyncio.gather(tasks[0], return_exceptions=True)  # the producer: no claim after this
        await self.runs.drain(self.options.shutdown_timeout)
        for task in tasks[1:]:
            task.cancel()
        await asyncio.gather(*tasks[1:], return_exceptions=True)
        await self._last(self.settler.flush)
        await self._last(self.timings.flush)
        await self._last(self.heartbeat.gone)
        await self.database.back()  # a statement ran: an outage still open at the stop ended (one back line)
        if self.options.ready_file is not None:
            self.options.ready_file.unlink(missing_ok=True)
        if self.died:
            announce(
                f"dygo worker {self.id} stopped: service {', '.join(self.died)} died (see the log); exit "
                f"{EXIT_SERVICE_DIED}",
                event="stopped",
                worker=self.id,
                died=self.died,
            )
            return EXIT_SERVICE_DIED
        if self.last_write_failed:
            announce(
                f"dygo worker {self.id} stopped: a last write failed (see the log); exit {EXIT_SERVICE_DIED}",
                event="stopped",
                worker=self.id,
            )
            return EXIT_SERVICE_DIED
        announce(f"dygo worker {self.id} stopped", event="stopped", worker=self.id)
        return 0

    async def _announce_ready(self) -> None:
        """Ready: every service started and, unless polling only, LISTEN in place (a job enqueued from now
        on wakes this worker at once). Said on stdout, by --ready-file, and on the metrics port's /readyz."""
        if self.listening:
            await self.listener.listening.wait()
        self.ready = True
        if self.options.ready_file is not None:
            self.options.ready_file.write_text(f"{self.id}\n")
        announce(f"dygo worker {self.id} ready", event="ready", worker=self.id)

    def is_ready(self) -> bool:
        """For the readiness probe (from the metrics thread): ready, and not in a database outage."""
        return self.ready and not self.database.outage.down

    def _mode(self) -> str:
        if self.listening:
            return "listening"
        if self.options.poll_only:
            return "polling only"
        return (
            "polling only (DATABASE_URL goes through a transaction pooler and DATABASE_DIRECT_URL is not "
            "set, so there is no session to LISTEN on)"
        )

    def _recovery_mode(self) -> str:
        if self.database.listen_url is not None:
            return "if it dies, its jobs come back in seconds (presence lock on its own session)"
        return (
            "if it dies, its jobs come back when their lease runs out (no session of its own to hold a presence "
            "lock on: DATABASE_URL goes through a transaction pooler and DATABASE_DIRECT_URL is not set)"
        )

    def _watch(self, task: asyncio.Task[None]) -> None:
        """A service's task ended: after a stop, as it should; before, or on an error, the service died."""
        if task.cancelled():
            return
        error = task.exception()
        if error is None and self.producer.stopping.is_set():
            return
        self.died.append(task.get_name())
        if isinstance(error, StatementError):
            self.said.add(describe(error.cause))
            log.error(
                "worker service %s died on a database error that is not an outage (%s); stopping the worker so "
                "its process manager starts a fresh one",
                task.get_name(),
                error,
            )
        else:
            log.error(
                "worker service %s died (%s); stopping the worker so its process manager starts a fresh one",
                task.get_name(),
                f"{type(error).__name__}: {error}" if error else "its loop returned",
                exc_info=error,
            )
        self.stop()

    async def _last(self, write: Callable[[], Awaitable[None]]) -> None:
        """One of the stop's last writes. A database error there that is not an outage is said in one line (unless
        a service died of the same one), and the worker exits 1; the other last writes still run."""
        try:
            await write()
        except StatementError as error:
            self.last_write_failed = True
            if describe(error.cause) not in self.said:
                log.error("worker stop: a last write failed on a database error that is not an outage (%s)", error)

    def stop(self) -> None:
        self.producer.stop()


@contextlib.asynccontextmanager
async def starting(where: str) -> AsyncIterator[None]:
    """A start-up step: a database error that is not an outage is raised as a StatementError naming the step
    (the CLI prints it in one line and exits 1); an outage is raised as it is."""
    try:
        yield
    except psycopg.Error as exc:
        if is_outage(exc):
            raise
        raise StatementError(f"start-up: {where}", exc) from exc
