-- Workflows: graphs of ordinary jobs. A node is one job or a group of any number of jobs; an edge makes
-- its downstream node wait until its upstream node has ended. Counters on the node rows decide, in the
-- transaction that ends a job, when a node ends and when the nodes after it are released, cancelled or
-- skipped: no sweeper, and no need to keep finished jobs (store/workflows.py tells the whole rule).

-- waiting: its node waits for its upstream nodes, never claimable. skipped: ended without running, on purpose.
ALTER TABLE dygo_jobs DROP CONSTRAINT dygo_jobs_state_check;
ALTER TABLE dygo_jobs ADD CONSTRAINT dygo_jobs_state_check CHECK (state IN
    ('pending', 'active', 'succeeded', 'dead', 'paused', 'cancelled', 'waiting', 'skipped')) NOT VALID;
ALTER TABLE dygo_jobs VALIDATE CONSTRAINT dygo_jobs_state_check;
ALTER TABLE dygo_jobs ADD COLUMN node_id bigint;  -- NULL for a job outside any workflow
CREATE INDEX dygo_jobs_node ON dygo_jobs (node_id, id) WHERE node_id IS NOT NULL;

CREATE TABLE dygo_workflows (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    name text NOT NULL,
    -- running until every node has ended; then succeeded when none failed or was cancelled.
    state text NOT NULL DEFAULT 'running' CHECK (state IN ('running', 'succeeded', 'failed', 'cancelled')),
    fail_fast boolean NOT NULL DEFAULT false,  -- the first failed node cancels every node not yet ended
    nodes integer NOT NULL,
    nodes_left integer NOT NULL,     -- not yet ended
    nodes_failed integer NOT NULL DEFAULT 0,  -- ended failed or cancelled
    idempotency_key text UNIQUE,
    created_at timestamptz NOT NULL DEFAULT now(),
    finished_at timestamptz
);
CREATE INDEX dygo_workflows_state ON dygo_workflows (state, id);
CREATE INDEX dygo_workflows_finished ON dygo_workflows (finished_at) WHERE state <> 'running';

CREATE TABLE dygo_nodes (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    workflow_id bigint NOT NULL REFERENCES dygo_workflows (id) ON DELETE CASCADE,
    name text NOT NULL,
    is_group boolean NOT NULL,
    -- waiting: for its upstream nodes; running: its jobs are released; then how it ended.
    state text NOT NULL CHECK (state IN ('waiting', 'running', 'succeeded', 'failed', 'cancelled', 'skipped')),
    sealed boolean NOT NULL DEFAULT true,  -- an open batch takes more jobs and cannot end until sealed
    -- A group succeeds with at most this many jobs not succeeded (1 and up: a count; below 1: a fraction).
    allow_failures double precision NOT NULL DEFAULT 0 CHECK (allow_failures >= 0),
    jobs integer NOT NULL DEFAULT 0,
    jobs_left integer NOT NULL DEFAULT 0,  -- not yet ended
    succeeded integer NOT NULL DEFAULT 0,
    dead integer NOT NULL DEFAULT 0,
    cancelled integer NOT NULL DEFAULT 0,
    skipped integer NOT NULL DEFAULT 0,
    deps integer NOT NULL DEFAULT 0,       -- edges into it
    deps_left integer NOT NULL DEFAULT 0,  -- of those, still open (upstream not ended)
    held integer NOT NULL DEFAULT 0,       -- of those, holding it (a failed upstream under `hold`)
    cancels integer NOT NULL DEFAULT 0,    -- of those, cancelling it
    skips integer NOT NULL DEFAULT 0,      -- of those, skipping it
    job_id bigint,                         -- a single-job node's job
    result jsonb,                          -- a single-job node's result, kept when retention deletes the job
    finished_at timestamptz,
    UNIQUE (workflow_id, name)
);

