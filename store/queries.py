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

# A batch of rows without keys, up to PLAIN_BATCH_MAX of them, in one statement and one round trip (atomic
# on its own in autocommit). The rows travel as one JSON array (one parameter: psycopg dumps a Python list
# per column element by element, which cost more than the insert). Each row's id comes from the column
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

# The channel the dygo_notify_pending trigger sends each queue name to.
LISTEN_FOR_JOBS = "LISTEN dygo_jobs"

# --- Lease, settle (the claim statements are in store/claim.py) ------------------------------------

# Sent in the same string as a worker statement that finds job rows by id (leases.on_indexes): a
# freshly migrated table of a few pages is cheapest to read whole, so the planner would take a sequential
# scan for the claim's and the settle's UPDATE until the table grew. Priced out, every lookup stays on its
# index whatever the statistics say.
# LOCAL: it ends with the statement's transaction, so a pooled server connection is left as it was.
INDEX_SCANS_ONLY = "SET LOCAL enable_seqscan = off"

# Wakes the workers of queues whose limited jobs a settle freed (the listener's channel, as the trigger
# sends); part of the settle's transaction, so delivered at its commit (store/limits.py freed_queues).
NOTIFY_QUEUES = "SELECT pg_notify('dygo_jobs', q) FROM unnest(%(queues)s::text[]) AS q"

# Every worker statement that locks several job rows (renew, settle, progress) locks them first, in id
# order, in this CTE: in the order of their arrays, a settle holding S and wanting U and a renewal holding
# U and wanting S deadlocked. A settle's first statement locks its whole batch (the ids in %(lock)s), since
# a transaction's locks are only ordered if the rows of its second statement are taken by its first.
# ANY(ARRAY(SELECT id FROM locked)) runs the CTE to its end, every lock taken, before the update starts.
_LOCKED = """locked AS MATERIALIZED (
    SELECT id FROM dygo_jobs WHERE id = ANY({ids}::bigint[]) ORDER BY id FOR NO KEY UPDATE
)"""

RENEW_LEASES = f"""
WITH {_LOCKED.format(ids="%(ids)s")}
UPDATE dygo_jobs AS j SET lease_deadline = now() + make_interval(secs => %(ttl)s)
FROM unnest(%(ids)s::bigint[], %(tokens)s::uuid[]) AS s(id, token)
WHERE j.id = ANY(ARRAY(SELECT id FROM locked)) AND j.id = s.id AND j.lease_token = s.token
RETURNING j.id"""

# A job's `progress` value (jobs j) from the fraction and message columns of the unnest row `{row}`:
# what REPORT_PROGRESS writes while the job runs and a settle writes at its end.
_PROGRESS = (
    "jsonb_build_object('fraction', {row}.fraction, 'message', {row}.message, 'attempt', j.attempt, 'at', now())"
)

# Every settle is fenced by the lease token: a worker that lost its lease changes nothing.
# Each settle statement also appends its counts, one row per queue and kind, to the stats
# deltas: an insert with no key, so settling workers never wait on each other for it.
# A settle also stores the run's latest `ctx.progress` report, which the once-a-second writer
# (worker/progress.py) may not have written yet: a NULL fraction leaves the column as it is. A batch
# in which no job reported passes NULL arrays, which unnest pads with NULLs: no per-job cost.
_SETTLE_PROGRESS = f"progress = CASE WHEN s.fraction IS NULL THEN j.progress ELSE {_PROGRESS.format(row='s')} END"
SETTLE_SUCCEEDED = f"""
WITH {_LOCKED.format(ids="%(lock)s")}, settled AS (
    UPDATE dygo_jobs AS j
    SET state = 'succeeded', finished_at = now(), result = s.result,
        lease_owner = NULL, lease_token = NULL, lease_deadline = NULL,
        {_SETTLE_PROGRESS}
    FROM unnest(%(ids)s::bigint[], %(tokens)s::uuid[], %(results)s::jsonb[],
                %(fractions)s::float8[], %(messages)s::text[]) AS s(id, token, result, fraction, message)
    WHERE j.id = ANY(ARRAY(SELECT id FROM locked)) AND j.id = s.id AND j.lease_token = s.token
    RETURNING j.id, j.queue, j.kind
), counted AS (
    INSERT INTO dygo_stats_deltas (day, queue, kind, succeeded)
    SELECT (now() AT TIME ZONE 'UTC')::date, queue, kind, count(*) FROM settled GROUP BY queue, kind
)
SELECT id FROM settled"""

# Retry (pending after a delay), dead, snooze and hand-back (pending, attempt refunded) in one
# statement per batch; an error, when given, is appended to the attempt history. A hand-back keeps
# its run_at, so the job keeps its place at the head of the line instead of queueing behind the backlog.
SETTLE_UNSUCCESSFUL = f"""
WITH {_LOCKED.format(ids="%(lock)s")}, settled AS (
UPDATE dygo_jobs AS j
SET state = s.state,
    run_at = CASE WHEN s.state = 'pending' AND s.refund AND s.error IS NULL AND s.delay = 0 THEN j.run_at
                  WHEN s.state = 'pending' THEN now() + make_interval(secs => s.delay) ELSE j.run_at END,
    finished_at = CASE WHEN s.state = 'dead' THEN now() END,
    dead_fingerprint = CASE WHEN s.state = 'dead' THEN dygo_error_fingerprint(coalesce(s.error, j.last_error))
                            ELSE j.dead_fingerprint END,
    attempt = j.attempt - s.refund::integer,
    last_error = coalesce(s.error, j.last_error),
    errors = CASE WHEN s.error IS NULL THEN j.errors ELSE j.errors || jsonb_build_array(jsonb_build_object(
        'attempt', j.attempt, 'at', now(), 'started_at', j.started_at, 'worker', j.lease_owner,
        'error', s.error, 'traceback', s.traceback)) END,
    lease_owner = NULL, lease_token = NULL, lease_deadline = NULL,
    {_SETTLE_PROGRESS}
FROM unnest(%(ids)s::bigint[], %(tokens)s::uuid[], %(states)s::text[], %(delays)s::float8[],
            %(refunds)s::boolean[], %(errors)s::text[], %(tracebacks)s::text[],
            %(fractions)s::float8[], %(messages)s::text[])
     AS s(id, token, state, delay, refund, error, traceback, fraction, message)
WHERE j.id = ANY(ARRAY(SELECT id FROM locked)) AND j.id = s.id AND j.lease_token = s.token
RETURNING j.id, j.queue, j.kind, j.state, s.error IS NOT NULL AS failed
), counted AS (
    INSERT INTO dygo_stats_deltas (day, queue, kind, failed, dead)
    SELECT (now() AT TIME ZONE 'UTC')::date, queue, kind,
           count(*) FILTER (WHERE failed), count(*) FILTER (WHERE state = 'dead')
    FROM settled GROUP BY queue, kind HAVING count(*) FILTER (WHERE failed OR state = 'dead') > 0
)
SELECT id FROM settled"""

