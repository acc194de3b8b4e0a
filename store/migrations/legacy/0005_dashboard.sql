-- Legacy migration 0005_dashboard: finishes a database made before 0016_baseline. Never edit.

ALTER TABLE dygo_stats_deltas ADD COLUMN at timestamptz NOT NULL DEFAULT now();

CREATE TABLE dygo_minute_stats (
    minute    timestamptz NOT NULL,
    queue     text        NOT NULL,
    kind      text        NOT NULL,
    enqueued  bigint      NOT NULL DEFAULT 0,
    succeeded bigint      NOT NULL DEFAULT 0,
    failed    bigint      NOT NULL DEFAULT 0,
    dead      bigint      NOT NULL DEFAULT 0,
    reaped    bigint      NOT NULL DEFAULT 0,
    PRIMARY KEY (minute, queue, kind)
);

CREATE FUNCTION dygo_error_fingerprint(error text) RETURNS text LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
SELECT regexp_replace(regexp_replace(regexp_replace(
    left(split_part(coalesce(error, ''), E'\n', 1), 300),
    '[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}', '<id>', 'gi'),
    '0x[0-9a-f]+', '<hex>', 'gi'),
    '[0-9]+', '<n>', 'g')
$$;

ALTER TABLE dygo_jobs ADD COLUMN dead_fingerprint text;
UPDATE dygo_jobs SET dead_fingerprint = dygo_error_fingerprint(last_error) WHERE state = 'dead';

CREATE INDEX dygo_jobs_dead_groups ON dygo_jobs (kind, dead_fingerprint, id) INCLUDE (finished_at, queue)
    WHERE state = 'dead';
