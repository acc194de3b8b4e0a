"""Timeouts for the worker's hot paths: asyncio.timeout's cancel accounting, armed more cheaply.

`asyncio.timeout` is an async context manager whose enter and exit are awaited objects of their own; here a
call under a timeout is one coroutine frame, and a handler's timeout shares one loop timer with every running
call of the same length. bench/timeouts.py measures both against asyncio.timeout per job; they stay only while
it shows them paying a real share of a job's cost (bench/README.md, "Timeouts").

The accounting is asyncio.timeout's, and tests/test_job_timeouts.py proves each case against it: a call past
its deadline is cancelled and raises TimeoutError; a cancel from outside (a shutdown's drain) stays a
CancelledError, even one that lands together with the timeout's own; nested timeouts each answer for their
own deadline; and the task's cancel count is left as the call found it.

* `within(call, seconds)`: one loop timer for the call, cancelled when it ends (the services' waits, whose
  lengths all differ).
* `Deadlines.within(call, seconds)`: a handler's timeout. Calls of one length reach their deadlines in the
  order they started, so each length keeps its running calls in start order and one timer, for the first of
  them. When it fires, the calls past their deadline are cancelled, and the timer moves on to the first still
  running. A call that ends leaves its timer armed; the timer finds nothing due then, and moves on.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import Any


class _Timed:
    """One call under a timeout, as asyncio.timeout keeps it: whether its own cancel fired, and the task's cancel
    count when the call began, so that a cancel from outside stays a cancel."""

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
    """`await call`, cancelled with TimeoutError after `seconds`, as under `asyncio.timeout(seconds)`."""
    task = asyncio.current_task()
    assert task is not None
    loop = task.get_loop()
    timed = _Timed(task, loop.time() + seconds)
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


class Deadlines:
    """The handlers' timeouts of one worker (one event loop), on one timer per timeout length."""

    def __init__(self) -> None:
        # Timeout length -> its calls still running, in start order (a dict: one leaves from anywhere in O(1)).
        self.lines: dict[float, dict[_Timed, None]] = {}
        self.timers: dict[float, asyncio.TimerHandle] = {}  # timeout length -> its timer, while it has one

    async def within(self, call: Awaitable[Any], seconds: float) -> Any:
        """`await call`, cancelled with TimeoutError after `seconds`, as under `asyncio.timeout(seconds)`."""
        task = asyncio.current_task()
        assert task is not None
        loop = task.get_loop()
        timed = _Timed(task, loop.time() + seconds)
        line = self.lines.get(seconds)
        if line is None:
            line = self.lines[seconds] = {}
        line[timed] = None
        if seconds not in self.timers:
            self.timers[seconds] = loop.call_at(timed.deadline, self._expire, seconds, loop)
        try:
            return await call
        except asyncio.CancelledError as exc:
            if timed.timed_out():
                raise TimeoutError from exc
            raise
        finally:
            line.pop(timed, None)  # gone already if it expired
            timed.ended()

    def _expire(self, seconds: float, loop: asyncio.AbstractEventLoop) -> None:
        """The timer of one timeout length: cancel its calls past their deadline, then wait for the next."""
        line = self.lines[seconds]
        now = loop.time()
        due = []
        for timed in line:
            if timed.deadline > now:
                break
            due.append(timed)
        for timed in due:
            del line[timed]
            timed.expire()
        if line:
            self.timers[seconds] = loop.call_at(next(iter(line)).deadline, self._expire, seconds, loop)
        else:
            del self.timers[seconds]
