"""The claim's one module (store/claim.py): every claim statement starts a job the same way and returns the
same columns, read by name, with the same meaning whether or not a cluster-wide limit concerns the claim."""

from __future__ import annotations

import asyncio
import re
import uuid
from datetime import UTC, datetime, timedelta

import psycopg
import pytest
from dygo.store import claim, enqueue, enqueue_many, limits
from dygo.store.claim import Claim, claim_jobs, claim_rows
from dygo.store.registry import Registry


def claim_now(url: str, slots: dict[str, int]) -> Claim:
    async def go() -> Claim:
        async with await psycopg.AsyncConnection.connect(url, autocommit=True) as aconn:
            return await claim_jobs(aconn, slots, "w1", 30)

    return asyncio.run(go())


def test_a_limited_claim_reports_its_jobs_and_queues_as_a_plain_claim_does(conn, db_url):
    ready = enqueue_many(conn, [{"kind": "test.noop", "meta": {"tenant": "a"}}] * 3)
    enqueue(conn, "test.noop", {}, delay="30s")
    limits.set_limit(conn, "kind", "test.noop", 2, None, None, ["default"])
    limits.forget_cache()
    began = datetime.now(UTC)

    first = claim_now(db_url, {"default": 5})  # the limit admits two: the third is held back, worth a claim at once
    assert first.under_limit and [job.id for job in first.jobs] == [job.id for job in ready[:2]]
    assert first.held_back == {"default": 0.0}
    second = claim_now(db_url, {"default": 5})  # the limit is full now: nothing, until a settle or the recheck
    assert second.jobs == [] and second.held_back == {"default": claim.CONCURRENCY_RECHECK}

    limits.set_limit(conn, "kind", "test.noop", None, None, None, ["default"])
    limits.forget_cache()
    plain = claim_now(db_url, {"default": 5})
    assert not plain.under_limit and [job.id for job in plain.jobs] == [ready[2].id] and plain.held_back == {}

    for got in (first, second, plain):  # the same trailing columns, the same meaning
        assert 28 < got.due_in["default"] <= 30  # the job due in 30 s
        assert got.clock is not None and began - timedelta(seconds=1) < got.clock < datetime.now(UTC)
    for got in (first, plain):
        last = got.jobs[-1]
        run_at, token = conn.execute("SELECT run_at, lease_token FROM dygo_jobs WHERE id = %s", (last.id,)).fetchone()
        assert got.last_run_at == {"default": run_at}  # an epoch number in both statements, made a datetime alike
        assert uuid.UUID(last.lease_token) == token
        assert (last.kind, last.queue, last.meta, last.attempt, last.max_attempts) == (
            "test.noop",
            "default",
            {"tenant": "a"},
            1,
            20,
        )
        assert 0 <= last.waited < 60


CLAIM_PARAMS = {
    "queues": ["default"],
    "slots": [1],
    **claim.walk_segments(["default"], {}),
    "full_kinds": [],
    "owner": "w1",
    "ttl": 30,
    "kind_attempts": "{}",
    "max_attempts": 20,
}


def test_a_claim_statement_whose_columns_drift_from_claim_row_is_refused_not_misread(conn):
    enqueue(conn, "test.noop", {})
    swapped = claim.CLAIM_JOBS.replace(
        "NULL::float8 AS due_in, NULL::float8 AS held_for", "NULL::float8 AS held_for, NULL::float8 AS due_in"
    )
    assert swapped != claim.CLAIM_JOBS
    with conn.transaction(force_rollback=True), pytest.raises(TypeError, match="not ClaimRow's"):
        conn.cursor(row_factory=claim_rows).execute(swapped, CLAIM_PARAMS)
    with conn.transaction(force_rollback=True):
        [row] = conn.cursor(row_factory=claim_rows).execute(claim.CLAIM_JOBS, CLAIM_PARAMS).fetchall()
    assert row.kind == "test.noop" and row.due_in is None and row.held_for is None and row.attempt == 1


def part(statement: str, pattern: str) -> str:
    found = re.search(pattern, statement, re.DOTALL)
    assert found, pattern
    return found.group(0)


