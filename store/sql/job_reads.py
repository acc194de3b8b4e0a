"""One job as the API shows it: the job row every job statement returns, and its read by id.

Run by store/job_reads.py (GET /api/v1/jobs/{id}, the dashboard's job page) and store/results.py (a
waiter's read after it registers); the actions of store/admin.py (sql/admin_jobs.py) return JOB_COLUMNS.
"""

# A job's columns in the API's order, 'scheduled' told apart from 'pending' by the database clock.
JOB_COLUMNS = """id, kind, queue, args, meta,
    CASE WHEN state = 'pending' AND run_at > now() THEN 'scheduled' ELSE state END AS state,
    priority, run_at, attempt, max_attempts, lease_owner, lease_deadline, enqueued_at, started_at,
    finished_at, (errors -> -1 ->> 'at')::timestamptz AS failed_at, result, last_error, errors, reap_count,
    idempotency_key, progress"""
GET_JOB = f"SELECT {JOB_COLUMNS} FROM dygo_jobs WHERE id = %s"
