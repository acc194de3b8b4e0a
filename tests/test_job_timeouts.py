"""A handler's timeout (worker/deadlines.py, one timer per timeout length) and the services' timed waits
(worker/service.py `within`, one timer per wait): asyncio.timeout's behaviour at less cost per job.

The worker's own tests run a hanging handler to its timeout through a real worker (test_worker.py); these
pin the cases a worker rarely shows: a cancel from outside during a timeout, and a handler that swallows it.
"""

from __future__ import annotations

import asyncio
import time

import pytest
from dygo.worker.deadlines import Deadlines
from dygo.worker.service import wait_for_event, within


@pytest.fixture(params=["within", "deadlines"])
def timed(request):
    """`await timed(call, seconds)`: service.within, or a worker's Deadlines (one per test, as one per worker)."""
    return within if request.param == "within" else Deadlines().within


def test_a_handler_past_its_timeout_is_cancelled_with_timeout_error_and_its_task_is_left_uncancelled(timed):
    async def go() -> int:
        with pytest.raises(TimeoutError):
            await timed(asyncio.sleep(10), 0.05)
        return asyncio.current_task().cancelling()

    assert asyncio.run(go()) == 0


def test_a_handler_done_in_time_returns_its_result(timed):
    async def handler() -> str:
        await asyncio.sleep(0.01)
        return "done"

    async def go() -> str:
        return await timed(handler(), 5)

    assert asyncio.run(go()) == "done"


def test_a_cancel_from_outside_stays_a_cancel_and_is_not_taken_for_the_timeout(timed):
    started = asyncio.Event()

    async def run() -> None:
        started.set()
        await timed(asyncio.sleep(10), 5)

    async def go() -> None:
        task = asyncio.create_task(run())
        await started.wait()
        await asyncio.sleep(0.01)
        task.cancel()  # the drain at shutdown cancels a running handler like this
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(go())


def test_a_cancel_from_outside_racing_the_timeout_stays_a_cancel(timed):
    async def run() -> None:
        task = asyncio.current_task()
        asyncio.get_running_loop().call_later(0.05, task.cancel)  # lands with the timeout's own cancel
        await timed(asyncio.sleep(10), 0.05)

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


def test_a_handler_that_swallows_the_timeout_returns_and_its_task_is_left_uncancelled(timed):
    async def stubborn() -> str:
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            return "ignored the cancel"
        return "slept"

    async def go() -> tuple[str, int]:
        result = await timed(stubborn(), 0.05)
        return result, asyncio.current_task().cancelling()

    assert asyncio.run(go()) == ("ignored the cancel", 0)


def test_calls_of_one_timeout_length_expire_in_start_order_and_a_shorter_one_started_later_first():
    async def go() -> tuple[list[str], dict, dict]:
        deadlines = Deadlines()
        expired: list[str] = []

        async def run(name: str, seconds: float, sleep: float) -> None:
            try:
                await deadlines.within(asyncio.sleep(sleep), seconds)
            except TimeoutError:
                expired.append(name)

        tasks = [asyncio.create_task(run("a", 0.10, 10))]
        await asyncio.sleep(0.02)
        tasks.append(asyncio.create_task(run("quick", 0.10, 0)))  # ends in time: leaves nothing behind
        tasks.append(asyncio.create_task(run("b", 0.10, 10)))
        tasks.append(asyncio.create_task(run("short", 0.03, 10)))
        await asyncio.gather(*tasks)
        return expired, deadlines.lines, deadlines.timers

    expired, lines, timers = asyncio.run(go())
    assert expired == ["short", "a", "b"]
    assert all(not line for line in lines.values()) and not timers


def test_a_timer_armed_for_a_call_that_ended_moves_on_to_the_next_one_running():
    async def go() -> tuple[float, bool]:
        deadlines = Deadlines()
        await deadlines.within(asyncio.sleep(0), 0.05)  # its timer stays armed for its deadline
        await asyncio.sleep(0.03)
        started = time.monotonic()
        with pytest.raises(TimeoutError):
            await deadlines.within(asyncio.sleep(10), 0.05)
        return time.monotonic() - started, asyncio.current_task().cancelling() == 0

    waited, uncancelled = asyncio.run(go())
    assert 0.045 <= waited < 1 and uncancelled
