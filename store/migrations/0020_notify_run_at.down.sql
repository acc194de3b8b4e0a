-- Undo 0020: the NOTIFY for jobs left pending names their queue only.
CREATE OR REPLACE FUNCTION dygo_notify_pending() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('dygo_jobs', q.queue)
    FROM (SELECT DISTINCT queue FROM new_rows WHERE state = 'pending') AS q;
    RETURN NULL;
END
$$;