# A lease that ran out means its worker died or stalled: the job goes back, its attempt refunded,
# unless this has happened more than max_reaps times (poison: dead). It keeps its run_at, and so its
# place at the head of the line: behind a backlog, a crash would otherwise cost it the whole backlog.
# `since`: only deadlines from then on (the database's clock when the previous pass began, less a margin;
# NULL: every deadline). While something holds back VACUUM, the index keeps an entry for every lease taken
# since, and a walk from the oldest deadline visits them all (37.7 ms at 100,000); this walks the last
# second's. The one row returned carries the statement's clock, where the next pass takes up.
RECOVER_EXPIRED_LEASES = """
WITH expired AS (
    SELECT id FROM dygo_jobs
    WHERE state = 'active' AND lease_deadline < now()
      AND lease_deadline >= coalesce(%(since)s::timestamptz, '-infinity')
    ORDER BY lease_deadline
    LIMIT %(batch)s
    FOR UPDATE SKIP LOCKED
), recovered AS (
UPDATE dygo_jobs AS j
SET state = CASE WHEN j.reap_count + 1 > %(max_reaps)s THEN 'dead' ELSE 'pending' END,
    finished_at = CASE WHEN j.reap_count + 1 > %(max_reaps)s THEN now() END,
    dead_fingerprint = CASE WHEN j.reap_count + 1 > %(max_reaps)s
        THEN dygo_error_fingerprint('lease expired: worker ' || coalesce(j.lease_owner, '?') || ' stopped renewing it')
        ELSE j.dead_fingerprint END,
    attempt = j.attempt - 1, reap_count = j.reap_count + 1,
    last_error = 'lease expired: worker ' || coalesce(j.lease_owner, '?') || ' stopped renewing it',
    errors = j.errors || jsonb_build_array(jsonb_build_object(
        'attempt', j.attempt, 'at', now(), 'started_at', j.started_at, 'worker', j.lease_owner,
        'error', 'lease expired: worker ' || coalesce(j.lease_owner, '?') || ' stopped renewing it',
        'traceback', NULL)),
    lease_owner = NULL, lease_token = NULL, lease_deadline = NULL
FROM expired
WHERE j.id = expired.id
RETURNING j.id, j.state, j.queue, j.kind
), counted AS (
    INSERT INTO dygo_stats_deltas (day, queue, kind, reaped, dead)
    SELECT (now() AT TIME ZONE 'UTC')::date, queue, kind, count(*), count(*) FILTER (WHERE state = 'dead')
    FROM recovered GROUP BY queue, kind
)
SELECT now(), coalesce(array_agg(id), '{}'), coalesce(array_agg(state), '{}') FROM recovered"""

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
    finished_at, (errors -> -1 ->> 'at')::timestamptz AS failed_at, result, last_error, errors, reap_count,
    idempotency_key, progress"""
GET_JOB = f"SELECT {JOB_COLUMNS} FROM dygo_jobs WHERE id = %s"

# --- Admin: job lists ----------------------------------------------------------------------------
# A list is LIST_JOBS with the filters a request asks for, joined by AND (store.admin composes
# them; only these fragments are ever spliced in, values always travel as parameters). Pages are
# keyset on id, so a page costs the same on page 1 and page 10,000, and rows inserted while a
# client pages never shift what it has not seen yet.

JOB_SUMMARY_COLUMNS = """id, kind, queue, args, meta,
    CASE WHEN state = 'pending' AND run_at > now() THEN 'scheduled' ELSE state END AS state,
    priority, run_at, attempt, max_attempts, enqueued_at, started_at, finished_at, last_error"""
LIST_JOBS = "SELECT {columns} FROM dygo_jobs WHERE {filters} ORDER BY {key} {direction} LIMIT %(limit)s"
# The keys a list orders by. `id + 0` is the same order, but no index provides it: the planner
# then finds the rows through their own index (pending and scheduled rows: dygo_jobs_ready) and
# sorts them, instead of walking the primary key past every finished job to reach sparse ones.
JOB_ORDER_KEYS = {"by_primary_key": "id", "sorted": "id + 0"}
JOB_FILTERS = {
    "queue": "queue = %(queue)s",
    "kind": "kind = %(kind)s",
    # Text search scans, so admin bounds it to a window of ids per page (see list_jobs).
    "text": "(args::text ILIKE %(pattern)s OR last_error ILIKE %(pattern)s)",
    "below": "id < %(below)s",
    "above": "id > %(above)s",
    "floor": "id >= %(floor)s",
    "ceiling": "id <= %(ceiling)s",
    "everything": "true",
}
# 'scheduled' and 'pending' are the same stored state, told apart by the database clock.
JOB_STATE_FILTERS = {
    "scheduled": "state = 'pending' AND run_at > now()",
    "pending": "state = 'pending' AND run_at <= now()",
    "active": "state = 'active'",
    "succeeded": "state = 'succeeded'",
    "dead": "state = 'dead'",
    "paused": "state = 'paused'",
    "cancelled": "state = 'cancelled'",
}
# Both ends of the primary key: two index probes, however big the table.
JOB_ID_RANGE = "SELECT min(id), max(id) FROM dygo_jobs"

# --- Admin: one job ------------------------------------------------------------------------------
# Each action is one statement whose WHERE holds the states it may start from, so a job that
# changed meanwhile is never half-updated; no row back means unknown id or wrong state
# (JOB_STATE tells which).

JOB_STATE = """
SELECT CASE WHEN state = 'pending' AND run_at > now() THEN 'scheduled' ELSE state END
FROM dygo_jobs WHERE id = %s"""

# What a retry sets: pending now, with a fresh attempt budget; the error history is kept.
_REVIVED = """state = 'pending', run_at = now(), attempt = 0, reap_count = 0,
    started_at = NULL, finished_at = NULL, result = NULL"""

# Dead or cancelled -> pending now (_REVIVED).
RETRY_JOB = f"""
UPDATE dygo_jobs SET {_REVIVED}
WHERE id = %(id)s AND state IN ('dead', 'cancelled')
RETURNING {JOB_COLUMNS}"""

# A running handler cannot be stopped from here, so an active job is not cancellable.
CANCEL_JOB = f"""
UPDATE dygo_jobs SET state = 'cancelled', finished_at = now()
WHERE id = %(id)s AND state IN ('pending', 'paused')
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

