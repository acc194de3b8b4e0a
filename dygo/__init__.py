"""dygo: durable background jobs for Python on PostgreSQL.

The public face for a project's code: `from dygo import job, enqueue, JobContext, ...`, re-exported
from `dygo.store`. The installed distribution imports under `dygo` only (`dygo.store`, `dygo.worker`,
`dygo.app`; the repository keeps them as top-level folders, mapped in pyproject.toml), so it never
shadows a project's own `app`, `jobs`, `store` or `worker` package.
"""

from dygo.store import (
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
    Workflow,
    WorkflowError,
    aenqueue,
    aenqueue_many,
    aenqueue_workflow,
    await_for_result,
    batch,
    chain,
    enqueue,
    enqueue_many,
    enqueue_workflow,
    job,
    make_context,
    registry,
    schedule,
    wait_for_result,
)
from dygo.store import result as result  # deprecated alias of await_for_result, for one release

__all__ = [
    "Abort",
    "ConfigError",
    "EnqueueError",
    "Enqueued",
    "JobContext",
    "JobRequest",
    "Reportable",
    "Retry",
    "RetryAfter",
    "SchemaError",
    "Snooze",
    "Workflow",
    "WorkflowError",
    "aenqueue",
    "aenqueue_many",
    "aenqueue_workflow",
    "await_for_result",
    "batch",
    "chain",
    "enqueue",
    "enqueue_many",
    "enqueue_workflow",
    "job",
    "make_context",
    "registry",
    "schedule",
    "wait_for_result",
]
