"""Job lists: the list statement and the only fragments a list's WHERE and ORDER BY are made of.

Run by store/admin.py (`list_jobs`: GET /api/v1/jobs, the dashboard's job list, `dygo jobs list`), which
composes LIST_JOBS with psycopg's `sql` from the filters a request asks for, joined by AND; only these
fragments are ever spliced in, values always travel as parameters. The dashboard's bulk actions by
filter (sql/bulk.py) compose the same fragments. Pages are keyset on id, so a page costs the same on
page 1 and page 10,000, and rows inserted while a client pages never shift what it has not seen yet.
"""

JOB_SUMMARY_COLUMNS = """id, kind, queue, args, meta,
    CASE WHEN state = 'pending' AND run_at > now() THEN 'scheduled' ELSE state END AS state,
    priority, run_at, attempt, max_attempts, enqueued_at, started_at, finished_at, last_error"""
LIST_JOBS = "SELECT {columns} FROM dygo_jobs WHERE {filters} ORDER BY {key} {direction} LIMIT %(limit)s"
# The keys a list orders by. `id + 0` is the same order, but no index provides it: the planner
# then finds the rows through their own index (pending and scheduled rows: dygo_jobs_ready) and
# sorts them, instead of walking the primary key past every finished job to reach sparse ones.
JOB_ORDER_KEYS = {"by_primary_key": "id", "sorted": "id + 0"}
JOB_FILTERS = {
    "queue": "queue = %(queue)s",
    "kind": "kind = %(kind)s",
    # Text search scans, so admin bounds it to a window of ids per page (see list_jobs).
    "text": "(args::text ILIKE %(pattern)s OR last_error ILIKE %(pattern)s)",
    # A parent's children (`ctx.call`, `ctx.map`): dygo_jobs_parent finds them.
    "parent": "parent_id = %(parent_id)s",
    "below": "id < %(below)s",
    "above": "id > %(above)s",
    "floor": "id >= %(floor)s",
    "ceiling": "id <= %(ceiling)s",
    "everything": "true",
}
# 'scheduled' and 'pending' are the same stored state, told apart by the database clock.
JOB_STATE_FILTERS = {
    "scheduled": "state = 'pending' AND run_at > now()",
    "pending": "state = 'pending' AND run_at <= now()",
    "active": "state = 'active'",
    "succeeded": "state = 'succeeded'",
    "dead": "state = 'dead'",
    "paused": "state = 'paused'",
    "cancelled": "state = 'cancelled'",
    "waiting": "state = 'waiting'",
    "skipped": "state = 'skipped'",
}
# Both ends of the primary key: two index probes, however big the table.
JOB_ID_RANGE = "SELECT min(id), max(id) FROM dygo_jobs"
