"""worker/deadlines.py against asyncio.timeout: a handler's timeout (`Deadlines.within`, one timer per timeout
length) and the services' timed waits (`within`, one timer per wait) behave as asyncio.timeout does.

Each case runs under asyncio.timeout too and must give the same outcome, so the copy is held to the library,
not to a description of it. The worker's own tests run a hanging handler to its timeout through a real worker
(test_worker.py); these pin the cases a worker rarely shows: a cancel from outside during a timeout, one racing
it, a handler that swallows the cancel, nested timeouts and the task's cancel count.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from dygo.worker.deadlines import Deadlines, within
from dygo.worker.service import wait_for_event

Timed = Callable[[Awaitable[Any], float], Awaitable[Any]]


async def library(call: Awaitable[Any], seconds: float) -> Any:
    """The reference: the same call under asyncio.timeout."""
    async with asyncio.timeout(seconds):
        return await call


IMPLEMENTATIONS: dict[str, Callable[[], Timed]] = {
    "within": lambda: within,
    "deadlines": lambda: Deadlines().within,  # one per test, as one per worker
}


def outcome(scenario: Callable[[Timed], Awaitable[Any]], timed: Timed) -> Any:
    """What `scenario` gives under `timed`: its result, or the name of the exception it raised."""

    async def go() -> Any:
        try:
            return await scenario(timed)
        except BaseException as exc:  # noqa: BLE001 - the exception is the outcome compared
            return type(exc).__name__

    return asyncio.run(go())


def same_as_asyncio_timeout(scenario: Callable[[Timed], Awaitable[Any]], expected: Any) -> None:
    """`scenario` gives `expected` under asyncio.timeout, and the same under each copy."""
    assert outcome(scenario, library) == expected
    for name, make in IMPLEMENTATIONS.items():
        assert (name, outcome(scenario, make())) == (name, expected)


async def cancel_count_after(timed: Timed, call: Awaitable[Any], seconds: float) -> tuple[str, int]:
    task = asyncio.current_task()
    try:
        result = await timed(call, seconds)
    except TimeoutError:
        result = "TimeoutError"
    return result, task.cancelling()


def test_a_call_past_its_timeout_raises_timeout_error_and_leaves_its_task_uncancelled():
    async def scenario(timed: Timed) -> tuple[str, int]:
        return await cancel_count_after(timed, asyncio.sleep(10), 0.05)

    same_as_asyncio_timeout(scenario, ("TimeoutError", 0))


def test_a_call_done_in_time_returns_its_result():
    async def handler() -> str:
        await asyncio.sleep(0.01)
        return "done"

    async def scenario(timed: Timed) -> tuple[str, int]:
        return await cancel_count_after(timed, handler(), 5)

    same_as_asyncio_timeout(scenario, ("done", 0))


def test_a_cancel_from_outside_stays_a_cancel_and_is_not_taken_for_the_timeout():
    async def scenario(timed: Timed) -> str:
        started = asyncio.Event()

        async def run() -> None:
            started.set()
            await timed(asyncio.sleep(10), 5)

        task = asyncio.create_task(run())
        await started.wait()
        await asyncio.sleep(0.01)
        task.cancel()  # the drain at shutdown cancels a running handler like this
        try:
            await task
        except asyncio.CancelledError:
            return f"CancelledError, cancelling {task.cancelling()}"
        return "not cancelled"

    same_as_asyncio_timeout(scenario, "CancelledError, cancelling 1")


def test_a_cancel_from_outside_racing_the_timeout_stays_a_cancel():
    async def scenario(timed: Timed) -> str:
        async def run() -> None:
            task = asyncio.current_task()
            # Lands in the same pass of the loop as the timeout's own cancel.
            asyncio.get_running_loop().call_later(0.05, task.cancel)
            await timed(asyncio.sleep(10), 0.05)

        task = asyncio.create_task(run())
        try:
            await task
        except asyncio.CancelledError:
            return "CancelledError"
        except TimeoutError:
            return "TimeoutError"
        return "not cancelled"

    same_as_asyncio_timeout(scenario, "CancelledError")


def test_a_cancel_pending_before_the_call_is_not_taken_for_the_timeout():
    async def scenario(timed: Timed) -> tuple[str, int]:
        task = asyncio.current_task()
        task.cancel()  # delivered at the call's first suspension, before its deadline
        try:
            await timed(asyncio.sleep(10), 5)
        except asyncio.CancelledError:
            return "CancelledError", task.uncancel()
        return "not cancelled", task.cancelling()

    same_as_asyncio_timeout(scenario, ("CancelledError", 0))


def test_a_call_that_swallows_the_timeout_returns_and_leaves_its_task_uncancelled():
    async def stubborn() -> str:
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            return "ignored the cancel"
        return "slept"

    async def scenario(timed: Timed) -> tuple[str, int]:
        return await cancel_count_after(timed, stubborn(), 0.05)

    same_as_asyncio_timeout(scenario, ("ignored the cancel", 0))


def test_an_inner_timeout_that_fires_is_the_inner_ones_and_the_outer_goes_on():
    async def inner(timed: Timed) -> str:
        try:
            await timed(asyncio.sleep(10), 0.03)
        except TimeoutError:
            await asyncio.sleep(0.01)  # the outer timeout still governs what follows
            return "inner timed out"
        return "inner done"

    async def scenario(timed: Timed) -> tuple[str, int]:
        return await cancel_count_after(timed, inner(timed), 5)

    same_as_asyncio_timeout(scenario, ("inner timed out", 0))


def test_an_outer_timeout_that_fires_inside_an_inner_one_is_the_outer_ones():
    async def inner(timed: Timed) -> str:
        try:
            await timed(asyncio.sleep(10), 5)
        except TimeoutError:
            return "taken by the inner timeout"
        return "inner done"

    async def scenario(timed: Timed) -> tuple[str, int]:
        return await cancel_count_after(timed, inner(timed), 0.05)

    same_as_asyncio_timeout(scenario, ("TimeoutError", 0))


def test_a_handler_using_asyncio_timeout_inside_a_worker_timeout_gets_the_right_one():
    async def handler(inner_seconds: float) -> str:
        try:
            async with asyncio.timeout(inner_seconds):
                await asyncio.sleep(10)
        except TimeoutError:
            return "handler's own timeout"
        return "slept"

    async def scenario(timed: Timed) -> list[tuple[str, int]]:
        return [
            await cancel_count_after(timed, handler(0.03), 5),  # the handler's fires first
            await cancel_count_after(timed, handler(5), 0.03),  # the worker's fires first
        ]

    same_as_asyncio_timeout(scenario, [("handler's own timeout", 0), ("TimeoutError", 0)])


def test_a_timeout_inside_a_task_already_cancelled_once_restores_that_count():
    async def scenario(timed: Timed) -> tuple[str, int]:
        task = asyncio.current_task()
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):  # swallowed without uncancel(): the count stays 1
            await asyncio.sleep(0)
        return await cancel_count_after(timed, asyncio.sleep(10), 0.05)

    same_as_asyncio_timeout(scenario, ("TimeoutError", 1))


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


def test_a_wait_for_an_event_cancelled_at_shutdown_stops_at_once():
    async def go() -> str:
        event = asyncio.Event()
        waiter = asyncio.create_task(wait_for_event(event, 5))
        await asyncio.sleep(0.01)
        event.set()
        waiter.cancel()  # lands as the event is set: asyncio.wait_for on 3.11 would swallow it
        try:
            await waiter
        except asyncio.CancelledError:
            return "cancelled"
        return "returned"

    assert asyncio.run(go()) == "cancelled"


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
