-- A NOTIFY for jobs left pending also says where in line they are: the payload is the queue, a space, and
-- the earliest run_at (epoch seconds) of the statement's pending rows of that queue. A worker whose walk of
-- the ready index starts past that run_at (store/claim.py WalkStart) starts its next walk there instead,
-- so a job committed late, or put back in line with its old run_at, is claimed at once, with no look from
-- the head across the entries a held snapshot keeps. Queue names are kebab-case: the space is unambiguous.
CREATE OR REPLACE FUNCTION dygo_notify_pending() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('dygo_jobs', q.queue || ' ' || extract(epoch FROM q.run_at)::text)
    FROM (SELECT queue, min(run_at) AS run_at FROM new_rows WHERE state = 'pending' GROUP BY queue) AS q;
    RETURN NULL;
END
$$;
