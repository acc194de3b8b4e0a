"""dygo: durable background jobs for Python on PostgreSQL.

The public face for a project's code: `from dygo import job, enqueue, JobContext, ...`. Everything
here is re-exported from `store` (the modules stay where they are; `dygo init` projects import from
here, so a later move of the modules changes no project's imports).
"""

from store import (
    Abort,
    ConfigError,
    Enqueued,
    EnqueueError,
    JobContext,
    JobRequest,
    Reportable,
    Retry,
    RetryAfter,
    SchemaError,
    Snooze,
    aenqueue,
    enqueue,
    enqueue_many,
    job,
    make_context,
    registry,
    result,
    schedule,
    wait_for_result,
)

__all__ = [
    "Abort", "ConfigError", "EnqueueError", "Enqueued", "JobContext", "JobRequest", "Reportable", "Retry",
    "RetryAfter", "SchemaError", "Snooze", "aenqueue", "enqueue", "enqueue_many", "job", "make_context",
    "registry", "result", "schedule", "wait_for_result",
]
