"""Enqueueing: one job, with or without an idempotency key, and batches of jobs.

Run by store/enqueue.py (`enqueue`, `enqueue_many` and their async twins; the HTTP enqueue routes and the
scheduler go through it), and store/connections.py (OPEN_TRANSACTION).
"""

# Any statement: on a connection out of autocommit with no transaction open, psycopg opens the caller's
# transaction before it, so that a batch's savepoint can go inside that transaction.
OPEN_TRANSACTION = "SELECT 1"

# The values of one job's row, the same in each single-row insert: run_at is the given time, else now
# plus the delay.
_JOB_VALUES = """%(kind)s, %(queue)s, %(args)s, %(meta)s, %(priority)s,
        coalesce(%(run_at)s::timestamptz, now() + make_interval(secs => %(delay)s)), %(max_attempts)s"""

INSERT_JOB = f"""
INSERT INTO dygo_jobs (kind, queue, args, meta, priority, run_at, max_attempts)
VALUES ({_JOB_VALUES})
RETURNING id, run_at"""

# With an idempotency key held by a live job, the insert does nothing and the caller looks it up.
INSERT_JOB_UNLESS_LIVE_KEY = f"""
INSERT INTO dygo_jobs (kind, queue, args, meta, priority, run_at, max_attempts, idempotency_key)
VALUES ({_JOB_VALUES}, %(key)s)
ON CONFLICT (idempotency_key)
    WHERE idempotency_key IS NOT NULL AND state IN ('pending', 'active', 'paused') DO NOTHING
RETURNING id, run_at"""

LIVE_JOB_BY_KEY = """
SELECT id, run_at FROM dygo_jobs
WHERE idempotency_key = %s AND state IN ('pending', 'active', 'paused')"""

# A key with a time window: taken when absent or expired, and it names the job it let through.
INSERT_JOB_UNLESS_WINDOW_KEY = f"""
WITH taken AS (
    INSERT INTO dygo_idempotency_keys AS k (key, job_id, expires_at)
    VALUES (%(key)s, nextval('dygo_jobs_id_seq'), now() + make_interval(secs => %(ttl)s))
    ON CONFLICT (key) DO UPDATE SET job_id = excluded.job_id, expires_at = excluded.expires_at
        WHERE k.expires_at <= now()
    RETURNING job_id
)
INSERT INTO dygo_jobs (id, kind, queue, args, meta, priority, run_at, max_attempts)
SELECT taken.job_id, {_JOB_VALUES} FROM taken
RETURNING id, run_at"""

JOB_BY_WINDOW_KEY = """
SELECT k.job_id, j.run_at FROM dygo_idempotency_keys k LEFT JOIN dygo_jobs j ON j.id = k.job_id
WHERE k.key = %s"""

# A batch of rows without keys, up to PLAIN_BATCH_MAX of them, in one statement and one round trip (atomic
# on its own in autocommit). The rows travel as one JSON array, one parameter, rather than a list per
# column, which psycopg would dump element by element in Python. Each row's id comes from the column
# default as jsonb_to_recordset yields the rows, in array order: the caller maps them back by id order.
INSERT_JOBS = """
INSERT INTO dygo_jobs (kind, queue, args, meta, priority, run_at, max_attempts)
SELECT kind, queue, args, meta, priority, coalesce(run_at, now() + make_interval(secs => delay)), max_attempts
FROM jsonb_to_recordset(%s::jsonb) AS t(kind text, queue text, args jsonb, meta jsonb, priority smallint,
                                       run_at timestamptz, delay float8, max_attempts integer)
RETURNING id, run_at"""

# Batches: ids are reserved first so the rows can be sent with COPY and still reported by id.
RESERVE_JOB_IDS = "SELECT now(), array(SELECT nextval('dygo_jobs_id_seq') FROM generate_series(1, %s))"
COPY_JOBS = "COPY dygo_jobs (id, kind, queue, args, meta, priority, run_at, max_attempts) FROM STDIN"
INSERT_JOBS_UNLESS_LIVE_KEY = """
INSERT INTO dygo_jobs (id, kind, queue, args, meta, priority, run_at, max_attempts, idempotency_key)
SELECT * FROM unnest(%(ids)s::bigint[], %(kinds)s::text[], %(queues)s::text[], %(args)s::jsonb[],
                     %(metas)s::jsonb[], %(priorities)s::smallint[], %(run_ats)s::timestamptz[],
                     %(max_attempts)s::integer[], %(keys)s::text[])
ON CONFLICT (idempotency_key)
    WHERE idempotency_key IS NOT NULL AND state IN ('pending', 'active', 'paused') DO NOTHING
RETURNING id"""
LIVE_JOBS_BY_KEYS = """
SELECT idempotency_key, id FROM dygo_jobs
WHERE idempotency_key = ANY(%s) AND state IN ('pending', 'active', 'paused')"""
