"""Workflows and batches: creating one, reading it, and the operator's actions on it and its nodes.

Run by store/workflows.py. Ending nodes and releasing what follows them is not here: the job triggers and
the functions of migration 0017 do it, in the transaction that ends each job (store/workflows.py says how).
"""

# A workflow's row; with a key already taken, nothing (the caller reads the workflow the key names).
INSERT_WORKFLOW = """
INSERT INTO dygo_workflows (name, fail_fast, nodes, nodes_left, idempotency_key)
VALUES (%(name)s, %(fail_fast)s, %(nodes)s, %(nodes)s, %(key)s)
ON CONFLICT (idempotency_key) DO NOTHING
RETURNING id"""

WORKFLOW_BY_KEY = "SELECT id FROM dygo_workflows WHERE idempotency_key = %s"

# The nodes, upstream first (ids follow the array order, so upstream nodes get the smaller ids: the order
# every transaction locks them in). A node without upstream nodes starts running.
INSERT_NODES = """
INSERT INTO dygo_nodes (workflow_id, name, is_group, state, sealed, allow_failures, jobs, jobs_left,
                        deps, deps_left, job_id)
SELECT %(workflow)s, n.name, n.is_group, CASE WHEN n.deps = 0 THEN 'running' ELSE 'waiting' END, n.sealed,
       n.allow_failures, n.jobs, n.jobs, n.deps, n.deps, n.job_id
FROM unnest(%(names)s::text[], %(groups)s::boolean[], %(sealed)s::boolean[], %(allow)s::float8[],
            %(jobs)s::integer[], %(deps)s::integer[], %(job_ids)s::bigint[])
     WITH ORDINALITY AS n(name, is_group, sealed, allow_failures, jobs, deps, job_id, position)
ORDER BY n.position
RETURNING id, name"""

INSERT_EDGES = """
INSERT INTO dygo_edges (workflow_id, upstream, downstream, policy)
SELECT %(workflow)s, * FROM unnest(%(upstream)s::bigint[], %(downstream)s::bigint[], %(policies)s::text[])"""

# Jobs of a workflow: ids reserved first (store/sql/enqueue.py RESERVE_JOB_IDS), then COPY, each row with its
# node and its first state (waiting until its node is released).
COPY_NODE_JOBS = """
COPY dygo_jobs (id, kind, queue, args, meta, priority, run_at, max_attempts, state, node_id) FROM STDIN"""

# Nodes that start running with no job (an empty map) end at once; dygo_advance carries on from them.
ADVANCE = "SELECT dygo_advance(%s::bigint[])"

WORKFLOW_COLUMNS = """w.id, w.name, w.state, w.fail_fast, w.nodes, w.nodes_left, w.nodes_failed,
    w.idempotency_key, w.created_at, w.finished_at"""

GET_WORKFLOW = f"SELECT {WORKFLOW_COLUMNS} FROM dygo_workflows w WHERE w.id = %s"

# Newest first, keyset on id.
LIST_WORKFLOWS = f"""
SELECT {WORKFLOW_COLUMNS} FROM dygo_workflows w
WHERE (%(state)s::text IS NULL OR w.state = %(state)s) AND (%(before)s::bigint IS NULL OR w.id < %(before)s)
  AND (%(name)s::text IS NULL OR w.name = %(name)s)
ORDER BY w.id DESC LIMIT %(limit)s"""

NODE_COLUMNS = """n.id, n.workflow_id, n.name, n.is_group, n.state, n.sealed, n.allow_failures, n.jobs, n.jobs_left,
    n.succeeded, n.dead, n.cancelled, n.skipped, n.deps, n.deps_left, n.held, n.cancels, n.skips, n.job_id,
    n.result, n.finished_at"""

# The nodes with their counters, upstream first: the counters say everything, no member is counted.
WORKFLOW_NODES = f"SELECT {NODE_COLUMNS} FROM dygo_nodes n WHERE n.workflow_id = %s ORDER BY n.id"

WORKFLOW_EDGES = """
SELECT u.name AS upstream, d.name AS downstream, e.policy, e.state
FROM dygo_edges e JOIN dygo_nodes u ON u.id = e.upstream JOIN dygo_nodes d ON d.id = e.downstream
WHERE e.workflow_id = %s ORDER BY e.upstream, e.downstream"""

