"""Run one claimed job's handler and turn whatever happens into an outcome to settle."""

from __future__ import annotations

import asyncio
import contextvars
import json
import logging
import threading
import time
import traceback
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from dygo.store import tracing
from dygo.store.backoff import retry_delay
from dygo.store.config import Settings
from dygo.store.durations import format_duration
from dygo.store.errors import Abort, Reportable, RetryAfter, Sleeping, Snooze, Suspended
from dygo.store.leases import ClaimedJob, Outcome, Succeeded, Unsuccessful
from dygo.store.registry import JobContext, JobDefinition, Registry
from dygo.store.steps import Connect, StepLease, StepReader, StepRules, Steps, SyncConnect
from dygo.worker.deadlines import Deadlines
from dygo.worker.execution_log import ExecutionLog

log = logging.getLogger("dygo.worker")


class UnstorableResult(Exception):
    """A handler returned something the job row cannot hold: the attempt fails instead of the settle."""


class Executor:
    def __init__(
        self,
        settings: Settings,
        jobs: Registry,
        progress: Callable[[str, float, str | None], None] | None = None,
        connect: Connect | None = None,
        connect_sync: SyncConnect | None = None,
    ) -> None:
        self.settings = settings
        self.jobs = jobs
        self.progress = progress  # where ctx.progress reports go (worker.progress.ProgressWriter.report)
        # Where ctx.step reads and records steps: the shared connection, and a sync one for sync step_tx.
        self.connect = connect
        self.connect_sync = connect_sync
        self.step_reader = None if connect is None else StepReader(connect)
        self.step_rules = StepRules(settings.max_step_result_bytes, settings.strict_steps)
        self.execution_log = ExecutionLog()
        self.deadlines = Deadlines()  # the handlers' timeouts

    async def run(self, job: ClaimedJob) -> tuple[Outcome, float]:
        """The outcome, and how long the handler ran in seconds (the log line's and the metrics' duration)."""
        started = time.monotonic()
        definition = self.jobs.get(job.kind)
        if definition is None:
            outcome: Outcome = Unsuccessful(
                job, "dead", error=f"no handler for kind {job.kind!r} in this worker (not retried)"
            )
        else:
            outcome = await self._run_handler(definition, job)
        elapsed = time.monotonic() - started
        self._log(job, outcome, elapsed)
        return outcome, elapsed

    async def _run_handler(self, definition: JobDefinition, job: ClaimedJob) -> Outcome:
        timeout = definition.timeout if definition.timeout is not None else self.settings.default_timeout
        deadline = datetime.fromtimestamp(time.time() + timeout, UTC) if timeout else None
        ctx = JobContext(
            id=job.id,
            kind=job.kind,
            queue=job.queue,
            attempt=job.attempt,
            max_attempts=job.max_attempts,
            enqueued_at=job.enqueued_at,
            meta=job.meta,
            deadline=deadline,
            lease_token=job.lease_token,
            reporter=self.progress,
            workflow=job.workflow,
            deps=job.deps or {},
            steps=None if self.connect is None else self._steps(job),
        )
        try:
            args = definition.build_args(job.args)
            if definition.is_async:
                call = definition.handler(ctx, args)
            else:
                call = run_in_daemon_thread(definition.handler, ctx, args)
            result = await (self.deadlines.within(call, timeout) if timeout else call)
            stored = None if result is None else self._stored_result(job, encode_result(result))
            return Succeeded(job, stored, appends=ctx.appends or None)
        except asyncio.CancelledError:
            raise
        except Suspended as suspended:
            return Unsuccessful(job, "waiting", refund_attempt=True, wait=suspended.wait)
        except Snooze as snooze:
            since = snooze.since if isinstance(snooze, Sleeping) else None
            return Unsuccessful(job, "pending", delay=snooze.delay, refund_attempt=True, delay_since=since)
        except TimeoutError as exc:
            message = f"timed out after {format_duration(timeout)}" if timeout else f"TimeoutError: {exc}"
            return self._failure(definition, job, exc, message)
        except UnstorableResult as exc:
            return self._failure(definition, job, exc, str(exc))
        except (Exception, SystemExit, KeyboardInterrupt) as exc:
            return self._failure(definition, job, exc)

    def _steps(self, job: ClaimedJob) -> Steps:
        assert self.connect is not None
        lease = StepLease(job.id, job.lease_token, job.attempt)
        return Steps(lease, job.kind, self.step_rules, self.connect, self.connect_sync, self.step_reader)

    def _stored_result(self, job: ClaimedJob, encoded: str | None) -> str | None:
        """The result as stored: itself, or a note when it is bigger than max_result_bytes. The job
        still succeeds (its work is done; running it again would not make the result smaller)."""
        if encoded is None:
            return None
        size = len(encoded)  # json.dumps escapes non-ASCII, so characters are bytes
        limit = self.settings.max_result_bytes
        if size <= limit:
            return encoded
        log.warning(
            "job %s %s: result of %d bytes not stored (max_result_bytes is %d)",
            job.id,
            job.kind,
            size,
            limit,
            extra={"fields": {"job_id": job.id, "kind": job.kind, "result_bytes": size}},
        )
        return json.dumps(
            {"result_not_stored": f"{size} bytes of JSON, more than max_result_bytes ({limit})", "bytes": size}
        )

    def _failure(
        self, definition: JobDefinition, job: ClaimedJob, exc: BaseException, message: str | None = None
    ) -> Unsuccessful:
        # PostgreSQL text cannot hold NUL: one in an error message would make the settle fail for
        # the whole batch, again and again.
        error = (message or f"{type(exc).__name__}: {exc}").replace("\x00", "\\x00")
        trace = "".join(traceback.format_exception(exc)).replace("\x00", "\\x00")
        tracing.record_exception(exc)
        if isinstance(exc, Abort):
            return Unsuccessful(job, "dead", error=error, traceback=trace)
        if job.attempt >= job.max_attempts:
            if isinstance(exc, Reportable):
                # The traceback follows as indented lines in text (dygo.logs.TextFormatter), as a field in JSON.
                log.error(
                    "REPORTABLE job %s %s is dead after %s attempts: %s",
                    job.id,
                    job.kind,
                    job.attempt,
                    error,
                    extra={"block": trace, "fields": {"job_id": job.id, "kind": job.kind, "traceback": trace}},
                )
            return Unsuccessful(job, "dead", error=error, traceback=trace)
        delay = exc.delay if isinstance(exc, RetryAfter) else retry_delay(job.id, job.attempt, definition.retry_backoff)
        return Unsuccessful(job, "pending", delay=delay, error=error, traceback=trace)

    def _log(self, job: ClaimedJob, outcome: Outcome, elapsed: float) -> None:
        """One line per execution: `job 12 email.send attempt 1/5 failed in 2ms, retry in 1.2s: ...`."""
        if isinstance(outcome, Succeeded):
            word, detail, level = "succeeded", "", logging.INFO
        elif outcome.state == "dead":
            word, detail, level = "dead", f": {outcome.error}", logging.WARNING
        elif outcome.state == "waiting":  # a durable wait
            word, detail, level = "waiting", f" for {outcome.wait.reason if outcome.wait else '?'}", logging.INFO
        elif outcome.delay_since is not None:  # ctx.sleep
            word, detail, level = "sleeping", f", wakes in {format_duration(outcome.delay)}", logging.INFO
        elif outcome.refund_attempt:
            word, detail, level = "snoozed", f", again in {format_duration(outcome.delay)}", logging.INFO
        else:
            word, detail, level = (
                "failed",
                f", retry in {format_duration(outcome.delay)}: {outcome.error}",
                logging.WARNING,
            )
        if not log.isEnabledFor(level):
            return
        error = outcome.error if isinstance(outcome, Unsuccessful) else None
        self.execution_log.write(
            level,
            f"job {job.id} {job.kind} attempt {job.attempt}/{job.max_attempts} {word} "
            f"in {format_duration(elapsed)}{detail}",
            lambda: execution_fields(job, word, elapsed, error),
        )


