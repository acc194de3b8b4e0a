"""The stats rollups: enqueues (a trigger), settles, recoveries and archives append their counts to
dygo_stats_deltas, a fold moves them into the minute and daily rollups, and each read adds the deltas not
folded yet, so none reads job rows.

Run by store/admin.py (the fold, the daily and minute charts, the overview's failing kinds; the
worker's retention pass folds through it too) and store/metrics.py (METRICS_STAT_TOTALS).
"""

# One folder at a time (several `dygo serve` may run); the others skip and read the deltas too.
FOLD_STATS_LOCK = "SELECT pg_try_advisory_xact_lock(hashtext('dygo.stats.fold'))"
FOLD_STATS = """
WITH moved AS (DELETE FROM dygo_stats_deltas RETURNING *), minutes AS (
    INSERT INTO dygo_minute_stats AS m (minute, queue, kind, enqueued, succeeded, failed, dead, reaped)
    SELECT date_trunc('minute', at), queue, kind, sum(enqueued), sum(succeeded), sum(failed), sum(dead), sum(reaped)
    FROM moved GROUP BY 1, queue, kind
    ON CONFLICT (minute, queue, kind) DO UPDATE SET
        enqueued = m.enqueued + excluded.enqueued, succeeded = m.succeeded + excluded.succeeded,
        failed = m.failed + excluded.failed, dead = m.dead + excluded.dead, reaped = m.reaped + excluded.reaped
)
INSERT INTO dygo_daily_stats AS s (day, queue, kind, enqueued, succeeded, failed, dead, reaped)
SELECT day, queue, kind, sum(enqueued), sum(succeeded), sum(failed), sum(dead), sum(reaped)
FROM moved GROUP BY day, queue, kind
ON CONFLICT (day, queue, kind) DO UPDATE SET
    enqueued = s.enqueued + excluded.enqueued, succeeded = s.succeeded + excluded.succeeded,
    failed = s.failed + excluded.failed, dead = s.dead + excluded.dead, reaped = s.reaped + excluded.reaped"""

# The last %(days)s UTC days, oldest first, zero-filled; folded rows plus deltas not folded yet.
# A NULL queue means every queue.
DAILY_STATS = """
WITH days AS (
    SELECT d::date AS day FROM generate_series(
        (now() AT TIME ZONE 'UTC')::date - (%(days)s - 1), (now() AT TIME ZONE 'UTC')::date, interval '1 day') AS d
), counts AS (
    SELECT day, enqueued, succeeded, failed, dead, reaped FROM dygo_daily_stats
    WHERE day > (now() AT TIME ZONE 'UTC')::date - %(days)s AND (%(queue)s::text IS NULL OR queue = %(queue)s)
    UNION ALL
    SELECT day, enqueued, succeeded, failed, dead, reaped FROM dygo_stats_deltas
    WHERE day > (now() AT TIME ZONE 'UTC')::date - %(days)s AND (%(queue)s::text IS NULL OR queue = %(queue)s)
)
SELECT days.day, coalesce(sum(c.enqueued), 0)::bigint, coalesce(sum(c.succeeded), 0)::bigint,
       coalesce(sum(c.failed), 0)::bigint, coalesce(sum(c.dead), 0)::bigint, coalesce(sum(c.reaped), 0)::bigint
FROM days LEFT JOIN counts c USING (day)
GROUP BY days.day ORDER BY days.day"""

# The dashboard's per-minute throughput: the last %(minutes)s UTC minutes, oldest first, zero-filled, from
# the folded minute rollups plus the deltas not folded yet (each delta knows its minute). A few hundred
# small rows, never the jobs table.
MINUTE_STATS = """
WITH minutes AS (
    SELECT m AS minute FROM generate_series(
        date_trunc('minute', now()) - make_interval(mins => %(minutes)s - 1), date_trunc('minute', now()),
        interval '1 minute') AS m
), counts AS (
    SELECT minute, enqueued, succeeded, failed, dead, reaped FROM dygo_minute_stats
    WHERE minute > date_trunc('minute', now()) - make_interval(mins => %(minutes)s)
    UNION ALL
    SELECT date_trunc('minute', at), enqueued, succeeded, failed, dead, reaped FROM dygo_stats_deltas
    WHERE at >= date_trunc('minute', now()) - make_interval(mins => %(minutes)s - 1)
)
SELECT minutes.minute, coalesce(sum(c.enqueued), 0)::bigint, coalesce(sum(c.succeeded), 0)::bigint,
       coalesce(sum(c.failed), 0)::bigint, coalesce(sum(c.dead), 0)::bigint, coalesce(sum(c.reaped), 0)::bigint
FROM minutes LEFT JOIN counts c USING (minute)
GROUP BY minutes.minute ORDER BY minutes.minute"""

# The overview's kinds with the most dead jobs and failed attempts today and yesterday (UTC), from the
# folded daily stats plus the deltas not folded yet: a handful of small rows, never the jobs table.
FAILING_KINDS = """
WITH counts AS (
    SELECT kind, failed, dead FROM dygo_daily_stats WHERE day >= (now() AT TIME ZONE 'UTC')::date - 1
    UNION ALL
    SELECT kind, failed, dead FROM dygo_stats_deltas WHERE day >= (now() AT TIME ZONE 'UTC')::date - 1
)
SELECT kind, sum(dead)::bigint AS dead, sum(failed)::bigint AS failed FROM counts
GROUP BY kind HAVING sum(dead) + sum(failed) > 0
ORDER BY sum(dead) DESC, sum(failed) DESC, kind
LIMIT %(limit)s"""

# GET /metrics: per queue and kind, every day still kept in dygo_daily_stats plus the deltas not folded
# yet. Counters "since stats retention began" (trimming old days lowers them).
METRICS_STAT_TOTALS = """
SELECT queue, kind, sum(enqueued)::bigint, sum(succeeded)::bigint, sum(failed)::bigint,
       sum(dead)::bigint, sum(reaped)::bigint
FROM (SELECT queue, kind, enqueued, succeeded, failed, dead, reaped FROM dygo_daily_stats
      UNION ALL
      SELECT queue, kind, enqueued, succeeded, failed, dead, reaped FROM dygo_stats_deltas) AS s
GROUP BY queue, kind ORDER BY queue, kind"""

# How far a replica's data is behind its primary, in seconds: 0 when it has replayed all it received, else the
# age of the last transaction it replayed; NULL on a server that is not in recovery (DATABASE_READ_URL set to
# a primary or a copy). Run on serve's read connection (app/db.py), for the dashboard's notice.
REPLICA_LAG = """
SELECT CASE WHEN NOT pg_is_in_recovery() THEN NULL
            WHEN pg_last_wal_receive_lsn() IS NOT DISTINCT FROM pg_last_wal_replay_lsn() THEN 0.0
            ELSE extract(epoch FROM now() - pg_last_xact_replay_timestamp())::float8 END"""