# An active job's row belongs to the worker running it. With a state (the seed's Delete(id, state)), only a
# job in that state goes: one retried or resumed since the caller looked at it stays.
DELETE_JOB = """
DELETE FROM dygo_jobs WHERE id = %(id)s AND state <> 'active'
    AND (%(state)s::text IS NULL OR CASE WHEN state = 'pending' AND run_at > now() THEN 'scheduled' ELSE state END
                                    = %(state)s::text)
RETURNING id"""

# --- Admin: queues -------------------------------------------------------------------------------

# Instantaneous counts, each part read from a partial index: pending and scheduled from
# dygo_jobs_ready, active from dygo_jobs_leases (at most the workers' concurrency), dead, paused
# and cancelled from dygo_jobs_parked. Succeeded rows are history and never counted here (the
# daily stats have them).
QUEUE_COUNTS = """
SELECT queue, CASE WHEN run_at > now() THEN 'scheduled' ELSE 'pending' END, count(*)
FROM dygo_jobs WHERE state = 'pending' GROUP BY 1, 2
UNION ALL
SELECT queue, 'active', count(*) FROM dygo_jobs WHERE state = 'active' GROUP BY 1
UNION ALL
SELECT queue, state, count(*) FROM dygo_jobs WHERE state IN ('dead', 'paused', 'cancelled') GROUP BY 1, 2"""

# Jobs each queue finished successfully today (UTC): succeeded rows are history (kept for
# completed_retention, no index counts them), so the count comes from the stats rollups, like the
# throughput window: today's folded row plus the deltas not folded yet. A handful of small rows.
QUEUE_SUCCEEDED_TODAY = """
SELECT queue, sum(succeeded)::bigint FROM (
    SELECT queue, succeeded FROM dygo_daily_stats WHERE day = (now() AT TIME ZONE 'UTC')::date
    UNION ALL
    SELECT queue, succeeded FROM dygo_stats_deltas WHERE day = (now() AT TIME ZONE 'UTC')::date) AS s
GROUP BY queue"""

# The queue list in one round trip (GET /api/v1/queues, the dashboard, /metrics): the three reads above as
# rows tagged 'count' (queue, state, number), 'paused' (name, paused_at) and 'succeeded' (queue, number).
QUEUE_LIST = f"""
SELECT 'count', queue, state, number, NULL::timestamptz FROM ({QUEUE_COUNTS}) AS c(queue, state, number)
UNION ALL
SELECT 'paused', name, NULL, NULL, paused_at FROM dygo_queues WHERE paused
UNION ALL
SELECT 'succeeded', queue, NULL, number, NULL FROM ({QUEUE_SUCCEEDED_TODAY}) AS s(queue, number)"""
PAUSE_QUEUE = """
INSERT INTO dygo_queues AS q (name, paused, paused_at) VALUES (%s, true, now())
ON CONFLICT (name) DO UPDATE SET paused = true, paused_at = CASE WHEN q.paused THEN q.paused_at ELSE now() END
RETURNING paused_at"""
# Resuming wakes the queue's workers at once (they were idling until their poll interval).
RESUME_QUEUE = """
WITH resumed AS (
    UPDATE dygo_queues SET paused = false, paused_at = NULL WHERE name = %s AND paused RETURNING name
)
SELECT pg_notify('dygo_jobs', name) FROM resumed"""


# Which of many jobs to retry may revive: a job whose idempotency key is held by a live job stays
# where it is (reviving it would break the key's uniqueness), as do all but the newest job sharing
# a key. The CTEs `keyed` and `chosen` (ids) over `source`, a CTE of (id, idempotency_key) rows.
def _revivable(source: str) -> str:
    return f"""keyed AS (
    SELECT DISTINCT ON (idempotency_key) id, idempotency_key FROM {source}
    WHERE idempotency_key IS NOT NULL
    ORDER BY idempotency_key, id DESC
), chosen AS (
    SELECT id FROM {source} WHERE idempotency_key IS NULL
    UNION ALL
    SELECT k.id FROM keyed k WHERE NOT EXISTS (
        SELECT 1 FROM dygo_jobs l
        WHERE l.idempotency_key = k.idempotency_key AND l.state IN ('pending', 'active', 'paused'))
)"""


# Every dead job of the queue -> pending now, in one statement, by _revivable's rule for keys.
def _revive_dead(dead: str) -> str:
    """Revive the dead jobs `dead` selects (id, idempotency_key) -> pending now, fresh attempts."""
    return f"""
WITH dead AS ({dead}), {_revivable("dead")}
UPDATE dygo_jobs AS j SET {_REVIVED}
FROM chosen
WHERE j.id = chosen.id AND j.state = 'dead'
RETURNING j.id"""


