"""Errors a caller can catch: configuration and schema problems, and the outcomes a handler raises."""

from __future__ import annotations


class DygoError(Exception):
    """Base of every error dygo raises on purpose."""


class ConfigError(DygoError):
    """A configuration file or job definition breaks a rule. The CLI exits 2 on it."""

    def __init__(self, source: str, entry: str, rule: str) -> None:
        self.source, self.entry, self.rule = source, entry, rule
        super().__init__(f"{source}: {entry}: {rule}")


class SchemaError(DygoError):
    """The database schema is missing or older than this code."""


class EnqueueError(DygoError):
    """An enqueue request names an unknown kind or queue, or carries bad arguments or options."""

    def __init__(self, code: str, message: str, details: object = None) -> None:
        self.code, self.details = code, details
        super().__init__(message)


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


# --- Admin operations ---------------------------------------------------------------------------


class AdminError(DygoError):
    """An admin operation that cannot be done; `code` is machine-readable, the message says why."""

    def __init__(self, code: str, message: str, details: object = None) -> None:
        self.code, self.details = code, details
        super().__init__(message)


class NotFound(AdminError):
    """No such job or queue."""


class Conflict(AdminError):
    """The job or queue is not in a state that allows the operation."""


class WaitTimeout(DygoError):
    """Waiting for a job's result ran out of time before the job reached a final state."""

    def __init__(self, job_id: int, timeout: float, job: dict) -> None:
        self.job_id, self.timeout, self.job = job_id, timeout, job
        super().__init__(f"job {job_id} is still {job['state']} after waiting {timeout:g}s for its result")


# --- The database connection ---------------------------------------------------------------------


class DatabaseUnavailable(DygoError):
    """DATABASE_URL is malformed, or the database cannot be reached. The message never holds the password."""
