-- Legacy migration 0007_timings: finishes a database made before 0016_baseline. Never edit.

CREATE TABLE dygo_timing_deltas (
    queue   text     NOT NULL,
    kind    text     NOT NULL,
    measure text     NOT NULL CHECK (measure IN ('latency', 'duration')),
    buckets bigint[] NOT NULL,
    sum     float8   NOT NULL,
    count   bigint   NOT NULL
);

CREATE TABLE dygo_timings (
    queue   text     NOT NULL,
    kind    text     NOT NULL,
    measure text     NOT NULL CHECK (measure IN ('latency', 'duration')),
    buckets bigint[] NOT NULL,
    sum     float8   NOT NULL,
    count   bigint   NOT NULL,
    PRIMARY KEY (queue, kind, measure)
);
