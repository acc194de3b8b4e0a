-- A job's max_attempts is resolved at its first lease, not stamped at enqueue (issue 14, point 6): NULL
-- until then means "the registration's max_attempts in the worker that claims it, else default_max_attempts".
-- The seed: a registration's retry budget applies at the first lease unless the job set its own. Stamped at
-- enqueue, a producer that did not import the kind stored the default for a kind declared with fewer.
-- Both are catalog-only changes: no table rewrite, no long lock.
ALTER TABLE dygo_jobs ALTER COLUMN max_attempts DROP NOT NULL;
ALTER TABLE dygo_jobs ALTER COLUMN max_attempts DROP DEFAULT;
