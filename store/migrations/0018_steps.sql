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
    -- How it was recorded: 'step' (at least once), 'step_tx' (in the transaction of its own SQL),
    -- 'sleep' (`ctx.sleep`: the job left its slot until wake_at), or a durable wait, recorded by the settle
    -- that moved the job to waiting: 'event' (`ctx.wait_for_event`), 'call' and 'map' (child jobs).
    op          text        NOT NULL CHECK (op IN ('step', 'step_tx', 'sleep', 'event', 'call', 'map')),
    seq         integer     NOT NULL,  -- its call's position in the run that recorded it: replays are checked
    attempt     integer     NOT NULL,  -- the job's attempt that recorded it
    recorded_at timestamptz NOT NULL DEFAULT now(),
    duration    double precision NOT NULL,  -- seconds the step's function ran
    result      jsonb,                 -- its JSON result; NULL for None and for a sleep
    wake_at     timestamptz,           -- a sleep's end; an event wait's timeout (NULL: none)
    -- A wait's: 'waiting' until what it waits for comes, then 'done' (its result stored), 'failed' (a child
    -- ended dead or cancelled: result says how) or 'timed_out'. NULL for the other ops.
    state       text CHECK (state IN ('waiting', 'done', 'failed', 'timed_out')),
    waits_for   text,                  -- an event wait's event key
    CHECK ((op IN ('event', 'call', 'map')) = (state IS NOT NULL)),
    CHECK (op = 'sleep' AND wake_at IS NOT NULL OR op IN ('step', 'step_tx', 'call', 'map') AND wake_at IS NULL
           OR op = 'event'),
    PRIMARY KEY (job_id, key)
);

-- Sleeps by wake time: /metrics counts the jobs asleep (store/sql/steps.py WAITING_BY_REASON) without
-- reading every step.
CREATE INDEX dygo_steps_sleeps ON dygo_steps (wake_at) WHERE op = 'sleep';
