-- Retention (store/maintenance.py): workers trim old history in small batches.
--
-- No new index on dygo_jobs, so the hot path (pending -> active -> succeeded) writes nothing more:
-- * succeeded jobs are found by walking the primary key from the oldest id, one id range at a time
--   (ids grow with time, so the walk stops at the first job enqueued inside the retention window);
-- * dead and cancelled jobs come from dygo_jobs_parked (0002), which only they and paused jobs enter.
--
-- Keys with a time window are found by their expiry. Only enqueues that ask for a window write here.
CREATE INDEX dygo_idempotency_keys_expiry ON dygo_idempotency_keys (expires_at);
