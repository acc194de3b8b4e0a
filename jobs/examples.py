"""Example jobs that show each outcome. Enqueue them from the README's curl lines."""

from __future__ import annotations

import asyncio
import math
import time

from pydantic import BaseModel, Field

from dygo import Abort, EventTimeout, JobContext, job


@job("example.noop")
async def noop(ctx: JobContext, args: dict) -> None:
    """Does nothing; the benchmark's job."""


class Sleep(BaseModel):
    seconds: float = Field(1.0, ge=0, le=3600)


@job("example.sleep", queue="slow", timeout="10m")
async def sleep(ctx: JobContext, args: Sleep) -> dict:
    """Sleeps, reporting its progress every second, so the API and the dashboard have some to show."""
    end = time.monotonic() + args.seconds
    while (left := end - time.monotonic()) > 0:
        ctx.progress(1 - left / args.seconds, f"{math.ceil(left)}s to go")
        await asyncio.sleep(min(left, 1.0))
    ctx.progress(1.0, "done")  # a run's last report is stored when it settles
    return {"slept": args.seconds}


class Flaky(BaseModel):
    failures: int = Field(2, ge=0, description="fail this many attempts, then succeed")


@job("example.flaky", max_attempts=5, retry_backoff="1s")
def flaky(ctx: JobContext, args: Flaky) -> dict:
    """A sync handler (runs in a thread) that fails its first `failures` attempts."""
    if ctx.attempt <= args.failures:
        raise RuntimeError(f"attempt {ctx.attempt} fails on purpose ({args.failures} failures asked for)")
    time.sleep(0.01)
    return {"succeeded_on_attempt": ctx.attempt}


class Refuse(BaseModel):
    reason: str = "this job cannot succeed"


@job("example.abort")
async def refuse(ctx: JobContext, args: Refuse) -> None:
    raise Abort(args.reason)


@job("example.summary")
async def summary(ctx: JobContext, args: dict) -> dict:
    """A workflow's last step: how each node before it ended, and what it gave (try it after a map of
    example.flaky jobs: see docs/guides/workflows.md)."""
    return {
        name: {"state": dep.state, "result": dep.result, "counts": dict(dep.counts)} for name, dep in ctx.deps.items()
    }


class Checkout(BaseModel):
    fail_at_ship: int = Field(1, ge=0, description="fail this many attempts at the last step, then succeed")
    cool_off: float = Field(2.0, ge=0, le=3600, description="seconds of ctx.sleep between reserve and ship")


@job("example.checkout", max_attempts=5, retry_backoff="1s")
async def checkout(ctx: JobContext, args: Checkout) -> dict:
    """Durable steps: the charge runs once across every attempt, the sleep holds no slot, and a failure at
    the last step retries only that step (see its steps: GET /api/v1/jobs/{id}/steps)."""
    charge = await ctx.step("charge", lambda: {"charge": f"ch_{ctx.id}", "at_attempt": ctx.attempt})
    await ctx.sleep("cool-off", args.cool_off)
    if ctx.attempt <= args.fail_at_ship:
        raise RuntimeError(f"the carrier is down (attempt {ctx.attempt})")
    label = await ctx.step("ship", lambda: {"label": f"lbl_{ctx.id}"})
    return {**charge, **label}


class Approval(BaseModel):
    order: str = Field("42", pattern=r"^[A-Za-z0-9_-]{1,40}$", description="waits for the event approval:<order>")
    timeout: float = Field(3600, gt=0, le=7 * 86400, description="seconds to wait for it")


@job("example.approval", max_attempts=3, retry_backoff="1s")
async def approval(ctx: JobContext, args: Approval) -> dict:
    """A durable wait, then child jobs: waits, holding no slot, for the event approval:<order> (emit it with
    `dygo events emit approval:42 --payload '{"approved": true}'` or POST /api/v1/events/approval:42), then
    runs one example.checkout per parcel as child jobs and returns their results."""
    try:
        decision = await ctx.wait_for_event("approval", key=f"approval:{args.order}", timeout=args.timeout)
    except EventTimeout:
        return {"order": args.order, "approved": False, "why": f"no decision within {args.timeout:g}s"}
    if not (isinstance(decision, dict) and decision.get("approved")):
        return {"order": args.order, "approved": False, "decision": decision}
    parcels = await ctx.map("parcels", "example.checkout", [{"fail_at_ship": 0, "cool_off": 0}] * 2)
    return {"order": args.order, "approved": True, "parcels": parcels}
