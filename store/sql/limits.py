"""Cluster-wide limits (dygo_limits): the limits in force, their sync from config/queues.yml, their use
for the API, changing one, and trimming the log of rate-limited starts.

Run by store/limits.py: every claim reads LIMITS through its cache; a worker syncs at start and trims in
its maintenance pass; the limits API (app/limits.py), the dashboard, GET /metrics and `dygo status` read
and change them. The claim's own statements under a limit (its locks, its counts, its start log) are in
store/claim.py.
"""

LIMITS = """
SELECT scope, name, key, concurrency_limit, rate_count, rate_window FROM dygo_limits
WHERE concurrency_limit IS NOT NULL OR rate_count IS NOT NULL"""

# Start-log rows older than their limit's window (every row of a limit no longer rated).
TRIM_STARTS = """
DELETE FROM dygo_limit_starts s
WHERE s.at < now() - make_interval(secs => coalesce(
    (SELECT max(rate_window) FROM dygo_limits l WHERE l.scope = s.scope AND l.name = s.name), 0))"""

# One statement per sync, safe when many workers start at once. For each declared limit: a new row,
# or, when the file's value differs from the one stored at the last sync, the file's value; otherwise
# the limit in force stays (a change made through the API survives restarts). A limit the file no
# longer declares is removed if it came from the file.
SYNC_LIMITS = """
WITH declared AS (
    SELECT * FROM unnest(%(scopes)s::text[], %(names)s::text[], %(keys)s::text[], %(concurrency)s::integer[],
                         %(rates)s::text[], %(counts)s::integer[], %(windows)s::float8[])
        AS d(scope, name, key, concurrency, rate, count, win)
), upserted AS (
    INSERT INTO dygo_limits AS l (scope, name, key, concurrency_limit, rate_count, rate_window,
                                  in_file, file_concurrency, file_rate, file_key)
    SELECT scope, name, key, concurrency, count, win, true, concurrency, rate, key FROM declared
    ON CONFLICT (scope, name) DO UPDATE SET
        concurrency_limit = CASE WHEN l.file_concurrency IS DISTINCT FROM excluded.file_concurrency
                                   OR NOT l.in_file THEN excluded.concurrency_limit ELSE l.concurrency_limit END,
        rate_count = CASE WHEN l.file_rate IS DISTINCT FROM excluded.file_rate OR NOT l.in_file
                          THEN excluded.rate_count ELSE l.rate_count END,
        rate_window = CASE WHEN l.file_rate IS DISTINCT FROM excluded.file_rate OR NOT l.in_file
                           THEN excluded.rate_window ELSE l.rate_window END,
        key = CASE WHEN l.file_key IS DISTINCT FROM excluded.file_key OR NOT l.in_file
                   THEN excluded.key ELSE l.key END,
        in_file = true, file_concurrency = excluded.file_concurrency, file_rate = excluded.file_rate,
        file_key = excluded.file_key,
        updated_at = CASE WHEN (l.file_concurrency, l.file_rate, l.file_key, l.in_file)
                               IS DISTINCT FROM (excluded.file_concurrency, excluded.file_rate, excluded.file_key, true)
                          THEN now() ELSE l.updated_at END
    RETURNING l.scope, l.name
)
DELETE FROM dygo_limits l
WHERE l.in_file AND NOT EXISTS (SELECT 1 FROM declared d WHERE d.scope = l.scope AND d.name = l.name)"""

# Each limit in force with its use per key: active jobs, starts in the window, ready pending jobs.
# For the API, the dashboard, /metrics and `dygo status` (not the claim: it counts under its lock).
USE_ALL = """
WITH l AS (
    SELECT scope, name, key, concurrency_limit, rate_count, rate_window FROM dygo_limits
    WHERE concurrency_limit IS NOT NULL OR rate_count IS NOT NULL
)
SELECT l.scope, l.name, l.key, l.concurrency_limit, l.rate_count, l.rate_window,
       coalesce((SELECT jsonb_object_agg(k, n) FROM (
           SELECT coalesce(j.meta ->> l.key, '') AS k, count(*) AS n FROM dygo_jobs j
           WHERE j.state = 'active' AND l.name = CASE l.scope WHEN 'queue' THEN j.queue ELSE j.kind END
           GROUP BY 1) a), '{}'::jsonb),
       coalesce((SELECT jsonb_object_agg(k, n) FROM (
           SELECT s.key AS k, sum(s.n) AS n FROM dygo_limit_starts s
           WHERE s.scope = l.scope AND s.name = l.name AND l.rate_window IS NOT NULL
             AND s.at > clock_timestamp() - make_interval(secs => l.rate_window)
           GROUP BY 1) r), '{}'::jsonb),
       coalesce((SELECT jsonb_object_agg(k, n) FROM (
           SELECT coalesce(j.meta ->> l.key, '') AS k, count(*) AS n FROM dygo_jobs j
           WHERE j.state = 'pending' AND j.run_at <= now()
             AND l.name = CASE l.scope WHEN 'queue' THEN j.queue ELSE j.kind END
           GROUP BY 1) p), '{}'::jsonb)
FROM l ORDER BY l.scope DESC, l.name"""

# A limit put in force now (NULL for both: no limit), kept over restarts until config/queues.yml's value
# for it changes (SYNC_LIMITS).
SET_LIMIT = """
INSERT INTO dygo_limits AS l (scope, name, key, concurrency_limit, rate_count, rate_window)
VALUES (%(scope)s, %(name)s, %(key)s, %(concurrency)s, %(count)s, %(window)s)
ON CONFLICT (scope, name) DO UPDATE SET
    concurrency_limit = excluded.concurrency_limit, rate_count = excluded.rate_count,
    rate_window = excluded.rate_window, key = excluded.key, updated_at = now()"""