CREATE TABLE dygo_edges (
    workflow_id bigint NOT NULL REFERENCES dygo_workflows (id) ON DELETE CASCADE,
    upstream bigint NOT NULL REFERENCES dygo_nodes (id) ON DELETE CASCADE,
    downstream bigint NOT NULL REFERENCES dygo_nodes (id) ON DELETE CASCADE,
    -- What the downstream node does when the upstream one ends other than succeeded (on_failure: runs
    -- only then, and is skipped when it succeeded).
    policy text NOT NULL CHECK (policy IN ('cancel', 'continue', 'skip', 'hold', 'on_failure')),
    state text NOT NULL DEFAULT 'open' CHECK (state IN ('open', 'met', 'cancel', 'skip', 'held')),
    PRIMARY KEY (upstream, downstream)
);
CREATE INDEX dygo_edges_downstream ON dygo_edges (downstream);
CREATE INDEX dygo_edges_workflow ON dygo_edges (workflow_id);

-- How a node whose jobs have all ended ended.
CREATE FUNCTION dygo_node_outcome(jobs integer, succeeded integer, dead integer, cancelled integer,
                                  allow_failures double precision) RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
SELECT CASE
    WHEN jobs - succeeded <= CASE WHEN allow_failures >= 1 THEN floor(allow_failures)
                                  ELSE floor(allow_failures * jobs) END THEN 'succeeded'
    WHEN dead > 0 THEN 'failed'
    WHEN cancelled > 0 THEN 'cancelled'
    ELSE 'skipped' END
$$;

-- What an open edge becomes when its upstream node ends as `outcome`. A skipped node skips what needs it
-- (unless the edge continues regardless): skipping cascades and is never a failure.
CREATE FUNCTION dygo_edge_state(policy text, outcome text) RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
SELECT CASE
    WHEN outcome = 'succeeded' THEN CASE WHEN policy = 'on_failure' THEN 'skip' ELSE 'met' END
    WHEN policy = 'continue' THEN 'met'
    WHEN outcome = 'skipped' THEN 'skip'
    WHEN policy = 'on_failure' THEN 'met'
    WHEN policy = 'cancel' THEN 'cancel'
    WHEN policy = 'skip' THEN 'skip'
    ELSE 'held' END
$$;

-- Sets the ended jobs of the given nodes to `state`, as the engine's own move: the job triggers leave the
-- counting to the caller (dygo.advancing).
CREATE FUNCTION dygo_move_node_jobs(nodes bigint[], from_states text[], to_state text) RETURNS TABLE (node_id bigint, n bigint)
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM set_config('dygo.advancing', 'on', true);
    RETURN QUERY
    WITH moved AS (
        UPDATE dygo_jobs j SET state = to_state,
            finished_at = CASE WHEN to_state IN ('cancelled', 'skipped') THEN now() END,
            run_at = CASE WHEN to_state = 'pending' THEN greatest(j.run_at, now()) ELSE j.run_at END
        WHERE j.node_id = ANY(nodes) AND j.state = ANY(from_states)
        RETURNING j.node_id
    )
    SELECT m.node_id, count(*) FROM moved m GROUP BY m.node_id;
    PERFORM set_config('dygo.advancing', '', true);
END
$$;

-- Cancels every node of the workflows not yet ended: waiting ones whole, running ones' jobs not yet started
-- (a job already running ends as it will, and its node with it). The nodes to advance from come back.
-- Run by fail_fast's first failure and by an operator's cancel of a workflow.
CREATE FUNCTION dygo_stop_workflows(workflows bigint[]) RETURNS bigint[]
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
            ARRAY['pending', 'paused'], 'cancelled')
    ), counted AS (
        UPDATE dygo_nodes n SET cancelled = n.cancelled + s.n, jobs_left = n.jobs_left - s.n
        FROM stopped s WHERE n.id = s.node_id
        RETURNING n.id
    )
    SELECT touched || coalesce(array_agg(id), '{}') INTO touched FROM counted;
    RETURN touched;
END
$$;

-- Moves workflows on from the given nodes, whose counters just changed, until nothing more follows:
-- * a node that had ended and has jobs again (a retry) runs again, and what it had cancelled, skipped or
--   held waits for it again;
-- * a running node whose jobs have all ended (and that is sealed) ends, with its outcome;
-- * each edge out of an ended node settles by its policy, and its downstream node counts it: cancelled or
--   skipped by it (with all its jobs), held, or released (its jobs pending) once nothing is open;
-- * a workflow counts its ended nodes, and under fail_fast its first failure cancels every node not ended.
-- The caller holds the workflows' rows (dygo_lock_workflows): every node row it locks here, and every
-- job row it moves, is taken under them, so two transactions never take them in opposite orders.
CREATE FUNCTION dygo_advance(start bigint[]) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    v_frontier bigint[] := start;
    v_later bigint[];       -- nodes to look at again in the next round
    v_rearmed bigint[];
    v_ended bigint[];
    v_cancelled bigint[];
    v_skipped bigint[];
    v_released bigint[];
    v_failing bigint[];
