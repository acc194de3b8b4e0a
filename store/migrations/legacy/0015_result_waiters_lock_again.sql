-- Legacy migration 0015_result_waiters_lock_again: finishes a database made before 0016_baseline. Never edit.

CREATE OR REPLACE FUNCTION dygo_notify_finished() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    -- Claims, lease renewals and retries leave no job final: no lock, no notification.
    IF NOT EXISTS (SELECT FROM new_rows WHERE state IN ('succeeded', 'dead', 'cancelled')) THEN
        RETURN NULL;
    END IF;
    -- The key is store/sql/results.py's RESULT_WAITERS_LOCK (two int4 keys: apart from dygo's one-bigint locks).
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
