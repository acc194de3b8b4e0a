"""What the worker's services share: the shape of a service, and the waits and backoff of their loops.

A service is one long-lived loop with the state it owns (producer, settler, lease keeper, maintainer,
scheduler, listener, progress writer, timings writer). `Worker` (worker/runtime.py) starts each in a
task named after it, watches them all, and stops them in one order.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
from typing import Protocol

from dygo.worker.deadlines import within


class Service(Protocol):
    name: str  # the task's name, and the name a log line gives it when it dies

    async def run(self) -> None:
        """The service's loop. It hands its database and OS errors to `WorkerConnections.failed`: an outage is
        logged and retried; any other error ends the loop, and the worker stops on it (worker/runtime.py)."""


async def wait_for_event(event: asyncio.Event, timeout: float | None) -> None:
    """Sleep until `event` is set or `timeout` seconds pass, whichever is first."""
    # Not asyncio.wait_for: on Python 3.11 it swallows a cancel that arrives as the event is set, and a loop
    # cancelled at shutdown must stop at once. `within` keeps asyncio.timeout's cancel accounting, in the
    # waiting task itself, at the cost the producer's idle waits need (worker/deadlines.py).
    if timeout is None or math.isinf(timeout):
        await event.wait()
        return
    with contextlib.suppress(TimeoutError):
        await within(event.wait(), timeout)


def failure_backoff(failures: int) -> float:
    """Backoff after consecutive database failures of a loop: 1 s, 2 s, 4 s ... at most 30 s."""
    return min(30.0, 0.5 * 2.0**failures)
