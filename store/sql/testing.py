"""The statements of store/testing.py: scratch databases for a project's tests, and jobs made due at once."""

DATABASE_NOW = "SELECT now()"

# Retries, snoozes and sleeps wait out their delay as pending jobs with a later run_at that have started before
# (a snooze refunds its attempt, so the attempt may be 0); a job enqueued for later has not, and keeps its
# run_at. Those not due when `since` was read are made due now; one that fell due since then counts too, so a
# drain round that looked just before it did is followed by another.
RUN_DELAYED_RUNS_NOW = """
UPDATE dygo_jobs SET run_at = least(run_at, now())
WHERE state = 'pending' AND run_at > %(since)s AND started_at IS NOT NULL"""

# Every job, oldest first, as `enqueued()` shows them: the state a person reads ('scheduled': pending later).
ENQUEUED_JOBS = """
SELECT id, kind, queue, args, meta, priority, attempt, max_attempts, run_at, result, last_error,
       CASE WHEN state = 'pending' AND run_at > now() THEN 'scheduled' ELSE state END AS state
FROM dygo_jobs
WHERE (%(kind)s::text IS NULL OR kind = %(kind)s) AND (%(queue)s::text IS NULL OR queue = %(queue)s)
ORDER BY id"""

DATABASE_EXISTS = "SELECT 1 FROM pg_database WHERE datname = %s"
CREATE_DATABASE = "CREATE DATABASE {name}"
COPY_DATABASE = "CREATE DATABASE {name} TEMPLATE {template}"
DROP_DATABASE = "DROP DATABASE IF EXISTS {name} WITH (FORCE)"
