"""dygo's shared core: configuration, job definitions, migrations and every SQL statement (store/sql/)."""

from dygo.store.connections import UnsupportedConnection
from dygo.store.enqueue import Enqueued, JobRequest, aenqueue, aenqueue_many, enqueue, enqueue_many
from dygo.store.errors import (
    Abort,
    ChildFailed,
    ConfigError,
    EnqueueError,
    EventError,
    EventTimeout,
    LeaseLost,
    Reportable,
    Retry,
    RetryAfter,
    SchemaError,
    Sleeping,
    Snooze,
    StepError,
    StepOrderError,
    Suspended,
)
from dygo.store.events import Emitted, aemit, callback_url, emit
from dygo.store.job_handle import EnqueueOptions, Job
from dygo.store.registry import JobContext, job, make_context, registry
from dygo.store.results import await_for_result, wait_for_result
from dygo.store.results import result as result  # deprecated alias of await_for_result, for one release
from dygo.store.schedules import schedule
from dygo.store.workflows import Workflow, WorkflowError, aenqueue_workflow, batch, chain, enqueue_workflow

__all__ = [
    "Abort",
    "ChildFailed",
    "ConfigError",
    "EnqueueError",
    "EnqueueOptions",
    "Enqueued",
    "Emitted",
    "EventError",
    "EventTimeout",
    "Job",
    "JobContext",
    "JobRequest",
    "LeaseLost",
    "Reportable",
    "Retry",
    "RetryAfter",
    "SchemaError",
    "Sleeping",
    "Snooze",
    "StepError",
    "StepOrderError",
    "Suspended",
    "UnsupportedConnection",
    "Workflow",
    "WorkflowError",
    "aemit",
    "aenqueue",
    "aenqueue_many",
    "aenqueue_workflow",
    "await_for_result",
    "batch",
    "callback_url",
    "chain",
    "emit",
    "enqueue",
    "enqueue_many",
    "enqueue_workflow",
    "job",
    "make_context",
    "registry",
    "schedule",
    "wait_for_result",
]