BEGIN
    WHILE cardinality(v_frontier) > 0 LOOP
        v_later := '{}';

        -- Nodes that ended and have jobs again run (or wait) again, and so do their workflows.
        WITH before AS MATERIALIZED (
            SELECT id, workflow_id, state FROM dygo_nodes
            WHERE id = ANY(v_frontier) AND state IN ('succeeded', 'failed', 'cancelled', 'skipped') AND jobs_left > 0
            ORDER BY id FOR NO KEY UPDATE
        ), again AS (
            UPDATE dygo_nodes n
            SET state = CASE WHEN n.deps_left = 0 AND n.held = 0 THEN 'running' ELSE 'waiting' END, finished_at = NULL
            FROM before b WHERE n.id = b.id
            RETURNING n.id, b.workflow_id, b.state AS was
        ), counted AS (
            UPDATE dygo_workflows w SET nodes_left = w.nodes_left + a.n, nodes_failed = w.nodes_failed - a.failed,
                state = CASE WHEN w.state = 'cancelled' THEN w.state ELSE 'running' END, finished_at = NULL
            FROM (SELECT workflow_id, count(*) AS n, count(*) FILTER (WHERE was IN ('failed', 'cancelled')) AS failed
                  FROM again GROUP BY workflow_id) a
            WHERE w.id = a.workflow_id
        )
        SELECT coalesce(array_agg(id ORDER BY id), '{}') INTO v_rearmed FROM again;

        -- What a re-armed node had settled by ending badly opens again: its downstream nodes count the edge
        -- as open, and those it had cancelled or skipped (and nothing else did) wait again, with all their
        -- jobs; they are re-armed in turn in the next round.
        IF cardinality(v_rearmed) > 0 THEN
            WITH reopened AS (
                -- `before`: the same row as the statement's snapshot sees it, so its state before the update.
                UPDATE dygo_edges e SET state = 'open'
                FROM dygo_edges before
                WHERE e.upstream = ANY(v_rearmed) AND e.state IN ('cancel', 'skip', 'held')
                  AND before.upstream = e.upstream AND before.downstream = e.downstream
                RETURNING e.downstream, before.state AS was
            ), counts AS (
                SELECT downstream, count(*) AS n, count(*) FILTER (WHERE was = 'held') AS held,
                       count(*) FILTER (WHERE was = 'cancel') AS cancels, count(*) FILTER (WHERE was = 'skip') AS skips
                FROM reopened GROUP BY downstream
            ), locked AS MATERIALIZED (
                SELECT id FROM dygo_nodes WHERE id IN (SELECT downstream FROM counts) ORDER BY id FOR NO KEY UPDATE
            ), undone AS (
                UPDATE dygo_nodes n SET deps_left = n.deps_left + c.n, held = n.held - c.held,
                    cancels = n.cancels - c.cancels, skips = n.skips - c.skips
                FROM counts c WHERE n.id = c.downstream AND n.id IN (SELECT id FROM locked)
                RETURNING n.id, n.state, n.cancels, n.skips
            )
            SELECT coalesce(array_agg(id ORDER BY id), '{}') INTO v_later FROM undone
            WHERE state IN ('cancelled', 'skipped') AND cancels = 0 AND skips = 0;
            IF cardinality(v_later) > 0 THEN
                -- Counted from the jobs that came back: one deleted meanwhile (retention) stays cancelled.
                WITH back AS (
                    SELECT * FROM dygo_move_node_jobs(v_later, ARRAY['cancelled', 'skipped'], 'waiting')
                )
                UPDATE dygo_nodes n SET jobs_left = coalesce(b.n, 0), cancelled = n.jobs - coalesce(b.n, 0), skipped = 0
                FROM unnest(v_later) AS v(id) LEFT JOIN back b ON b.node_id = v.id
                WHERE n.id = v.id;
            END IF;
        END IF;

        -- Running nodes whose jobs have all ended end now, with their outcome; so does a waiting node all of
        -- whose jobs an operator skipped, cancelled or deleted, held or not (an empty group, which has none, waits
        -- its turn).
        WITH done AS (
            UPDATE dygo_nodes n
            SET state = dygo_node_outcome(n.jobs, n.succeeded, n.dead, n.cancelled, n.allow_failures), finished_at = now()
            WHERE n.id = ANY(v_frontier) AND (n.state = 'running' OR (n.state = 'waiting' AND n.jobs > 0))
              AND n.jobs_left = 0 AND n.sealed
            RETURNING n.id
        )
        SELECT coalesce(array_agg(id ORDER BY id), '{}') INTO v_ended FROM done;

        -- Waiting nodes an edge cancels or skips end so, with all their jobs.
        WITH doomed AS (
            UPDATE dygo_nodes n SET state = CASE WHEN n.cancels > 0 THEN 'cancelled' ELSE 'skipped' END,
                cancelled = n.cancelled + CASE WHEN n.cancels > 0 THEN n.jobs_left ELSE 0 END,
                skipped = n.skipped + CASE WHEN n.cancels > 0 THEN 0 ELSE n.jobs_left END,
                jobs_left = 0, finished_at = now()
            WHERE n.id = ANY(v_frontier) AND n.state = 'waiting' AND (n.cancels > 0 OR n.skips > 0)
            RETURNING n.id, n.state
        )
        SELECT coalesce(array_agg(id ORDER BY id) FILTER (WHERE state = 'cancelled'), '{}'),
               coalesce(array_agg(id ORDER BY id) FILTER (WHERE state = 'skipped'), '{}')
        INTO v_cancelled, v_skipped FROM doomed;
        IF cardinality(v_cancelled) > 0 THEN
            PERFORM count(*) FROM dygo_move_node_jobs(v_cancelled, ARRAY['waiting'], 'cancelled');
        END IF;
        IF cardinality(v_skipped) > 0 THEN
            PERFORM count(*) FROM dygo_move_node_jobs(v_skipped, ARRAY['waiting'], 'skipped');
        END IF;
        v_ended := v_ended || v_cancelled || v_skipped;

        -- Waiting nodes with nothing open or holding them are v_released: their jobs become pending. One
        -- without jobs (an empty map, a batch sealed empty) ends in the next round.
        WITH go AS (
            UPDATE dygo_nodes n SET state = 'running'
            WHERE n.id = ANY(v_frontier) AND n.state = 'waiting' AND n.deps_left = 0 AND n.held = 0
              AND n.cancels = 0 AND n.skips = 0
            RETURNING n.id, n.jobs_left, n.sealed
        )
        SELECT coalesce(array_agg(id ORDER BY id), '{}'),
               v_later || coalesce(array_agg(id) FILTER (WHERE jobs_left = 0 AND sealed), '{}')
        INTO v_released, v_later FROM go;
        IF cardinality(v_released) > 0 THEN
            PERFORM count(*) FROM dygo_move_node_jobs(v_released, ARRAY['waiting'], 'pending');
        END IF;

        v_frontier := v_later;
        CONTINUE WHEN cardinality(v_ended) = 0;

        -- The workflows count their ended nodes.
        WITH counts AS (
            SELECT workflow_id, count(*) AS n, count(*) FILTER (WHERE state IN ('failed', 'cancelled')) AS failed
            FROM dygo_nodes WHERE id = ANY(v_ended) GROUP BY workflow_id
        ), counted AS (
            UPDATE dygo_workflows w SET nodes_left = w.nodes_left - c.n, nodes_failed = w.nodes_failed + c.failed,
                state = CASE WHEN w.state = 'cancelled' OR w.nodes_left - c.n > 0 THEN w.state
                             WHEN w.nodes_failed + c.failed = 0 THEN 'succeeded' ELSE 'failed' END,
                finished_at = CASE WHEN w.nodes_left - c.n = 0 THEN now() END
            FROM counts c WHERE w.id = c.workflow_id
            RETURNING w.id, w.fail_fast, c.failed
        )
        SELECT coalesce(array_agg(id), '{}') INTO v_failing FROM counted WHERE fail_fast AND failed > 0;

        -- Each open edge out of an ended node settles by its policy; its downstream node counts it.
        WITH outcomes AS (
            SELECT id, state FROM dygo_nodes WHERE id = ANY(v_ended)
        ), settled AS (
            UPDATE dygo_edges e SET state = dygo_edge_state(e.policy, o.state)
            FROM outcomes o WHERE e.upstream = o.id AND e.state = 'open'
            RETURNING e.downstream, e.state
        ), counts AS (
            SELECT downstream, count(*) AS n, count(*) FILTER (WHERE state = 'held') AS held,
                   count(*) FILTER (WHERE state = 'cancel') AS cancels, count(*) FILTER (WHERE state = 'skip') AS skips
            FROM settled GROUP BY downstream
        ), locked AS MATERIALIZED (
            SELECT id FROM dygo_nodes WHERE id IN (SELECT downstream FROM counts) ORDER BY id FOR NO KEY UPDATE
        ), counted AS (
            UPDATE dygo_nodes n SET deps_left = n.deps_left - c.n, held = n.held + c.held,
                cancels = n.cancels + c.cancels, skips = n.skips + c.skips
            FROM counts c WHERE n.id = c.downstream AND n.id IN (SELECT id FROM locked)
            RETURNING n.id
        )
        SELECT v_frontier || coalesce(array_agg(id ORDER BY id), '{}') INTO v_frontier FROM counted;

        IF cardinality(v_failing) > 0 THEN
            v_frontier := v_frontier || dygo_stop_workflows(v_failing);
        END IF;
    END LOOP;
