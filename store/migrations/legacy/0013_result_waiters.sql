-- Notify only the jobs somebody waits for (issue 12, many workers).
--
-- Migration 0006 sent a `dygo_finished` NOTIFY for every statement that left jobs final. PostgreSQL
-- queues notifications in commit order: a notifying transaction holds one cluster-wide lock from its
-- NOTIFY queue insert through its commit's WAL flush, so every settle of a fleet committed one at a
-- time, whether anyone listened or not. Now a waiter (GET /api/v1/jobs/{id}?wait=, store.results.result)
-- registers a row here first, and the trigger notifies only the ids that have one.
--
-- The order that cannot miss a settle (READ COMMITTED):
-- * the trigger takes the advisory lock below in SHARE mode, then, in a later statement (a plpgsql
--   statement takes a fresh snapshot), reads this table;
-- * a waiter, in its own transaction, takes the same lock EXCLUSIVE (so it waits for every settle that
--   already holds it, that is for their commits), inserts its row, reads the job and commits.
-- A settle that took the lock before the waiter is committed when the waiter reads the job: the read
-- sees it final. One that takes it after waits for the waiter's commit, then its snapshot sees the row
-- and it notifies (delivered at its commit, to a waiter already listening).
--
-- A waiter deletes its row when done; a crashed waiter's row expires at expires_at, at most the longest
-- wait (60 s: a Python waiter refreshes its row once a minute) plus a grace, and the maintainer's
-- retention pass deletes it.
CREATE TABLE dygo_result_waiters (
    id         bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    job_id     bigint      NOT NULL,
    expires_at timestamptz NOT NULL
);
CREATE INDEX dygo_result_waiters_job ON dygo_result_waiters (job_id);
CREATE INDEX dygo_result_waiters_expires ON dygo_result_waiters (expires_at);

CREATE OR REPLACE FUNCTION dygo_notify_finished() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    -- Claims, lease renewals and retries leave no job final: no lock, no notification.
    IF NOT EXISTS (SELECT FROM new_rows WHERE state IN ('succeeded', 'dead', 'cancelled')) THEN
        RETURN NULL;
    END IF;
    -- The key is store/queries.py's RESULT_WAITERS_LOCK (two int4 keys: apart from dygo's one-bigint locks).
    PERFORM pg_advisory_xact_lock_shared(hashtext('dygo'), hashtext('dygo.result_waiters'));
    -- A later statement: its snapshot sees every waiter committed before the lock was granted.
    -- At most 390 ids per notification (20 bytes each at most) to stay under the 8000-byte limit.
    PERFORM pg_notify('dygo_finished', string_agg(f.id::text, ','))
    FROM (SELECT n.id, (row_number() OVER ()) / 390 AS chunk FROM new_rows n
          WHERE n.state IN ('succeeded', 'dead', 'cancelled')
            AND EXISTS (SELECT FROM dygo_result_waiters w WHERE w.job_id = n.id)) AS f
    GROUP BY f.chunk;
    RETURN NULL;
END
$$;