RETRY_DEAD_JOBS = _revive_dead("SELECT id, idempotency_key FROM dygo_jobs WHERE state = 'dead' AND queue = %(queue)s")
# The same for every queue at once (the seed's RetryAll with no queue).
RETRY_ALL_DEAD_JOBS = _revive_dead("SELECT id, idempotency_key FROM dygo_jobs WHERE state = 'dead'")

# Pending, scheduled and dead jobs go; active ones belong to their workers and paused ones were
# parked on purpose, so both stay (and are reported).
PURGE_QUEUE = """
WITH purged AS (
    DELETE FROM dygo_jobs WHERE queue = %(queue)s AND state IN ('pending', 'dead')
    RETURNING CASE WHEN state = 'pending' AND run_at > now() THEN 'scheduled' ELSE state END AS state
)
SELECT count(*) FILTER (WHERE state = 'pending'), count(*) FILTER (WHERE state = 'scheduled'),
       count(*) FILTER (WHERE state = 'dead'),
       (SELECT count(*) FROM dygo_jobs WHERE queue = %(queue)s AND state = 'active'),
       (SELECT count(*) FROM dygo_jobs WHERE queue = %(queue)s AND state = 'paused')
FROM purged"""

VACUUM_DEAD = """
DELETE FROM dygo_jobs
WHERE state = 'dead' AND queue = %(queue)s AND finished_at < now() - make_interval(secs => %(older_than)s)"""

# --- Admin: daily stats --------------------------------------------------------------------------

# One folder at a time (several `dygo serve` may run); the others skip and read the deltas too.
FOLD_STATS_LOCK = "SELECT pg_try_advisory_xact_lock(hashtext('dygo.stats.fold'))"
FOLD_STATS = """
WITH moved AS (DELETE FROM dygo_stats_deltas RETURNING *), minutes AS (
    INSERT INTO dygo_minute_stats AS m (minute, queue, kind, enqueued, succeeded, failed, dead, reaped)
    SELECT date_trunc('minute', at), queue, kind, sum(enqueued), sum(succeeded), sum(failed), sum(dead), sum(reaped)
    FROM moved GROUP BY 1, queue, kind
    ON CONFLICT (minute, queue, kind) DO UPDATE SET
        enqueued = m.enqueued + excluded.enqueued, succeeded = m.succeeded + excluded.succeeded,
        failed = m.failed + excluded.failed, dead = m.dead + excluded.dead, reaped = m.reaped + excluded.reaped
)
INSERT INTO dygo_daily_stats AS s (day, queue, kind, enqueued, succeeded, failed, dead, reaped)
SELECT day, queue, kind, sum(enqueued), sum(succeeded), sum(failed), sum(dead), sum(reaped)
FROM moved GROUP BY day, queue, kind
ON CONFLICT (day, queue, kind) DO UPDATE SET
    enqueued = s.enqueued + excluded.enqueued, succeeded = s.succeeded + excluded.succeeded,
    failed = s.failed + excluded.failed, dead = s.dead + excluded.dead, reaped = s.reaped + excluded.reaped"""

# The last %(days)s UTC days, oldest first, zero-filled; folded rows plus deltas not folded yet.
# A NULL queue means every queue.
DAILY_STATS = """
WITH days AS (
    SELECT d::date AS day FROM generate_series(
        (now() AT TIME ZONE 'UTC')::date - (%(days)s - 1), (now() AT TIME ZONE 'UTC')::date, interval '1 day') AS d
), counts AS (
    SELECT day, enqueued, succeeded, failed, dead, reaped FROM dygo_daily_stats
    WHERE day > (now() AT TIME ZONE 'UTC')::date - %(days)s AND (%(queue)s::text IS NULL OR queue = %(queue)s)
    UNION ALL
    SELECT day, enqueued, succeeded, failed, dead, reaped FROM dygo_stats_deltas
    WHERE day > (now() AT TIME ZONE 'UTC')::date - %(days)s AND (%(queue)s::text IS NULL OR queue = %(queue)s)
)
SELECT days.day, coalesce(sum(c.enqueued), 0)::bigint, coalesce(sum(c.succeeded), 0)::bigint,
       coalesce(sum(c.failed), 0)::bigint, coalesce(sum(c.dead), 0)::bigint, coalesce(sum(c.reaped), 0)::bigint
FROM days LEFT JOIN counts c USING (day)
GROUP BY days.day ORDER BY days.day"""

# --- Admin: development only ---------------------------------------------------------------------

NUKE = """
WITH jobs AS (DELETE FROM dygo_jobs RETURNING 1),
     keys AS (DELETE FROM dygo_idempotency_keys RETURNING 1),
     deltas AS (DELETE FROM dygo_stats_deltas RETURNING 1),
     daily AS (DELETE FROM dygo_daily_stats RETURNING 1),
     minutes AS (DELETE FROM dygo_minute_stats RETURNING 1),
     queues AS (DELETE FROM dygo_queues RETURNING 1)
SELECT (SELECT count(*) FROM jobs), (SELECT count(*) FROM keys),
       (SELECT count(*) FROM deltas) + (SELECT count(*) FROM daily) + (SELECT count(*) FROM minutes),
       (SELECT count(*) FROM queues)"""

# --- Schedules -----------------------------------------------------------------------------------

# Two workers starting at once with different declarations (a rolling deploy) sync one after the other.
SCHEDULES_SYNC_LOCK = "SELECT pg_advisory_xact_lock(hashtext('dygo.schedules.sync'))"
DATABASE_NOW = "SELECT now()"
# `scheduled`: enabled with a next fire time; false makes the sync recompute it.
STORED_SCHEDULES = """
SELECT name, spec, timezone, kind, args, queue, priority, max_attempts, missed,
       enabled AND next_run_at IS NOT NULL AS scheduled
FROM dygo_schedules"""

_SCHEDULE_VALUES = """%(name)s, %(spec)s, %(timezone)s, %(kind)s, %(args)s, %(queue)s, %(priority)s,
        %(max_attempts)s, %(missed)s, %(next_run_at)s"""