END
$$;

-- Locks the rows of the workflows the given nodes belong to, in id order. Whatever changes a workflow's
-- counters takes them first: its workflow rows, then node rows, then the job rows its advance moves. A
-- node's end updates its workflow's row, and a later round or an operator's cancel locks more nodes and
-- jobs of that workflow, so a transaction that locked a node before the workflow could wait for one that
-- holds the workflow and wants that node: a deadlock. Under the workflow's row they queue instead.
CREATE FUNCTION dygo_lock_workflows(p_nodes bigint[]) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM 1 FROM dygo_workflows WHERE id IN (SELECT workflow_id FROM dygo_nodes WHERE id = ANY(p_nodes))
    ORDER BY id FOR NO KEY UPDATE;
END
$$;

-- Counts, per node, jobs that entered an ended state (succeeded, dead, cancelled, skipped) or left one (a
-- retry), and advances the workflows from those nodes. Only rows a statement really moved count: a settle
-- fenced out by its lease token moves none.
CREATE FUNCTION dygo_tally(p_nodes bigint[], p_succeeded integer[], p_dead integer[], p_cancelled integer[],
                           p_skipped integer[], p_results jsonb[]) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM dygo_lock_workflows(p_nodes);
    WITH d AS (
        SELECT * FROM unnest(p_nodes, p_succeeded, p_dead, p_cancelled, p_skipped, p_results)
                      AS d(node, ds, df, dc, dk, result)
    ), locked AS MATERIALIZED (
        SELECT id FROM dygo_nodes WHERE id = ANY(p_nodes) ORDER BY id FOR NO KEY UPDATE
    )
    UPDATE dygo_nodes n SET succeeded = n.succeeded + d.ds, dead = n.dead + d.df, cancelled = n.cancelled + d.dc,
        skipped = n.skipped + d.dk, jobs_left = n.jobs_left - (d.ds + d.df + d.dc + d.dk),
        result = CASE WHEN n.is_group THEN NULL WHEN d.ds > 0 THEN d.result WHEN d.ds < 0 THEN NULL ELSE n.result END
    FROM d WHERE n.id = d.node AND n.id IN (SELECT id FROM locked);
    PERFORM dygo_advance(p_nodes);
