"""Errors a caller can catch: configuration and schema problems, the outcomes a handler raises, and the
errors a request is answered with.

Every one derives from `DygoError`. Those a request can be refused with derive from `CodedError`: a
machine-readable `code`, a `message` for a person, structured `details`, and the HTTP status the API
answers with (the body is `{"error": {"code", "message", "details"}}`, app/errors.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dygo.store.outage import describe


class DygoError(Exception):
    """Base of every error dygo raises on purpose."""


class CodedError(DygoError):
    """An error with a `code`, a `message`, `details`, and the HTTP status the API answers it with: the class's
    `http_status`, unless given for the one error; `headers` go with that answer (Retry-After, Allow)."""

    http_status: int = 400

    def __init__(
        self,
        code: str,
        message: str,
        details: object = None,
        *,
        http_status: int | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        self.code, self.message, self.details = code, message, details
        if http_status is not None:
            self.http_status = http_status
        self.headers = dict(headers) if headers else None
        super().__init__(message)


class ConfigError(DygoError):
    """A configuration file or job definition breaks a rule. The CLI exits 2 on it."""

    def __init__(self, source: str, entry: str, rule: str) -> None:
        self.source, self.entry, self.rule = source, entry, rule
        super().__init__(f"{source}: {entry}: {rule}")


class SchemaError(DygoError):
    """The database schema is missing or older than this code."""


class EnqueueError(CodedError):
    """An enqueue request names an unknown kind or queue, or carries bad arguments or options (422)."""

    http_status = 422


class EnqueueConflict(EnqueueError):
    """The enqueue could not be decided now (an idempotency key kept changing hands); trying again can work (409)."""

    http_status = 409


# --- Handler outcomes -------------------------------------------------------------------------
# A handler returns normally to succeed. Any other exception is a failed attempt (retried with
# backoff). These types say something more specific.


class Abort(DygoError):
    """Dead now: the job will never succeed, so spend no more attempts on it."""


class Retry(DygoError):
    """A failed attempt, retried with the usual backoff (the same as raising any exception)."""


class RetryAfter(Retry):
    """A failed attempt, retried after `delay` seconds instead of the usual backoff."""

    def __init__(self, message: str = "retry requested", delay: float = 1.0) -> None:
        if delay < 0:
            raise ValueError(f"RetryAfter delay must not be negative, got {delay}")
        self.delay = float(delay)
        super().__init__(message)


class Reportable(Retry):
    """A failed attempt that is logged loudly when the job runs out of attempts."""


class Snooze(DygoError):
    """Run again after `delay` seconds without spending an attempt."""

    def __init__(self, delay: float = 1.0) -> None:
        if delay < 0:
            raise ValueError(f"Snooze delay must not be negative, got {delay}")
        self.delay = float(delay)
        super().__init__(f"snoozed for {delay}s")


class Sleeping(Snooze):
    """Raised by `ctx.sleep` to end the run: the job leaves its slot and runs again at its wake time, its attempt
    not spent. A handler must let it through (an `except Exception` that swallows it keeps the slot)."""

    def __init__(self, key: str, delay: float, since: float | None = None) -> None:
        self.key = key
        self.since = since  # the time.monotonic() at which `delay` was measured (the settle counts from it)
        super().__init__(delay)
        self.args = (f"sleeping at step {key!r} for {delay:.3f}s",)


class Suspended(DygoError):
    """Raised by a durable wait (`ctx.wait_for_event`, `ctx.call`, `ctx.map`) to end the run: the job leaves its
    slot and waits (state `waiting`, its attempt not spent) until what it waits for comes, then runs again and
    replays its steps. `wait` is what the settle records (store.leases.Wait). A handler must let it through."""

    def __init__(self, key: str, reason: str, wait: Any) -> None:
        self.key, self.reason, self.wait = key, reason, wait
        super().__init__(f"waiting at step {key!r} for {reason}")


class ChildFailed(DygoError):
    """A child job of `ctx.call` or `ctx.map` did not succeed: it ended dead, cancelled or skipped, or was
    deleted before it ended. Raised in the parent where it awaits the step `key`; catchable like any error
    (uncaught, it fails the parent's attempt). `failures`: one dict per child that did not succeed, in input
    order, with its `index`, job `id` (None when deleted), `state` ('dead', 'cancelled', 'skipped',
    'deleted') and `error` (a dead child's last error, else None); `results`: every child's result in input
    order, None for those that did not succeed."""

    def __init__(self, key: str, failures: list[dict[str, Any]], results: list[Any]) -> None:
        self.key, self.failures, self.results = key, failures, results
        shown = "; ".join(_child_failure(f) for f in failures[:3])
        more = f"; and {len(failures) - 3} more" if len(failures) > 3 else ""
        total = len(results)
        super().__init__(
            f"step {key!r}: {len(failures)} of {total} child job{'s' if total != 1 else ''} did not succeed: "
            f"{shown}{more}"
        )


def _child_failure(failure: Mapping[str, Any]) -> str:
    job = "a deleted job" if failure.get("id") is None else f"job {failure['id']}"
    error = f": {failure['error']}" if failure.get("error") else ""
    return f"[{failure.get('index')}] {job} {failure.get('state')}{error}"


class StepError(DygoError):
    """A step (`ctx.step`, `ctx.step_tx`) broke a rule: a bad name, a result that cannot be stored, or (with
    `strict_steps`) a replay whose steps come in another order than recorded. The message names the step. A
    failed attempt like any exception: retried with the usual backoff."""

    def __init__(self, key: str, rule: str) -> None:
        self.key, self.rule = key, rule
        super().__init__(f"step {key!r}: {rule}")


class StepOrderError(StepError):
    """With `strict_steps`: a replayed run calls its steps in another order than the run that recorded them."""


class LeaseLost(DygoError):
    """This run no longer holds its job's lease (recovered after its lease expired, or settled elsewhere), so
    it may record no step: the handler should stop. Its outcome is dropped by the fenced settle anyway."""

    def __init__(self, job_id: int, key: str) -> None:
        self.job_id, self.key = job_id, key
        super().__init__(f"job {job_id}: step {key!r} not recorded: this run lost the job's lease")


# --- Events (store/events.py) ---------------------------------------------------------------------


class EventError(CodedError):
    """An event's key or payload, or a wait's timeout, breaks a rule; the message names the field (422)."""

    http_status = 422

    def __init__(self, field: str, rule: str) -> None:
        self.field, self.rule = field, rule
        super().__init__("invalid_event", f"{field}: {rule}", {"field": field})


class EventTimeout(DygoError):
    """Raised by `ctx.wait_for_event` when its timeout passed before the event was emitted. A handler may catch
    it and go on (its replays raise it again at the same wait); uncaught, it fails the attempt like any error."""

    def __init__(self, key: str, event: str, timeout: float | None) -> None:
        self.key, self.event, self.timeout = key, event, timeout
        after = "" if timeout is None else f" within {timeout:g}s"
        super().__init__(f"step {key!r}: event {event!r} was not emitted{after}")


# --- Admin operations ---------------------------------------------------------------------------


class AdminError(CodedError):
    """An admin operation that cannot be done; `code` is machine-readable, the message says why (422)."""

    http_status = 422


class NotFound(AdminError):
    """No such job, queue or schedule (404)."""

    http_status = 404


class Conflict(AdminError):
    """The job or queue is not in a state that allows the operation (409)."""

    http_status = 409


class WaitTimeout(DygoError):
    """Waiting for a job's result ran out of time before the job reached a final state."""

    def __init__(self, job_id: int, timeout: float, job: dict[str, Any]) -> None:
        self.job_id, self.timeout, self.job = job_id, timeout, job
        super().__init__(f"job {job_id} is still {job['state']} after waiting {timeout:g}s for its result")


# --- The database connection ---------------------------------------------------------------------


class DatabaseUnavailable(CodedError):
    """No database for this operation, and `reason` says why: "down" (unreachable, or refusing connections: an
    outage, store/outage.py), "saturated" (a `dygo serve` process has more requests waiting for a connection
    than its limits allow), or "invalid_url" (DATABASE_URL does not parse). The message never holds the
    password. The API answers it with 503 `database_unavailable`, `details.reason`, and, given `retry_after`,
    a Retry-After header."""

    http_status = 503

    def __init__(
        self, message: str, reason: str = "down", cause: BaseException | None = None, retry_after: int | None = None
    ) -> None:
        self.reason, self.cause, self.retry_after = reason, cause, retry_after
        headers = None if retry_after is None else {"Retry-After": str(retry_after)}
        super().__init__("database_unavailable", message, {"reason": reason}, headers=headers)


class StatementError(DygoError):
    """A database error that is not an outage (store/outage.py is_outage): a privilege the role lacks, a table
    or column this code expects and the database does not have, a value it refuses. Retrying the statement
    gets the same answer, so a worker stops on it and exits 1, with this message: `where` (what the process
    was doing) and the error's name, SQLSTATE and message. `cause` is the driver's error."""

    def __init__(self, where: str, cause: BaseException) -> None:
        self.where, self.cause = where, cause
        self.sqlstate: str | None = getattr(cause, "sqlstate", None)
        super().__init__(f"{where}: {describe(cause)}")