INSERT_SCHEDULE = f"""
INSERT INTO dygo_schedules (name, spec, timezone, kind, args, queue, priority, max_attempts, missed, next_run_at)
VALUES ({_SCHEDULE_VALUES})
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

# --- Dashboard: the dead-letter view ----------------------------------------------------------------
# A dead job's error fingerprint (dygo_error_fingerprint, migration 0005) is stored when it dies, so
# grouping reads the dygo_jobs_dead_groups index alone instead of normalising every dead row's error.

# Dead jobs grouped by kind and fingerprint, biggest groups first, each with its newest job as the
# sample (one index probe per group shown).
DEAD_LETTER_GROUPS = """
SELECT g.kind, g.fingerprint, g.count, g.first_seen, g.last_seen, g.sample_id,
       s.last_error AS sample_error, s.errors -> -1 ->> 'traceback' AS sample_traceback
FROM (SELECT kind, coalesce(dead_fingerprint, '') AS fingerprint, count(*) AS count,
             min(finished_at) AS first_seen, max(finished_at) AS last_seen, max(id) AS sample_id
      FROM dygo_jobs WHERE state = 'dead'
      GROUP BY kind, dead_fingerprint
      ORDER BY count(*) DESC, max(finished_at) DESC
      LIMIT %(limit)s) AS g
JOIN dygo_jobs s ON s.id = g.sample_id
ORDER BY g.count DESC, g.last_seen DESC"""

# Every dead job of one group -> pending now, in one statement, with RETRY_DEAD_JOBS's rule for
# idempotency keys (a key held by a live job keeps its dead job dead; one revival per key).
RETRY_DEAD_GROUP = _revive_dead("""
    SELECT id, idempotency_key FROM dygo_jobs
    WHERE state = 'dead' AND kind = %(kind)s AND coalesce(dead_fingerprint, '') = %(fingerprint)s""")

# --- Retention (worker maintenance, store/maintenance.py) -----------------------------------------

# One worker of the cluster trims at a time: each batch takes this lock in its own short transaction
# (transaction-level, so it holds through PgBouncer's transaction pooling), and a pass that finds it
# taken stops; no batch holds row locks long, and the pass needs one connection, not two.
RETENTION_LOCK = "SELECT pg_try_advisory_xact_lock(hashtext('dygo.retention'))"

# One step of the walk over old succeeded jobs, served by the primary key (no index on the hot path):
# the %(window)s ids starting at the first job after %(after)s. Returns how many were deleted and
# where the next step starts, or NULL when that first job was enqueued inside the retention window
# (ids grow with time, so every later job is that recent too) or there is no job after %(after)s.
# A job finishes after it is enqueued, so no older succeeded job hides beyond that point.
# `= ANY(ARRAY(...))` keeps the delete on the primary key whatever the statistics.
TRIM_SUCCEEDED_RANGE = """
WITH first AS (
    SELECT id, enqueued_at < now() - make_interval(secs => %(keep)s) AS old
    FROM dygo_jobs WHERE id > %(after)s ORDER BY id LIMIT 1
), doomed AS (
    SELECT id FROM dygo_jobs
    WHERE id >= (SELECT id FROM first WHERE old) AND id < (SELECT id FROM first WHERE old) + %(window)s
      AND state = 'succeeded' AND finished_at < now() - make_interval(secs => %(keep)s)
    FOR UPDATE SKIP LOCKED
), trimmed AS (
    DELETE FROM dygo_jobs WHERE id = ANY(ARRAY(SELECT id FROM doomed)) RETURNING 1
)
SELECT (SELECT count(*) FROM trimmed), (SELECT id + %(window)s - 1 FROM first WHERE old)"""

# Dead or cancelled jobs finished before the retention window, oldest ids first, from
# dygo_jobs_parked. The state is written out (not a parameter) so every plan can use that partial index.
_TRIM_PARKED = """
WITH doomed AS (
    SELECT id FROM dygo_jobs
    WHERE state = '{state}' AND finished_at < now() - make_interval(secs => %(keep)s)
    ORDER BY id LIMIT %(batch)s FOR UPDATE SKIP LOCKED
), trimmed AS (
    DELETE FROM dygo_jobs WHERE id = ANY(ARRAY(SELECT id FROM doomed)) RETURNING 1
)
SELECT count(*) FROM trimmed"""
TRIM_DEAD = _TRIM_PARKED.format(state="dead")
TRIM_CANCELLED = _TRIM_PARKED.format(state="cancelled")

# Rows of {table} whose expires_at has passed, oldest first, found by their {key}.
_TRIM_EXPIRED = """
WITH doomed AS (
    SELECT {key} FROM {table} WHERE expires_at < now()
    ORDER BY expires_at LIMIT %(batch)s FOR UPDATE SKIP LOCKED
), trimmed AS (
    DELETE FROM {table} WHERE {key} = ANY(ARRAY(SELECT {key} FROM doomed)) RETURNING 1
)
SELECT count(*) FROM trimmed"""
# Keys whose window has passed: they no longer deduplicate anything (the enqueue takes them over).
TRIM_EXPIRED_KEYS = _TRIM_EXPIRED.format(table="dygo_idempotency_keys", key="key")

# Rollup rows, keyed by ({period}, queue, kind), whose period started before {cutoff}, oldest first.
_TRIM_ROLLUP = """
WITH doomed AS (
    SELECT {period}, queue, kind FROM {table}
    WHERE {period} < {cutoff}
    ORDER BY {period} LIMIT %(batch)s FOR UPDATE SKIP LOCKED
), trimmed AS (
    DELETE FROM {table} s USING doomed d
    WHERE s.{period} = d.{period} AND s.queue = d.queue AND s.kind = d.kind RETURNING 1
)
SELECT count(*) FROM trimmed"""

# Daily stats of UTC days that ended before the retention window.
TRIM_DAILY_STATS = _TRIM_ROLLUP.format(
    table="dygo_daily_stats",
    period="day",
    cutoff="((now() - make_interval(secs => %(keep)s)) AT TIME ZONE 'UTC')::date",
)

# Minute rollups older than %(keep)s seconds: the chart only shows the last hour.
TRIM_MINUTE_STATS = _TRIM_ROLLUP.format(
    table="dygo_minute_stats", period="minute", cutoff="now() - make_interval(secs => %(keep)s)"
)

# --- Metrics (GET /metrics) -----------------------------------------------------------------------

# Per queue and kind, every day still kept in dygo_daily_stats plus the deltas not folded yet:
# rollup rows, never job rows. Counters "since stats retention began" (trimming old days lowers them).
METRICS_STAT_TOTALS = """
SELECT queue, kind, sum(enqueued)::bigint, sum(succeeded)::bigint, sum(failed)::bigint,
       sum(dead)::bigint, sum(reaped)::bigint
