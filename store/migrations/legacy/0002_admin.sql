-- The admin service: queue pauses, daily throughput rollups, and the index its lists need.

-- Queues an operator paused. Workers skip a paused queue when they claim (CLAIM_JOBS); a queue
-- without a row here runs.
CREATE TABLE dygo_queues (
    name      text PRIMARY KEY,
    paused    boolean     NOT NULL DEFAULT false,
    paused_at timestamptz
);

-- Daily throughput per UTC day, queue and kind, read by the stats endpoints.
-- Nothing on the job path writes these rows: that would make every settle of every worker
-- queue on the same hot row. Writers append to dygo_stats_deltas instead (no key, no index:
-- an insert there never waits for anyone), and the admin service folds the deltas into this
-- table in batches (store.admin.fold_stats).
CREATE TABLE dygo_daily_stats (
    day       date   NOT NULL,
    queue     text   NOT NULL,
    kind      text   NOT NULL,
    enqueued  bigint NOT NULL DEFAULT 0,
    succeeded bigint NOT NULL DEFAULT 0,
    failed    bigint NOT NULL DEFAULT 0,  -- failed attempts, retried or not
    dead      bigint NOT NULL DEFAULT 0,  -- out of attempts, aborted, poison, no handler or archived
    reaped    bigint NOT NULL DEFAULT 0,  -- expired leases recovered
    PRIMARY KEY (day, queue, kind)
);

-- One row per statement that changed counts (an enqueue, a settle batch, a recovery, an
-- archive), aggregated by queue and kind within that statement.
CREATE TABLE dygo_stats_deltas (
    day       date    NOT NULL,
    queue     text    NOT NULL,
    kind      text    NOT NULL,
    enqueued  integer NOT NULL DEFAULT 0,
    succeeded integer NOT NULL DEFAULT 0,
    failed    integer NOT NULL DEFAULT 0,
    dead      integer NOT NULL DEFAULT 0,
    reaped    integer NOT NULL DEFAULT 0
);

-- Enqueued counts come from a statement trigger, so every way in (enqueue, COPY batches,
-- schedules) is counted: one delta row per queue and kind per statement, not per job.
CREATE FUNCTION dygo_count_enqueued() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO dygo_stats_deltas (day, queue, kind, enqueued)
    SELECT (now() AT TIME ZONE 'UTC')::date, queue, kind, count(*) FROM new_rows GROUP BY queue, kind;
    RETURN NULL;
END
$$;

CREATE TRIGGER dygo_jobs_counted AFTER INSERT ON dygo_jobs
    REFERENCING NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION dygo_count_enqueued();

-- Dead, paused and cancelled jobs, newest first, for the admin lists, counts, purge, retry-all
-- and vacuum. A partial index only gets an entry when a row enters one of these states, so the
-- hot path (pending -> active -> succeeded) never writes to it.
CREATE INDEX dygo_jobs_parked ON dygo_jobs (state, id) INCLUDE (queue)
    WHERE state IN ('dead', 'paused', 'cancelled');
