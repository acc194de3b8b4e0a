"""Job kinds for child jobs (`ctx.call`, `ctx.map`; tests/test_steps_children.py). Every effect is a `test_runs`
row noted with its name (tests/jobs.py effect), so a test counts how often each part ran."""

from __future__ import annotations

import asyncio

from dygo.store import ChildFailed, JobContext, job

from tests.jobs import effect


@job("test.child_double", max_attempts=1)
async def child_double(ctx: JobContext, args: dict) -> int:
    await asyncio.to_thread(effect, ctx, "child")
    return int(args["x"]) * 2


@job("test.child_dies", max_attempts=1)
async def child_dies(ctx: JobContext, args: dict) -> None:
    raise RuntimeError(f"child {args.get('x')} breaks")


@job("test.child_maybe", max_attempts=1)
async def child_maybe(ctx: JobContext, args: dict) -> int:
    """Doubles `x`; dies when `x` is negative."""
    if args["x"] < 0:
        raise RuntimeError(f"negative {args['x']}")
    return int(args["x"]) * 2


@job("test.parent_call", max_attempts=2, retry_backoff="50ms")
async def parent_call(ctx: JobContext, args: dict) -> list:
    """A step, a call of test.child_double (as a handler, not a name), another step."""
    before = await ctx.step("before", effect, ctx, "before")
    await asyncio.to_thread(effect, ctx, "run")
    doubled = await ctx.call("double", child_double, {"x": args.get("x", 21)}, **args.get("options", {}))
    after = await ctx.step("after", effect, ctx, "after")
    return [before, doubled, after]


@job("test.parent_call_sync", max_attempts=2)
def parent_call_sync(ctx: JobContext, args: dict) -> list:
    before = ctx.step_sync("before", effect, ctx, "before")
    doubled = ctx.call_sync("double", "test.child_double", {"x": 5})
    tripled = ctx.map_sync("many", "test.child_double", [{"x": 1}, {"x": 2}])
    return [before, doubled, tripled]


@job("test.parent_map", max_attempts=2)
async def parent_map(ctx: JobContext, args: dict) -> dict:
    """Maps test.child_maybe over `xs`; returns the results (or, when a child failed, what ChildFailed says)."""
    await asyncio.to_thread(effect, ctx, "run")
    try:
        results = await ctx.map("items", "test.child_maybe", [{"x": x} for x in args["xs"]], **args.get("options", {}))
    except ChildFailed as failed:
        return {"failed": failed.failures, "results": failed.results, "message": str(failed)}
    empty = await ctx.map("none", "test.child_maybe", [])
    return {"results": results if args.get("all", True) else len(results), "empty": empty}


@job("test.parent_catches", max_attempts=1)
async def parent_catches(ctx: JobContext, args: dict) -> dict:
    """Calls a child that dies (or, with `delay`, one that waits that long to start) and catches ChildFailed."""
    options = {"delay": args["delay"]} if "delay" in args else {}
    try:
        await ctx.call("risky", "test.child_dies", {"x": 1}, **options)
    except ChildFailed as failed:
        return {"key": failed.key, "failed": failed.failures, "results": failed.results, "message": str(failed)}
    return {"caught": False}


@job("test.parent_uncaught", max_attempts=1)
async def parent_uncaught(ctx: JobContext, args: dict) -> None:
    await ctx.call("risky", "test.child_dies", {"x": 1})


@job("test.parent_bad_child", max_attempts=1)
async def parent_bad_child(ctx: JobContext, args: dict) -> None:
    await ctx.map("bad", "test.child_double", [{"x": 1}, {"x": 2}], queue="no-such-queue")


@job("test.parent_holds_first_run", max_attempts=3)
async def parent_holds_first_run(ctx: JobContext, args: dict) -> int:
    """A call whose run is noted ('run') before it suspends; the first run then waits 1.5 s, so a test can
    block its settle and kill its worker."""
    if await asyncio.to_thread(effect, ctx, "run") == 1:
        await asyncio.sleep(1.5)
    return await ctx.call("double", "test.child_double", {"x": 4})


@job("test.parent_nested", max_attempts=1)
async def parent_nested(ctx: JobContext, args: dict) -> list:
    """A call of a job that itself calls test.child_double: a grandchild."""
    await asyncio.to_thread(effect, ctx, "run")
    return await ctx.call("middle", "test.child_calls", {"x": args["x"]})


@job("test.child_calls", max_attempts=1)
async def child_calls(ctx: JobContext, args: dict) -> list:
    doubled = await ctx.call("inner", child_double, {"x": args["x"]})
    return [ctx.id, doubled]


@job("test.child_slow", max_attempts=3)
async def child_slow(ctx: JobContext, args: dict) -> int:
    """Notes its run, then takes `seconds` (a test kills its worker meanwhile)."""
    await asyncio.to_thread(effect, ctx, "child")
    await asyncio.sleep(args["seconds"])
    return int(args["x"])


@job("test.parent_map_slow", max_attempts=1)
async def parent_map_slow(ctx: JobContext, args: dict) -> list:
    await asyncio.to_thread(effect, ctx, "run")
    return await ctx.map("slow", child_slow, [{"x": x, "seconds": args["seconds"]} for x in range(args["n"])])
