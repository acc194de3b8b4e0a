"""Events: a wait's record in its settle, an emit, the timeout sweep and retention's trim (store/events.py runs
them; migration 0018 has the tables and dygo_lock_event).

Every path that ends a wait takes the rows in one order: the event's row, then step rows, then job rows. A
waiting settle holds the event's row FOR SHARE from before it takes any job row (store/leases.py Wait.lock)
until it commits; an emit takes it exclusively before it looks for waits. Whichever comes second runs its
next statement with a snapshot taken after the first committed, and so sees the other's work: a settle sees
the emit (and records its wait as done), or the emit sees the waiting step (and wakes it). A settle waits for
an emit in flight at most 50 ms (dygo_lock_event), then fails, and the worker settles the wait as a recheck
(store/events.py). The timeout sweep takes step rows with SKIP LOCKED, then job rows, and never an event's row.
"""

# The event's row, FOR SHARE until the settle's transaction ends (a placeholder first if the key has none).
LOCK_EVENT = "SELECT dygo_lock_event(%(event)s)"

# A run's wait, when the event was emitted before it: the step is recorded done with the event's payload,
# fenced by the lease like a step (store/sql/steps.py RECORD_STEP), and the run goes on without suspending.
# `emitted` false: not emitted yet (nothing written); the run suspends and its settle records the wait.
RECORD_EMITTED = """
WITH lease AS MATERIALIZED (
    SELECT id FROM dygo_jobs
    WHERE id = %(job_id)s AND lease_token = %(lease_token)s::uuid AND state = 'active'
    FOR SHARE
), event AS (
    SELECT payload FROM dygo_events WHERE key = %(event)s AND emitted_at IS NOT NULL
), recorded AS (
    INSERT INTO dygo_steps (job_id, key, op, seq, attempt, duration, result, state, waits_for)
    SELECT l.id, %(key)s, 'event', %(seq)s, %(attempt)s, 0, e.payload, 'done', %(event)s FROM lease l, event e
    ON CONFLICT (job_id, key) DO NOTHING
    RETURNING 1
)
SELECT EXISTS (SELECT FROM lease) AS leased, EXISTS (SELECT FROM event) AS emitted,
       EXISTS (SELECT FROM recorded) AS recorded, (SELECT payload::text FROM event) AS payload"""

# A suspended run's wait, after its settle in the same transaction (store/leases.py Wait.record), under the
# event's row (LOCK_EVENT): only for a job this transaction settled to waiting. The step is waiting, with its
# deadline (NULL: none); or done with the payload if the event was emitted meanwhile, and then the job is
# pending again at once. A wait recorded before (a replay that waits again) keeps its row and its deadline;
# if an emit or the timeout sweep ended it while its job ran (and so left the job as it was), the job is
# pending again at once too. An emit that came after the deadline does not count: the sweep ends the wait.
RECORD_WAIT = """
WITH fence AS (
    SELECT id FROM dygo_jobs WHERE id = %(job_id)s AND state = 'waiting' AND xmin = pg_current_xact_id()::xid
), event AS (
    SELECT payload FROM dygo_events WHERE key = %(event)s AND emitted_at IS NOT NULL
), recorded AS (
    INSERT INTO dygo_steps (job_id, key, op, seq, attempt, duration, result, wake_at, state, waits_for)
    SELECT f.id, %(key)s, 'event', %(seq)s, %(attempt)s, 0, e.payload,
           now() + make_interval(secs => %(timeout)s::float8),
           CASE WHEN EXISTS (SELECT FROM event) THEN 'done' ELSE 'waiting' END, %(event)s
    FROM fence f LEFT JOIN event e ON true
    ON CONFLICT (job_id, key) DO NOTHING
    RETURNING state
), woken AS (
    UPDATE dygo_jobs SET state = 'pending', run_at = now()
    WHERE id = (SELECT id FROM fence)
      AND (EXISTS (SELECT FROM recorded WHERE state = 'done')
           OR EXISTS (SELECT FROM dygo_steps WHERE job_id = %(job_id)s AND key = %(key)s
                                              AND state IN ('done', 'timed_out')))
    RETURNING 1
)
SELECT count(*) FROM woken"""

# An emit's first statement: the event's payload, unless emitted before (first write wins). It takes the row
# exclusively, so it waits for a settle holding it FOR SHARE. `isolation`: the caller's transaction's, which
# must be read committed: the wake-up's statement must see the waits committed while this one waited.
EMIT_EVENT = """
WITH emitted AS (
    INSERT INTO dygo_events AS e (key, payload, emitted_at)
    VALUES (%(event)s, %(payload)s::jsonb, now())
    ON CONFLICT (key) DO UPDATE SET payload = EXCLUDED.payload, emitted_at = EXCLUDED.emitted_at
    WHERE e.emitted_at IS NULL
    RETURNING 1
)
SELECT EXISTS (SELECT FROM emitted) AS first, current_setting('transaction_isolation') AS isolation"""

