"""Child jobs (`ctx.call`, `ctx.map`): what a parent's settle writes when it starts or renews a wait on its
children (store/children.py builds them; migration 0018's dygo_children_ended counts the children and wakes
the parent).

The settle that moves the parent to waiting runs RECORD_CHILDREN after its own update, in its transaction
(store/leases.py Wait): the xmin fence lets only a parent row that transaction settled record anything, so
a run that lost its lease enqueues no child, and no child exists before its parent's wait commits.
"""

# The step row (op 'call' or 'map', waiting, counting its children) and the children, each naming its parent,
# the step and its place in the list. The rows are store.enqueue.rows_json's, validated by the handler.
RECORD_CHILDREN = """
WITH fence AS (
    SELECT id FROM dygo_jobs WHERE id = %(job)s AND state = 'waiting' AND xmin = pg_current_xact_id()::xid
), step AS (
    INSERT INTO dygo_steps (job_id, key, op, seq, attempt, duration, state, children, children_left)
    SELECT id, %(key)s, %(op)s, %(seq)s, %(attempt)s, 0, 'waiting', %(n)s, %(n)s FROM fence
    ON CONFLICT (job_id, key) DO NOTHING
    RETURNING job_id
)
INSERT INTO dygo_jobs (kind, queue, args, meta, priority, run_at, max_attempts, parent_id, parent_step, parent_index)
SELECT t.kind, t.queue, t.args, t.meta, t.priority, coalesce(t.run_at, now() + make_interval(secs => t.delay)),
       t.max_attempts, s.job_id, %(key)s, (t.place - 1)::integer
FROM step s CROSS JOIN ROWS FROM (
    jsonb_to_recordset(%(rows)s::jsonb) AS (kind text, queue text, args jsonb, meta jsonb, priority smallint,
                                             run_at timestamptz, delay float8, max_attempts integer)
) WITH ORDINALITY AS t(kind, queue, args, meta, priority, run_at, delay, max_attempts, place)"""

# A replay that finds its step still waiting suspends again and enqueues nothing. Its settle first locks the
# step row (Wait.lock: before any job row, as dygo_children_ended takes a step row before its parent's),
# then, after settling, puts the parent back to pending if the step ended meanwhile: the last child's
# transaction found the parent active and left it, and a later statement than this lock sees its commit.
LOCK_STEP = "SELECT 1 FROM dygo_steps WHERE job_id = %(job)s AND key = %(key)s FOR NO KEY UPDATE"
WAIT_AGAIN = """
UPDATE dygo_jobs SET state = 'pending', run_at = now()
WHERE id = %(job)s AND state = 'waiting' AND xmin = pg_current_xact_id()::xid
  AND NOT EXISTS (SELECT FROM dygo_steps WHERE job_id = %(job)s AND key = %(key)s AND state = 'waiting')"""
