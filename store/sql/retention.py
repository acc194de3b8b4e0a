"""Retention: the worker's trims of old history, each a batch of at most %(batch)s rows (the succeeded
jobs' walk: a window of ids) that commits on its own.

Run by store/maintenance.py (worker/maintainer.py's retention pass), each batch in its own transaction
under RETENTION_LOCK and after sql/leases.py's INDEX_SCANS_ONLY: a trim deletes by id or walks an index.
Every trim locks its rows with SKIP LOCKED, so it never waits on a worker holding one, and returns how many
rows it deleted; the caller repeats it while batches come back full.
"""

# One worker of the cluster trims at a time: each batch takes this lock in its own short transaction
# (transaction-level, so it holds through PgBouncer's transaction pooling), and a pass that finds it
# taken stops; no batch holds row locks long, and the pass needs one connection, not two.
RETENTION_LOCK = "SELECT pg_try_advisory_xact_lock(hashtext('dygo.retention'))"

# One step of the walk over old succeeded jobs, served by the primary key (no index on the hot path):
# the %(window)s ids starting at the first job after %(after)s. Returns how many were deleted and
# where the next step starts, or NULL when that first job was enqueued inside the retention window
# (ids grow with time, so every later job is that recent too) or there is no job after %(after)s.
# A job finishes after it is enqueued, so no older succeeded job hides beyond that point. A child whose
# parent's step still waits is kept: that step's result is made from its row when the last child ends.
# `= ANY(ARRAY(...))` keeps the delete on the primary key whatever the statistics.
TRIM_SUCCEEDED_RANGE = """
WITH first AS (
    SELECT id, enqueued_at < now() - make_interval(secs => %(keep)s) AS old
    FROM dygo_jobs WHERE id > %(after)s ORDER BY id LIMIT 1
), doomed AS (
    SELECT id FROM dygo_jobs
    WHERE id >= (SELECT id FROM first WHERE old) AND id < (SELECT id FROM first WHERE old) + %(window)s
      AND state = 'succeeded' AND finished_at < now() - make_interval(secs => %(keep)s)
      AND (parent_id IS NULL OR NOT EXISTS (
          SELECT FROM dygo_steps s WHERE s.job_id = parent_id AND s.key = parent_step AND s.state = 'waiting'))
    FOR UPDATE SKIP LOCKED
), trimmed AS (
    DELETE FROM dygo_jobs WHERE id = ANY(ARRAY(SELECT id FROM doomed)) RETURNING 1
)
SELECT (SELECT count(*) FROM trimmed), (SELECT id + %(window)s - 1 FROM first WHERE old)"""

# Dead, then cancelled, then skipped jobs (a workflow's nodes that did not run: kept as long as cancelled
# ones) finished before the retention window, oldest ids first, from dygo_jobs_parked. The state is
# written out (not a parameter) so every plan can use that partial index.
TRIM_DEAD = """
WITH doomed AS (
    SELECT id FROM dygo_jobs
    WHERE state = 'dead' AND finished_at < now() - make_interval(secs => %(keep)s)
    ORDER BY id LIMIT %(batch)s FOR UPDATE SKIP LOCKED
), trimmed AS (
    DELETE FROM dygo_jobs WHERE id = ANY(ARRAY(SELECT id FROM doomed)) RETURNING 1
)
SELECT count(*) FROM trimmed"""
TRIM_CANCELLED = """
WITH doomed AS (
    SELECT id FROM dygo_jobs
    WHERE state = 'cancelled' AND finished_at < now() - make_interval(secs => %(keep)s)
    ORDER BY id LIMIT %(batch)s FOR UPDATE SKIP LOCKED
), trimmed AS (
    DELETE FROM dygo_jobs WHERE id = ANY(ARRAY(SELECT id FROM doomed)) RETURNING 1
)
SELECT count(*) FROM trimmed"""
TRIM_SKIPPED = """
WITH doomed AS (
    SELECT id FROM dygo_jobs
    WHERE state = 'skipped' AND finished_at < now() - make_interval(secs => %(keep)s)
    ORDER BY id LIMIT %(batch)s FOR UPDATE SKIP LOCKED
), trimmed AS (
    DELETE FROM dygo_jobs WHERE id = ANY(ARRAY(SELECT id FROM doomed)) RETURNING 1
)
SELECT count(*) FROM trimmed"""

