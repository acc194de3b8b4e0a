-- Undo 0017: refused while a job waits in or ended in a workflow-only state, which the old schema cannot hold.
DO $$
BEGIN
    IF EXISTS (SELECT FROM dygo_jobs WHERE state IN ('waiting', 'skipped')) THEN
        RAISE EXCEPTION 'jobs in state waiting or skipped exist: delete them (or their workflows'' jobs) first';
    END IF;
END
$$;
DROP INDEX dygo_jobs_parked;
CREATE INDEX dygo_jobs_parked ON dygo_jobs (state, id) INCLUDE (queue)
    WHERE state IN ('dead', 'paused', 'cancelled');
DROP TRIGGER dygo_workflows_ended ON dygo_workflows;
DROP FUNCTION dygo_notify_workflow_ended();
DROP TRIGGER dygo_jobs_updated ON dygo_jobs;
DROP TRIGGER dygo_jobs_removed ON dygo_jobs;
DROP FUNCTION dygo_jobs_updated();
DROP FUNCTION dygo_jobs_removed();
DROP FUNCTION dygo_tally(bigint[], integer[], integer[], integer[], integer[], jsonb[]);
DROP FUNCTION dygo_lock_workflows(bigint[]);
DROP FUNCTION dygo_advance(bigint[]);
DROP FUNCTION dygo_stop_workflows(bigint[]);
DROP FUNCTION dygo_move_node_jobs(bigint[], text[], text);
DROP FUNCTION dygo_edge_state(text, text);
DROP FUNCTION dygo_node_outcome(integer, integer, integer, integer, double precision);
DROP FUNCTION dygo_may_revive(bigint);
DROP TABLE dygo_edges;
DROP TABLE dygo_nodes;
DROP TABLE dygo_workflows;
DROP INDEX dygo_jobs_node;
ALTER TABLE dygo_jobs DROP COLUMN node_id;
ALTER TABLE dygo_jobs DROP CONSTRAINT dygo_jobs_state_check;
ALTER TABLE dygo_jobs ADD CONSTRAINT dygo_jobs_state_check CHECK (state IN
    ('pending', 'active', 'succeeded', 'dead', 'paused', 'cancelled'));
CREATE FUNCTION dygo_notify_finished() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    -- Claims, lease renewals and retries leave no job final: no lock, no notification.
    IF NOT EXISTS (SELECT FROM new_rows WHERE state IN ('succeeded', 'dead', 'cancelled')) THEN
        RETURN NULL;
    END IF;
    -- The key is store/sql/results.py's RESULT_WAITERS_LOCK (two int4 keys: apart from dygo's one-bigint locks).
    PERFORM pg_advisory_xact_lock_shared(hashtext('dygo'), hashtext('dygo.result_waiters'));
    -- A later statement: its snapshot sees every waiter committed before the lock was granted.
    -- At most 390 ids per notification (20 bytes each at most) to stay under the 8000-byte limit.
    PERFORM pg_notify('dygo_finished', string_agg(f.id::text, ','))
    FROM (SELECT n.id, (row_number() OVER ()) / 390 AS chunk FROM new_rows n
          WHERE n.state IN ('succeeded', 'dead', 'cancelled')
            AND EXISTS (SELECT FROM dygo_result_waiters w WHERE w.job_id = n.id)) AS f
    GROUP BY f.chunk;
    RETURN NULL;
END
$$;

CREATE TRIGGER dygo_jobs_updated AFTER UPDATE ON dygo_jobs
    REFERENCING NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION dygo_notify_pending();
CREATE TRIGGER dygo_jobs_finished AFTER UPDATE ON dygo_jobs
    REFERENCING NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION dygo_notify_finished();
