"""Claiming: how ready jobs leave the queue for a worker. The one module that owns the claim statements,
their parameters and their rows; the producer (worker/producer.py) calls `claim_jobs` and nothing else.

A claim takes, for each queue with free slots, at most that many ready jobs in claim order (priority, then
run_at, then id), leases them to the worker and starts them: one statement, one round trip, whatever the
number of queues. With no cluster-wide limit (store/limits.py) concerning its queues it is CLAIM_JOBS (or
CLAIM_JOBS_CAPPED), with no lock. Under a limit it is one transaction in one round trip (pipelined):
1. an advisory lock per limit concerned (sorted, so two claims never wait on each other in a cycle),
   taken by its own statement before anything is counted: READ COMMITTED gives the next statement a
   snapshot that includes every claim committed while this one waited for the lock;
2. CLAIM_LIMITED, one statement: the use of each limit (active jobs: the active set is small, one walk
   of dygo_jobs_leases; the starts logged in each rate window), the ready rows skipping every queue,
   kind and key already at its limit (so one tenant's backlog does not hide another tenant's jobs),
   locked FOR UPDATE SKIP LOCKED, of those the ones each limit still admits, claimed as CLAIM_JOBS
   claims them, and one start-log row per rate limit and key with its count (insert-only, no shared row
   per job).

Rate windows are sliding: at most N starts in any interval of the window's length, on the database
clock at the claim (clock_timestamp(), read after the lock, so the log's times follow lock order).

Every claim statement returns the same columns (ClaimRow), read by name through a row factory: the claimed
jobs in claim order, then one row per queue that came back short (`due_in`) or that a limit held back
(`held_for`).
"""

from __future__ import annotations

import time
import weakref
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import partial
from typing import Any, NamedTuple, cast

import psycopg
from dygo.store import leases, limits, workflows
from dygo.store.codecs import array, load_json
from dygo.store.db import aroll_back, through_transaction_pooler
from dygo.store.leases import ClaimedJob
from dygo.store.limits import START_SLACK, LimitRow
from dygo.store.registry import Registry, registry
from psycopg.rows import RowMaker, no_result
from psycopg.types.json import set_json_loads

# A queue held back by a full concurrency limit claims again after this at the latest; a settle of a
# limited job NOTIFYs its queue (limits.freed_queues, at the settle's commit), so normally sooner.
CONCURRENCY_RECHECK = 0.5
# A rate-limited job is claimed once its start time is at most this far off, and waits in the worker until
# then: a claim takes the starts of the next tenth of a second, not one job per start.
RATE_HORIZON = 0.1

# --- The statements ------------------------------------------------------------------------------


# A queue's walk of the ready index, the LATERAL each claim statement joins to its queue row `w`: the queue's
# segments in order (walk_segments), each walked in claim order, until `limit` rows are locked. `columns` of
# dygo_jobs (as `j`); `filters`, more conditions on a row, each beginning with AND.
def _ready_walk(columns: str, limit: str, filters: str = "") -> str:
    return f"""CROSS JOIN LATERAL (
        SELECT r.* FROM unnest(%(walk_queues)s::text[], %(walk_tops)s::integer[], %(walk_bottoms)s::integer[],
                               %(walk_since)s::timestamptz[]) AS s(queue, top, bottom, since)
        CROSS JOIN LATERAL (
            SELECT {columns} FROM dygo_jobs j
            WHERE state = 'pending' AND queue = w.queue AND priority <= s.top AND priority >= s.bottom
              AND run_at >= coalesce(s.since, '-infinity') AND run_at <= now()
              AND kind <> ALL(%(full_kinds)s::text[])
              AND NOT EXISTS (SELECT 1 FROM dygo_queues q WHERE q.name = w.queue AND q.paused){filters}
            ORDER BY priority DESC, run_at, id
            LIMIT {limit}
            FOR UPDATE SKIP LOCKED
        ) AS r
        WHERE s.queue = w.queue
        LIMIT {limit}
    ) AS p
"""


# The next-due look of a queue row `w` (n.run_at: its next scheduled job, NULL: none), through the same segments
# as its walk: only jobs still to come (a future run_at, an index condition within a segment, so the entries of
# claimed jobs are passed over without a visit to their rows).
_NEXT_DUE = """CROSS JOIN LATERAL (
        SELECT min(f.run_at) AS run_at
        FROM unnest(%(walk_queues)s::text[], %(walk_tops)s::integer[], %(walk_bottoms)s::integer[])
            AS s(queue, top, bottom)
        CROSS JOIN LATERAL (
            SELECT min(run_at) AS run_at FROM dygo_jobs
            WHERE state = 'pending' AND queue = w.queue AND priority <= s.top AND priority >= s.bottom
              AND run_at > now()
              AND NOT EXISTS (SELECT 1 FROM dygo_queues q WHERE q.name = w.queue AND q.paused)) AS f
        WHERE s.queue = w.queue) AS n
"""

