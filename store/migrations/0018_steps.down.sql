-- Undo 0018: the recorded steps and the events go; a job that used them runs its steps again on its next
-- attempt. Children: 0017's triggers come back; a child job stays an ordinary job, its parent no longer counted.
CREATE OR REPLACE FUNCTION dygo_jobs_updated() RETURNS trigger
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

CREATE OR REPLACE FUNCTION dygo_jobs_removed() RETURNS trigger
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

DROP FUNCTION dygo_children_ended(bigint[], text[], integer[]);
DROP INDEX dygo_jobs_parent;
ALTER TABLE dygo_jobs DROP COLUMN parent_id, DROP COLUMN parent_step, DROP COLUMN parent_index;
DROP FUNCTION dygo_lock_event(text);
DROP TABLE dygo_events;
DROP TABLE dygo_steps;
