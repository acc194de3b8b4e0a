"""The worker's statements once jobs are claimed: wake-ups, lease renewal, settles, lease recovery and
progress (the claim's statements are in store/claim.py, with the row type they fill).

Run by store/leases.py (worker/listener.py, lease_keeper.py, settler.py, maintainer.py and progress.py
call it); INDEX_SCANS_ONLY also by store/maintenance.py's trims, NOTIFY_QUEUES also by store/limits.py.

Every statement here that updates several job rows (renew, settle, progress) first locks them in id
order, in its `locked` CTE: two transactions taking rows in the order of their arrays could each hold a
row the other wants, and deadlock. A settle's first statement locks its whole batch (%(lock)s), since a
transaction's locks are only ordered if the rows of its second statement were taken by its first.
`ANY(ARRAY(SELECT id FROM locked))` runs the CTE to its end, every lock taken, before the update starts.
"""

# The channel the dygo_notify_pending trigger sends each queue, with its jobs' earliest run_at, to.
LISTEN_FOR_JOBS = "LISTEN dygo_jobs"

# Sent in the same string as a worker statement that finds job rows by id (leases.on_indexes): a
# freshly migrated table of a few pages is cheapest to read whole, so the planner would take a sequential
# scan for the claim's and the settle's UPDATE until the table grew. Priced out, every lookup stays on its
# index whatever the statistics say.
# LOCAL: it ends with the statement's transaction, so a pooled server connection is left as it was.
INDEX_SCANS_ONLY = "SET LOCAL enable_seqscan = off"

# Wakes the workers of queues whose limited jobs a settle freed (the listener's channel, as the trigger
# sends); part of the settle's transaction, so delivered at its commit (store/limits.py freed_queues).
# Also sent when a limit changes (store/limits.py set_limit), so workers claim under it at once.
NOTIFY_QUEUES = "SELECT pg_notify('dygo_jobs', q) FROM unnest(%(queues)s::text[]) AS q"

RENEW_LEASES = """
WITH locked AS MATERIALIZED (
    SELECT id FROM dygo_jobs WHERE id = ANY(%(ids)s::bigint[]) ORDER BY id FOR NO KEY UPDATE
)
UPDATE dygo_jobs AS j SET lease_deadline = now() + make_interval(secs => %(ttl)s)
FROM unnest(%(ids)s::bigint[], %(tokens)s::uuid[]) AS s(id, token)
WHERE j.id = ANY(ARRAY(SELECT id FROM locked)) AND j.id = s.id AND j.lease_token = s.token
RETURNING j.id"""

# Every settle is fenced by the lease token: a worker that lost its lease changes nothing.
# Each settle statement also appends its counts, one row per queue and kind, to the stats
# deltas: an insert with no key, so settling workers never wait on each other for it.
# A settle also stores the run's latest `ctx.progress` report (the same value REPORT_PROGRESS writes),
# which the once-a-second writer (worker/progress.py) may not have written yet: a NULL fraction leaves the
# column as it is. A batch in which no job reported passes NULL arrays, which unnest pads with NULLs: no
# per-job cost.
SETTLE_SUCCEEDED = """
WITH locked AS MATERIALIZED (
    SELECT id FROM dygo_jobs WHERE id = ANY(%(lock)s::bigint[]) ORDER BY id FOR NO KEY UPDATE
), settled AS (
    UPDATE dygo_jobs AS j
    SET state = 'succeeded', finished_at = now(), result = s.result,
        lease_owner = NULL, lease_token = NULL, lease_deadline = NULL,
        progress = CASE WHEN s.fraction IS NULL THEN j.progress ELSE jsonb_build_object('fraction', s.fraction, 'message', s.message, 'attempt', j.attempt, 'at', now()) END
    FROM unnest(%(ids)s::bigint[], %(tokens)s::uuid[], %(results)s::jsonb[],
                %(fractions)s::float8[], %(messages)s::text[]) AS s(id, token, result, fraction, message)
    WHERE j.id = ANY(ARRAY(SELECT id FROM locked)) AND j.id = s.id AND j.lease_token = s.token
    RETURNING j.id, j.queue, j.kind
), counted AS (
    INSERT INTO dygo_stats_deltas (day, queue, kind, succeeded)
    SELECT (now() AT TIME ZONE 'UTC')::date, queue, kind, count(*) FROM settled GROUP BY queue, kind
)
SELECT id FROM settled"""  # noqa: E501

