"""Cluster-wide limits (dygo_limits): the limits in force, their sync from config/queues.yml, their use
for the API, changing one, and trimming the log of rate-limited starts.

Run by store/limits.py: every claim reads LIMITS through its cache; a worker syncs at start and trims in
its maintenance pass; the limits API (app/limits.py), the dashboard, GET /metrics and `dygo status` read
and change them. The claim's own statements under a limit (its locks, its counts, its start log) are in
store/claim.py.
"""

LIMITS = """
SELECT scope, name, key, concurrency_limit, rate_count, rate_window, rate_burst FROM dygo_limits
WHERE concurrency_limit IS NOT NULL OR rate_count IS NOT NULL"""

# Start-log rows older than their limit's window (every row of a limit no longer rated).
TRIM_STARTS = """
DELETE FROM dygo_limit_starts s
WHERE s.at < now() - make_interval(secs => coalesce(
    (SELECT max(rate_window) FROM dygo_limits l WHERE l.scope = s.scope AND l.name = s.name), 0))"""

# Pace rows whose next start passed a minute ago: an idle key's row says no more than no row (a claim reads only
# rows still to come), and a claim under the limit's lock writes it again when it starts a job of that key.
TRIM_PACE = """
DELETE FROM dygo_limit_pace WHERE next_at < now() - interval '1 minute'"""

# One statement per sync, safe when many workers start at once. For each declared limit: a new row,
# or, when the file's value differs from the one stored at the last sync, the file's value; otherwise
# the limit in force stays (a change made through the API survives restarts). A limit the file no
# longer declares is removed if it came from the file.
SYNC_LIMITS = """
WITH declared AS (
    SELECT * FROM unnest(%(scopes)s::text[], %(names)s::text[], %(keys)s::text[], %(concurrency)s::integer[],
                         %(rates)s::text[], %(counts)s::integer[], %(windows)s::float8[], %(bursts)s::integer[])
        AS d(scope, name, key, concurrency, rate, count, win, burst)
), upserted AS (
    INSERT INTO dygo_limits AS l (scope, name, key, concurrency_limit, rate_count, rate_window, rate_burst,
                                  in_file, file_concurrency, file_rate, file_key, file_burst)
    SELECT scope, name, key, concurrency, count, win, burst, true, concurrency, rate, key, burst FROM declared
    ON CONFLICT (scope, name) DO UPDATE SET
        concurrency_limit = CASE WHEN l.file_concurrency IS DISTINCT FROM excluded.file_concurrency
                                   OR NOT l.in_file THEN excluded.concurrency_limit ELSE l.concurrency_limit END,
        rate_count = CASE WHEN l.file_rate IS DISTINCT FROM excluded.file_rate OR NOT l.in_file
                          THEN excluded.rate_count ELSE l.rate_count END,
        rate_window = CASE WHEN l.file_rate IS DISTINCT FROM excluded.file_rate OR NOT l.in_file
                           THEN excluded.rate_window ELSE l.rate_window END,
        rate_burst = CASE WHEN l.file_burst IS DISTINCT FROM excluded.file_burst
                            OR l.file_rate IS DISTINCT FROM excluded.file_rate OR NOT l.in_file
                          THEN excluded.rate_burst ELSE l.rate_burst END,
        key = CASE WHEN l.file_key IS DISTINCT FROM excluded.file_key OR NOT l.in_file
                   THEN excluded.key ELSE l.key END,
        in_file = true, file_concurrency = excluded.file_concurrency, file_rate = excluded.file_rate,
        file_key = excluded.file_key, file_burst = excluded.file_burst,
        updated_at = CASE WHEN (l.file_concurrency, l.file_rate, l.file_key, l.file_burst, l.in_file)
                               IS DISTINCT FROM (excluded.file_concurrency, excluded.file_rate, excluded.file_key,
                                                 excluded.file_burst, true)
                          THEN now() ELSE l.updated_at END
    RETURNING l.scope, l.name
)
DELETE FROM dygo_limits l
WHERE l.in_file AND NOT EXISTS (SELECT 1 FROM declared d WHERE d.scope = l.scope AND d.name = l.name)"""

# Each limit in force with its use per key: active jobs, starts in the window, ready pending jobs.
# For the API, the dashboard, /metrics and `dygo status` (not the claim: it counts under its lock).
USE_ALL = """
WITH l AS (
    SELECT scope, name, key, concurrency_limit, rate_count, rate_window, rate_burst FROM dygo_limits
    WHERE concurrency_limit IS NOT NULL OR rate_count IS NOT NULL
)
SELECT l.scope, l.name, l.key, l.concurrency_limit, l.rate_count, l.rate_window, l.rate_burst,
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

# The limit in force on one queue or kind, locked until the change that reads it commits (LIMIT_FOR_CHANGE).
LIMIT_FOR_CHANGE = """
SELECT key, concurrency_limit, rate_count, rate_window, rate_burst FROM dygo_limits
WHERE scope = %(scope)s AND name = %(name)s FOR UPDATE"""

# A limit put in force now (NULL for all: no limit), kept over restarts until config/queues.yml's value
# for it changes (SYNC_LIMITS).
SET_LIMIT = """
INSERT INTO dygo_limits AS l (scope, name, key, concurrency_limit, rate_count, rate_window, rate_burst)
VALUES (%(scope)s, %(name)s, %(key)s, %(concurrency)s, %(count)s, %(window)s, %(burst)s)
ON CONFLICT (scope, name) DO UPDATE SET
    concurrency_limit = excluded.concurrency_limit, rate_count = excluded.rate_count,
    rate_window = excluded.rate_window, rate_burst = excluded.rate_burst, key = excluded.key, updated_at = now()"""
