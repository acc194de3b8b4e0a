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

# Found through the workflow's nodes (the edges' primary key starts with upstream): no index on
# dygo_edges.workflow_id, and a scan of every workflow's edges would grow with all those kept.
WORKFLOW_EDGES = """
SELECT u.name AS upstream, d.name AS downstream, e.policy, e.state
FROM dygo_nodes u JOIN dygo_edges e ON e.upstream = u.id JOIN dygo_nodes d ON d.id = e.downstream
WHERE u.workflow_id = %s ORDER BY e.upstream, e.downstream"""

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

# Retry a node: its dead and cancelled jobs back to pending (the REVIVED of sql/admin_jobs.py), or to waiting
# when the node may not run yet (cancelled by an operator before the nodes before it ended); the job
# trigger re-arms the node and what it had cancelled or skipped.
RETRY_NODE_JOBS = """
UPDATE dygo_jobs SET state = CASE WHEN dygo_may_revive(node_id) THEN 'pending' ELSE 'waiting' END,
    run_at = now(), attempt = 0, reap_count = 0,
    started_at = NULL, finished_at = NULL, result = NULL
WHERE node_id = %(node)s AND state IN ('dead', 'cancelled')
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

# Jobs a run of a batch's job added (`ctx.add_to_batch`), in the transaction that settles it and after the
# settle: only a run this transaction settled succeeded adds them (the job's row version is this
# transaction's: `xmin`), so a run that lost its lease adds nothing. The batch must still be open: open, it
# cannot have ended, and the group counts the jobs in the statement that writes them.
APPEND_TO_BATCH = """
WITH fence AS (
    SELECT 1 FROM dygo_jobs WHERE id = %(job)s AND state = 'succeeded' AND xmin = pg_current_xact_id()::xid
), grown AS (
    UPDATE dygo_nodes SET jobs = jobs + %(n)s, jobs_left = jobs_left + %(n)s
    WHERE workflow_id = %(workflow)s AND name = 'jobs' AND NOT sealed AND EXISTS (SELECT FROM fence)
    RETURNING id, state
)
INSERT INTO dygo_jobs (kind, queue, args, meta, priority, run_at, max_attempts, state, node_id)
SELECT t.kind, t.queue, t.args, t.meta, t.priority, coalesce(t.run_at, now() + make_interval(secs => t.delay)),
       t.max_attempts, CASE WHEN g.state = 'running' THEN 'pending' ELSE 'waiting' END, g.id
FROM grown g CROSS JOIN jsonb_to_recordset(%(rows)s::jsonb) AS t(kind text, queue text, args jsonb, meta jsonb,
                                                                 priority smallint, run_at timestamptz,
                                                                 delay float8, max_attempts integer)