# One statement claims for every queue a worker serves: each (queue, free slots) pair of the arrays
# walks the dygo_jobs_ready partial index (queue, priority DESC, run_at, id) in a LATERAL of its own,
# so each queue gets at most its own free slots in claim order, and one round trip serves any
# number of queues (a worker's claim connection is one, whatever its queues). SKIP LOCKED lets any
# number of workers claim at once. A paused queue (dygo_queues) yields nothing: one primary-key
# probe per segment walked (below). The UPDATE finds each picked row by primary key
# (`= ANY(ARRAY(...))`); the rows come back in claim order across the queues, the order jobs start in.
# Each queue that comes back short gets one more row (id NULL): the seconds until its next scheduled job
# is due (NULL: none), so the producer sets its timer without a second statement; every row has the
# statement's clock.
# A queue's walk may start past the head (WalkStart). Its entries of claimed jobs stay in the index until a
# vacuum removes them, and while something holds a snapshot back every walk from the head visits each of
# their rows: the producer passes, after a claim that came back short at time T (every job then due and
# visible was taken), T less a margin for enqueues that commit late. Jobs put back in line with an earlier
# run_at (hand-backs, recovered leases, resumed jobs) or committed later than the margin are found by
# JOBS_BEHIND, apart from the claims; a walk from the head follows only when it finds one. The walk goes
# through the queue's segments (`walk_segments`) in order, each a range of priorities, until it has its
# slots: a run_at bound is an index boundary only within one priority (the index orders by priority first;
# PostgreSQL before 18 would otherwise check it entry by entry from the queue's head), so each priority the
# queue's claims have met is a segment of its own, starting at the run_at, and the priorities between them
# are segments walked from their start. A queue walked from the head is one segment of every priority; so is
# one with a start on PostgreSQL 18 and later, whose skip scan seeks the run_at within each priority itself.
# The worker's claim is prepared and planned once, a generic plan (CLAIM_SETTINGS): planning a small claim
# afresh costs more server time than running it. The plan is made with sequential scans priced out: a plan
# made on a freshly migrated, empty table would otherwise scan the whole table (cheapest there) and keep
# doing so while the table grows, until an ANALYZE invalidates it. Planned afresh, the UPDATE's lookup by id
# is also a sequential scan while the table has a few pages, so every claim runs with
# store/sql/leases.py's INDEX_SCANS_ONLY (or its session's setting).
# Per-worker kind caps (worker/capacity.py): the walk skips the kinds at their cap in this worker
# (%(full_kinds)s, empty when none), so they hold up no other kind of the queue. CLAIM_JOBS takes every
# picked row. CLAIM_JOBS_CAPPED, sent when a capped kind has fewer free slots than the claim could take
# (%(cap_kinds)s, %(cap_free)s), keeps no row of such a kind beyond its free slots (a window over the
# locked candidates, before the UPDATE); the rows it drops stay pending, locked only until the statement
# ends. Two statements: a worker without caps does not pay for planning the window (bench/claim_caps.py).
# Columns: the claimed job (ClaimedJob's), `meta` NULL when empty (most jobs': each column costs the worker
# per job to load), the lease token as text (it loads several times faster than a UUID), no lease deadline
# (the same for the whole claim); `waited`, the start latency (store/timings.py); the epoch numbers load
# faster than timestamps.
CLAIM_JOBS = (
    """
WITH picked AS (
    SELECT p.id, p.kind, p.priority, p.run_at
    FROM unnest(%(queues)s::text[], %(slots)s::integer[]) AS w(queue, slots)
    """
    + _ready_walk("id, kind, priority, run_at", "w.slots")
    + """), kept AS (
    SELECT id FROM picked
), claimed AS (
    UPDATE dygo_jobs AS j
    SET state = 'active', attempt = j.attempt + 1, started_at = now(),
        -- Unset at enqueue: the kind's registered max_attempts in this worker, else the configured default.
        max_attempts = coalesce(j.max_attempts, (%(kind_attempts)s::jsonb ->> j.kind)::integer, %(max_attempts)s),
        lease_owner = %(owner)s, lease_token = gen_random_uuid(),
        lease_deadline = now() + make_interval(secs => %(ttl)s)
    WHERE j.id = ANY(ARRAY(SELECT id FROM kept))
    RETURNING j.id, j.kind, j.queue, j.args, j.meta, j.attempt, j.max_attempts, j.enqueued_at, j.node_id,
              j.lease_token, j.priority, j.run_at
), next_due AS (
    -- Only for queues that came back short, and only jobs still to come (future run_at only, an index
    -- condition, so the entries of claimed jobs are passed over without a visit to their rows): the
    -- statement's snapshot sees the jobs it just claimed as pending, and a due job skipped as locked is
    -- another worker's. Paused queues are left out: they must not wake anyone.
    SELECT w.queue, extract(epoch FROM n.run_at - now())::float8 AS due_in
    FROM unnest(%(queues)s::text[], %(slots)s::integer[]) AS w(queue, slots)
    """
    + _NEXT_DUE
    + """    WHERE w.slots > (SELECT count(*) FROM claimed c WHERE c.queue = w.queue)
)
SELECT id, kind, queue, args, nullif(meta, '{}'::jsonb) AS meta, attempt, max_attempts, enqueued_at,
       lease_token::text AS lease_token, extract(epoch FROM now() - greatest(run_at, enqueued_at))::float8 AS waited,
       NULL::float8 AS due_in, NULL::float8 AS held_for, extract(epoch FROM now())::float8 AS clock, priority,
       extract(epoch FROM run_at)::float8 AS run_at, node_id, NULL::float8 AS start_in
FROM claimed
UNION ALL
SELECT NULL, NULL, queue, NULL, NULL, NULL, NULL, NULL, NULL, NULL, due_in, NULL, extract(epoch FROM now())::float8,
       NULL, NULL, NULL, NULL FROM next_due
ORDER BY priority DESC NULLS LAST, run_at, id"""
)

# CLAIM_JOBS, keeping no more of a capped kind than its free slots (the `kept` CTE); the rest is the same.
CLAIM_JOBS_CAPPED = (
    """
WITH picked AS (
    SELECT p.id, p.kind, p.priority, p.run_at
    FROM unnest(%(queues)s::text[], %(slots)s::integer[]) AS w(queue, slots)
    """
    + _ready_walk("id, kind, priority, run_at", "w.slots")
    + """), kept AS (
    SELECT r.id FROM (
        SELECT id, kind, row_number() OVER (PARTITION BY kind ORDER BY priority DESC, run_at, id) AS n FROM picked
    ) AS r
    LEFT JOIN unnest(%(cap_kinds)s::text[], %(cap_free)s::integer[]) AS c(kind, free) ON c.kind = r.kind
    WHERE c.free IS NULL OR r.n <= c.free
), claimed AS (
    UPDATE dygo_jobs AS j
    SET state = 'active', attempt = j.attempt + 1, started_at = now(),
        -- Unset at enqueue: the kind's registered max_attempts in this worker, else the configured default.
        max_attempts = coalesce(j.max_attempts, (%(kind_attempts)s::jsonb ->> j.kind)::integer, %(max_attempts)s),
        lease_owner = %(owner)s, lease_token = gen_random_uuid(),
        lease_deadline = now() + make_interval(secs => %(ttl)s)
    WHERE j.id = ANY(ARRAY(SELECT id FROM kept))
    RETURNING j.id, j.kind, j.queue, j.args, j.meta, j.attempt, j.max_attempts, j.enqueued_at, j.node_id,
              j.lease_token, j.priority, j.run_at
), next_due AS (
    SELECT w.queue, extract(epoch FROM n.run_at - now())::float8 AS due_in
    FROM unnest(%(queues)s::text[], %(slots)s::integer[]) AS w(queue, slots)
    """
    + _NEXT_DUE
    + """    WHERE w.slots > (SELECT count(*) FROM claimed c WHERE c.queue = w.queue)
)
SELECT id, kind, queue, args, nullif(meta, '{}'::jsonb) AS meta, attempt, max_attempts, enqueued_at,
       lease_token::text AS lease_token, extract(epoch FROM now() - greatest(run_at, enqueued_at))::float8 AS waited,
       NULL::float8 AS due_in, NULL::float8 AS held_for, extract(epoch FROM now())::float8 AS clock, priority,
       extract(epoch FROM run_at)::float8 AS run_at, node_id, NULL::float8 AS start_in
FROM claimed
UNION ALL
SELECT NULL, NULL, queue, NULL, NULL, NULL, NULL, NULL, NULL, NULL, due_in, NULL, extract(epoch FROM now())::float8,
       NULL, NULL, NULL, NULL FROM next_due
ORDER BY priority DESC NULLS LAST, run_at, id"""
)

