"""Handler timeouts for every running job of a worker, on one timer per timeout length.

`within` (worker/service.py) gives each call a timer of its own: loop.call_at, cancelled when the call ends
first. At thousands of jobs a second that was ~5 us of a no-op job's cost: the loop keeps its timers in a
heap ordered by Python-level comparisons and sweeps the cancelled ones out (issue 12, item 7). Jobs with
the same timeout reach their deadlines in the order they started, so each timeout length keeps its running
calls in start order and one timer, for the first of them. When it fires, the calls past their deadline are
cancelled with TimeoutError, exactly as `within` does it (service.Timed), and the timer moves on to the first
still running.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import Any

from dygo.worker.service import Timed


class Deadlines:
    def __init__(self) -> None:
        # Timeout length -> its calls still running, in start order (a dict: one leaves from anywhere in O(1)).
        self.lines: dict[float, dict[Timed, None]] = {}
        self.timers: dict[float, asyncio.TimerHandle] = {}  # timeout length -> its timer, while it has one

    async def within(self, call: Awaitable[Any], seconds: float) -> Any:
        """`await call`, cancelled with TimeoutError after `seconds` (service.within's behaviour)."""
        task = asyncio.current_task()
        assert task is not None
        loop = task.get_loop()
        timed = Timed(task, loop.time() + seconds)
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
