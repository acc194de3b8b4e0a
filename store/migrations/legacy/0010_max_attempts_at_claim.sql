-- Legacy migration 0010_max_attempts_at_claim: finishes a database made before 0016_baseline. Never edit.

ALTER TABLE dygo_jobs ALTER COLUMN max_attempts DROP NOT NULL;
ALTER TABLE dygo_jobs ALTER COLUMN max_attempts DROP DEFAULT;
