-- Undo 0020: the NOTIFY for jobs left pending names their queue only.
CREATE OR REPLACE FUNCTION dygo_notify_pending() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('dygo_jobs', q.queue)
    FROM (SELECT DISTINCT queue FROM new_rows WHERE state = 'pending') AS q;
    RETURN NULL;
END
$$;

DO $$
DECLARE
    body text := pg_get_functiondef('dygo_jobs_updated()'::regprocedure);
    queue_only text := $w$PERFORM pg_notify('dygo_jobs', q.queue) FROM (SELECT DISTINCT queue FROM new_rows WHERE state = 'pending') AS q;$w$;
    with_run_at text := $w$PERFORM pg_notify('dygo_jobs', q.queue || ' ' || extract(epoch FROM q.run_at)::text)
        FROM (SELECT queue, min(run_at) AS run_at FROM new_rows WHERE state = 'pending' GROUP BY queue) AS q;$w$;
BEGIN
    IF position(with_run_at IN body) = 0 THEN
        RAISE EXCEPTION 'dygo_jobs_updated() has no wake-up line to change back';
    END IF;
    EXECUTE replace(body, with_run_at, queue_only);
END
$$;
