"""The admin's queue statements: the queue list with its counts, pause, resume, purge, and each queue's lag.

Run by store/admin.py (GET /api/v1/queues and its actions, the dashboard, `dygo status`; GET /metrics
reads QUEUE_LIST and QUEUE_LAG through it). A queue's dead jobs: sql/dead_jobs.py.
"""

# The queue list in one round trip, as rows tagged 'count' (queue, state, number), 'paused' (name,
# paused_at) and 'succeeded' (queue, number).
# The counts are instantaneous, each part read from a partial index: pending and scheduled from
# dygo_jobs_ready, active from dygo_jobs_leases (at most the workers' concurrency), dead, paused,
# cancelled, waiting and skipped from dygo_jobs_parked. Succeeded rows are history (kept for
# completed_retention, no index counts them), so the jobs each queue finished today (UTC) come from the
# stats rollups instead, like the throughput window: today's folded row plus the deltas not folded yet, a
# handful of small rows.
QUEUE_LIST = """
SELECT 'count', queue, state, number, NULL::timestamptz FROM (
SELECT queue, CASE WHEN run_at > now() THEN 'scheduled' ELSE 'pending' END, count(*)
FROM dygo_jobs WHERE state = 'pending' GROUP BY 1, 2
UNION ALL
SELECT queue, 'active', count(*) FROM dygo_jobs WHERE state = 'active' GROUP BY 1
UNION ALL
SELECT queue, state, count(*) FROM dygo_jobs WHERE state IN ('dead', 'paused', 'cancelled', 'waiting', 'skipped')
GROUP BY 1, 2) AS c(queue, state, number)
UNION ALL
SELECT 'paused', name, NULL, NULL, paused_at FROM dygo_queues WHERE paused
UNION ALL
SELECT 'succeeded', queue, NULL, number, NULL FROM (
SELECT queue, sum(succeeded)::bigint FROM (
    SELECT queue, succeeded FROM dygo_daily_stats WHERE day = (now() AT TIME ZONE 'UTC')::date
    UNION ALL
    SELECT queue, succeeded FROM dygo_stats_deltas WHERE day = (now() AT TIME ZONE 'UTC')::date) AS s
GROUP BY queue) AS s(queue, number)"""  # noqa: E501

PAUSE_QUEUE = """
INSERT INTO dygo_queues AS q (name, paused, paused_at) VALUES (%s, true, now())
ON CONFLICT (name) DO UPDATE SET paused = true, paused_at = CASE WHEN q.paused THEN q.paused_at ELSE now() END
RETURNING paused_at"""
# Resuming wakes the queue's workers at once (they were idling until their poll interval), with a run_at
# before every job (the epoch): the walks that passed while it was paused took none of them.
RESUME_QUEUE = """
WITH resumed AS (
    UPDATE dygo_queues SET paused = false, paused_at = NULL WHERE name = %s AND paused RETURNING name
)
SELECT pg_notify('dygo_jobs', name || ' 0') FROM resumed"""

# Pending, scheduled and dead jobs go; active ones belong to their workers and paused ones were
# parked on purpose, so both stay (and are reported).
PURGED = "queue = %(queue)s AND state IN ('pending', 'dead')"
PURGE_QUEUE = f"""
WITH purged AS (
    DELETE FROM dygo_jobs WHERE {PURGED}
    RETURNING CASE WHEN state = 'pending' AND run_at > now() THEN 'scheduled' ELSE state END AS state
)
SELECT count(*) FILTER (WHERE state = 'pending'), count(*) FILTER (WHERE state = 'scheduled'),
       count(*) FILTER (WHERE state = 'dead'),
       (SELECT count(*) FROM dygo_jobs WHERE queue = %(queue)s AND state = 'active'),
       (SELECT count(*) FROM dygo_jobs WHERE queue = %(queue)s AND state = 'paused')
FROM purged"""

# Per queue, the age of the oldest job that is due and not yet claimed (seconds since its run_at), from
# dygo_jobs_ready. Queues with no ready job are absent (/metrics reports 0 for them).
QUEUE_LAG = """
SELECT queue, extract(epoch FROM now() - min(run_at))::float8
FROM dygo_jobs WHERE state = 'pending' AND run_at <= now() GROUP BY queue"""