# The queues with a ready job behind their walk start (`since`), which walks from there do not see: put in
# line with an earlier run_at (a hand-back, a recovered lease, a resumed job) or committed later than the
# producer's margin. The producer asks it apart from its claims, on the shared connection, at most once a
# second: while something holds a snapshot back it visits the row of every job claimed since the hold
# began, a cost that would otherwise fall on a claim, and on the jobs waiting for it. It locks nothing: a
# pending row another worker has locked counts too (one walk from the head too many, no job missed).
JOBS_BEHIND = """
SELECT w.queue FROM unnest(%(queues)s::text[], %(since)s::timestamptz[]) AS w(queue, since)
WHERE EXISTS (
    SELECT 1 FROM dygo_jobs
    WHERE state = 'pending' AND queue = w.queue AND run_at < w.since AND run_at <= now()
      AND NOT EXISTS (SELECT 1 FROM dygo_queues q WHERE q.name = w.queue AND q.paused))"""

# The limited claim's lock: advisory lock keys (LimitRow.lock_key), in ascending order.
LOCK_LIMITS = """
SELECT count(pg_advisory_xact_lock(k)) FROM unnest(%(keys)s::bigint[]) WITH ORDINALITY AS l(k, i)"""

# CLAIM_LIMITED's walk skips every (limit, key) with a wait.
LIMITS_HOLD_NONE = """
              AND NOT EXISTS (SELECT 1 FROM use u WHERE u.wait IS NOT NULL
                                AND u.name = CASE u.scope WHEN 'queue' THEN j.queue ELSE j.kind END
                                AND coalesce(j.meta ->> u.field, '') = u.key)"""

