-- The dashboard at scale: a per-minute throughput rollup and a stored dead-letter fingerprint.

-- Each stats delta says when it was written, so the fold can also roll it up by minute. The default
-- fills it for every existing writer (settle, recovery, archive, the enqueue trigger) without
-- touching their statements: one delta row per statement still, never one per job.
ALTER TABLE dygo_stats_deltas ADD COLUMN at timestamptz NOT NULL DEFAULT now();

-- Throughput per UTC minute, queue and kind, for the overview's last-hour chart. Written only by the
-- fold (store.admin.fold_stats, store.maintenance.fold_stats), like dygo_daily_stats; the retention
-- pass deletes minutes older than a couple of hours, so the table stays a few thousand rows.
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

-- A dead job's error fingerprint: the first line of an error (exception type and message) with
-- uuids, hex and numbers normalised, so "order 123 failed" and "order 456 failed" group together.
-- The only definition: every statement that makes a job dead stores it (dead_fingerprint below).
CREATE FUNCTION dygo_error_fingerprint(error text) RETURNS text LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
SELECT regexp_replace(regexp_replace(regexp_replace(
    left(split_part(coalesce(error, ''), E'\n', 1), 300),
    '[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}', '<id>', 'gi'),
    '0x[0-9a-f]+', '<hex>', 'gi'),
    '[0-9]+', '<n>', 'g')
$$;

-- Set when a job dies (settle, poison recovery, archive); meaningless in any other state (a retried
-- job keeps its old value until it dies again), so every read also asks for state = 'dead'.
ALTER TABLE dygo_jobs ADD COLUMN dead_fingerprint text;
UPDATE dygo_jobs SET dead_fingerprint = dygo_error_fingerprint(last_error) WHERE state = 'dead';

-- Grouping the dead letters reads this index only (kind, fingerprint, count, first/last seen), and
-- a group's newest sample is its last entry; counting a queue's jobs dead for longer than an age
-- (vacuum dead's confirmation) reads it only too. Only dead rows enter it: nothing on the hot path.
CREATE INDEX dygo_jobs_dead_groups ON dygo_jobs (kind, dead_fingerprint, id) INCLUDE (finished_at, queue)
    WHERE state = 'dead';
