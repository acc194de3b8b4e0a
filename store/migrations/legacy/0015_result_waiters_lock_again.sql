-- Back to migration 0013's lock for result waiters: 0014's row lock hid jobs from claims.
--
-- In 0014 a waiter read its job FOR SHARE, to wait for a settle of it in flight. But a waiter registers
-- for a pending job too, and a claim (FOR UPDATE SKIP LOCKED) that met the job while that read held it
-- passed over it. The worker told of the job by its NOTIFY claimed once, found nothing, and slept until
-- its poll interval: a fresh-clone test run saw a job stay pending for 10 s with a waiter beside it, and
-- tests/test_result_waiters.py's claim test passed over 4 jobs in 200. Waiters must take no lock that a
-- claim can meet.
--
-- So the trigger takes 0013's advisory lock SHARE again before it reads the waiters, and a registration
-- takes it EXCLUSIVE, inserts its row and reads the job in one transaction (0013 says why that order
-- cannot miss a settle). The registration's transaction no longer waits for its WAL flush
-- (store/queries.py WAITER_TRANSACTION), so it holds up the settles behind it for less time than in 0013.
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
