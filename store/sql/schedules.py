"""Cron schedules: their sync from config/schedules.yml, firing them, and the admin's view and actions.

Run by store/schedules.py (a worker's sync at start and its scheduler, worker/scheduler.py; GET
/api/v1/schedules and its actions, the dashboard).
"""

# Two workers starting at once with different declarations (a rolling deploy) sync one after the other.
SCHEDULES_SYNC_LOCK = "SELECT pg_advisory_xact_lock(hashtext('dygo.schedules.sync'))"
DATABASE_NOW = "SELECT now()"
# `scheduled`: enabled with a next fire time; false makes the sync recompute it.
STORED_SCHEDULES = """
SELECT name, spec, timezone, kind, args, queue, priority, max_attempts, missed,
       enabled AND next_run_at IS NOT NULL AS scheduled
FROM dygo_schedules"""

INSERT_SCHEDULE = """
INSERT INTO dygo_schedules (name, spec, timezone, kind, args, queue, priority, max_attempts, missed, next_run_at)
VALUES (%(name)s, %(spec)s, %(timezone)s, %(kind)s, %(args)s, %(queue)s, %(priority)s,
        %(max_attempts)s, %(missed)s, %(next_run_at)s)
ON CONFLICT (name) DO NOTHING"""

# The next fire time is only recomputed when the timing changed, the schedule comes back after
# removal, or it has none: a worker restart must neither skip nor repeat an occurrence. (SET reads
# the old row.)
UPDATE_SCHEDULE_DEFINITION = """
UPDATE dygo_schedules
SET spec = %(spec)s, timezone = %(timezone)s, kind = %(kind)s, args = %(args)s, queue = %(queue)s,
    priority = %(priority)s, max_attempts = %(max_attempts)s, missed = %(missed)s, enabled = true,
    next_run_at = CASE WHEN spec <> %(spec)s OR timezone <> %(timezone)s OR NOT enabled OR next_run_at IS NULL
                       THEN %(next_run_at)s ELSE next_run_at END,
    updated_at = now()
WHERE name = %(name)s"""

# Removed declarations are disabled, not deleted, so their history (last fire, last job) stays.
DISABLE_UNDECLARED_SCHEDULES = """
UPDATE dygo_schedules SET enabled = false, updated_at = now()
WHERE enabled AND NOT (name = ANY(%s))
RETURNING name"""

# One due schedule, locked for the transaction that enqueues its job and advances it: any number of
# workers fire at once, each occurrence exactly once. `now` is the caller's clock in tests, else now().
LOCK_DUE_SCHEDULE = """
SELECT name, spec, timezone, kind, args, queue, priority, max_attempts, missed, next_run_at,
       coalesce(%(now)s::timestamptz, now())
FROM dygo_schedules
WHERE enabled AND NOT paused AND next_run_at <= coalesce(%(now)s::timestamptz, now())
ORDER BY next_run_at, name
LIMIT 1
FOR UPDATE SKIP LOCKED"""

ADVANCE_SCHEDULE = """
UPDATE dygo_schedules
SET next_run_at = %(next_run_at)s,
    last_run_at = CASE WHEN %(job_id)s::bigint IS NULL THEN last_run_at ELSE %(fired_at)s END,
    last_job_id = coalesce(%(job_id)s, last_job_id),
    updated_at = now()
WHERE name = %(name)s"""

# Seconds until the next schedule falls due, on the database clock (negative: due already).
SECONDS_TO_NEXT_FIRE = """
SELECT extract(epoch FROM min(next_run_at) - now())::float8 FROM dygo_schedules WHERE enabled AND NOT paused"""

# The channel the dygo_schedules triggers send a schedule's name to when it may fall due sooner.
LISTEN_FOR_SCHEDULES = "LISTEN dygo_schedules"

# A schedule as the API shows it, with the state of the last job it fired: the columns and the FROM of
# LIST_SCHEDULES and GET_SCHEDULE.
_SCHEDULE_COLUMNS = """s.name, s.spec, s.timezone, s.kind, s.args, s.queue, s.priority, s.max_attempts, s.missed,
    s.enabled, s.paused, s.next_run_at, s.last_run_at, s.last_job_id,
    CASE WHEN j.state = 'pending' AND j.run_at > now() THEN 'scheduled' ELSE j.state END AS last_job_state,
    s.created_at, s.updated_at
FROM dygo_schedules s LEFT JOIN dygo_jobs j ON j.id = s.last_job_id"""
LIST_SCHEDULES = f"SELECT {_SCHEDULE_COLUMNS} ORDER BY s.name"
GET_SCHEDULE = f"SELECT {_SCHEDULE_COLUMNS} WHERE s.name = %s"

# Waits for a worker that is firing this schedule, so a manual fire never interleaves with it.
LOCK_SCHEDULE = """
SELECT name, spec, timezone, kind, args, queue, priority, max_attempts, enabled, paused, now()
FROM dygo_schedules WHERE name = %s FOR UPDATE"""
PAUSE_SCHEDULE = "UPDATE dygo_schedules SET paused = true, updated_at = now() WHERE name = %s RETURNING name"
# Resuming starts from the next occurrence after now: the paused ones are not made up.
RESUME_SCHEDULE = """
UPDATE dygo_schedules SET paused = false, next_run_at = %(next_run_at)s, updated_at = now()
WHERE name = %(name)s AND paused"""
RECORD_MANUAL_FIRE = """
UPDATE dygo_schedules SET last_run_at = now(), last_job_id = %(job_id)s, updated_at = now() WHERE name = %(name)s"""
