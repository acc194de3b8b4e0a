"""Waiting for results: the waiters' channel and registrations, and the notifications that wake them.

Run by store/results.py (`await_for_result`, `wait_for_result`; serve's `?wait=` through app/listening.py
and app/waiting.py; NOTIFY_RECHECK also through store/admin.py's bulk deletes). Expired registrations are
trimmed by sql/retention.py's TRIM_EXPIRED_WAITERS.
"""

# The channel the dygo_jobs_updated trigger sends the ids of jobs that reached a final state to:
# only the ids some waiter registered for in dygo_result_waiters.
LISTEN_FOR_FINISHED = "LISTEN dygo_finished"
# The same notification for a statement the trigger does not see (a deleted job: its waiters find it gone).
NOTIFY_FINISHED = "SELECT pg_notify('dygo_finished', %s)"
# After an admin statement that deletes unfinished jobs in bulk (purge, bulk delete, nuke): one empty
# payload, "re-read your job", for every waiter, instead of the ids of up to millions of deleted jobs.
# Empty, so a process that does not know it (an older serve in a rolling deploy) finds no ids in it.
NOTIFY_RECHECK = "SELECT pg_notify('dygo_finished', '')"

# A waiter's registration, in its own transaction: this lock EXCLUSIVE, then its row, then the read of the
# job, each a statement of its own. The lock waits for the commits of the settles in flight, whose trigger
# holds it in SHARE mode, so the read (a later snapshot) sees what they settled; a settle that takes the
# lock after the registration commits sees its row and notifies it: no settle is missed. The key is the
# trigger's, two int4 keys so that it can never be one of dygo's one-bigint advisory locks. No lock on the
# job's row: a claim passes over a locked row, so the wait would hold its job back.
RESULT_WAITERS_LOCK = "SELECT pg_advisory_xact_lock(hashtext('dygo'), hashtext('dygo.result_waiters'))"
# The registration's commit does not wait for the WAL flush, so the settles queued behind its lock wait
# less: a registration lost in a crash goes with its waiter (its connection).
WAITER_TRANSACTION = "SELECT set_config('synchronous_commit', 'off', true)"
REGISTER_WAITER = """
INSERT INTO dygo_result_waiters (job_id, expires_at) VALUES (%(job_id)s, now() + make_interval(secs => %(seconds)s))
RETURNING id"""
# A wait longer than a registration's lifetime moves its expiry on before it passes.
REFRESH_WAITER = """
UPDATE dygo_result_waiters SET expires_at = now() + make_interval(secs => %(seconds)s) WHERE id = %(id)s"""
UNREGISTER_WAITER = "DELETE FROM dygo_result_waiters WHERE id = %s"
