"""The statements of store/testing.py: scratch databases for a project's tests, and jobs made due at once."""

# Retries, snoozes and sleeps wait out their delay as pending jobs with a later run_at and an attempt already
# spent or started; a job enqueued for later (attempt 0) keeps its run_at.
RUN_DELAYED_RUNS_NOW = """
UPDATE dygo_jobs SET run_at = now() WHERE state = 'pending' AND run_at > now() AND attempt > 0"""

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
