"""Dead jobs: retrying a queue's (or every queue's) dead jobs, the dashboard's dead-letter groups and their
retry, and vacuuming old dead jobs.

Run by store/admin.py (`retry_dead`, `dead_letter_groups`, `retry_dead_group`, `vacuum_dead`,
`count_vacuum_dead`).

A retry of many dead jobs revives them in one statement, with a fresh attempt budget (REVIVED). Of the
jobs sharing an idempotency key only the newest revives, and none whose key a live job holds (reviving it
would break the key's uniqueness): the CTEs `keyed` and `chosen` (the ids to revive) over `dead`, the dead
jobs the statement is about. sql/bulk.py's BULK_RETRY applies the same rule.
"""

from dygo.store.sql.admin_jobs import REVIVED

# Which dead jobs a retry of many revives: a queue's, every queue's, or one dead-letter group's.
DEAD_IN_QUEUE = "state = 'dead' AND queue = %(queue)s"
DEAD_ANYWHERE = "state = 'dead'"
DEAD_IN_GROUP = "state = 'dead' AND kind = %(kind)s AND coalesce(dead_fingerprint, '') = %(fingerprint)s"


def _retry_dead(which: str) -> str:
    """The dead jobs `which` selects -> pending now."""
    return f"""
WITH dead AS (SELECT id, idempotency_key FROM dygo_jobs WHERE {which}), keyed AS (
    SELECT DISTINCT ON (idempotency_key) id, idempotency_key FROM dead
    WHERE idempotency_key IS NOT NULL
    ORDER BY idempotency_key, id DESC
), chosen AS (
    SELECT id FROM dead WHERE idempotency_key IS NULL
    UNION ALL
    SELECT k.id FROM keyed k WHERE NOT EXISTS (
        SELECT 1 FROM dygo_jobs l
        WHERE l.idempotency_key = k.idempotency_key AND l.state IN ('pending', 'active', 'paused'))
)
UPDATE dygo_jobs AS j SET {REVIVED}
FROM chosen
WHERE j.id = chosen.id AND j.state = 'dead'
RETURNING j.id"""


RETRY_DEAD_JOBS = _retry_dead(DEAD_IN_QUEUE)
RETRY_ALL_DEAD_JOBS = _retry_dead(DEAD_ANYWHERE)
RETRY_DEAD_GROUP = _retry_dead(DEAD_IN_GROUP)

# Dead jobs grouped by kind and error fingerprint, biggest groups first, each with its newest job as the
# sample (one index probe per group shown). The fingerprint (dygo_error_fingerprint) is stored when a job
# dies, so grouping reads the dygo_jobs_dead_groups index alone instead of normalising every dead row's
# error.
DEAD_LETTER_GROUPS = """
SELECT g.kind, g.fingerprint, g.count, g.first_seen, g.last_seen, g.sample_id,
       s.last_error AS sample_error, s.errors -> -1 ->> 'traceback' AS sample_traceback
FROM (SELECT kind, coalesce(dead_fingerprint, '') AS fingerprint, count(*) AS count,
             min(finished_at) AS first_seen, max(finished_at) AS last_seen, max(id) AS sample_id
      FROM dygo_jobs WHERE state = 'dead'
      GROUP BY kind, dead_fingerprint
      ORDER BY count(*) DESC, max(finished_at) DESC
      LIMIT %(limit)s) AS g
JOIN dygo_jobs s ON s.id = g.sample_id
ORDER BY g.count DESC, g.last_seen DESC"""

VACUUM_DEAD = """
DELETE FROM dygo_jobs
WHERE state = 'dead' AND queue = %(queue)s AND finished_at < now() - make_interval(secs => %(older_than)s)"""

# What VACUUM_DEAD would delete, for the dashboard's confirmation (dygo_jobs_parked).
COUNT_VACUUM_DEAD = """
SELECT count(*) FROM dygo_jobs
WHERE state = 'dead' AND queue = %(queue)s AND finished_at < now() - make_interval(secs => %(older_than)s)"""
