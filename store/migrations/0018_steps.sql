-- Durable steps: what `ctx.step` and `ctx.step_tx` recorded for a job, one row per step, so that a later
-- attempt of the job (a retry, a recovery after a lost lease, an operator's retry) gets the stored result
-- instead of running the step again (store/steps.py tells the whole rule).
--
-- A step row outlives its job until the worker's retention pass deletes the rows whose job is gone
-- (sql/retention.py TRIM_ORPHAN_STEPS), whichever path deleted the job. Not a foreign key with ON DELETE
-- CASCADE: its per-row trigger would make every delete of jobs (retention's above all) several times
-- slower, steps or none. Job ids are never reused, so an orphan is never read. The primary key's index
-- serves the one read (all the steps of a job) and the write's conflict check.
CREATE TABLE dygo_steps (
    job_id      bigint      NOT NULL,
    key         text        NOT NULL,  -- the step's name and occurrence in a run: 'charge#1', 'charge#2'
    -- How it was recorded: 'step' (at least once), 'step_tx' (in the transaction of its own SQL) or
    -- 'sleep' (`ctx.sleep`: the job left its slot until wake_at).
    op          text        NOT NULL CHECK (op IN ('step', 'step_tx', 'sleep')),
    seq         integer     NOT NULL,  -- its call's position in the run that recorded it: replays are checked
    attempt     integer     NOT NULL,  -- the job's attempt that recorded it
    recorded_at timestamptz NOT NULL DEFAULT now(),
    duration    double precision NOT NULL,  -- seconds the step's function ran
    result      jsonb,                 -- its JSON result; NULL for None and for a sleep
    wake_at     timestamptz,           -- a sleep's end (NULL for the other ops)
    CHECK ((op = 'sleep') = (wake_at IS NOT NULL)),
    PRIMARY KEY (job_id, key)
);