# The limited claim, after the lock: every step in one statement, so the whole claim is one round trip
# (BEGIN, the lock, this, COMMIT, pipelined) whatever the limits. Its clock is clock_timestamp() read once
# (`clk`), after the lock, so the limits' counts and start times follow lock order. Each (scope, name, field,
# concurrency, rate spacing, rate tolerance) of the limits concerned is a row of `lim`; `use` has per limit and
# key ('' for an unkeyed limit, and for jobs without the key's field) the active jobs and, for a rate limit,
# `base`: the time of its next start (dygo_limit_pace; the clock when idle), with `wait`: NULL if it admits
# another job now, else the seconds until it may (CONCURRENCY_RECHECK for a full concurrency limit, a
# settle's NOTIFY may come first; for a rate limit, until its next start comes within RATE_HORIZON).
# The walk is CLAIM_JOBS's, skipping every (limit, key) with a wait (so one tenant's backlog does not hide
# another tenant's jobs), from the queue's walk start as CLAIM_JOBS's walk (the producer starts at the head after
# a claim a limit held back: what it left may sit anywhere in line); an unkeyed queue concurrency limit caps the
# walk itself (no point locking rows it cannot admit; a settle of a job it counts wakes the queue; a capped walk
# is a `held` row, as the limit is then reached). A rate limit does not: the rows
# it refuses tell the queue when to claim again. Each candidate gets its rank among the candidates of each
# limit and key that applies, in claim order, and its queue position: beyond the queue's %(free)s slots it is
# claimed ahead (it waits in the worker for a slot). A limit keeps a candidate when:
# * concurrency: its rank plus the active jobs is within the limit, within half of it for a job claimed ahead
#   (claiming ahead never takes the room other workers' free slots could use);
# * rate (GCRA): its start time, base + (rank - 1) x spacing - tolerance (no earlier than the clock), falls
#   within RATE_HORIZON; the job's handler starts at the latest of its rates' start times (`start_in`).
# Ranks count candidates another limit refused: the claim may take fewer than it could, never more; the queue
# then gets a `held` row (0: claim again at once). The kept rows are claimed by CLAIM_JOBS's UPDATE; each rate
# limit and key moves its next start past the last rank claimed (one row, dygo_limit_pace) and gets one
# start-log row with its count (what the API reports as starts in the window). The rows returned are
# CLAIM_JOBS's, plus one per queue a limit held back (`held_for`, the seconds until worth claiming again).
CLAIM_LIMITED = (
    """
WITH clk AS MATERIALIZED (
    SELECT clock_timestamp() AS now
), lim AS MATERIALIZED (
    SELECT * FROM unnest(%(scopes)s::text[], %(names)s::text[], %(fields)s::text[], %(concurrency)s::integer[],
                         %(rate_spacings)s::float8[], %(rate_tolerances)s::float8[])
        WITH ORDINALITY AS l(scope, name, field, conc, gap, tol, li)
), active AS (
    SELECT l.li, coalesce(j.meta ->> l.field, '') AS key, count(*)::integer AS n
    FROM lim l JOIN dygo_jobs j ON j.state = 'active'
                               AND l.name = CASE l.scope WHEN 'queue' THEN j.queue ELSE j.kind END
    WHERE l.conc IS NOT NULL
    GROUP BY 1, 2
), paced AS (
    SELECT l.li, p.key, p.next_at
    FROM lim l JOIN dygo_limit_pace p ON p.scope = l.scope AND p.name = l.name AND p.next_at > (SELECT now FROM clk)
    WHERE l.gap IS NOT NULL
), use AS MATERIALIZED (
    SELECT l.li, l.scope, l.name, l.field, coalesce(a.key, p.key) AS key, coalesce(a.n, 0) AS active,
           coalesce(p.next_at, c.now) AS base,
           greatest(CASE WHEN a.n >= l.conc THEN %(recheck)s::float8 END,
                    CASE WHEN extract(epoch FROM p.next_at - c.now) - l.tol > %(horizon)s
                         THEN extract(epoch FROM p.next_at - c.now)::float8 - l.tol - %(horizon)s + 0.001 END) AS wait
    FROM active a FULL JOIN paced p ON p.li = a.li AND p.key = a.key
    JOIN lim l ON l.li = coalesce(a.li, p.li) CROSS JOIN clk c
), w AS (
    SELECT w.queue, w.free, w.slots AS wanted, greatest(least(w.slots, (
        SELECT min(l.conc - coalesce(u.active, 0)) FROM lim l LEFT JOIN use u ON u.li = l.li AND u.key = ''
        WHERE l.scope = 'queue' AND l.field IS NULL AND l.name = w.queue)), 0) AS slots
    FROM unnest(%(queues)s::text[], %(slots)s::integer[], %(free)s::integer[]) AS w(queue, slots, free)
), cand AS MATERIALIZED (
    SELECT p.* FROM w """
    + _ready_walk("id, kind, queue, meta, priority, run_at", "w.slots", LIMITS_HOLD_NONE)
    + """    WHERE w.slots > 0
), placed AS (
    SELECT c.*, row_number() OVER (PARTITION BY c.queue ORDER BY c.priority DESC, c.run_at, c.id) > w.free AS ahead
    FROM cand c JOIN w ON w.queue = c.queue
), ranked AS (
    SELECT c.id, c.queue, c.ahead, l.li, coalesce(c.meta ->> l.field, '') AS key,
           row_number() OVER (PARTITION BY l.li, coalesce(c.meta ->> l.field, '')
                              ORDER BY c.priority DESC, c.run_at, c.id) AS rn
    FROM placed c JOIN lim l ON l.name = CASE l.scope WHEN 'queue' THEN c.queue ELSE c.kind END
), slotted AS (
    SELECT r.*, l.scope, l.name, l.conc, l.gap, coalesce(u.active, 0) AS active, coalesce(u.base, k.now) AS base,
           CASE WHEN l.gap IS NOT NULL THEN greatest(
               coalesce(u.base, k.now) + make_interval(secs => (r.rn - 1) * l.gap - l.tol), k.now) END AS start_at,
           CASE WHEN l.gap IS NOT NULL THEN extract(epoch FROM k.now - now())::float8 + greatest(
               extract(epoch FROM coalesce(u.base, k.now) - k.now)::float8 + (r.rn - 1) * l.gap - l.tol, 0) END
               AS start_in
    FROM ranked r JOIN lim l ON l.li = r.li LEFT JOIN use u ON u.li = r.li AND u.key = r.key CROSS JOIN clk k
), refusals AS (
    SELECT s.id, s.queue, CASE WHEN s.rn + s.active > s.conc AND NOT s.ahead THEN 0::float8
                               ELSE %(recheck)s::float8 END AS wait
    FROM slotted s WHERE s.rn + s.active > CASE WHEN s.ahead THEN s.conc / 2 ELSE s.conc END
    UNION ALL
    SELECT s.id, s.queue, extract(epoch FROM s.start_at - k.now)::float8 - %(horizon)s + 0.001
    FROM slotted s CROSS JOIN clk k WHERE s.start_at > k.now + make_interval(secs => %(horizon)s)
), kept AS (
    -- This worker's per-kind caps (worker/capacity.py): no more of a kind than its free slots.
    SELECT r.id FROM (
        SELECT c.id, c.kind, row_number() OVER (PARTITION BY c.kind ORDER BY c.priority DESC, c.run_at, c.id) AS n
        FROM cand c WHERE c.id NOT IN (SELECT id FROM refusals)
    ) AS r LEFT JOIN unnest(%(cap_kinds)s::text[], %(cap_free)s::integer[]) AS k(kind, free) ON k.kind = r.kind
    WHERE k.free IS NULL OR r.n <= k.free
), claimed AS (
    UPDATE dygo_jobs AS j
    SET state = 'active', attempt = j.attempt + 1, started_at = now(),
        -- Unset at enqueue: the kind's registered max_attempts in this worker, else the configured default.
        max_attempts = coalesce(j.max_attempts, (%(kind_attempts)s::jsonb ->> j.kind)::integer, %(max_attempts)s),
        lease_owner = %(owner)s, lease_token = gen_random_uuid(),
        lease_deadline = now() + make_interval(secs => %(ttl)s)
    WHERE j.id = ANY(ARRAY(SELECT id FROM kept))
    RETURNING j.id, j.kind, j.queue, j.args, j.meta, j.attempt, j.max_attempts, j.enqueued_at, j.node_id,
              j.lease_token, j.priority, j.run_at
), rated AS (
    SELECT s.scope, s.name, s.key, s.base, s.gap, max(s.rn) AS last, count(*) AS n
    FROM slotted s JOIN claimed c ON c.id = s.id WHERE s.gap IS NOT NULL
    GROUP BY 1, 2, 3, 4, 5
), moved AS (
    INSERT INTO dygo_limit_pace AS p (scope, name, key, next_at)
    SELECT scope, name, key, base + make_interval(secs => last * gap) FROM rated
    ON CONFLICT (scope, name, key) DO UPDATE SET next_at = excluded.next_at
), logged AS (
    INSERT INTO dygo_limit_starts (scope, name, key, at, n)
    SELECT r.scope, r.name, r.key, k.now, r.n FROM rated r CROSS JOIN clk k
), next_due AS (
    SELECT w.queue, extract(epoch FROM n.run_at - now())::float8 AS due_in
    FROM unnest(%(queues)s::text[], %(slots)s::integer[]) AS w(queue, slots)
    """
    + _NEXT_DUE
    + """    WHERE n.run_at IS NOT NULL AND w.slots > (SELECT count(*) FROM claimed c WHERE c.queue = w.queue)
), held AS (
    SELECT w.queue, min(u.wait) AS wait FROM unnest(%(queues)s::text[]) AS w(queue)
    JOIN use u ON u.wait IS NOT NULL AND (u.scope = 'kind' OR u.name = w.queue)
    GROUP BY 1
    UNION ALL
    SELECT queue, min(wait) FROM refusals GROUP BY 1
    UNION ALL
    SELECT queue, %(recheck)s::float8 FROM w WHERE slots < wanted
)
SELECT id, kind, queue, args, nullif(meta, '{}'::jsonb) AS meta, attempt, max_attempts, enqueued_at,
       lease_token::text AS lease_token, extract(epoch FROM now() - greatest(run_at, enqueued_at))::float8 AS waited,
       NULL::float8 AS due_in, NULL::float8 AS held_for, extract(epoch FROM now())::float8 AS clock, priority,
       extract(epoch FROM run_at)::float8 AS run_at, node_id,
       rated_start.start_in
FROM claimed LEFT JOIN (
    SELECT id, max(start_in) AS start_in FROM slotted WHERE start_in IS NOT NULL GROUP BY id
) AS rated_start USING (id)
UNION ALL
SELECT NULL, NULL, queue, NULL, NULL, NULL, NULL, NULL, NULL, NULL, due_in, NULL, extract(epoch FROM now())::float8,
       NULL, NULL, NULL, NULL FROM next_due
UNION ALL
SELECT NULL, NULL, queue, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, wait, extract(epoch FROM now())::float8,
       NULL, NULL, NULL, NULL FROM held
ORDER BY priority DESC NULLS LAST, run_at, id"""
)