FROM (SELECT queue, kind, enqueued, succeeded, failed, dead, reaped FROM dygo_daily_stats
      UNION ALL
      SELECT queue, kind, enqueued, succeeded, failed, dead, reaped FROM dygo_stats_deltas) AS s
GROUP BY queue, kind ORDER BY queue, kind"""

# --- Dashboard: bulk actions on jobs ------------------------------------------------------------------
# A bulk action is one statement over the jobs a list filter (store.admin composes {filters} from
# JOB_FILTERS / JOB_STATE_FILTERS, or BULK_SELECTED for ticked rows), oldest ids first and at most
# %(cap)s of them. Its UPDATE/DELETE repeats the starting states the single-job action allows
# (BULK_ALLOWED), so a row that changed meanwhile is skipped, never half-updated. Each returns
# (rows matched, rows changed): the difference is what was skipped.
BULK_SELECTED = "id = ANY(%(ids)s::bigint[])"
BULK_ALLOWED = {
    "retry": "state IN ('dead', 'cancelled')",
    "cancel": "state IN ('pending', 'paused')",
    "archive": "state = 'pending'",  # due or scheduled
    "delete": "state <> 'active'",
}
_BULK_MATCHED = """matched AS (
    SELECT id, state, idempotency_key FROM dygo_jobs WHERE {filters} ORDER BY id LIMIT %(cap)s)"""
_BULK_REPORT = "SELECT (SELECT count(*) FROM matched), (SELECT count(*) FROM changed)"

# How many jobs a filter matches (at most %(cap)s looked at: one more than a run takes, to tell
# "more"), and how many of the first %(limit)s the action would change.
BULK_COUNT = """
SELECT count(*), count(*) FILTER (WHERE {allowed} AND n <= %(limit)s) FROM (
    SELECT state, row_number() OVER (ORDER BY id) AS n FROM (
        SELECT id, state FROM dygo_jobs WHERE {filters} ORDER BY id LIMIT %(cap)s) AS first) AS matched"""

# Dead or cancelled -> pending now, like RETRY_JOB, by _revivable's rule for idempotency keys.
BULK_RETRY = f"""
WITH {_BULK_MATCHED}, eligible AS (
    SELECT id, idempotency_key FROM matched WHERE {BULK_ALLOWED["retry"]}
), {_revivable("eligible")}, changed AS (
    UPDATE dygo_jobs AS j SET {_REVIVED}
    WHERE j.id = ANY(ARRAY(SELECT id FROM chosen)) AND j.{BULK_ALLOWED["retry"]}
    RETURNING j.id
)
{_BULK_REPORT}"""

BULK_CANCEL = f"""
WITH {_BULK_MATCHED}, changed AS (
    UPDATE dygo_jobs SET state = 'cancelled', finished_at = now()
    WHERE id = ANY(ARRAY(SELECT id FROM matched)) AND {BULK_ALLOWED["cancel"]}
    RETURNING id
)
{_BULK_REPORT}"""

# Like ARCHIVE_JOB: dead without running, counted in the day's dead.
BULK_ARCHIVE = f"""
WITH {_BULK_MATCHED}, changed AS (
    UPDATE dygo_jobs SET state = 'dead', finished_at = now(), last_error = 'archived by an operator before it ran',
        dead_fingerprint = dygo_error_fingerprint('archived by an operator before it ran')
    WHERE id = ANY(ARRAY(SELECT id FROM matched)) AND {BULK_ALLOWED["archive"]}
    RETURNING id, queue, kind
), counted AS (
    INSERT INTO dygo_stats_deltas (day, queue, kind, dead)
    SELECT (now() AT TIME ZONE 'UTC')::date, queue, kind, count(*) FROM changed GROUP BY queue, kind
)
{_BULK_REPORT}"""

BULK_DELETE = f"""
WITH {_BULK_MATCHED}, changed AS (
    DELETE FROM dygo_jobs WHERE id = ANY(ARRAY(SELECT id FROM matched)) AND {BULK_ALLOWED["delete"]}
    RETURNING id
)
{_BULK_REPORT}"""

# --- Dashboard and GET /metrics: lag; the overview's failing kinds ------------------------------------

# Per queue, the age of the oldest job that is due and not yet claimed (seconds since its run_at), from
# dygo_jobs_ready. Queues with no ready job are absent (/metrics reports 0 for them).
QUEUE_LAG = """
SELECT queue, extract(epoch FROM now() - min(run_at))::float8
FROM dygo_jobs WHERE state = 'pending' AND run_at <= now() GROUP BY queue"""

# The kinds with the most dead jobs and failed attempts today and yesterday (UTC), from the folded
# daily stats plus the deltas not folded yet: a handful of small rows, never the jobs table.
FAILING_KINDS = """
WITH counts AS (
    SELECT kind, failed, dead FROM dygo_daily_stats WHERE day >= (now() AT TIME ZONE 'UTC')::date - 1
    UNION ALL
    SELECT kind, failed, dead FROM dygo_stats_deltas WHERE day >= (now() AT TIME ZONE 'UTC')::date - 1
)
SELECT kind, sum(dead)::bigint AS dead, sum(failed)::bigint AS failed FROM counts
GROUP BY kind HAVING sum(dead) + sum(failed) > 0
ORDER BY sum(dead) DESC, sum(failed) DESC, kind
LIMIT %(limit)s"""

# --- Dashboard: per-minute throughput, vacuum-dead count (migration 0005) -----------------------------

# The last %(minutes)s UTC minutes, oldest first, zero-filled: the folded minute rollups plus the
# deltas not folded yet (each delta knows its minute). A few hundred small rows, never the jobs table.
MINUTE_STATS = """
WITH minutes AS (
    SELECT m AS minute FROM generate_series(
        date_trunc('minute', now()) - make_interval(mins => %(minutes)s - 1), date_trunc('minute', now()),
        interval '1 minute') AS m
), counts AS (
    SELECT minute, enqueued, succeeded, failed, dead, reaped FROM dygo_minute_stats
    WHERE minute > date_trunc('minute', now()) - make_interval(mins => %(minutes)s)
    UNION ALL
    SELECT date_trunc('minute', at), enqueued, succeeded, failed, dead, reaped FROM dygo_stats_deltas
    WHERE at >= date_trunc('minute', now()) - make_interval(mins => %(minutes)s - 1)
)
SELECT minutes.minute, coalesce(sum(c.enqueued), 0)::bigint, coalesce(sum(c.succeeded), 0)::bigint,
       coalesce(sum(c.failed), 0)::bigint, coalesce(sum(c.dead), 0)::bigint, coalesce(sum(c.reaped), 0)::bigint
