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

-- Children: `ctx.call` and `ctx.map` (store/children.py tells the whole rule). A child job names its parent,
-- the parent's step that waits for it and its place in that step's list; other jobs store NULL in the three
-- (nullable columns added without a rewrite, and a plain job writes nothing more). The settle that moves the
-- parent to waiting inserts the children and the step row (op 'call' or 'map', state 'waiting'), so no
-- child exists before its parent's wait has committed; the step counts its children not yet ended.
ALTER TABLE dygo_jobs ADD COLUMN parent_id bigint, ADD COLUMN parent_step text, ADD COLUMN parent_index integer;
-- A parent's children (its job page's list), and the one child at each place of a step (the step's result).
-- Not unique: a step an operator forgot is recorded again with new children beside the old ones.
CREATE INDEX dygo_jobs_parent ON dygo_jobs (parent_id, parent_step, parent_index) WHERE parent_id IS NOT NULL;
ALTER TABLE dygo_steps ADD COLUMN children integer, ADD COLUMN children_left integer;  -- a call's or map's

-- Counts children that entered an ended state (`p_ended` > 0) or left one (< 0: an operator's retry) on
-- their parents' steps: one update of each step's row per statement, not one per child, steps locked in
-- (job, key) order; a step already done or failed is left as it is (its parent was told: a child retried
-- later changes nothing for it). A step whose last child ended is done, or failed when any child did not succeed, with
-- its result made once from the children's rows (a call: the child's result; a map: the results in input
-- order; failed: {"failed": [...], "results": [...]}), so the parent's replay never reads them. Its parent,
-- if waiting, is pending again (the update's trigger wakes a worker). Lock order: the children's rows (the
-- caller's), then step rows, then parent rows, all in key order; a parent's settle that waits again on a
-- step takes the step row before its own (store/sql/children.py LOCK_STEP), so the two queue.
CREATE FUNCTION dygo_children_ended(p_parents bigint[], p_keys text[], p_ended integer[]) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    v_parents bigint[] := '{}'; v_keys text[] := '{}'; v_left integer;
BEGIN
    -- One short update per step, in the callers' (job, key) order: each locks one row, always in that order.
    FOR i IN 1 .. cardinality(p_parents) LOOP
        UPDATE dygo_steps SET children_left = children_left - p_ended[i]
        WHERE job_id = p_parents[i] AND key = p_keys[i] AND state = 'waiting'
        RETURNING children_left INTO v_left;
        IF v_left <= 0 THEN
            v_parents := v_parents || p_parents[i];
            v_keys := v_keys || p_keys[i];
        END IF;
    END LOOP;
    IF cardinality(v_parents) = 0 THEN
        RETURN;
    END IF;
    -- A later statement: its snapshot sees every child whose end was counted before this one (each held the
    -- step's row until it committed). The newest child at each place counts; a place with none was deleted.
    UPDATE dygo_steps s
    SET state = CASE WHEN a.failed IS NULL THEN 'done' ELSE 'failed' END,
        result = CASE WHEN a.failed IS NOT NULL THEN jsonb_build_object('failed', a.failed, 'results', a.results)
                      WHEN s.op = 'call' THEN a.results -> 0 ELSE a.results END,
        duration = extract(epoch FROM now() - s.recorded_at)
    FROM (
        SELECT d.job_id, d.key, jsonb_agg(c.result ORDER BY i.i) AS results,
               jsonb_agg(jsonb_build_object('index', i.i, 'id', c.id, 'state', coalesce(c.state, 'deleted'),
                                            'error', CASE WHEN c.state = 'dead' THEN c.last_error END) ORDER BY i.i)
                   FILTER (WHERE c.state IS DISTINCT FROM 'succeeded') AS failed
        FROM unnest(v_parents, v_keys) AS d(job_id, key)
        JOIN dygo_steps st ON st.job_id = d.job_id AND st.key = d.key
        CROSS JOIN LATERAL generate_series(0, st.children - 1) AS i(i)
        LEFT JOIN LATERAL (
            SELECT j.id, j.state, j.result, j.last_error FROM dygo_jobs j
            WHERE j.parent_id = d.job_id AND j.parent_step = d.key AND j.parent_index = i.i
            ORDER BY j.id DESC LIMIT 1
        ) c ON true
        GROUP BY d.job_id, d.key
    ) a
    WHERE s.job_id = a.job_id AND s.key = a.key;
    UPDATE dygo_jobs SET state = 'pending', run_at = now()
    WHERE id = ANY(ARRAY(SELECT id FROM dygo_jobs WHERE id = ANY(v_parents) AND state = 'waiting'
                         ORDER BY id FOR NO KEY UPDATE))
      AND state = 'waiting';
END
$$;

-- 0017's trigger with a fourth part: children that entered or left an ended state are counted on their
-- parents' steps. The one read of the NEW rows learns whether any child moved other than to active (a claim
-- or a lease renewal): a plain job's statement pays one more aggregate over the rows it already reads.
CREATE OR REPLACE FUNCTION dygo_jobs_updated() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    any_pending boolean; any_ended boolean; any_workflow boolean; any_child boolean;
    moved_nodes bigint[]; n_succeeded integer[]; n_dead integer[]; n_cancelled integer[]; n_skipped integer[];
    n_results jsonb[];
    c_parents bigint[]; c_keys text[]; c_ended integer[];
BEGIN
    SELECT bool_or(state = 'pending'), bool_or(state IN ('succeeded', 'dead', 'cancelled', 'skipped')),
           bool_or(node_id IS NOT NULL), bool_or(parent_id IS NOT NULL AND state <> 'active')
    INTO any_pending, any_ended, any_workflow, any_child FROM new_rows;
    -- Wake-ups: one NOTIFY per queue with jobs pending again (a retry, a snooze, a revived job).
    IF any_pending THEN
        PERFORM pg_notify('dygo_jobs', q.queue) FROM (SELECT DISTINCT queue FROM new_rows WHERE state = 'pending') AS q;
    END IF;
    -- Result waiters. The key is store/sql/results.py's RESULT_WAITERS_LOCK (two int4 keys: apart from dygo's
    -- one-bigint locks), which orders this against a waiter's registration, so no settle is missed.
    IF any_ended THEN
        PERFORM pg_advisory_xact_lock_shared(hashtext('dygo'), hashtext('dygo.result_waiters'));
        -- A later statement: its snapshot sees every waiter committed before the lock was granted.
        -- At most 390 ids per notification (20 bytes each at most) to stay under the 8000-byte limit.
        PERFORM pg_notify('dygo_finished', string_agg(f.id::text, ','))
        FROM (SELECT n.id, (row_number() OVER ()) / 390 AS chunk FROM new_rows n
              WHERE n.state IN ('succeeded', 'dead', 'cancelled', 'skipped')
                AND EXISTS (SELECT FROM dygo_result_waiters w WHERE w.job_id = n.id)) AS f
        GROUP BY f.chunk;
    END IF;
    -- Workflow counts; dygo_advance moving jobs itself counts them.
    IF any_workflow AND current_setting('dygo.advancing', true) IS DISTINCT FROM 'on' THEN
        -- Planned afresh for each statement (EXECUTE): a plan kept from a first, one-row statement joins the
        -- transition tables by nested loop, quadratic in the rows of a later big one (a node's retry, a cancel).
        EXECUTE $query$
            WITH moved AS (
                SELECT n.node_id, o.state AS was, n.state AS now, n.result
                FROM new_rows n JOIN old_rows o USING (id)
                WHERE n.node_id IS NOT NULL
                  AND (o.state IN ('succeeded', 'dead', 'cancelled', 'skipped'))
                      <> (n.state IN ('succeeded', 'dead', 'cancelled', 'skipped'))
            ), d AS (
                SELECT node_id,
                    (count(*) FILTER (WHERE now = 'succeeded') - count(*) FILTER (WHERE was = 'succeeded'))::integer AS ds,
                    (count(*) FILTER (WHERE now = 'dead') - count(*) FILTER (WHERE was = 'dead'))::integer AS df,
                    (count(*) FILTER (WHERE now = 'cancelled') - count(*) FILTER (WHERE was = 'cancelled'))::integer AS dc,
                    (count(*) FILTER (WHERE now = 'skipped') - count(*) FILTER (WHERE was = 'skipped'))::integer AS dk,
                    (array_agg(result) FILTER (WHERE now = 'succeeded'))[1] AS result
                FROM moved GROUP BY node_id
            )
            SELECT array_agg(node_id ORDER BY node_id), array_agg(ds ORDER BY node_id), array_agg(df ORDER BY node_id),
                   array_agg(dc ORDER BY node_id), array_agg(dk ORDER BY node_id), array_agg(result ORDER BY node_id)
            FROM d
        $query$
        INTO moved_nodes, n_succeeded, n_dead, n_cancelled, n_skipped, n_results;
        IF moved_nodes IS NOT NULL THEN
            PERFORM dygo_tally(moved_nodes, n_succeeded, n_dead, n_cancelled, n_skipped, n_results);
        END IF;
    END IF;
    -- Children, after the workflows: a settle's workflow rows, nodes and jobs come before step rows and parents.
    -- Per step, the children ended in NEW less those ended in OLD: no join of the two (a child's parent and
    -- step never change), so one plan serves every statement, however many rows it has.
    IF any_child THEN
        SELECT array_agg(parent_id ORDER BY parent_id, parent_step),
               array_agg(parent_step ORDER BY parent_id, parent_step), array_agg(n ORDER BY parent_id, parent_step)
        INTO c_parents, c_keys, c_ended
        FROM (
            SELECT parent_id, parent_step, sum(d)::integer AS n
            FROM (SELECT parent_id, parent_step, 1 AS d FROM new_rows
                  WHERE parent_id IS NOT NULL AND state IN ('succeeded', 'dead', 'cancelled', 'skipped')
                  UNION ALL
                  SELECT parent_id, parent_step, -1 FROM old_rows
                  WHERE parent_id IS NOT NULL AND state IN ('succeeded', 'dead', 'cancelled', 'skipped')) AS m
            GROUP BY parent_id, parent_step
            HAVING sum(d) <> 0
        ) AS d;
        IF c_parents IS NOT NULL THEN
            PERFORM dygo_children_ended(c_parents, c_keys, c_ended);
        END IF;
    END IF;
    RETURN NULL;
END
$$;

-- 0017's delete trigger, and a child deleted before it ended counts as one that did not succeed: its parent
-- is not stranded, and learns it failed. One read of the OLD rows learns which part has work: a delete of
-- ended jobs (retention's) reads them once, as before.
CREATE OR REPLACE FUNCTION dygo_jobs_removed() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    any_node boolean; any_child boolean;
    removed_nodes bigint[]; removed integer[];
    c_parents bigint[]; c_keys text[]; c_ended integer[];
BEGIN
    SELECT bool_or(node_id IS NOT NULL), bool_or(parent_id IS NOT NULL) INTO any_node, any_child
    FROM old_rows WHERE state NOT IN ('succeeded', 'dead', 'cancelled', 'skipped');
    IF any_node THEN
        SELECT array_agg(node_id ORDER BY node_id), array_agg(n ORDER BY node_id) INTO removed_nodes, removed
        FROM (SELECT node_id, count(*)::integer AS n FROM old_rows
              WHERE node_id IS NOT NULL AND state NOT IN ('succeeded', 'dead', 'cancelled', 'skipped')
              GROUP BY node_id) AS d;
    END IF;
    IF removed_nodes IS NOT NULL THEN
        PERFORM dygo_tally(removed_nodes, array_fill(0, ARRAY[cardinality(removed_nodes)]),
                           array_fill(0, ARRAY[cardinality(removed_nodes)]), removed,
                           array_fill(0, ARRAY[cardinality(removed_nodes)]),
                           array_fill(NULL::jsonb, ARRAY[cardinality(removed_nodes)]));
    END IF;
    IF any_child THEN
        SELECT array_agg(parent_id ORDER BY parent_id, parent_step),
               array_agg(parent_step ORDER BY parent_id, parent_step), array_agg(n ORDER BY parent_id, parent_step)
        INTO c_parents, c_keys, c_ended
        FROM (SELECT parent_id, parent_step, count(*)::integer AS n FROM old_rows
              WHERE parent_id IS NOT NULL AND state NOT IN ('succeeded', 'dead', 'cancelled', 'skipped')
              GROUP BY parent_id, parent_step) AS d;
    END IF;
    IF c_parents IS NOT NULL THEN
        PERFORM dygo_children_ended(c_parents, c_keys, c_ended);
    END IF;
    RETURN NULL;
END
$$;

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

-- 0017's stop of workflows, and a running node's job that waits (an event, a child job) is cancelled like
-- one not yet started: it runs nothing until woken, and a later wake-up must not run it after its workflow
-- was cancelled.
CREATE OR REPLACE FUNCTION dygo_stop_workflows(workflows bigint[]) RETURNS bigint[]
LANGUAGE plpgsql AS $$
DECLARE
    touched bigint[];
BEGIN
    WITH doomed AS (
        UPDATE dygo_nodes SET cancels = cancels + 1
        WHERE workflow_id = ANY(workflows) AND state = 'waiting'
        RETURNING id
    )
    SELECT coalesce(array_agg(id), '{}') INTO touched FROM doomed;
    WITH stopped AS (
        SELECT * FROM dygo_move_node_jobs(
            ARRAY(SELECT id FROM dygo_nodes WHERE workflow_id = ANY(workflows) AND state = 'running' ORDER BY id),
            ARRAY['pending', 'paused', 'waiting'], 'cancelled')
    ), counted AS (
        UPDATE dygo_nodes n SET cancelled = n.cancelled + s.n, jobs_left = n.jobs_left - s.n
        FROM stopped s WHERE n.id = s.node_id
        RETURNING n.id
    )
    SELECT touched || coalesce(array_agg(id), '{}') INTO touched FROM counted;
    RETURN touched;
END
$$;