# A settle of both kinds (two statements) that holds jobs of workflows: the batch's rows, then its workflows'
# rows, in id order, before either statement. Each statement's trigger locks the workflows of its own jobs
# (migration 0017, dygo_lock_workflows), so without this the second could take a workflow of a lower id
# than the first had taken, while another settle holding that one waited for the first's: a deadlock.
LOCK_SETTLE_WORKFLOWS = """
WITH locked AS MATERIALIZED (
    SELECT id, node_id FROM dygo_jobs WHERE id = ANY(%(lock)s::bigint[]) ORDER BY id FOR NO KEY UPDATE
)
SELECT dygo_lock_workflows(ARRAY(SELECT node_id FROM locked WHERE node_id IS NOT NULL))"""

# Retry (pending after a delay), dead, snooze and hand-back (pending, attempt refunded) in one
# statement per batch; an error, when given, is appended to the attempt history. A hand-back keeps
# its run_at, so the job keeps its place at the head of the line instead of queueing behind the backlog.
SETTLE_UNSUCCESSFUL = """
WITH locked AS MATERIALIZED (
    SELECT id FROM dygo_jobs WHERE id = ANY(%(lock)s::bigint[]) ORDER BY id FOR NO KEY UPDATE
), settled AS (
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
    progress = CASE WHEN s.fraction IS NULL THEN j.progress ELSE jsonb_build_object('fraction', s.fraction, 'message', s.message, 'attempt', j.attempt, 'at', now()) END
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
SELECT id FROM settled"""  # noqa: E501


def _recovery(taken: str, error: str) -> str:
    """A recovery statement: the jobs of `taken` (a CTE body selecting ids, FOR UPDATE SKIP LOCKED) back to
    pending, their attempt refunded, or dead as poison past max_reaps; `error` (an SQL expression over the job
    row j) is what their history records. The lease's fencing goes with it: owner and token are cleared, so
    a settle from the worker that held them changes nothing. The one row returned carries the statement's
    clock and the ids and new states of the jobs it recovered."""
    return f"""
WITH taken AS (
{taken}
), recovered AS (
UPDATE dygo_jobs AS j
SET state = CASE WHEN j.reap_count + 1 > %(max_reaps)s THEN 'dead' ELSE 'pending' END,
    finished_at = CASE WHEN j.reap_count + 1 > %(max_reaps)s THEN now() END,
    dead_fingerprint = CASE WHEN j.reap_count + 1 > %(max_reaps)s
        THEN dygo_error_fingerprint({error}) ELSE j.dead_fingerprint END,
    attempt = j.attempt - 1, reap_count = j.reap_count + 1,
    last_error = {error},
    errors = j.errors || jsonb_build_array(jsonb_build_object(
        'attempt', j.attempt, 'at', now(), 'started_at', j.started_at, 'worker', j.lease_owner,
        'error', {error}, 'traceback', NULL)),
    lease_owner = NULL, lease_token = NULL, lease_deadline = NULL
FROM taken
WHERE j.id = taken.id
RETURNING j.id, j.state, j.queue, j.kind
), counted AS (
    INSERT INTO dygo_stats_deltas (day, queue, kind, reaped, dead)
    SELECT (now() AT TIME ZONE 'UTC')::date, queue, kind, count(*), count(*) FILTER (WHERE state = 'dead')
    FROM recovered GROUP BY queue, kind
)
SELECT now(), coalesce(array_agg(id), '{{}}'), coalesce(array_agg(state), '{{}}') FROM recovered"""


