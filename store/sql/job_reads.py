"""One job as the API shows it: the job row every job statement returns, and its read by id.

Run by store/job_reads.py (GET /api/v1/jobs/{id}, the dashboard's job page) and store/results.py (a
waiter's read after it registers); the actions of store/admin.py (sql/admin_jobs.py) return JOB_COLUMNS.
"""

# A job's columns in the API's order, 'scheduled' told apart from 'pending' by the database clock. A job of a
# workflow names its node, the node's workflow and name (a primary-key probe, only for such a job); a child
# job (`ctx.call`, `ctx.map`) its parent, the parent's step and its place in that step's list.
JOB_COLUMNS = """id, kind, queue, args, meta,
    CASE WHEN state = 'pending' AND run_at > now() THEN 'scheduled' ELSE state END AS state,
    priority, run_at, attempt, max_attempts, lease_owner, lease_deadline, enqueued_at, started_at,
    finished_at, (errors -> -1 ->> 'at')::timestamptz AS failed_at, result, last_error, errors, reap_count,
    idempotency_key, progress, node_id,
    CASE WHEN node_id IS NOT NULL THEN (SELECT n.workflow_id FROM dygo_nodes n WHERE n.id = node_id) END
        AS workflow_id,
    CASE WHEN node_id IS NOT NULL THEN (SELECT n.name FROM dygo_nodes n WHERE n.id = node_id) END AS node,
    parent_id, parent_step, parent_index"""
# A scheduled job whose latest step is a sleep not yet over is sleeping on it (`ctx.sleep`): its key and wake
# time, read only for a scheduled job (a primary-key range of its steps).
SLEEPING = """CASE WHEN state = 'pending' AND run_at > now() THEN (
        SELECT jsonb_build_object('step', s.key, 'wake_at', s.wake_at) FROM (
            SELECT key, op, wake_at FROM dygo_steps WHERE job_id = dygo_jobs.id ORDER BY seq DESC LIMIT 1
        ) s WHERE s.op = 'sleep' AND s.wake_at > now()
    ) END AS sleeping"""
GET_JOB = f"SELECT {JOB_COLUMNS}, {SLEEPING} FROM dygo_jobs WHERE id = %s"