END
$$;

-- Every update of jobs calls one statement trigger, which reads its NEW rows once to learn which of its
-- three parts have work: wake the workers of queues with jobs pending again (0016's dygo_jobs_updated),
-- tell result waiters of jobs that ended (0016's dygo_jobs_finished), and count workflow jobs that entered or
-- left an ended state. One function call per statement instead of three keeps a plain job's claim and
-- settle at their cost without workflows (bench/trigger_cost.py).
DROP TRIGGER dygo_jobs_updated ON dygo_jobs;
DROP TRIGGER dygo_jobs_finished ON dygo_jobs;
DROP FUNCTION dygo_notify_finished();

CREATE FUNCTION dygo_jobs_updated() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    any_pending boolean; any_ended boolean; any_workflow boolean;
    moved_nodes bigint[]; n_succeeded integer[]; n_dead integer[]; n_cancelled integer[]; n_skipped integer[];
    n_results jsonb[];
BEGIN
    SELECT bool_or(state = 'pending'), bool_or(state IN ('succeeded', 'dead', 'cancelled', 'skipped')),
           bool_or(node_id IS NOT NULL)
    INTO any_pending, any_ended, any_workflow FROM new_rows;
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
    IF NOT any_workflow OR current_setting('dygo.advancing', true) = 'on' THEN
        RETURN NULL;
    END IF;
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
    RETURN NULL;
END
$$;

CREATE TRIGGER dygo_jobs_updated AFTER UPDATE ON dygo_jobs
    REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION dygo_jobs_updated();

-- A job deleted before it ended (a purge, a delete) counts as cancelled: what waits on it is not stranded.
CREATE FUNCTION dygo_jobs_removed() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    removed_nodes bigint[]; removed integer[];
BEGIN
    SELECT array_agg(node_id ORDER BY node_id), array_agg(n ORDER BY node_id) INTO removed_nodes, removed
    FROM (SELECT node_id, count(*)::integer AS n FROM old_rows
          WHERE node_id IS NOT NULL AND state NOT IN ('succeeded', 'dead', 'cancelled', 'skipped')
          GROUP BY node_id) AS d;
    IF removed_nodes IS NOT NULL THEN
        PERFORM dygo_tally(removed_nodes, array_fill(0, ARRAY[cardinality(removed_nodes)]),
                           array_fill(0, ARRAY[cardinality(removed_nodes)]), removed,
                           array_fill(0, ARRAY[cardinality(removed_nodes)]),
                           array_fill(NULL::jsonb, ARRAY[cardinality(removed_nodes)]));
    END IF;
    RETURN NULL;
END
$$;

CREATE TRIGGER dygo_jobs_removed AFTER DELETE ON dygo_jobs
    REFERENCING OLD TABLE AS old_rows
    FOR EACH STATEMENT EXECUTE FUNCTION dygo_jobs_removed();

-- A job of a workflow may be retried only when its node may run: one cancelled or skipped because of a node
-- before it waits for that node's retry instead (store/sql/admin_jobs.py REVIVED's statements ask this).
CREATE FUNCTION dygo_may_revive(node bigint) RETURNS boolean
LANGUAGE sql STABLE AS $$
SELECT node IS NULL OR NOT EXISTS (
    SELECT FROM dygo_nodes n WHERE n.id = node AND (n.cancels > 0 OR n.skips > 0 OR n.deps_left > 0 OR n.held > 0))
$$;

-- The admin's lists, counts and retention of parked jobs (migration 0016) take the two new states: a job
-- that waits for its node, and one its workflow skipped.
DROP INDEX dygo_jobs_parked;
CREATE INDEX dygo_jobs_parked ON dygo_jobs (state, id) INCLUDE (queue)
    WHERE state IN ('dead', 'paused', 'cancelled', 'waiting', 'skipped');

-- A workflow's waiter (GET /api/v1/workflows/{id}?wait=) registers in dygo_result_waiters as job id minus
-- the workflow's id, and hears the workflow end on dygo_finished as a job's waiter hears its job: whatever
-- ended it (a settle, a cancel, a seal), under the same lock as dygo_jobs_updated's, so none is missed.
CREATE FUNCTION dygo_notify_workflow_ended() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_advisory_xact_lock_shared(hashtext('dygo'), hashtext('dygo.result_waiters'));
    -- A later statement: its snapshot sees every waiter committed before the lock was granted.
    PERFORM pg_notify('dygo_finished', (-NEW.id)::text)
    WHERE EXISTS (SELECT FROM dygo_result_waiters w WHERE w.job_id = -NEW.id);
    RETURN NULL;
END
$$;

CREATE TRIGGER dygo_workflows_ended AFTER UPDATE OF state ON dygo_workflows
    FOR EACH ROW WHEN (OLD.state = 'running' AND NEW.state <> 'running')
    EXECUTE FUNCTION dygo_notify_workflow_ended();
