-- Legacy migration 0003_schedules: finishes a database made before 0016_baseline. Never edit.

CREATE TABLE dygo_schedules (
    name         text PRIMARY KEY,
    spec         text        NOT NULL,                  -- 5-field cron or a descriptor such as @hourly
    timezone     text        NOT NULL DEFAULT 'UTC',    -- IANA name; the spec reads on its wall clock
    kind         text        NOT NULL,
    args         jsonb       NOT NULL DEFAULT '{}',
    queue        text        NOT NULL,
    priority     smallint,                              -- NULL: the kind's
    max_attempts integer,                               -- NULL: the kind's, else the configured default
    -- After downtime: 'once' fires one catch-up job, 'skip' fires none; either way no backfill burst.
    missed       text        NOT NULL DEFAULT 'once' CHECK (missed IN ('once', 'skip')),
    enabled      boolean     NOT NULL DEFAULT true,     -- false: no longer declared
    paused       boolean     NOT NULL DEFAULT false,    -- an operator's hold; survives deploys and syncs
    next_run_at  timestamptz,                           -- the next occurrence to fire
    last_run_at  timestamptz,                           -- when it last fired (on schedule or by hand)
    last_job_id  bigint,                                -- the job that fire enqueued
    created_at   timestamptz NOT NULL DEFAULT now(),
    updated_at   timestamptz NOT NULL DEFAULT now()
);

CREATE INDEX dygo_schedules_due ON dygo_schedules (next_run_at) WHERE enabled AND NOT paused;

CREATE FUNCTION dygo_notify_schedule() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('dygo_schedules', NEW.name);
    RETURN NULL;
END
$$;

CREATE TRIGGER dygo_schedules_added AFTER INSERT ON dygo_schedules FOR EACH ROW
    WHEN (NEW.enabled AND NOT NEW.paused) EXECUTE FUNCTION dygo_notify_schedule();
CREATE TRIGGER dygo_schedules_sooner AFTER UPDATE ON dygo_schedules FOR EACH ROW
    WHEN (NEW.enabled AND NOT NEW.paused AND NEW.next_run_at IS NOT NULL
          AND (NOT OLD.enabled OR OLD.paused OR OLD.next_run_at IS NULL OR NEW.next_run_at < OLD.next_run_at))
    EXECUTE FUNCTION dygo_notify_schedule();
