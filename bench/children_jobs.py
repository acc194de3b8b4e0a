"""Job kinds for bench/children.py (`jobs: [children_jobs]`, bench/ on PYTHONPATH): parents that call or map a
no-op child job."""

from dygo import JobContext, job


@job("bench.child")
async def child(ctx: JobContext, args: dict) -> int:
    return int(args["i"])


@job("bench.parent_call")
async def parent_call(ctx: JobContext, args: dict) -> int:
    """One child job: the round trip of a suspend, the child's run and the resume."""
    result: int = await ctx.call("child", child, {"i": 1})
    return result


@job("bench.parent_map")
async def parent_map(ctx: JobContext, args: dict) -> int:
    """`n` child jobs in one map; returns how many results came back."""
    results = await ctx.map("fan", child, [{"i": i} for i in range(args["n"])])
    return len(results)
