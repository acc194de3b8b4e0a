"""What the worker's services share: the shape of a service, and the waits and backoff of their loops.

A service is one long-lived loop with the state it owns (producer, settler, lease keeper, maintainer,
scheduler, listener, progress writer, timings writer). `Worker` (worker/runtime.py) starts each in a
task named after it, watches them all, and stops them in one order.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections.abc import Awaitable
from typing import Any, Protocol


class Service(Protocol):
    name: str  # the task's name, and the name a log line gives it when it dies

    async def run(self) -> None:
        """The service's loop. It hands its database and OS errors to `Database.failed`: an outage is logged and
        retried; any other error ends the loop, and the worker stops on it (worker/runtime.py)."""


async def wait_for_event(event: asyncio.Event, timeout: float | None) -> None:
    """Sleep until `event` is set or `timeout` seconds pass, whichever is first."""
    # Not asyncio.wait_for: on Python 3.11 it swallows a cancel that arrives as the event is set,
    # so a loop cancelled at shutdown went on for another poll interval (seen as a hung SIGTERM);
    # nor does `within` (asyncio.timeout's checks) wrap the wait in a task of its own. The producer waits
    # here after most jobs' ends: asyncio.timeout's context manager cost it ~6 us each time.
    if timeout is None or math.isinf(timeout):
        await event.wait()
        return
    with contextlib.suppress(TimeoutError):
        await within(event.wait(), timeout)


class Timed:
    """One call under a timeout, as asyncio.timeout keeps it: whether its own cancel fired, and the task's cancel
    count when the call began, so a cancel from outside stays a cancel (`within`, worker/deadlines.py)."""

    __slots__ = ("task", "deadline", "expired", "cancelling")

    def __init__(self, task: asyncio.Task[Any], deadline: float) -> None:
        self.task = task
        self.deadline = deadline  # loop time
        self.expired = False  # its deadline passed and its task was cancelled for it
        self.cancelling = task.cancelling()

    def expire(self) -> None:
        self.expired = True
        self.task.cancel()

    def timed_out(self) -> bool:
        """On a CancelledError during the call: whether it is this timeout's own (then raise TimeoutError)."""
        if not self.expired:
            return False
        self.expired = False
        return self.task.uncancel() <= self.cancelling

    def ended(self) -> None:
        """When the call ends, however: a cancel it swallowed after expiring is undone, as asyncio.timeout does."""
        if self.expired:
            self.task.uncancel()


async def within(call: Awaitable[Any], seconds: float) -> Any:
    """`await call`, cancelled with TimeoutError after `seconds`, as `asyncio.timeout` does it (Timed), without
    its context manager's objects and awaits: those were a sixth of a no-op job's cost in the worker (issue 12,
    item 7)."""
    task = asyncio.current_task()
    assert task is not None
    loop = task.get_loop()
    timed = Timed(task, loop.time() + seconds)
    handle = loop.call_at(timed.deadline, timed.expire)
    try:
        return await call
    except asyncio.CancelledError as exc:
        if timed.timed_out():
            raise TimeoutError from exc
        raise
    finally:
        handle.cancel()
        timed.ended()


def failure_backoff(failures: int) -> float:
    """Backoff after consecutive database failures of a loop: 1 s, 2 s, 4 s ... at most 30 s."""
    return min(30.0, 0.5 * 2**failures)