@pytest.mark.parametrize("name", ["CLAIM_JOBS_CAPPED", "CLAIM_LIMITED", "CLAIM_QUEUE_LIMITED"])
def test_every_claim_statement_starts_a_job_as_claim_jobs_does_and_returns_its_columns(name):
    statement, plain = getattr(claim, name), claim.CLAIM_JOBS
    for pattern in (
        r"claimed AS \(\n\s+UPDATE.*?\n\)",  # the UPDATE that leases the kept rows
        r"CROSS JOIN LATERAL \(\n\s+SELECT min\(run_at\).*?\) AS n\n",  # a short queue's next scheduled job
        r"\nSELECT id, kind, .*?node_id,",  # the columns, up to a rate-limited job's start time (the limited claims')
        r"\nUNION ALL\nSELECT NULL, .*?FROM next_due\n",  # a short queue's row
    ):
        assert part(statement, pattern) == part(plain, pattern)


QUEUE_LIMITS = {
    "a full concurrency limit": {"concurrency_limit": 5},
    "a rate": {"rate_limit": "20/s"},
    "a rate with a burst": {"rate_limit": "20/s", "rate_burst": 3},
    "both": {"concurrency_limit": 6, "rate_limit": "50/s", "rate_burst": 4},
    "a limit never reached": {"concurrency_limit": 10_000, "rate_limit": "1000000/s"},
}


@pytest.mark.parametrize("changes", QUEUE_LIMITS.values(), ids=QUEUE_LIMITS.keys())
def test_a_queues_own_limit_claims_as_the_general_limited_claim_does(conn, changes):
    """CLAIM_QUEUE_LIMITED (a queue's own, unkeyed limits) takes the jobs CLAIM_LIMITED takes, with the same
    start times and the same word on when to claim again, for a queue claimed beside one without a limit."""
    enqueue_many(conn, [{"kind": "test.noop", "priority": i % 3} for i in range(12)])
    enqueue_many(conn, [{"kind": "test.noop", "queue": "other"}] * 3)
    another_workers = conn.execute(
        "UPDATE dygo_jobs SET state = 'active', lease_owner = 'w0' WHERE id IN "
        "(SELECT id FROM dygo_jobs WHERE queue = 'default' ORDER BY id LIMIT 3) RETURNING id"
    ).fetchall()
    limits.change_limit(conn, "queue", "default", changes, ["default"])
    [concerned] = [row for row in asyncio.run(current_limits(conn.info.dsn)) if row.name == "default"]
    wanted, free = {"default": 6, "other": 2}, {"default": 2, "other": 2}

    def claimed(general: bool) -> tuple[list[int], list[float | None], dict[str, float]]:
        statement, params = claim.limited_claim(wanted, free, "w1", 30, Registry(), [concerned], {}, {}, general)
        assert (statement is claim.CLAIM_LIMITED) == general
        with conn.transaction(force_rollback=True):
            rows = conn.cursor(row_factory=claim_rows).execute(statement, params).fetchall()
        jobs = [row for row in rows if row.id is not None]
        held = {row.queue: round(row.held_for, 2) for row in rows if row.held_for is not None}
        # Start times from the first: each statement's clock is its own (its transaction's start, then planned).
        first = min((row.start_in for row in jobs if row.start_in is not None), default=0.0)
        starts = [None if row.start_in is None else round(row.start_in - first, 3) for row in jobs]
        return [row.id for row in jobs], starts, held

    general = claimed(True)
    assert len(another_workers) == 3 and general[0]
    assert claimed(False) == general


async def current_limits(url: str) -> list[limits.LimitRow]:
    limits.forget_cache()
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as aconn:
        return await limits.current(aconn)


def test_a_rate_limit_hands_out_start_times_a_spacing_apart_and_a_burst_at_once(conn, db_url):
    enqueue_many(conn, [{"kind": "test.noop"}] * 12)
    limits.change_limit(conn, "kind", "test.noop", {"rate_limit": "20/s"}, ["default"])
    limits.forget_cache()
    spacing = (1.0 + limits.START_SLACK) / 20
    first = claim_now(db_url, {"default": 10})
    # The starts of the next RATE_HORIZON: the first at once, the next a spacing later; the rest held back until
    # their start times come within reach.
    waits = sorted(job.not_before - min(j.not_before for j in first.jobs) for job in first.jobs)
    assert len(waits) == 1 + int(claim.RATE_HORIZON / spacing)
    assert all(abs(b - a - spacing) < 0.005 for a, b in zip(waits, waits[1:], strict=False)), waits
    assert 0 < first.held_back["default"] <= claim.RATE_HORIZON
    limits.change_limit(conn, "kind", "test.noop", {"rate_burst": 4}, ["default"])
    conn.execute("DELETE FROM dygo_limit_pace")  # idle again
    limits.forget_cache()
    burst = claim_now(db_url, {"default": 10})
    waits = sorted(job.not_before - min(j.not_before for j in burst.jobs) for job in burst.jobs)
    assert waits[:4] == [waits[0]] * 4 and abs(waits[4] - waits[0] - spacing) < 0.005, waits


