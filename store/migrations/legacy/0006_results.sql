-- Progress reports and waiting for a result.
--
-- progress: the latest `ctx.progress(fraction, message)` of the job's handler,
-- {"fraction", "message", "attempt", "at"}, written by its worker at most once a second per job.
-- It is kept after the job settles (the last value reported), and a retry overwrites it.
ALTER TABLE dygo_jobs ADD COLUMN progress jsonb;

-- Wake whoever waits for a result (`GET /api/v1/jobs/{id}?wait=`, store.results.result): one
-- NOTIFY per chunk of ids per statement that leaves jobs in a final state (a settle batch, a
-- cancel, an archive, a poisoned lease), sent when the transaction commits. Payload: ids joined by
-- commas, at most 390 per notification (20 bytes each at most) to stay under the 8000-byte limit.
-- A statement that leaves no job final (claims, lease renewals, retries) sends nothing.
CREATE FUNCTION dygo_notify_finished() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('dygo_finished', string_agg(f.id::text, ','))
    FROM (SELECT id, (row_number() OVER ()) / 390 AS chunk FROM new_rows
          WHERE state IN ('succeeded', 'dead', 'cancelled')) AS f
    GROUP BY f.chunk;
    RETURN NULL;
END
$$;

CREATE TRIGGER dygo_jobs_finished AFTER UPDATE ON dygo_jobs
    REFERENCING NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION dygo_notify_finished();