def execution_fields(job: ClaimedJob, word: str, elapsed: float, error: str | None) -> dict[str, Any]:
    """What a JSON execution line carries besides its message (dygo.logs.JsonFormatter)."""
    fields = {
        "job_id": job.id,
        "kind": job.kind,
        "queue": job.queue,
        "attempt": job.attempt,
        "max_attempts": job.max_attempts,
        "outcome": word,
        "duration_ms": round(elapsed * 1000, 3),
    }
    if error:
        fields["error"] = error
    return fields


def encode_result(result: Any) -> str | None:
    """The result as JSON text for the jsonb column, or UnstorableResult saying why it cannot be stored."""
    if result is None:
        return None
    try:
        # NaN and Infinity are not JSON: jsonb refuses them, and at settle time that would fail the batch.
        text = json.dumps(result, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise UnstorableResult(f"result is not JSON-serialisable: {exc}") from None
    if "\\u0000" in text:
        raise UnstorableResult("result contains a NUL character (\\u0000), which PostgreSQL jsonb cannot store")
    return text


def run_in_daemon_thread(function: Callable[..., Any], *args: Any) -> asyncio.Future[Any]:
    """Run a sync handler in its own daemon thread. A handler that overruns its timeout cannot be
    killed, but a daemon thread neither holds a pool slot nor blocks the process from exiting."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[Any] = loop.create_future()

    def settle(result: Any = None, error: BaseException | None = None) -> None:
        if future.done():
            return
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(result)

    def target() -> None:
        try:
            result = function(*args)
        except BaseException as exc:  # noqa: BLE001 - everything a handler raises is its outcome
            loop.call_soon_threadsafe(settle, None, exc)
        else:
            loop.call_soon_threadsafe(settle, result)

    # The caller's context goes along, so spans a handler starts are children of its execution span.
    threading.Thread(target=contextvars.copy_context().run, args=(target,), daemon=True, name="dygo-handler").start()
    return future