# The limited claim when each limit concerned is a queue's own, unkeyed (a queue's safety cap, the rate of the
# API its jobs call): the same rules as CLAIM_LIMITED's, which then come down to one number per queue, known
# before the walk. One statement, with no pipeline around it: the limits' locks and the use read under them are
# dygo_queue_limits_use's (migration 0019), whose own snapshot counts every claim committed while it waited for
# the locks; the walk's older snapshot is safe (a row another claim took since is rechecked when locked, and is
# no longer pending). Its walk is CLAIM_JOBS's, capped at what the queue's limit admits (`cap`, least of):
# * concurrency: its free slots while the active jobs stay within the limit, and jobs claimed ahead while they
#   stay within half of it (CLAIM_LIMITED's ranks, which here admit a prefix of the walk);
# * rate: the ranks whose start time, base + (rank - 1) x spacing - tolerance, falls within RATE_HORIZON.
# A walk the cap stopped short of what the queue wanted is a `held` row: for a full concurrency limit,
# CONCURRENCY_RECHECK (a settle's NOTIFY may come first); for a rate, until its next start comes within the
# horizon. Each rated queue moves its next start past what it took and logs one start-log row. A plan of a few
# nodes, where CLAIM_LIMITED's per-limit ranks cost a claim its own price again.
CLAIM_QUEUE_LIMITED = (
    """
WITH use AS MATERIALIZED (
    SELECT * FROM dygo_queue_limits_use(%(keys)s::bigint[], %(queues)s::text[],
                                        %(counted)s::boolean[], %(rated)s::boolean[])
), w AS MATERIALIZED (
    SELECT w.queue, w.wanted, w.gap, w.tol, u.clock AS now, greatest(u.next_at, u.clock) AS base,
           CASE WHEN w.conc IS NOT NULL
                THEN greatest(least(w.free, w.conc - u.active), least(w.wanted, w.conc / 2 - u.active)) END
               AS by_concurrency,
           floor((%(horizon)s + w.tol - extract(epoch FROM greatest(u.next_at, u.clock) - u.clock)) / w.gap)::bigint
               + 1 AS by_rate
    FROM unnest(%(queues)s::text[], %(slots)s::integer[], %(free)s::integer[],
                %(concurrency)s::integer[], %(rate_spacings)s::float8[], %(rate_tolerances)s::float8[])
        AS w(queue, wanted, free, conc, gap, tol)
    JOIN use u ON u.queue = w.queue
), capped AS (
    SELECT w.*, greatest(least(w.wanted, w.by_concurrency, w.by_rate), 0)::integer AS cap FROM w
), picked AS (
    SELECT p.id, p.kind, p.priority, p.run_at
    FROM capped w """
    + _ready_walk("id, kind, priority, run_at", "w.cap")
    + """), kept AS (
    SELECT id FROM picked
), claimed AS (
    UPDATE dygo_jobs AS j
    SET state = 'active', attempt = j.attempt + 1, started_at = now(),
        -- Unset at enqueue: the kind's registered max_attempts in this worker, else the configured default.
        max_attempts = coalesce(j.max_attempts, (%(kind_attempts)s::jsonb ->> j.kind)::integer, %(max_attempts)s),
        lease_owner = %(owner)s, lease_token = gen_random_uuid(),
        lease_deadline = now() + make_interval(secs => %(ttl)s)
    WHERE j.id = ANY(ARRAY(SELECT id FROM kept))
    RETURNING j.id, j.kind, j.queue, j.args, j.meta, j.attempt, j.max_attempts, j.enqueued_at, j.node_id,
              j.lease_token, j.priority, j.run_at
), ranked AS (
    SELECT c.*, row_number() OVER (PARTITION BY c.queue ORDER BY c.priority DESC, c.run_at, c.id) AS rn
    FROM claimed c
), taken AS (
    SELECT w.*, (SELECT count(*) FROM claimed c WHERE c.queue = w.queue)::integer AS n FROM capped w
), moved AS (
    INSERT INTO dygo_limit_pace AS p (scope, name, key, next_at)
    SELECT 'queue', queue, '', base + make_interval(secs => n * gap) FROM taken WHERE gap IS NOT NULL AND n > 0
    ON CONFLICT (scope, name, key) DO UPDATE SET next_at = excluded.next_at
), logged AS (
    INSERT INTO dygo_limit_starts (scope, name, key, at, n)
    SELECT 'queue', queue, '', now, n FROM taken WHERE gap IS NOT NULL AND n > 0
), next_due AS (
    SELECT w.queue, extract(epoch FROM n.run_at - now())::float8 AS due_in
    FROM taken w
    """
    + _NEXT_DUE
    + """    WHERE n.run_at IS NOT NULL AND w.n < w.cap
), held AS (
    SELECT queue, greatest(
        CASE WHEN by_concurrency <= cap THEN %(recheck)s::float8 END,
        CASE WHEN by_rate <= cap
             THEN extract(epoch FROM base - now)::float8 + n * gap - tol - %(horizon)s + 0.001 END) AS wait
    FROM taken WHERE n = cap AND cap < wanted
)
SELECT id, kind, queue, args, nullif(meta, '{}'::jsonb) AS meta, attempt, max_attempts, enqueued_at,
       lease_token::text AS lease_token, extract(epoch FROM now() - greatest(run_at, enqueued_at))::float8 AS waited,
       NULL::float8 AS due_in, NULL::float8 AS held_for, extract(epoch FROM now())::float8 AS clock, priority,
       extract(epoch FROM run_at)::float8 AS run_at, node_id,
       CASE WHEN t.gap IS NOT NULL THEN extract(epoch FROM t.now - now())::float8
           + greatest(extract(epoch FROM t.base - t.now)::float8 + (r.rn - 1) * t.gap - t.tol, 0) END AS start_in
FROM ranked r JOIN taken t USING (queue)
UNION ALL
SELECT NULL, NULL, queue, NULL, NULL, NULL, NULL, NULL, NULL, NULL, due_in, NULL, extract(epoch FROM now())::float8,
       NULL, NULL, NULL, NULL FROM next_due
UNION ALL
SELECT NULL, NULL, queue, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, wait, extract(epoch FROM now())::float8,
       NULL, NULL, NULL, NULL FROM held
ORDER BY priority DESC NULLS LAST, run_at, id"""
)


