"""Every SQL statement dygo runs, named for what it does. Nothing outside `store` writes SQL."""

# --- Schema ------------------------------------------------------------------------------------

MIGRATIONS_TABLE = """
CREATE TABLE IF NOT EXISTS dygo_migrations (
    version    integer PRIMARY KEY,
    name       text        NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
)"""
# Two `dygo migrate` at once: the second waits here, then finds nothing left to apply.
MIGRATIONS_LOCK = "SELECT pg_advisory_xact_lock(hashtext('dygo.migrate'))"
APPLIED_MIGRATIONS = "SELECT version FROM dygo_migrations ORDER BY version"
RECORD_MIGRATION = "INSERT INTO dygo_migrations (version, name) VALUES (%s, %s)"
# The migrations table may not exist yet, so its name is looked up before it is read.
HAS_MIGRATIONS_TABLE = "SELECT to_regclass('dygo_migrations') IS NOT NULL"
SCHEMA_VERSION = "SELECT coalesce(max(version), 0) FROM dygo_migrations"

# --- Enqueue -----------------------------------------------------------------------------------

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

# The channel the dygo_notify_pending trigger sends each queue name to.
LISTEN_FOR_JOBS = "LISTEN dygo_jobs"

# --- Claim, lease, settle ------------------------------------------------------------------------

# Served from the dygo_jobs_ready partial index; SKIP LOCKED lets any number of workers claim at once.
CLAIM_JOBS = """
WITH picked AS (
    SELECT id FROM dygo_jobs
    WHERE state = 'pending' AND queue = %(queue)s AND run_at <= now()
    ORDER BY priority DESC, run_at, id
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
), claimed AS (
    UPDATE dygo_jobs AS j
    SET state = 'active', attempt = j.attempt + 1, started_at = now(),
        lease_owner = %(owner)s, lease_token = gen_random_uuid(),
        lease_deadline = now() + make_interval(secs => %(ttl)s)
    -- ANY(ARRAY(...)) keeps this a primary-key lookup whatever the table statistics say.
    WHERE j.id = ANY(ARRAY(SELECT id FROM picked))
    RETURNING j.id, j.kind, j.queue, j.args, j.meta, j.attempt, j.max_attempts, j.enqueued_at,
              j.lease_token, j.lease_deadline, j.priority, j.run_at
)
SELECT id, kind, queue, args, meta, attempt, max_attempts, enqueued_at, lease_token, lease_deadline
FROM claimed ORDER BY priority DESC, run_at, id"""

# Seconds until the next pending job is due, on the database clock (negative: due already).
SECONDS_TO_NEXT_RUN = """
SELECT extract(epoch FROM min(run_at) - now())::float8 FROM dygo_jobs
WHERE state = 'pending' AND queue = ANY(%s)"""

RENEW_LEASES = """
UPDATE dygo_jobs AS j SET lease_deadline = now() + make_interval(secs => %(ttl)s)
FROM unnest(%(ids)s::bigint[], %(tokens)s::uuid[]) AS s(id, token)
WHERE j.id = ANY(%(ids)s::bigint[]) AND j.id = s.id AND j.lease_token = s.token
RETURNING j.id"""

# Every settle is fenced by the lease token: a worker that lost its lease changes nothing.
SETTLE_SUCCEEDED = """
UPDATE dygo_jobs AS j
SET state = 'succeeded', finished_at = now(), result = s.result,
    lease_owner = NULL, lease_token = NULL, lease_deadline = NULL
FROM unnest(%(ids)s::bigint[], %(tokens)s::uuid[], %(results)s::jsonb[]) AS s(id, token, result)
WHERE j.id = ANY(%(ids)s::bigint[]) AND j.id = s.id AND j.lease_token = s.token
RETURNING j.id"""