FROM minutes LEFT JOIN counts c USING (minute)
GROUP BY minutes.minute ORDER BY minutes.minute"""

# What VACUUM_DEAD would delete, for the dashboard's confirmation (dygo_jobs_parked).
COUNT_VACUUM_DEAD = """
SELECT count(*) FROM dygo_jobs
WHERE state = 'dead' AND queue = %(queue)s AND finished_at < now() - make_interval(secs => %(older_than)s)"""

# --- Timings: start latency and execution duration histograms (store/timings.py) ----------------------

# One row per queue, kind and measure that saw observations since the worker's last flush; buckets
# arrive as array literals ('{1,0,2}'), since unnest would flatten a two-dimensional array.
RECORD_TIMINGS = """
INSERT INTO dygo_timing_deltas (queue, kind, measure, buckets, sum, count)
SELECT queue, kind, measure, buckets::bigint[], sum, count
FROM unnest(%(queues)s::text[], %(kinds)s::text[], %(measures)s::text[], %(buckets)s::text[],
            %(sums)s::float8[], %(counts)s::bigint[]) AS t(queue, kind, measure, buckets, sum, count)"""

# Bucket arrays add element by element: one row per (queue, kind, measure, bucket position) summed,
# then gathered back into an array in bucket order.
_TIMING_SUMS = """
per_bucket AS (
    SELECT queue, kind, measure, i, sum(b)::bigint AS n
    FROM {rows}, unnest(buckets) WITH ORDINALITY AS u(b, i) GROUP BY queue, kind, measure, i
), totals AS (
    SELECT queue, kind, measure, sum(sum)::float8 AS sum, sum(count)::bigint AS count
    FROM {rows} GROUP BY queue, kind, measure
)"""
_TIMING_SELECT = """
SELECT p.queue, p.kind, p.measure, array_agg(p.n ORDER BY p.i) AS buckets, t.sum, t.count
FROM per_bucket p JOIN totals t USING (queue, kind, measure)
GROUP BY p.queue, p.kind, p.measure, t.sum, t.count"""

# Run under FOLD_STATS_LOCK, with FOLD_STATS.
FOLD_TIMINGS = f"""
WITH moved AS (DELETE FROM dygo_timing_deltas RETURNING *),
{_TIMING_SUMS.format(rows="moved")}
INSERT INTO dygo_timings AS s (queue, kind, measure, buckets, sum, count)
{_TIMING_SELECT}
ON CONFLICT (queue, kind, measure) DO UPDATE SET
    buckets = ARRAY(SELECT a + b FROM unnest(s.buckets, excluded.buckets) WITH ORDINALITY AS u(a, b, i) ORDER BY i),
    sum = s.sum + excluded.sum, count = s.count + excluded.count"""

# Folded rows plus deltas not folded yet, per queue, kind and measure: never job rows.
METRICS_TIMINGS = f"""
WITH timing_rows AS (
    SELECT queue, kind, measure, buckets, sum, count FROM dygo_timings
    UNION ALL
    SELECT queue, kind, measure, buckets, sum, count FROM dygo_timing_deltas
),
{_TIMING_SUMS.format(rows="timing_rows")}
{_TIMING_SELECT}
ORDER BY p.queue, p.kind, p.measure"""

NUKE_TIMINGS = """
WITH deltas AS (DELETE FROM dygo_timing_deltas RETURNING 1), timings AS (DELETE FROM dygo_timings RETURNING 1)
SELECT (SELECT count(*) FROM deltas) + (SELECT count(*) FROM timings)"""

# Jobs running now per lease owner (worker id) and queue: active rows only, found through the
# dygo_jobs_leases partial index, so as many rows as there are busy slots in the cluster.
METRICS_BUSY_SLOTS = """
SELECT lease_owner, queue, count(*) FROM dygo_jobs WHERE state = 'active' AND lease_owner IS NOT NULL
GROUP BY lease_owner, queue"""

# --- Results and progress (store/results.py, worker/progress.py) ------------------------------------

# The channel the dygo_notify_finished trigger (0006, 0013, 0015) sends the ids of jobs that reached a final
# state to: only the ids some waiter registered for in dygo_result_waiters.
LISTEN_FOR_FINISHED = "LISTEN dygo_finished"
# The same notification for a statement the trigger does not see (a deleted job: its waiters find it gone).
NOTIFY_FINISHED = "SELECT pg_notify('dygo_finished', %s)"
# After an admin statement that deletes unfinished jobs in bulk (purge, bulk delete, nuke): one empty
# payload, "re-read your job", for every waiter, instead of the ids of up to millions of deleted jobs.
# Empty, so a process that does not know it (an older serve in a rolling deploy) finds no ids in it.
NOTIFY_RECHECK = "SELECT pg_notify('dygo_finished', '')"

# A waiter's registration (store/results.py; migrations 0013 and 0015 say why this order cannot miss a
# settle): in its own transaction, this lock EXCLUSIVE (it waits for the commits of the settles that hold
# it in SHARE mode), then its row, then the read of the job, each a statement of its own. The key is the
# trigger's, two int4 keys so that it can never be one of dygo's one-bigint advisory locks. No lock on the
# job's row: a claim passes over a locked row (migration 0015).
RESULT_WAITERS_LOCK = "SELECT pg_advisory_xact_lock(hashtext('dygo'), hashtext('dygo.result_waiters'))"
# The registration's commit does not wait for the WAL flush, so the settles queued behind its lock wait
# less: a registration lost in a crash goes with its waiter (its connection).
WAITER_TRANSACTION = "SELECT set_config('synchronous_commit', 'off', true)"
REGISTER_WAITER = """
INSERT INTO dygo_result_waiters (job_id, expires_at) VALUES (%(job_id)s, now() + make_interval(secs => %(seconds)s))
RETURNING id"""
# A wait longer than a registration's lifetime moves its expiry on before it passes.
REFRESH_WAITER = """
UPDATE dygo_result_waiters SET expires_at = now() + make_interval(secs => %(seconds)s) WHERE id = %(id)s"""
UNREGISTER_WAITER = "DELETE FROM dygo_result_waiters WHERE id = %s"
# The rows of waiters that died without deleting theirs (the maintainer's retention pass).
TRIM_EXPIRED_WAITERS = _TRIM_EXPIRED.format(table="dygo_result_waiters", key="id")

# The latest progress of each job, one statement per batch, fenced by the lease token like a settle:
# a job settled or lost meanwhile keeps what it had.
REPORT_PROGRESS = f"""
WITH {_LOCKED.format(ids="%(ids)s")}
UPDATE dygo_jobs AS j
SET progress = {_PROGRESS.format(row="p")}
FROM unnest(%(ids)s::bigint[], %(tokens)s::uuid[], %(fractions)s::float8[], %(messages)s::text[])
     AS p(id, token, fraction, message)
