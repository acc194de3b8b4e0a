-- Legacy migration 0012_limits: finishes a database made before 0016_baseline. Never edit.

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

CREATE TABLE dygo_limit_starts (
    scope text        NOT NULL,
    name  text        NOT NULL,
    key   text        NOT NULL DEFAULT '',
    at    timestamptz NOT NULL,
    n     integer     NOT NULL
);
CREATE INDEX dygo_limit_starts_window ON dygo_limit_starts (scope, name, at);