# --- The claim's transaction and session settings ------------------------------------------------

# A claim's own transaction, in one statement: sequential scans priced out (as by INDEX_SCANS_ONLY), a commit
# that does not wait for the WAL flush, and one generic plan for the prepared claim rather than a custom plan
# per call (what the server would otherwise pick for it: a plan per call is the planning the prepare is there
# to save). All three end with the transaction.
CLAIM_SETTINGS = (
    "SELECT set_config('enable_seqscan', 'off', true), set_config('synchronous_commit', 'off', true), "
    "set_config('plan_cache_mode', 'force_generic_plan', true)"
)
# The same three settings for a whole session, and LIMITED_SETTINGS' fourth (the plain claims walk the index
# either way): the worker's own claim connection, when it goes straight to
# PostgreSQL (through a transaction pooler a session is not the worker's, and nothing is prepared there). Its
# claims are then one statement each, with no pipeline around them. Every claim on it commits without waiting
# for the flush, a limited claim too: what a server crash loses is the whole claim, its start-log rows with
# it, so its jobs are pending again.
CLAIM_SESSION = (
    "SELECT set_config('enable_seqscan', 'off', false), set_config('synchronous_commit', 'off', false), "
    "set_config('plan_cache_mode', 'force_generic_plan', false), set_config('enable_bitmapscan', 'off', false)"
)
# The limited claim's transaction: CLAIM_SETTINGS, and no bitmap scans (a claim session has them all). Its one
# generic plan knows neither the queue nor how many jobs the limits admit, and would otherwise fetch every ready
# job of the queue through a bitmap of the ready index and sort them all, at every claim (a cost that grows with
# the backlog); with the bitmap scan priced out it walks the ready index in claim order and stops at the claim's
# size, as CLAIM_JOBS.
LIMITED_SETTINGS = CLAIM_SETTINGS + ", set_config('enable_bitmapscan', 'off', true)"
_claim_sessions: weakref.WeakSet[psycopg.AsyncConnection[Any]] = weakref.WeakSet()


async def claim_session(conn: psycopg.AsyncConnection[Any]) -> None:
    """Make `conn` (a connection of its own, kept for claims) a claim session: the jobs' arguments load faster
    and, unless it goes through a transaction pooler, claims on it skip the per-transaction settings."""
    set_json_loads(load_json, conn)
    if through_transaction_pooler():
        return
    await conn.execute(CLAIM_SESSION)
    _claim_sessions.add(conn)


# --- Where a walk starts -------------------------------------------------------------------------

# The bounds of the priorities a segment may hold: every integer a job row can have.
TOP_PRIORITY, BOTTOM_PRIORITY = 2**31 - 1, -(2**31)
# From this server version on, a btree scan seeks a run_at bound within each priority by itself (skip scan), so
# a walk from a start is one segment; before it, one segment per known priority.
SKIP_SCAN_SERVER = 180000


@dataclass(frozen=True, slots=True)
class WalkStart:
    """Where a queue's walk of the ready index starts: at `run_at` within each of `priorities` (those its
    claims have met), at the head within any other priority."""

    run_at: datetime
    priorities: frozenset[int]


def walk_segments(queues: list[str], starts: Mapping[str, WalkStart], skip_scan: bool = False) -> dict[str, str]:
    """The claim statements' segments of the queues' walks (`walk_queues`, `walk_tops`, `walk_bottoms`,
    `walk_since`), each queue's in walk order: highest priorities first. A queue without a start is one
    segment, from the head; so is one with a start on a server with a skip scan (`skip_scan`), from its
    run_at in every priority."""
    rows: list[tuple[str, int, int, datetime | None]] = []
    for queue in queues:
        start = starts.get(queue)
        if start is None or skip_scan:
            rows.append((queue, TOP_PRIORITY, BOTTOM_PRIORITY, start.run_at if start else None))
            continue
        top = TOP_PRIORITY
        for priority in sorted(start.priorities, reverse=True):
            if priority < top:
                rows.append((queue, top, priority + 1, None))
            rows.append((queue, priority, priority, start.run_at))
            top = priority - 1
        if top >= BOTTOM_PRIORITY:
            rows.append((queue, top, BOTTOM_PRIORITY, None))
    return {
        "walk_queues": array(row[0] for row in rows),
        "walk_tops": array(row[1] for row in rows),
        "walk_bottoms": array(row[2] for row in rows),
        "walk_since": array(row[3] for row in rows),
    }


# --- The rows ------------------------------------------------------------------------------------


class ClaimRow(NamedTuple):
    """A row of a claim statement, its columns by name: a claimed job (`id` set), or a note on a queue (`id`
    NULL: only `queue`, `clock` and `due_in` or `held_for` are set)."""

    id: int | None
    kind: str
    queue: str
    args: dict[str, Any]
    meta: dict[str, str] | None  # NULL when empty
    attempt: int
    max_attempts: int
    enqueued_at: datetime
    lease_token: str
    waited: float  # seconds from due to claim
    due_in: float | None  # a queue that came back short: seconds until its next scheduled job (NULL: none)
    held_for: float | None  # a queue a limit held back: seconds until worth claiming again (0: at once)
    clock: float  # the statement's now(), epoch seconds
    priority: int
    run_at: float  # epoch seconds
    node_id: int | None  # its workflow node (store/workflows.py); NULL for a plain job
    # A rate-limited job: seconds from the claim transaction's start (now(), about when the worker sent it: a
    # reading of no clock but the worker's own, whatever the claim waited for) to the job's start time.
    start_in: float | None


_COLUMNS = [name.encode() for name in ClaimRow._fields]
# A ClaimRow from a row's values, made in C (ClaimRow._make is a Python call per row): the column names and
# their number are checked once per result, by claim_rows.
_make_claim_row = cast("RowMaker[ClaimRow]", partial(tuple.__new__, ClaimRow))


def claim_rows(cursor: psycopg.AsyncCursor[Any]) -> RowMaker[ClaimRow]:
    """The psycopg row factory of a claim statement: each row a ClaimRow. The columns are checked by name
    once per result, so a statement whose columns drift from ClaimRow's fails at once rather than being
    read wrong."""
    result = cursor.pgresult
    if result is None or result.nfields == 0:
        return no_result
    names = [result.fname(i) for i in range(result.nfields)]
    if names != _COLUMNS:
        raise TypeError(f"a claim statement returned the columns {names}, not ClaimRow's {_COLUMNS}")
    return _make_claim_row


