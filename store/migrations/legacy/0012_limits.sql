-- Cluster-wide flow control (issue 13): concurrency and rate limits per queue and per kind, optionally
-- per key (a meta field), enforced by the claim (store/limits.py).
--
-- dygo_limits: the limits in force, one row per queue or kind. The claim reads them (cached a quarter
-- of a second), so a change through the API applies at every worker's next claim. The file_* columns
-- hold what config/queues.yml said at the last sync: a sync overwrites the limits only when the file's
-- value changed, so a restart does not undo a change made at runtime.
CREATE TABLE dygo_limits (
    scope             text        NOT NULL CHECK (scope IN ('queue', 'kind')),
    name              text        NOT NULL,
    key               text,       -- meta field name: each value of meta.<key> gets its own limit
    concurrency_limit integer     CHECK (concurrency_limit > 0),
    rate_count        integer     CHECK (rate_count > 0),
    rate_window       float8      CHECK (rate_window > 0),  -- seconds
    in_file           boolean     NOT NULL DEFAULT false,
    file_concurrency  integer,
    file_rate         text,
    file_key          text,
    updated_at        timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (scope, name),
    CHECK ((rate_count IS NULL) = (rate_window IS NULL))
);

-- dygo_limit_starts: an insert-only log of starts under a rate limit, one row per claim per limit and
-- key with its count (no shared row is updated per job). Rows older than the longest window are trimmed
-- by the maintainer.
CREATE TABLE dygo_limit_starts (
    scope text        NOT NULL,
    name  text        NOT NULL,
    key   text        NOT NULL DEFAULT '',
    at    timestamptz NOT NULL,
    n     integer     NOT NULL
);
CREATE INDEX dygo_limit_starts_window ON dygo_limit_starts (scope, name, at);
