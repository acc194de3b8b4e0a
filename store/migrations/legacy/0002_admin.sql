-- Legacy migration 0002_admin: finishes a database made before 0016_baseline. Never edit.

CREATE TABLE dygo_queues (
    name      text PRIMARY KEY,
    paused    boolean     NOT NULL DEFAULT false,
    paused_at timestamptz
);

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

CREATE FUNCTION dygo_count_enqueued() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO dygo_stats_deltas (day, queue, kind, enqueued)
    SELECT (now() AT TIME ZONE 'UTC')::date, queue, kind, count(*) FROM new_rows GROUP BY queue, kind;
    RETURN NULL;
END
$$;

CREATE TRIGGER dygo_jobs_counted AFTER INSERT ON dygo_jobs
    REFERENCING NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION dygo_count_enqueued();

CREATE INDEX dygo_jobs_parked ON dygo_jobs (state, id) INCLUDE (queue)
    WHERE state IN ('dead', 'paused', 'cancelled');
