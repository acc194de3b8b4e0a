-- Smooth rate limits: a rate limit hands out start times spaced through its window (GCRA, store/claim.py)
-- rather than counting starts in a sliding window, so the handlers' starts, not only the claims, keep to it.
--
-- dygo_limit_pace holds, per rate limit and key, the theoretical time of its next start (`next_at`): the one
-- row a claim reads and moves forward under the limit's lock. A row whose next_at has passed says nothing
-- more than no row (the limit is idle): the worker's maintenance deletes those (sql/limits.py TRIM_PACE).
-- `rate_burst`: how many starts may come at once after an idle spell (NULL: 1, evenly spaced);
-- `file_burst`: the file's value at the last sync, as file_rate is for rate_limit.
CREATE TABLE dygo_limit_pace (
    scope   text        NOT NULL,
    name    text        NOT NULL,
    key     text        NOT NULL DEFAULT '',
    next_at timestamptz NOT NULL,
    PRIMARY KEY (scope, name, key)
);

ALTER TABLE dygo_limits
    ADD COLUMN rate_burst integer CHECK (rate_burst > 0 AND rate_burst <= rate_count),
    ADD COLUMN file_burst integer;