# What an operator's action on a workflow takes first, as the job triggers do (dygo_lock_workflows): the
# workflow's row, then its nodes and jobs; an action that locked a job before it would deadlock with a settle
# that holds the workflow and is releasing that job.
LOCK_WORKFLOW = "SELECT id FROM dygo_workflows WHERE id = %s FOR NO KEY UPDATE"

NODE_BY_NAME = f"""
SELECT {NODE_COLUMNS} FROM dygo_nodes n WHERE n.workflow_id = %(workflow)s AND n.name = %(node)s"""

# What a claimed workflow job is told: its node, and each node upstream of it with its outcome, result and
# counts. One statement per claim that took workflow jobs.
DEPS_OF_NODES = """
SELECT e.downstream, u.id, u.name, u.is_group, u.state, u.result, u.jobs, u.succeeded, u.dead, u.cancelled,
       u.skipped, u.job_id
FROM dygo_edges e JOIN dygo_nodes u ON u.id = e.upstream
WHERE e.downstream = ANY(%s::bigint[])"""

NODES_OF_JOBS = """
SELECT n.id, n.workflow_id, n.name FROM dygo_nodes n WHERE n.id = ANY(%s::bigint[])"""

# A group's job results, in job order, a page at a time (keyset on id): never loaded whole.
GROUP_RESULTS = """
SELECT id, state, result FROM dygo_jobs
WHERE node_id = %(node)s AND id > %(after)s ORDER BY id LIMIT %(limit)s"""

# Cancel a workflow: every node not yet ended is cancelled (dygo_stop_workflows), then advanced.
CANCEL_WORKFLOW = """
WITH marked AS (
    UPDATE dygo_workflows SET state = 'cancelled' WHERE id = %(workflow)s AND state = 'running' RETURNING id
)
SELECT dygo_advance(dygo_stop_workflows(ARRAY(SELECT id FROM marked))), (SELECT count(*) FROM marked)"""

# Retry a node: its dead and cancelled jobs back to pending (the REVIVED of sql/admin_jobs.py); the job
# trigger re-arms the node and what it had cancelled or skipped. Not while the node waits (its jobs would run
# before the nodes it waits for): dygo_may_revive, as a single job's retry asks.
RETRY_NODE_JOBS = """
UPDATE dygo_jobs SET state = 'pending', run_at = now(), attempt = 0, reap_count = 0,
    started_at = NULL, finished_at = NULL, result = NULL
WHERE node_id = %(node)s AND state IN ('dead', 'cancelled') AND dygo_may_revive(node_id)
RETURNING id"""

# Skip a node: its jobs not yet started are skipped (a waiting node's whole); the job trigger ends the node
# when nothing of it runs any more, and its downstream nodes follow their policies.
SKIP_NODE_JOBS = """
UPDATE dygo_jobs SET state = 'skipped', finished_at = now()
WHERE node_id = %(node)s AND state IN ('waiting', 'pending', 'paused')
RETURNING id"""

# Cancel a node: as skip, with cancelled.
CANCEL_NODE_JOBS = """
UPDATE dygo_jobs SET state = 'cancelled', finished_at = now()
WHERE node_id = %(node)s AND state IN ('waiting', 'pending', 'paused')
RETURNING id"""

# A batch takes more jobs while it runs (or waits), until sealed: the node counts them before they exist,
# in the same transaction, so it cannot end between the two.
GROW_NODE = """
UPDATE dygo_nodes SET jobs = jobs + %(n)s, jobs_left = jobs_left + %(n)s
WHERE id = %(node)s AND NOT sealed
RETURNING state"""

# Seal a batch: from now on it ends when its jobs have; if they all have, at once (dygo_advance).
SEAL_NODE = """
WITH sealed AS (
    UPDATE dygo_nodes SET sealed = true WHERE id = %(node)s AND NOT sealed RETURNING id
)
SELECT dygo_advance(ARRAY(SELECT id FROM sealed)), (SELECT count(*) FROM sealed)"""

# Finished workflows older than their retention go, with their nodes and edges (their jobs have their own).
TRIM_WORKFLOWS = """
WITH doomed AS (
    SELECT id FROM dygo_workflows
    WHERE state <> 'running' AND finished_at < now() - make_interval(secs => %(older_than)s)
    ORDER BY id LIMIT %(batch)s
)
DELETE FROM dygo_workflows WHERE id IN (SELECT id FROM doomed) RETURNING 1"""
