"""Durable steps: reading a job's recorded steps and recording one (store/steps.py runs them).

A step is recorded only by the run that holds the job's lease. The write takes the job's row FOR SHARE,
checked against the run's lease token, in the statement (or transaction) that inserts the step: a recovery
or a settle elsewhere that takes the lease away waits for it or has already made the check fail, so a run
that lost its lease records nothing.
"""

from dygo.store.sql.job_reads import JOB_COLUMNS

# Every step a job recorded, read once per run at its first step (the primary key serves it); a sleep (and
# an event wait with a timeout) comes with the seconds left until its wake time by the database's clock (0
# once it has passed), and a wait with its state.
STEPS_OF_JOB = """
SELECT key, seq, result::text, greatest(extract(epoch FROM wake_at - now()), 0)::float8 AS left_seconds, state
FROM dygo_steps WHERE job_id = %(job_id)s"""

# The same for the jobs whose first steps came together (store/steps.py StepReader): one query for all.
STEPS_OF_JOBS = """
SELECT job_id, key, seq, result::text, greatest(extract(epoch FROM wake_at - now()), 0)::float8 AS left_seconds,
       state
FROM dygo_steps WHERE job_id = ANY(%(job_ids)s::bigint[])"""

# The run's lease, held until the transaction ends: the check and the lock of a step's write.
LOCK_LEASE = """
SELECT 1 FROM dygo_jobs
WHERE id = %(job_id)s AND lease_token = %(lease_token)s::uuid AND state = 'active'
FOR SHARE"""

# One step, fenced by the lease in the same statement. `leased` false: the lease is lost and nothing was
# written; `recorded` false with `leased` true: the key was recorded already (its stored result is kept).
RECORD_STEP = """
WITH lease AS MATERIALIZED (
    SELECT id FROM dygo_jobs
    WHERE id = %(job_id)s AND lease_token = %(lease_token)s::uuid AND state = 'active'
    FOR SHARE
), recorded AS (
    INSERT INTO dygo_steps (job_id, key, op, seq, attempt, duration, result)
    SELECT id, %(key)s, %(op)s, %(seq)s, %(attempt)s, %(duration)s, %(result)s::jsonb FROM lease
    ON CONFLICT (job_id, key) DO NOTHING
    RETURNING 1
)
SELECT EXISTS (SELECT FROM lease) AS leased, EXISTS (SELECT FROM recorded) AS recorded"""

# A step's stored result, read when its write found the key recorded already.
STEP_RESULT = """
SELECT result::text FROM dygo_steps WHERE job_id = %(job_id)s AND key = %(key)s"""


# One sleep, fenced by the lease like a step: its wake time is now plus the sleep, by the database's clock.
# `left_seconds` is the time left of the sleep recorded for the key (this one, or one recorded before it).
RECORD_SLEEP = """
WITH lease AS MATERIALIZED (
    SELECT id FROM dygo_jobs
    WHERE id = %(job_id)s AND lease_token = %(lease_token)s::uuid AND state = 'active'
    FOR SHARE
), recorded AS (
    INSERT INTO dygo_steps (job_id, key, op, seq, attempt, duration, wake_at)
    SELECT id, %(key)s, 'sleep', %(seq)s, %(attempt)s, %(seconds)s, now() + make_interval(secs => %(seconds)s)
    FROM lease
    ON CONFLICT (job_id, key) DO NOTHING
    RETURNING wake_at
)
SELECT EXISTS (SELECT FROM lease) AS leased,
       greatest(extract(epoch FROM coalesce(
           (SELECT wake_at FROM recorded),
           (SELECT wake_at FROM dygo_steps WHERE job_id = %(job_id)s AND key = %(key)s)
       ) - now()), 0)::float8 AS left_seconds"""


# --- an operator's view and actions (store/steps.py job_steps, forget_steps) ------------------------------

# A job's recorded steps in call order, as the API and the dashboard show them.
JOB_STEPS = """
SELECT key, split_part(key, '#', 1) AS name, split_part(key, '#', 2)::int AS occurrence, op, seq, attempt,
    recorded_at, duration, result, wake_at, state, waits_for, children, children_left
FROM dygo_steps WHERE job_id = %(job_id)s
ORDER BY seq, recorded_at"""

JOB_EXISTS = """
SELECT EXISTS (SELECT FROM dygo_jobs WHERE id = %(job_id)s)"""

# The job's state, its row locked for the rest of the transaction: a worker cannot claim it meanwhile.
LOCK_JOB_STATE = """
SELECT CASE WHEN state = 'pending' AND run_at > now() THEN 'scheduled' ELSE state END
FROM dygo_jobs WHERE id = %(job_id)s
FOR UPDATE"""

# A step and every step recorded after it (by call position) are forgotten: the job's next run runs them.
FORGET_STEPS_FROM = """
DELETE FROM dygo_steps
WHERE job_id = %(job_id)s
  AND seq >= (SELECT seq FROM dygo_steps WHERE job_id = %(job_id)s AND key = %(key)s)
RETURNING key, seq"""

# The job as an action returns it, for a job whose steps were forgotten without a retry.
JOB_AFTER_FORGET = f"SELECT {JOB_COLUMNS} FROM dygo_jobs WHERE id = %(id)s"


# --- metrics (GET /metrics dygo_jobs_waiting) -------------------------------------------------------------

# Jobs that wait, per queue and what for: a durable wait's op (an event; a child job, 'call' or 'map'), its
# workflow node (a waiting job with no waiting step), or a sleep not over yet (a pending job). The waiting
# jobs come from the parked-jobs index, the sleeps from the index of sleep rows by wake time: a scrape reads
# the jobs that wait, not every step.
WAITING_BY_REASON = """
SELECT j.queue, coalesce(w.reason, 'workflow') AS reason, count(*)
FROM dygo_jobs j
LEFT JOIN LATERAL (
    SELECT CASE s.op WHEN 'event' THEN 'event' ELSE 'child' END AS reason
    FROM dygo_steps s WHERE s.job_id = j.id AND s.state = 'waiting' LIMIT 1
) w ON true
WHERE j.state = 'waiting'
GROUP BY 1, 2
UNION ALL
SELECT j.queue, 'sleep', count(*)
FROM dygo_steps s JOIN dygo_jobs j ON j.id = s.job_id AND j.state = 'pending'
WHERE s.op = 'sleep' AND s.wake_at > now()
GROUP BY 1"""
