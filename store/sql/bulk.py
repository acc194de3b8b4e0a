"""The dashboard's bulk actions on jobs: retry, cancel, archive or delete the ticked jobs or a list's matches.

Run by store/admin.py (`count_matching`, `bulk_act`). A bulk action is one statement over the jobs a list
filter matches ({filters}: store/admin.py composes them from sql/job_lists.py's JOB_FILTERS and
JOB_STATE_FILTERS, or BULK_SELECTED for ticked rows), oldest ids first and at most %(cap)s of them. Its
UPDATE/DELETE repeats the starting states the single-job action allows (BULK_ALLOWED), so a row that
changed meanwhile is skipped, never half-updated. Each returns (rows matched, rows changed): the
difference is what was skipped.
"""

from dygo.store.sql.admin_jobs import REVIVED

BULK_SELECTED = "id = ANY(%(ids)s::bigint[])"
# The jobs a bulk action looks at, for sql/admin_jobs.py's LOCK_JOBS_WORKFLOWS.
BULK_MATCHED_IDS = "id IN (SELECT id FROM dygo_jobs WHERE {filters} ORDER BY id LIMIT %(cap)s)"
BULK_ALLOWED = {
    "retry": "state IN ('dead', 'cancelled')",
    "cancel": "state IN ('pending', 'paused')",
    "archive": "state = 'pending'",  # due or scheduled
    "delete": "state <> 'active'",
}
# What every bulk action starts with (the jobs it looks at) and ends with (its report).
_BULK_MATCHED = """matched AS (
    SELECT id, state, idempotency_key FROM dygo_jobs WHERE {filters} ORDER BY id LIMIT %(cap)s)"""
_BULK_REPORT = "SELECT (SELECT count(*) FROM matched), (SELECT count(*) FROM changed)"

# How many jobs a filter matches (at most %(cap)s looked at: one more than a run takes, to tell
# "more"), and how many of the first %(limit)s the action would change.
BULK_COUNT = """
SELECT count(*), count(*) FILTER (WHERE {allowed} AND n <= %(limit)s) FROM (
    SELECT state, row_number() OVER (ORDER BY id) AS n FROM (
        SELECT id, state FROM dygo_jobs WHERE {filters} ORDER BY id LIMIT %(cap)s) AS first) AS matched"""

# Dead or cancelled -> pending now, like RETRY_JOB. Of the jobs sharing an idempotency key only the newest
# revives, and none whose key a live job holds (reviving it would break the key's uniqueness): `keyed` and
# `chosen`, as in sql/dead_jobs.py.
BULK_RETRY = f"""
WITH {_BULK_MATCHED}, eligible AS (
    SELECT id, idempotency_key FROM matched WHERE {BULK_ALLOWED["retry"]}
), keyed AS (
    SELECT DISTINCT ON (idempotency_key) id, idempotency_key FROM eligible
    WHERE idempotency_key IS NOT NULL
    ORDER BY idempotency_key, id DESC
), chosen AS (
    SELECT id FROM eligible WHERE idempotency_key IS NULL
    UNION ALL
    SELECT k.id FROM keyed k WHERE NOT EXISTS (
        SELECT 1 FROM dygo_jobs l
        WHERE l.idempotency_key = k.idempotency_key AND l.state IN ('pending', 'active', 'paused'))
), changed AS (
    UPDATE dygo_jobs AS j SET {REVIVED}
    WHERE j.id = ANY(ARRAY(SELECT id FROM chosen)) AND j.{BULK_ALLOWED["retry"]} AND dygo_may_revive(j.node_id)
    RETURNING j.id
)
{_BULK_REPORT}"""

BULK_CANCEL = f"""
WITH {_BULK_MATCHED}, changed AS (
    UPDATE dygo_jobs SET state = 'cancelled', finished_at = now()
    WHERE id = ANY(ARRAY(SELECT id FROM matched)) AND {BULK_ALLOWED["cancel"]}
    RETURNING id
)
{_BULK_REPORT}"""

# Like ARCHIVE_JOB: dead without running, counted in the day's dead.
BULK_ARCHIVE = f"""
WITH {_BULK_MATCHED}, changed AS (
    UPDATE dygo_jobs SET state = 'dead', finished_at = now(), last_error = 'archived by an operator before it ran',
        dead_fingerprint = dygo_error_fingerprint('archived by an operator before it ran')
    WHERE id = ANY(ARRAY(SELECT id FROM matched)) AND {BULK_ALLOWED["archive"]}
    RETURNING id, queue, kind
), counted AS (
    INSERT INTO dygo_stats_deltas (day, queue, kind, dead)
    SELECT (now() AT TIME ZONE 'UTC')::date, queue, kind, count(*) FROM changed GROUP BY queue, kind
)
{_BULK_REPORT}"""

BULK_DELETE = f"""
WITH {_BULK_MATCHED}, changed AS (
    DELETE FROM dygo_jobs WHERE id = ANY(ARRAY(SELECT id FROM matched)) AND {BULK_ALLOWED["delete"]}
    RETURNING id
)
{_BULK_REPORT}"""