# Finished workflows older than their retention, oldest first, with their nodes and edges (ON DELETE CASCADE);
# their jobs follow the retention of their own states.
TRIM_WORKFLOWS = """
WITH doomed AS (
    SELECT id FROM dygo_workflows
    WHERE state <> 'running' AND finished_at < now() - make_interval(secs => %(keep)s)
    ORDER BY id LIMIT %(batch)s FOR UPDATE SKIP LOCKED
), trimmed AS (
    DELETE FROM dygo_workflows WHERE id = ANY(ARRAY(SELECT id FROM doomed)) RETURNING 1
)
SELECT count(*) FROM trimmed"""

# Steps whose job is gone (retention, an operator or a purge deleted it: dygo_steps has no foreign key, see
# migration 0018). A pass that finds none reads every step row once, each with a probe of the jobs' primary
# key: a cost for those who use steps, none for a plain job.
TRIM_ORPHAN_STEPS = """
WITH doomed AS (
    SELECT s.job_id, s.key FROM dygo_steps s
    WHERE NOT EXISTS (SELECT FROM dygo_jobs j WHERE j.id = s.job_id)
    LIMIT %(batch)s FOR UPDATE OF s SKIP LOCKED
), trimmed AS (
    DELETE FROM dygo_steps s USING doomed d WHERE s.job_id = d.job_id AND s.key = d.key RETURNING 1
)
SELECT count(*) FROM trimmed"""

# Idempotency keys whose window has passed, oldest first: they no longer deduplicate anything (the enqueue
# takes them over).
TRIM_EXPIRED_KEYS = """
WITH doomed AS (
    SELECT key FROM dygo_idempotency_keys WHERE expires_at < now()
    ORDER BY expires_at LIMIT %(batch)s FOR UPDATE SKIP LOCKED
), trimmed AS (
    DELETE FROM dygo_idempotency_keys WHERE key = ANY(ARRAY(SELECT key FROM doomed)) RETURNING 1
)
SELECT count(*) FROM trimmed"""

# The rows of result waiters that died without deleting theirs (store/results.py), oldest first.
TRIM_EXPIRED_WAITERS = """
WITH doomed AS (
    SELECT id FROM dygo_result_waiters WHERE expires_at < now()
    ORDER BY expires_at LIMIT %(batch)s FOR UPDATE SKIP LOCKED
), trimmed AS (
    DELETE FROM dygo_result_waiters WHERE id = ANY(ARRAY(SELECT id FROM doomed)) RETURNING 1
)
SELECT count(*) FROM trimmed"""

# Daily stats of UTC days that ended before the retention window, oldest first.
TRIM_DAILY_STATS = """
WITH doomed AS (
    SELECT day, queue, kind FROM dygo_daily_stats
    WHERE day < ((now() - make_interval(secs => %(keep)s)) AT TIME ZONE 'UTC')::date
    ORDER BY day LIMIT %(batch)s FOR UPDATE SKIP LOCKED
), trimmed AS (
    DELETE FROM dygo_daily_stats s USING doomed d
    WHERE s.day = d.day AND s.queue = d.queue AND s.kind = d.kind RETURNING 1
)
SELECT count(*) FROM trimmed"""

# Minute rollups older than %(keep)s seconds, oldest first: the chart only shows the last hour.
TRIM_MINUTE_STATS = """
WITH doomed AS (
    SELECT minute, queue, kind FROM dygo_minute_stats
    WHERE minute < now() - make_interval(secs => %(keep)s)
    ORDER BY minute LIMIT %(batch)s FOR UPDATE SKIP LOCKED
), trimmed AS (
    DELETE FROM dygo_minute_stats s USING doomed d
    WHERE s.minute = d.minute AND s.queue = d.queue AND s.kind = d.kind RETURNING 1
)
SELECT count(*) FROM trimmed"""