RETURNING id"""

# --- Dashboard -------------------------------------------------------------------------------------------

# The workflow and node a job belongs to (the job page's link to its graph): nothing for a job outside one.
NODE_OF_JOB = """
SELECT w.id AS workflow_id, w.name AS workflow, w.state AS workflow_state, n.name AS node, n.is_group, n.state
FROM dygo_jobs j JOIN dygo_nodes n ON n.id = j.node_id JOIN dygo_workflows w ON w.id = n.workflow_id
WHERE j.id = %s"""

# --- Proofs: the counters checked against the rows (store/workflows.py check_invariants) -----------------

# Every way a workflow's counters can disagree with its rows, one row per violation: (workflow, node, what).
# Exact wherever the rows are all there; a job retention deleted had ended, so its node's ended counts may
# exceed what the rows say, never fall short, and its jobs_left is still exact (a job deleted before it
# ended counts as cancelled). `cancels` may exceed the cancelling edges by one: a fail_fast stop or an
# operator's cancel of the workflow cancels a waiting node without an edge.
CHECK_INVARIANTS = """
WITH scope AS (
    SELECT * FROM dygo_workflows WHERE %(workflows)s::bigint[] IS NULL OR id = ANY(%(workflows)s::bigint[])
), nodes AS (
    SELECT n.* FROM dygo_nodes n JOIN scope w ON w.id = n.workflow_id
), rows AS (
    SELECT j.node_id, count(*) AS n,
        count(*) FILTER (WHERE j.state NOT IN ('succeeded', 'dead', 'cancelled', 'skipped')) AS open,
        count(*) FILTER (WHERE j.state = 'succeeded') AS succeeded,
        count(*) FILTER (WHERE j.state = 'dead') AS dead,
        count(*) FILTER (WHERE j.state = 'cancelled') AS cancelled,
        count(*) FILTER (WHERE j.state = 'skipped') AS skipped,
        count(*) FILTER (WHERE j.state = 'waiting') AS waiting,
        count(*) FILTER (WHERE j.state IN ('pending', 'active', 'paused')) AS live
    FROM dygo_jobs j WHERE j.node_id IN (SELECT id FROM nodes) GROUP BY j.node_id
), edges_in AS (
    SELECT e.downstream, count(*) AS n, count(*) FILTER (WHERE e.state = 'open') AS open,
        count(*) FILTER (WHERE e.state = 'held') AS held, count(*) FILTER (WHERE e.state = 'cancel') AS cancels,
        count(*) FILTER (WHERE e.state = 'skip') AS skips
    FROM dygo_edges e WHERE e.downstream IN (SELECT id FROM nodes) GROUP BY e.downstream
), node_facts AS (
    SELECT n.*, w.state AS workflow_state, w.fail_fast,
        coalesce(r.n, 0) AS r_n, coalesce(r.open, 0) AS r_open, coalesce(r.succeeded, 0) AS r_succeeded,
        coalesce(r.dead, 0) AS r_dead, coalesce(r.cancelled, 0) AS r_cancelled, coalesce(r.skipped, 0) AS r_skipped,
        coalesce(r.waiting, 0) AS r_waiting, coalesce(r.live, 0) AS r_live,
        coalesce(e.n, 0) AS e_n, coalesce(e.open, 0) AS e_open, coalesce(e.held, 0) AS e_held,
        coalesce(e.cancels, 0) AS e_cancels, coalesce(e.skips, 0) AS e_skips,
        n.state IN ('succeeded', 'failed', 'cancelled', 'skipped') AS ended
    FROM nodes n JOIN scope w ON w.id = n.workflow_id
    LEFT JOIN rows r ON r.node_id = n.id LEFT JOIN edges_in e ON e.downstream = n.id
), node_violations AS (
    SELECT workflow_id, name, v FROM node_facts, LATERAL (VALUES
        (CASE WHEN jobs <> succeeded + dead + cancelled + skipped + jobs_left THEN format(
            'jobs %%s <> succeeded %%s + dead %%s + cancelled %%s + skipped %%s + jobs_left %%s',
            jobs, succeeded, dead, cancelled, skipped, jobs_left) END),
        (CASE WHEN jobs_left <> r_open THEN format('jobs_left %%s, but %%s job rows not ended', jobs_left, r_open) END),
        (CASE WHEN r_n > jobs THEN format('%%s job rows for %%s jobs', r_n, jobs) END),
        (CASE WHEN r_n = jobs AND (succeeded, dead, cancelled, skipped) <> (r_succeeded, r_dead, r_cancelled, r_skipped)
              OR succeeded < r_succeeded OR dead < r_dead OR cancelled < r_cancelled OR skipped < r_skipped
              THEN format('counts succeeded/dead/cancelled/skipped %%s/%%s/%%s/%%s, rows %%s/%%s/%%s/%%s '
                          '(%%s of %%s rows kept)', succeeded, dead, cancelled, skipped,
                          r_succeeded, r_dead, r_cancelled, r_skipped, r_n, jobs) END),
        (CASE WHEN deps <> e_n THEN format('deps %%s, but %%s edges in', deps, e_n) END),
        (CASE WHEN (deps_left, held, skips) <> (e_open, e_held, e_skips)
              THEN format('deps_left/held/skips %%s/%%s/%%s, edges open/held/skip %%s/%%s/%%s',
                  deps_left, held, skips, e_open, e_held, e_skips) END),
        (CASE WHEN cancels <> e_cancels
                   AND NOT (cancels = e_cancels + 1 AND (workflow_state = 'cancelled' OR fail_fast))
              THEN format('cancels %%s, but %%s cancelling edges', cancels, e_cancels) END),
        (CASE WHEN state = 'waiting' AND r_live > 0
              THEN format('waiting, with %%s jobs pending, active or paused', r_live) END),
        (CASE WHEN state = 'running' AND r_waiting > 0 THEN format('running, with %%s jobs waiting', r_waiting) END),
        (CASE WHEN state = 'running' AND (deps_left, held, cancels, skips) <> (0, 0, 0, 0)
              THEN format('running with deps_left/held/cancels/skips %%s/%%s/%%s/%%s',
                          deps_left, held, cancels, skips) END),
        (CASE WHEN ended AND jobs_left <> 0 THEN format('%%s, with jobs_left %%s', state, jobs_left) END),
        (CASE WHEN ended <> (finished_at IS NOT NULL) THEN format('%%s, finished_at %%s', state, finished_at) END),
        (CASE WHEN state = 'waiting' AND (deps_left, held, cancels, skips) = (0, 0, 0, 0)
              THEN 'stranded: waiting with nothing open, held, cancelling or skipping it' END),
        (CASE WHEN state = 'running' AND jobs_left = 0 AND sealed THEN 'stranded: running with no job left' END),
        (CASE WHEN state = 'waiting' AND held > 0 AND jobs > 0 AND jobs_left = 0 AND sealed
                   AND (deps_left, cancels, skips) = (0, 0, 0)
              THEN 'stranded: held, its jobs all skipped or cancelled' END)
    ) AS checks(v) WHERE v IS NOT NULL
), edge_violations AS (
    SELECT e.workflow_id, d.name, v
    FROM dygo_edges e JOIN node_facts u ON u.id = e.upstream JOIN dygo_nodes d ON d.id = e.downstream,
    LATERAL (VALUES
        -- Open until its upstream node ends; `met` stays met when that node runs again (a retry).
        (CASE WHEN NOT u.ended AND e.state NOT IN ('open', 'met')
              THEN format('edge from %%s (%%s) is %%s', u.name, u.state, e.state) END),
        (CASE WHEN u.ended AND e.state NOT IN ('met', dygo_edge_state(e.policy, u.state))
              THEN format('edge from %%s (%%s, policy %%s) is %%s, not %%s',
                  u.name, u.state, e.policy, e.state, dygo_edge_state(e.policy, u.state)) END)
    ) AS checks(v) WHERE v IS NOT NULL
), workflow_facts AS (
    SELECT w.*, count(n.id) AS n_nodes,
        count(n.id) FILTER (WHERE n.state NOT IN ('succeeded', 'failed', 'cancelled', 'skipped')) AS n_left,
        count(n.id) FILTER (WHERE n.state IN ('failed', 'cancelled')) AS n_failed
    FROM scope w LEFT JOIN dygo_nodes n ON n.workflow_id = w.id GROUP BY w.id, w.name, w.state, w.fail_fast, w.nodes,
        w.nodes_left, w.nodes_failed, w.idempotency_key, w.created_at, w.finished_at
), workflow_violations AS (
    SELECT id, NULL::text, v FROM workflow_facts, LATERAL (VALUES
        (CASE WHEN nodes <> n_nodes THEN format('nodes %%s, but %%s node rows', nodes, n_nodes) END),
        (CASE WHEN nodes_left <> n_left THEN format('nodes_left %%s, but %%s nodes not ended', nodes_left, n_left) END),
        (CASE WHEN nodes_failed <> n_failed
              THEN format('nodes_failed %%s, but %%s nodes failed or cancelled', nodes_failed, n_failed) END),
        (CASE WHEN state = 'running' AND nodes_left = 0 THEN 'running with no node left' END),
        (CASE WHEN state IN ('succeeded', 'failed') AND nodes_left > 0
              THEN format('%%s with %%s nodes left', state, nodes_left) END),
        (CASE WHEN state = 'succeeded' AND nodes_failed > 0
              THEN format('succeeded with %%s nodes failed', nodes_failed) END),
        (CASE WHEN state = 'failed' AND nodes_failed = 0 THEN 'failed with no node failed' END),
        (CASE WHEN (nodes_left = 0) <> (finished_at IS NOT NULL)
              THEN format('nodes_left %%s, finished_at %%s', nodes_left, finished_at) END)
    ) AS checks(v) WHERE v IS NOT NULL
)
SELECT * FROM workflow_violations
UNION ALL SELECT * FROM node_violations
UNION ALL SELECT * FROM edge_violations
ORDER BY 1, 2 NULLS FIRST, 3"""