# --- The claim -----------------------------------------------------------------------------------


@dataclass(slots=True)
class Claim:
    """What one claim took, and what it learnt about the queues it claimed for."""

    jobs: list[ClaimedJob]  # in claim order
    due_in: dict[str, float]  # queue -> seconds until its next scheduled job, for queues that came back short
    clock: datetime | None = None  # the database's now() for the claim (None: nothing was claimed for)
    # Queues a cluster-wide limit held back: seconds until worth claiming again (0: at once, there may be jobs
    # of other keys or kinds ready).
    held_back: dict[str, float] = field(default_factory=dict)
    # Queue -> run_at of the last job claimed for it (in claim order): where a backlog's next walk may start.
    last_run_at: dict[str, datetime] = field(default_factory=dict)
    # Queue -> the priorities of the jobs claimed for it: those its walks may start past the head within.
    priorities: dict[str, set[int]] = field(default_factory=dict)
    # A cluster-wide limit concerned the claim: it counts claimed jobs as running, and may leave due jobs
    # behind in a queue it held back (`held_back`).
    under_limit: bool = False


async def claim_jobs(
    conn: psycopg.AsyncConnection[Any],
    slots: Mapping[str, int],
    owner: str,
    ttl: float,
    jobs: Registry | None = None,
    starts: Mapping[str, WalkStart] | None = None,
    kind_free: Mapping[str, int] | None = None,
    free: Mapping[str, int] | None = None,
) -> Claim:
    """Claim up to slots[queue] ready jobs of each queue, leased to `owner` for `ttl` seconds, in claim order,
    without exceeding any cluster-wide limit in force nor this worker's per-kind caps, and learn in the same
    statement when the next scheduled job of each queue that came back short is due.

    A job enqueued without max_attempts gets it here, durably: its kind's in `jobs` (default: the process's
    registry, the one `load_jobs` filled), else the default. A queue's walk starts at its WalkStart in `starts`,
    if any (the producer's way past the entries of claimed jobs a held snapshot keeps), else at the head.
    `kind_free`: the capped kinds' free slots in this worker; the claim takes
    no more of a kind than that, and skips a kind with none. `free`: each queue's free slots (default: all it
    wants); under a limit, the jobs beyond them are claimed ahead and admitted only where the limit has room to
    spare (CLAIM_LIMITED)."""
    wanted = {queue: n for queue, n in slots.items() if n > 0}
    if not wanted:
        return Claim([], {})
    registered = jobs or registry
    concerned = [r for r in await limits.current(conn) if r.scope == "kind" or r.name in wanted]
    sent = time.monotonic()
    if concerned:
        free_slots = {queue: min(n, (free or wanted).get(queue, n)) for queue, n in wanted.items()}
        rows = await _claim_limited(
            conn, wanted, free_slots, owner, ttl, registered, concerned, starts or {}, kind_free or {}
        )
    else:
        rows = await _claim_plain(conn, wanted, owner, ttl, registered, starts or {}, kind_free or {})
    claim = _parse(rows, under_limit=bool(concerned), sent=sent)
    await _read_workflow_deps(conn, claim.jobs)
    return claim


async def queues_with_jobs_behind(conn: psycopg.AsyncConnection[Any], since: Mapping[str, datetime]) -> set[str]:
    """The queues of `since` (queue -> where its walk starts) with a ready job before that start (JOBS_BEHIND):
    their next claim should walk from the head."""
    if not since:
        return set()
    params = {"queues": list(since), "since": list(since.values())}
    return {row[0] for row in await (await leases.on_indexes(conn, JOBS_BEHIND, params)).fetchall()}


async def _read_workflow_deps(conn: psycopg.AsyncConnection[Any], jobs: list[ClaimedJob]) -> None:
    """Tell each claimed job of a workflow its node and what its upstream nodes gave (`ctx.deps`): one more
    round trip for a claim that took any, none for plain jobs."""
    node_ids = [job.node_id for job in jobs if job.node_id is not None]
    if not node_ids:
        return
    found = await workflows.aread_deps(conn, node_ids)
    for job in jobs:
        if job.node_id in found:
            job.workflow, job.deps = found[job.node_id]


async def _claim_plain(
    conn: psycopg.AsyncConnection[Any],
    wanted: dict[str, int],
    owner: str,
    ttl: float,
    jobs: Registry,
    starts: Mapping[str, WalkStart],
    kind_free: Mapping[str, int],
) -> list[ClaimRow]:
    kind_attempts, default = jobs.max_attempts_at_claim()
    most = sum(wanted.values())  # a kind with this many free slots cannot be trimmed: leave it out
    trimmed = {kind: free for kind, free in kind_free.items() if 0 < free < most}
    params = {
        "queues": array(wanted),
        "slots": array(wanted.values()),
        "owner": owner,
        "ttl": ttl,
        "kind_attempts": kind_attempts,
        "max_attempts": default,
        "full_kinds": array(kind for kind, free in kind_free.items() if free <= 0),
        "cap_kinds": array(trimmed),
        "cap_free": array(trimmed.values()),
        **walk_segments(list(wanted), starts, skip_scan=conn.info.server_version >= SKIP_SCAN_SERVER),
    }
    return await _run_claim(conn, CLAIM_JOBS_CAPPED if trimmed else CLAIM_JOBS, params)


async def _run_claim(conn: psycopg.AsyncConnection[Any], statement: str, params: Mapping[str, Any]) -> list[ClaimRow]:
    """Run a claim that is one statement.

    In a transaction of its own (an idle autocommit connection: the worker's), the claim's commit does not
    wait for the WAL flush: a slot's claim does not wait on the disk. A claim lost in a server crash leaves
    its jobs pending, to run again: at-least-once, as a settle lost in a crash already does (the first run's
    settle is then fenced off). A settle's commit still waits: what it records (and notifies waiters of)
    must survive a crash. Inside a caller's transaction, its settings are left alone."""
    own = conn.autocommit and conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
    if own and conn in _claim_sessions:
        cursor = conn.cursor(row_factory=claim_rows)
        return await (await cursor.execute(statement, params)).fetchall()
    if own:
        return await _in_own_transaction(conn, statement, params)
    return await (await leases.on_indexes(conn, statement, params, claim_rows)).fetchall()


