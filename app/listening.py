"""The one LISTEN connection of a `dygo serve` process, shared by everything that wants notifications.

Subscribers (the result waiters of app/waiting.py, the failed-token throttle of app/throttle.py) each
name their channels and get three calls: `listening(conn)` once the connection is up, on every
(re)connect, to subscribe and catch up on what they may have missed; `notified(channel, payload)` for
each notification on one of their channels; `deaf()` when the connection is lost, so that each can fall
back to what is safe without notifications until `listening` is called again. The connection is
re-established with backoff; a lost one is logged once in serve's outage log like any other. A database
error that is not an outage (store/outage.py) is logged as an error naming it, at each attempt, with a
longer backoff: serve goes on answering requests without notifications meanwhile.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Protocol

import psycopg
from dygo.store.db import connect_kwargs, notifications
from dygo.store.outage import OutageLog, describe, is_outage

log = logging.getLogger("dygo.serve")

# Named for pg_stat_activity, like the worker's `dygo-worker-listen <id>`.
LISTEN_APPLICATION_NAME = "dygo-serve-listen"
LISTEN_RETRY_MAX = 5.0
FAILED_RETRY = 60.0  # after an error that is not an outage: the next attempt most likely meets it again


class Subscriber(Protocol):
    channels: tuple[str, ...]

    async def listening(self, conn: psycopg.AsyncConnection) -> None:
        """Subscribe `conn` (autocommit) to the channels, and catch up; on every (re)connect."""

    def notified(self, channel: str, payload: str) -> None: ...

    def deaf(self) -> None:
        """The connection is lost: notifications may be missed until the next `listening`."""


class ServeListener:
    """The process's one LISTEN connection, routing each notification to the subscriber of its channel."""

    def __init__(self, database_url: str, outage: OutageLog, subscribers: list[Subscriber]) -> None:
        self.database_url = database_url
        self.outage = outage
        self.subscribers = subscribers
        self.task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self.task = asyncio.create_task(self._listen(), name="dygo-serve-listen")

    async def stop(self) -> None:
        if self.task is not None:
            self.task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.task
        for subscriber in self.subscribers:
            subscriber.deaf()

    async def _listen(self) -> None:
        routes = {channel: subscriber for subscriber in self.subscribers for channel in subscriber.channels}
        delay = 0.5
        while True:
            try:
                conn = await psycopg.AsyncConnection.connect(
                    self.database_url, autocommit=True, application_name=LISTEN_APPLICATION_NAME, **connect_kwargs()
                )
                async with conn:
                    for subscriber in self.subscribers:
                        await subscriber.listening(conn)
                    delay = 0.5
                    self.outage.back()
                    async for notify in notifications(conn):
                        routed = routes.get(notify.channel)
                        if routed is not None:
                            routed.notified(notify.channel, notify.payload)
            except (psycopg.Error, OSError) as exc:
                fallback = "waiting requests re-read their job, bearer tokens are checked in the failed-token table"
                for subscriber in self.subscribers:
                    subscriber.deaf()
                if not is_outage(exc):
                    log.error(
                        "result LISTEN connection failed (%s); %s; retrying in %gs",
                        describe(exc),
                        fallback,
                        FAILED_RETRY,
                    )
                    await asyncio.sleep(FAILED_RETRY)
                    continue
                self.outage.lost(f"result LISTEN connection; {fallback}", exc)
                await asyncio.sleep(delay)
                # Capped low, like the worker's LISTEN: a job that finishes before the reconnect is only
                # seen at its waiter's deadline.
                delay = min(delay * 2, LISTEN_RETRY_MAX)
