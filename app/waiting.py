"""`GET /api/v1/jobs/{id}?wait=`: requests waiting for a job to finish, woken by LISTEN/NOTIFY.

Serve's one LISTEN connection (app/listening.py) fans the `dygo_finished` notifications out to the
waiting requests (a future per request, keyed by job id), so a thousand waiting clients cost one
connection and no polling. The trigger notifies only the jobs somebody registered for
(store.results.aregister, migration 0013): a request reads its job, and when it is not final registers a
row for the length of its wait, in a transaction that reads the job again after the registration's lock,
so a settle either shows in that read or notifies; the request deletes its row when it answers. A bulk
delete's empty payload wakes every waiter of the process to re-read its job once
(store.results.notify_recheck). A request subscribes its future before it reads the job, so a
notification that arrives in between is not lost. When the LISTEN connection drops, every waiter
re-reads its job and the connection is re-established with backoff; on reconnect every waiter re-reads
again, which covers anything that finished while nobody listened.

`GET /api/v1/workflows/{id}?wait=` waits the same way for a workflow to end: its waiter registers as the
job id minus the workflow's id (store.workflows.waiter_key), which the workflow's end notifies.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from typing import Any

import psycopg
from dygo.store import job_reads, results, workflows
from dygo.store.errors import NotFound

# Where a waiting request gets a connection for each read: the hot pool's `connection`, taken only
# while it reads, so a waiting request holds none.
Connections = Callable[[], AbstractAsyncContextManager[psycopg.AsyncConnection]]


class ResultWaiters:
    """A subscriber of ServeListener (app/listening.py) on the `dygo_finished` channel."""

    channels = (results.CHANNEL,)

    def __init__(self, poll: float | None = None) -> None:
        # Set when notifications cannot be relied on (LISTEN through a transaction pooler): each waiter
        # re-reads its job this often.
        self.poll = poll
        self.waiting: dict[int, set[asyncio.Future[None]]] = {}

    async def wait(self, job_id: int, seconds: float, connection: Connections) -> dict[str, Any] | None:
        """The job once it is final, or as it is when `seconds` run out; None if it does not exist."""
        return await self._wait(_JobWatch(job_id), seconds, connection)

    async def wait_for_workflow(
        self, workflow_id: int, seconds: float, connection: Connections
    ) -> dict[str, Any] | None:
        """The workflow (store.workflows.aget_workflow) once it is succeeded, failed or cancelled, or as it is
        when `seconds` run out; None if it does not exist."""
        return await self._wait(_WorkflowWatch(workflow_id), seconds, connection)

    async def _wait(self, watch: _Watch, seconds: float, connection: Connections) -> dict[str, Any] | None:
        deadline = time.monotonic() + seconds
        waiter: int | None = None
        key = watch.key
        try:
            while True:
                woken = asyncio.get_running_loop().create_future()
                self.waiting.setdefault(key, set()).add(woken)
                try:
                    async with connection() as conn:
                        found = await watch.read(conn)
                        # Polling (no notifications through a transaction pooler): nobody to notify.
                        if waiter is None and self.poll is None and watch.waits_on(found):
                            waiter, found = await watch.register(conn, deadline - time.monotonic())
                    remaining = deadline - time.monotonic()
                    if not watch.waits_on(found) or remaining <= 0:
                        return found
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(woken, remaining if self.poll is None else min(remaining, self.poll))
                finally:
                    self._forget(key, woken)
        finally:
            if waiter is not None:
                # Best effort: a row left behind (database gone meanwhile) expires and the maintainer
                # deletes it; the answer must not fail for it.
                with contextlib.suppress(Exception):
                    async with connection() as conn:
                        await results.aunregister(conn, waiter)

    async def listening(self, conn: psycopg.AsyncConnection) -> None:
        await results.alisten(conn)
        self._wake_all()  # re-read: a job may have finished while nobody listened

    def notified(self, channel: str, payload: str) -> None:
        if results.recheck_all(payload):
            self._wake_all()  # a bulk delete: each waiter re-reads once (404 if gone)
            return
        for job_id in results.finished_ids(payload):
            self._wake(job_id)

    def deaf(self) -> None:
        self._wake_all()  # each waiter re-reads now, and again when serve listens again

    def _forget(self, job_id: int, woken: asyncio.Future[None]) -> None:
        futures = self.waiting.get(job_id)
        if futures is not None:
            futures.discard(woken)
            if not futures:
                del self.waiting[job_id]

    def _wake(self, job_id: int) -> None:
        for woken in self.waiting.get(job_id, ()):
            if not woken.done():
                woken.set_result(None)

    def _wake_all(self) -> None:
        for job_id in list(self.waiting):
            self._wake(job_id)


class _Watch(ABC):
    """What a wait is for: its key in `waiting` (the id its notification carries), how to read it, and
    the states that end the wait."""

    def __init__(self, key: int, final: frozenset[str]) -> None:
        self.key, self.final = key, final

    @abstractmethod
    async def read(self, conn: psycopg.AsyncConnection) -> dict[str, Any] | None:
        """The job or workflow as it is now; None if it does not exist."""

    @abstractmethod
    async def register(self, conn: psycopg.AsyncConnection, seconds: float) -> tuple[int, dict[str, Any] | None]:
        """Register the waiter's row, then what a read after it finds."""

    def waits_on(self, found: dict[str, Any] | None) -> bool:
        return found is not None and found["state"] not in self.final


class _JobWatch(_Watch):
    def __init__(self, job_id: int) -> None:
        super().__init__(job_id, results.FINAL_STATES)

    async def read(self, conn: psycopg.AsyncConnection) -> dict[str, Any] | None:
        return await job_reads.aget_job(conn, self.key)

    async def register(self, conn: psycopg.AsyncConnection, seconds: float) -> tuple[int, dict[str, Any] | None]:
        return await results.aregister(conn, self.key, seconds)  # the job read in the registration's transaction


class _WorkflowWatch(_Watch):
    def __init__(self, workflow_id: int) -> None:
        super().__init__(workflows.waiter_key(workflow_id), workflows.FINAL_WORKFLOW_STATES)
        self.workflow_id = workflow_id

    async def read(self, conn: psycopg.AsyncConnection) -> dict[str, Any] | None:
        try:
            return await workflows.aget_workflow(conn, self.workflow_id)
        except NotFound:
            return None

    async def register(self, conn: psycopg.AsyncConnection, seconds: float) -> tuple[int, dict[str, Any] | None]:
        waiter = await workflows.aregister_waiter(conn, self.workflow_id, seconds)
        return waiter, await self.read(conn)
