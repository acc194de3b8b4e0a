"""The worker's services one by one (worker/*.py), and how the worker watches them.

Covered elsewhere, by name: the producer's wake-ups and timers (test_worker.py
test_notify_wakes_an_idle_worker_well_under_the_poll_interval,
test_scheduled_job_starts_when_due_without_a_notification, test_poll_only_worker_finds_jobs_by_polling;
test_worker_options.py test_poll_only_worker_runs_a_retry_it_scheduled_when_due_not_at_the_next_poll,
test_first_claim_after_start_follows_a_recovery_pass), the lease keeper (test_worker.py
test_lease_is_renewed_while_a_long_job_runs), the settler and the drain (test_worker.py
test_sigterm_lets_short_jobs_finish_and_hands_long_ones_straight_back), the maintainer's recovery
(test_worker.py test_worker_killed_mid_job_is_recovered_and_finished_by_another) and retention
(test_retention.py test_worker_trims_history_and_logs_one_line), the scheduler (test_schedules.py
test_worker_timer_fires_at_the_occurrence, test_four_workers_fire_50_occurrences_as_exactly_50_jobs),
the progress writer (test_results.py test_progress_is_visible_mid_job_and_written_at_most_once_a_second),
the timings writer (test_telemetry.py
test_latency_and_duration_histograms_by_queue_and_kind_are_exact_after_a_real_worker), the listener's
reconnect (test_chaos.py test_terminated_backends_and_listen_connection_miss_no_wake_up_beyond_the_poll_interval),
readiness (test_worker_options.py test_worker_says_it_is_ready_on_stdout_by_file_and_on_its_metrics_port).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from datetime import UTC, datetime, timedelta

import psycopg
import pytest
from dygo.store import enqueue, enqueue_many, events, maintenance
from dygo.store.claim import claim_jobs, queues_with_jobs_behind
from dygo.store.config import load_settings
from dygo.store.leases import (
    Succeeded,
    Unsuccessful,
    recover_expired,
    renew,
    report_progress,
    settle,
)
from dygo.store.registry import registry
from dygo.worker.options import WorkerOptions
from dygo.worker.runtime import Worker

from tests.claiming import claim_queues
from tests.conftest import TEST_CONFIG, dygo_env, wait_until


def claim(url: str, slots: dict[str, int]) -> list:
    async def go():
        async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
            return await claim_queues(conn, slots, "w1", 30)

    return asyncio.run(go())


def test_one_claim_takes_each_queues_free_slots_in_the_seeds_order(conn, db_url):
    low = enqueue_many(conn, [{"kind": "test.noop", "priority": 0}] * 3)
    high = enqueue(conn, "test.noop", {}, priority=5)
    others = enqueue_many(conn, [{"kind": "test.context"}] * 4)  # queue "other"
    claimed = claim(db_url, {"default": 2, "other": 3})
    by_queue = {q: [j.id for j in claimed if j.queue == q] for q in ("default", "other")}
    assert by_queue["default"] == [high.id, low[0].id]
    assert by_queue["other"] == [j.id for j in others[:3]]
    assert [j.id for j in claimed][0] == high.id  # across queues too: priority first
    assert [j.queue for j in claim(db_url, {"default": 0, "other": 5})] == ["other"]  # the fourth


def test_a_claim_leaves_a_paused_queue_alone_and_serves_the_others(conn, db_url):
    enqueue(conn, "test.noop", {})
    other = enqueue(conn, "test.context", {})
    conn.execute(
        "INSERT INTO dygo_queues (name, paused) VALUES ('default', true) ON CONFLICT (name) DO UPDATE SET paused = true"
    )
    assert [j.id for j in claim(db_url, {"default": 10, "other": 10})] == [other.id]


def test_claim_walks_the_ready_index_never_the_whole_table(conn):
    from dygo.store import claim

    conn.execute("INSERT INTO dygo_jobs (kind, queue) SELECT 'test.noop', 'default' FROM generate_series(1, 5000)")
    params = {
        "queues": ["default", "other"],
        "slots": [100, 100],
        "owner": "w1",
        "ttl": 30,
        "kind_attempts": "{}",
        "max_attempts": 20,
        "full_kinds": [],
        **claim.walk_segments(["default", "other"], {}),
    }
    for analyzed in (False, True):  # a fresh table (no statistics yet), then an analyzed one
        plan = "\n".join(row[0] for row in conn.execute("EXPLAIN " + claim.CLAIM_JOBS, params))
        assert "dygo_jobs_ready" in plan and "Seq Scan on dygo_jobs" not in plan, (analyzed, plan)
        conn.execute("ANALYZE dygo_jobs")


def test_a_claim_planned_once_on_the_empty_table_still_walks_the_indexes_once_the_table_has_grown(conn, db_url):
    # The worker's claim is prepared, and planned once (a generic plan), not on every call. The plan is made
    # on a freshly migrated, empty table, where a sequential scan is cheapest; its settings price that out,
    # so it stays on the indexes after the table has grown.
    async def claims(c: psycopg.AsyncConnection, times: int) -> int:
        claimed = 0
        for _ in range(times):
            claimed += len(await claim_queues(c, {"default": 4, "other": 4}, "w1", 30))
        return claimed

    async def go() -> tuple[int, int, int]:
        async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as c:
            await claims(c, 10)  # psycopg prepares a statement on its 5th execution: on the empty table
            conn.execute(
                "INSERT INTO dygo_jobs (kind, queue) SELECT 'test.noop', 'default' FROM generate_series(1, 5000)"
            )
            before = seq_scans_of_the_job_table(conn)
            claimed = await claims(c, 10)
            await c.execute("SELECT pg_stat_force_next_flush()")
            cursor = await c.execute(
                "SELECT coalesce(sum(generic_plans), 0) FROM pg_prepared_statements "
                "WHERE statement LIKE '%%FOR UPDATE SKIP LOCKED%%'"
            )
            generic = (await cursor.fetchone())[0]
            return claimed, generic, seq_scans_of_the_job_table(conn) - before

    claimed, generic_plans, seq_scans = asyncio.run(go())
    assert claimed == 40 and generic_plans >= 10 and seq_scans == 0


def seq_scans_of_the_job_table(conn) -> int:
    conn.execute("SELECT pg_stat_clear_snapshot()")
    return conn.execute("SELECT seq_scan FROM pg_stat_user_tables WHERE relname = 'dygo_jobs'").fetchone()[0]


def test_worker_statements_never_scan_the_whole_job_table_even_before_its_first_analyze(conn, db_url):
    # A freshly migrated table of a few pages that was never analysed: finding a few rows by id is
    # cheapest by a sequential scan there, and the planner would take one for the claim's and the settle's
    # UPDATE until the table grew. Every worker statement here must use its index.
    conn.execute(
        "INSERT INTO dygo_jobs (kind, queue, state, finished_at) "
        "SELECT 'test.noop', 'default', 'succeeded', now() FROM generate_series(1, 200)"
    )
    enqueue_many(conn, [{"kind": "test.noop"}] * 20)
    enqueue(conn, "test.noop", {}, delay="1h")
    waiting = conn.execute(
        "INSERT INTO dygo_jobs (kind, queue, state, attempt) VALUES ('test.noop', 'other', 'waiting', 1) RETURNING id"
    ).fetchone()[0]
    conn.execute(  # an event wait past its deadline, for the timeout sweep
        "INSERT INTO dygo_steps (job_id, key, op, seq, attempt, duration, wake_at, state, waits_for) "
        "VALUES (%s, 'paid#1', 'event', 1, 1, 0, now() - interval '1 second', 'waiting', 'paid')",
        (waiting,),
    )
    before = seq_scans_of_the_job_table(conn)

    async def cycle() -> dict[str, float]:
        async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as c:
            jobs = (await claim_jobs(c, {"default": 10, "other": 5}, "w1", 30)).jobs
            await renew(c, jobs, 60)
            await report_progress(c, [(jobs[0], (0.5, "half way"))])
            await settle(
                c,
                [
                    Succeeded(jobs[0], None),
                    Unsuccessful(jobs[1], "pending", delay=600, error="boom"),
                    Unsuccessful(jobs[2], "dead", error="bust"),
                ],
            )
            assert await events.time_out_waits(c) == events.TimedOut(waits=1, woken=1)
            await claim_jobs(c, {"default": 5}, "w2", 0.001)  # leases that expire at once
            await asyncio.sleep(0.05)
            assert len((await recover_expired(c, 3)).jobs) == 5
            last = await claim_jobs(c, {"default": 30}, "w3", 30)
            assert len(last.jobs) == 10  # the 5 never claimed and the 5 recovered
            await asyncio.sleep(1.1)  # past a retention of 1 s: the history and the jobs settled above go
            trimmed = await maintenance.trim(
                lambda: contextlib.nullcontext(c), maintenance.RetentionPeriods(1, 1, 1, 1), maintenance.SucceededWalk()
            )
            assert trimmed is not None and (trimmed.succeeded, trimmed.dead) == (201, 1)
            await c.execute("SELECT pg_stat_force_next_flush()")  # this backend's counters, before we read
            await c.execute("SELECT 1")
            return last.due_in

    due_in = asyncio.run(cycle())
    assert seq_scans_of_the_job_table(conn) == before
    assert 590 < due_in["default"] <= 600  # the retry, due before the job enqueued for in an hour


def claim_walk_buffers(conn, since) -> int:
    """Pages the claim's walk of dygo_jobs_ready touched (EXPLAIN ANALYZE, rolled back)."""
    from dygo.store import claim

    params = {
        "queues": ["default"],
        "slots": [10],
        "owner": "w1",
        "ttl": 30,
        "kind_attempts": "{}",
        "max_attempts": 20,
        **claim.walk_segments(
            ["default"], {} if since is None else {"default": claim.WalkStart(since, frozenset({0}))}
        ),
        "full_kinds": [],
    }
    with conn.transaction(force_rollback=True):
        [[plan]] = conn.execute("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + claim.CLAIM_JOBS, params).fetchall()

    def walks(node):
        if node.get("Index Name") == "dygo_jobs_ready" and "run_at <= now()" in node.get("Index Cond", ""):
            yield node["Shared Hit Blocks"] + node["Shared Read Blocks"]
        for child in node.get("Plans", []):
            yield from walks(child)

    [buffers] = walks(plan[0]["Plan"])
    return buffers


def test_a_walk_from_since_passes_over_the_jobs_claimed_under_a_held_snapshot(conn, db_url):
    with psycopg.connect(db_url) as holder:
        holder.execute("SELECT pg_current_xact_id()")  # an xid: every row version newer than it is kept
        conn.execute(
            "INSERT INTO dygo_jobs (kind, queue, run_at) "
            "SELECT 'test.noop', 'default', now() - interval '1 minute' FROM generate_series(1, 3000)"
        )
        conn.execute("UPDATE dygo_jobs SET state = 'succeeded'")  # 3,000 entries at the head, dead but kept
        since = conn.execute("SELECT now() - interval '1 second'").fetchone()[0]
        enqueue(conn, "test.noop", {})
        from_head, from_since = claim_walk_buffers(conn, None), claim_walk_buffers(conn, since)
        holder.rollback()
    assert from_head > 50 and from_since < 10, (from_head, from_since)


def test_the_look_behind_the_walk_starts_names_the_queues_with_a_ready_job_there(conn, db_url):
    # The producer's claims start past the head; this look, apart from them, is what finds a job put in line
    # behind that start. A job due later, or one in a paused queue, is no reason to walk from the head.
    enqueue(conn, "test.noop", {}, run_at=datetime.now(UTC) - timedelta(minutes=5))  # "default": behind
    enqueue(conn, "test.context", {}, delay="10s")  # "other": not due
    conn.execute("INSERT INTO dygo_queues (name, paused) VALUES ('paused', true)")
    conn.execute(
        "INSERT INTO dygo_jobs (kind, queue, run_at) VALUES ('test.noop', 'paused', now() - interval '1 hour')"
    )
    start = datetime.now(UTC) - timedelta(minutes=1)

    async def look(starts: dict[str, datetime]) -> set[str]:
        async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as c:
            return await queues_with_jobs_behind(c, starts)

    assert asyncio.run(look({"default": start, "other": start, "paused": start})) == {"default"}
    assert asyncio.run(look({"default": start - timedelta(minutes=10)})) == set()


def test_a_full_claim_says_where_in_line_it_stopped_for_each_queue(conn, db_url):
    # In a backlog the producer's next walk starts there (less a margin), not at the head: under a held
    # snapshot a walk from the head visits every job claimed since, and a worker behind never caught up.
    from datetime import UTC, datetime, timedelta

    start = datetime.now(UTC) - timedelta(minutes=5)
    jobs = [enqueue(conn, "test.noop", {}, run_at=start + timedelta(seconds=i)) for i in range(5)]
    claim = asyncio.run(claim_in_one_statement(db_url, {"default": 3}))
    assert [job.id for job in claim.jobs] == [job.id for job in jobs[:3]]
    assert claim.last_run_at == {"default": start + timedelta(seconds=2)}


async def claim_in_one_statement(url: str, wanted: dict[str, int]):
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as c:
        return await claim_jobs(c, wanted, "w1", 30)


def test_a_short_claim_says_when_each_queues_next_job_is_due_in_the_same_statement(conn, db_url):
    enqueue(conn, "test.noop", {})
    enqueue(conn, "test.noop", {}, delay="30s")
    enqueue(conn, "test.noop", {}, delay="90s", priority=5)
    enqueue_many(conn, [{"kind": "test.context"}] * 3)  # queue "other"
    enqueue(conn, "test.context", {}, delay="10s")
    conn.execute("INSERT INTO dygo_jobs (kind, queue, run_at) VALUES ('test.noop', 'mail', now() + interval '1 hour')")

    async def go():
        async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as c:
            return await claim_jobs(c, {"default": 5, "other": 2, "mail": 1, "reports": 1}, "w1", 30)

    claim = asyncio.run(go())
    assert sorted(job.queue for job in claim.jobs) == ["default", "other", "other"]
    # Short queues only, with the earliest future run_at whatever its priority (the job just claimed is
    # not counted, though the statement's snapshot still sees it pending); a full queue ("other") and a
    # queue with nothing pending ("reports") have no entry.
    assert set(claim.due_in) == {"default", "mail"}
    assert 28 < claim.due_in["default"] <= 30 and 3590 < claim.due_in["mail"] <= 3600


@pytest.mark.parametrize(
    ("module", "function", "service"),
    [
        ("dygo.store.leases", "renew", "lease-keeper"),
        ("dygo.store.leases", "heartbeat", "maintainer"),
    ],
)
def test_a_service_that_dies_is_named_and_the_worker_stops_with_exit_1(conn, spawn, module, function, service):
    process = spawn("worker", "--poll-interval", "60s", "--shutdown-timeout", "1s")
    process.wait_for_line("started")
    long = enqueue(conn, "test.record", {"seconds": 30})  # a lease to keep: the lease keeper renews it
    wait_until(lambda: conn.execute("SELECT count(*) FROM test_runs").fetchone()[0] == 1, message="the long job")
    job = enqueue(conn, "test.break_service", {"module": module, "function": function})
    assert process.wait(timeout=30) == 1
    stderr = process.stderr()
    assert f"worker service {service} died (RuntimeError: injected: {module}.{function} is broken)" in stderr
    assert f"stopped: service {service} died" in "".join(process.lines)
    # The other services did their part on the way out: the breaking job was settled, the long one
    # handed back at the shutdown timeout, the worker row removed.
    assert conn.execute("SELECT state FROM dygo_jobs WHERE id = %s", (job.id,)).fetchone()[0] == "succeeded"
    assert conn.execute("SELECT state, attempt FROM dygo_jobs WHERE id = %s", (long.id,)).fetchone() == ("pending", 0)
    assert conn.execute("SELECT count(*) FROM dygo_workers").fetchone()[0] == 0


FIVE_QUEUES = """queues:
  - name: default
    concurrency: 8
  - name: other
    concurrency: 2
  - name: mail
    concurrency: 4
  - name: reports
    concurrency: 4
  - name: webhooks
    concurrency: 4
"""


def worker_connections(conn) -> int:
    return conn.execute(
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
        "AND application_name LIKE 'dygo-worker%'"
    ).fetchone()[0]


def test_worker_serving_five_queues_holds_at_most_three_connections(conn, db_url, spawn, tmp_path):
    (tmp_path / "queues.yml").write_text(FIVE_QUEUES)
    (tmp_path / "dygo.yml").write_text((TEST_CONFIG / "dygo.yml").read_text() + "retention_interval: 1s\n")
    process = spawn("worker", "--poll-interval", "1s", env=dygo_env(db_url, DYGO_CONFIG_DIR=str(tmp_path)))
    process.wait_for_line("started")
    idle = [worker_connections(conn) for _ in range(30) if not time.sleep(0.2)]  # 6 s: heartbeat, retention
    conn.execute(
        "INSERT INTO dygo_jobs (kind, queue, args) SELECT 'test.record', q, '{\"seconds\": 0.02}' "
        "FROM unnest(ARRAY['default', 'other', 'mail', 'reports', 'webhooks']) AS q, "
        "generate_series(1, 60)"
    )
    busy = []

    def drained() -> bool:
        busy.append(worker_connections(conn))
        return conn.execute("SELECT count(*) FROM dygo_jobs WHERE state <> 'succeeded'").fetchone()[0] == 0

    wait_until(drained, timeout=60, interval=0.05, message="300 jobs over 5 queues to succeed")
    assert max(idle) <= 3 and max(busy) <= 3, (idle, busy)
    assert min(busy) >= 2  # counted for real: the claim and the LISTEN connections at least
    queues = conn.execute("SELECT DISTINCT queue FROM dygo_jobs j JOIN test_runs r ON r.job_id = j.id").fetchall()
    assert len(queues) == 5


def test_lease_keeper_with_nothing_to_renew_does_not_report_the_database_back(db_url):
    from dygo.worker.database import WorkerConnections
    from dygo.worker.lease_keeper import LeaseKeeper

    async def go() -> bool:
        database = WorkerConnections(db_url, "test:1:abc")
        await database.pool.open(wait=True)
        try:
            database.outage.lost("a restart under way", OSError("server closed the connection"))
            await LeaseKeeper(database, {}, 2.0).renew_once()
            return database.outage.down
        finally:
            await database.pool.close()

    assert asyncio.run(go())  # still down: only a statement that ran may end an outage


def test_a_statement_that_ran_while_new_connections_are_refused_does_not_end_an_outage(db_url):
    # A server shutting down refuses new connections while a backend it has not yet stopped may still run a
    # statement: only a new connection says the database is back.
    from dygo.worker.database import WorkerConnections

    async def go() -> list[bool]:
        database = WorkerConnections(db_url, "test:1:abc")
        await database.pool.open(wait=True)
        try:
            database.outage.lost("a restart under way", OSError("server closed the connection"))
            database.url = "host=/nonexistent dbname=gone connect_timeout=1"  # new connections fail
            async with database.connection() as conn:  # an old one still answers
                await conn.execute("SELECT 1")
            await database.back()
            still_down = database.outage.down
            database.url = db_url
            await database.back()
            return [still_down, database.outage.down]
        finally:
            await database.pool.close()

    assert asyncio.run(go()) == [True, False]


def test_recovery_looks_back_to_its_previous_pass_and_a_whole_pass_finds_older_leases(conn, db_url):
    # While VACUUM is held back, a walk from the oldest deadline visits an index entry for every lease
    # taken since: between whole passes, a pass only looks back to the previous one.
    from dygo.worker.database import WorkerConnections
    from dygo.worker.maintainer import Recovery

    recent, old = (enqueue(conn, "test.noop", {}).id for _ in range(2))
    claim(db_url, {"default": 2})

    def expire(job_id: int, ago: str) -> None:
        conn.execute("UPDATE dygo_jobs SET lease_deadline = now() - %s::interval WHERE id = %s", (ago, job_id))

    def pending() -> set[int]:
        return {i for (i,) in conn.execute("SELECT id FROM dygo_jobs WHERE state = 'pending'")}

    async def go() -> list[set[int]]:
        database = WorkerConnections(db_url, "test:1:abc")
        await database.pool.open(wait=True)
        try:
            recovery = Recovery(database, max_reaps=3)
            await recovery.run_once()  # the first pass is whole: nothing has expired yet
            expire(recent, "2 seconds")  # within the margin before the previous pass
            expire(old, "1 hour")  # long before it: only a whole pass looks that far back
            await recovery.run_once()
            after_window = pending()
            recovery.last_whole -= 3600  # as if the last whole pass was an hour ago
            await recovery.run_once()
            return [after_window, pending()]
        finally:
            await database.pool.close()

    assert asyncio.run(go()) == [{recent}, {recent, old}]


def test_a_recovery_pass_that_waited_for_its_connection_still_finds_a_lease_that_expired_meanwhile(
    conn, db_url, monkeypatch
):
    # The chaos suite once saw a killed worker's job wait 74 s for the next whole pass: a pass that waits for
    # the shared connection (a stalled server) must look back to the previous pass's clock, not further up.
    from dygo.worker import maintainer
    from dygo.worker.database import WorkerConnections

    monkeypatch.setattr(maintainer, "RECOVERY_MARGIN", timedelta(seconds=1))
    job_id = enqueue(conn, "test.noop", {}).id
    claim(db_url, {"default": 1})

    async def go() -> str:
        database = WorkerConnections(db_url, "test:1:abc")
        await database.pool.open(wait=True)
        try:
            recovery = maintainer.Recovery(database, max_reaps=3)
            await recovery.run_once()  # whole; the next pass looks back from this one's clock
            conn.execute("UPDATE dygo_jobs SET lease_deadline = now() WHERE id = %s", (job_id,))
            async with database.connection():  # the pass begins now, and waits 2 s for the connection
                waiting = asyncio.create_task(recovery.run_once())
                await asyncio.sleep(2.0)
            await waiting
            return conn.execute("SELECT state FROM dygo_jobs WHERE id = %s", (job_id,)).fetchone()[0]
        finally:
            await database.pool.close()

    assert asyncio.run(go()) == "pending"


def test_jobs_of_a_claim_still_run_when_the_stop_comes_before_their_tasks_are_made(conn, db_url):
    """The producer's claimed jobs get their tasks on the loop's next turn, once its next claim is on its way
    (worker/runs.py Runs.start). A drain in between makes them first: they run and settle like any other."""
    ids = [job.id for job in enqueue_many(conn, [{"kind": "test.noop"}] * 3)]

    async def go() -> None:
        worker = Worker(load_settings(TEST_CONFIG), registry, WorkerOptions({"default": 4}), db_url)
        await worker.database.pool.open()
        try:
            async with worker.database.connection() as claimer:
                jobs = await claim_queues(claimer, {"default": 4}, worker.id, 30)
            finished = []
            worker.runs.start(jobs, lambda job, took: finished.append(job.id))
            assert not worker.runs.tasks  # made on the loop's next turn, not here
            await worker.runs.drain(timeout=5)
            await worker.settler.flush()
            assert sorted(finished) == ids
        finally:
            await worker.database.pool.close()

    asyncio.run(go())
    rows = conn.execute("SELECT state, attempt FROM dygo_jobs WHERE id = ANY(%s)", (ids,)).fetchall()
    assert rows == [("succeeded", 1)] * 3


def test_a_queue_walks_from_its_start_within_the_priorities_its_claims_met_up_to_eight():
    from dygo.store.claim import WalkStart
    from dygo.worker.producer import KNOWN_PRIORITIES, QueueSlots

    slots = QueueSlots("default", 4, 0.0, 0)
    assert slots.walk_start_at() is None  # no start yet: from the head
    slots.met({0, 5})
    at = datetime(2026, 1, 1, tzinfo=UTC)
    slots.walk_start = at
    assert slots.walk_start_at() == WalkStart(at, frozenset({0, 5}))
    slots.met(set(range(100, 120)))  # more than it keeps: the rest are walked from the head of their range
    assert len(slots.priorities) == KNOWN_PRIORITIES == 8 and {0, 5} <= slots.priorities
    slots.walk_start = None  # a walk from the head (a look found a job behind the start)
    assert slots.walk_start_at() is None


def test_a_notified_job_behind_the_walk_start_moves_it_back_even_while_a_claim_is_on_its_way():
    from dygo.worker.producer import NOTIFIED_MARGIN, QueueSlots

    slots = QueueSlots("default", 4, 0.0, 0)
    at = datetime(2026, 1, 1, tzinfo=UTC)
    slots.walk_start = at
    slots.put_in_line(at + timedelta(seconds=5))  # an enqueue committed in time: ahead of the start
    assert slots.walk_start == at
    slots.put_in_line(at - timedelta(minutes=1))  # committed late, or put back in line with its old run_at
    assert slots.walk_start == at - timedelta(minutes=1) - NOTIFIED_MARGIN
    slots.claim_sent()
    slots.put_in_line(at - timedelta(minutes=2))  # while a claim is on its way: its snapshot may not see it
    slots.claim_returned(at + timedelta(seconds=10))  # the claim came back short
    assert slots.walk_start == at - timedelta(minutes=2) - NOTIFIED_MARGIN
    slots.claim_sent()
    slots.claim_returned(at + timedelta(seconds=10))
    assert slots.walk_start == at + timedelta(seconds=10)
    slots.claim_sent()
    slots.put_in_line(at)
    slots.claim_returned(False)  # the claim moved nothing (a limit held it back)
    assert slots.walk_start == at - NOTIFIED_MARGIN
    slots.walk_start = None  # from the head: a NOTIFY cannot move it later
    slots.put_in_line(at)
    assert slots.walk_start is None


def test_a_job_put_in_line_behind_a_walk_start_runs_at_its_notify_with_no_look_behind(conn, db_url, monkeypatch):
    # With no look for jobs behind the walk start this hour, only the NOTIFY's run_at can bring the worker's
    # walk back to a job committed late (or handed back) and to a paused queue's jobs when it resumes.
    from dygo.store.admin import pause_queue, resume_queue
    from dygo.worker import producer

    monkeypatch.setattr(producer, "BEHIND_SAFETY_INTERVAL", 3600.0)
    a_minute_ago = datetime.now(UTC) - timedelta(minutes=1)

    def state(job_id: int) -> str:
        return conn.execute("SELECT state FROM dygo_jobs WHERE id = %s", (job_id,)).fetchone()[0]

    async def until(done, what: str) -> None:
        deadline = time.monotonic() + 10
        while not done():
            assert time.monotonic() < deadline, what
            await asyncio.sleep(0.02)

    async def go() -> None:
        worker = Worker(load_settings(TEST_CONFIG), registry, WorkerOptions({"default": 4}), db_url)
        running = asyncio.create_task(worker.run())
        slots = worker.producer.slots["default"]
        try:
            await until(lambda: worker.ready, "the worker to be ready")
            first = enqueue(conn, "test.noop", {})
            await until(lambda: state(first.id) == "succeeded", "the first job")
            await until(lambda: slots.walk_start is not None and slots.walk_start > a_minute_ago, "a walk start")
            late = enqueue(conn, "test.noop", {}, run_at=a_minute_ago)
            await until(lambda: state(late.id) == "succeeded", "the job behind the walk start")
            # An update that leaves a job pending with an earlier run_at, as a hand-back or a recovered lease does.
            later = enqueue(conn, "test.noop", {}, delay="1h")
            conn.execute("UPDATE dygo_jobs SET run_at = %s WHERE id = %s", (a_minute_ago, later.id))
            await until(lambda: state(later.id) == "succeeded", "the job put back behind the walk start")

            pause_queue(conn, "default")
            parked = enqueue(conn, "test.noop", {}, run_at=a_minute_ago)
            await asyncio.sleep(0.5)  # its NOTIFY moves the walk start back; a claim then finds the queue paused
            assert slots.walk_start is not None and slots.walk_start > a_minute_ago and state(parked.id) == "pending"
            resume_queue(conn, "default")
            await until(lambda: state(parked.id) == "succeeded", "the paused queue's job after its resume")
        finally:
            worker.stop()
            await running

    asyncio.run(go())
