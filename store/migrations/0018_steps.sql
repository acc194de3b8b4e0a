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

-- Events (`ctx.wait_for_event`, `dygo.emit`; store/events.py tells the whole rule). One row per event key:
-- the first emit writes its payload and emitted_at (first write wins: a later emit changes nothing), and a
-- wait that begins before any emit leaves a placeholder (emitted_at NULL), so that a waiting settle and an
-- emit always meet on the same row: the settle holds it FOR SHARE, the emit takes it exclusively, and
-- whichever comes second sees what the first did. Retention deletes a row once it is older than
-- event_retention (an emitted one counted from its emit).
CREATE TABLE dygo_events (
    key        text        PRIMARY KEY,
    payload    jsonb,                  -- the first emit's; NULL for null and for a placeholder
    emitted_at timestamptz,            -- its emit's transaction's start; NULL: a wait's placeholder, not emitted yet
    created_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX dygo_events_age ON dygo_events ((coalesce(emitted_at, created_at)));

-- The event waits an emit wakes (by key) and the timeout sweep finds (by deadline): waiting rows only.
CREATE INDEX dygo_steps_waits_for ON dygo_steps (waits_for) WHERE state = 'waiting';
CREATE INDEX dygo_steps_wait_deadline ON dygo_steps (wake_at) WHERE state = 'waiting';

-- Takes an event's row FOR SHARE, first leaving a placeholder if the key has none: the lock a waiting settle
-- holds against an emit of the key (store/sql/events.py LOCK_EVENT). Waiters share it, so they never queue
-- on each other. A loop, each statement with a fresh snapshot: a row another transaction inserted meanwhile
-- is then locked, and one deleted meanwhile (retention) is inserted again, so the call never returns unlocked.
-- An emit in flight holds the row: the settle waits for it at most 50 ms (its lock_timeout, then put back),
-- since it holds the worker's one shared connection; past that the settle fails with lock_not_available and
-- the worker settles those waits as a recheck instead (store/events.py recheck).
CREATE FUNCTION dygo_lock_event(p_key text) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    v_timeout text := current_setting('lock_timeout');
BEGIN
    PERFORM set_config('lock_timeout', '50ms', true);
    LOOP
        PERFORM 1 FROM dygo_events WHERE key = p_key FOR SHARE;
        EXIT WHEN FOUND;
        INSERT INTO dygo_events (key) VALUES (p_key) ON CONFLICT (key) DO NOTHING;
        EXIT WHEN FOUND;
    END LOOP;
    PERFORM set_config('lock_timeout', v_timeout, true);
END
$$;