WHERE j.id = ANY(ARRAY(SELECT id FROM locked)) AND j.id = p.id AND j.lease_token = p.token AND j.state = 'active'
RETURNING j.id"""

# --- The embedded server's settings (store/embedded.py) --------------------------------------------

# dygo owns the embedded server, so it may tune it server-wide: autovacuum visits each database every
# naptime (1 min by default), too rarely for a queue table settling thousands of jobs a second
# (migration 0008). A reload applies it; no restart.
EMBEDDED_NAPTIME = "10s"
AUTOVACUUM_NAPTIME = "SELECT current_setting('autovacuum_naptime')"
SET_AUTOVACUUM_NAPTIME = f"ALTER SYSTEM SET autovacuum_naptime = '{EMBEDDED_NAPTIME}'"
RELOAD_CONFIGURATION = "SELECT pg_reload_conf()"

# --- Authentication state: dashboard sessions, failed-token throttle (store/auth_state.py) ----------

INSERT_DASHBOARD_SESSION = """
INSERT INTO dygo_dashboard_sessions (sid, role, expires_at) VALUES (%s, %s, to_timestamp(%s))"""
TRIM_DASHBOARD_SESSIONS = "DELETE FROM dygo_dashboard_sessions WHERE expires_at < now()"
DASHBOARD_SESSION_ROLE = "SELECT role FROM dygo_dashboard_sessions WHERE sid = %s AND expires_at > now()"
END_DASHBOARD_SESSION = "DELETE FROM dygo_dashboard_sessions WHERE sid = %s"

# Keeps the address's failures inside the window, newest `attempts` of them, oldest first; answers when
# the address may try again (epoch seconds), or NULL while it has fewer than `attempts` recent failures.
_LOCKED_UNTIL = """CASE WHEN cardinality({failures}) >= %(attempts)s
    AND {failures}[cardinality({failures}) - %(attempts)s + 1] > clock_timestamp() - make_interval(secs => %(window)s)
    THEN extract(epoch FROM {failures}[cardinality({failures}) - %(attempts)s + 1]
                 + make_interval(secs => %(window)s))::float8 END"""

RECORD_AUTH_FAILURE = f"""
INSERT INTO dygo_auth_failures AS f (address, failures) VALUES (%(address)s, ARRAY[clock_timestamp()])
ON CONFLICT (address) DO UPDATE SET failures = (
    SELECT coalesce(array_agg(t ORDER BY t), '{{}}') FROM (
        SELECT t FROM unnest(f.failures || clock_timestamp()) AS t
        WHERE t > clock_timestamp() - make_interval(secs => %(window)s)
        ORDER BY t DESC LIMIT %(attempts)s) AS recent)
RETURNING {_LOCKED_UNTIL.format(failures="failures")}"""

# Addresses whose newest failure left the window: forgotten (run with each recorded failure).
TRIM_AUTH_FAILURES = """
DELETE FROM dygo_auth_failures
WHERE failures[cardinality(failures)] < clock_timestamp() - make_interval(secs => %(window)s)"""

# One row when the address has failures on record: (locked until, or NULL).
AUTH_LOCKED_UNTIL = f"""
SELECT {_LOCKED_UNTIL.format(failures="failures")} FROM dygo_auth_failures WHERE address = %(address)s"""

CLEAR_AUTH_FAILURES = "DELETE FROM dygo_auth_failures WHERE address = %s"

# Each recorded failure names its address on this channel (delivered at commit), so every serve process
# knows which addresses it must check in the table and can admit every other one without a read.
LISTEN_FOR_AUTH_FAILURES = "LISTEN dygo_auth_failures"
NOTIFY_AUTH_FAILURE = "SELECT pg_notify('dygo_auth_failures', %(address)s)"
# Run right after LISTEN_FOR_AUTH_FAILURES: what was recorded before it, the notifications tell the rest.
AUTH_FAILURE_ADDRESSES = "SELECT address FROM dygo_auth_failures"