# Retry (pending after a delay), dead, snooze and hand-back (pending, attempt refunded) in one
# statement per batch; an error, when given, is appended to the attempt history.
SETTLE_UNSUCCESSFUL = """
UPDATE dygo_jobs AS j
SET state = s.state,
    run_at = CASE WHEN s.state = 'pending' THEN now() + make_interval(secs => s.delay) ELSE j.run_at END,
    finished_at = CASE WHEN s.state = 'dead' THEN now() END,
    attempt = j.attempt - s.refund::integer,
    last_error = coalesce(s.error, j.last_error),
    errors = CASE WHEN s.error IS NULL THEN j.errors ELSE j.errors || jsonb_build_array(jsonb_build_object(
        'attempt', j.attempt, 'at', now(), 'started_at', j.started_at, 'worker', j.lease_owner,
        'error', s.error, 'traceback', s.traceback)) END,
    lease_owner = NULL, lease_token = NULL, lease_deadline = NULL
FROM unnest(%(ids)s::bigint[], %(tokens)s::uuid[], %(states)s::text[], %(delays)s::float8[],
            %(refunds)s::boolean[], %(errors)s::text[], %(tracebacks)s::text[])
     AS s(id, token, state, delay, refund, error, traceback)
WHERE j.id = ANY(%(ids)s::bigint[]) AND j.id = s.id AND j.lease_token = s.token
RETURNING j.id"""

# A lease that ran out means its worker died or stalled: the job goes back, its attempt refunded,
# unless this has happened more than max_reaps times (poison: dead).
RECOVER_EXPIRED_LEASES = """
WITH expired AS (
    SELECT id FROM dygo_jobs
    WHERE state = 'active' AND lease_deadline < now()
    ORDER BY lease_deadline
    LIMIT 1000
    FOR UPDATE SKIP LOCKED
)
UPDATE dygo_jobs AS j
SET state = CASE WHEN j.reap_count + 1 > %(max_reaps)s THEN 'dead' ELSE 'pending' END,
    finished_at = CASE WHEN j.reap_count + 1 > %(max_reaps)s THEN now() END,
    run_at = now(), attempt = j.attempt - 1, reap_count = j.reap_count + 1,
    last_error = 'lease expired: worker ' || coalesce(j.lease_owner, '?') || ' stopped renewing it',
    errors = j.errors || jsonb_build_array(jsonb_build_object(
        'attempt', j.attempt, 'at', now(), 'started_at', j.started_at, 'worker', j.lease_owner,
        'error', 'lease expired: worker ' || coalesce(j.lease_owner, '?') || ' stopped renewing it',
        'traceback', NULL)),
    lease_owner = NULL, lease_token = NULL, lease_deadline = NULL
FROM expired
WHERE j.id = expired.id
RETURNING j.id, j.state"""

# --- Workers -------------------------------------------------------------------------------------

WORKER_HEARTBEAT = """
INSERT INTO dygo_workers (id, hostname, pid, queues) VALUES (%(id)s, %(hostname)s, %(pid)s, %(queues)s)
ON CONFLICT (id) DO UPDATE SET last_seen_at = now(), queues = excluded.queues"""
WORKER_GONE = "DELETE FROM dygo_workers WHERE id = %s"
FORGET_STALE_WORKERS = "DELETE FROM dygo_workers WHERE last_seen_at < now() - make_interval(secs => %s)"
LIVE_WORKERS = """
SELECT id, hostname, pid, queues, started_at, last_seen_at FROM dygo_workers
WHERE last_seen_at >= now() - make_interval(secs => %s) ORDER BY started_at"""

# --- Inspection ----------------------------------------------------------------------------------

JOB_COLUMNS = """id, kind, queue, args, meta,
    CASE WHEN state = 'pending' AND run_at > now() THEN 'scheduled' ELSE state END AS state,
    priority, run_at, attempt, max_attempts, lease_owner, lease_deadline, enqueued_at, started_at,
    finished_at, result, last_error, errors, reap_count, idempotency_key"""
GET_JOB = f"SELECT {JOB_COLUMNS} FROM dygo_jobs WHERE id = %s"
