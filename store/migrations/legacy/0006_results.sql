-- Legacy migration 0006_results: finishes a database made before 0016_baseline. Never edit.

ALTER TABLE dygo_jobs ADD COLUMN progress jsonb;

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
