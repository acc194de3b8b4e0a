"""A handler's timeout (worker/executor.py `within`): asyncio.timeout's behaviour at less cost per job.

The worker's own tests run a hanging handler to its timeout through a real worker (test_worker.py); these
pin the cases a worker rarely shows: a cancel from outside during a timeout, and a handler that swallows it.
"""

from __future__ import annotations

import asyncio

import pytest
from dygo.worker.executor import within


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
