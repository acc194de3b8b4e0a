"""The admin's actions on one job (retry, cancel, pause, resume, run now, archive, delete), and `nuke`.

Run by store/admin.py (the API's and the dashboard's job actions, `dygo jobs`). Each action is one
statement whose WHERE holds the states it may start from, so a job that changed meanwhile is never
half-updated; no row back means unknown id or wrong state (JOB_STATE tells which). Each returns the job
as GET /api/v1/jobs/{id} shows it (JOB_COLUMNS).
"""

from dygo.store.sql.job_reads import JOB_COLUMNS

JOB_STATE = """
SELECT CASE WHEN state = 'pending' AND run_at > now() THEN 'scheduled' ELSE state END
FROM dygo_jobs WHERE id = %s"""

# Run first in an action's transaction: a job of a workflow is moved under its workflow's row, as the job
# triggers move it (migration 0017, dygo_lock_workflows); nothing for any other job.
LOCK_JOB_WORKFLOW = """
SELECT dygo_lock_workflows(ARRAY(SELECT node_id FROM dygo_jobs WHERE id = %(id)s AND node_id IS NOT NULL))"""
# The same for a statement that moves many jobs, those {jobs} selects: their workflows' rows first, then theirs.
LOCK_JOBS_WORKFLOWS = """
SELECT dygo_lock_workflows(ARRAY(SELECT DISTINCT node_id FROM dygo_jobs WHERE node_id IS NOT NULL AND {jobs}))"""

# What every retry sets (this one, and those of sql/dead_jobs.py and sql/bulk.py): pending now, with a fresh
# attempt budget; the error history is kept.
REVIVED = """state = 'pending', run_at = now(), attempt = 0, reap_count = 0,
    started_at = NULL, finished_at = NULL, result = NULL"""

# Dead or cancelled -> pending now (REVIVED).
RETRY_JOB = f"""
UPDATE dygo_jobs SET {REVIVED}
WHERE id = %(id)s AND state IN ('dead', 'cancelled') AND dygo_may_revive(node_id)
RETURNING {JOB_COLUMNS}"""

# A running handler cannot be stopped from here, so an active job is not cancellable.
CANCEL_JOB = f"""
UPDATE dygo_jobs SET state = 'cancelled', finished_at = now()
WHERE id = %(id)s AND state IN ('pending', 'paused', 'waiting')
RETURNING {JOB_COLUMNS}"""

PAUSE_JOB = f"""
UPDATE dygo_jobs SET state = 'paused' WHERE id = %(id)s AND state = 'pending'
RETURNING {JOB_COLUMNS}"""

# Back to pending with its run_at: due now, or still scheduled.
RESUME_JOB = f"""
UPDATE dygo_jobs SET state = 'pending' WHERE id = %(id)s AND state = 'paused'
RETURNING {JOB_COLUMNS}"""

# Scheduled (a delay, a retry backoff or a snooze) -> due now; the update trigger wakes workers.
RUN_JOB_NOW = f"""
UPDATE dygo_jobs SET run_at = now() WHERE id = %(id)s AND state = 'pending' AND run_at > now()
RETURNING {JOB_COLUMNS}"""

# Pending or scheduled -> dead without running, counted in the day's dead.
ARCHIVE_JOB = f"""
WITH archived AS (
    UPDATE dygo_jobs SET state = 'dead', finished_at = now(),
        last_error = 'archived by an operator before it ran',
        dead_fingerprint = dygo_error_fingerprint('archived by an operator before it ran')
    WHERE id = %(id)s AND state = 'pending'
    RETURNING *
), counted AS (
    INSERT INTO dygo_stats_deltas (day, queue, kind, dead)
    SELECT (now() AT TIME ZONE 'UTC')::date, queue, kind, 1 FROM archived
)
SELECT {JOB_COLUMNS} FROM archived"""

# An active job's row belongs to the worker running it. With a state, only a job in that state goes: one
# retried or resumed since the caller looked at it stays.
DELETE_JOB = """
DELETE FROM dygo_jobs WHERE id = %(id)s AND state <> 'active'
    AND (%(state)s::text IS NULL OR CASE WHEN state = 'pending' AND run_at > now() THEN 'scheduled' ELSE state END
                                    = %(state)s::text)
RETURNING id"""

# Development only (POST /api/v1/nuke, the caller checks): every job, workflow, idempotency key, stats row and
# queue pause.
# The jobs go first, in a statement of their own: their delete trigger counts the unfinished ones on their
# workflows' nodes, which must still be there (in one statement with the workflows' delete, that count
# would update nodes the cascade deletes: a foreign-key violation).
NUKE_JOBS = """
WITH jobs AS (DELETE FROM dygo_jobs RETURNING 1)
SELECT count(*) FROM jobs"""

NUKE = """
WITH workflows AS (DELETE FROM dygo_workflows RETURNING 1),
     steps AS (DELETE FROM dygo_steps RETURNING 1),
     events AS (DELETE FROM dygo_events RETURNING 1),
     keys AS (DELETE FROM dygo_idempotency_keys RETURNING 1),
     deltas AS (DELETE FROM dygo_stats_deltas RETURNING 1),
     daily AS (DELETE FROM dygo_daily_stats RETURNING 1),
     minutes AS (DELETE FROM dygo_minute_stats RETURNING 1),
     queues AS (DELETE FROM dygo_queues RETURNING 1)
SELECT (SELECT count(*) FROM keys),
       (SELECT count(*) FROM deltas) + (SELECT count(*) FROM daily) + (SELECT count(*) FROM minutes),
       (SELECT count(*) FROM queues)"""
