"""A handler's timeout and the services' timed waits (worker/service.py `within`): asyncio.timeout's
behaviour at less cost per job.

The worker's own tests run a hanging handler to its timeout through a real worker (test_worker.py); these
pin the cases a worker rarely shows: a cancel from outside during a timeout, and a handler that swallows it.
"""

from __future__ import annotations

import asyncio
import time

import pytest
from dygo.worker.service import wait_for_event, within


def test_a_handler_past_its_timeout_is_cancelled_with_timeout_error_and_its_task_is_left_uncancelled():
    async def go() -> int:
        with pytest.raises(TimeoutError):
            await within(asyncio.sleep(10), 0.05)
        return asyncio.current_task().cancelling()

    assert asyncio.run(go()) == 0


def test_a_handler_done_in_time_returns_its_result():
    async def handler() -> str:
        await asyncio.sleep(0.01)
        return "done"

    async def go() -> str:
        return await within(handler(), 5)

    assert asyncio.run(go()) == "done"


def test_a_cancel_from_outside_stays_a_cancel_and_is_not_taken_for_the_timeout():
    started = asyncio.Event()

    async def run() -> None:
        started.set()
        await within(asyncio.sleep(10), 5)

    async def go() -> None:
        task = asyncio.create_task(run())
        await started.wait()
        await asyncio.sleep(0.01)
        task.cancel()  # the drain at shutdown cancels a running handler like this
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(go())


def test_a_cancel_from_outside_racing_the_timeout_stays_a_cancel():
    async def run() -> None:
        task = asyncio.current_task()
        asyncio.get_running_loop().call_later(0.05, task.cancel)  # lands with the timeout's own cancel
        await within(asyncio.sleep(10), 0.05)

    async def go() -> None:
        task = asyncio.create_task(run())
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(go())


def test_a_wait_for_an_event_ends_when_it_is_set_or_when_its_time_is_up():
    async def go() -> tuple[bool, bool, float]:
        event = asyncio.Event()
        asyncio.get_running_loop().call_later(0.02, event.set)
        await wait_for_event(event, 5)
        started = time.monotonic()
        await wait_for_event(asyncio.Event(), 0.05)
        return event.is_set(), asyncio.current_task().cancelling() == 0, time.monotonic() - started

    is_set, uncancelled, waited = asyncio.run(go())
    assert is_set and uncancelled and 0.04 <= waited < 1


def test_a_handler_that_swallows_the_timeout_returns_and_its_task_is_left_uncancelled():
    async def stubborn() -> str:
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            return "ignored the cancel"
        return "slept"

    async def go() -> tuple[str, int]:
        result = await within(stubborn(), 0.05)
        return result, asyncio.current_task().cancelling()

    assert asyncio.run(go()) == ("ignored the cancel", 0)
