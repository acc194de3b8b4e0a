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

-- The update trigger's function (0018) wakes workers the same way: its wake-up line changes, the rest of
-- it stays as 0018 left it.
DO $$
DECLARE
    body text := pg_get_functiondef('dygo_jobs_updated()'::regprocedure);
    queue_only text := $w$PERFORM pg_notify('dygo_jobs', q.queue) FROM (SELECT DISTINCT queue FROM new_rows WHERE state = 'pending') AS q;$w$;
    with_run_at text := $w$PERFORM pg_notify('dygo_jobs', q.queue || ' ' || extract(epoch FROM q.run_at)::text)
        FROM (SELECT queue, min(run_at) AS run_at FROM new_rows WHERE state = 'pending' GROUP BY queue) AS q;$w$;
BEGIN
    IF position(queue_only IN body) = 0 THEN
        RAISE EXCEPTION 'dygo_jobs_updated() has no wake-up line to change';
    END IF;
    EXECUTE replace(body, queue_only, with_run_at);
END
$$;