# An emit's second statement, sent with the first (one round trip) and run once the first has its row lock,
# with a snapshot taken then: if this transaction wrote the event (its emitted_at is this transaction's now(),
# where a duplicate's is an earlier transaction's; not xmin, which a savepoint makes a subtransaction's), every
# wait for the key whose deadline has not passed is done, with the event's payload and the seconds it waited,
# and its job, if still waiting, is pending now. Returns the jobs woken.
WAKE_WAITERS = """
WITH event AS (
    SELECT payload FROM dygo_events WHERE key = %(event)s AND emitted_at = now()
), done AS (
    UPDATE dygo_steps SET state = 'done', result = (SELECT payload FROM event),
        duration = greatest(extract(epoch FROM statement_timestamp() - recorded_at), 0)
    WHERE waits_for = %(event)s AND state = 'waiting' AND (wake_at IS NULL OR wake_at > statement_timestamp())
      AND EXISTS (SELECT FROM event)
    RETURNING job_id
), locked AS MATERIALIZED (
    SELECT id FROM dygo_jobs WHERE id IN (SELECT job_id FROM done) ORDER BY id FOR NO KEY UPDATE
), woken AS (
    UPDATE dygo_jobs SET state = 'pending', run_at = now()
    WHERE id = ANY(ARRAY(SELECT id FROM locked)) AND state = 'waiting'
    RETURNING 1
)
SELECT count(*) FROM woken"""

# An emit on an autocommit connection outside a transaction: its own, read committed whatever the default.
BEGIN_READ_COMMITTED = "BEGIN ISOLATION LEVEL READ COMMITTED"
COMMIT = "COMMIT"

# The timeout sweep (worker/event_timeouts.py): waits whose deadline has passed, oldest first, time out; their
# jobs, if still waiting, are pending now and raise EventTimeout at the wait. Everything with SKIP LOCKED, the
# waits' rows and then their jobs' (a wait whose job row another transaction holds is left for the next pass):
# the sweep never waits, so it cannot deadlock with a settle that holds a job's row and waits for its wait's
# row. A job row taken without waiting is its latest version, so the state it is moved from is the real one.
TIME_OUT_WAITS = """
WITH due AS MATERIALIZED (
    SELECT job_id, key FROM dygo_steps
    WHERE state = 'waiting' AND wake_at < statement_timestamp()
    ORDER BY wake_at LIMIT %(batch)s
    FOR UPDATE SKIP LOCKED
), jobs AS MATERIALIZED (
    SELECT id, state FROM dygo_jobs WHERE id IN (SELECT job_id FROM due) ORDER BY id FOR NO KEY UPDATE SKIP LOCKED
), timed_out AS (
    UPDATE dygo_steps s SET state = 'timed_out',
        duration = greatest(extract(epoch FROM statement_timestamp() - s.recorded_at), 0)
    FROM due d
    WHERE s.job_id = d.job_id AND s.key = d.key
      AND (d.job_id IN (SELECT id FROM jobs) OR NOT EXISTS (SELECT FROM dygo_jobs j WHERE j.id = d.job_id))
    RETURNING s.job_id
), woken AS (
    UPDATE dygo_jobs SET state = 'pending', run_at = now()
    WHERE id = ANY(ARRAY(SELECT job_id FROM timed_out)) AND id IN (SELECT id FROM jobs WHERE state = 'waiting')
    RETURNING 1
)
SELECT (SELECT count(*) FROM timed_out), (SELECT count(*) FROM woken)"""

# Retention (store/maintenance.py): events emitted, and placeholders left, longer ago than %(keep)s seconds,
# oldest first, by dygo_events_age. A placeholder deleted under a wait still waiting costs nothing: the emit
# finds the wait by its step row, and the next wait or emit writes the row again.
TRIM_EVENTS = """
WITH doomed AS (
    SELECT key FROM dygo_events
    WHERE coalesce(emitted_at, created_at) < now() - make_interval(secs => %(keep)s)
    ORDER BY coalesce(emitted_at, created_at) LIMIT %(batch)s
    FOR UPDATE SKIP LOCKED
), trimmed AS (
    DELETE FROM dygo_events WHERE key = ANY(ARRAY(SELECT key FROM doomed)) RETURNING 1
)
SELECT count(*) FROM trimmed"""