def test_a_walk_start_holds_within_the_priorities_met_and_the_others_are_walked_from_their_head():
    at = datetime(2026, 1, 1, tzinfo=UTC)
    segments = claim.walk_segments(["default", "other"], {"default": claim.WalkStart(at, frozenset({5, 0}))})
    top, bottom = claim.TOP_PRIORITY, claim.BOTTOM_PRIORITY
    at_text = f'"{at}"'
    assert segments == {
        "walk_queues": '{"default","default","default","default","default","other"}',
        "walk_tops": f'{{"{top}","5","4","0","-1","{top}"}}',
        "walk_bottoms": f'{{"6","5","1","0","{bottom}","{bottom}"}}',
        "walk_since": f"{{NULL,{at_text},NULL,{at_text},NULL,NULL}}",
    }
    # A server with a skip scan seeks the run_at within each priority itself: one segment.
    one = claim.walk_segments(["default"], {"default": claim.WalkStart(at, frozenset({5, 0}))}, skip_scan=True)
    assert (one["walk_tops"], one["walk_bottoms"], one["walk_since"]) == (
        f'{{"{top}"}}',
        f'{{"{bottom}"}}',
        f"{{{at_text}}}",
    )


@pytest.mark.parametrize("segments", ["per priority", "one, skip scan"])
@pytest.mark.parametrize("limit", [None, "queue", "kind"])
def test_a_claim_from_a_walk_start_takes_every_priority_in_claim_order_but_what_is_behind_the_start(
    conn, db_url, limit, segments, monkeypatch
):
    # Both walk shapes, whatever this server's version (a skip scan server: PostgreSQL 18 and later).
    monkeypatch.setattr(claim, "SKIP_SCAN_SERVER", 10**9 if segments == "per priority" else 0)

    # Known priority 0, started 1 s ago: jobs from a minute ago are behind the start (the producer's look finds
    # such jobs), but per priority the walk goes from the head within each priority its claims never met.
    def job(priority: int, run_at: str) -> int:
        return conn.execute(
            "INSERT INTO dygo_jobs (kind, queue, priority, run_at) VALUES ('test.noop', 'default', %s, "
            f"{run_at}) RETURNING id",
            (priority,),
        ).fetchone()[0]

    old = "now() - interval '1 minute'"
    behind, old_high = job(0, old), job(9, old)
    high, low = job(7, "now()"), job(-3, "now()")
    new = enqueue(conn, "test.noop", {}).id
    if limit is not None:  # a limit never reached: the limited claims walk the same way
        limits.set_limit(conn, limit, "default" if limit == "queue" else "test.noop", 1000, None, None, ["default"])
    limits.forget_cache()
    start = claim.WalkStart(conn.execute("SELECT now() - interval '1 second'").fetchone()[0], frozenset({0}))

    def claimed(n: int) -> list[int]:
        async def go() -> list[int]:
            async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as aconn:
                got = await claim_jobs(aconn, {"default": n}, "w1", 30, starts={"default": start})
                return [job.id for job in got.jobs]

        ids = asyncio.run(go())
        conn.execute(  # back in line, as they were
            "UPDATE dygo_jobs SET state = 'pending', attempt = 0, started_at = NULL, lease_owner = NULL, "
            "lease_token = NULL, lease_deadline = NULL WHERE state = 'active'"
        )
        return ids

    try:
        if segments == "per priority":
            assert claimed(10) == [old_high, high, new, low]
            assert claimed(3) == [old_high, high, new]
        else:
            assert claimed(10) == [high, new, low]
            assert claimed(2) == [high, new]
        assert behind not in claimed(10)
    finally:
        limits.forget_cache()