async def _in_own_transaction(
    conn: psycopg.AsyncConnection[Any], statement: str, params: Mapping[str, Any]
) -> list[ClaimRow]:
    """The claim and its settings in one pipeline: one round trip and one implicit transaction (its commit, at
    the pipeline's sync, does not wait for the WAL flush). Parameters are bound server-side, so psycopg
    prepares the claim like any statement it runs often (not through a transaction pooler: store/db.py), and
    the server plans it once, not on every call. Its one generic plan is made under CLAIM_SETTINGS, with
    sequential scans priced out, so a plan made while the table was empty or small still walks the indexes."""
    cursor = conn.cursor(row_factory=claim_rows)
    async with conn.pipeline():
        await conn.execute(CLAIM_SETTINGS)
        await cursor.execute(statement, params)
    return await cursor.fetchall()


async def _claim_limited(
    conn: psycopg.AsyncConnection[Any],
    wanted: dict[str, int],
    free: dict[str, int],
    owner: str,
    ttl: float,
    jobs: Registry,
    concerned: list[LimitRow],
    starts: Mapping[str, WalkStart],
    kind_free: Mapping[str, int],
) -> list[ClaimRow]:
    statement, params = limited_claim(
        wanted,
        free,
        owner,
        ttl,
        jobs,
        concerned,
        starts,
        kind_free,
        skip_scan=conn.info.server_version >= SKIP_SCAN_SERVER,
    )
    if statement is CLAIM_QUEUE_LIMITED:
        return await _run_claim(conn, statement, params)
    # CLAIM_LIMITED: one pipeline, one round trip; the lock is a statement of its own, so that the claim, a later
    # statement, takes its READ COMMITTED snapshot after the lock was granted and counts every claim
    # committed while this one waited for it. The commit need not wait for the WAL flush, as a plain
    # claim's (a claim lost in a crash leaves its jobs pending).
    cursor = conn.cursor(row_factory=claim_rows)
    try:
        async with conn.pipeline():
            await conn.execute(leases.BEGIN)
            if conn not in _claim_sessions:  # index walks only (LIMITED_SETTINGS), no wait for the flush
                await conn.execute(LIMITED_SETTINGS)
            await conn.execute(LOCK_LIMITS, {"keys": array(sorted(r.lock_key for r in concerned))})
            await cursor.execute(statement, params)
            await conn.execute(leases.COMMIT)
        return await cursor.fetchall()
    except BaseException:
        await aroll_back(conn)
        raise


def limited_claim(
    wanted: dict[str, int],
    free: dict[str, int],
    owner: str,
    ttl: float,
    jobs: Registry,
    concerned: list[LimitRow],
    starts: Mapping[str, WalkStart],
    kind_free: Mapping[str, int],
    general: bool = False,
    skip_scan: bool = False,
) -> tuple[str, dict[str, Any]]:
    """The statement of a claim under `concerned` limits and its parameters: CLAIM_QUEUE_LIMITED when every
    limit is a queue's own and unkeyed and no kind is capped in this worker, else (or with `general`)
    CLAIM_LIMITED. `skip_scan`: as walk_segments's."""
    kind_attempts, default = jobs.max_attempts_at_claim()
    params: dict[str, Any] = {
        "queues": array(wanted),
        "slots": array(wanted.values()),
        "free": array(free[queue] for queue in wanted),
        **walk_segments(list(wanted), starts, skip_scan),
        "owner": owner,
        "ttl": ttl,
        "kind_attempts": kind_attempts,
        "max_attempts": default,
        "recheck": CONCURRENCY_RECHECK,
        "horizon": RATE_HORIZON,
        "full_kinds": array(kind for kind, free in kind_free.items() if free <= 0),
    }
    capped = {kind: free for kind, free in kind_free.items() if free > 0}
    if not general and not capped and all(r.scope == "queue" and r.key is None for r in concerned):
        own = {r.name: r for r in concerned}
        return CLAIM_QUEUE_LIMITED, params | {
            "keys": array(sorted(r.lock_key for r in concerned)),
            "counted": array(q in own and own[q].concurrency_limit is not None for q in wanted),
            "rated": array(q in own and own[q].spacing is not None for q in wanted),
            "concurrency": array(own[q].concurrency_limit if q in own else None for q in wanted),
            "rate_spacings": array(own[q].spacing if q in own else None for q in wanted),
            "rate_tolerances": array(own[q].tolerance if q in own else None for q in wanted),
        }
    return CLAIM_LIMITED, params | {
        "scopes": array(r.scope for r in concerned),
        "names": array(r.name for r in concerned),
        "fields": array(r.key for r in concerned),
        "concurrency": array(r.concurrency_limit for r in concerned),
        "rate_spacings": array(r.spacing for r in concerned),
        "rate_tolerances": array(r.tolerance for r in concerned),
        "cap_kinds": array(capped),
        "cap_free": array(capped.values()),
    }


def _parse(rows: list[ClaimRow], under_limit: bool, sent: float) -> Claim:
    jobs: list[ClaimedJob] = []
    due_in: dict[str, float] = {}
    held_back: dict[str, float] = {}
    last_run_at: dict[str, float] = {}  # rows in claim order: the last one stays
    priorities: dict[str, set[int]] = {}
    held = {row.queue for row in rows if row.id is None and row.held_for is not None}
    for row in rows:
        if row.id is not None:
            jobs.append(
                ClaimedJob(
                    row.id,
                    row.kind,
                    row.queue,
                    row.args,
                    row.meta or {},
                    row.attempt,
                    row.max_attempts,
                    row.enqueued_at,
                    row.lease_token,
                    row.waited,
                    row.node_id,
                    not_before=sent + row.start_in if row.start_in is not None else None,
                    start_by=sent + row.start_in + START_SLACK
                    if row.start_in is not None and row.queue in held
                    else None,
                )
            )
            last_run_at[row.queue] = row.run_at
            priorities.setdefault(row.queue, set()).add(row.priority)
            continue
        if row.due_in is not None:
            due_in[row.queue] = row.due_in
        if row.held_for is not None:
            held_back[row.queue] = min(held_back.get(row.queue, row.held_for), row.held_for)
    return Claim(
        jobs,
        due_in,
        _timestamp(rows[0].clock) if rows else None,
        held_back=held_back,
        last_run_at={queue: _timestamp(run_at) for queue, run_at in last_run_at.items()},
        priorities=priorities,
        under_limit=under_limit,
    )


def _start_by(sent: float, start_in: float | None) -> float | None:
    """The latest start of a job whose rate limit is in use (it held the claim back): its start time plus the
    slack the spacing leaves (limits.START_SLACK)."""
    return None if start_in is None else sent + start_in + START_SLACK


def _timestamp(epoch: float) -> datetime:
    return datetime.fromtimestamp(epoch, UTC)
