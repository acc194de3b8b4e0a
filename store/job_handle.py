"""What `@job` returns: the handler, callable as before, with a typed enqueue of its own kind.

`send_email.enqueue(conn, SendEmail(to=..., subject=...), delay="10m")` is `enqueue(conn, "email.send",
...)` with the kind taken from the declaration and `args` typed as the handler's own args model, so a
type checker (mypy, pyright) finds a wrong field or a job's args passed to another job's kind before
anything runs. The options are typed too (`EnqueueOptions`).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Mapping
from datetime import datetime, timedelta
from typing import Generic, TypedDict, TypeVar, Unpack

from dygo.store.connections import Connectable
from dygo.store.enqueue import Enqueued, JobRequest
from dygo.store.enqueue import aenqueue as aenqueue_kind
from dygo.store.enqueue import aenqueue_many as aenqueue_requests
from dygo.store.enqueue import enqueue as enqueue_kind
from dygo.store.enqueue import enqueue_many as enqueue_requests
from dygo.store.registry import JobContext, JobDefinition

A = TypeVar("A")  # the handler's args: its pydantic model, or a dict
R = TypeVar("R")  # what calling the handler returns (a coroutine for an `async def` one)


class EnqueueOptions(TypedDict, total=False):
    """The options of `enqueue` (docs/guides/enqueueing.md), each optional; None is the default, as unset."""

    queue: str | None
    priority: int | None
    run_at: datetime | None
    delay: str | float | timedelta | None
    max_attempts: int | None
    meta: Mapping[str, str]
    idempotency_key: str | None
    idempotency_ttl: str | float | timedelta | None


class Job(Generic[A, R]):
    """A declared job: call it as the handler (tests do, with `make_context`), or enqueue it by its kind."""

    def __init__(self, definition: JobDefinition, handler: Callable[[JobContext, A], R]) -> None:
        self.definition = definition
        self.kind = definition.kind
        self.handler = handler
        functools.update_wrapper(self, handler)

    def __call__(self, ctx: JobContext, args: A) -> R:
        return self.handler(ctx, args)

    def __repr__(self) -> str:
        return f"<dygo job {self.kind!r}: {self.handler.__module__}.{self.handler.__qualname__}>"

    def request(self, args: A, **options: Unpack[EnqueueOptions]) -> JobRequest:
        """One job of this kind as `enqueue_many(conn, [...])` takes it, each with options of its own."""
        return JobRequest(self.kind, args, **options)

    def enqueue(self, conn: Connectable, args: A, **options: Unpack[EnqueueOptions]) -> Enqueued:
        """Enqueue one job of this kind (`dygo.enqueue`): through a psycopg connection, a Django connection, or a
        SQLAlchemy Session or Connection, inside its transaction when one is open."""
        return enqueue_kind(conn, self.kind, args, **options)

    async def aenqueue(self, conn: Connectable, args: A, **options: Unpack[EnqueueOptions]) -> Enqueued:
        """`enqueue` through a psycopg AsyncConnection, or a SQLAlchemy AsyncSession or AsyncConnection."""
        return await aenqueue_kind(conn, self.kind, args, **options)

    def enqueue_many(self, conn: Connectable, args: Iterable[A], **options: Unpack[EnqueueOptions]) -> list[Enqueued]:
        """One job of this kind per element of `args`, all-or-nothing (`dygo.enqueue_many`), each with `options`;
        results in the order of `args`. For options that differ per job, pass `request(...)`s to
        `dygo.enqueue_many`."""
        return enqueue_requests(conn, [JobRequest(self.kind, each, **options) for each in args])

    async def aenqueue_many(
        self, conn: Connectable, args: Iterable[A], **options: Unpack[EnqueueOptions]
    ) -> list[Enqueued]:
        """`enqueue_many` through an async connection or session."""
        return await aenqueue_requests(conn, [JobRequest(self.kind, each, **options) for each in args])
