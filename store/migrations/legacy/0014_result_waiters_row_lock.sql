-- A waiter no longer holds up settles (migration 0013's advisory lock goes).
--
-- In 0013 every settle that finished jobs took one advisory lock shared, and a waiter's registration took
-- it exclusive: each registration stopped every such settle, cluster-wide, until it committed (and settles
-- queued behind it while it waited for those in flight). The waiter only needs its own job's settle, and
-- that settle holds the job's row lock from its UPDATE to its commit, so the waiter now waits on that row:
-- * the trigger reads this table in a statement after the settle's UPDATE (a plpgsql statement takes a
--   fresh snapshot) and notifies the ids that have a row;
-- * a waiter commits its row first, then reads the job FOR SHARE (a lock that conflicts with an UPDATE's),
--   then reads it again.
-- A settle whose trigger read this table before the waiter's row committed had updated the job before
-- that: it holds the row until it commits, so the waiter's FOR SHARE waits for that commit and the read
-- after it sees the job final. A settle whose trigger read it after sees the row and notifies (delivered
-- at its commit, to a waiter already listening).
CREATE OR REPLACE FUNCTION dygo_notify_finished() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    -- Claims, lease renewals and retries leave no job final: no notification.
    IF NOT EXISTS (SELECT FROM new_rows WHERE state IN ('succeeded', 'dead', 'cancelled')) THEN
        RETURN NULL;
    END IF;
    -- At most 390 ids per notification (20 bytes each at most) to stay under the 8000-byte limit.
    PERFORM pg_notify('dygo_finished', string_agg(f.id::text, ','))
    FROM (SELECT n.id, (row_number() OVER ()) / 390 AS chunk FROM new_rows n
          WHERE n.state IN ('succeeded', 'dead', 'cancelled')
            AND EXISTS (SELECT FROM dygo_result_waiters w WHERE w.job_id = n.id)) AS f
    GROUP BY f.chunk;
    RETURN NULL;
END
$$;