# A lease that ran out means its worker died or stalled: the job goes back, its attempt refunded,
# unless this has happened more than max_reaps times (poison: dead). It keeps its run_at, and so its
# place at the head of the line: behind a backlog, a crash would otherwise cost it the whole backlog.
# `since`: only deadlines from then on (the database's clock when the previous pass began, less a margin;
# NULL: every deadline). While something holds back VACUUM, the index keeps an entry for every lease taken
# since, and a walk from the oldest deadline would visit them all; this one walks the last pass's. The one
# row returned carries the statement's clock, where the next pass takes up.
RECOVER_EXPIRED_LEASES = _recovery(
    """    SELECT id FROM dygo_jobs
    WHERE state = 'active' AND lease_deadline < now()
      AND lease_deadline >= coalesce(%(since)s::timestamptz, '-infinity')
    ORDER BY lease_deadline
    LIMIT %(batch)s
    FOR UPDATE SKIP LOCKED""",
    "'lease expired: worker ' || coalesce(j.lease_owner, '?') || ' stopped renewing it'",
)

# --- presence: a worker's session-level advisory lock (worker/presence.py) ------------------------------
# Two int4 keys: the namespace, and the hash of the worker's id. A worker's id is unique (host, pid and a
# random part); two ids whose hashes collide make the second worker's HOLD_PRESENCE fail, and its jobs are
# then left to their leases.
PRESENCE_NAMESPACE = "hashtext('dygo.presence')"

# Taken by the worker on its session connection each time that session starts; the server releases it when
# the session ends, the worker's process dying with it.
HOLD_PRESENCE = f"SELECT pg_try_advisory_lock({PRESENCE_NAMESPACE}, hashtext(%(worker)s))"

# The presence locks held in this database now. pg_locks reads the server's whole lock table once.
_PRESENCE_HELD = f"""SELECT objid FROM pg_locks
    WHERE locktype = 'advisory' AND granted AND objsubid = 2 AND classid = {PRESENCE_NAMESPACE}::oid
      AND database = (SELECT oid FROM pg_database WHERE datname = current_database())"""

# Every registered worker and whether its presence lock is held now, with the server's start time: a
# different start time means a restart or another server (a failover), and what was seen before it is void.
WORKER_PRESENCE = f"""
WITH held AS MATERIALIZED ({_PRESENCE_HELD})
SELECT pg_postmaster_start_time(), coalesce(array_agg(w.id), '{{}}'),
       coalesce(array_agg(hashtext(w.id)::oid IN (SELECT objid FROM held)), '{{}}')
FROM dygo_workers AS w"""

# The active jobs of workers found gone (%(owners)s), back to their queue as after an expired lease. Their
# locks are checked again here, in the statement that takes the rows: a worker that took its lock again since
# keeps its jobs. The active rows are few (the busy slots): the dygo_jobs_leases partial index holds them all.
RECOVER_ABSENT_WORKERS = _recovery(
    f"""    SELECT id FROM dygo_jobs
    WHERE state = 'active' AND lease_owner = ANY(%(owners)s::text[])
      AND hashtext(lease_owner)::oid NOT IN ({_PRESENCE_HELD})
    LIMIT %(batch)s
    FOR UPDATE SKIP LOCKED""",
    "'worker ' || coalesce(j.lease_owner, '?') || ' is gone: its session to the database ended'",
)

# The latest progress of each job, one statement per batch (worker/progress.py), fenced by the lease token
# like a settle: a job settled or lost meanwhile keeps what it had.
REPORT_PROGRESS = """
WITH locked AS MATERIALIZED (
    SELECT id FROM dygo_jobs WHERE id = ANY(%(ids)s::bigint[]) ORDER BY id FOR NO KEY UPDATE
)
UPDATE dygo_jobs AS j
SET progress = jsonb_build_object('fraction', p.fraction, 'message', p.message, 'attempt', j.attempt, 'at', now())
FROM unnest(%(ids)s::bigint[], %(tokens)s::uuid[], %(fractions)s::float8[], %(messages)s::text[])
     AS p(id, token, fraction, message)
WHERE j.id = ANY(ARRAY(SELECT id FROM locked)) AND j.id = p.id AND j.lease_token = p.token AND j.state = 'active'
RETURNING j.id"""
