-- Legacy migration 0004_retention: finishes a database made before 0016_baseline. Never edit.

CREATE INDEX dygo_idempotency_keys_expiry ON dygo_idempotency_keys (expires_at);
